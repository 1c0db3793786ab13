"""Envs and factories that leave files behind, as training scripts set them up: CleanRL's
``make_env(env_id, idx, capture_video, run_name)`` (``RecordVideo`` on env 0) and envs whose step
or construction takes long (the timing process's watchdog tests).

:class:`FramedCartPole` is CartPole-v1 whose ``rgb_array`` frames are drawn from its state
(no pygame); ``RecordVideo`` then needs MoviePy, which ``tests/stub_moviepy`` stands in for
(put :data:`STUB_MOVIEPY` on ``sys.path``).
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

STUB_MOVIEPY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_moviepy")
FRAMED_CARTPOLE = "shmvec-tests/FramedCartPole-v1"


class FramedCartPole(CartPoleEnv):
    """CartPole whose ``rgb_array`` frame is a 2x4 picture of its state."""

    def render(self):
        if self.render_mode != "rgb_array":
            return super().render()
        values = np.clip((np.asarray(self.state, np.float64) + 5.0) * 25.0, 0, 255).astype(np.uint8)
        return np.broadcast_to(values[None, :, None], (2, 4, 3)).copy()


if FRAMED_CARTPOLE not in gym.registry:
    gym.register(FRAMED_CARTPOLE, entry_point=f"{__name__}:FramedCartPole", max_episode_steps=500)


def make_env(env_id, idx, capture_video, run_name):
    """CleanRL's ``make_env`` (``ppo.py``), as its scripts have it."""

    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return thunk


class SlowEnv(gym.Env):
    """Writes its pid to ``folder/built`` as it starts to build, then takes ``build`` seconds to
    build and ``step`` seconds a step; ``close()`` writes ``folder/closed``."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, folder: str, build: float = 0.0, step: float = 0.0):
        self.folder, self.seconds = folder, step
        with open(os.path.join(folder, "built"), "a") as built:
            built.write(f"{os.getpid()}\n")
        time.sleep(build)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(self.seconds)
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def close(self):
        with open(os.path.join(self.folder, "closed"), "a") as closed:
            closed.write(f"{os.getpid()}\n")
