"""The one shared-memory arena of a pool.

The main process owns it (:class:`OwnedArena`): it creates the segment through
:mod:`multiprocessing.shared_memory`, so Python's resource tracker unlinks it even if
the main process is SIGKILLed (if the tracker is killed with it, the next pool to start
removes it: :mod:`shmvec.ipc.leftovers`), reserves its pages up front (a full ``/dev/shm`` is a
clear :class:`~shmvec.errors.SharedMemoryCapacityError` now, not a SIGBUS later) and
unlinks it exactly once, on ``close()`` or, as a safety net, at garbage collection
or interpreter exit.

Workers only attach (:func:`attach`). They go through posix_ipc rather than
``SharedMemory`` because on Python < 3.13 ``SharedMemory`` registers every attach
with the resource tracker, which then warns about "leaked shared_memory objects"
or unlinks the segment under the owner's feet.
"""

from __future__ import annotations

import mmap
import os
import weakref
from multiprocessing import shared_memory

import posix_ipc

from shmvec.errors import SharedMemoryCapacityError
from shmvec.ipc.leftovers import SHM_DIR, unique_name


def free_bytes() -> int | None:
    """Bytes free in ``/dev/shm``, or None where there is no such mount (not Linux)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def check_capacity(nbytes: int) -> None:
    """Raise :class:`SharedMemoryCapacityError` if ``/dev/shm`` has less than ``nbytes`` free."""
    free = free_bytes()
    if free is not None and free < nbytes:
        raise SharedMemoryCapacityError(_capacity_message(nbytes, free))


def _capacity_message(nbytes: int, free: int | None) -> str:
    have = f"only {free:,} bytes are free" if free is not None else "the allocation failed"
    return (
        f"shmvec needs {nbytes:,} bytes of shared memory in {SHM_DIR}, but {have}. "
        "Use fewer envs or smaller observations, or enlarge /dev/shm "
        "(e.g. `docker run --shm-size=2g`, or `mount -o remount,size=4G /dev/shm`)."
    )


class OwnedArena:
    """A shared-memory segment created and owned by this process."""

    def __init__(self, nbytes: int):
        check_capacity(nbytes)
        self._shm = shared_memory.SharedMemory(name=unique_name("arena"), create=True, size=nbytes)
        self.name: str = self._shm.name
        self.nbytes = nbytes
        self._finalizer = weakref.finalize(self, _release, self._shm, os.getpid())
        try:
            # Reserve the pages now: tmpfs otherwise allocates on first touch and a full
            # /dev/shm then kills the toucher with SIGBUS.
            os.posix_fallocate(self._shm._fd, 0, nbytes)
        except OSError as exc:
            self.close()
            raise SharedMemoryCapacityError(_capacity_message(nbytes, None)) from exc

    @property
    def buf(self) -> memoryview:
        return self._shm.buf

    def close(self) -> None:
        """Unlink the segment now; the mapping goes when the last numpy view does. Idempotent."""
        self._finalizer()


def _release(shm: shared_memory.SharedMemory, owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child's copy: the segment is the parent's to unlink
    try:
        shm.unlink()  # the name goes now, so nothing is left in /dev/shm
    except FileNotFoundError:
        pass
    # Never unmap here: numpy views made with ``buffer=`` do not pin the buffer, so
    # munmap would leave live views (a caller's zero-copy obs, a pool's own views at
    # exit) pointing at nothing: a segfault. The views' memoryview keeps the mmap
    # object alive and it unmaps when the last view goes. Only the fd is ours to close.
    if shm._fd >= 0:
        os.close(shm._fd)
        shm._fd = -1
    shm._buf = shm._mmap = None  # SharedMemory.__del__ would otherwise unmap


def attach(name: str, nbytes: int) -> mmap.mmap:
    """Map an existing segment (worker side) without registering it with any tracker."""
    segment = posix_ipc.SharedMemory("/" + name)
    try:
        return mmap.mmap(segment.fd, nbytes)
    finally:
        segment.close_fd()
