"""``python -m shmvec.demo``: step CartPole with shmvec next to SB3's DummyVecEnv and SubprocVecEnv.

Every implementation steps the same envs with the same pre-drawn actions; they take turns
(round-robin) so that load from other processes hits all of them alike, and the table
quotes each one's median throughput in env steps per second.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


def measure(env, actions: np.ndarray, seconds: float, policy: Callable[[Any], Any] | None = None) -> float:
    """Env steps per second of ``env`` over about ``seconds`` of stepping, with ``policy``
    (:mod:`shmvec.stand_in`) called on the observations between steps."""
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

    from shmvec import ShmPoolVecEnv

    if name == "DummyVecEnv":
        return DummyVecEnv(env_fns)
    if name == "SubprocVecEnv":
        return SubprocVecEnv(env_fns, start_method="fork")
    if name == DEFAULT:
        return ShmPoolVecEnv(env_fns, start_method="fork")  # n_workers=None: chosen at start-up
    return ShmPoolVecEnv(env_fns, n_workers=n_workers, start_method="fork")


DEFAULT = "ShmPoolVecEnv (default)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id (default CartPole-v1)")
    parser.add_argument("--num-envs", type=int, default=64, help="envs per vector env (default 64)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes of the explicit configuration (default: cores)")
    parser.add_argument("--seconds", type=float, default=1.5, help="stepping time per round (default 1.5)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    args = parser.parse_args(argv)

    env_fns = [lambda: gym.make(args.env) for _ in range(args.num_envs)]
    names = ["DummyVecEnv", "SubprocVecEnv", DEFAULT, f"ShmPoolVecEnv ({args.workers} workers)"]
    print(f"{args.env}, {args.num_envs} envs, {os.cpu_count()} cores: {args.rounds} rounds of {args.seconds}s each")

    envs = {}
    try:
        for name in names:
            envs[name] = build(name, env_fns, args.workers)
            envs[name].seed(0)
            envs[name].reset()
        print(f"the default chose: {envs[DEFAULT]!r}")
        space = envs[names[0]].action_space
        space.seed(0)
        actions = np.stack([np.stack([space.sample() for _ in range(args.num_envs)]) for _ in range(256)])
        for env in envs.values():  # warm-up
            measure(env, actions, 0.2)
        rates: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name, env in envs.items():
                rates[name].append(measure(env, actions, args.seconds))
    finally:
        for env in envs.values():
            env.close()

    baseline = statistics.median(rates["DummyVecEnv"])
    width = max(map(len, names))
    print(f"\n{'implementation':<{width}}  {'steps/s (median)':>16}  {'vs DummyVecEnv':>14}")
    for name in names:
        rate = statistics.median(rates[name])
        print(f"{name:<{width}}  {rate:>16,.0f}  {rate / baseline:>13.2f}x")


if __name__ == "__main__":
    main()
