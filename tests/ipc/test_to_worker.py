"""What crosses a worker's pipe arrives as pickle would deliver it (shmvec.ipc.wire)."""

from __future__ import annotations

import pickle
import sys

import cloudpickle
import numpy as np
import pytest

from shmvec.ipc.wire import dumps, from_main, to_worker

GRID = np.arange(12.0).reshape(3, 4)
READ_ONLY = GRID.copy()
READ_ONLY.flags.writeable = False
ARRAYS = {
    "c_order": GRID,
    "f_order": np.asfortranarray(GRID),
    "strided": GRID[:, ::2],
    "read_only": READ_ONLY,
    "zero_d": np.array(3.5),
    "bool": GRID > 3,
    "structured": np.zeros(3, [("x", "f4"), ("y", "i8")]),
    "objects": np.array([{}, None, "x"], dtype=object),
    "empty": np.zeros((0, 3), np.float32),
    "her_batch": np.random.default_rng(0).uniform(-1, 1, (256, 3)),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_an_array_arrives_as_pickle_would_deliver_it(name):
    array = ARRAYS[name]
    got, want = from_main(to_worker(array)), pickle.loads(pickle.dumps(array, protocol=5))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tolist() == want.tolist()
    for flag in ("writeable", "c_contiguous", "f_contiguous"):
        assert getattr(got.flags, flag) == getattr(want.flags, flag), flag


def test_arrays_travel_out_of_band_and_arrive_as_copies():
    achieved, desired = ARRAYS["her_batch"], ARRAYS["her_batch"] * 2
    blob = to_worker(("compute_reward", (achieved, desired, [{} for _ in range(256)])))
    assert blob[:1] == b"B"  # framed: the pickle, then the arrays' bytes
    name, (got_achieved, got_desired, infos) = from_main(blob)
    assert name == "compute_reward" and infos == [{}] * 256
    assert np.array_equal(got_achieved, achieved) and np.array_equal(got_desired, desired)
    got_achieved[0, 0] = 7.0  # the worker's own copy
    assert achieved[0, 0] != 7.0 and np.array_equal(from_main(blob)[1][0], achieved)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_a_reply_of_arrays_arrives_as_pickle_would_deliver_it(name):
    """A rare call's ``{env: result}``: plain arrays by their bytes, dtype character and shape; others by numpy."""
    reply = {0: ARRAYS[name], 3: ARRAYS[name]}
    blob = dumps(reply)
    got, want = pickle.loads(blob), pickle.loads(pickle.dumps(reply, protocol=5))
    assert list(got) == [0, 3] and got[0] is got[3]  # one object twice, as pickle keeps it
    for flag in ("writeable", "c_contiguous", "f_contiguous"):
        assert getattr(got[0].flags, flag) == getattr(want[0].flags, flag), flag
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape and got[0].tolist() == want[0].tolist()
    plain = name in ("c_order", "zero_d", "bool", "empty", "her_batch")
    assert (b"array_from" in blob) == plain and (b"numpy" in blob) != plain


def test_plain_data_is_a_plain_pickle():
    blob = to_worker({"a": [1, 2.5, "x"], "b": None})
    assert blob == pickle.dumps({"a": [1, 2.5, "x"], "b": None}, protocol=5)
    assert from_main(blob) == {"a": [1, 2.5, "x"], "b": None}


def test_what_pickle_cannot_name_goes_by_cloudpickle(monkeypatch):
    """A lambda (pickle fails) and a class of the main script (a worker does not run it)."""

    def double(x):
        return 2 * x

    assert to_worker(double) == cloudpickle.dumps(double, protocol=5)
    assert from_main(to_worker(lambda x: x + 1))(1) == 2

    class Goal:
        pass

    Goal.__module__, Goal.__qualname__ = "__main__", "Goal"  # as if the script defined it
    monkeypatch.setattr(sys.modules["__main__"], "Goal", Goal, raising=False)
    payload = [Goal(), np.zeros(3)]
    assert b"__main__" in pickle.dumps(payload, protocol=5)  # pickle would name it ...
    assert to_worker(payload) == cloudpickle.dumps(payload, protocol=5)  # ... cloudpickle carries it
