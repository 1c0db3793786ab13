"""Usable CPUs: the affinity set within the cgroup CPU quota (v2 and v1), physical cores;
available memory: ``MemAvailable`` within the cgroup memory limits (v2 and v1).

Each test builds a folder that looks like ``/`` to the parts of it that are read:
``proc/self/cgroup``, ``proc/meminfo``, ``sys/fs/cgroup/...`` and
``sys/devices/system/cpu/cpu*/topology``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from shmvec.planning import machine, plan
from shmvec.planning.machine import available_memory, cgroup_quota, physical_cores, usable_cpus

GIB = 2**30


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


# ---- memory -------------------------------------------------------------------------------


def meminfo(root: Path, available: int) -> Path:
    write(root, "proc/meminfo", f"MemTotal:       {2 * available // 1024} kB\nMemAvailable:   {available // 1024} kB")
    return root


def memory_v2(root: Path, files: dict[str, dict[str, str]], own: str = "/") -> Path:
    """A cgroup v2 tree with this process in ``own``; ``files``: folder -> {file name: text}."""
    cgroup_v2(root, {}, own=own)
    for folder, texts in files.items():
        for name, text in texts.items():
            write(root, str(Path("sys/fs/cgroup", folder.lstrip("/"), name)), text)
    return root


def memory_v1(root: Path, limit: int, usage: int, inactive_file: int = 0, own: str = "/slurm/job1") -> Path:
    write(root, "proc/self/cgroup", f"12:memory:{own}\n4:cpu,cpuacct:/\n1:name=systemd:/")
    folder = f"sys/fs/cgroup/memory/{own.lstrip('/')}"
    write(root, f"{folder}/memory.limit_in_bytes", str(limit))
    write(root, f"{folder}/memory.usage_in_bytes", str(usage))
    write(root, f"{folder}/memory.stat", f"cache 0\ntotal_inactive_file {inactive_file}\ntotal_rss {usage}")
    write(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712")  # the root: no limit
    return root


def test_memory_available_without_cgroup_files(tmp_path):
    assert available_memory(meminfo(tmp_path, 64 * GIB)) == 64 * GIB
    assert available_memory(tmp_path / "nothing") is None


def test_cgroup_v2_memory_limit_below_mem_available(tmp_path):
    root = memory_v2(meminfo(tmp_path, 64 * GIB), {"/job": {"memory.max": str(8 * GIB), "memory.current": str(GIB)}})
    write(root, "proc/self/cgroup", "0::/job")
    assert available_memory(root) == 7 * GIB


def test_cgroup_v2_takes_the_tightest_limit_high_included_on_the_way_to_the_root(tmp_path):
    files = {
        "/kubepods": {"memory.max": str(4 * GIB), "memory.current": str(3 * GIB)},  # 1 GiB left: the tightest
        "/kubepods/pod1": {"memory.max": "max", "memory.high": "max", "memory.current": str(2 * GIB)},
        "/kubepods/pod1/ctr": {"memory.max": str(16 * GIB), "memory.high": str(3 * GIB), "memory.current": "0"},
    }
    root = memory_v2(meminfo(tmp_path, 64 * GIB), files, own="/kubepods/pod1/ctr")
    assert available_memory(root) == GIB
    write(root, "sys/fs/cgroup/kubepods/memory.max", "max")
    assert available_memory(root) == 3 * GIB  # memory.high, lower than memory.max


def test_cgroup_v2_unlimited_leaves_mem_available(tmp_path):
    files = {"/": {"memory.current": str(GIB)}, "/job": {"memory.max": "max", "memory.current": str(GIB)}}
    root = memory_v2(meminfo(tmp_path, 64 * GIB), files, own="/job")
    assert available_memory(root) == 64 * GIB
    assert machine.cgroup_memory(root) is None


def test_cgroup_v2_over_its_limit_leaves_nothing_and_reclaimable_cache_counts_as_free(tmp_path):
    files = {"/job": {"memory.max": str(GIB), "memory.current": str(2 * GIB)}}
    root = memory_v2(meminfo(tmp_path, 64 * GIB), files, own="/job")
    assert available_memory(root) == 0
    write(root, "sys/fs/cgroup/job/memory.stat", f"anon {GIB // 2}\ninactive_file {3 * GIB // 2}")
    assert available_memory(root) == GIB // 2  # 2 GiB used, 1.5 GiB of it cache the kernel reclaims first


def test_cgroup_v1_memory_limit(tmp_path):
    root = memory_v1(meminfo(tmp_path, 64 * GIB), limit=8 * GIB, usage=3 * GIB, inactive_file=GIB)
    assert available_memory(root) == 6 * GIB
    root = memory_v1(meminfo(tmp_path / "full", 64 * GIB), limit=GIB, usage=2 * GIB)
    assert available_memory(root) == 0  # never negative


def test_cgroup_v1_unlimited_leaves_mem_available(tmp_path):
    root = memory_v1(meminfo(tmp_path, 64 * GIB), limit=9223372036854771712, usage=3 * GIB)
    assert available_memory(root) == 64 * GIB


def test_mem_available_below_the_cgroup_limit_wins(tmp_path):
    root = memory_v1(meminfo(tmp_path, 2 * GIB), limit=8 * GIB, usage=GIB)
    assert available_memory(root) == 2 * GIB


def test_max_lanes_follows_the_cgroup_memory_limit(tmp_path, monkeypatch):
    root = memory_v2(meminfo(tmp_path, 64 * GIB), {"/job": {"memory.max": str(GIB), "memory.current": "0"}}, "/job")
    monkeypatch.setattr(plan, "available_memory", functools.partial(available_memory, root))
    assert plan.max_lanes(1000) == GIB // plan.WORKER_MEMORY == 16  # MemAvailable alone would allow MAX_LANES


def test_this_machines_memory():
    mem_available = machine._mem_available(Path("/"))
    available = available_memory()
    assert available is not None and mem_available is not None and 0 <= available <= mem_available
