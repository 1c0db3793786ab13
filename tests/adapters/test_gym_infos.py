"""``ShmVectorEnv``'s infos built a column at a time from the info rows are exactly those of
Gymnasium's per-env ``_add_info`` in env order: dtypes set by the first env that has a key,
later values cast into them, masks, key order, pipe records between the rows, and the
cases columns cannot reproduce (objects, nested dicts, other shapes, numpy bools)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from shmvec.adapters.async_batches import _BatchInfos
from shmvec.adapters.gym_infos import add_step_infos
from shmvec.ipc import info_rows
from shmvec.ipc.info_rows import InfoReader, InfoWriter
from shmvec.ipc.layout import ArenaLayout, shard_bounds
from shmvec.ipc.protocol import StepInfo
from tests.helpers import assert_same

pytestmark = (
    pytest.mark.vector_api
)  # ShmVectorEnv's infos, against Gymnasium 1.1's _add_info: Gymnasium 1.1 on (tests/conftest.py)

N_ENVS, N_WORKERS = 6, 2
MUJOCO = {"x_position": np.float64(0.25), "reward_ctrl": np.float32(-0.5), "reward_survive": 1.0, "t": 3}

CASES = {
    "mujoco, every env": [{**MUJOCO, "x_position": np.float64(i)} for i in range(N_ENVS)],
    "some envs without infos": [MUJOCO, {}, MUJOCO, MUJOCO, {}, {}],
    "int first, then floats cast into it": [{"a": 1}, {"a": 2.75}, {"a": -1.5}, {"a": 2.5}, {"a": 7}, {"a": True}],
    "float first, then ints": [{"a": 0.5}, {"a": 3}, {"a": 1}, {"a": 2}, {"b": 1}, {"a": 9}],
    "keys first seen in a later worker": [{"a": 1.0}, {}, {}, {"b": np.int16(4), "a": 2.0}, {"b": np.int16(5)}, {}],
    "numpy scalars and arrays": [
        {"z": np.complex64(1 - 2j), "v": np.array([1.0, 2.0]), "u": np.uint64(2**64 - 1)} for _ in range(N_ENVS)
    ],
    "numpy bools are objects": [{"done": np.bool_(i % 2)} for i in range(N_ENVS)],
    "a final_obs key": [{"final_obs": 1.5}] * N_ENVS,
    "a user key that looks like a mask": [{"a": 1.0, "_a": 2.0}] * N_ENVS,
    "a nested dict before rows of the same key": [{}, {"a": {"n": 1}}, {}, {"a": 3.0}, {}, {}],  # fails in both
    "an object value before rows of the same key": [{}, {"a": "text"}, {"a": 1.5}, {"a": 2.5}, {"a": 0.0}, {}],
    "pipe records between rows": [{"a": 1.0}, {"a": 2.0, "s": "x"}, {"a": 3.0}, {"s": "y"}, {"a": 4.0}, {"a": 5}],
}


@pytest.fixture
def arena():
    layout = ArenaLayout.plan(spaces.Box(-1, 1, (2,)), spaces.Discrete(2), N_ENVS, N_WORKERS)
    return layout.views(memoryview(bytearray(layout.nbytes)))


def step_infos(arena, infos: list[dict]) -> tuple[list[StepInfo], list]:
    """What a step's workers leave: rows where an info fits one, records (the pipe) where not."""
    writers = [InfoWriter(arena, k) for k in range(N_WORKERS)]
    codes, records = arena[info_rows.INFO_CODE], []
    for k, (start, stop) in enumerate(shard_bounds(N_ENVS, N_WORKERS)):
        for i in range(start, stop):
            codes[i] = writers[k].write(i, infos[i]) if infos[i] else 0
            if infos[i] and not codes[i]:
                records.append(StepInfo(i, infos[i]))
    return records, InfoReader(arena, shard_bounds(N_ENVS, N_WORKERS), N_WORKERS).groups()


def reference(infos: list[dict]) -> dict:
    add_info, out = _BatchInfos(N_ENVS)._add_info, {}
    for i, info in enumerate(infos):
        out = add_info(out, info, i)
    return out


def outcome(add) -> tuple[str, object]:
    try:
        return "infos", add()
    except Exception as exc:  # Gymnasium's own failures must be reproduced too
        return "error", f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("infos", CASES.values(), ids=CASES.keys())
def test_columns_equal_the_per_env_additions(arena, infos):
    records, groups = step_infos(arena, infos)
    assert groups, "the case should put some infos in rows"
    got = outcome(lambda: add_step_infos({}, _BatchInfos(N_ENVS)._add_info, N_ENVS, records, groups))
    assert_same(got, outcome(lambda: reference(infos)))


def test_the_usual_step_is_one_group_for_all_workers(arena):
    records, groups = step_infos(arena, CASES["mujoco, every env"])
    assert not records and [(g.first, g.envs) for g in groups] == [(0, slice(0, 6))]


def test_arrays_of_another_shape_fail_as_they_do_in_gymnasium(arena):
    infos = [{"v": np.zeros(2)}, {}, {}, {"v": np.zeros(3)}, {}, {}]
    records, groups = step_infos(arena, infos)
    got = outcome(lambda: add_step_infos({}, _BatchInfos(N_ENVS)._add_info, N_ENVS, records, groups))
    assert got[0] == "error" and got == outcome(lambda: reference(infos))
