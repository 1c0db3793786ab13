"""Envs that wait: the default gives them more workers than cores, and on those lanes (every
wait blocking) results stay bit-identical to the references and failures stay clear."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv, StepTimeoutError, WorkerDiedError
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.planning.plan import usable_cores
from tests.envs import WaitingRandomEnv
from tests.faulty import Boom, FaultyEnv
from tests.helpers import assert_same

N = 12
WAIT = WaitingRandomEnv.wait


def test_the_default_gives_waiting_envs_more_workers_than_cores_and_equals_dummyvecenv(closing):
    shm = closing(ShmPoolVecEnv([WaitingRandomEnv] * N))
    assert shm.n_workers > usable_cores() and "waits" in repr(shm), repr(shm)
    ref = DummyVecEnv([WaitingRandomEnv] * N)
    shm.seed(7), ref.seed(7)
    assert_same(shm.reset(), ref.reset())
    rng = np.random.default_rng(0)
    for _ in range(25):
        actions = rng.integers(0, 3, N)
        assert_same(shm.step(actions), ref.step(actions))


def test_the_default_on_waiting_envs_equals_syncvectorenv(closing):
    shm = closing(ShmVectorEnv([WaitingRandomEnv] * N, autoreset_mode=AutoresetMode.SAME_STEP))
    assert shm.n_workers > usable_cores()
    ref = SyncVectorEnv([WaitingRandomEnv] * N, autoreset_mode=AutoresetMode.SAME_STEP)
    assert_same(shm.reset(seed=1), ref.reset(seed=1))
    rng = np.random.default_rng(1)
    for _ in range(25):
        actions = rng.integers(0, 3, N)
        assert_same(shm.step(actions), ref.step(actions))


def faulty(fail: str | None, bad: int = 9) -> list:
    return [functools.partial(FaultyEnv, fail if i == bad else None, wait=WAIT) for i in range(N)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", [ShmPoolVecEnv, ShmVectorEnv])
def test_an_env_that_raises_on_a_crowded_lane(closing, adapter):
    env = closing(adapter(faulty("step")))  # the default: one worker per waiting env
    assert env.n_workers > usable_cores()
    env.reset()
    env.step(np.zeros(N, np.int64))
    with pytest.raises(Boom) as excinfo:
        env.step(np.zeros(N, np.int64))
    assert any(f"raised in env 9 (worker {excinfo.value.worker_index})" in note for note in excinfo.value.__notes__)
    env.step(np.zeros(N, np.int64))  # still usable


@pytest.mark.timeout(60)
def test_a_worker_that_dies_on_a_crowded_lane(closing):
    env = closing(ShmVectorEnv(faulty("exit")))
    env.reset(seed=0)
    env.step(np.zeros(N, np.int64))
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"\(envs 9\.\.9, pid \d+\) died with exit code 3"):
        env.step(np.zeros(N, np.int64))
    assert time.monotonic() - start < 5


@pytest.mark.timeout(60)
def test_an_env_that_hangs_on_a_crowded_lane_times_out(closing):
    env = closing(ShmVectorEnv(faulty("hang"), timeout=1.0))
    env.reset(seed=0)
    env.step(np.zeros(N, np.int64))
    with pytest.raises(StepTimeoutError, match="envs 9 did not answer within timeout=1.0s"):
        env.step(np.zeros(N, np.int64))
