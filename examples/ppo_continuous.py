"""PPO with continuous actions on MuJoCo: CleanRL's ppo_continuous_action.py over shmvec or SyncVectorEnv.

``python examples/ppo_continuous.py --num-envs 8`` trains on HalfCheetah-v5 over shmvec's
ShmVectorEnv (its default options); ``--vec sync`` runs the same loop over Gymnasium's
SyncVectorEnv. CleanRL's defaults: 1 env, 2048 steps per rollout, 10 epochs of 32
minibatches, learning rate 3e-4 annealed, no entropy bonus, 1M steps. Each env is wrapped
as CleanRL's ``make_env`` wraps it (observations and rewards normalized by running
statistics of that env alone, so the wrappers run in the workers); the policy is a Gaussian
with a state-independent log std. Prints the mean episodic return (RecordEpisodeStatistics',
before the rewards are normalized) as it learns and, at the end, a line
``TIMING rollout=...s update=...s total=...s`` (``--json``: one JSON line with those
seconds, the steps and the vector env's ``repr``).

Gymnasium 1.x resets an env in the step after the one that ended its episode (NEXT_STEP):
that step's transition is not trained on, as in ppo_sync.py. As CleanRL does, an episode
cut by the time limit (every one of HalfCheetah's) counts as done: no bootstrap.
"""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import torch
from ppo_common import (
    TRAINED,
    Episodes,
    PhaseTimer,
    anneal,
    finish,
    gae,
    layer,
    make_vector_env,
    parse_args,
    ppo_update,
    seed_everything,
)
from torch import nn
from torch.distributions import Normal

CLEANRL_DEFAULTS = {
    "env_id": "HalfCheetah-v5",
    "total_timesteps": 1_000_000,
    "num_envs": 1,
    "num_steps": 2048,
    "learning_rate": 3e-4,
    "num_minibatches": 32,
    "update_epochs": 10,
    "ent_coef": 0.0,
}


def make_env(env_id: str, gamma: float):
    """One env as CleanRL's ``make_env`` builds it (Gymnasium 1.x spells TransformObservation's space)."""

    def thunk() -> gym.Env:
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)  # dm_control's dict observations
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


class GaussianAgent(nn.Module):
    """CleanRL's continuous agent: 64-64 tanh critic and actor mean, a learned log std shared by all states.

    ``evaluate`` and ``act`` as ppo_common's ``Agent``, so ``ppo_update`` trains it unchanged."""

    def __init__(self, obs_size: int, action_size: int):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor_mean = nn.Sequential(
            layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, action_size, 0.01)
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_size))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        mean = self.actor_mean(obs)
        dist = Normal(mean, self.actor_logstd.expand_as(mean).exp(), validate_args=False)  # checks change nothing
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(1), dist.entropy().sum(1), self.value(obs)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions, their log-probabilities and the values of a batch of (float32) observations."""
        action, logprob, _, value = self.evaluate(torch.as_tensor(obs))
        return action.numpy(), logprob.numpy(), value.numpy()


def finished_returns(infos: dict) -> np.ndarray:
    """The returns of the episodes that ended in this step (RecordEpisodeStatistics' info, per env)."""
    if "episode" not in infos:
        return np.empty(0)
    return np.asarray(infos["episode"]["r"])[infos["_episode"]]


def main() -> None:
    args = parse_args(async_batches=False, defaults=CLEANRL_DEFAULTS, vecs=("shm", "sync"))
    random.seed(args.seed)
    seed_everything(args.seed)
    envs = make_vector_env(args, [make_env(args.env_id, args.gamma) for _ in range(args.num_envs)])
    assert isinstance(envs.single_action_space, gym.spaces.Box), "only continuous action spaces are supported"
    agent = GaussianAgent(
        int(np.prod(envs.single_observation_space.shape)), int(np.prod(envs.single_action_space.shape))
    )
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    T = args.num_steps
    episodes, timer = Episodes(args.num_envs), PhaseTimer()

    obs, _ = envs.reset(seed=args.seed)
    obs = obs.astype(np.float32)  # the normalized observations are float64; CleanRL's torch.Tensor(obs) is float32
    was_final = np.zeros(args.num_envs, dtype=bool)  # obs[i] ended an episode: its action only resets env i
    for iteration in range(args.num_iterations):
        anneal(optimizer, iteration, args)
        store = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "ended", "valid")}
        with timer.phase("rollout"):
            for _ in range(T):
                actions, logprobs, values = agent.act(obs)
                next_obs, rewards, terminations, truncations, infos = envs.step(actions)
                ended = terminations | truncations
                for key, value in zip(store, (obs, actions, logprobs, values, rewards, ended, ~was_final)):
                    store[key].append(value)
                episodes.record(finished_returns(infos))
                obs, was_final = next_obs.astype(np.float32), ended
        with timer.phase("update"):
            data = {k: np.stack(v) for k, v in store.items()}  # (T, N, ...)
            next_values = np.concatenate([data["values"][1:], agent.act(obs)[2][None]])
            rewards, ended = data["rewards"].astype(np.float32), data["ended"].astype(np.float32)
            # CleanRL's done = terminated or truncated, in both places
            data["advantages"] = gae(rewards, data["values"], next_values, ended, ended, args.gamma, args.gae_lambda)
            valid = data.pop("valid")
            ppo_update(agent, optimizer, {k: data[k][valid] for k in TRAINED}, args)
        if iteration % 10 == 9 or iteration == args.num_iterations - 1:
            episodes.report((iteration + 1) * args.rollout_size)
    finish(timer, args, envs)


if __name__ == "__main__":
    main()
