"""Every env in this process: shmvec against DummyVecEnv and SyncVectorEnv, in one process.

A fixed cost of a few µs a step is a 5-15 % step for one CartPole, below what separate
processes resolve on a shared machine. So both vector envs of a pair live in this process
and are timed in alternating blocks (each block the same pre-generated actions for both),
and only the paired ratio of each block pair is kept: ``reference time / shmvec time``
(above 1: shmvec is faster). Pairs: ``ShmPoolVecEnv(n_workers=0)`` vs ``DummyVecEnv``,
``ShmVectorEnv(n_workers=0)`` vs ``SyncVectorEnv`` in each autoreset mode (DISABLED:
both reset ended envs with a ``reset_mask`` after each step). Usage::

    python bench/in_process.py               # 40 blocks of 300 steps, CartPole x1, x4, x8, x64
    python bench/in_process.py --quick       # 12 blocks of 200 steps
    python bench/in_process.py --n 1 8 --pairs sb3 next_step --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

PAIRS = ("sb3", "next_step", "same_step", "disabled")
_MODES = {
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}


def build(pair: str, env_id: str, n: int) -> tuple[object, object]:
    """(shmvec's vector env, the reference) for ``pair``, both reset with the same seeds."""
    import shmvec

    env_fns = [lambda: gym.make(env_id)] * n
    if pair == "sb3":
        from stable_baselines3.common.vec_env import DummyVecEnv

        shm, ref = shmvec.ShmPoolVecEnv(env_fns, n_workers=0), DummyVecEnv(env_fns)
        for env in (shm, ref):
            env.seed(0)
            env.reset()
        return shm, ref
    mode = _MODES[pair]
    shm = shmvec.ShmVectorEnv(env_fns, n_workers=0, autoreset_mode=mode)
    ref = SyncVectorEnv(env_fns, autoreset_mode=mode)
    for env in (shm, ref):
        env.reset(seed=0)
    return shm, ref


def stepper(pair: str, env: object) -> Callable[[np.ndarray], None]:
    """One step of ``env`` with a row of actions (DISABLED: then a masked reset of the envs that ended)."""
    if pair == "sb3":
        return env.step
    if pair != "disabled":
        return env.step

    def step(actions: np.ndarray) -> None:
        _, _, terminated, truncated, _ = env.step(actions)
        ended = terminated | truncated
        if ended.any():
            env.reset(options={"reset_mask": ended})

    return step


def block(step: Callable[[np.ndarray], None], actions: np.ndarray) -> float:
    """µs per step over one pass through ``actions``."""
    started = time.perf_counter()
    for row in actions:
        step(row)
    return (time.perf_counter() - started) * 1e6 / len(actions)


def measure(pair: str, env_id: str, n: int, blocks: int, steps: int) -> dict:
    shm, ref = build(pair, env_id, n)
    try:
        actions = np.random.default_rng(n).integers(0, 2, size=(steps, n))
        step_shm, step_ref = stepper(pair, shm), stepper(pair, ref)
        block(step_shm, actions[:50])  # warm-up
        block(step_ref, actions[:50])
        shm_us, ref_us = [], []
        gc.collect()
        for b in range(blocks):  # alternate which goes first
            order = ((step_shm, shm_us), (step_ref, ref_us)) if b % 2 == 0 else ((step_ref, ref_us), (step_shm, shm_us))
            for step, out in order:
                out.append(block(step, actions))
    finally:
        shm.close()
        ref.close()
    ratios = [r / s for s, r in zip(shm_us, ref_us)]
    q = statistics.quantiles(ratios, n=4)
    return {
        "pair": pair,
        "n": n,
        "shm_us": statistics.median(shm_us),
        "ref_us": statistics.median(ref_us),
        "ratio": statistics.median(ratios),
        "ratio_q1": q[0],
        "ratio_q3": q[2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="12 blocks of 200 steps")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4, 8, 64])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=PAIRS)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.steps = 12, 200
    rows = []
    print(f"{'pair':<10} {'N':>3} {'shmvec µs':>10} {'ref µs':>8} {'ratio':>6} {'[q1-q3]':>13}")
    for n in args.n:
        for pair in args.pairs:
            row = measure(pair, args.env, n, args.blocks, args.steps)
            rows.append(row)
            print(
                f"{pair:<10} {n:>3} {row['shm_us']:>10.1f} {row['ref_us']:>8.1f} {row['ratio']:>6.3f} "
                f"[{row['ratio_q1']:.3f}-{row['ratio_q3']:.3f}]",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
