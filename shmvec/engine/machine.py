"""What this machine lets a pool use: CPUs (affinity, cgroup quota, physical cores) and memory.

``os.cpu_count()`` is the machine's count. A container limited by a CPU quota (Docker
``--cpus``, Kubernetes limits, a SLURM job in a cgroup) sees every CPU of its host but
gets only the quota's share of time: a pool sized by the host's count starts workers
that the quota then throttles, all of them. :func:`usable_cpus` returns

- ``logical``: the CPUs of the affinity set, at most the quota (rounded down, at least 1);
- ``physical``: the same, counting SMT siblings (hyperthreads) of one core once, for
  lanes that need a core each (CPU-bound envs).

The quota is the smallest one on the path from this process's cgroup to the root: cgroup
v2 ``cpu.max`` (``"150000 100000"``: 1.5 CPUs; ``"max 100000"``: none), or v1
``cpu.cfs_quota_us / cpu.cfs_period_us`` (a quota of -1: none). Everything reads files
under ``root``, so tests pass a folder that looks like ``/``. joblib's ``loky.cpu_count``
does the same but reads only the cgroup root and shells out to ``lscpu`` for physical
cores; this is the part shmvec needs, without the dependency.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("sys/fs/cgroup")


@dataclass(frozen=True)
class Cpus:
    """What a pool may use: ``logical`` CPUs, ``physical`` cores, and a few words saying why."""

    logical: int
    physical: int
    why: str


def usable_cpus(root: Path = Path("/"), affinity: set[int] | None = None) -> Cpus:
    """The CPUs and cores this process may use (see the module docstring)."""
    if affinity is None:
        affinity = _affinity()
    quota = cgroup_quota(root)
    cores = physical_cores(affinity, root)
    logical, why = len(affinity), f"{len(affinity)} CPUs"
    if quota is not None and quota < logical:
        logical = max(1, math.floor(quota))
        why = f"cgroup CPU quota {quota:g} of {len(affinity)} CPUs"
    if cores < len(affinity):
        why += f", {cores} physical cores"
    return Cpus(logical, max(1, min(cores, logical)), why)


def cgroup_quota(root: Path = Path("/")) -> float | None:
    """CPUs' worth of time the cgroup quota allows this process (e.g. 1.5), or None if unlimited."""
    quotas = []
    for controllers, path in _own_cgroups(root):
        if controllers == "":  # cgroup v2
            for base in (root / CGROUP, root / CGROUP / "unified"):
                if (base / "cgroup.controllers").exists():
                    quotas += [_v2_quota(d) for d in _up_to(base, path)]
                    break
        elif "cpu" in controllers.split(","):
            for base in (root / CGROUP / controllers, root / CGROUP / "cpu", root / CGROUP / "cpu,cpuacct"):
                if base.is_dir():
                    quotas += [_v1_quota(d) for d in _up_to(base, path)]
                    break
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def physical_cores(cpus: set[int], root: Path = Path("/")) -> int:
    """How many physical cores ``cpus`` span (SMT siblings count once); ``len(cpus)`` if the topology is unknown."""
    cores = set()
    for cpu in cpus:
        topology = root / "sys/devices/system/cpu" / f"cpu{cpu}" / "topology"
        siblings = _read(topology / "core_cpus_list") or _read(topology / "thread_siblings_list")
        if siblings is None:
            return len(cpus)
        cores.add(siblings)
    return len(cores)


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes of memory available for new processes (``MemAvailable``), or None where it is unknown."""
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def _own_cgroups(root: Path) -> list[tuple[str, str]]:
    """``(controllers, path)`` of each line of ``/proc/self/cgroup`` (``""`` controllers: cgroup v2)."""
    text = _read(root / "proc/self/cgroup") or ""
    pairs = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            pairs.append((parts[1], parts[2]))
    return pairs


def _up_to(base: Path, path: str) -> list[Path]:
    """The folders from ``base/path`` up to ``base`` (just ``base`` where the path is not visible:
    in a container, ``/proc/self/cgroup`` may name the host's path while ``base`` is already ours)."""
    leaf = base / path.lstrip("/")
    if not leaf.is_dir():
        return [base]
    folders = [leaf]
    while folders[-1] != base and base in folders[-1].parents:
        folders.append(folders[-1].parent)
    return folders


def _v2_quota(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    if text is None:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None
