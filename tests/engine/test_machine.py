"""Usable CPUs: the affinity set within the cgroup CPU quota (v2 and v1), physical cores.

Each test builds a folder that looks like ``/`` to the parts of it that are read:
``proc/self/cgroup``, ``sys/fs/cgroup/...`` and ``sys/devices/system/cpu/cpu*/topology``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shmvec.engine.machine import cgroup_quota, physical_cores, usable_cpus


def write(root: Path, path: str, text: str) -> None:
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text + "\n")


def cgroup_v2(root: Path, cpu_max: dict[str, str], own: str = "/") -> Path:
    """A cgroup v2 tree with this process in ``own``; ``cpu_max``: folder ("/": the root) -> its cpu.max."""
    write(root, "proc/self/cgroup", f"0::{own}")
    write(root, "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids")
    (root / "sys/fs/cgroup" / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for folder, text in cpu_max.items():
        write(root, str(Path("sys/fs/cgroup", folder.lstrip("/"), "cpu.max")), text)
    return root


def cgroup_v1(root: Path, quota: int, period: int = 100000, own: str = "/", mount: str = "cpu,cpuacct") -> Path:
    write(root, "proc/self/cgroup", f"12:memory:{own}\n4:{mount}:{own}\n1:name=systemd:{own}")
    write(root, f"sys/fs/cgroup/{mount}/cpu.cfs_quota_us", str(quota))
    write(root, f"sys/fs/cgroup/{mount}/cpu.cfs_period_us", str(period))
    return root


def smt(root: Path, n_cores: int, threads: int = 2) -> Path:
    """``n_cores`` cores of ``threads`` SMT siblings each, numbered as Linux does (core c: c, c + n_cores, ...)."""
    for core in range(n_cores):
        siblings = ",".join(str(core + t * n_cores) for t in range(threads))
        for t in range(threads):
            write(root, f"sys/devices/system/cpu/cpu{core + t * n_cores}/topology/thread_siblings_list", siblings)
    return root


@pytest.mark.parametrize(
    "cpu_max, expected", [("max 100000", None), ("150000 100000", 1.5), ("400000 100000", 4.0), ("50000 100000", 0.5)]
)
def test_cgroup_v2_quota(tmp_path, cpu_max, expected):
    assert cgroup_quota(cgroup_v2(tmp_path, {"/": cpu_max})) == expected


def test_cgroup_v2_takes_the_smallest_quota_on_the_way_to_the_root(tmp_path):
    cpu_max = {"/": "max 100000", "/kubepods/pod1": "300000 100000", "/kubepods/pod1/ctr": "800000 100000"}
    root = cgroup_v2(tmp_path, cpu_max, own="/kubepods/pod1/ctr")  # the container's own quota is looser
    assert cgroup_quota(root) == 3.0


def test_cgroup_v2_in_a_container_whose_path_is_the_hosts(tmp_path):
    """/proc/self/cgroup may name a path the container's mount does not show: read the mount's root."""
    root = cgroup_v2(tmp_path, {"/": "200000 100000"})
    write(root, "proc/self/cgroup", "0::/system.slice/docker-abc.scope")
    assert cgroup_quota(root) == 2.0


@pytest.mark.parametrize("mount", ["cpu,cpuacct", "cpu"])
def test_cgroup_v1_quota(tmp_path, mount):
    assert cgroup_quota(cgroup_v1(tmp_path, 250000, mount=mount)) == 2.5
    assert cgroup_quota(cgroup_v1(tmp_path / "none", -1, mount=mount)) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_quota(tmp_path) is None


def test_the_quota_limits_the_affinity_set_rounded_down(tmp_path):
    cpus = usable_cpus(cgroup_v2(tmp_path, {"/": "250000 100000"}), affinity=set(range(64)))
    assert (cpus.logical, cpus.physical) == (2, 2)
    assert "quota 2.5 of 64 CPUs" in cpus.why


def test_a_quota_under_one_cpu_still_gives_one(tmp_path):
    cpus = usable_cpus(cgroup_v1(tmp_path, 20000), affinity=set(range(8)))
    assert (cpus.logical, cpus.physical) == (1, 1)


def test_a_quota_above_the_affinity_set_changes_nothing(tmp_path):
    cpus = usable_cpus(cgroup_v2(tmp_path, {"/": "1600000 100000"}), affinity={0, 1, 2, 3})
    assert (cpus.logical, cpus.physical, cpus.why) == (4, 4, "4 CPUs")


def test_smt_siblings_count_once(tmp_path):
    root = smt(tmp_path, n_cores=8)
    assert physical_cores(set(range(16)), root) == 8
    assert physical_cores({0, 8}, root) == 1  # two hyperthreads of one core
    assert physical_cores({0, 1, 2}, root) == 3
    cpus = usable_cpus(root, affinity=set(range(16)))
    assert (cpus.logical, cpus.physical) == (16, 8) and "8 physical cores" in cpus.why


def test_quota_and_smt_together(tmp_path):
    root = smt(cgroup_v2(tmp_path, {"/": "1200000 100000"}), n_cores=8)
    cpus = usable_cpus(root, affinity=set(range(16)))
    assert (cpus.logical, cpus.physical) == (12, 8)
    root = smt(cgroup_v2(tmp_path / "tight", {"/": "300000 100000"}), n_cores=8)
    assert usable_cpus(root, affinity=set(range(16))).physical == 3


def test_unknown_topology_counts_every_cpu(tmp_path):
    assert physical_cores({0, 1, 2, 3}, tmp_path) == 4


def test_this_machine():
    cpus = usable_cpus()
    assert 1 <= cpus.physical <= cpus.logical and cpus.why
