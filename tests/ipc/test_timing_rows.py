"""The lanes' timing rows as the main process reads them while a lane writes: never a torn entry."""

from __future__ import annotations

import sys
import threading

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


def test_no_torn_entry_while_a_lane_writes():
    """A lane stepping as fast as it can in another thread, the reader copying the rows meanwhile."""
    views = rows_of()
    timer = tr.LaneTimer(views, 0, 0, 1)
    stop = threading.Event()

    def lane() -> None:
        while not stop.is_set():
            stamps = timer.begin()
            timer.end(stamps, [])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads between the lane's stores as often as CPython allows
    writer = threading.Thread(target=lane)
    writer.start()
    torn = 0
    try:
        for _ in range(20_000):
            ring = tr.read_rows(views).lane_ring[0]
            written = ring[:, tr.RING_END] != 0
            torn += int(np.count_nonzero(ring[written, tr.RING_END] < ring[written, tr.RING_START]))
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(interval)
    assert views[tr.LANE_TOTALS][0, tr.LANE_STEPS] > tr.RING  # the lane went round its ring
    assert torn == 0
