"""Every SB3 VecEnv method of ShmPoolVecEnv, checked against DummyVecEnv, and bad input.

Rare calls (get_attr / set_attr / env_method / env_is_wrapped / has_attr / render) must
answer exactly as DummyVecEnv does for every form of ``indices``; bad input must be
refused with a clear error before anything reaches a worker.
"""

from __future__ import annotations

import copy
import functools
import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from shmvec import ShmPoolVecEnv
from shmvec.errors import (
    ClosedEnvError,
    InvalidActionError,
    SpaceMismatchError,
    StepStateError,
    UnsupportedSpaceError,
)
from tests.envs import BoxObsEnv, MixedDictEnv, TupleObsEnv, cartpole, make_mixed
from tests.helpers import assert_same
from tests.sb3_compare import make_pair, sample_actions

N = 5  # envs in most tests below; with 2 workers the shards are uneven (3 + 2)
INDICES = [None, 0, 3, -1, [1, 4], [-1, 0, 2], range(1, 3), np.array([4, 2])]
INDEX_IDS = ["None", "0", "3", "-1", "[1,4]", "[-1,0,2]", "range", "ndarray"]
# SB3 2.6 added VecEnv.has_attr; ShmPoolVecEnv has it on every release (computed in the workers),
# checked against DummyVecEnv's where the installed SB3 has one.
SB3_HAS_ATTR = hasattr(VecEnv, "has_attr")


def mixed_rgb():
    return make_mixed(render_mode="rgb_array")


def _stepped_pair(closing, env_fns, n_workers=2, steps=12, seed=0):
    """A seeded, reset and stepped (shm, dummy) pair, so envs differ in their state."""
    shm, dummy = make_pair(env_fns, n_workers, closing)
    space = dummy.action_space
    space.seed(seed)
    for venv in (shm, dummy):
        venv.seed(seed)
        venv.reset()
    for _ in range(steps):
        actions = sample_actions(space, len(env_fns))
        shm.step(actions)
        dummy.step(actions)
    return shm, dummy


# ---- attributes and methods -------------------------------------------------------------


@pytest.mark.parametrize("indices", INDICES, ids=INDEX_IDS)
def test_get_attr_set_attr_env_method_with_indices(indices, closing):
    shm, dummy = _stepped_pair(closing, [make_mixed] * N)
    targets = [int(i) % N for i in dummy._get_indices(indices)]
    for i in range(N):  # a distinct value per env, so that a wrong index cannot go unnoticed
        shm.set_attr("ident", f"env{i}", indices=i)
    assert shm.get_attr("ident", indices) == [f"env{i}" for i in targets]
    for name in ("calls", "t", "_max_episode_steps", "render_mode", "metadata"):
        assert_same(
            shm.get_attr(name, indices),
            dummy.get_attr(name, indices),
            f"get_attr({name!r})",
        )
    assert_same(
        shm.env_method("double", 21, indices=indices),
        dummy.env_method("double", 21, indices=indices),
    )
    assert_same(
        shm.env_method("double", x=np.arange(3, dtype=np.int16), indices=indices),
        dummy.env_method("double", x=np.arange(3, dtype=np.int16), indices=indices),
    )
    for venv in (shm, dummy):
        venv.set_attr("tag", "set", indices)
        venv.set_attr("calls", -7, indices)  # lands on the outer wrapper and shadows the env's
    assert_same(shm.get_attr("calls"), dummy.get_attr("calls"), "calls after set_attr")
    assert shm.has_attr("tag") is (len(set(targets)) == N)
    assert not SB3_HAS_ATTR or dummy.has_attr("tag") is shm.has_attr("tag")
    assert shm.get_attr("tag", targets) == ["set"] * len(targets)
    assert shm.get_attr("calls", targets) == [-7] * len(targets)


def test_get_attr_tuple_env_and_unknown_attribute(closing):
    shm, dummy = _stepped_pair(closing, [TupleObsEnv] * 3)
    assert_same(shm.get_attr("x"), dummy.get_attr("x"))
    assert_same(
        shm.get_attr("observation_space", [0, -1]),
        dummy.get_attr("observation_space", [0, -1]),
    )
    with pytest.raises(AttributeError):
        dummy.get_attr("no_such_attribute")
    with pytest.raises(AttributeError, match="no_such_attribute"):
        shm.get_attr("no_such_attribute")
    with pytest.raises(AttributeError, match="no_such_method"):
        shm.env_method("no_such_method", indices=1)
    assert shm.get_attr("x", 0)[0].shape == (2,)  # the pool is still usable after a remote error


