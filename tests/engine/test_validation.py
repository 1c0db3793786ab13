"""Unit tests of shmvec.engine.validation: the checks of user input before anything reaches a worker.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from shmvec.engine.validation import check_env_fns, check_same_spaces, checked_column, split_actions
from shmvec.errors import InvalidActionError, SpaceMismatchError


def test_checked_column_passes_a_matching_column_through():
    view = np.zeros(4, np.int64)
    actions = np.array([0, 1, 1, 0], np.int32)  # same kind: the env gets int32
    assert checked_column(actions, view, spaces.Discrete(2), "actions") is actions
    assert checked_column([0, 1, 1, 0], view, spaces.Discrete(2), "actions").tolist() == [0, 1, 1, 0]


def test_checked_column_refuses_a_wrong_shape():
    with pytest.raises(InvalidActionError) as excinfo:
        checked_column([0, 1, 1], np.zeros(4, np.int64), spaces.Discrete(2), "actions")
    assert str(excinfo.value) == "expected actions of shape (4,) (num_envs=4, action space Discrete(2)), got shape (3,)"


def test_checked_column_refuses_ragged_values():
    view = np.zeros((2, 2), np.int64)
    with pytest.raises(InvalidActionError, match=r"got values that do not form one array: ") as excinfo:
        checked_column([[0], [0, 1]], view, spaces.MultiDiscrete([2, 2]), "actions at ('a',)")
    assert str(excinfo.value).startswith(
        "expected actions at ('a',) of shape (2, 2) (num_envs=2, action space MultiDiscrete([2 2]))"
    )


def test_checked_column_refuses_float_to_int():
    with pytest.raises(InvalidActionError) as excinfo:
        checked_column(np.zeros(4), np.zeros(4, np.int64), spaces.Discrete(2), "actions")
    assert str(excinfo.value) == (
        "actions of dtype float64 are not of the kind of the action space's dtype int64; pass int64 actions"
    )


def test_checked_column_takes_multibinary_floats_of_0_and_1_only():
    space, view = spaces.MultiBinary(3), np.zeros((2, 3), np.int8)
    floats = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]], np.float32)  # as SB3's PPO samples them
    assert checked_column(floats, view, space, "actions") is floats
    with pytest.raises(InvalidActionError, match="dtype float32 are not of the kind of the action space's dtype int8"):
        checked_column(floats * 0.5, view, space, "actions")


def make_env():
    raise AssertionError("never called by the checks")


def test_check_env_fns_returns_a_list():
    assert check_env_fns((make_env, make_env)) == [make_env, make_env]


@pytest.mark.parametrize(
    "env_fns, error, message",
    [
        ("CartPole-v1", TypeError, "env_fns must be a list of callables that each build an env, got str"),
        (make_env, TypeError, "env_fns must be a list of callables that each build an env, got function"),
        (
            (f for f in [make_env]),
            TypeError,
            "env_fns must be a list of callables that each build an env, got generator",
        ),
        ([], ValueError, "env_fns is empty: pass at least one callable that builds an env"),
        (
            [make_env, "CartPole-v1"],
            TypeError,
            "env_fns[1] is a str, not a callable; pass functions that build envs, "
            "e.g. [lambda: gym.make('CartPole-v1')] * 8",
        ),
    ],
    ids=["str", "one callable", "generator", "empty", "non-callable"],
)
def test_check_env_fns_refuses(env_fns, error, message):
    with pytest.raises(error) as excinfo:
        check_env_fns(env_fns)
    assert type(excinfo.value) is error and str(excinfo.value) == message


def test_check_same_spaces_accepts_equal_spaces():
    check_same_spaces([(spaces.Box(0, 1, (2,)), spaces.Discrete(2))] * 3)


@pytest.mark.parametrize("which", ["observation", "action"])
def test_check_same_spaces_names_the_first_env_that_differs(which):
    same, other = (spaces.Box(0, 1, (2,)), spaces.Discrete(2)), (spaces.Box(0, 1, (3,)), spaces.Discrete(3))
    odd = (other[0], same[1]) if which == "observation" else (same[0], other[1])
    envs = [same, same, odd, odd]
    with pytest.raises(SpaceMismatchError) as excinfo:
        check_same_spaces(envs)
    exc = excinfo.value
    differing, first = (odd[0], same[0]) if which == "observation" else (odd[1], same[1])
    assert str(exc) == f"env 2 has {which} space {differing}, but env 0 has {first}; all envs must match"
    assert exc.space == which
    assert exc.spaces == [pair[0 if which == "observation" else 1] for pair in envs]
    assert isinstance(exc, ValueError) and isinstance(exc, RuntimeError)


def test_check_same_spaces_with_obs_space_match():
    def same_shape(first, space):
        return first.shape == space.shape

    low, high = spaces.Box(0, 1, (2,)), spaces.Box(5, 9, (2,))
    check_same_spaces([(low, spaces.Discrete(2)), (high, spaces.Discrete(2))], obs_space_match=same_shape)
    with pytest.raises(SpaceMismatchError, match=r"^env 1 has observation space Box\(0.0, 1.0, \(3,\)"):
        check_same_spaces([(low, spaces.Discrete(2)), (spaces.Box(0, 1, (3,)), spaces.Discrete(2))], same_shape)
    with pytest.raises(SpaceMismatchError, match=r"^env 1 has action space Discrete\(3\), but env 0 has Discrete\(2\)"):
        check_same_spaces([(low, spaces.Discrete(2)), (high, spaces.Discrete(3))], obs_space_match=same_shape)


ACTION_SPACE = spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Tuple((spaces.Discrete(2), spaces.Discrete(4)))})


def test_split_actions_into_leaf_columns():
    actions = [{"move": 1, "aim": (0, 3)}, {"aim": [1, 2], "move": 2}, {"move": 0, "aim": np.array([1, 1])}]
    columns = split_actions(actions, ACTION_SPACE, 3)
    assert list(columns) == [("aim", 0), ("aim", 1), ("move",)]
    assert columns[("move",)] == [1, 2, 0]
    assert [int(v) for v in columns[("aim", 0)]] == [0, 1, 1]
    assert [int(v) for v in columns[("aim", 1)]] == [3, 2, 1]


def test_split_actions_of_a_flat_space_is_one_column():
    assert split_actions(np.array([1, 0]), spaces.Discrete(2), 2) == {(): [1, 0]}


@pytest.mark.parametrize(
    "actions, message",
    [
        (
            {"move": [1, 2]},
            f"expected a list of 2 actions, one per env, each an element of {ACTION_SPACE} "
            "(as DummyVecEnv takes them), got a dict with keys ['move']",
        ),
        (5, f"expected a list of 2 actions, one per env, each an element of {ACTION_SPACE}, got a int"),
        ([{"move": 1, "aim": (0, 0)}], f"expected 2 actions (one per env, each an element of {ACTION_SPACE}), got 1"),
        (
            [{"move": 1, "aim": (0, 0)}, {"move": 1}],
            f"actions[1] misses key(s) ['aim']; expected exactly the keys ['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"move": 1, "aim": (0, 0), "fire": 1}, {"move": 1, "aim": (0, 0)}],
            f"actions[0] has unknown key(s) ['fire']; expected exactly the keys ['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"aim": (0, 0), "fire": 1}, {"move": 1, "aim": (0, 0)}],
            f"actions[0] misses key(s) ['move'] and has unknown key(s) ['fire']; expected exactly the keys "
            f"['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"move": 1, "aim": (0, 0)}, (1, (0, 0))],
            f"actions[1] is a tuple, expected a dict with keys ['aim', 'move'] ({ACTION_SPACE})",
        ),
        (
            [{"move": 1, "aim": (0, 0)}, {"move": 1, "aim": (0,)}],
            f"actions[1]['aim'] has 1 elements, expected 2 ({ACTION_SPACE['aim']})",
        ),
        (
            [{"move": 1, "aim": 0}, {"move": 1, "aim": (0, 0)}],
            f"actions[0]['aim'] is a int, expected a tuple of 2 actions ({ACTION_SPACE['aim']})",
        ),
    ],
    ids=[
        "mapping",
        "no len",
        "count",
        "missing key",
        "extra key",
        "missing and extra",
        "not a dict",
        "tuple length",
        "not a tuple",
    ],
)
def test_split_actions_refuses(actions, message):
    with pytest.raises(InvalidActionError) as excinfo:
        split_actions(actions, ACTION_SPACE, 2)
    assert str(excinfo.value) == message
