"""ShmVectorEnv against Gymnasium's SyncVectorEnv: same seeds and actions -> identical results.

Every comparison is bit for bit: observations (structure, dtype, shape, bytes), rewards,
terminations, truncations and infos, including the ``_key`` masks and the
``final_obs``/``final_info`` entries of SAME_STEP mode.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

import shmvec
from shmvec import (
    ClosedEnvError,
    InvalidActionError,
    ResetNeededError,
    ShmVectorEnv,
    StepStateError,
    StepTimeoutError,
    WorkerDiedError,
)
from shmvec.gymnasium_1_1 import AutoresetMode
from tests.envs import TAXI, MixedDictEnv, NestedEnv, TupleObsEnv, make_info_types, make_mixed
from tests.gym_versions import ASSERTS_RESET_MASKS, WRITES_CLASS_METADATA
from tests.helpers import assert_same

pytestmark = pytest.mark.vector_api  # ShmVectorEnv: Gymnasium 1.1 on (tests/conftest.py)

STEPS = 300
MODES = list(AutoresetMode)
SHAPES = [(5, 2), (7, 3), (4, 4)]

ENV_FACTORIES = {
    "CartPole": lambda: gym.make("CartPole-v1"),
    "Pendulum": lambda: gym.make("Pendulum-v1", max_episode_steps=60),
    "MixedDict": lambda: make_mixed(max_episode_steps=25),
    "TupleObs": lambda: gym.wrappers.TimeLimit(TupleObsEnv(), max_episode_steps=30),
    "Nested": lambda: NestedEnv(max_steps=20),
    "InfoTypes": lambda: make_info_types(mergeable=True),  # infos at every step, in shared rows or pickled
    "Taxi": lambda: gym.make(TAXI, max_episode_steps=30),
}


# ---- comparison helpers ----------------------------------------------------------------


def _drop_wall_time(*infos):
    """RecordEpisodeStatistics' episode["t"] is elapsed wall time: it cannot match. Drop it (nested too)."""
    for info in infos:
        if isinstance(info.get("episode"), dict) and "t" in info["episode"]:
            info["episode"].pop("t")
        for value in info.values():
            if isinstance(value, dict):
                _drop_wall_time(value)


def make_pair(name_or_fn, n_envs, n_workers, closing, mode=AutoresetMode.NEXT_STEP, **kwargs):
    fn = ENV_FACTORIES[name_or_fn] if isinstance(name_or_fn, str) else name_or_fn
    shm = closing(ShmVectorEnv([fn] * n_envs, n_workers, autoreset_mode=mode, start_method="fork", **kwargs))
    ref = closing(SyncVectorEnv([fn] * n_envs, autoreset_mode=mode))
    return shm, ref


def run_equivalence(shm, ref, steps, seed):
    """Drive both envs with the same seeds and actions; assert identical results. Returns event counts."""
    counts = {"terminated": 0, "truncated": 0, "info_steps": 0, "masked_resets": 0}
    assert_same(shm.reset(seed=seed), ref.reset(seed=seed), "reset")
    actions_space = ref.action_space
    actions_space.seed(seed)
    mode = ref.metadata["autoreset_mode"]
    rng = np.random.default_rng(seed)
    for t in range(steps):
        actions = actions_space.sample()
        got, want = shm.step(actions), ref.step(actions)
        _drop_wall_time(got[4], want[4])
        assert_same(got, want, f"step {t}")
        _, _, terminated, truncated, infos = want
        counts["terminated"] += int(terminated.sum())
        counts["truncated"] += int(truncated.sum())
        counts["info_steps"] += bool(infos)
        ended = terminated | truncated
        if mode == AutoresetMode.DISABLED and ended.any():
            # reset exactly the ended envs (plus, now and then, a running one), with seeds and options
            mask = ended | (rng.random(len(ended)) < 0.1)
            seeds = [int(s) for s in rng.integers(0, 2**31, len(ended))] if t % 2 else None
            got = shm.reset(seed=seeds, options={"reset_mask": mask.copy(), "scale": 0.3})
            want = ref.reset(seed=seeds, options={"reset_mask": mask.copy(), "scale": 0.3})
            assert_same(got, want, f"masked reset after step {t}")
            counts["masked_resets"] += 1
    return counts


# ---- equivalence with SyncVectorEnv ------------------------------------------------


