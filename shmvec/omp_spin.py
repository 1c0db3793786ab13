"""The caller's OpenMP threads while a pool is open: short spins instead of long ones.

torch's CPU build (and the MKL inside it) runs its intra-op threads on GNU OpenMP
(libgomp). After each parallel region an idle thread spins before it sleeps: 300,000
PAUSE iterations by default (``GOMP_SPINCOUNT``), milliseconds. In a training loop the
policy's forward pass ends in such a region, so through the env step that follows, the
main process's idle OpenMP threads hold cores the workers need: a batch of 8 through a
64-64 MLP, then 2 ms of waiting, kept the second thread of a 2-thread torch 99% busy.

libgomp spins 1,000 iterations instead (its "throttled" count, documented under
``GOMP_SPINCOUNT``) while the process has more OpenMP threads than available CPUs. So
while a pool with workers is open, :class:`ShortSpin` keeps a parked thread whose own
OpenMP team is just large enough to tip that count; the team sleeps and costs nothing.
The policy keeps all its threads (a CNN update needs them), and they go to sleep within
microseconds of each op instead of milliseconds. :meth:`ShortSpin.release` lets the
thread end; libgomp then frees its team and the default spin is back.

Only libgomp is handled (torch's Linux wheels); with another OpenMP runtime, or none
loaded when the pool starts, nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from typing import Literal

logger = logging.getLogger("shmvec")

OmpSpin = Literal["auto", "short", "unchanged"]


def loaded_libgomp() -> str | None:
    """The path of the GNU OpenMP runtime loaded in this process, if any (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libgomp"):
                    return path
    except OSError:
        pass
    return None


def torch_threads() -> int | None:
    """torch's intra-op thread count in the calling thread, if torch is imported (never imports it)."""
    torch = sys.modules.get("torch")
    get_num_threads = getattr(torch, "get_num_threads", None)
    return get_num_threads() if get_num_threads is not None else None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ShortSpin:
    """While alive, libgomp's idle threads in this process spin ~1,000 PAUSEs, not ~300,000.

    A daemon thread asks libgomp for a team of ``team`` threads, once, and then waits;
    libgomp keeps a finished team's threads parked for the thread's next region, and
    counts them while deciding how long idle threads spin. :meth:`release` ends the thread.
    """

    def __init__(self, libgomp_path: str, team: int):
        self.team = team
        gomp = ctypes.CDLL(libgomp_path)  # the already loaded runtime: dlopen returns its handle
        # GOMP_parallel(fn, data, num_threads, flags) runs fn(data) on every thread of a team;
        # omp_get_num_threads ignores the argument, so the region does nothing.
        region = (gomp.GOMP_parallel, ctypes.cast(gomp.omp_get_num_threads, ctypes.c_void_p))
        self._stop, self._parked = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._park, args=region, name="shmvec-omp-spin", daemon=True)
        self._thread.start()
        self._parked.wait(5.0)

    def _park(self, parallel, noop) -> None:
        parallel(noop, None, ctypes.c_uint(self.team), ctypes.c_uint(0))
        self._parked.set()
        self._stop.wait()  # libgomp keeps the team parked for this thread until it ends

    def release(self) -> None:
        """Let the thread end (libgomp frees its team). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)


def short_spin_for_pool(mode: OmpSpin, n_workers: int) -> tuple[ShortSpin | None, str]:
    """Start :class:`ShortSpin` if ``mode`` asks for it; return it (or None) and why, for ``repr``.

    ``"auto"``: when libgomp is loaded, the pool has worker processes to share the cores
    with, and torch (if imported) runs more than one thread. ``"short"``: whenever libgomp
    is loaded. ``"unchanged"``: never.
    """
    if mode == "unchanged":
        return None, "unchanged"
    path = loaded_libgomp()
    if path is None:
        return None, "unchanged (no GNU OpenMP loaded)"
    threads = torch_threads()
    if mode == "auto":
        if n_workers == 0:
            return None, "unchanged (no workers)"
        if threads is not None and threads <= 1:
            return None, "unchanged (torch runs 1 thread)"
    # The main thread's team holds `threads` (the master counts once, as libgomp counts);
    # more than the CPUs in all tips libgomp into short spins.
    team = max(2, usable_cpus() + 2 - (threads or 1))
    try:
        spin = ShortSpin(path, team)
    except (OSError, AttributeError) as exc:  # an odd libgomp: leave it alone
        logger.info("shmvec: could not shorten OpenMP spins (%s)", exc)
        return None, f"unchanged ({type(exc).__name__})"
    why = "short" + (f" (torch: {threads} threads)" if threads is not None else "")
    logger.info("shmvec: caller's OpenMP threads spin short while the pool is open (a parked team of %d)", team)
    return spin, why
