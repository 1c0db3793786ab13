"""The default configuration's stability check: fresh pools of one configuration, one after another.

Usage (from the repository root)::

    python bench/probes/stability.py                          # default ShmPoolVecEnv, CartPole-v1 N=64, 5 pools
    python bench/probes/stability.py --n-workers 2 --pools 8  # an explicit configuration

Each pool is built, reset, warmed up and stepped for ``--seconds``; the script prints
each pool's throughput, the median, and the slowest pool's ratio to the median (the
target: at least 0.85). A SyncVectorEnv(SAME_STEP) sample is taken before every pool so
that machine load shows up beside the pool's figure. Its pools are built in one process;
``bench/stability.py`` builds each default pool in a fresh one and prints what its timing
measured and the layout it chose.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402


def steps_per_second(step, actions: np.ndarray, seconds: float) -> float:
    """env.step() calls per second of ``step`` over about ``seconds``."""
    n, count, start = actions.shape[1], 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(20):
            step(actions[count % len(actions)])
            count += 1
    return count * n / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--n-workers", type=int, default=None, help="default: None (the automatic choice)")
    p.add_argument("--main-shard", action="store_true")
    p.add_argument("--pools", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.5)
    args = p.parse_args(argv)
    from shmvec import ShmPoolVecEnv

    env_fns = [lambda: gym.make(args.env)] * args.n
    actions = np.random.default_rng(0).integers(0, 2, size=(256, args.n))
    sync = SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    sync.reset(seed=0)
    rates, sync_rates = [], []
    try:
        for k in range(args.pools):
            sync_rates.append(steps_per_second(sync.step, actions, args.seconds / 2))
            options = {"main_shard": True} if args.main_shard else {}
            with ShmPoolVecEnv(env_fns, n_workers=args.n_workers, start_method="fork", **options) as envs:
                envs.seed(0)
                envs.reset()
                steps_per_second(envs.step, actions, 0.3)  # warm-up: spin budgets settle
                rates.append(steps_per_second(envs.step, actions, args.seconds))
                print(f"pool {k}: {rates[-1]:>9,.0f} steps/s  (sync {sync_rates[-1]:,.0f})  {envs!r}", flush=True)
    finally:
        sync.close()
    median = statistics.median(rates)
    print(
        f"median {median:,.0f} steps/s; slowest/median {min(rates) / median:.2f} (target >= 0.85); "
        f"median vs SyncVectorEnv {median / statistics.median(sync_rates):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
