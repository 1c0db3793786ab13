"""Per-step infos in shared rows: every value comes back as the env returned it, whatever cannot
travel in a row is refused (and then pickled), and the pools use the rows for real envs."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec import ShmPoolVecEnv
from shmvec.ipc import info_rows
from shmvec.ipc.info_rows import MAX_SCHEMAS, InfoReader, InfoWriter, fast_copy, schema_of
from shmvec.ipc.layout import ArenaLayout, shard_bounds
from tests.envs import TAXI, make_info_types
from tests.helpers import assert_same

N_ENVS, N_WORKERS = 6, 2

ROW_INFOS = [
    {"x_position": np.float64(0.25), "reward_ctrl": np.float32(-0.5), "reward_survive": 1.0},
    {"lives": 3, "episode_frame_number": 2**62, "frame_number": -7, "done": True},
    {
        "half": np.float16(1.5),
        "wide": np.longdouble(1) / 3,
        "z": np.complex64(1 - 2j),
        "i8": np.int8(-128),
        "u64": np.uint64(2**64 - 1),
        "b": np.bool_(True),
        "nan": np.float64("nan"),
        "neg_zero": -0.0,
    },
    {
        "tendon_length": np.array([0.5, -1.25]),
        "mask": np.array([[1, 0, 1]], dtype=np.int8),
        "big_endian": np.arange(3, dtype=">f8"),
        "bools": np.array([True, False]),
    },
]

PICKLED_INFOS = [
    {"stats": {"t": 1}},  # nested
    {"name": "level-1"},
    {"none": None},
    {"objects": np.array([1, "a"], dtype=object)},
    {1: 0.5},  # a key that is not a string
    {"": 0.5},
    {"empty": np.zeros(0)},
    {"zero_d": np.array(1.5)},
    {"too_big": np.zeros(100)},  # 800 bytes: more than a row
    {"when": np.datetime64("2026-01-01")},
]


@pytest.fixture
def arena():
    layout = ArenaLayout.plan(spaces.Box(-1, 1, (2,)), spaces.Discrete(2), N_ENVS, N_WORKERS)
    buffer = bytearray(layout.nbytes)
    return layout.views(memoryview(buffer))


def reader_for(views) -> InfoReader:
    return InfoReader(views, shard_bounds(N_ENVS, N_WORKERS), N_WORKERS)


def test_values_come_back_with_the_types_and_bytes_the_env_returned(arena):
    writers = [InfoWriter(arena, k) for k in range(N_WORKERS)]
    sent = {}
    for i in range(N_ENVS):
        info = ROW_INFOS[i % len(ROW_INFOS)]
        code = writers[i // 3].write(i, info)
        assert code > 0, f"{info} should fit a row"
        arena[info_rows.INFO_CODE][i] = code
        sent[i] = info
    got = reader_for(arena).infos()
    assert [i for i, _ in got] == sorted(sent)  # env order, across schemas and workers
    for i, info in got:
        assert_same(info, sent[i], f"env {i}")
        for value, original in zip(info.values(), sent[i].values()):
            assert value is not original or not isinstance(value, np.ndarray)  # arrays are copies


@pytest.mark.parametrize("info", ROW_INFOS, ids=["mujoco", "atari", "numpy_scalars", "arrays"])
def test_shards_whose_envs_share_a_schema_come_back_whole_or_in_part(arena, info):
    """The usual step (every env of a shard wrote a row of one schema) and a step where one
    env's info went through the pipe instead."""
    sent = [{**info, "env": i} for i in range(N_ENVS)]  # one schema, values of each env's own
    writers = [InfoWriter(arena, k) for k in range(N_WORKERS)]
    codes, rows = arena[info_rows.INFO_CODE], arena[info_rows.INFO_ROWS]
    for k, (start, stop) in enumerate(shard_bounds(N_ENVS, N_WORKERS)):
        for i in range(start, stop):
            codes[i] = writers[k].write(i, sent[i])
    assert len(set(codes.tolist())) == 1
    reader = reader_for(arena)
    got = reader.infos()
    assert_same(got, list(enumerate(sent)))
    assert not any(np.shares_memory(value, rows) for _, got_info in got for value in got_info.values())
    codes[4] = 0
    assert_same(reader.infos(), [(i, sent[i]) for i in range(N_ENVS) if i != 4])


