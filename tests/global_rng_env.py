"""Envs for the default plan's and the workers' generators' tests (tests/engine/test_timing_run.py,
tests/processes/test_worker_rngs.py), importable by workers.

:class:`GlobalRngEnv` draws from the legacy global generators (``np.random``, ``random``),
as old code does; :class:`DyingRngEnv` also ends its process on action 1; :class:`CountingEnv`
records the pid of every process that builds one; :class:`BusyEnv` and :class:`WaitingEnv`
compute or wait a fixed time per step.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class GlobalRngEnv(gym.Env):
    """Observations, rewards and episode ends drawn from ``np.random`` and ``random`` (never
    from ``self.np_random``), in ``reset`` and ``step``; building one draws nothing."""

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 2.0, (2,), np.float64)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([np.random.random(), random.random()]), {}

    def step(self, action):
        obs = np.array([np.random.random() + int(action), random.random()])
        reward = float(np.random.random())
        terminated = bool(np.random.random() < 0.1)
        truncated = bool(random.random() < 0.05)
        return obs, reward, terminated, truncated, {}

    def draws(self) -> tuple[float, float]:
        """The next ``random.random()`` and ``np.random.random()`` of the process the env is in."""
        return random.random(), float(np.random.random())


class DyingRngEnv(GlobalRngEnv):
    """A :class:`GlobalRngEnv` whose process exits at once (as in a crash) when it steps action 1."""

    def step(self, action):
        if int(action) == 1:
            os._exit(1)
        return super().step(action)


class CountingEnv(gym.Env):
    """Appends the pid of the process that builds it, one line per env, to the file ``path``."""

    def __init__(self, path: str):
        with open(path, "a") as builds:
            builds.write(f"{os.getpid()}\n")
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


def builds(path) -> list[int]:
    """The pids :class:`CountingEnv` wrote to ``path``, one per env built."""
    path = Path(path)
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


class _TimedEnv(gym.Env):
    """An env whose step only takes ``seconds``, one way or another."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}


class BusyEnv(_TimedEnv):
    """Computes ``seconds`` (a busy loop on the clock) in every step: CPU-bound."""

    def __init__(self, seconds: float = 150e-6):
        super().__init__(seconds)

    def step(self, action):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return np.zeros(1, np.float32), 0.0, False, False, {}


class WaitingEnv(_TimedEnv):
    """Sleeps ``seconds`` in every step, as an env that waits on a simulator or a socket."""

    def __init__(self, seconds: float = 0.002):
        super().__init__(seconds)

    def step(self, action):
        time.sleep(self.seconds)
        return np.zeros(1, np.float32), 0.0, False, False, {}
