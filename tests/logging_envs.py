"""Envs that log from their worker, for the log relay's tests (tests/processes/test_log_relay.py),
importable by workers."""

from __future__ import annotations

import logging
import os

import gymnasium as gym
import numpy as np
from gymnasium import spaces

log = logging.getLogger("probe")
noisy = logging.getLogger("probe.noisy")


class LoggingEnv(gym.Env):
    """Logs ``"reset in <pid>"`` on logger ``probe`` at each reset; ``per_step`` records of
    ``size`` characters on ``probe.noisy`` at each step (:meth:`burst`: at a call); :meth:`shout` one record
    of a given length; :meth:`wide` one too large for a datagram."""

    def __init__(self, per_step: int = 0, size: int = 100):
        self.per_step, self.size = per_step, size
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        log.info("reset in %d", os.getpid())
        return np.zeros(1, np.float32), {}

    def step(self, action):
        for i in range(self.per_step):
            noisy.info("%d %s", i, "n" * self.size)
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def burst(self, n: int) -> None:
        """Log ``n`` records of ``size`` characters on ``probe.noisy``."""
        for i in range(n):
            noisy.info("%d %s", i, "n" * self.size)

    def wide(self, chars: int = 40_000, extra_chars: int = 2_000) -> int:
        """Log one record of ``chars`` two-byte characters with an ``extra=`` attribute ``blob`` of
        ``extra_chars``: too large for one datagram in every way; returns the pid."""
        log.info("wide:%s", "\u00e9" * chars, extra={"blob": "b" * extra_chars})
        return os.getpid()

    def shout(self, length: int) -> int:
        """Log one record whose message is ``"<length>:"`` and ``length`` characters; returns the pid."""
        log.info("%d:%s", length, "x" * length)
        return os.getpid()
