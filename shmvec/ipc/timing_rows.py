"""Shared rows where each lane (a worker, or the main process's shard) writes when its steps ran.

Per lane, a ring of its last :data:`RING` steps (start and end on the system-wide monotonic
clock, in ns, and the thread's CPU time in between, -1 where not read) and running totals;
on every :data:`ENV_SAMPLE_EVERY`-th step of a lane, how long each of its envs' own step took
(a histogram per env in quarter octaves, and totals, its resets counted apart), and on such a
step at most once per :data:`CPU_READ_INTERVAL_NS` the lane's CPU time. The writer
(:class:`LaneTimer`) stores plain integers through memoryviews (~0.9 µs per lane step, nothing
per env on the other steps); the main process reads the rows only when asked (:func:`read_rows`),
after the steps it reads were published by their semaphores.

The CPU clock is read sparingly because it is a system call, and a system call is where a busy
machine's scheduler takes the core away: on the 2-core VM under load, ``time.thread_time_ns()``
took 3 µs at the median but 36-100 µs on average in a stepping loop (``perf_counter_ns``,
answered without entering the kernel: 0.5-1 µs).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

LANE_RING, LANE_TOTALS, ENV_HIST, ENV_TOTALS = "lane_ring", "lane_totals", "env_hist", "env_totals"
RING = 512  # steps each lane keeps: the timeline and the stragglers are read from them
RING_START, RING_END, RING_CPU = 0, 1, 2  # columns of a ring entry
# Columns of a lane's totals (ns): its steps, their wall time, and on the sampled steps (below) the
# thread's CPU time and those steps' wall time (a CPU clock read is a system call, ~0.6 µs).
LANE_STEPS, LANE_BUSY, LANE_CPU, LANE_CPU_BUSY = 0, 1, 2, 3
ENV_STEPS, ENV_STEP_NS, ENV_RESETS, ENV_RESET_NS = 0, 1, 2, 3  # columns of an env's totals (sampled steps)
ENV_SAMPLE_EVERY = 16  # a lane times each of its envs on one step in this many
CPU_READ_INTERVAL_NS = 10_000_000  # and on such a step reads its CPU clock if it has not for this long
HIST_BINS, BINS_PER_OCTAVE = 96, 4  # bin b holds steps of 1 µs * 2**(b / 4) up to the next: 1 µs to 16 s
_HIST_FLOOR_NS = 1000


def timing_fields(n_envs: int, n_workers: int) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """The arena fields of a pool's timing rows: a lane per worker, and one for the main shard (the last)."""
    lanes = n_workers + 1
    return [
        (LANE_RING, (lanes, RING, 3), np.dtype(np.int64)),
        (LANE_TOTALS, (lanes, 4), np.dtype(np.int64)),
        (ENV_HIST, (n_envs, HIST_BINS), np.dtype(np.int32)),
        (ENV_TOTALS, (n_envs, 4), np.dtype(np.int64)),
    ]


def _ints(view: np.ndarray, fmt: str) -> memoryview:
    return memoryview(view).cast("B").cast(fmt)  # item stores ~4x cheaper than numpy's


