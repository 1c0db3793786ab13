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
