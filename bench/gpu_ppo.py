"""Part (c) of ``bench/gpu_handoff.py``: a CleanRL-style PPO Atari loop with its policy on the GPU.

The same loop with each way of getting a step's results onto the device: numpy results moved
by CleanRL's ``torch.Tensor(obs).to(device)`` (uint8 frames cast to float32 on the CPU, four
times the bytes over the bus), by ``torch.as_tensor(obs).to(device)`` (uint8 kept, as a user
would write it), and, on CUDA, by ``torch.as_tensor(obs).pin_memory().to(device, non_blocking=True)``
(page-locked first, so the copy is one DMA); actions back with ``.cpu().numpy()``; and
``ShmVectorEnv(device=...)`` (uint8 frames arrive on the device, actions go back as tensors).
Each synchronous (``step``) and with async batches (``send``/``recv``, two batches). The envs
are ALE Breakout as CleanRL preprocesses it (84×84 grayscale, frame skip 4, 4 frames stacked)
where ``ale_py`` and ``cv2`` are installed, else a synthetic env of the same observations and
a similar step cost.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from bench.synthetic import SyntheticEnv
from shmvec import ShmVectorEnv

SYNTHETIC_STEP = 400e-6  # seconds: about ALE Breakout's step with frame skip 4 on a current x86 core


def atari_available() -> bool:
    try:
        import ale_py  # noqa: F401
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def make_breakout() -> gym.Env:
    """Breakout as CleanRL's ppo_atari.py sees it: (4, 84, 84) uint8, frame skip 4."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    return gym.wrappers.FrameStackObservation(env, 4)


def env_fns(n: int, synthetic: bool, step_cost: float = SYNTHETIC_STEP) -> tuple[list, str]:
    if synthetic or not atari_available():
        fn = functools.partial(SyntheticEnv, step_cost=step_cost, obs_shape=(4, 84, 84), dtype="uint8")
        return [fn] * n, f"synthetic 4x84x84 uint8, {step_cost * 1e6:.0f} us/step"
    return [make_breakout] * n, "ALE/Breakout-v5, CleanRL's preprocessing (4x84x84 uint8)"


class Agent(nn.Module):
    """CleanRL's Nature CNN actor-critic."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
        )
        self.actor, self.critic = nn.Linear(512, n_actions), nn.Linear(512, 1)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        hidden = self.network(x / 255.0)  # uint8 frames are divided on the device
        dist = Categorical(logits=self.actor(hidden))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden).flatten()


@dataclass(frozen=True)
class NumpyHandOff:
    """How a script moves one step's numpy results to the device: observations, rewards, done flags (as floats)."""

    obs: Callable[[np.ndarray], torch.Tensor]
    reward: Callable[[np.ndarray], torch.Tensor]
    done: Callable[[np.ndarray], torch.Tensor]


HAND_OFF_LABELS = {
    "float32": "numpy + torch.Tensor(obs).to() (CleanRL: float32 on the CPU)",
    "uint8": "numpy + torch.as_tensor(obs).to()",
    "pinned": "numpy + as_tensor(obs).pin_memory().to(non_blocking=True)",
}


def numpy_hand_off(how: str, device: torch.device) -> NumpyHandOff:
    """The lines a script writes for ``how``: "float32" (CleanRL's), "uint8" or "pinned" (CUDA only)."""
    if how == "float32":  # CleanRL's lines, as ppo_atari.py has them
        return NumpyHandOff(
            obs=lambda x: torch.Tensor(x).to(device),
            reward=lambda x: torch.tensor(x).to(device),
            done=lambda x: torch.Tensor(x).to(device),
        )
    if how not in HAND_OFF_LABELS:
        raise ValueError(f"unknown hand-off {how!r}: one of {sorted(HAND_OFF_LABELS)}")
    if how == "pinned" and device.type != "cuda":
        raise ValueError(f"pinned host memory needs a CUDA device, not {device}")

    def move(x: np.ndarray) -> torch.Tensor:  # dtype kept: uint8 frames stay uint8, the policy divides on the device
        if how == "pinned":  # page-locked first: one DMA, issued without waiting for it
            return torch.as_tensor(x).pin_memory().to(device, non_blocking=True)
        return torch.as_tensor(x).to(device)

    return NumpyHandOff(obs=move, reward=move, done=lambda x: move(x).float())