@pytest.mark.parametrize("n_envs,n_workers", SHAPES, ids=[f"N{n}K{k}" for n, k in SHAPES])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize("env_name", list(ENV_FACTORIES))
def test_matches_sync_vector_env(env_name, mode, n_envs, n_workers, closing):
    shm, ref = make_pair(env_name, n_envs, n_workers, closing, mode)
    counts = run_equivalence(shm, ref, STEPS, seed=n_envs * 10 + n_workers)
    # the run must have exercised what it claims to compare
    assert counts["terminated"] + counts["truncated"] > 0, counts
    if env_name in ("MixedDict", "Nested", "Pendulum", "TupleObs"):
        assert counts["truncated"] > 0, counts
    if env_name in ("MixedDict", "Nested", "InfoTypes"):
        assert counts["terminated"] > 0 and counts["info_steps"] > 0, counts
    if mode == AutoresetMode.DISABLED:
        assert counts["masked_resets"] > 0, counts


MAIN_SHARD_SHAPES = [(5, 1), (7, 2), (2, 0)]


@pytest.mark.parametrize("n_envs,n_workers", MAIN_SHARD_SHAPES, ids=[f"N{n}K{k}" for n, k in MAIN_SHARD_SHAPES])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize("env_name", ["Nested", "InfoTypes"])
def test_matches_sync_vector_env_with_main_shard(env_name, mode, n_envs, n_workers, closing):
    shm, ref = make_pair(env_name, n_envs, n_workers, closing, mode, use_main_process=True)
    counts = run_equivalence(shm, ref, 200, seed=n_envs)
    assert counts["terminated"] > 0 and counts["truncated"] > 0 and counts["info_steps"] > 0, counts


def test_same_step_infos_carry_final_obs_and_final_info(closing):
    shm, _ = make_pair("MixedDict", 4, 2, closing, AutoresetMode.SAME_STEP)
    shm.reset(seed=1)
    actions = np.ones((4, 3), dtype=np.float32)
    for _ in range(30):
        obs, _, terminated, truncated, infos = shm.step(actions)
        if (terminated | truncated).any():
            break
    ended = terminated | truncated
    assert ended.any()
    np.testing.assert_array_equal(infos["_final_obs"], ended)
    np.testing.assert_array_equal(infos["_final_info"], ended)
    for i in np.flatnonzero(ended):
        assert set(infos["final_obs"][i]) == set(MixedDictEnv().observation_space.spaces)
        assert infos["_start"][i]  # the reset info of the new episode is there too
        assert obs["count"][i] == 0  # and the returned observation is the new episode's first


def test_step_async_step_wait_match_step(closing):
    shm, ref = make_pair("Nested", 5, 2, closing)
    assert_same(shm.reset(seed=5), ref.reset(seed=5))
    ref.action_space.seed(5)
    for t in range(40):
        actions = ref.action_space.sample()
        shm.step_async(actions)
        assert_same(shm.step_wait(timeout=30.0), ref.step(actions), f"step {t}")


def test_reset_seed_list_and_options_reach_the_envs(closing):
    shm, ref = make_pair("MixedDict", 5, 2, closing)
    seeds = [3, None, 7, 7, 100]
    got = shm.reset(seed=[3, 1, 7, 7, 100], options={"scale": 0.9})
    want = ref.reset(seed=[3, 1, 7, 7, 100], options={"scale": 0.9})
    assert_same(got, want)
    obs, infos = got
    assert np.abs(infos["start"]).max() > 0.1  # the option widened the start range
    np.testing.assert_array_equal(obs["position"][2], obs["position"][3])  # same seed, same start
    assert shm.reset(seed=seeds)[0]["position"].shape == (5, 3)
    assert_same(shm.reset(seed=np.arange(5)), ref.reset(seed=list(range(5))))  # numpy seeds are fine


def test_reset_mask_keeps_the_caller_options(closing):
    shm, _ = make_pair("CartPole", 4, 2, closing, AutoresetMode.DISABLED)
    first, _ = shm.reset(seed=0)
    options = {"reset_mask": np.array([False, True, False, False])}
    obs, infos = shm.reset(seed=50, options=options)
    assert "reset_mask" in options  # not popped from the caller's dict (SyncVectorEnv pops it)
    np.testing.assert_array_equal(obs[[0, 2, 3]], first[[0, 2, 3]])
    assert not np.array_equal(obs[1], first[1])
    assert infos == {}


