"""Unit tests of shmvec.ipc.layout: flattening spaces into leaves, shard bounds, arena plans and views.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from gymnasium import spaces

from shmvec.errors import UnsupportedSpaceError
from shmvec.ipc import layout as lay
from shmvec.ipc.info_rows import INFO_CODE, INFO_ROWS, INFO_SCHEMAS
from shmvec.ipc.timing_rows import ENV_HIST, ENV_TOTALS, HIST_BINS, LANE_RING, LANE_TOTALS, RING
from tests.envs import Token, TokenSpace
from tests.helpers import assert_same

BOX = spaces.Box(0.0, 1.0, (2, 3), np.float32)


def nested_space() -> spaces.Dict:
    """Every leaf kind, nested two levels deep; gymnasium's Dict sorts the keys: a, b, s, u."""
    return spaces.Dict(
        {
            "u": TokenSpace(),
            "b": spaces.Tuple(
                (
                    spaces.Discrete(3),
                    spaces.MultiDiscrete([2, 3]),
                    spaces.Dict({"t": spaces.Text(5), "c": spaces.MultiBinary(4)}),
                )
            ),
            "a": BOX,
            "s": spaces.Sequence(spaces.Discrete(2)),
        },
        seed=0,
    )


NESTED_LEAVES = [
    (("a",), (2, 3), np.dtype(np.float32)),
    (("b", 0), (), np.dtype(np.int64)),
    (("b", 1), (2,), np.dtype(np.int64)),
    (("b", 2, "c"), (4,), np.dtype(np.int8)),
    (("b", 2, "t"), None, None),
    (("s",), None, None),
    (("u",), None, None),
]
CONTROL_FIELDS = [
    *["ctrl", "reward", "terminated", "truncated", "inbox", "outbox", "ready_ns", "env_status"],
    *[INFO_ROWS, INFO_CODE, INFO_SCHEMAS],
    *[LANE_RING, LANE_TOTALS, ENV_HIST, ENV_TOTALS],
]


class BoxSubclass(spaces.Box):
    """A user's Box subclass: still a Box, so it keeps its shared-memory buffer."""


def test_flatten_nested_space_in_key_and_index_order():
    leaves = lay.flatten_space(nested_space())
    assert [(leaf.path, leaf.shape, leaf.dtype) for leaf in leaves] == NESTED_LEAVES
    assert [leaf.pickled for leaf in leaves] == [False, False, False, False, True, True, True]


@pytest.mark.parametrize(
    "space, shape, dtype",
    [
        (BOX, (2, 3), np.float32),
        (spaces.Discrete(5), (), np.int64),
        (spaces.MultiDiscrete([[2, 3], [4, 5]]), (2, 2), np.int64),
        (spaces.MultiBinary([2, 3]), (2, 3), np.int8),
        (BoxSubclass(-1, 1, (4,), np.float64), (4,), np.float64),
    ],
    ids=["Box", "Discrete", "MultiDiscrete", "MultiBinary", "BoxSubclass"],
)
def test_flatten_flat_array_space_is_one_root_leaf(space, shape, dtype):
    assert lay.flatten_space(space) == [lay.Leaf((), shape, np.dtype(dtype))]


@pytest.mark.parametrize(
    "space",
    [spaces.Text(4), spaces.Sequence(spaces.Box(0, 1, (2,))), spaces.Graph(spaces.Box(0, 1, (2,)), None), TokenSpace()],
    ids=["Text", "Sequence", "Graph", "custom"],
)
def test_flatten_space_with_no_fixed_size_is_one_pickled_leaf(space):
    (leaf,) = lay.flatten_space(space)
    assert (leaf.path, leaf.shape, leaf.dtype, leaf.pickled) == ((), None, None, True)


def test_flatten_refuses_what_is_not_a_space():
    with pytest.raises(UnsupportedSpaceError) as excinfo:
        lay.flatten_space((3, 4))
    assert str(excinfo.value) == (
        "expected a gymnasium.spaces.Space, got a tuple ((3, 4)) at the root; "
        "envs must declare their observation_space and action_space as gymnasium spaces"
    )
    assert isinstance(excinfo.value, TypeError)


def plain_dicts(value):
    """``value`` with each OrderedDict in it a dict, the rest as it is (the same leaf objects)."""
    if isinstance(value, dict):
        return {key: plain_dicts(item) for key, item in value.items()}
    return tuple(plain_dicts(item) for item in value) if isinstance(value, tuple) else value