def hand_offs(device: torch.device) -> list[str]:
    """Every way compared on ``device``: the numpy baselines (pinned only on CUDA), then ``device=``."""
    return ["float32", "uint8"] + (["pinned"] if device.type == "cuda" else []) + ["device"]


@dataclass
class Loop:
    """One vector env and its PPO loop: ``how`` is a numpy baseline (see ``numpy_hand_off``) or "device"."""

    how: str
    batch_size: int | None
    envs: ShmVectorEnv
    device: torch.device
    num_steps: int
    state: Any = None  # what the last rollout left: the next observations (and flags), kept across runs

    @property
    def moves(self) -> NumpyHandOff | None:
        return None if self.how == "device" else numpy_hand_off(self.how, self.device)

    @property
    def name(self) -> str:
        hand_off = f'device="{self.device.type}"' if self.how == "device" else HAND_OFF_LABELS[self.how]
        return f"{hand_off}, {'async batches of ' + str(self.batch_size) if self.batch_size else 'sync'}"


def make_loops(n_envs: int, device: torch.device, synthetic: bool, num_steps: int) -> tuple[list[Loop], str]:
    fns, what = env_fns(n_envs, synthetic)
    loops = []
    for batch_size in (None, n_envs // 2):
        for how in hand_offs(device):
            envs = ShmVectorEnv(fns, batch_size=batch_size, device=device if how == "device" else None)
            loops.append(Loop(how, batch_size, envs, device, num_steps))
    return loops, what


def run_iterations(loop: Loop, agent: Agent, optimizer, iterations: int, seed: int) -> tuple[float, float]:
    """``iterations`` of rollout + update; (env steps per second over the whole loop, over the rollouts)."""
    collect = _sync_rollout if loop.batch_size is None else _async_rollout
    steps, rollout_seconds = 0, 0.0
    start = time.perf_counter()
    for _ in range(iterations):
        t0 = time.perf_counter()
        batch, loop.state, n = collect(loop, agent, loop.state, seed)
        _synchronize(loop.device)
        rollout_seconds += time.perf_counter() - t0
        ppo_update(agent, optimizer, batch)
        steps += n
    _synchronize(loop.device)
    return steps / (time.perf_counter() - start), steps / rollout_seconds


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sync_rollout(loop: Loop, agent: Agent, state, seed: int):
    """CleanRL's rollout: ``num_steps`` steps of every env into device buffers, then GAE."""
    envs, device, T, N = loop.envs, loop.device, loop.num_steps, loop.envs.num_envs
    moves = loop.moves
    if state is None:
        obs, _ = envs.reset(seed=seed)
        state = (moves.obs(obs) if moves else obs, torch.zeros(N, device=device))
    next_obs, next_done = state
    obs_buf = torch.zeros((T, *next_obs.shape), dtype=next_obs.dtype, device=device)
    actions, logprobs, rewards, dones, values = (torch.zeros((T, N), device=device) for _ in range(5))
    for step in range(T):
        obs_buf[step], dones[step] = next_obs, next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(next_obs)
        actions[step], logprobs[step], values[step] = action, logprob, value
        if moves:  # CleanRL's lines, with the baseline's way of moving results
            next_obs, reward, terminations, truncations, _ = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = moves.reward(reward).view(-1)
            next_obs, next_done = moves.obs(next_obs), moves.done(next_done)
        else:  # everything arrives on the device
            next_obs, reward, terminations, truncations, _ = envs.step(action)
            next_done = (terminations | truncations).float()
            rewards[step] = reward
    with torch.no_grad():
        next_value = agent.get_action_and_value(next_obs)[3]
    advantages = torch.zeros_like(rewards)
    last = 0
    for t in reversed(range(T)):
        not_done = 1.0 - (next_done if t == T - 1 else dones[t + 1])
        following = next_value if t == T - 1 else values[t + 1]
        delta = rewards[t] + 0.99 * following * not_done - values[t]
        advantages[t] = last = delta + 0.99 * 0.95 * not_done * last
    batch = {
        "obs": obs_buf.reshape(-1, *obs_buf.shape[2:]),
        "actions": actions.reshape(-1),
        "logprobs": logprobs.reshape(-1),
        "advantages": advantages.reshape(-1),
        "returns": (advantages + values).reshape(-1),
    }
    return batch, (next_obs, next_done), T * N


def _async_rollout(loop: Loop, agent: Agent, state, seed: int):
    """``num_steps`` steps per env in batches (as examples/ppo_async.py): rows stored with their env id."""
    envs, device = loop.envs, loop.device
    moves = loop.moves
    if state is None:
        envs.async_reset(seed=seed)
        state = envs.recv()
    obs, reward, terminations, truncations, infos = state
    rows: dict[str, list] = {key: [] for key in ("env_id", "obs", "actions", "logprobs", "values", "rewards", "dones")}
    for _ in range(loop.num_steps * envs.num_envs // loop.batch_size):
        if moves:
            obs, reward = moves.obs(obs), moves.reward(reward)
            done = moves.done(np.logical_or(terminations, truncations))
        else:
            done = (terminations | truncations).float()
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(obs)
        envs.send(action.cpu().numpy() if moves else action)  # the workers step these while the policy runs on the next
        for key, item in zip(rows, (infos["env_id"], obs, action, logprob, value, reward, done)):
            rows[key].append(item)
        obs, reward, terminations, truncations, infos = envs.recv()
    state = (obs, reward, terminations, truncations, infos)
    env_ids = np.concatenate(rows.pop("env_id"))
    stored = {key: torch.cat(values) for key, values in rows.items()}
    advantages = torch.as_tensor(_per_env_gae(env_ids, stored), device=device)
    batch = {
        "obs": stored["obs"],
        "actions": stored["actions"].float(),
        "logprobs": stored["logprobs"],
        "advantages": advantages,
        "returns": advantages + stored["values"],
    }
    return batch, state, len(env_ids)


def _per_env_gae(env_ids: np.ndarray, stored: dict) -> np.ndarray:
    """GAE along each env's own rows (a row's reward and done are the outcome of that env's previous action)."""
    values = stored["values"].float().cpu().numpy()
    rewards, dones = stored["rewards"].float().cpu().numpy(), stored["dones"].float().cpu().numpy()
    advantages = np.zeros_like(values)
    for i in np.unique(env_ids):
        idx = np.flatnonzero(env_ids == i)
        last = 0.0
        for now, nxt in zip(idx[-2::-1], idx[:0:-1]):
            not_done = 1.0 - dones[nxt]
            delta = rewards[nxt] + 0.99 * values[nxt] * not_done - values[now]
            advantages[now] = last = delta + 0.99 * 0.95 * not_done * last
    return advantages


def ppo_update(agent: Agent, optimizer, batch: dict, epochs: int = 4, minibatches: int = 4) -> None:
    """CleanRL's clipped PPO update (4 epochs, 4 minibatches)."""
    n = len(batch["actions"])
    for _ in range(epochs):
        for idx in torch.randperm(n, device=batch["actions"].device).chunk(minibatches):
            _, logprob, entropy, value = agent.get_action_and_value(batch["obs"][idx], batch["actions"][idx].long())
            ratio = (logprob - batch["logprobs"][idx]).exp()
            adv = batch["advantages"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
            value_loss = 0.5 * ((value - batch["returns"][idx]) ** 2).mean()
            loss = policy_loss - 0.01 * entropy.mean() + 0.5 * value_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
