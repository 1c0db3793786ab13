"""Where one synchronous step's time goes: a timeline of the main process and every shard.

Usage (from the repository root)::

    python bench/probes/timeline.py                                  # default ShmPoolVecEnv, CartPole-v1, N=64
    python bench/probes/timeline.py --adapter gym --n-workers 2      # ShmVectorEnv with two workers
    python bench/probes/timeline.py --env synth:0us:210x160x3:uint8 --n 32 --no-copy

Every env is wrapped in :class:`Probe`, which records when each of its ``step``/``reset``
calls starts and ends (``perf_counter`` is ``CLOCK_MONOTONIC``: comparable across
processes; a probe costs ~0.3-1 µs per env step). The main process times the engine's
phases by wrapping its methods. For each step the times are taken from the moment the
caller calls ``step``; the table shows their medians over the steps, and splits the step
into *stepping* (the slowest shard, first env start to last env end) and the rest: the
main process's work before the shards start and after the last env ends, the hand-offs,
and the shards' writes of their result rows (in parallel, but after their last env;
large observations make this the bulk). Of the rest, only the row writes shrink with
more cores. Shards of equal size still differ from step to step (episode ends, a shared
machine, caches, interrupts): the slowest shard's lag behind their mean is the price of
static shards (an env cannot move between processes), paid every step.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

_now = time.perf_counter


class Probe(gym.Wrapper):
    """Records ``(start, end)`` of every ``step`` and ``reset`` in :attr:`probe_times` (flat)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.probe_times: list[float] = []

    def step(self, action):
        start = _now()
        result = self.env.step(action)
        self.probe_times += (start, _now())
        return result

    def reset(self, **kwargs):
        start = _now()
        result = self.env.reset(**kwargs)
        self.probe_times += (start, _now())
        return result


def probed(env_name: str) -> gym.Env:
    """The bench workload ``env_name`` (a Gymnasium id or ``synth:...``) with a probe."""
    from bench.workloads import get_workload

    return Probe(get_workload(env_name).make())


def _timed(marks: list[float], fn: Callable) -> Callable:
    """``fn``, appending the time it returns to ``marks``."""

    def wrapper(*args, **kwargs):
        result = fn(*args, **kwargs)
        marks.append(_now())
        return result

    return wrapper


def run(adapter: str, env_name: str, n: int, n_workers: int | None, steps: int, warmup: int, copy: bool = True) -> dict:
    """Step a vector env ``warmup + steps`` times; return the phases of the timed steps (seconds, per step)."""
    from shmvec import ShmPoolVecEnv, ShmVectorEnv
    from shmvec.engine import ops

    env_fns = [functools.partial(probed, env_name)] * n
    kwargs = {"copy": copy} if n_workers is None else {"copy": copy, "n_workers": n_workers}
    envs = ShmPoolVecEnv(env_fns, **kwargs) if adapter == "sb3" else ShmVectorEnv(env_fns, **kwargs)
    try:
        pool = envs._pool
        collected, engine_done = [], []
        pool.collect = _timed(collected, pool.collect)
        pool.step_wait = _timed(engine_done, pool.step_wait)
        envs.reset() if adapter == "sb3" else envs.reset(seed=0)
        envs.action_space.seed(0)
        if adapter == "sb3":  # SB3's action_space is one env's
            actions = [np.stack([envs.action_space.sample() for _ in range(n)]) for _ in range(64)]
        else:
            actions = [envs.action_space.sample() for _ in range(64)]
        for i in range(warmup):
            envs.step(actions[i % 64])
        pool.run({i: ops.SetAttr("probe_times", []) for i in range(n)})
        del collected[:], engine_done[:]  # the marks of the timed steps only
        windows = []
        for i in range(steps):
            call = _now()
            envs.step_async(actions[i % 64])
            sent = _now()
            envs.step_wait()
            windows.append((call, sent, _now()))
        times = pool.run({i: ops.GetWrapperAttr("probe_times") for i in range(n)})
        description = repr(envs)
        shards = [(start, stop, k < pool.n_workers) for k, (start, stop) in enumerate(pool.shards)]
    finally:
        envs.close()
    return _phases(windows, collected, engine_done, times, shards, description)


def _phases(windows, collected, engine_done, times, shards, description) -> dict:
    """Per-step phase lengths from the main process's marks and the envs' probe intervals."""
    starts = {i: np.asarray(t[0::2]) for i, t in times.items()}
    ends = {i: np.asarray(t[1::2]) for i, t in times.items()}
    rows: list[dict[str, float]] = []
    for s, (call, sent, returned) in enumerate(windows):
        row = {"step_async returns": sent - call}
        shard_ends = []
        for k, (start, stop, in_worker) in enumerate(shards):
            name = f"worker {k}" if in_worker else "main shard"
            first = min(_first_after(starts[i], call) for i in range(start, stop))
            last = max(_last_before(ends[i], returned) for i in range(start, stop))
            row[f"{name}: first env starts"] = first - call
            row[f"{name}: stepping"] = last - first
            shard_ends.append(last)
        row["last env ends -> all shards collected (rows, hand-off)"] = collected[s] - max(shard_ends)
        row["collected -> engine returns"] = engine_done[s] - collected[s]
        row["engine returns -> adapter returns"] = returned - engine_done[s]
        row["step"] = returned - call
        stepping = [row[key] for key in row if key.endswith(": stepping")]
        row["stepping (slowest shard)"] = max(stepping)
        row["of which the slowest shard's lag (slowest - mean)"] = max(stepping) - statistics.fmean(stepping)
        row["not stepping envs (step - stepping)"] = row["step"] - row["stepping (slowest shard)"]
        rows.append(row)
    return {
        "description": description,
        "steps": len(rows),
        "medians": {key: statistics.median(r[key] for r in rows) for key in rows[0]},
    }


def _first_after(values: np.ndarray, t: float) -> float:
    return float(values[np.searchsorted(values, t)])


def _last_before(values: np.ndarray, t: float) -> float:
    return float(values[np.searchsorted(values, t) - 1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapter", choices=("sb3", "gym"), default="sb3")
    p.add_argument(
        "--env", default="CartPole-v1", help="a Gymnasium id or a synthetic env, e.g. synth:0us:210x160x3:uint8"
    )
    p.add_argument("--n", type=int, default=64, help="envs")
    p.add_argument("--n-workers", type=int, default=None, help="worker processes (default: the adapter's choice)")
    p.add_argument("--no-copy", action="store_true", help="copy=False: observations returned as views")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=300)
    args = p.parse_args(argv)
    result = run(args.adapter, args.env, args.n, args.n_workers, args.steps, args.warmup, copy=not args.no_copy)
    medians = result["medians"]
    print(f"{result['description']}: {args.env}, medians of {result['steps']} steps (µs from the caller's step call)")
    for key, value in medians.items():
        share = f"{100 * value / medians['step']:5.1f}%" if not key.endswith("first env starts") else ""
        print(f"  {key:50s} {value * 1e6:8.1f}  {share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
