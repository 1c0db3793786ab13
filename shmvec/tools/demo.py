"""``python -m shmvec.demo``: train and step with shmvec next to SB3's DummyVecEnv and SubprocVecEnv.

First a short training run, what users came for: SB3's PPO (its defaults, torch's threads
as they are) on the same envs over DummyVecEnv and over the default ``ShmPoolVecEnv``,
taking turns, with the median wall time of collecting (rollout), learning (update) and
both. Then two stepping tables: envs that wait for a simulator (each step blocks in a
syscall and uses almost no CPU), and light CPU-bound envs. Every implementation steps
the same envs with the same pre-drawn actions, round-robin so that load from other
processes hits all of them alike, and each table quotes the median throughput in env
steps per second.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


def measure(env, actions: np.ndarray, seconds: float, policy: Callable[[Any], Any] | None = None) -> float:
    """Env steps per second of ``env`` over about ``seconds`` of stepping, with ``policy``
    (:mod:`shmvec.tools.stand_in`) called on the observations between steps."""
    steps, start = 0, time.perf_counter()
    while True:
        obs = env.step(actions[steps % len(actions)])[0]
        if policy is not None:
            policy(obs)
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps * env.num_envs / elapsed


def build(name: str, env_fns: list[Callable[[], gym.Env]], n_workers: int):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec.adapters.sb3 import ShmPoolVecEnv

    if name == "DummyVecEnv":
        return DummyVecEnv(env_fns)
    if name == "SubprocVecEnv":
        return SubprocVecEnv(env_fns, start_method="fork")
    if name == DEFAULT:
        return ShmPoolVecEnv(env_fns)  # n_workers=None: chosen at start-up
    return ShmPoolVecEnv(env_fns, n_workers=n_workers, start_method="fork")


DEFAULT = "ShmPoolVecEnv (default)"


def time_phases(model) -> dict[str, float]:
    """Time ``model``'s rollouts (``collect_rollouts``) and updates (``train``) from now on
    (an SB3 algorithm; this instance only): the returned dict's ``"rollout"`` and
    ``"update"`` add up their seconds."""
    seconds = {"rollout": 0.0, "update": 0.0}
    for phase, method in (("rollout", "collect_rollouts"), ("update", "train")):
        inner = getattr(model, method)

        def timed(*args, _inner=inner, _phase=phase, **kwargs):
            start = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                seconds[_phase] += time.perf_counter() - start

        setattr(model, method, timed)  # an instance attribute: this model only
    return seconds


def timed_learn(model, total_timesteps: int) -> dict[str, float]:
    """Run ``model.learn(total_timesteps)`` (an SB3 algorithm); seconds spent in rollout
    (``collect_rollouts``), update (``train``) and in all."""
    seconds = time_phases(model)
    start = time.perf_counter()
    model.learn(total_timesteps)
    seconds["total"] = time.perf_counter() - start
    return seconds


def train_side_by_side(env_id: str, num_envs: int, timesteps: int, rounds: int) -> None:
    """PPO over DummyVecEnv and over the default ShmPoolVecEnv, taking turns; prints the medians."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from shmvec.adapters.sb3 import ShmPoolVecEnv

    env_fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
    builds = {"DummyVecEnv": lambda: DummyVecEnv(env_fns), DEFAULT: lambda: ShmPoolVecEnv(env_fns)}
    print(f"Training: PPO (SB3 defaults, n_steps=256) on {env_id} x{num_envs}, {timesteps} steps, {rounds} rounds each")
    times: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    timings = None  # where the default's last run spent its time (envs.timings)
    for r in range(rounds):
        for name in list(builds)[r % 2 :] + list(builds)[: r % 2]:
            env = builds[name]()
            try:
                if r == 0 and name == DEFAULT:
                    print(f"the default chose: {env!r}")
                times[name].append(timed_learn(PPO("MlpPolicy", env, n_steps=256, seed=r), timesteps))
                if name == DEFAULT:
                    timings = env.timings
            finally:
                env.close()
    med = {
        name: {k: statistics.median(t[k] for t in runs) for k in ("rollout", "update", "total")}
        for name, runs in times.items()
    }
    width = max(map(len, builds))
    print(
        f"\n{'wall time (median)':<{width}}  {'rollout':>8}  {'update':>8}  {'total':>8}  {'total vs DummyVecEnv':>20}"
    )
    for name, m in med.items():
        ratio = med["DummyVecEnv"]["total"] / m["total"]
        print(f"{name:<{width}}  {m['rollout']:>7.2f}s  {m['update']:>7.2f}s  {m['total']:>7.2f}s  {ratio:>19.2f}x")
    if timings is not None:
        print(f"\nWhere the default's last run spent its time (print(env.timings)):\n{timings}")
    print()


