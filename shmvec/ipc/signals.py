"""Cross-process signalling: named POSIX semaphores (futex-backed) via posix_ipc.

A :class:`Signal` is a counting semaphore one side posts and the other waits on.
Waiting is *spin-then-block*: poll the semaphore's value for up to ``max_spin`` (a
wake-up costs ~2-15 µs when the peer answers within it) and then fall back to a
blocking ``sem_timedwait`` (~25-40 µs to wake on a quiet machine, 80-110 µs median on
a busy 2-core VM, where waking an idle vCPU goes through the hypervisor, but it frees
the core). Spinning yields the core on every turn, so a spinner sharing a core with the
peer it waits for does not starve it (pure spinning is catastrophic when processes
outnumber cores).

The spin adapts: a signal spins up to ``max_spin`` while most recent waits ended within
it (a moving average of hits, at least :data:`MIN_HIT_RATE`), and blocks at once while
they outgrow it: the peer is busy for long (a policy computing between steps, heavy env
shards), or needs our core. A few waits beyond the bound (a hiccup) do not turn
spinning off; a run of them does. While spinning is off, every :data:`PROBE_EVERY`-th
wait spins for the full ``max_spin`` again (a probe), and only probes update the hit
rate: a blocked wait measures the peer's time *plus* our own wake-up, so learning from
it would keep spinning off for good once it was off. The hit rate is a share of waits,
not an average of their lengths, so one or two long waits (outliers) do not turn
spinning off.

One wait can be told how long to spin (``wait(timeout, spin=...)``), learning nothing:
a worker's wait for its next step, which the main process predicts with each step
(:class:`~shmvec.ipc.protocol.NextWait`: spin through a tight caller loop, block while the
caller's policy computes, as a spinner would take a core from it).

The owner (main process) creates and unlinks every semaphore and registers it with
Python's resource tracker so a SIGKILLed owner still leaves nothing in /dev/shm.
"""

from __future__ import annotations

import os
import time
from multiprocessing import resource_tracker

import posix_ipc

from shmvec.ipc.leftovers import unique_name

_perf_counter = time.perf_counter
_sched_yield = os.sched_yield
PROBE_EVERY = 16  # while spinning is off, one wait in this many spins for max_spin to re-measure
MAX_SPIN = 2e-3  # no wait spins longer (a wake-up costs ~80 µs at worst: spinning longer saves < 4 %)
MIN_HIT_RATE = 0.5  # a signal spins while at least this share of recent waits ended within max_spin
HIT_WEIGHT = 0.25  # weight of the newest wait in the moving average of hits


class Signal:
    """One named semaphore, initially 0. ``post()`` adds one post: it is the semaphore's own
    C method, so no Python code runs between a caller's last store and the post (see
    :meth:`shmvec.engine.link.WorkerLink.post`).

    Args:
        max_spin: upper bound, in seconds, of the adaptive spin before blocking;
            0 disables spinning.
    """

    def __init__(self, sem: posix_ipc.Semaphore, owner: bool, max_spin: float):
        self._sem = sem
        self.name: str = sem.name
        self._owner = owner
        self.max_spin = max_spin
        self._spin = max_spin  # current budget: max_spin, or 0 while spinning is off
        self._hits = 1.0  # moving average of "the wait ended within max_spin"
        self._off_waits = 0  # waits since spinning turned off (counts to the next probe)
        self.post = sem.release
        self.take = sem.acquire  # take(0): one post now, or posix_ipc.BusyError (no spin, no learning)

    @classmethod
    def create(cls, max_spin: float = 0.0) -> Signal:
        sem = posix_ipc.Semaphore("/" + unique_name("sem"), posix_ipc.O_CREX, initial_value=0)
        resource_tracker.register(sem.name, "semaphore")  # unlinked for us if we are killed
        return cls(sem, owner=True, max_spin=max_spin)

    @classmethod
    def open(cls, name: str, max_spin: float = 0.0) -> Signal:
        return cls(posix_ipc.Semaphore(name), owner=False, max_spin=max_spin)

    def wait(self, timeout: float, spin: float | None = None) -> bool:
        """Take one post, spinning first; False if none came within ``timeout`` seconds.

        ``spin``: spin this long this time (nothing is learned), instead of adaptively.
        """
        sem = self._sem
        start = _perf_counter()
        if sem.value:  # already posted: the cheapest case
            try:
                sem.acquire(0)
                return True
            except posix_ipc.BusyError:
                pass
        learn = spin is None
        spin = self._spin if spin is None else spin
        if learn and spin == 0.0 and self.max_spin > 0.0:
            self._off_waits += 1
            if self._off_waits % PROBE_EVERY == 0:  # a probe: spin once to see whether it would pay again
                spin = self.max_spin
        if spin > 0.0:
            end = start + spin
            while True:
                if sem.value:
                    try:
                        sem.acquire(0)
                    except posix_ipc.BusyError:  # another taker won; keep going
                        continue
                    if learn:
                        self._learn(hit=True)
                    return True
                now = _perf_counter()
                if now >= end:
                    break
                _sched_yield()  # polite: lets a peer sharing this core run
            timeout = max(0.0, timeout - (now - start))
        try:
            sem.acquire(timeout)
        except posix_ipc.BusyError:
            return False
        except posix_ipc.SignalError:
            # A signal interrupted the wait. Report "nothing yet": Python runs the handler at
            # the next bytecode; inside a pool call SIGINT's only counts a Ctrl-C, which the
            # caller hands to the script's handler at once, as no post was taken (ipc.interrupts);
            # if that returns, or the signal was another, the caller waits again.
            return False
        if learn and spin > 0.0:  # a blocked wait while off (no probe) says nothing new (see the module doc)
            self._learn(hit=False)
        return True

    def _learn(self, hit: bool) -> None:
        """Count a wait that spun: ``hit`` if it ended while spinning. Spin while most waits do."""
        self._hits += HIT_WEIGHT * (hit - self._hits)
        spin = self.max_spin if self._hits >= MIN_HIT_RATE else 0.0
        if spin > 0.0 and self._spin == 0.0:
            self._off_waits = 0
        self._spin = spin

    def drain(self) -> int:
        """Take every pending post without waiting; return how many there were.

        Each post taken publishes what its poster wrote before it (the value read first
        only says whether to try: a BusyError costs ~1 µs, and scans drain often).
        """
        sem, taken = self._sem, 0
        while sem.value:
            try:
                sem.acquire(0)
            except posix_ipc.BusyError:  # another taker won
                return taken
            taken += 1
        return taken

    def close(self) -> None:
        """Close this handle; the owner also unlinks the name. Idempotent."""
        if self._sem is None:
            return
        sem, self._sem = self._sem, None
        if self._owner:
            try:
                sem.unlink()
            except posix_ipc.ExistentialError:
                pass
            resource_tracker.unregister(sem.name, "semaphore")
        try:
            sem.close()
        except posix_ipc.Error:
            pass
