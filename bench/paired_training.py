"""SB3 training, one iteration at a time in turns: DummyVecEnv's process, then the default's.

``bench/training.py`` alternates whole runs, tens of seconds each. On a VM whose CPUs
change speed in phases of seconds (``python bench/probes/scaling_probe.py --per-cpu``), one run
and the next can fall in different phases. Here each implementation trains in a process
of its own, and the processes take turns one turn at a time: ``learn()`` continued for at
least ``--turn-steps`` steps, in whole rollouts (a rollout and its update; a few seconds),
while the other process waits, blocked. The two turns of a round give a paired ratio, and
the medians of those ratios are less exposed to the phases than ratios of whole runs.

    python bench/paired_training.py ppo-atari --rounds 12
    python bench/paired_training.py ppo-humanoid --impl dummy --impl shm --impl subproc
    python bench/paired_training.py ppo-atari --impl dummy --impl shm --impl shm:n_workers=1,main_shard=True

On-policy workloads of ``bench/training_jobs.py`` only (PPO, A2C: a turn is whole
rollouts). The first turn of each process (env reset, first calls) is not counted.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.training_jobs import WORKLOADS, Sb3Workload, build_vec_env, describe  # noqa: E402
from shmvec.tools.demo import time_phases  # noqa: E402

PHASES = ("rollout", "update", "turn")
ROLLOUT_STEPS = {"PPO": 2048, "A2C": 5}  # SB3's default n_steps, where the workload sets none


def turn_steps(workload: Sb3Workload, at_least: int) -> int:
    """Steps per turn: whole rollouts (``n_steps * n_envs``), at least ``at_least``."""
    rollout = workload.hyper.get("n_steps", ROLLOUT_STEPS[workload.algo]) * workload.n_envs
    return rollout * max(1, math.ceil(at_least / rollout))


def _trainer(name: str, impl: str, steps: int, conn) -> None:
    """A child: build ``impl``'s vector env and the model, then train ``steps`` steps per turn
    asked for, answering each with its seconds per phase (an error as a string)."""
    try:
        import stable_baselines3 as sb3

        workload = WORKLOADS[name]
        venv = build_vec_env(workload, impl)
        model = getattr(sb3, workload.algo)(workload.policy, venv, seed=0, verbose=0, **workload.hyper)
        seconds = time_phases(model)
        conn.send(describe(venv.unwrapped))
    except Exception as exc:  # reported by the parent
        conn.send(f"error: {type(exc).__name__}: {exc}")
        return
    try:
        while conn.recv():
            seconds.update(dict.fromkeys(PHASES, 0.0))
            start = time.perf_counter()
            model.learn(steps, reset_num_timesteps=False)
            seconds["turn"] = time.perf_counter() - start
            conn.send(dict(seconds))
    finally:
        venv.close()


def paired_turns(name: str, impls: list[str], rounds: int, steps: int) -> tuple[dict, dict[str, str]]:
    """{impl: [{phase: seconds} per round]} and {impl: its vector env's repr}; the order of the
    impls rotates each round, and only one process trains at a time."""
    ctx = mp.get_context("spawn")
    children, conns, described = {}, {}, {}
    try:
        for impl in impls:
            conns[impl], child_end = ctx.Pipe()
            children[impl] = ctx.Process(target=_trainer, args=(name, impl, steps, child_end), name=f"train-{impl}")
            children[impl].start()
        for impl in impls:
            described[impl] = conns[impl].recv()
            if described[impl].startswith("error:"):
                raise RuntimeError(f"{impl}: {described[impl]}")
        turns: dict[str, list[dict[str, float]]] = {impl: [] for impl in impls}
        for r in range(rounds + 1):  # round 0 warms up
            for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
                conns[impl].send(True)
                seconds = conns[impl].recv()
                if r:
                    turns[impl].append(seconds)
        return turns, described
    finally:
        for impl, conn in conns.items():
            if children[impl].is_alive():
                conn.send(False)
        for child in children.values():
            child.join(30)
            if child.is_alive():
                child.terminate()


def summary(turns: dict[str, list[dict[str, float]]], reference: str) -> list[str]:
    """Lines: each impl's median seconds per phase, and the median (range) of its per-round
    ratios to ``reference`` (the reference's seconds / the impl's: above 1 is faster)."""
    width = max(10, *(len(impl) + 2 for impl in turns))
    header = "".join(f"{phase + ' s':>10s}" for phase in PHASES)
    lines = [f"{'impl':{width}s}{header}   paired ratios: median (range)"]
    for impl, rounds in turns.items():
        medians = "".join(f"{statistics.median(t[phase] for t in rounds):10.2f}" for phase in PHASES)
        ratios = []
        for phase in PHASES:
            paired = [ref[phase] / own[phase] for ref, own in zip(turns[reference], rounds) if own[phase] > 0]
            if paired:
                ratios.append(f"{phase} {statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f})")
        lines.append(f"{impl:{width}s}{medians}   " + ", ".join(ratios))
    return lines


def main() -> None:
    on_policy = [name for name, w in WORKLOADS.items() if isinstance(w, Sb3Workload) and w.algo in ROLLOUT_STEPS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=on_policy)
    parser.add_argument(
        "--impl",
        action="append",
        help="dummy, subproc, shm or shm:key=value,... (repeat; the first is the reference; default: dummy and shm)",
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--turn-steps", type=int, default=1024, help="at least this many steps per turn")
    args = parser.parse_args()
    workload, impls = WORKLOADS[args.workload], args.impl or ["dummy", "shm"]
    unknown = [impl for impl in impls if impl.partition(":")[0] not in ("dummy", "subproc", "shm")]
    if unknown:
        parser.error(f"no implementation {', '.join(unknown)} here (dummy, subproc, shm or shm:key=value,...)")
    steps = turn_steps(workload, args.turn_steps)
    print(f"{workload.describe()}; {steps} steps a turn, {args.rounds} rounds, {impls[0]} the reference")
    turns, described = paired_turns(args.workload, impls, args.rounds, steps)
    for impl in impls:
        print(f"  {impl}: {described[impl]}")
    print("\n".join(summary(turns, impls[0])))


if __name__ == "__main__":
    main()