def test_index_out_of_range_is_refused(closing):
    shm, _ = make_pair([cartpole] * 3, 2, closing)
    for bad in (3, -4, [0, 3]):
        with pytest.raises(IndexError):
            shm.get_attr("spec", bad)
    assert len(shm.get_attr("spec")) == 3


def test_env_method_reset_matches_dummy(closing):
    shm, dummy = _stepped_pair(closing, [make_mixed] * 4)
    got = shm.env_method("reset", seed=11, indices=[0, 2])
    want = dummy.env_method("reset", seed=11, indices=[0, 2])
    assert_same(got, want, "env_method('reset')")
    actions = np.full((4, 3), 0.5, dtype=np.float32)
    assert_same(shm.step(actions), dummy.step(actions), "step after env_method('reset')")


def test_env_method_repeated_indices_call_once_per_occurrence(closing):
    """DummyVecEnv calls the method once per listed index, duplicates included, in order."""
    shm, dummy = _stepped_pair(closing, [make_mixed] * 4, steps=2)
    action = np.full(3, 0.2, dtype=np.float32)
    for indices in ([2, 2], [1, -3, 0, 1]):
        assert_same(
            shm.env_method("step", action, indices=indices),
            dummy.env_method("step", action, indices=indices),
            f"{indices}",
        )
        assert_same(shm.get_attr("calls"), dummy.get_attr("calls"), f"calls after {indices}")
    assert shm.get_attr("calls") == [
        2 + 1,
        2 + 3,
        2 + 2,
        2,
    ]  # env 1 is listed three times (-3 is 1)


def test_has_attr(closing):
    shm, dummy = make_pair([make_mixed] * 3, 2, closing)
    for name, expected in [
        ("double", True),
        ("calls", True),
        ("_max_episode_steps", True),
        ("nope", False),
    ]:
        assert shm.has_attr(name) is expected, name
        assert not SB3_HAS_ATTR or dummy.has_attr(name) is expected, name
    shm.set_attr("only_some", 1, indices=[0, 2])
    assert shm.has_attr("only_some") is False  # every env must have it
    shm.set_attr("only_some", 1, indices=1)
    assert shm.has_attr("only_some") is True


def test_env_is_wrapped(closing):
    env_fns = [
        lambda: Monitor(cartpole()),
        cartpole,
        lambda: Monitor(cartpole()),
        cartpole,
    ]
    shm, dummy = make_pair(env_fns, 3, closing)
    for wrapper in (
        Monitor,
        gym.wrappers.TimeLimit,
        gym.wrappers.ClipAction,
        gym.Wrapper,
    ):
        for indices in (None, 1, -2, [0, 1, 3]):
            assert_same(
                shm.env_is_wrapped(wrapper, indices),
                dummy.env_is_wrapped(wrapper, indices),
                f"{wrapper}, {indices}",
            )
    assert shm.env_is_wrapped(Monitor) == [True, False, True, False]
    assert shm.env_is_wrapped(gym.wrappers.ClipAction) == [False] * 4


# ---- rendering, metadata ------------------------------------------------------------------


def test_get_images_and_render_rgb_array(closing):
    shm, dummy = _stepped_pair(closing, [mixed_rgb] * N, n_workers=3, steps=17)
    for venv in (shm, dummy):
        venv.env_method("reset", indices=[0, 3])  # so that the envs show different frames
    assert shm.render_mode == dummy.render_mode == "rgb_array"
    images = shm.get_images()
    assert_same(images, dummy.get_images(), "get_images()")
    assert len({int(image[0, 0, 0]) for image in images}) > 1  # the envs are at different times
    assert_same(shm.render(), dummy.render(), "render()")
    assert_same(shm.render("rgb_array"), dummy.render("rgb_array"), "render('rgb_array')")
    assert shm.render().shape == (4 * 3, 4 * 2, 3)  # 5 images tiled 3 x 2


def test_render_without_render_mode_warns_like_dummy(closing):
    shm, dummy = make_pair([make_mixed] * 3, 2, closing)
    assert shm.render_mode is None
    for venv in (shm, dummy):
        with pytest.warns(UserWarning, match="render mode is None"):
            assert venv.get_images() == [None, None, None]
        with pytest.warns(UserWarning, match="no `render_mode` was passed"):
            assert venv.render() is None
        with pytest.warns(UserWarning, match="has to be the same as the environment render mode"):
            assert venv.render("rgb_array") is None


