"""Every env gets its action exactly as the reference implementations hand it over.

SyncVectorEnv and AsyncVectorEnv give env i the i-th item of ``iterate(action_space,
actions)``, DummyVecEnv ``actions[i]``: a row of the caller's array in the caller's dtype
(a numpy scalar for a shape-() leaf), or the caller's own Python number or list.
ShmVectorEnv and ShmPoolVecEnv must give the same through shared memory whatever the
caller passes: float64 for a float32 Box, ints for a float Box, float16, long double,
Python lists and numbers, a different type per env, nested Dict/Tuple actions; in a step
and in async send/recv batches. :class:`~envs.ActionProbeEnv` says in its info exactly
what it got, and those infos are compared with the reference's.
"""

from __future__ import annotations

import functools
import multiprocessing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_space, iterate
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from tests.envs import ActionProbeEnv, SleepEnv, describe_action
from tests.helpers import assert_same

N = 4
SPACES = {
    "box": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "scalar_box": spaces.Box(0.0, 1.0, (), np.float32),
    "discrete": spaces.Discrete(3),
    "multi_discrete": spaces.MultiDiscrete([3, 2]),
    "multi_binary": spaces.MultiBinary(4),
    "nested": spaces.Dict(
        {
            "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "gear": spaces.Discrete(3),
            "aux": spaces.Tuple((spaces.MultiBinary(2), spaces.Box(0.0, 2.0, (), np.float64))),
        }
    ),
}
# (n_workers, main_shard): 4 envs as shards of 2+2 in workers, and of 2 in a worker + 2 in the main process
LAYOUTS = [(2, False), (1, True)]


def leaf_batches(space: spaces.Space, rng: np.random.Generator, n: int) -> list[Any]:
    """Batches of ``n`` actions of a Box/Discrete/MultiDiscrete/MultiBinary ``space``, in
    every form the references take: arrays of many dtypes, Python lists, per-env mixes."""
    if isinstance(space, spaces.Box):
        floats = rng.uniform(space.low, space.high, (n, *space.shape))  # float64, as numpy makes them
        ints = rng.integers(0, 2, (n, *space.shape))
        arrays = [floats, floats.astype(np.float32), floats.astype(np.float16), floats.astype(np.longdouble), ints]
        forms = [
            lambda j: floats[j].astype(np.float16),
            lambda j: floats[j],
            lambda j: floats[j].tolist(),
            lambda j: ints[j].astype(np.int8),
        ]
        mix = [forms[j % 4](j) for j in range(n)]
        return [*arrays, floats.tolist(), ints.tolist(), mix]
    ints = np.stack([space.sample() for _ in range(n)]).astype(np.int64)
    arrays = [ints, ints.astype(np.int32), ints.astype(np.uint8), ints.astype(np.int16)]
    if isinstance(space, spaces.MultiBinary):
        arrays += [ints.astype(np.bool_), ints.astype(np.float32)]  # SB3's PPO samples MultiBinary as floats
    forms = [
        lambda j: ints[j].astype(np.int16),
        lambda j: ints[j],
        lambda j: ints[j].tolist(),
        lambda j: ints[j].astype(np.uint8),
    ]
    mix = [forms[j % 4](j) for j in range(n)]
    return [*arrays, ints.tolist(), mix]


def batches(space: spaces.Space, rng: np.random.Generator, n: int = N) -> list[Any]:
    """Batches as ``SyncVectorEnv`` takes them: for a Dict space a dict of leaf batches,
    nested as the space is (a Tuple's batches in a tuple or a list)."""
    if not isinstance(space, spaces.Dict):
        return leaf_batches(space, rng, n)
    move, gear = leaf_batches(space["move"], rng, n), leaf_batches(space["gear"], rng, n)
    bits, boost = leaf_batches(space["aux"][0], rng, n), leaf_batches(space["aux"][1], rng, n)
    count = min(map(len, (move, gear, bits, boost)))
    aux = [(bits[k], boost[-1 - k]) if k % 2 else [bits[k], boost[-1 - k]] for k in range(count)]
    return [{"move": move[k], "gear": gear[-1 - k], "aux": aux[k]} for k in range(count)]


def per_env(space: spaces.Space, batch: Any) -> list[Any]:
    """One action per env, as ``SyncVectorEnv`` hands them over: DummyVecEnv's form of a batch."""
    return list(iterate(batch_space(space, N), batch))


def probe(space: spaces.Space):
    return functools.partial(ActionProbeEnv, space)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["workers", "main_shard"])
@pytest.mark.parametrize("name", list(SPACES))
def test_shm_vector_env_hands_each_env_what_sync_vector_env_does(name, layout, closing):
    space, (n_workers, main_shard) = SPACES[name], layout
    shm = closing(ShmVectorEnv([probe(space)] * N, n_workers, use_main_process=main_shard, start_method="fork"))
    ref = closing(SyncVectorEnv([probe(space)] * N))
    assert_same(shm.reset(seed=0), ref.reset(seed=0), "reset")
    tried = set()
    for k, actions in enumerate(batches(space, np.random.default_rng(1))):
        got, want = shm.step(actions), ref.step(actions)
        assert_same(got, want, f"batch {k}")
        tried.update(got[4]["got"])
    assert len(tried) > N, "the batches gave the envs different actions"


