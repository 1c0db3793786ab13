"""What this machine lets a pool use: CPUs (affinity, cgroup quota, physical cores) and memory (cgroup limit).

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

Memory is the same story: a job limited by SLURM ``--mem``, Docker ``-m`` or a Kubernetes
limit sees its host's ``MemAvailable``, and workers planned by it are OOM-killed.
:func:`available_memory` is the smaller of ``MemAvailable`` and the room every cgroup on
the way to the root leaves: its limit (v2: ``memory.max``, or ``memory.high`` if lower,
``"max"``: none; v1: ``memory.limit_in_bytes``, a huge number: none) less its use (v2
``memory.current``, v1 ``memory.usage_in_bytes``), not counting the inactive file cache
(``memory.stat``), which the kernel reclaims before it kills: the working set the kubelet
evicts by.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("sys/fs/cgroup")
V1_MOUNTS = {"cpu": ("cpu", "cpu,cpuacct"), "memory": ("memory",)}  # where a v1 controller may be mounted
V1_UNLIMITED = 1 << 60  # v1 writes "no memory limit" as the most pages in bytes (9223372036854771712)


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
    quotas = [(_v2_quota if version == 2 else _v1_quota)(d) for version, d in _cgroup_folders(root, "cpu")]
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
    """Bytes of memory available for new processes: ``MemAvailable`` within the cgroup memory
    limits (see the module docstring); None where neither is known."""
    found = [room for room in (_mem_available(root), cgroup_memory(root)) if room is not None]
    return min(found) if found else None


def cgroup_memory(root: Path = Path("/")) -> int | None:
    """Bytes the cgroup memory limits on the way to the root still leave this process (at least 0), or None if none."""
    rooms = [(_v2_room if version == 2 else _v1_room)(d) for version, d in _cgroup_folders(root, "memory")]
    found = [room for room in rooms if room is not None]
    return min(found) if found else None


def _mem_available(root: Path) -> int | None:
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


def _cgroup_folders(root: Path, controller: str) -> list[tuple[int, Path]]:
    """``(cgroup version, folder)`` of ``controller`` ("cpu", "memory"), from this process's cgroup to the root."""
    folders = []
    for controllers, path in _own_cgroups(root):
        if controllers == "":  # cgroup v2: one tree for every controller
            v2_bases = (root / CGROUP, root / CGROUP / "unified")
            version, bases = 2, [b for b in v2_bases if (b / "cgroup.controllers").exists()]
        elif controller in controllers.split(","):
            mounts = (controllers, *V1_MOUNTS[controller])
            version, bases = 1, [b for b in (root / CGROUP / mount for mount in mounts) if b.is_dir()]
        else:
            continue
        if bases:
            folders += [(version, d) for d in _up_to(bases[0], path)]
    return folders


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


def _v2_room(folder: Path) -> int | None:
    limits = [_number(_read(folder / name)) for name in ("memory.max", "memory.high")]  # "max": not a number
    found = [limit for limit in limits if limit is not None]
    if not found:
        return None
    return _room(min(found), _read(folder / "memory.current"), _stat(folder, "inactive_file"))


def _v1_room(folder: Path) -> int | None:
    limit = _number(_read(folder / "memory.limit_in_bytes"))
    if limit is None or limit >= V1_UNLIMITED:
        return None
    return _room(limit, _read(folder / "memory.usage_in_bytes"), _stat(folder, "total_inactive_file"))


def _room(limit: int, used: str | None, reclaimable: int) -> int:
    """What ``limit`` leaves once the cgroup's use is counted, less the file cache the kernel would reclaim first."""
    return max(0, limit - max(0, (_number(used) or 0) - reclaimable))


def _stat(folder: Path, key: str) -> int:
    """A counter of the cgroup's ``memory.stat`` (0 if absent)."""
    for line in (_read(folder / "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _number(value) or 0
    return 0


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None
