"""Names of /dev/shm entries that record their maker, and the removal of those whose maker is gone.

A pool's arena and semaphores are unlinked by ``close()``, or by Python's resource
tracker if the main process is killed. When the whole process group is SIGKILLed at once
(a job scheduler, ``docker stop`` past its grace period, ``timeout -s KILL``, the
out-of-memory killer), the tracker dies too and the entries stay until reboot. So each
name says which process made it, and every pool start (:func:`reclaim`, one listing of
``/dev/shm``) removes the entries of makers that no longer exist::

    shmvec_<pid>_<kind>_<start>-<pidns>_<random>      (a semaphore: sem.shmvec_...)

- ``pid``: the maker's pid; it stays right after ``shmvec_``, where tools look for it.
- ``start``: when the maker started, in clock ticks after boot (``/proc/<pid>/stat``
  field 22). A process that got the pid later has a later start, so a reused pid does
  not keep a leftover alive.
- ``pidns``: the inode of the maker's pid namespace. Containers may share one
  ``/dev/shm`` without sharing pids (a Kubernetes pod, ``docker run --ipc``): an entry
  made in another namespace names a pid that means nothing here, so it is never removed.

An entry is removed only if this user owns it, it was made in this pid namespace, and no
process has its pid or the one that has it started at another time (:func:`is_leftover`).
Names in any other form, older ones included, are left alone.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import NamedTuple

SHM_DIR = "/dev/shm"
# The random part keeps names of one process apart; sem. is how glibc stores a semaphore.
_NAME = re.compile(r"(?:sem\.)?shmvec_(\d+)_[a-z]+_(\d+)-(\d+)_[0-9a-f]+")

logger = logging.getLogger("shmvec")


class Maker(NamedTuple):
    """The process that made an entry: its pid, start time (ticks after boot), pid namespace."""

    pid: int
    start: int
    pidns: int


_own: Maker | None = None  # this process, read once (again after a fork: a child is another maker)


def own_maker() -> Maker:
    """This process as a :class:`Maker`; start and pidns are 0 where ``/proc`` cannot say."""
    global _own
    pid = os.getpid()
    if _own is None or _own.pid != pid:
        try:
            pidns = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            pidns = 0
        _own = Maker(pid, start_time(pid) or 0, pidns)
    return _own


def unique_name(kind: str) -> str:
    """A name no other pool (or process) uses: ``shmvec_<pid>_<kind>_<start>-<pidns>_<random>``."""
    me = own_maker()
    return f"shmvec_{me.pid}_{kind}_{me.start}-{me.pidns}_{secrets.token_hex(4)}"


def parse_name(entry: str) -> Maker | None:
    """The maker an entry of ``/dev/shm`` names, or None if it is not a name of this form.

    Example:
        >>> parse_name("sem.shmvec_4242_sem_58411-4026531836_1a2b3c4d")
        Maker(pid=4242, start=58411, pidns=4026531836)
        >>> parse_name("shmvec_4242_arena_1a2b3c4d") is None
        True
    """
    match = _NAME.fullmatch(entry)
    if match is None:
        return None
    return Maker(*(int(group) for group in match.groups()))


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            line = file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    return int(line.rpartition(b")")[2].split()[19])


def is_leftover(maker: Maker, owner_uid: int, me: Maker, uid: int, start_of: Callable[[int], int | None]) -> bool:
    """Whether an entry made by ``maker`` and owned by ``owner_uid`` may be removed.

    Args:
        maker: what the entry's name says.
        owner_uid: the entry's ``st_uid``.
        me: the process deciding (:func:`own_maker`).
        uid: its effective uid.
        start_of: the start time of the process that has a pid now, None if none has
            (:func:`start_time`); asked only once the entry is ours to judge.
    """
    if owner_uid != uid or maker.pidns != me.pidns or not me.pidns:
        return False  # another user's, or a pid that means another process here
    return start_of(maker.pid) != maker.start


def reclaim(directory: str = SHM_DIR) -> list[str]:
    """Remove the entries of ``directory`` whose maker no longer exists; return their names.

    Entries that vanish meanwhile (their maker's tracker, a pool starting beside us) and
    entries that cannot be read or removed are skipped: reclaiming never fails a pool.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []  # no /dev/shm here: nothing can have been left in it
    me, uid = own_maker(), os.geteuid()
    starts: dict[int, int | None] = {}

    def start_of(pid: int) -> int | None:
        if pid not in starts:
            starts[pid] = start_time(pid)
        return starts[pid]

    removed = []
    for name in names:
        maker = parse_name(name)
        if maker is None:
            continue
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or not is_leftover(maker, info.st_uid, me, uid, start_of):
                continue
            os.unlink(path)
        except OSError:
            continue  # gone meanwhile, or not ours to remove after all
        removed.append(name)
    if removed:
        logger.info(
            "removed %d entries from %s left by processes that no longer exist: %s",
            len(removed),
            directory,
            ", ".join(sorted(removed)),
        )
    return removed
