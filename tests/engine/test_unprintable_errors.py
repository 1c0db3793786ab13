"""An env exception whose ``str()`` raises: reported as the env's error, its worker lives on."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVectorEnv
from tests.held_call_envs import RaisesUnprintable, Unprintable


def env_fns() -> list:
    return [lambda: gym.make("CartPole-v1"), functools.partial(RaisesUnprintable, at=2)]


@pytest.mark.parametrize("failure", ["raise", "restart"])
def test_the_env_error_is_raised_and_the_worker_lives(closing, failure):
    env = closing(ShmVectorEnv(env_fns(), n_workers=2, start_method="fork", on_worker_failure=failure, timeout=10.0))
    env.reset(seed=0)
    worker = env._pool.links[1].process
    env.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(Unprintable) as raised:
        env.step(np.zeros(2, dtype=np.int64))
    assert raised.value.env_index == 1 and raised.value.args == ("the env failed",)
    assert worker.exitcode is None  # alive: not restarted, not dead
    if failure == "restart":
        assert env._pool.restarter.count == 0
    obs, rewards, *_ = env.step(np.zeros(2, dtype=np.int64))  # the pool goes on
    assert rewards.tolist() == [1.0, 1.0]
