"""CleanRL-style PPO on MPE2's ``simple_spread_v3``, every agent a slot of shmvec's ``ShmAgentVecEnv``.

One policy acts for each of the 3 agents of each copy (parameter sharing, as PettingZoo's SB3
tutorials train). The loop is CleanRL's ``ppo.py`` over SB3's ``VecEnv`` interface: a slot whose
episode ended returns ``done``, its ``terminal_observation`` and ``TimeLimit.truncated``, so a
truncated episode (every MPE episode ends at ``max_cycles``) bootstraps from the value of its final
observation; ``env.mask`` says which slots hold an agent that acts (rows of an agent that left are
left out of the update).

    python examples/agents/cleanrl_simple_spread.py                   # 500,000 agent steps
    python examples/agents/cleanrl_simple_spread.py --timesteps 4096  # a short run

Prints the mean episode return per agent of the trained policy (greedy) and of a random one, over
the same seeded episodes. Needs ``pip install ".[sb3,agents]"`` in shmvec's checkout (torch comes
with SB3; the README says how to get its CPU build).
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch
from mpe2 import simple_spread_v3
from torch import nn
from torch.distributions import Categorical

from shmvec import ShmAgentVecEnv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timesteps", type=int, default=500_000, help="agent steps in all (slots x vector steps)")
    p.add_argument("--num-copies", type=int, default=16, help="copies of the env (3 agent slots each)")
    p.add_argument("--num-workers", type=int, default=None, help="worker processes (default: shmvec chooses)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--num-steps", type=int, default=64, help="vector steps per rollout")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--eval-episodes", type=int, default=32, help="seeded episodes for the trained and random policies")
    p.add_argument("--save", default="simple_spread_ppo.pt", help="where the policy's weights go ('' : nowhere)")
    return p.parse_args(argv)


ENV_FN = functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=25, continuous_actions=False)


def layer(n_in: int, n_out: int, std: float = np.sqrt(2)) -> nn.Linear:
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


class Agent(nn.Module):
    """Separate 64-64 tanh actor and critic, as CleanRL's ppo.py."""

    def __init__(self, obs_size: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_actions, 0.01))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        dist = Categorical(logits=self.actor(obs))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(obs)