def test_disabled_mode_requires_reset_of_ended_envs(closing):
    shm, ref = make_pair("CartPole", 3, 2, closing, AutoresetMode.DISABLED)
    shm.reset(seed=0)
    ref.reset(seed=0)
    actions = np.ones(3, dtype=np.int64)
    for _ in range(100):
        *_, terminated, truncated, _ = shm.step(actions)
        ref.step(actions)
        if (terminated | truncated).any():
            break
    ended = terminated | truncated
    assert ended.any()
    with pytest.raises(ResetNeededError, match=r"reset_mask"):
        shm.step(actions)
    with pytest.raises(AssertionError):  # what SyncVectorEnv raises; ours is an AssertionError too
        ref.step(actions)
    shm.reset(options={"reset_mask": ended.copy()})
    shm.step(actions)  # fine again


# ---- copies and views ------------------------------------------------------------


@pytest.mark.parametrize("env_name", ["CartPole", "Nested"])
def test_copy_true_returns_arrays_that_never_change(env_name, closing):
    shm, _ = make_pair(env_name, 4, 2, closing)
    obs0, _ = shm.reset(seed=0)
    snapshot0 = _deep_copy(obs0)
    shm.action_space.seed(0)
    obs1, rewards, terminated, *_ = shm.step(shm.action_space.sample())
    snapshot1 = (_deep_copy(obs1), rewards.copy(), terminated.copy())
    for _ in range(3):
        shm.step(shm.action_space.sample())
    assert_same(obs0, snapshot0)
    assert_same((obs1, rewards, terminated), snapshot1)
    for a, b in zip(_leaves(obs0), _leaves(obs1)):
        assert not np.shares_memory(a, b)


@pytest.mark.parametrize("env_name", ["CartPole", "Nested"])
def test_copy_false_returns_views_into_shared_memory(env_name, closing):
    shm, ref = make_pair(env_name, 4, 2, closing, copy=False)
    obs0, _ = shm.reset(seed=0)
    ref.reset(seed=0)
    shm.action_space.seed(0)
    actions = shm.action_space.sample()
    obs1, *_ = shm.step(actions)
    want1, *_ = ref.step(actions)
    for a, b in zip(_leaves(obs0), _leaves(obs1)):
        assert np.shares_memory(a, b)  # the same shared buffer, overwritten by the step
    assert_same(obs0, want1)
    assert_same(obs1, want1)


def _leaves(obs):
    if isinstance(obs, dict):
        return [leaf for value in obs.values() for leaf in _leaves(value)]
    if isinstance(obs, tuple):
        return [leaf for value in obs for leaf in _leaves(value)]
    return [obs]