def step_side_by_side(
    names: list[str], env_fns: list[Callable[[], gym.Env]], n_workers: int, rounds: int, seconds: float
) -> dict[str, float]:
    """Median env steps per second of each implementation in ``names``, stepped in turns."""
    envs = {}
    try:
        for name in names:
            envs[name] = build(name, env_fns, n_workers)
            envs[name].seed(0)
            envs[name].reset()
        print(f"the default chose: {envs[DEFAULT]!r}")
        space = envs[names[0]].action_space
        space.seed(0)
        actions = np.stack([np.stack([space.sample() for _ in range(len(env_fns))]) for _ in range(256)])
        for env in envs.values():  # warm-up
            measure(env, actions, min(0.2, seconds))
        rates: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(rounds):
            for name, env in envs.items():
                rates[name].append(measure(env, actions, seconds))
    finally:
        for env in envs.values():
            env.close()
    return {name: statistics.median(rates[name]) for name in names}


def print_rates(rates: dict[str, float], limit: float | None = None) -> None:
    """A table of ``rates`` against DummyVecEnv's (and against ``limit``, the most any could reach)."""
    width = max(map(len, rates))
    extra = f"  {'of the limit':>12}" if limit else ""
    print(f"\n{'implementation':<{width}}  {'steps/s (median)':>16}  {'vs DummyVecEnv':>14}{extra}")
    for name, rate in rates.items():
        share = f"  {rate / limit:>12.2f}" if limit else ""
        print(f"{name:<{width}}  {rate:>16,.0f}  {rate / rates['DummyVecEnv']:>13.2f}x{share}")
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id (default CartPole-v1)")
    parser.add_argument("--num-envs", type=int, default=64, help="envs per vector env (default 64)")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes of the explicit configuration (default: cores)",
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="stepping time per round (default 1.0)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    parser.add_argument("--train-env", default="Acrobot-v1", help="env of the training run (default Acrobot-v1)")
    parser.add_argument("--train-envs", type=int, default=8, help="envs of the training run (default 8)")
    parser.add_argument(
        "--train-steps", type=int, default=4096, help="timesteps of each training run (0: none; default 4096)"
    )
    parser.add_argument(
        "--train-rounds", type=int, default=3, help="training runs of each; the median is reported (default 3)"
    )
    parser.add_argument("--wait-envs", type=int, default=32, help="envs that wait (0: none; default 32)")
    parser.add_argument("--wait-ms", type=float, default=2.0, help="how long each of their steps waits (default 2)")
    args = parser.parse_args(argv)
    if args.train_steps > 0:
        train_side_by_side(args.train_env, args.train_envs, args.train_steps, args.train_rounds)
    if args.wait_envs > 0:
        from shmvec.tools.waiting_env import WaitingEnv

        wait = args.wait_ms / 1e3
        limit = args.wait_envs / wait
        print(
            f"Envs that wait for a simulator: {args.wait_envs} envs whose step blocks {args.wait_ms:g} ms in a "
            f"syscall (almost no CPU), {os.cpu_count()} cores; the limit, every env waiting at once, is "
            f"{limit:,.0f} steps/s"
        )
        env_fns = [functools.partial(WaitingEnv, wait)] * args.wait_envs
        rates = step_side_by_side(["DummyVecEnv", "SubprocVecEnv", DEFAULT], env_fns, 0, 3, min(args.seconds, 0.5))
        print_rates(rates, limit)

    env_fns = [lambda: gym.make(args.env) for _ in range(args.num_envs)]
    names = ["DummyVecEnv", "SubprocVecEnv", DEFAULT, f"ShmPoolVecEnv ({args.workers} workers)"]
    print(f"{args.env}, {args.num_envs} envs, {os.cpu_count()} cores: {args.rounds} rounds of {args.seconds}s each")
    print_rates(step_side_by_side(names, env_fns, args.workers, args.rounds, args.seconds))


if __name__ == "__main__":
    main()
