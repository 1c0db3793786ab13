"""A synthetic env with a tunable step cost and observation size.

It maps the plane "how much work per step" x "how many bytes per observation" that
the real envs only sample. The step busy-waits (so it costs CPU like a real env, unlike
``time.sleep``) and returns a preallocated observation whose first element changes, so
the cost of *producing* the observation is near zero and what is measured is the vector
env's cost of moving it.

Example:
    >>> env = SyntheticEnv(step_cost=150e-6, obs_shape=(84, 84, 4), dtype="uint8")
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, obs.dtype
    ((84, 84, 4), dtype('uint8'))
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

_perf_counter = time.perf_counter


def busy_wait(seconds: float) -> None:
    """Burn ``seconds`` of CPU (a sleep would free the core and flatter parallel runners)."""
    end = _perf_counter() + seconds
    while _perf_counter() < end:
        pass


class SyntheticEnv(gym.Env):
    """Discrete(2) actions, a Box observation of ``obs_shape``/``dtype``, a fixed step cost.

    Args:
        step_cost: seconds of busy-wait per ``step()`` (0 = no env work at all).
        obs_shape: observation shape; ``(84, 84, 4)`` uint8 is an Atari frame stack.
        dtype: observation dtype.
        episode_length: steps until truncation; ``None`` never ends (no reset traffic).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        step_cost: float = 0.0,
        obs_shape: tuple[int, ...] = (4,),
        dtype: str = "float32",
        episode_length: int | None = None,
    ):
        dtype = np.dtype(dtype)
        high = 255 if dtype == np.uint8 else 1.0
        self.observation_space = spaces.Box(0, high, tuple(obs_shape), dtype)
        self.action_space = spaces.Discrete(2)
        self.step_cost = float(step_cost)
        self.episode_length = episode_length
        self._obs = np.zeros(obs_shape, dtype)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._obs.flat[0] = 0
        return self._obs, {}

    def step(self, action):
        if self.step_cost:
            busy_wait(self.step_cost)
        self._t += 1
        self._obs.flat[0] = self._t % 100
        truncated = self.episode_length is not None and self._t >= self.episode_length
        return self._obs, 1.0, False, truncated, {}
