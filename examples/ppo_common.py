"""What ppo_sync.py and ppo_async.py share: arguments, the vector env, the network, GAE along
one time axis, the PPO update, episode returns and the phase timer. CleanRL's ppo.py, condensed.
ppo_continuous.py takes all of it but the network and the env maker.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from shmvec import ShmVectorEnv

TRAINED = ("obs", "actions", "logprobs", "values", "advantages")  # what the update needs of each transition
VEC_HELP = {
    "shm": "shm: shmvec's ShmVectorEnv",
    "sync": "sync: Gymnasium's SyncVectorEnv (the reference)",
    "envpool": "envpool: EnvPool's own env (needs envpool)",
}


def parse_args(
    async_batches: bool, defaults: dict | None = None, vecs: tuple[str, ...] = ("shm", "sync", "envpool")
) -> argparse.Namespace:
    """The scripts' command line; ``defaults`` replaces some defaults, ``vecs`` are the ``--vec`` choices."""
    p = argparse.ArgumentParser()
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--total-timesteps", type=int, default=50_000)
    p.add_argument("--num-envs", type=int, default=16)
    if async_batches:
        p.add_argument("--batch-size", type=int, default=8, help="envs per recv() (num_envs // batch_size batches)")
    else:
        p.add_argument(
            "--vec",
            choices=vecs,
            default="shm",
            help="; ".join(VEC_HELP[vec] for vec in vecs),
        )
    p.add_argument("--n-workers", type=int, default=None, help="ShmVectorEnv's n_workers (default: its own choice)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--num-steps", type=int, default=32, help="steps per env per rollout")
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--json", action="store_true", help="print the timing as one JSON line instead of the TIMING line")
    p.set_defaults(**(defaults or {}))
    args = p.parse_args()
    args.rollout_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // args.rollout_size
    return args


def seed_everything(seed: int) -> None:
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_env_fns(args: argparse.Namespace) -> list:
    return [lambda: gym.make(args.env_id)] * args.num_envs


def make_vector_env(args: argparse.Namespace, env_fns: list | None = None, **options) -> gym.vector.VectorEnv:
    """``args.vec``'s vector env over ``env_fns`` (default ``args.num_envs`` plain ``gym.make``),
    autoreset NEXT_STEP (every one's default).

    ``options`` (e.g. ``batch_size``) go to ShmVectorEnv; the others take none.
    """
    vec = getattr(args, "vec", "shm")
    env_fns = make_env_fns(args) if env_fns is None else env_fns
    if vec == "sync":
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    if vec == "envpool":
        import envpool  # optional

        return envpool.make_gymnasium(args.env_id, num_envs=args.num_envs, seed=args.seed)
    return ShmVectorEnv(env_fns, n_workers=args.n_workers, **options)


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
        dist = Categorical(logits=self.actor(obs), validate_args=False)  # checks cost ~25 % of a small batch's call
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.value(obs)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions, their log-probabilities and the values of a batch of observations."""
        action, logprob, _, value = self.evaluate(torch.as_tensor(obs))
        return action.numpy(), logprob.numpy(), value.numpy()


def gae(rewards, values, next_values, terminated, ended, gamma: float, lam: float) -> np.ndarray:
    """Advantages along axis 0 (time); ``rewards[t]``, ``terminated[t]``, ``ended[t]`` are the outcome
    of the action at ``t``. A truncated episode bootstraps from the value of its final observation."""
    advantages = np.zeros_like(values)
    last = 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_values[t] * (1.0 - terminated[t]) - values[t]
        last = delta + gamma * lam * (1.0 - ended[t]) * last
        advantages[t] = last
    return advantages


def ppo_update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, np.ndarray], args) -> None:
    """CleanRL's clipped-objective update over minibatches of ``batch`` (flat arrays, one row per transition)."""
    data = {k: torch.as_tensor(v) for k, v in batch.items()}
    returns = data["advantages"] + data["values"]
    n = len(data["obs"])
    for _ in range(args.update_epochs):
        for idx in torch.randperm(n).tensor_split(args.num_minibatches):  # near-equal sizes: n varies a little
            _, logprob, entropy, value = agent.evaluate(data["obs"][idx], data["actions"][idx])
            ratio = (logprob - data["logprobs"][idx]).exp()
            adv = data["advantages"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
            old_value = data["values"][idx]
            clipped = old_value + (value - old_value).clamp(-args.clip_coef, args.clip_coef)
            v_loss = 0.5 * torch.max((value - returns[idx]) ** 2, (clipped - returns[idx]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()


def anneal(optimizer: torch.optim.Optimizer, iteration: int, args) -> None:
    for group in optimizer.param_groups:
        group["lr"] = (1.0 - iteration / args.num_iterations) * args.learning_rate


class Episodes:
    """Episodic returns summed per env from the rewards (works for step() and recv() alike)."""

    def __init__(self, num_envs: int):
        self.running = np.zeros(num_envs)
        self.recent: deque[float] = deque(maxlen=20)

    def add(self, env_ids: np.ndarray, rewards: np.ndarray, ended: np.ndarray) -> None:
        self.running[env_ids] += rewards
        for i in env_ids[ended]:
            self.recent.append(self.running[i])
            self.running[i] = 0.0

    def record(self, returns) -> None:
        """Returns summed elsewhere (RecordEpisodeStatistics' ``info["episode"]["r"]``: the env's own rewards
        where wrappers above it normalize them)."""
        self.recent.extend(float(r) for r in returns)

    def report(self, global_step: int) -> None:
        if self.recent:
            print(
                f"global_step={global_step} episodic_return={np.mean(self.recent):.1f} "
                f"(last {len(self.recent)} episodes)"
            )


class PhaseTimer:
    """Seconds spent collecting (rollout) and learning (update); ``TIMING`` line at the end."""

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds = {"rollout": 0.0, "update": 0.0}

    def phase(self, name: str):
        timer = self

        class _Phase:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.seconds[name] += time.perf_counter() - self.t0

        return _Phase()

    def line(self) -> str:
        total = time.perf_counter() - self.start
        return f"TIMING rollout={self.seconds['rollout']:.3f}s update={self.seconds['update']:.3f}s total={total:.3f}s"

    def json_line(self, steps: int, vec_env: str) -> str:
        """The timing as one JSON line, with the env steps taken and the vector env's ``repr``."""
        total = time.perf_counter() - self.start
        return json.dumps(
            {
                **self.seconds,
                "total": total,
                "steps": steps,
                "vec_env": vec_env,
                "torch_threads": torch.get_num_threads(),
            }
        )


def finish(timer: PhaseTimer, args: argparse.Namespace, envs: gym.vector.VectorEnv) -> None:
    """Close ``envs`` and print the timing: the TIMING line, or with ``--json`` one JSON line."""
    described = repr(envs)  # before close: the configuration that ran the steps
    timings = getattr(envs, "timings", None)  # shmvec's: where the run's time went
    if timings is not None and not args.json:
        print(timings)
    envs.close()
    print(timer.json_line(args.num_iterations * args.rollout_size, described) if args.json else timer.line())