@pytest.mark.parametrize("layout", LAYOUTS, ids=["workers", "main_shard"])
@pytest.mark.parametrize("name", list(SPACES))
def test_shm_pool_vec_env_hands_each_env_what_dummy_vec_env_does(name, layout, closing):
    space, (n_workers, main_shard) = SPACES[name], layout
    shm = closing(ShmPoolVecEnv([probe(space)] * N, n_workers, use_main_process=main_shard, start_method="fork"))
    dummy = closing(DummyVecEnv([probe(space)] * N))
    assert_same(shm.reset(), dummy.reset(), "reset")
    for k, batch in enumerate(batches(space, np.random.default_rng(2))):
        # DummyVecEnv indexes the batch: a flat space's batch as it is, a Dict space's as a list of dicts
        actions = per_env(space, batch) if isinstance(space, spaces.Dict) else batch
        assert_same(shm.step(actions), dummy.step(actions), f"batch {k}")


@pytest.mark.parametrize("main_shard", [False, True], ids=["workers", "main_shard"])
@pytest.mark.parametrize("name", ["box", "scalar_box", "discrete", "nested"])
def test_async_batches_hand_each_env_what_it_gets_alone(name, main_shard, closing):
    """Batches of 2 in flight together, each in its own dtypes, in every worker (a batch
    takes envs from every worker in turn)."""
    space = SPACES[name]
    envs = closing(
        ShmVectorEnv([probe(space)] * N, 2 - main_shard, batch_size=2, use_main_process=main_shard, start_method="fork")
    )
    alone = [ActionProbeEnv(space) for _ in range(N)]
    forms = batches(space, np.random.default_rng(3), n=2)
    envs.async_reset(seed=0)
    want: dict[int, str] = {}
    for k in range(3 * len(forms)):
        infos = envs.recv()[4]
        ids = infos["env_id"].tolist()
        for row, i in enumerate(ids):
            if i in want:
                assert infos["got"][row] == want.pop(i), f"round {k}, env {i}"
        actions = forms[k % len(forms)]
        for i, action in zip(ids, iterate(batch_space(space, 2), actions)):
            want[i] = alone[i].step(action)[4]["got"]
        envs.send(actions)
    assert len(want) == N  # still in flight: every env was sent actions


@pytest.mark.parametrize("adapter", ["gymnasium", "sb3"])
def test_half_cheetah_with_float64_actions_matches_the_reference_bit_for_bit(adapter, closing, monkeypatch, tmp_path):
    """MuJoCo integrates float64 controls: a float32 rounding of them changes the run."""
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings to MUJOCO_LOG.TXT here
    fns = [lambda: gym.make("HalfCheetah-v5")] * 4
    if adapter == "gymnasium":
        shm, ref = closing(ShmVectorEnv(fns, 2, start_method="fork")), closing(SyncVectorEnv(fns))
        assert_same(shm.reset(seed=5), ref.reset(seed=5), "reset")
    else:
        shm, ref = closing(ShmPoolVecEnv(fns, 2, start_method="fork")), closing(DummyVecEnv(fns))
        assert shm.seed(5) == ref.seed(5)
        assert_same(shm.reset(), ref.reset(), "reset")
    rng = np.random.default_rng(0)
    for step in range(50):
        actions = rng.uniform(-1.0, 1.0, (4, 6))  # float64; the action space is float32
        assert_same(shm.step(actions), ref.step(actions), f"step {step}")


def test_an_env_that_sleeps_its_action_gets_a_float_time_sleep_takes(closing):
    """``time.sleep`` takes a numpy.float64 and refuses a numpy.float32, for both."""
    shm = closing(ShmVectorEnv([SleepEnv] * N, 2, start_method="fork"))
    ref = closing(SyncVectorEnv([SleepEnv] * N))
    for envs in (shm, ref):
        envs.reset(seed=0)
        envs.step(np.full(N, 0.01))
        with pytest.raises(TypeError, match="'numpy.float32' object cannot be interpreted as an integer"):
            envs.step(np.full(N, 0.01, np.float32))
    shm = closing(ShmVectorEnv([SleepEnv] * N, 2, start_method="fork"))
    shm.reset(seed=0)
    shm.step_async(np.array([0.1, 0.1, 0.3, 0.1]))
    with pytest.raises(multiprocessing.TimeoutError):
        shm.step_wait(timeout=0.1)
    shm.close(terminate=True)


def test_describe_action_tells_apart_what_an_env_can():
    """The probe's report is only as good as this: every difference the tests above rely on shows."""
    same_value = [1.0, np.float64(1.0), np.float32(1.0), np.array(1.0), np.array([1.0]), [1.0], (1.0,), 1, True]
    assert len({describe_action(value) for value in same_value}) == len(same_value)
    assert describe_action({"a": 1, "b": 2}) != describe_action({"b": 2, "a": 1})
    assert describe_action(np.longdouble(1) / 3) != describe_action(np.longdouble(1 / 3))
