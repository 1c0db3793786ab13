"""Envs that misbehave on purpose, for tests/engine/test_failures.py and tests/engine/test_resources.py.

Kept apart from the test modules so that spawn/forkserver workers, which import this
module to unpickle the envs, do not import pytest, SB3 and torch as well.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

N_ENVS, N_WORKERS, BAD = 4, 2, 3  # env 3 misbehaves; it lives in worker 1 with env 2


class Boom(ValueError):
    """What the faulty envs raise: a user-defined type must come back as itself."""


class FaultyEnv(gym.Env):
    """A tiny env that misbehaves as told (``fail``) from its ``at``-th step on; each step first
    waits ``wait`` seconds in a syscall (an env that waits on a simulator)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, fail: str | None = None, at: int = 2, render_mode: str = "rgb_array", wait: float = 0.0):
        if fail == "init":
            raise Boom("env construction failed on purpose")
        if fail == "init_hang":
            time.sleep(600)
        self.fail, self.at, self.render_mode, self.wait = fail, at, render_mode, wait
        self.t = 0
        self.lock = threading.Lock()  # cannot be pickled

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail == "reset":
            raise Boom("reset failed on purpose")
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.wait:
            time.sleep(self.wait)
        self.t += 1
        info = {}
        if self.t >= self.at:
            if self.fail == "step" and self.t == self.at:  # once: the pool must then go on
                raise Boom("step failed on purpose")
            if self.fail == "exit":
                os._exit(3)
            if self.fail == "segv":
                faulthandler.disable()  # pytest's, inherited by fork: keep the log free of a fake crash dump
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.fail == "hang":
                time.sleep(600)
            if self.fail == "slow":
                time.sleep(0.5)
            if self.fail == "bad_info":
                info = {"lock": self.lock}
        return self._obs(), 1.0, False, False, info

    def render(self):
        if self.fail == "render":
            raise Boom("render failed on purpose")
        return np.zeros((4, 4, 3), np.uint8)

    def boom(self):
        raise Boom("env_method failed on purpose")

    def pid(self):
        return os.getpid()

    def _obs(self):
        return np.full(2, min(self.t, 100) / 100, np.float32)


def env_fns(fail: str | None, bad: int = BAD, n: int = N_ENVS, **kwargs) -> list:
    return [functools.partial(FaultyEnv, fail if i == bad else None, **kwargs) for i in range(n)]


class DieOnce(gym.Wrapper):
    """CartPole that kills its own process at its ``at``-th step, unless ``marker`` exists.

    It creates ``marker`` first, so the env rebuilt by a restart lives on. Counts its
    resets in ``resets`` (a fresh instance starts at 0). ``infos``: every step returns an
    info, ``{"t": steps}`` from the envs built at start-up, ``{"rebuilt": steps}`` from those
    built once ``marker`` exists.
    """

    def __init__(self, how: str | None = None, at: int = 5, marker: str = "", infos: bool = False):
        super().__init__(gym.make("CartPole-v1"))
        self.how, self.at, self.marker = how, at, marker
        self.t = self.resets = 0
        self.info_key = ("rebuilt" if os.path.exists(marker) else "t") if infos else None

    def reset(self, **kwargs):
        self.resets += 1
        return self.env.reset(**kwargs)

    def step(self, action):
        self.t += 1
        if self.how and self.t == self.at and not os.path.exists(self.marker):
            open(self.marker, "x").close()
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.info_key:
            info = {self.info_key: np.float64(self.t)}
        return obs, reward, terminated, truncated, info

    def pid(self):
        return os.getpid()


def die_once_fns(how: str | None, marker: str, bad: int = BAD, n: int = N_ENVS, at: int = 5, infos=False) -> list:
    return [functools.partial(DieOnce, how if i == bad else None, at, marker, infos) for i in range(n)]