class LaneTimer:
    """Written by the lane that steps envs ``[start, stop)``: call :meth:`begin` before a step and
    :meth:`end` after it (before its post). :meth:`begin` returns a list on the steps whose envs
    are timed one by one: the lane appends ``time.perf_counter_ns()`` before the first env's step
    and after each env's step, and lists in ``resets`` the envs (0-based in the shard) that reset in that step."""

    def __init__(self, views: dict[str, np.ndarray], lane: int, start: int, stop: int):
        self._ring = _ints(views[LANE_RING][lane], "q")
        self._totals = _ints(views[LANE_TOTALS][lane], "q")
        self._hist = _ints(views[ENV_HIST][start:stop], "i")
        self._env_totals = _ints(views[ENV_TOTALS][start:stop], "q")
        self._steps = self._totals[LANE_STEPS]  # kept here too: this timer is the lane's only writer
        self._started = self._cpu = self._took = 0
        self._cpu_read_at = -CPU_READ_INTERVAL_NS  # the first sampled step reads it

    def begin(self) -> list[int] | None:
        started = self._started = time.perf_counter_ns()
        if self._steps % ENV_SAMPLE_EVERY:
            self._cpu = -1
            return None
        if started - self._cpu_read_at >= CPU_READ_INTERVAL_NS:
            self._cpu_read_at = started
            self._cpu = time.thread_time_ns()
        else:
            self._cpu = -1
        return []

    def end(self, stamps: list[int] | None = None, resets: list[int] | None = None) -> None:
        ended = time.perf_counter_ns()
        totals, started, cpu, steps = self._totals, self._started, self._cpu, self._steps
        took = self._took = ended - started
        if cpu >= 0:
            cpu = time.thread_time_ns() - cpu
            totals[LANE_CPU] += cpu
            totals[LANE_CPU_BUSY] += took
        ring, slot = self._ring, (steps % RING) * 3
        ring[slot + RING_START], ring[slot + RING_END], ring[slot + RING_CPU] = started, ended, cpu
        totals[LANE_BUSY] += took
        totals[LANE_STEPS] = self._steps = steps + 1  # after the entry: read_rows leaves the one at this count out
        if stamps:
            self._record_envs(stamps, resets or ())

    def took_ns(self, unfinished: bool = False) -> int:
        """How long the last step took (ns), from its own clock reads; ``unfinished``: the step
        :meth:`begin` started and that raised before :meth:`end`, until now."""
        return time.perf_counter_ns() - self._started if unfinished else self._took

    def _record_envs(self, stamps: list[int], resets) -> None:
        hist, totals, previous = self._hist, self._env_totals, stamps[0]
        for j, stamp in enumerate(stamps[1:]):
            took, previous = stamp - previous, stamp
            row = 4 * j
            if j in resets:
                totals[row + ENV_RESETS] += 1
                totals[row + ENV_RESET_NS] += took
                continue
            totals[row + ENV_STEPS] += 1
            totals[row + ENV_STEP_NS] += took
            hist[j * HIST_BINS + hist_bin(took)] += 1


def hist_bin(ns: int) -> int:
    """The histogram bin of a step of ``ns`` nanoseconds."""
    if ns <= _HIST_FLOOR_NS:
        return 0
    return min(HIST_BINS - 1, int(BINS_PER_OCTAVE * math.log2(ns / _HIST_FLOOR_NS)))


def bin_seconds(b: np.ndarray | int) -> np.ndarray | float:
    """The middle of histogram bin ``b``, in seconds."""
    return _HIST_FLOOR_NS * 1e-9 * 2.0 ** ((np.asarray(b) + 0.5) / BINS_PER_OCTAVE)


class Rows(NamedTuple):
    """A copy of a pool's timing rows (see the module's fields), read by the main process."""

    lane_ring: np.ndarray  # (lanes, RING, 3) int64
    lane_totals: np.ndarray  # (lanes, 4) int64
    env_hist: np.ndarray  # (n_envs, HIST_BINS) int32
    env_totals: np.ndarray  # (n_envs, 4) int64

    def minus(self, earlier: Rows) -> Rows:
        """Counts since ``earlier`` (the ring is kept whole: its entries carry their times)."""
        return Rows(
            self.lane_ring,
            self.lane_totals - earlier.lane_totals,
            self.env_hist - earlier.env_hist,
            self.env_totals - earlier.env_totals,
        )


def read_rows(views: dict[str, np.ndarray]) -> Rows:
    """A copy of the rows. A lane may be writing its next ring entry meanwhile (a worker's step in
    flight: at most one per lane, as each waits for a post of the main process): the entry at its
    step count, read before the ring, is left out (zeros, as an entry never written), never torn."""
    totals = views[LANE_TOTALS].copy()
    ring = views[LANE_RING].copy()
    ring[np.arange(len(ring)), totals[:, LANE_STEPS] % RING] = 0
    return Rows(ring, totals, views[ENV_HIST].copy(), views[ENV_TOTALS].copy())