def test_unflatten_rebuilds_the_nested_value():
    space = nested_space()
    value = plain_dicts(space.sample())  # Gymnasium < 1.0 samples a Dict as an OrderedDict, unflatten as 1.x: a dict
    leaf_values = {leaf.path: lay.get_path(value, leaf.path) for leaf in lay.flatten_space(space)}
    rebuilt = lay.unflatten(space, leaf_values)
    assert list(rebuilt) == ["a", "b", "s", "u"]
    assert type(rebuilt["b"]) is tuple and type(rebuilt["b"][2]) is dict
    assert_same(rebuilt, value)
    assert rebuilt["b"][2]["t"] is value["b"][2]["t"]  # leaves are placed, not copied


def test_unflatten_of_a_flat_space_is_its_root_value():
    row = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert lay.unflatten(BOX, {(): row}) is row


def test_unflatten_of_a_custom_space_hands_its_value_back():
    token = Token("up", 3)
    assert lay.unflatten(TokenSpace(), {(): token}) is token


def test_get_path_follows_keys_and_indices():
    value = {"a": (1, {"b": [10, 20]})}
    assert lay.get_path(value, ("a", 1, "b", 1)) == 20
    assert lay.get_path(value, ()) is value
    with pytest.raises(KeyError):
        lay.get_path(value, ("missing",))


def test_require_fixed_size_names_the_pickled_leaf():
    with pytest.raises(UnsupportedSpaceError, match=r"got Text\(1, 5, .*\) at \('b', 2, 't'\) in Dict") as excinfo:
        lay.require_fixed_size(nested_space(), "observation", "ShmPoolVecEnv")
    assert str(excinfo.value).startswith("ShmPoolVecEnv takes only fixed-size observation spaces")
    lay.require_fixed_size(spaces.Dict({"x": BOX}), "observation", "ShmPoolVecEnv")  # no error


@pytest.mark.parametrize(
    "n_envs, n_workers, bounds",
    [
        (10, 3, [(0, 4), (4, 7), (7, 10)]),
        (7, 4, [(0, 2), (2, 4), (4, 6), (6, 7)]),
        (6, 3, [(0, 2), (2, 4), (4, 6)]),
        (5, 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
        (7, 1, [(0, 7)]),
        (1, 1, [(0, 1)]),
    ],
)
def test_shard_bounds(n_envs, n_workers, bounds):
    assert lay.shard_bounds(n_envs, n_workers) == bounds


def test_shard_bounds_are_contiguous_and_even_within_one():
    for n_envs in range(1, 40):
        for n_workers in range(1, n_envs + 1):
            bounds = lay.shard_bounds(n_envs, n_workers)
            starts, stops = [b[0] for b in bounds], [b[1] for b in bounds]
            assert starts == [0, *stops[:-1]] and stops[-1] == n_envs
            sizes = [stop - start for start, stop in bounds]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)  # the larger shards come first


@pytest.mark.parametrize("n_envs, n_workers", [(4, 0), (4, 5), (4, -1), (0, 1)])
def test_shard_bounds_refuses_impossible_splits(n_envs, n_workers):
    with pytest.raises(ValueError) as excinfo:
        lay.shard_bounds(n_envs, n_workers)
    assert str(excinfo.value) == f"n_workers must be between 1 and the number of envs ({n_envs}), got {n_workers}"


def assert_well_placed(layout: lay.ArenaLayout) -> None:
    """Every field starts on a cache line, none overlaps the next, and the arena covers them all."""
    placed = sorted(layout.fields.values(), key=lambda spec: spec.offset)
    for spec in placed:
        assert spec.offset % lay.ALIGNMENT == 0, spec
    for spec, following in zip(placed, placed[1:]):
        assert spec.offset + max(spec.nbytes, 1) <= following.offset, (spec, following)
    assert layout.nbytes >= placed[-1].offset + placed[-1].nbytes
    assert layout.nbytes % lay.ALIGNMENT == 0


