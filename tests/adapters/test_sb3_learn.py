"""Short ``learn()`` runs of PPO, A2C, DQN and SAC on ShmPoolVecEnv.

Each algorithm is trained twice with the same seed, once on ShmPoolVecEnv and once on
DummyVecEnv: since the vec envs return identical data, the learned parameters must be
identical too (this fails on any difference in obs, rewards, dones or terminal
observations the algorithm consumed). Afterwards the env must still be usable.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.monitor import Monitor

from tests.sb3_compare import make_pair


def monitored_cartpole():
    return Monitor(gym.make("CartPole-v1"))  # episode infos reach the model's ep_info_buffer


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=100)


NET = {"net_arch": [32, 32]}  # copy it per model: SB3 adds keys to policy_kwargs
CASES = {
    "PPO": (
        PPO,
        monitored_cartpole,
        4,
        2,
        1024,
        {"n_steps": 64, "batch_size": 64, "n_epochs": 2},
    ),
    "DQN": (
        DQN,
        monitored_cartpole,
        2,
        2,
        600,
        {
            "learning_starts": 100,
            "buffer_size": 2000,
            "train_freq": 4,
            "target_update_interval": 100,
        },
    ),
    "A2C": (A2C, pendulum, 4, 2, 400, {"n_steps": 5}),
    "SAC": (
        SAC,
        pendulum,
        2,
        1,
        300,
        {"learning_starts": 100, "batch_size": 32, "buffer_size": 1000},
    ),
}


def _train(algo, venv, total, kwargs):
    torch.set_num_threads(1)  # identical reductions on both runs
    model = algo("MlpPolicy", venv, seed=0, policy_kwargs=dict(NET), device="cpu", **kwargs)
    model.learn(total)
    return model


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero_copy"])
@pytest.mark.parametrize("name", list(CASES))
def test_learn_matches_dummy(name, copy, closing):
    """With ``copy=False`` the algorithms read observations in place (double-buffered rows)."""
    algo, make, n_envs, n_workers, total, kwargs = CASES[name]
    shm, dummy = make_pair([make] * n_envs, n_workers, closing, copy=copy)
    threads = torch.get_num_threads()
    try:
        model = _train(algo, shm, total, kwargs)
        reference = _train(algo, dummy, total, kwargs)
    finally:
        torch.set_num_threads(threads)
    assert model.num_timesteps == reference.num_timesteps >= total
    assert model.num_timesteps < total + n_envs * kwargs.get("n_steps", 1)
    got, want = model.policy.state_dict(), reference.policy.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), f"{name}: parameter {key} differs from the DummyVecEnv run"
    episodes = [(e["r"], e["l"]) for e in model.ep_info_buffer]
    assert episodes == [(e["r"], e["l"]) for e in reference.ep_info_buffer]
    if make is monitored_cartpole:
        assert len(episodes) > 10

    # The env is still fully usable after training.
    obs = shm.reset()
    assert obs.shape == (n_envs, *shm.observation_space.shape)
    actions, _ = model.predict(obs, deterministic=True)
    assert shm.step(actions)[0].shape == obs.shape
    assert shm.env_is_wrapped(gym.wrappers.TimeLimit) == [True] * n_envs
    assert np.isfinite(np.concatenate([p.detach().numpy().ravel() for p in model.policy.parameters()])).all()


class MultiBinaryEnv(gym.Env):
    """MultiBinary(3) actions; SB3's Bernoulli policies hand them to the env as float32 0./1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action  # float 0./1. arrays are contained
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return obs, float(np.dot(obs, action)), False, self.t >= 20, {}


def test_ppo_multibinary_actions(closing):
    shm, _ = make_pair([MultiBinaryEnv] * 2, 2, closing)
    model = PPO(
        "MlpPolicy",
        shm,
        n_steps=16,
        batch_size=32,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(NET),
        device="cpu",
    )
    model.learn(64)
    assert model.num_timesteps == 64
