"""Envs with the per-step calls of HER and MaskablePPO: ``compute_reward`` and ``action_masks``.

SB3's ``HerReplayBuffer`` calls ``env_method("compute_reward", achieved, desired, infos, indices=[0])``
for every batch it samples (two ``(batch, 3)`` arrays and a list of ``batch`` info dicts);
sb3-contrib's MaskablePPO calls ``env_method("action_masks")`` before every step.
:class:`OwnGlobalRng` and :func:`make_fetch` bring third-party envs with these calls
(sb3-contrib's ``InvalidActionEnvDiscrete``, Gymnasium-Robotics' FetchReach) to the tests.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class GoalReach(gym.Env):
    """A point moving towards a goal in 3-D, observed as goal-conditioned envs are (FetchReach's keys).

    Each env draws its own success threshold at its first reset, so results tell which env answered.
    ``compute_reward`` works on one goal or a batch; a batch's infos may carry a ``"penalty"``, so
    results also tell whether the infos arrived.
    """

    def __init__(self, max_steps: int = 20):
        box = spaces.Box(-10.0, 10.0, (3,), np.float64)
        self.observation_space = spaces.Dict(
            {"observation": spaces.Box(-10.0, 10.0, (6,), np.float64), "achieved_goal": box, "desired_goal": box}
        )
        self.action_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.max_steps = max_steps
        self.threshold: float | None = None
        self.calls = 0  # compute_reward calls: which env (and so which worker) was asked

    def _obs(self):
        return {
            "observation": np.concatenate([self.pos, self.goal]),
            "achieved_goal": self.pos.copy(),
            "desired_goal": self.goal.copy(),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.threshold is None:
            self.threshold = float(self.np_random.uniform(0.05, 0.5))
        self.pos, self.goal = self.np_random.uniform(-1, 1, 3), self.np_random.uniform(-1, 1, 3)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = self.pos + 0.1 * np.clip(action, -1.0, 1.0)
        self.t += 1
        reward = float(self.compute_reward(self.pos, self.goal, {}))
        return self._obs(), reward, False, self.t >= self.max_steps, {"is_success": float(reward == 0.0)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        self.calls += 1
        distance = np.linalg.norm(achieved_goal - desired_goal, axis=-1)
        reward = -(distance > self.threshold).astype(np.float32)
        if isinstance(info, (list, np.ndarray)):  # a batch: one info per goal
            reward -= np.array([entry.get("penalty", 0.0) for entry in info], np.float32)
        return reward

    def count_calls(self) -> int:
        return self.calls


def her_call_args(rng: np.random.Generator, batch: int = 256) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """``compute_reward``'s arguments as HerReplayBuffer passes them: two ``(batch, 3)`` arrays and
    ``batch`` info dicts (empty unless ``copy_info_dict``; a few carry a penalty here)."""
    achieved, desired = rng.uniform(-1, 1, (batch, 3)), rng.uniform(-1, 1, (batch, 3))
    infos = [{"penalty": 0.5} if i % 7 == 0 else {} for i in range(batch)]
    return achieved, desired, infos


class MaskedWalk(gym.Env):
    """A walk on 0..9 with 5 moves, some of them masked at each position (MaskablePPO's ``action_masks``)."""

    observation_space = spaces.Box(0.0, 1.0, (10,), np.float32)
    action_space = spaces.Discrete(5)
    MOVES = np.array([-2, -1, 0, 1, 2])

    def __init__(self, max_steps: int = 25):
        self.max_steps = max_steps

    def _obs(self):
        obs = np.zeros(10, np.float32)
        obs[self.position] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = int(self.np_random.integers(0, 10)), 0
        return self._obs(), {}

    def action_masks(self) -> np.ndarray:
        landing = self.position + self.MOVES
        return (landing >= 0) & (landing <= 9) & (self.MOVES != self.position % 3 - 1)

    def step(self, action):
        valid = bool(self.action_masks()[action])
        if valid:
            self.position += int(self.MOVES[action])
        self.t += 1
        reward = (1.0 if self.position == 9 else 0.0) - (0.0 if valid else 1.0)
        return self._obs(), reward, self.position == 9, self.t >= self.max_steps, {}


class OwnGlobalRng(gym.Wrapper):
    """Gives an env that draws from ``np.random`` (and samples its own action space) a generator of
    its own, seeded by ``reset(seed=...)``: its numbers then depend on its seed alone, not on
    which process runs it or which envs drew before it (sb3-contrib's ``InvalidActionEnvDiscrete``
    draws its states from its action space, never seeded, and its invalid actions from ``np.random``)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._state = np.random.RandomState(0).get_state()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.env.action_space.seed(seed)
            self._state = np.random.RandomState(seed).get_state()
        return self._own_rng(self.env.reset, seed=seed, options=options)

    def step(self, action):
        return self._own_rng(self.env.step, action)

    def _own_rng(self, call, *args, **kwargs):
        saved = np.random.get_state()
        np.random.set_state(self._state)
        try:
            return call(*args, **kwargs)
        finally:
            self._state = np.random.get_state()
            np.random.set_state(saved)


def make_invalid_action_env(dim: int = 80, n_invalid_actions: int = 60) -> gym.Env:
    """sb3-contrib's ``InvalidActionEnvDiscrete`` (as its MaskablePPO tests build it) in :class:`OwnGlobalRng`."""
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    return OwnGlobalRng(InvalidActionEnvDiscrete(dim=dim, n_invalid_actions=n_invalid_actions))


def make_fetch(env_id: str = "FetchReach-v4") -> gym.Env:
    """A Gymnasium-Robotics env; importing its module registers its envs, in whichever process builds one."""
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return gym.make(env_id)
