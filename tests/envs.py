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


class ImageObsEnv(gym.Env):
    """(H, W, 3) uint8 image observations (channel-last), a Discrete action, random episode ends.

    For SB3's ``VecTransposeImage`` and ``VecFrameStack``; renders its current frame.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, height: int = 12, width: int = 10, render_mode=None):
        self.observation_space = spaces.Box(0, 255, (height, width, 3), np.uint8)
        self.action_space = spaces.Discrete(3)
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.frame = self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)
        return self.frame.copy(), {}

    def step(self, action):
        shift = int(action) - 1
        noise = self.np_random.integers(0, 8, self.observation_space.shape, dtype=np.uint8)
        self.frame = np.roll(self.frame, shift, axis=1) + noise  # uint8 wraps around
        terminated = bool(self.np_random.random() < 0.05)
        return self.frame.copy(), float(self.frame.mean() / 255.0), terminated, False, {}

    def render(self):
        return self.frame.copy()


def make_image(max_episode_steps: int = 30, render_mode=None):
    return gym.wrappers.TimeLimit(ImageObsEnv(render_mode=render_mode), max_episode_steps=max_episode_steps)


class NestedEnv(gym.Env):
    """Nested Dict/Tuple observations *and* actions, nested and array-valued infos.

    Episodes end by termination (a random walk leaves a box) and by the env's own
    truncation (``max_steps``), so both paths are exercised; infos are sparse.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, max_steps: int = 20, render_mode=None):
        self.observation_space = spaces.Dict(
            {
                "agent": spaces.Dict(
                    {"pos": spaces.Box(-5.0, 5.0, (2,), np.float32), "hp": spaces.Discrete(10, start=1)}
                ),
                "sensors": spaces.Tuple(
                    (spaces.Box(-np.inf, np.inf, (3,), np.float64), spaces.MultiBinary((2, 2)))
                ),
                "goal": spaces.Tuple(
                    (spaces.Discrete(4), spaces.Dict({"xy": spaces.Box(-100, 100, (2,), np.int32)}))
                ),
            }
        )
        self.action_space = spaces.Dict(
            {
                "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mode": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
            }
        )
        self.max_steps = max_steps
        self.render_mode = render_mode

    def _obs(self):
        return {
            "agent": {"pos": self.pos.astype(np.float32), "hp": int(self.hp)},
            "sensors": (self.np_random.normal(0, 1, 3), self.np_random.integers(0, 2, (2, 2), dtype=np.int8)),
            "goal": (int(self.t % 4), {"xy": np.array([self.t, -self.t], dtype=np.int32)}),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, 2)
        self.hp, self.t = 10, 0
        return self._obs(), {"spawn": self.pos.copy(), "level": {"id": int(self.np_random.integers(0, 5))}}

    def step(self, action):
        mode, bits = action["mode"]
        self.t += 1
        self.pos = np.clip(self.pos + 0.3 * np.asarray(action["move"], np.float64) + self.np_random.normal(0, 0.2, 2), -5, 5)
        self.hp = max(1, self.hp - int(mode == 2) - int(np.sum(bits)))
        terminated = bool(np.abs(self.pos).max() > 1.5)
        truncated = self.t >= self.max_steps
        reward = float(-np.abs(self.pos).sum()) + 0.1 * int(mode)
        info = {}
        if self.t % 4 == 0:
            info = {"stats": {"dist": float(np.abs(self.pos).sum()), "t": self.t}, "bits": np.asarray(bits).copy()}
        return self._obs(), reward, terminated, truncated, info

    def render(self):
        return np.full((3, 3, 3), self.t % 256, dtype=np.uint8)
