"""An env that waits rather than computes, as envs that talk to a simulator do.

Used by ``python -m shmvec.demo`` and the scaling benchmark (``bench/scaling.py``).
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class WaitingEnv(gym.Env):
    """An env that waits rather than computes: each ``step()`` blocks ``wait`` seconds in a
    syscall (``time.sleep``), like a simulator or game engine answering over a socket, and
    uses almost no CPU. ``N / wait`` steps per second is the limit any vector env can reach.

    Example:
        >>> env = WaitingEnv(wait=0.0)
        >>> env.reset(seed=0)[0].shape
        (4,)
    """

    metadata = {"render_modes": []}

    def __init__(self, wait: float = 2e-3, obs_shape: tuple[int, ...] = (4,), episode_length: int = 500):
        self.observation_space = spaces.Box(-1.0, 1.0, tuple(obs_shape), np.float32)
        self.action_space = spaces.Discrete(2)
        self.wait, self.episode_length = float(wait), episode_length
        self._obs = np.zeros(obs_shape, np.float32)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs.copy(), {}

    def step(self, action):
        if self.wait:  # time.sleep(0) still costs a syscall and a trip through the scheduler
            time.sleep(self.wait)
        self._t += 1
        self._obs[0] = self._t / self.episode_length
        return self._obs.copy(), 1.0, False, self._t >= self.episode_length, {}
