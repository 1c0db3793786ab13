"""Where the main thread's time goes, as a vector env sees it: the caller's, or inside its calls.

The adapters' public calls are wrapped (:func:`timed_step`, :func:`timed_call`): the time
between two calls is the caller's (its policy, its updates, its logging); inside a step
call the engine says how long it stepped the main shard's envs (:meth:`CallClock.stepped`)
and how long it waited for the workers (:meth:`CallClock.waited`); the rest of a step call
is the library's own work (actions in, results out, infos, copies). Other calls (resets,
``env_method``, attributes) are counted apart. A few ``perf_counter`` reads and float
additions per call, always on; the last :data:`RING` steps are kept for the stragglers and
the timeline (:mod:`~shmvec.clocks.timings`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from shmvec.ipc.timing_rows import RING

F = TypeVar("F", bound=Callable[..., Any])


class CallClock:
    """Running totals (seconds) of the main thread's time since the clock was made or reset."""

    def __init__(self):
        now = time.perf_counter()
        self.since = self.left_at = self.entered_at = now
        self.depth = 0  # calls in progress (a public call may make another)
        self.caller = self.in_steps = self.in_calls = self.main_envs = self.waiting = self.remote = 0.0
        self.steps = 0
        self.baseline: Any = None  # the pool's timing rows when the clock was reset (their counts start there)
        self._wait_start = self._wait_end = 0.0
        self._step_started: float | None = None  # a step started by a call before the one that ends it
        # The last RING steps: entered, waiting from, waiting until, left (perf_counter seconds).
        self.ring_in, self.ring_wait_from = [0.0] * RING, [0.0] * RING
        self.ring_wait_to, self.ring_out = [0.0] * RING, [0.0] * RING

    def enter(self) -> None:
        self.depth += 1
        if self.depth == 1:
            now = self.entered_at = time.perf_counter()
            self.caller += now - self.left_at
            self._wait_start = self._wait_end = now

    def leave(self, kind: int) -> None:
        """``kind``: :data:`CALL`, :data:`STEP_START` or :data:`STEP_END` (see the decorators)."""
        self.depth -= 1
        if self.depth:
            return
        now = self.left_at = time.perf_counter()
        if kind == CALL:
            self.in_calls += now - self.entered_at
            return
        self.in_steps += now - self.entered_at
        if kind == STEP_START:
            if self._step_started is None:
                self._step_started = self.entered_at
            return
        started, self._step_started = self._step_started or self.entered_at, None
        slot = self.steps % RING
        self.ring_in[slot], self.ring_out[slot] = started, now
        self.ring_wait_from[slot], self.ring_wait_to[slot] = self._wait_start, self._wait_end
        self.steps += 1

    def whole_step(self, entered: float, left: float) -> None:
        """A step call that ran from ``entered`` to ``left`` (perf_counter) and waited for no worker,
        counted as :meth:`enter` then :meth:`leave` would count it (the in-process step: one call, two clock reads)."""
        if self.depth:  # inside another public call: that call's time already counts
            return
        self.caller += entered - self.left_at
        self.entered_at, self.left_at = entered, left
        self.in_steps += left - entered
        started, self._step_started = self._step_started or entered, None
        slot = self.steps % RING
        self.ring_in[slot], self.ring_out[slot] = started, left
        self.ring_wait_from[slot] = self.ring_wait_to[slot] = self._wait_start = self._wait_end = entered
        self.steps += 1

    def whole_call(self, entered: float, left: float) -> None:
        """A call other than a step that ran from ``entered`` to ``left`` (perf_counter), counted as
        :meth:`enter` then :meth:`leave` would count it (an in-process reset: one call, two clock reads)."""
        if self.depth:  # inside another public call: that call's time already counts
            return
        self.caller += entered - self.left_at
        self.entered_at, self.left_at = entered, left
        self.in_calls += left - entered

    def stepped(self, seconds: float) -> None:
        """The call stepped the main shard's envs for ``seconds``."""
        self.main_envs += seconds

    def waited(self, start: float, end: float, remote: float = 0.0) -> None:
        """The call waited for workers from ``start`` to ``end`` (perf_counter); ``remote``: of which
        the slowest Ray node stepped this long (the rest: the network)."""
        self.waiting += end - start
        self.remote += remote
        self._wait_start, self._wait_end = start, end

    def reset(self, rows: Any = None) -> None:
        """Totals from now on (a call in progress counts from now); ``rows``: the pool's timing rows now."""
        now = time.perf_counter()
        self.since, self.baseline = now, rows
        self.caller = self.in_steps = self.in_calls = self.main_envs = self.waiting = self.remote = 0.0
        self.steps = 0
        if self.depth:
            self.entered_at = now
        else:
            self.left_at = now


class NoClock(CallClock):
    """The clock of a pool made with ``timings=False``: it counts nothing."""

    def whole_step(self, entered: float, left: float) -> None:
        pass

    def whole_call(self, entered: float, left: float) -> None:
        pass

    def enter(self) -> None:
        pass

    def leave(self, kind: int) -> None:
        pass

    def stepped(self, seconds: float) -> None:
        pass

    def waited(self, start: float, end: float, remote: float = 0.0) -> None:
        pass


CALL, STEP_START, STEP_END = 0, 1, 2


def _timed(kind: int) -> Callable[[F], F]:
    def decorate(method: F) -> F:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            clock = self._clock
            clock.enter()
            try:
                return method(self, *args, **kwargs)
            finally:
                clock.leave(kind)

        return call  # type: ignore[return-value]

    return decorate


timed_step = _timed(STEP_END)  # a call that ends a step or returns an async batch (step, step_wait, recv)
timed_step_start = _timed(STEP_START)  # a call that starts one (step_async, send)
timed_call = _timed(CALL)  # any other public call: resets, env_method, attributes