@pytest.mark.parametrize("make", [cartpole, make_mixed, mixed_rgb], ids=["cartpole", "mixed", "mixed_rgb"])
def test_metadata_spaces_and_render_mode_match_dummy(make, closing):
    shm, dummy = make_pair([make] * 3, 2, closing)
    assert shm.metadata == dummy.metadata
    assert shm.metadata == make().metadata
    assert shm.render_mode == dummy.render_mode
    assert shm.observation_space == dummy.observation_space
    assert shm.action_space == dummy.action_space
    assert shm.num_envs == 3 and shm.unwrapped is shm


# ---- lifecycle ---------------------------------------------------------------------------


def test_close_twice_then_use_raises(closing):
    shm = closing(ShmPoolVecEnv([cartpole] * 3, n_workers=2, start_method="fork"))
    shm.reset()
    shm.close()
    shm.close()
    assert shm.closed
    with pytest.raises(ClosedEnvError):
        shm.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ClosedEnvError):
        shm.reset()
    with pytest.raises(ClosedEnvError):
        shm.get_attr("spec")


def test_close_with_a_step_pending():
    shm = ShmPoolVecEnv([make_mixed] * 3, n_workers=2, start_method="fork")
    try:
        shm.reset()
        shm.step_async(np.zeros((3, 3), dtype=np.float32))
    finally:
        shm.close()  # must not hang nor leave the workers' answer behind (no_leaks checks)
    assert shm.closed


def test_context_manager_closes_even_on_error():
    with (
        pytest.raises(RuntimeError, match="boom"),
        ShmPoolVecEnv([cartpole] * 2, 2, start_method="fork") as shm,
    ):
        assert shm.reset().shape == (2, 4)
        raise RuntimeError("boom")
    assert shm.closed  # no_leaks checks the workers and /dev/shm entries are gone


def test_default_n_workers_is_chosen_and_explicit_is_obeyed(closing):
    shm = closing(ShmPoolVecEnv([cartpole] * 3, start_method="fork"))
    assert shm.n_workers == shm._pool.plan.n_workers <= min(3, os.cpu_count())  # the timed choice (test_autoconfig)
    shm1 = closing(ShmPoolVecEnv([cartpole], 1, start_method="fork"))
    assert shm1.n_workers == 1 and not shm1._pool.main_shard


def test_step_async_step_wait_misuse(closing):
    shm, dummy = make_pair([cartpole] * 3, 2, closing)
    for venv in (shm, dummy):
        venv.seed(2)
        venv.reset()
    with pytest.raises(StepStateError):
        shm.step_wait()
    first, second = np.array([0, 1, 0]), np.array([1, 1, 1])
    shm.step_async(first)
    with pytest.raises(StepStateError):
        shm.step_async(second)
    with pytest.raises(StepStateError):
        shm.get_attr("spec")
    dummy.step_async(first)
    assert_same(shm.step_wait(), dummy.step_wait(), "the pending step is the first one")
    assert_same(shm.step(second), dummy.step(second), "usable afterwards")


def test_returned_obs_is_not_overwritten_or_shared(closing):
    shm, dummy = make_pair([make_mixed] * 4, 2, closing)
    for venv in (shm, dummy):
        venv.seed(4)
    reset_obs = shm.reset()
    dummy.reset()
    reset_copy = copy.deepcopy(reset_obs)
    actions = np.full((4, 3), 0.9, dtype=np.float32)
    terminal = []  # (the returned terminal_observation, a deep copy taken at once)
    for _ in range(20):
        out = shm.step(actions)
        assert_same(out, dummy.step(actions), "step")
        terminal += [
            (info["terminal_observation"], copy.deepcopy(info["terminal_observation"]))
            for info in out[3]
            if "terminal_observation" in info
        ]
        for key in out[0]:
            out[0][key][...] = 0  # the caller scribbling on its obs must not reach the envs
    for ref, saved in terminal:
        assert_same(ref, saved, "terminal_observation changed by a later step")
    assert_same(reset_obs, reset_copy, "reset() obs changed by later steps")
    assert terminal, "the run must end episodes"


# ---- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((N - 1, 3), np.float32),  # too few actions
        np.zeros((N + 1, 3), np.float32),  # too many
        np.zeros((N, 2), np.float32),  # wrong action shape
        np.zeros((N, 3, 1), np.float32),
        np.zeros(N * 3, np.float32),
        np.zeros((N, 3), np.complex64),  # cannot become float32 safely
        np.array([["a", "b", "c"]] * N),
    ],
    ids=["fewer", "more", "shape", "extra-dim", "flat", "complex", "strings"],
)
def test_bad_box_actions_refused_before_reaching_workers(bad, closing):
    shm, dummy = _stepped_pair(closing, [make_mixed] * N, steps=3)
    calls = shm.get_attr("calls")
    with pytest.raises(InvalidActionError) as info:
        shm.step(bad)
    assert "actions" in str(info.value)
    assert isinstance(info.value, ValueError)
    assert shm.get_attr("calls") == calls  # no env stepped
    actions = np.full((N, 3), 0.3, dtype=np.float32)
    assert_same(shm.step(actions), dummy.step(actions), "usable after the bad step")