def test_neighbouring_shards_of_one_schema_make_one_group(arena):
    """Many workers of a few envs each: one group while their schemas agree, split where they do not."""
    writers = [InfoWriter(arena, k) for k in range(N_WORKERS)]
    codes = arena[info_rows.INFO_CODE]
    sent = [{"reward_ctrl": -0.5 * i, "x": float(i)} for i in range(N_ENVS)]
    for k, (start, stop) in enumerate(shard_bounds(N_ENVS, N_WORKERS)):
        for i in range(start, stop):
            codes[i] = writers[k].write(i, sent[i])
    reader = reader_for(arena)
    (group,) = reader.groups()
    assert group.envs == slice(0, N_ENVS) and group.first == 0
    assert_same(reader.infos(), list(enumerate(sent)))
    codes[4] = writers[1].write(4, {"other": 1})  # a second schema in the second shard
    groups = reader.groups()
    assert [g.envs for g in groups][0] == slice(0, 3) and len(groups) == 3
    assert_same(reader.infos(), [(i, {"other": 1} if i == 4 else sent[i]) for i in range(N_ENVS)])


@pytest.mark.parametrize("info", PICKLED_INFOS, ids=lambda info: next(iter(info)).__repr__())
def test_what_cannot_travel_in_a_row_is_refused(arena, info):
    assert schema_of(info) is None
    assert InfoWriter(arena, 0).write(0, info) == 0


def test_ints_beyond_int64_are_refused_and_other_array_shapes_get_a_schema_or_two(arena):
    writer = InfoWriter(arena, 0)
    assert writer.write(0, {"lives": 3, "arm": np.zeros(2)}) == 1
    assert writer.write(0, {"lives": 2**70, "arm": np.zeros(2)}) == 0
    assert writer.write(0, {"lives": 3, "arm": np.zeros(3)}) == 2
    assert writer.write(0, {"lives": 3, "arm": np.zeros(2, np.float32)}) == 0  # a third shape or dtype: pickled
    assert writer.write(0, {"lives": 4, "arm": np.ones(2)}) == 1
    assert writer.write(0, {"lives": 4, "arm": np.ones(3)}) == 2


def test_each_key_set_and_type_set_is_a_schema_up_to_the_limit(arena):
    writer = InfoWriter(arena, 1)
    codes = [writer.write(3, {f"key{n}": 1.0}) for n in range(MAX_SCHEMAS + 2)]
    assert codes == [*range(1, MAX_SCHEMAS + 1), 0, 0]
    assert writer.write(3, {"key0": 1.0}) == 1  # known ones keep their code
    assert writer.write(3, {"key0": np.float64(1.0)}) == 0  # another type: another schema, none left
    assert writer.write(3, {"key1": 2.0, "key0": 1.0}) == 0  # key order matters: dicts keep it


def test_a_replaced_worker_starts_its_schemas_afresh(arena):
    reader = reader_for(arena)
    codes = arena[info_rows.INFO_CODE]
    old = InfoWriter(arena, 0)
    codes[0] = old.write(0, {"a": 1.0})
    assert_same(reader.infos(), [(0, {"a": 1.0})])
    reader.forget(0, 0, 3)
    assert not codes.any()
    new = InfoWriter(arena, 0)  # its code 1 means something else now
    codes[1] = new.write(1, {"b": np.int64(5)})
    assert_same(reader.infos(), [(1, {"b": np.int64(5)})])


def test_fast_copy_is_as_independent_as_deepcopy():
    for info in ROW_INFOS + PICKLED_INFOS:
        assert_same(fast_copy(info), copy.deepcopy(info), repr(info))
    arm = np.zeros(2)
    info = {"arm": arm, "same_arm": arm, "other": np.ones(2)}
    copied = fast_copy(info)
    assert copied["arm"] is copied["same_arm"] and copied["arm"] is not arm  # one array stays one
    copied = fast_copy({"arm": arm})
    arm[0] = 5.0
    assert copied["arm"][0] == 0.0


def test_a_pool_sends_its_workers_step_infos_through_the_rows(closing):
    venv = closing(ShmPoolVecEnv([make_info_types] * 4, n_workers=2, start_method="fork"))
    venv.reset()
    pool = venv._pool
    coded = 0
    for _ in range(20):
        _, _, _, infos = venv.step(np.ones(4, dtype=np.int64))
        codes = pool.info_reader.codes
        coded += int(np.count_nonzero(codes))
        for i in np.flatnonzero(codes):
            assert "x_position" in infos[i] or "frame_number" in infos[i]
    assert coded >= 40, "most step infos should have come through the rows"


def test_taxi_infos_come_through_the_rows_unchanged(closing):
    def taxi():
        return gym.make(TAXI)

    venv = closing(ShmPoolVecEnv([taxi] * 3, n_workers=3, start_method="fork"))
    venv.seed(0)
    venv.reset()
    _, _, _, infos = venv.step(np.array([0, 1, 2]))
    assert np.count_nonzero(venv._pool.info_reader.codes) == 3
    for info in infos:
        assert type(info["prob"]) is float and info["action_mask"].dtype == np.int8
