"""Small real-dynamics test envs covering the space types shmvec must lay out."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class MixedDictEnv(gym.Env):
    """Dict observations of mixed dtypes and shapes, a Box action, random episode lengths.

    Episodes end by termination (a random walk leaves [-1, 1]) and, through the
    TimeLimit wrapper of :func:`make_mixed`, by truncation, so both paths are exercised.
    Infos are non-empty on some steps only.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None):
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-np.inf, np.inf, (3,), np.float32),
                "image": spaces.Box(0, 255, (6, 5, 3), np.uint8),
                "count": spaces.Discrete(1000),
                "flags": spaces.MultiBinary(4),
                "grid": spaces.MultiDiscrete([3, 5]),
                "energy": spaces.Box(-10.0, 10.0, (), np.float64),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.render_mode = render_mode
        self.calls = 0

    def _obs(self):
        return {
            "position": self.pos.astype(np.float32),
            "image": self.np_random.integers(0, 256, (6, 5, 3), dtype=np.uint8),
            "count": int(self.t),
            "flags": self.np_random.integers(0, 2, 4, dtype=np.int8),
            "grid": np.array([self.t % 3, self.t % 5], dtype=np.int64),
            "energy": np.float64(self.pos.sum()),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        scale = 0.1 if not options else options.get("scale", 0.1)
        self.pos = self.np_random.uniform(-scale, scale, 3)
        self.t = 0
        return self._obs(), {"start": self.pos.copy()}

    def step(self, action):
        self.calls += 1
        self.t += 1
        self.pos = self.pos + 0.1 * np.asarray(action, dtype=np.float64) + self.np_random.normal(0, 0.05, 3)
        terminated = bool(np.abs(self.pos).max() > 1.0)
        reward = float(-np.square(self.pos).sum())
        info = {"t": self.t} if self.t % 3 == 0 else {}
        return self._obs(), reward, terminated, False, info

    def render(self):
        return np.full((4, 4, 3), self.t % 256, dtype=np.uint8)

    def double(self, x):
        return 2 * x


def make_mixed(max_episode_steps: int = 25, render_mode=None):
    return gym.wrappers.TimeLimit(MixedDictEnv(render_mode=render_mode), max_episode_steps=max_episode_steps)


class TupleObsEnv(gym.Env):
    """Tuple observations (Box, Discrete) and a Discrete action."""

    def __init__(self):
        self.observation_space = spaces.Tuple((spaces.Box(-5, 5, (2,), np.float32), spaces.Discrete(7)))
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return (self.x.copy(), 0), {}

    def step(self, action):
        self.x = np.clip(self.x + (int(action) - 1) * 0.3 + self.np_random.normal(0, 0.1, 2), -5, 5).astype(np.float32)
        k = int(self.np_random.integers(0, 7))
        return (self.x.copy(), k), float(self.x[0]), bool(abs(self.x[1]) > 2), False, {}