@pytest.mark.parametrize(
    "bad",
    [
        np.array([0.0, 1.0, 1.0]),
        np.array([[0], [1], [1]]),
        np.array([0, 1]),
    ],
    ids=["float", "column", "fewer"],
)
def test_bad_discrete_actions_refused(bad, closing):
    shm, dummy = _stepped_pair(closing, [cartpole] * 3, steps=2)
    with pytest.raises(InvalidActionError):
        shm.step(bad)
    actions = np.array([1, 0, 1])
    assert_same(shm.step(actions), dummy.step(actions), "usable after the bad step")


def test_empty_and_non_callable_env_fns():
    with pytest.raises(ValueError, match="empty"):
        ShmPoolVecEnv([], start_method="fork")
    with pytest.raises(TypeError, match=r"env_fns\[1\]"):
        ShmPoolVecEnv([cartpole, cartpole(), cartpole], start_method="fork")
    with pytest.raises(TypeError, match="list of callables"):
        ShmPoolVecEnv(cartpole, start_method="fork")


@pytest.mark.parametrize("n_workers", [1, 3])
def test_different_observation_spaces(n_workers):
    env_fns = [BoxObsEnv, BoxObsEnv, functools.partial(BoxObsEnv, 5)]
    with pytest.raises(SpaceMismatchError, match="env 2") as info:
        # not fork: a forked worker holds the main process's end of its pipe, so a start that fails
        # after the workers built their envs waits close()'s 3 s for them
        ShmPoolVecEnv(env_fns, n_workers=n_workers, start_method="forkserver")
    assert isinstance(info.value, ValueError)


def test_different_action_spaces():
    with pytest.raises(SpaceMismatchError, match="action space"):
        ShmPoolVecEnv([BoxObsEnv, functools.partial(BoxObsEnv, n_actions=3)], n_workers=2, start_method="forkserver")


def test_same_env_instance_twice_in_one_worker():
    shared = cartpole()
    with pytest.raises(ValueError, match="same"):
        DummyVecEnv([lambda: shared] * 2)
    with pytest.raises(ValueError, match="same env instance"):
        ShmPoolVecEnv([lambda: shared, cartpole, lambda: shared], n_workers=1, start_method="fork")


@pytest.mark.parametrize("n_workers", [-1, 4, 1.5, "2", True])  # 0: every env in this process
def test_n_workers_out_of_range(n_workers):
    # "2" with start_method= is SubprocVecEnv's start_method given twice: its TypeError, naming n_workers
    with pytest.raises(TypeError if isinstance(n_workers, str) else ValueError, match="n_workers"):
        ShmPoolVecEnv([cartpole] * 3, n_workers=n_workers, start_method="fork")


@pytest.mark.parametrize("start_method", ["threads", "FORK", ""])
def test_bad_start_method(start_method):
    with pytest.raises(ValueError, match="cannot find context for"):  # SubprocVecEnv's words
        ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method=start_method)


class TextObsEnv(BoxObsEnv):
    def __init__(self):
        self.observation_space = spaces.Text(8)
        self.action_space = spaces.Discrete(2)


class NestedDictObsEnv(BoxObsEnv):
    def __init__(self):
        self.observation_space = spaces.Dict({"outer": spaces.Dict({"inner": spaces.Box(-1, 1, (2,))})})
        self.action_space = spaces.Discrete(2)


def test_unsupported_observation_space():
    with pytest.raises(UnsupportedSpaceError, match="Text"):
        ShmPoolVecEnv([TextObsEnv] * 2, n_workers=2, start_method="fork")


def test_nested_dict_obs_refused_like_sb3():
    with pytest.raises(NotImplementedError, match="Nested observation spaces"):
        DummyVecEnv([NestedDictObsEnv])
    with pytest.raises(NotImplementedError, match="Nested observation spaces"):
        ShmPoolVecEnv([NestedDictObsEnv] * 2, n_workers=2, start_method="fork")


def test_mixed_dict_env_module_class_directly(closing):
    """An env class (not a factory function) as env_fn, the form SB3 docs also show."""
    shm, dummy = make_pair([MixedDictEnv] * 2, 2, closing)
    for venv in (shm, dummy):
        venv.seed(0)
    assert_same(shm.reset(), dummy.reset())
