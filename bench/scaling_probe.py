"""The machine's ceiling: how well plain processes scale, with no vector env and no sync.

Each process builds ``n`` envs and steps them in a loop; the probe reports the total
env steps per second with 1 and with ``procs`` processes, alternating. No vector env
can beat this ratio, so it is the yardstick for every "x over a single process" target.

    python bench/scaling_probe.py CartPole-v1 --n 32 --procs 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import gymnasium as gym


def _step_loop(env_id: str, n: int, seconds: float, results: mp.Queue) -> None:
    envs = [gym.make(env_id) for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        env.action_space.seed(i)
    actions = [[env.action_space.sample() for env in envs] for _ in range(64)]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for env, action in zip(envs, actions[steps % 64]):
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        steps += 1
    results.put(steps * n / (time.perf_counter() - start))


def total_rate(env_id: str, n: int, procs: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    workers = [ctx.Process(target=_step_loop, args=(env_id, n, seconds, results)) for _ in range(procs)]
    for w in workers:
        w.start()
    total = sum(results.get() for _ in workers)
    for w in workers:
        w.join()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env_id", nargs="?", default="CartPole-v1")
    parser.add_argument("--n", type=int, default=32, help="envs per process")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    single, multi = [], []
    for _ in range(args.rounds):
        single.append(total_rate(args.env_id, args.n, 1, args.seconds))
        multi.append(total_rate(args.env_id, args.n, args.procs, args.seconds))
    s, m = statistics.median(single), statistics.median(multi)
    print(f"{args.env_id}: 1 process {s:,.0f} steps/s, {args.procs} processes {m:,.0f} steps/s: {m / s:.2f}x")


if __name__ == "__main__":
    main()
