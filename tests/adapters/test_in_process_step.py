"""Every env in this process (``n_workers=0``): a step is one direct call, as in DummyVecEnv and
SyncVectorEnv: the caller's SIGINT handler stays installed while the envs step (nothing to hold:
no worker is waited on), and ``envs.timings`` still counts every step. Results: the equivalence
suites (their ``K0`` layouts step through this path)."""

from __future__ import annotations

import signal

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmPoolVecEnv, ShmVectorEnv


class HandlerSeen(gym.Env):
    """Records, in each step's info, whether SIGINT's handler was the caller's as the env stepped."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    caller_handler = signal.default_int_handler

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        own = signal.getsignal(signal.SIGINT) is HandlerSeen.caller_handler
        return np.zeros(2, np.float32), 1.0, False, False, {"own_handler": own}


def own_handler(signum, frame):
    raise KeyboardInterrupt


@pytest.mark.parametrize("adapter", [ShmPoolVecEnv, ShmVectorEnv])
def test_an_in_process_step_leaves_the_callers_sigint_handler_alone(adapter, closing):
    before = signal.signal(signal.SIGINT, own_handler)
    HandlerSeen.caller_handler = own_handler
    try:
        envs = closing(adapter([HandlerSeen] * 2, n_workers=0))
        envs.reset()
        for _ in range(3):
            infos = envs.step(np.zeros(2, dtype=np.int64))[-1]
            seen = [info["own_handler"] for info in infos] if adapter is ShmPoolVecEnv else list(infos["own_handler"])
            assert seen == [True, True]
        assert envs.timings.steps == 3
    finally:
        signal.signal(signal.SIGINT, before)
