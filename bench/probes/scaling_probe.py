"""The machine's ceiling: how well plain processes scale, with no vector env and no sync.

Each process builds ``n`` envs and steps them in a loop; the probe reports the total
env steps per second with 1 and with ``procs`` processes, alternating. No vector env
can beat this ratio, so it is the yardstick for every "x over a single process" target.

    python bench/probes/scaling_probe.py CartPole-v1 --n 32 --procs 2

``--per-cpu`` shows how that ceiling moves: one process pinned to each usable CPU times
:func:`shmvec.planning.env_timing.reference_loop` every half second, all CPUs busy at once, then
each CPU alone. On a VM whose host gives a virtual CPU only half a core at times, a row's
figures double for seconds at a stretch, busy or alone::

    python bench/probes/scaling_probe.py --per-cpu --seconds 6
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import gymnasium as gym

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SAMPLE_SECONDS = 0.5  # one --per-cpu figure


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


def _reference_loop_times(cpu: int, seconds: float, results: mp.Queue) -> None:
    """Pinned to ``cpu``: µs per reference_loop(), one figure per SAMPLE_SECONDS, for ``seconds``."""
    from shmvec.planning.env_timing import reference_loop

    os.sched_setaffinity(0, {cpu})
    figures, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < SAMPLE_SECONDS:
            for _ in range(50):
                reference_loop()
            calls += 50
        figures.append((time.perf_counter() - start) / calls * 1e6)
    results.put((cpu, figures))


def per_cpu(cpus: list[int], seconds: float) -> dict[str, list[float]]:
    """{"cpu 0 (all busy)": figures, ..., "cpu 0 (alone)": figures, ...}: µs per reference_loop()
    on each CPU, first with every CPU of ``cpus`` busy at once, then with each one alone."""
    ctx = mp.get_context("fork")
    rows: dict[str, list[float]] = {}
    for together in ([cpus] if len(cpus) > 1 else []) + [[cpu] for cpu in cpus]:
        results = ctx.Queue()
        procs = [ctx.Process(target=_reference_loop_times, args=(cpu, seconds, results)) for cpu in together]
        for proc in procs:
            proc.start()
        figures = dict(results.get() for _ in procs)
        for proc in procs:
            proc.join()
        label = "all busy" if len(together) > 1 else "alone"
        rows.update({f"cpu {cpu} ({label})": figures[cpu] for cpu in together})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env_id", nargs="?", default="CartPole-v1")
    parser.add_argument("--n", type=int, default=32, help="envs per process")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-cpu", action="store_true", help="each CPU's speed over time, all busy, then alone")
    args = parser.parse_args()
    if args.per_cpu:
        print(f"µs per reference_loop(), every {SAMPLE_SECONDS} s")
        for label, figures in per_cpu(sorted(os.sched_getaffinity(0)), args.seconds).items():
            print(f"{label:18s}" + " ".join(f"{figure:6.1f}" for figure in figures))
        return
    single, multi = [], []
    for _ in range(args.rounds):
        single.append(total_rate(args.env_id, args.n, 1, args.seconds))
        multi.append(total_rate(args.env_id, args.n, args.procs, args.seconds))
    s, m = statistics.median(single), statistics.median(multi)
    print(f"{args.env_id}: 1 process {s:,.0f} steps/s, {args.procs} processes {m:,.0f} steps/s: {m / s:.2f}x")


if __name__ == "__main__":
    main()