def _deep_copy(obs):
    if isinstance(obs, dict):
        return {k: _deep_copy(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_deep_copy(v) for v in obs)
    return obs.copy()


# ---- attributes, calls, rendering --------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_attributes_match_sync_vector_env(mode, closing):
    fn = lambda: make_mixed(render_mode="rgb_array")
    shm, ref = make_pair(fn, 5, 2, closing, mode)
    assert shm.num_envs == ref.num_envs == 5
    assert shm.n_workers == 2
    assert shm.single_observation_space == ref.single_observation_space
    assert shm.single_action_space == ref.single_action_space
    assert shm.observation_space == ref.observation_space
    assert shm.action_space == ref.action_space
    assert shm.metadata == ref.metadata
    assert shm.metadata["autoreset_mode"] is mode
    assert shm.metadata is not MixedDictEnv.metadata
    assert WRITES_CLASS_METADATA or "autoreset_mode" not in MixedDictEnv.metadata  # (the reference's, before 1.4)
    assert shm.render_mode == ref.render_mode == "rgb_array"
    assert shm.spec is None and ref.spec is None  # as SyncVectorEnv; make_vec sets it
    assert shm.autoreset_mode is mode and shm.copy is True
    assert shm.unwrapped is shm
    given = "n_workers=2, use_main_process=False, why='n_workers=2 given'"
    threads = f"omp_spin={shm._pool.omp_spin!r}, torch_threads={shm._pool.caller.description()!r}"
    assert repr(shm) == f"ShmVectorEnv(num_envs=5, {given}, {threads})"
    assert isinstance(shm, gym.vector.VectorEnv)


def test_call_get_attr_set_attr_render_match_sync(closing):
    fn = lambda: make_mixed(render_mode="rgb_array")
    shm, ref = make_pair(fn, 5, 2, closing)
    for env in (shm, ref):
        env.reset(seed=0)
        for _ in range(3):
            env.step(np.zeros((5, 3), dtype=np.float32))
    assert shm.call("double", 21) == ref.call("double", 21) == (42,) * 5
    assert shm.call("double", x=2) == (4,) * 5
    assert shm.call("calls") == ref.call("calls") == (3,) * 5  # not callable: returned as is
    assert shm.get_attr("calls") == ref.get_attr("calls")
    assert shm.get_attr("render_mode") == ("rgb_array",) * 5
    assert shm.np_random_seed == ref.np_random_seed == (0, 1, 2, 3, 4)
    assert all(isinstance(g, np.random.Generator) for g in shm.np_random)

    for env in (shm, ref):
        env.set_attr("calls", [10, 11, 12, 13, 14])  # through set_wrapper_attr: reaches MixedDictEnv
    assert shm.get_attr("calls") == ref.get_attr("calls") == (10, 11, 12, 13, 14)
    shm.set_attr("custom", {"k": 1})  # a non-list value goes to every env
    assert shm.get_attr("custom") == ({"k": 1},) * 5
    assert_same(shm.render(), ref.render())
    assert len(shm.render()) == 5


def test_call_errors(closing):
    shm, ref = make_pair("MixedDict", 3, 2, closing)
    shm.reset(seed=0)
    with pytest.raises(AttributeError) as info:
        shm.call("no_such_attribute")
    assert info.value.env_index == 0
    assert any("env 0" in note for note in info.value.__notes__)
    for name in ("reset", "step", "close"):
        with pytest.raises(ValueError, match=f"use `{name}` directly"):
            shm.call(name)
    with pytest.raises(ValueError, match="Got `2` values for 3 environments") as ours:
        shm.set_attr("calls", [1, 2])
    with pytest.raises(ValueError) as theirs:
        ref.set_attr("calls", [1, 2])
    assert str(ours.value) == str(theirs.value)
    shm.step(np.zeros((3, 3), dtype=np.float32))  # still usable


def test_env_exception_surfaces_with_env_index(closing):
    shm = closing(ShmVectorEnv([lambda: make_mixed()] * 3, 2, start_method="fork"))
    shm.reset(seed=0)
    with pytest.raises(TypeError) as info:  # MixedDictEnv cannot multiply a string
        shm.call("double", None)
    assert info.value.env_index == 0 and info.value.worker_index == 0


# ---- bad input ---------------------------------------------------------------------


def test_wrong_action_batches_are_rejected(closing):
    cart = closing(ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, 2, start_method="fork"))
    nested = closing(ShmVectorEnv([NestedEnv] * 3, 2, start_method="fork"))
    cart.reset(seed=0)
    nested.reset(seed=0)
    with pytest.raises(InvalidActionError, match=r"shape \(4,\).*got shape \(3,\)"):
        cart.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(InvalidActionError, match=r"shape \(4,\).*got shape \(4, 1\)"):
        cart.step(np.zeros((4, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="dtype float64"):  # InvalidActionError is a ValueError
        cart.step(np.zeros(4))
    good = nested.action_space.sample()
    bad = {"move": good["move"][:2], "mode": good["mode"]}
    with pytest.raises(InvalidActionError, match=r"at \('move',\) of shape \(3, 2\)"):
        nested.step(bad)
    with pytest.raises(InvalidActionError, match="cannot find the part at \\('mode', 1\\)"):
        nested.step({"move": good["move"], "mode": (good["mode"][0],)})
    with pytest.raises(InvalidActionError, match="cannot find"):
        nested.step(np.zeros(3))
    # nothing was started by the rejected calls
    cart.step([0, 1, 0, 1])  # a plain list is fine
    nested.step(good)


def test_reset_mask_errors_match_gymnasium(closing):
    shm, ref = make_pair("CartPole", 4, 2, closing, AutoresetMode.DISABLED)
    shm.reset(seed=0)
    ref.reset(seed=0)
    bad_masks = [
        ([True, False, True, False], TypeError),
        (np.ones(3, dtype=bool), ValueError),
        (np.ones((4, 1), dtype=bool), ValueError),
        (np.ones(4, dtype=np.int64), TypeError),
        (np.zeros(4, dtype=bool), ValueError),
    ]
    for mask, exc_type in bad_masks:
        with pytest.raises(exc_type) as ours:
            shm.reset(options={"reset_mask": mask})
        with pytest.raises(AssertionError if ASSERTS_RESET_MASKS else exc_type) as theirs:
            ref.reset(options={"reset_mask": mask})
        if not ASSERTS_RESET_MASKS:  # Gymnasium before 1.4 asserts, in other words; shmvec raises 1.4's errors
            assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="length must match num_envs=4 but got length=3"):
        shm.reset(seed=[1, 2, 3])


def test_step_state_errors(closing):
    shm = closing(ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 3, 2, start_method="fork"))
    shm.reset(seed=0)
    with pytest.raises(StepStateError, match="without any prior call to `step_async`"):  # AsyncVectorEnv's words
        shm.step_wait()
    shm.step_async(np.zeros(3, dtype=np.int64))
    with pytest.raises(StepStateError, match="while waiting for a pending call to `step`"):
        shm.step_async(np.zeros(3, dtype=np.int64))
    with pytest.raises(StepStateError, match="pending"):
        shm.reset()
    with pytest.raises(StepStateError, match="pending"):
        shm.get_attr("spec")
    with pytest.raises(TypeError, match="timeout"):
        shm.step_wait(timeout="soon")
    shm.step_wait()  # a bad timeout left the step pending
    with pytest.raises(ValueError, match="Invalid|not a valid"):
        ShmVectorEnv([lambda: gym.make("CartPole-v1")], autoreset_mode="sometimes")


