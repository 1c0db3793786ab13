"""The lanes' timing rows as the main process reads them while a lane writes: never a torn entry.

A worker writes a ring entry (start, end, CPU) with three stores while the main process may copy
the ring; the entry at the lane's step count, read first, is the only one that can be in flight."""

from __future__ import annotations

import numpy as np

from shmvec.ipc import timing_rows as tr


def rows_of(n_envs: int = 2, n_workers: int = 1) -> dict[str, np.ndarray]:
    return {name: np.zeros(shape, dtype) for name, shape, dtype in tr.timing_fields(n_envs, n_workers)}


def test_the_entry_a_lane_is_writing_is_left_out():
    views = rows_of()
    views[tr.LANE_TOTALS][0, tr.LANE_STEPS] = 5
    views[tr.LANE_RING][0, 4] = (100, 200, -1)  # the last step written
    views[tr.LANE_RING][0, 5] = (300, 50, -1)  # being written: the new start, the end of RING steps ago
    rows = tr.read_rows(views)
    assert rows.lane_ring[0, 4].tolist() == [100, 200, -1]
    assert rows.lane_ring[0, 5].tolist() == [0, 0, 0]


class _Clocks:
    """Stand-ins for ``time``: a wall clock that moves ``step_ns`` a read, and a CPU clock that counts its reads."""

    def __init__(self, step_ns: int):
        self.now, self.step_ns, self.cpu_reads = 0, step_ns, 0

    def perf_counter_ns(self) -> int:
        self.now += self.step_ns
        return self.now

    def thread_time_ns(self) -> int:
        self.cpu_reads += 1
        return self.now // 2


def test_the_cpu_clock_is_read_at_most_once_per_interval(monkeypatch):
    """A CPU clock read is a system call (where a busy machine's scheduler preempts): fast steps
    read it once per interval, not on every sampled step; slow steps on every sampled step."""
    steps = 64 * tr.ENV_SAMPLE_EVERY
    for step_ns, most in ((50_000, None), (tr.CPU_READ_INTERVAL_NS, steps // tr.ENV_SAMPLE_EVERY)):
        clocks = _Clocks(step_ns)
        monkeypatch.setattr(tr, "time", clocks)
        views = rows_of()
        timer = tr.LaneTimer(views, 0, 0, 2)
        for _ in range(steps):
            stamps = timer.begin()
            if stamps is not None:
                stamps += [clocks.perf_counter_ns() for _ in range(3)]  # before env 0, after each
            timer.end(stamps, [])
        elapsed = clocks.now
        reads = clocks.cpu_reads // 2  # a begin and an end each
        if most is None:  # fast steps: one read per interval of wall time, the first step's included
            assert reads <= elapsed // tr.CPU_READ_INTERVAL_NS + 1 and reads < steps // tr.ENV_SAMPLE_EVERY
        else:
            assert reads == most
        totals = views[tr.LANE_TOTALS][0]
        assert totals[tr.LANE_STEPS] == steps and 0 < totals[tr.LANE_CPU_BUSY] <= totals[tr.LANE_BUSY]
        assert views[tr.ENV_TOTALS][:, tr.ENV_STEPS].sum() == 2 * steps // tr.ENV_SAMPLE_EVERY  # envs timed as before