def test_plan_places_nested_spaces_without_pickled_leaves():
    action_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (3,), np.float64)))
    layout = lay.ArenaLayout.plan(nested_space(), action_space, n_envs=5, n_workers=2, final_obs=True)
    obs_fields = ["obs('a',)", "obs('b', 0)", "obs('b', 1)", "obs('b', 2, 'c')"]
    action_fields = ["action(0,)", "action(1,)", lay.ACTION_CODE]
    assert list(layout.fields) == CONTROL_FIELDS + obs_fields + action_fields  # no final_obs: not flat
    shapes = {name: (spec.shape, spec.dtype) for name, spec in layout.fields.items()}
    assert shapes["ctrl"] == ((2, lay.CTRL_WIDTH), np.dtype(np.int64))
    assert shapes["reward"] == ((5,), np.dtype(np.float64))
    assert shapes["terminated"] == shapes["truncated"] == ((5,), np.dtype(np.bool_))
    assert shapes["env_status"] == ((5,), np.dtype(np.int8))
    assert shapes[INFO_ROWS] == ((5, 512), np.dtype(np.uint8)) and shapes[INFO_CODE] == ((5,), np.dtype(np.uint8))
    assert shapes[INFO_SCHEMAS] == ((3, 4096), np.dtype(np.uint8))  # a block per worker, and the main shard's
    assert shapes[LANE_RING] == ((3, RING, 3), np.dtype(np.int64))  # a lane per worker, and the main shard's
    assert shapes[ENV_HIST] == ((5, HIST_BINS), np.dtype(np.int32))
    assert shapes["obs('a',)"] == ((5, 2, 3), np.dtype(np.float32))
    assert shapes["obs('b', 2, 'c')"] == ((5, 4), np.dtype(np.int8))
    # an action row holds 3 values of any dtype a caller gives: the codes say which
    assert shapes["action(1,)"] == ((5, 3 * lay.ACTION_ITEMSIZE), np.dtype(np.uint8))
    assert shapes[lay.ACTION_CODE] == ((2, 6), np.dtype(np.int8))  # and the code of all rows at once
    assert [leaf.path for leaf in layout.obs_leaves] == [("a",), ("b", 0), ("b", 1), ("b", 2, "c")]
    assert [leaf.path for leaf in layout.pickled_obs_leaves] == [("b", 2, "t"), ("s",), ("u",)]
    assert layout.pickled_action_leaves == ()
    assert_well_placed(layout)


def test_plan_adds_final_obs_fields_only_for_flat_observations_when_asked():
    flat = lay.ArenaLayout.plan(BOX, spaces.Discrete(2), n_envs=3, n_workers=1, final_obs=True)
    assert (flat.fields[lay.FINAL_OBS].shape, flat.fields[lay.FINAL_OBS].dtype) == ((3, 2, 3), np.dtype(np.float32))
    assert (flat.fields[lay.FINAL_FLAG].shape, flat.fields[lay.FINAL_FLAG].dtype) == ((3,), np.dtype(np.bool_))
    assert_well_placed(flat)
    not_asked = lay.ArenaLayout.plan(BOX, spaces.Discrete(2), n_envs=3, n_workers=1)
    assert lay.FINAL_OBS not in not_asked.fields and lay.FINAL_FLAG not in not_asked.fields
    in_a_dict = lay.ArenaLayout.plan(spaces.Dict({"x": BOX}), spaces.Discrete(2), n_envs=3, n_workers=1, final_obs=True)
    assert lay.FINAL_OBS not in in_a_dict.fields and lay.FINAL_FLAG not in in_a_dict.fields


def test_plan_gives_empty_and_one_byte_fields_a_cache_line_each():
    layout = lay.ArenaLayout.plan(spaces.Box(0, 1, (0,)), spaces.MultiBinary(1), n_envs=1, n_workers=1)
    assert layout.fields["obs()"].nbytes == 0 and layout.fields[lay.ENV_STATUS].nbytes == 1
    assert_well_placed(layout)
    multi_line = {INFO_ROWS: 512, INFO_SCHEMAS: 2 * 4096}  # one env's info row; the worker's and a main shard's schemas
    multi_line |= {LANE_RING: 2 * RING * 24, ENV_HIST: HIST_BINS * 4}  # two lanes' rings, an env's histogram
    small = len(layout.fields) - len(multi_line)
    assert layout.nbytes == lay.ALIGNMENT * small + sum(multi_line.values())


def test_plan_is_picklable():
    layout = lay.ArenaLayout.plan(nested_space(), spaces.Discrete(2), n_envs=4, n_workers=2)
    assert pickle.loads(pickle.dumps(layout)) == layout


def test_views_over_a_bytearray_are_separate_windows_of_it():
    layout = lay.ArenaLayout.plan(nested_space(), spaces.MultiDiscrete([3, 3]), n_envs=5, n_workers=2)
    buffer = bytearray(layout.nbytes)
    views = layout.views(buffer)
    assert list(views) == list(layout.fields)
    for name, view in views.items():
        assert (view.shape, view.dtype) == (layout.fields[name].shape, layout.fields[name].dtype)
    for n, view in enumerate(views.values(), start=1):  # each field its own value: no overlap
        view.view(np.uint8)[...] = n
    for n, name in enumerate(views, start=1):
        spec = layout.fields[name]
        assert bytes(buffer[spec.offset : spec.offset + spec.nbytes]) == bytes([n]) * spec.nbytes, name
    views["reward"][2] = 1.5  # writes go straight to the buffer
    offset = layout.fields["reward"].offset + 2 * 8
    assert np.frombuffer(buffer, np.float64, 1, offset)[0] == 1.5


def test_views_need_a_buffer_of_nbytes():
    layout = lay.ArenaLayout.plan(BOX, spaces.Discrete(2), n_envs=2, n_workers=1)
    with pytest.raises(TypeError, match="buffer is too small"):
        layout.views(bytearray(layout.nbytes - lay.ALIGNMENT))
