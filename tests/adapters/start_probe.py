"""An env that tells how its process was started: which start method, and whether it is daemonic.

``STATE`` is ``"imported"`` in a process that imported this module afresh (spawn, forkserver)
and whatever the test set it to in a process forked from the test's (fork). Kept in a small
module of its own, so that a spawned worker imports little.
"""

from __future__ import annotations

import multiprocessing

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete

STATE = "imported"


class ProbeEnv(gym.Env):
    observation_space = Box(-1.0, 1.0, (2,), np.float32)
    action_space = Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return obs, float(action) + float(obs[0]), bool(obs[1] > 0.9), False, {}

    @property
    def state(self) -> str:
        return STATE

    @property
    def daemonic(self) -> bool:
        return multiprocessing.current_process().daemon
