"""Two checkouts of shmvec measured in turn, each run in a fresh process of its own.

A change to the engine is best judged against the code before it, on the same machine
at the same time, and one vector env alone in a process measures differently from the
same vector env beside six others (``bench/report.py --targets``). In each of
``--rounds`` rounds this starts one process per checkout; each process builds the
shmvec configuration with SyncVectorEnv (in the adapter's autoreset mode) and
DummyVecEnv beside it, times the three in turn and prints their ratios. Usage (from
the repository root)::

    git worktree add /tmp/before HEAD~3      # the code to compare with
    python bench/alternate.py --other /tmp/before --env CartPole-v1 --n 64 --adapter sb3
    python bench/alternate.py --other /tmp/before --n 64 --n-workers 2 --adapter gym
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(args: argparse.Namespace) -> dict:
    """In the child: time the shmvec configuration and the references in turn; their ratios."""
    import gymnasium as gym
    import numpy as np
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    from stable_baselines3.common.vec_env import DummyVecEnv

    import shmvec

    env_fns = [lambda: gym.make(args.env)] * args.n
    sb3 = args.adapter == "sb3"
    mode = AutoresetMode.SAME_STEP if sb3 else AutoresetMode.NEXT_STEP
    adapter = shmvec.ShmPoolVecEnv if sb3 else shmvec.ShmVectorEnv
    envs = {
        "shmvec": adapter(env_fns, n_workers=args.n_workers, start_method="fork"),
        "sync": SyncVectorEnv(env_fns, autoreset_mode=mode),
        "dummy": DummyVecEnv(env_fns),
    }
    actions = np.random.default_rng(0).integers(0, 2, size=(256, args.n))
    samples: dict[str, list[float]] = {name: [] for name in envs}
    try:
        for env in envs.values():
            env.reset()
            _steps_per_second(env.step, actions, 0.2)  # warm-up
        for _ in range(args.samples):
            for name, env in envs.items():
                samples[name].append(_steps_per_second(env.step, actions, args.seconds))
    finally:
        for env in envs.values():
            env.close()
    median = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "checkout": os.path.dirname(os.path.dirname(os.path.abspath(shmvec.__file__))),
        "steps_per_s": median["shmvec"],
        "vs_sync": median["shmvec"] / median["sync"],
        "vs_dummy": median["shmvec"] / median["dummy"],
    }


def _steps_per_second(step, actions, seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(5):
            step(actions[count % len(actions)])
            count += 1
    return count * actions.shape[1] / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", required=True, help="the other checkout (a directory holding shmvec/)")
    p.add_argument("--env", default="CartPole-v1", help="a registered env id with Discrete(2) actions")
    p.add_argument("--n", type=int, default=64, help="envs per vector env")
    p.add_argument("--n-workers", type=int, default=None, help="default: None (the automatic choice)")
    p.add_argument("--adapter", choices=("sb3", "gym"), default="sb3")
    p.add_argument("--rounds", type=int, default=4, help="processes per checkout (default 4)")
    p.add_argument("--samples", type=int, default=5, help="samples per process, round-robin (default 5)")
    p.add_argument("--seconds", type=float, default=0.4, help="seconds per sample")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    child_argv = list(argv if argv is not None else sys.argv[1:])
    rows: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for checkout in (HERE, os.path.abspath(args.other)):
            env = {**os.environ, "PYTHONPATH": checkout}  # this checkout's shmvec, not the installed one
            out = subprocess.run(
                [sys.executable, __file__, *child_argv, "--child"],
                env=env,
                cwd=checkout,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.setdefault(checkout, []).append(row)
            print(f"{checkout}: {row['vs_sync']:.2f}x SyncVectorEnv, {row['vs_dummy']:.2f}x DummyVecEnv", flush=True)
    for checkout, found in rows.items():
        print(
            f"{checkout}: median {statistics.median(r['vs_sync'] for r in found):.2f}x SyncVectorEnv, "
            f"{statistics.median(r['vs_dummy'] for r in found):.2f}x DummyVecEnv, "
            f"{statistics.median(r['steps_per_s'] for r in found):,.0f} steps/s ({len(found)} processes)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