def test_closed_env_raises(closing):
    shm = closing(ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, 2, start_method="fork"))
    shm.reset(seed=0)
    shm.close()
    shm.close()  # twice is fine
    assert shm.closed
    calls = [
        lambda: shm.reset(),
        lambda: shm.step(np.zeros(2, dtype=np.int64)),
        lambda: shm.step_async(np.zeros(2, dtype=np.int64)),
        lambda: shm.step_wait(),
        lambda: shm.call("spec"),
        lambda: shm.get_attr("spec"),
        lambda: shm.set_attr("x", 1),
        lambda: shm.render(),
    ]
    for call in calls:
        with pytest.raises(ClosedEnvError):
            call()


class _SlowEnv(gym.Env):
    """Sleeps in step when the action is 1."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if action == 1:
            time.sleep(5)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_step_wait_timeout(closing):
    shm = closing(ShmVectorEnv([_SlowEnv] * 2, 2, start_method="fork"))
    shm.reset(seed=0)
    shm.step(np.zeros(2, dtype=np.int64))  # fast steps are unaffected
    shm.step_async(np.array([0, 1]))
    with pytest.raises(StepTimeoutError, match=r"envs 1 did not answer within timeout=0.3s") as info:
        shm.step_wait(timeout=0.3)
    assert isinstance(info.value, TimeoutError)
    assert shm._pool.timeout is None  # the per-call timeout did not stick
    shm.close()  # terminates the stuck worker


class _FragileEnv(_SlowEnv):
    """Raises on action 1, exits its process on action 2."""

    action_space = gym.spaces.Discrete(3)

    def step(self, action):
        if action == 1:
            raise ValueError("bad action 1")
        if action == 2:
            os._exit(3)
        return super().step(action)


def test_env_error_in_step_is_reraised_and_env_stays_usable(closing):
    shm = closing(ShmVectorEnv([_FragileEnv] * 3, 2, start_method="fork"))
    shm.reset(seed=0)
    with pytest.raises(ValueError, match="bad action 1") as info:
        shm.step(np.array([0, 0, 1]))
    assert info.value.env_index == 2 and info.value.worker_index == 1
    obs, *_ = shm.step(np.zeros(3, dtype=np.int64))
    assert obs.shape == (3, 1)


def test_dead_worker_is_reported_not_hung(closing):
    shm = closing(ShmVectorEnv([_FragileEnv] * 3, 2, start_method="fork"))
    shm.reset(seed=0)
    with pytest.raises(WorkerDiedError, match="worker 1"):
        shm.step(np.array([0, 0, 2]))
    with pytest.raises(WorkerDiedError):
        shm.step(np.zeros(3, dtype=np.int64))
    shm.close()
    with pytest.raises(ClosedEnvError):
        shm.reset()


# ---- Gymnasium vector wrappers and make_vec ---------------------------------------


def _wrap(env):
    env = gym.wrappers.vector.ClipAction(env)
    env = gym.wrappers.vector.NormalizeObservation(env)
    return gym.wrappers.vector.RecordEpisodeStatistics(env)


def test_gymnasium_vector_wrappers_match_sync(closing):
    shm, ref = make_pair("Pendulum", 5, 2, closing)
    shm, ref = _wrap(shm), _wrap(ref)
    assert_same(shm.reset(seed=3), ref.reset(seed=3))
    rng = np.random.default_rng(3)
    episodes = 0
    for t in range(150):
        actions = rng.uniform(-4, 4, (5, 1)).astype(np.float32)  # out of bounds: ClipAction acts
        got, want = shm.step(actions), ref.step(actions)
        _drop_wall_time(got[4], want[4])
        assert_same(got, want, f"step {t}")
        episodes += int(want[4].get("_episode", np.zeros(5, bool)).sum())
    assert episodes == 10  # 150 steps of 60-step episodes, 5 envs, next-step autoreset
    np.testing.assert_array_equal(shm.env.obs_rms.mean, ref.env.obs_rms.mean)
    assert len(shm.return_queue) == len(ref.return_queue) == 10
    assert list(shm.return_queue) == list(ref.return_queue)


def test_record_episode_statistics_same_step(closing):
    shm, ref = make_pair("CartPole", 4, 2, closing, AutoresetMode.SAME_STEP)
    shm = gym.wrappers.vector.RecordEpisodeStatistics(shm)
    ref = gym.wrappers.vector.RecordEpisodeStatistics(ref)
    counts = run_equivalence(shm, ref, 200, seed=9)
    assert counts["terminated"] > 0
    assert len(shm.length_queue) == len(ref.length_queue) == counts["terminated"] + counts["truncated"]
    assert list(shm.return_queue) == list(ref.return_queue)


def test_make_vec_mirrors_gym_make_vec(closing):
    shm = closing(
        shmvec.make_vec(
            "CartPole-v1",
            num_envs=5,
            n_workers=2,
            vector_kwargs={"autoreset_mode": "SameStep", "start_method": "fork"},
            wrappers=[gym.wrappers.RecordEpisodeStatistics],
            max_episode_steps=10,
        )
    )
    ref = closing(
        gym.make_vec(
            "CartPole-v1",
            num_envs=5,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            wrappers=[gym.wrappers.RecordEpisodeStatistics],
            max_episode_steps=10,
        )
    )
    assert isinstance(shm, ShmVectorEnv) and shm.n_workers == 2
    assert shm.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert shm.spec.id == "CartPole-v1"
    assert shm.spec.kwargs["num_envs"] == 5 and shm.spec.kwargs["max_episode_steps"] == 10
    given = "n_workers=2, use_main_process=False, why='n_workers=2 given'"
    threads = f"omp_spin={shm._pool.omp_spin!r}, torch_threads={shm._pool.caller.description()!r}"
    assert repr(shm) == f"ShmVectorEnv(CartPole-v1, num_envs=5, {given}, {threads})"
    counts = run_equivalence(shm, ref, 40, seed=0)
    assert counts["truncated"] > 0  # max_episode_steps reached the envs


# ---- other start methods -------------------------------------------------------------


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_start_method_smoke(start_method, closing):
    shm = closing(shmvec.make_vec("CartPole-v1", num_envs=3, n_workers=2, vector_kwargs={"start_method": start_method}))
    ref = closing(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync"))
    counts = run_equivalence(shm, ref, 60, seed=1)
    assert counts["terminated"] > 0


def test_call_one_calls_one_env_only(closing):
    envs = closing(ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2))
    envs.set_attr("gravity", [1.0, 2.0, 3.0, 4.0])
    assert envs.call_one(2, "get_wrapper_attr", "gravity") == 3.0 and envs.call_one(3, "gravity") == 4.0
    with pytest.raises(IndexError, match="out of range for 4 envs"):
        envs.call_one(4, "gravity")
    with pytest.raises(ValueError, match="use `step` directly"):
        envs.call_one(0, "step", 0)
    envs.close()
    with pytest.raises(ClosedEnvError):
        envs.call_one(0, "gravity")
