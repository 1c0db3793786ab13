"""The caller's OpenMP threads while a pool is open: short spins instead of long ones.

torch's CPU build (and the MKL inside it) runs its intra-op threads on GNU OpenMP
(libgomp). After each parallel region an idle thread spins before it sleeps: 300,000
PAUSE iterations by default (``GOMP_SPINCOUNT``), milliseconds. In a training loop the
policy's forward pass ends in such a region, so through the env step that follows, the
main process's idle OpenMP threads hold cores the workers need: a batch of 8 through a
64-64 MLP, then 2 ms of waiting, kept the second thread of a 2-thread torch 99% busy.

libgomp spins 1,000 iterations instead (its "throttled" count, documented under
``GOMP_SPINCOUNT``) while the process has more OpenMP threads than available CPUs. So
while the caller steps the pool, :class:`ShortSpin` keeps a parked thread whose own
OpenMP team is just large enough to tip that count; the team sleeps and costs nothing.
The policy keeps all its threads (a CNN update needs them), and through the rollout
they go to sleep within microseconds of each op instead of milliseconds. Once the
caller stops stepping for a while (its update, where back-to-back ops gain from the long
spin: a PPO MLP update ran 15-20 % slower with the short one), the thread ends; libgomp
then frees its team and its default spin is back, and the next step parks it again.

A pause is counted from the last results the caller got back, never during a step: on a
loaded machine a step that waited for a worker the OS had descheduled lasted more than a
tight loop's pause, the team was let go, and parking it again (a thread and its team
started, the caller waiting for both) made the next steps later still: 40 teams parked
in 0.3 s, steps 30x slower. The caller never waits for the team to park.

Only libgomp is handled (torch's Linux wheels); with another OpenMP runtime, or none
loaded when the pool starts, nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from typing import Literal

logger = logging.getLogger("shmvec")

OmpSpin = Literal["auto", "short", "unchanged"]
# The caller is updating its policy, not collecting, once no step came for IDLE_STEPS times
# its usual interval between steps (a policy's forward pass and the step), within these
# bounds: a CleanRL update of 16 minibatches takes ~50 ms, SB3's CNN forward pass ~5 ms.
IDLE_STEPS = 3.0
MIN_IDLE, MAX_IDLE = 2e-3, 50e-3
INTERVAL_WEIGHT = 0.1  # of the newest interval in the moving average
# A step in flight is not a pause, unless its results never came back (it raised) for this long.
LOST_STEP = 1.0


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
    """While engaged, libgomp's idle threads in this process spin ~1,000 PAUSEs, not ~300,000.

    Engaged, a daemon thread has asked libgomp for a team of ``team`` threads, once, and
    waits; libgomp keeps a finished team's threads parked for the thread's next region,
    and counts them while deciding how long idle threads spin. The pool calls
    :meth:`step` with every step, which engages it; it lets itself go once no step came
    for a few of the caller's usual intervals between steps (:data:`IDLE_STEPS`) after
    the last one returned (:meth:`returned`), so that a training loop's update
    (back-to-back ops, where a thread that fell asleep costs a wake-up per op) runs with
    libgomp's own spin, and the next rollout's first step engages it again.
    :meth:`release` ends it for good.
    """

    def __init__(self, libgomp_path: str, team: int):
        self.team = team
        gomp = ctypes.CDLL(libgomp_path)  # the already loaded runtime: dlopen returns its handle
        # GOMP_parallel(fn, data, num_threads, flags) runs fn(data) on every thread of a team;
        # omp_get_num_threads ignores the argument, so the region does nothing.
        self._region = (gomp.GOMP_parallel, ctypes.cast(gomp.omp_get_num_threads, ctypes.c_void_p))
        self._released = threading.Event()
        self._last_step = 0.0
        self._returned_at = 0.0  # when the caller last got results back
        self._in_flight = False  # a step was asked for and its results have not come back
        self._interval = MAX_IDLE / IDLE_STEPS  # moving average of the intervals between steps
        self.idle = MAX_IDLE  # no step for this long: the caller paused (IDLE_STEPS intervals)
        self.engaged = False
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        """The caller steps: keep the team parked (park it if it is not)."""
        now = time.perf_counter()
        interval = now - self._last_step
        if interval < self.idle:  # a step of a rollout (not the first one after a pause)
            self._interval += INTERVAL_WEIGHT * (interval - self._interval)
            self.idle = min(MAX_IDLE, max(MIN_IDLE, IDLE_STEPS * self._interval))
        self._last_step = now
        self._in_flight = True
        if not self.engaged and not self._released.is_set():
            self.engaged = True
            # Not waited for: the first ops after a pause may spin long once, a wait for a
            # new thread on a loaded machine costs the caller milliseconds.
            self._thread = threading.Thread(target=self._park, name="shmvec-omp-spin", daemon=True)
            self._thread.start()

    def returned(self) -> None:
        """A step's results went back to the caller: a pause, if any, starts now."""
        self._returned_at = time.perf_counter()
        self._in_flight = False

    def paused_for(self, now: float) -> float | None:
        """How long the caller has not been stepping; None while a step is in flight (unless
        its results never came back for :data:`LOST_STEP`: then the pause counts from then)."""
        if self._in_flight:
            lost = now - self._last_step - LOST_STEP
            return lost if lost >= 0.0 else None
        return now - max(self._returned_at, self._last_step)

    def _park(self) -> None:
        parallel, noop = self._region
        parallel(noop, None, ctypes.c_uint(self.team), ctypes.c_uint(0))
        while True:  # the team stays parked until this thread ends
            paused = self.paused_for(time.perf_counter())
            # A step in flight: look again one idle period later, not when it would count as lost,
            # so that the team is let go within an idle period of the rollout's last step (a PPO
            # update that began with the team parked ran its first ~0.8 s with short spins).
            left = self.idle if paused is None else self.idle - paused
            if left <= 0.0 or self._released.wait(left):
                break
        self.engaged = False

    def release(self) -> None:
        """End the thread (libgomp frees its team) and engage no more. Idempotent."""
        self._released.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(5.0)


def short_spin_for_pool(mode: OmpSpin, n_workers: int) -> tuple[ShortSpin | None, str]:
    """A :class:`ShortSpin` if ``mode`` asks for one (None otherwise), and why, for ``repr``.

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
