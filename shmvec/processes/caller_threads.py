"""The caller's threads while a pool steps: torch's thread count, and libgomp's spins.

On a machine with C cores torch runs C intra-op threads. A light policy (an MLP's forward
pass on a batch of envs: a few hundred µs) gains nothing from them, but between its ops
they spin, or sleep and wake, on the cores where the workers step. On 2 cores,
CleanRL-style async PPO on CartPole spent 5.3 s collecting with torch's 2 threads and
2.9 s with one, and a synchronous MLP policy's forward pass lost 80-200 µs a step.

So while the caller's compute between steps is light (the median time from a step's
return to the next step, over :data:`WINDOW` steps, under :data:`LIGHT`), the pool sets
torch's thread count, in the thread that steps, to the cores its workers leave (at least
1, never more than it was). Once that compute turns heavy (over :data:`HEAVY`: a CNN's
forward pass, SAC's gradient step between steps), the count goes back, and ``close()``
restores it. An update between rollouts (no steps for a while) is one sample of a window,
so it does not switch the count back: the update runs on the reduced count too. An MLP
update of RL's usual sizes gains nothing from a second thread on 2 cores (measured: SB3
PPO on Humanoid, CleanRL-style PPO on CartPole); ``torch_threads="unchanged"`` keeps
torch's threads as they are.

Only the count of the thread that steps is changed. torch's count is per thread, but
``torch.set_num_threads`` also sets the count that threads get when they first use torch
(a process-wide default): the pool puts that default back at once (read and written in a
short-lived thread of its own), so other threads, and threads started later, never see the
reduced count. ``close()`` in the thread that stepped gives it its count back; a ``close()``
in another thread (a ``finally:`` block, a finalizer) cannot change a count that is not its
own, so the thread that stepped gets it back at its next step or call into a vector env (the
closed one raises ``ClosedEnvError``), or at its next garbage collection (a training step
allocates), whichever comes first. Pools opened one inside another may close in any order, from any
thread: each undoes its count only while that count is in force, and one closed under a
newer one hands that one the count to go back to (:func:`_settle`). A count the caller sets
itself is kept, unless it is the very count a pool set (the two cannot be told apart); so is
one in force when the thread settles, even a ``threadpool_limits`` block's that ends later.
torch is looked up when the caller steps, never imported.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from typing import Literal

from shmvec.ipc import interrupts
from shmvec.processes.omp_spin import ShortSpin

logger = logging.getLogger("shmvec")

TorchThreadsMode = Literal["auto", "unchanged"] | int
LIGHT = 1e-3  # seconds of caller compute per step under which torch's threads are reduced
HEAVY = 2e-3  # ... over which they go back (hysteresis: no switching on a borderline policy)
WINDOW = 16  # steps whose median caller compute decides (an update between rollouts is one of them)


class CallerThreads:
    """Told of every step the caller asks for (:meth:`step`) and of every result it gets
    back (:meth:`returned`); :meth:`release` at ``close()`` undoes what it changed.

    ``collect_threads``: torch's thread count while the caller's compute is light
    (``auto`` mode), or from the first step on (``fixed=True``: an explicit count);
    ``None`` leaves torch alone. ``short_spin``, if given, is told of every return, and of every
    step while the caller's own CPU time between steps is light (else it lets its team go after
    a pause): a caller that computes for long between steps (SAC's gradient step per env step)
    runs back-to-back ops, which short spins slow down (SAC + HER on FetchReach x4 trained 1.6x
    slower with them), and its workers block through it anyway.
    """

    def __init__(self, collect_threads: int | None, fixed: bool, short_spin: ShortSpin | None, why: str):
        self.collect_threads, self.fixed, self.short_spin, self.why = collect_threads, fixed, short_spin, why
        self.returned_at = 0.0  # when the caller last got results back (perf_counter)
        self.light = True  # the caller's CPU time between steps is light (by the last window's median)
        self._returned_cpu: float | None = None  # its thread's CPU time at the last return (read while gaps are long)
        self._read_cpu = False
        self._cpu_samples: list[float] = []  # its CPU time before each step of this window
        self._samples: list[float] = []  # the caller's compute (wall time) before each step of this window
        self._saved: Reduction | None = None  # while reduced

    def step(self) -> None:
        """The caller asks for a step: note its compute since the last return; every
        :data:`WINDOW` steps, set torch's thread count by their median (wall time), and
        judge the short spin by the median of the caller's own CPU time between steps."""
        if _owed:  # a pool that another thread closed owes this one its count (see the module doc)
            settle_owed()
        spin = self.short_spin
        if spin is not None:
            # A short gap is light whatever it did; only a long one needs the CPU clock, a system
            # call (a point where an oversubscribed machine takes the core away), read at the
            # last return only once gaps are long.
            gap = time.perf_counter() - self.returned_at
            long_gap = gap >= LIGHT
            if long_gap and self._returned_cpu is not None:
                gap = time.thread_time() - self._returned_cpu
            self._read_cpu = long_gap
            cpu = self._cpu_samples
            cpu.append(gap)
            if len(cpu) >= WINDOW:
                median = sorted(cpu)[WINDOW // 2]
                cpu.clear()
                self.light = median <= HEAVY if self.light else median < LIGHT  # hysteresis
            if self.light:
                spin.step()
        if self.collect_threads is None:
            return
        if self.fixed:
            if self._saved is None:
                self._reduce()
            return
        samples = self._samples
        samples.append(time.perf_counter() - self.returned_at)
        if len(samples) < WINDOW:
            return
        caller_time = sorted(samples)[WINDOW // 2]
        samples.clear()
        if self._saved is None:
            if caller_time < LIGHT:
                self._reduce()
        elif caller_time > HEAVY and threading.current_thread() is self._saved.thread:
            self._restore()

    def returned(self) -> None:
        """A step's results went back to the caller: its compute starts now."""
        self.returned_at = time.perf_counter()
        if self.short_spin is not None:
            self.short_spin.returned()
            self._returned_cpu = time.thread_time() if self._read_cpu else None

    def release(self) -> None:
        """Put torch's thread count back (in the thread that stepped: now if it is this one, else
        owed to it, see the module doc) and end the short spins."""
        if self._saved is not None:
            thread = self._saved.thread
            if thread is threading.current_thread():
                self._restore()
            else:
                self._saved.released = True
                _owe(thread)
        self._saved = None
        self.collect_threads = None  # no more changes
        if self.short_spin is not None:
            self.short_spin.release()

    def _reduce(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        before = torch.get_num_threads()
        if before == self.collect_threads or (before < self.collect_threads and not self.fixed):
            return  # "auto" never adds threads
        _set_here(torch, self.collect_threads)
        self._saved = Reduction(before, self.collect_threads)
        _reductions.setdefault(self._saved.thread, []).append(self._saved)
        logger.info(
            "shmvec: torch runs %d thread(s) instead of %d while the caller steps the pool (%s)",
            self.collect_threads,
            before,
            "as asked" if self.fixed else "its compute between steps is light",
        )

    def _restore(self) -> None:
        self._saved.released = True
        self._saved = None
        _settle(threading.current_thread())

    def description(self) -> str:
        """What ``repr`` of a pool shows as ``torch_threads``."""
        return self.why


def _set_here(torch, count: int) -> None:
    """``torch.set_num_threads(count)`` in this thread only: the default it also sets for threads that
    first use torch later is read before and written back after, each in a short-lived thread."""
    default = _in_a_new_thread(torch.get_num_threads)  # what such a thread gets now
    torch.set_num_threads(count)
    if default != count:
        _in_a_new_thread(torch.set_num_threads, default)


def _in_a_new_thread(fn, *args):
    result = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), name="shmvec-torch-default")
    thread.start()
    thread.join()
    return result[0]


class Reduction:
    """A count a pool set in the thread that stepped it, in place of ``before``."""

    def __init__(self, before: int, count: int):
        self.before, self.count, self.thread = before, count, threading.current_thread()
        self.released = False  # the pool no longer wants it: to be undone in its thread


# Each thread's reductions, oldest first. Pools opened one inside another reduce on top of each
# other and may close in any order, from any thread: only the thread itself can set its count,
# and a reduction undoes itself only while its count is in force (else the caller set another).
_reductions: dict[threading.Thread, list[Reduction]] = {}
# Threads that stepped a pool that another thread closed since: they settle at their next step or call.
_owed: set[threading.Thread] = set()


def _settle(thread: threading.Thread) -> None:
    """In ``thread``: undo its released reductions whose count is in force, and forget the rest.

    Reductions above the newest one whose count is in force were undone by the caller (a
    ``threadpool_limits`` block that ended, its own ``set_num_threads``): forgotten. A released
    one under a live one that took its count as ``before`` hands that one its own ``before``; a
    released one in force is undone. The caller's own count is one no pool set: one that equals
    the count of a reduction in force cannot be told from it.
    """
    ledger = _reductions.get(thread)
    torch = sys.modules.get("torch")
    if not ledger or torch is None:
        return
    now = torch.get_num_threads()
    in_force = max((i for i, reduction in enumerate(ledger) if reduction.count == now), default=-1)
    del ledger[in_force + 1 :]
    i = 0
    while i < len(ledger) - 1:
        below, above = ledger[i], ledger[i + 1]
        if below.released:
            if above.before == below.count:
                above.before = below.before
            del ledger[i]
        else:
            i += 1
    if ledger and ledger[-1].released:
        reduction = ledger.pop()
        _set_here(torch, reduction.before)
        logger.info("shmvec: torch runs %d thread(s) again", reduction.before)
    if not ledger:
        del _reductions[thread]


def _owe(thread: threading.Thread) -> None:
    if not thread.is_alive():  # its count died with it
        _reductions.pop(thread, None)
        return
    if _collected not in gc.callbacks:
        gc.callbacks.append(_collected)
    _owed.add(thread)
    logger.info("shmvec: torch's count in %r is put back at its next step or call into an env", thread)


def settle_owed() -> None:
    """Give this thread back the torch count a pool set in it, if another thread closed that pool since."""
    thread = threading.current_thread()
    if thread in _owed:
        _owed.discard(thread)
        _settle(thread)


def _collected(phase: str, info: dict) -> None:
    """At a garbage collection (in the thread that triggered it): settle that thread's count; forget ended threads."""
    if _owed and phase == "start":
        settle_owed()
        for thread in [thread for thread in list(_reductions) if not thread.is_alive()]:
            _reductions.pop(thread, None)
            _owed.discard(thread)


interrupts.on_closed(settle_owed)  # a thread that finds its env closed gets its count back there


def caller_threads_for_pool(
    mode: TorchThreadsMode, n_workers: int, cores: int, short_spin: ShortSpin | None
) -> CallerThreads:
    """The pool's :class:`CallerThreads`: torch's count while the caller's compute is light
    (``"auto"``: the cores the workers leave, at least 1), ``n`` from the first step (an
    int), or unchanged (``"unchanged"``, and ``"auto"`` with no workers)."""
    if mode == "unchanged":
        return CallerThreads(None, False, short_spin, "unchanged")
    if mode != "auto":
        return CallerThreads(int(mode), True, short_spin, f"{mode} while stepping")
    if n_workers == 0:
        return CallerThreads(None, False, short_spin, "unchanged (no workers)")
    count = max(1, cores - n_workers)
    return CallerThreads(count, False, short_spin, f"at most {count} while the policy is light")