def as_tensor(obs: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(obs, dtype=torch.float32)


def train(args: argparse.Namespace) -> tuple[Agent, list[float]]:
    """PPO for ``args.timesteps`` agent steps; returns the policy and each finished episode's return per agent."""
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    env = ShmAgentVecEnv(ENV_FN, args.num_copies, n_workers=args.num_workers)
    try:
        n, obs_size = env.num_envs, int(np.prod(env.observation_space.shape))
        agent = Agent(obs_size, env.action_space.n)
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
        shape = (args.num_steps, n)
        buf = {
            k: np.zeros((*shape, obs_size), np.float32) if k == "obs" else np.zeros(shape, np.float32)
            for k in ("obs", "actions", "logprobs", "values", "rewards", "next_values", "terminated", "ended", "active")
        }
        env.seed(args.seed)
        obs = env.reset().reshape(n, obs_size)
        returns, running = [], np.zeros(n)
        for _ in range(max(1, args.timesteps // (args.num_steps * n))):
            for t in range(args.num_steps):
                with torch.no_grad():
                    action, logprob, _, value = agent.evaluate(as_tensor(obs))
                active = env.mask.copy()  # slots whose agent acts now
                next_obs, rewards, dones, infos = env.step(action.numpy())
                next_obs = next_obs.reshape(n, obs_size)
                after, truncated = values_from(next_obs, dones, infos)
                with torch.no_grad():
                    next_value = agent.value(as_tensor(after)).numpy()
                for key, row in (
                    ("obs", obs),
                    ("actions", action.numpy()),
                    ("logprobs", logprob.numpy()),
                    ("values", value.numpy()),
                    ("rewards", rewards),
                    ("next_values", next_value),
                    ("terminated", dones & ~truncated),
                    ("ended", dones),
                    ("active", active),
                ):
                    buf[key][t] = row
                running += rewards
                for i in np.flatnonzero(
                    dones & active
                ):  # a slot done again when its copy ends, agent long gone: no episode
                    returns.append(float(running[i]))
                running[dones] = 0.0
                obs = next_obs
            update(agent, optimizer, buf, args)
    finally:
        env.close()
    return agent, returns


def values_from(next_obs: np.ndarray, dones: np.ndarray, infos: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """The observation each slot's value after its action is of (its final one where its episode
    ended), and which ended slots bootstrap from it: the truncated ones that have one, as SB3 does
    (a copy restarted after its worker died has none: its episode died with the worker)."""
    after, truncated = next_obs.copy(), np.zeros(len(dones), bool)
    for i in np.flatnonzero(dones):
        final = infos[i].get("terminal_observation")
        if final is not None:
            after[i] = final.reshape(after.shape[1:])
            truncated[i] = infos[i].get("TimeLimit.truncated", False)
    return after, truncated


def update(agent: Agent, optimizer: torch.optim.Optimizer, buf: dict[str, np.ndarray], args) -> None:
    """GAE along the time axis, then CleanRL's clipped-objective epochs over the active rows."""
    advantages = np.zeros_like(buf["values"])
    last = 0.0
    for t in reversed(range(args.num_steps)):
        delta = buf["rewards"][t] + args.gamma * buf["next_values"][t] * (1 - buf["terminated"][t]) - buf["values"][t]
        last = delta + args.gamma * args.gae_lambda * (1 - buf["ended"][t]) * last
        advantages[t] = last
    keep = buf["active"].reshape(-1).astype(bool)
    data = {
        k: torch.as_tensor(buf[k].reshape(-1, *buf[k].shape[2:])[keep])
        for k in ("obs", "actions", "logprobs", "values")
    }
    data["advantages"] = torch.as_tensor(advantages.reshape(-1)[keep])
    returns = data["advantages"] + data["values"]
    for _ in range(args.update_epochs):
        for idx in torch.randperm(len(returns)).tensor_split(args.num_minibatches):
            _, logprob, entropy, value = agent.evaluate(data["obs"][idx], data["actions"][idx].long())
            ratio = (logprob - data["logprobs"][idx]).exp()
            adv = data["advantages"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            v_loss = 0.5 * ((value - returns[idx]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()


def mean_episode_return(agent: Agent | None, episodes: int, seed: int = 10_000) -> float:
    """Mean return per agent over ``episodes`` seeded episodes: ``agent``'s greedy actions, or random ones (None)."""
    env = ShmAgentVecEnv(ENV_FN, episodes, n_workers=0)  # one episode per copy, all in this process
    try:
        env.seed(seed)
        env.action_space.seed(seed)
        obs, total, done = env.reset(), np.zeros(env.num_envs), np.zeros(env.num_envs, bool)
        while not done.all():  # every copy ends at max_cycles, on the same step
            if agent is None:
                actions = np.array([env.action_space.sample() for _ in range(env.num_envs)])
            else:
                with torch.no_grad():
                    actions = agent.actor(as_tensor(obs.reshape(env.num_envs, -1))).argmax(-1).numpy()
            obs, rewards, dones, _ = env.step(actions)
            total += rewards * ~done
            done |= dones
    finally:
        env.close()
    return float(total.mean())


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    agent, returns = train(args)
    seconds = time.perf_counter() - start
    if args.save:
        torch.save(agent.state_dict(), args.save)
    result = {"agent": agent, "train_returns": returns, "seconds": seconds}
    if args.eval_episodes:
        result["trained"] = mean_episode_return(agent, args.eval_episodes)
        result["random"] = mean_episode_return(None, args.eval_episodes)
        print(
            f"mean episode return per agent: trained {result['trained']:.2f}, random {result['random']:.2f} "
            f"({args.timesteps} agent steps in {seconds:.1f} s)"
        )
    return result


if __name__ == "__main__":
    main()
