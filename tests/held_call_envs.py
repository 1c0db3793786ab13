"""Envs for the tests of Ctrl-C in the main shard, large requests beside async sends, and
errors that cannot be printed (tests/engine/test_held_calls.py).

Kept apart from the test modules so that spawn/forkserver workers, which import this module
to unpickle the envs, do not import pytest.
"""

from __future__ import annotations

import time

import gymnasium as gym


class Unprintable(ValueError):
    """An exception whose ``str()`` raises (a broken ``__str__`` of a user's exception)."""

    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


class SleepsOnce(gym.Wrapper):
    """CartPole whose ``at``-th step first sleeps ``seconds`` (an env stuck in a simulator), once."""

    def __init__(self, seconds: float = 0.0, at: int = 1):
        super().__init__(gym.make("CartPole-v1"))
        self.seconds, self.at, self.t = seconds, at, 0

    def step(self, action):
        self.t += 1
        if self.seconds and self.t == self.at:
            time.sleep(self.seconds)
        return self.env.step(action)


class LargeInfos(gym.Wrapper):
    """CartPole whose every step returns an info of ``size`` bytes (it travels pickled on the pipe)."""

    def __init__(self, size: int = 300_000):
        super().__init__(gym.make("CartPole-v1"))
        self.size = size

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {"payload": b"x" * self.size}


class RaisesUnprintable(gym.Wrapper):
    """CartPole whose ``at``-th step raises :class:`Unprintable`."""

    def __init__(self, at: int = 2):
        super().__init__(gym.make("CartPole-v1"))
        self.at, self.t = at, 0

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self.t += 1
        if self.t == self.at:
            raise Unprintable("the env failed")
        return self.env.step(action)
