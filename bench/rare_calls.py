"""Round trip of the rare calls that algorithms make every step, per vector env, side by side.

- ``her``: HER's ``env_method("compute_reward", achieved, desired, infos, indices=[0])``, as
  SB3's ``HerReplayBuffer`` calls it for every sampled batch: two (256, 3) float64 arrays and
  256 info dicts (empty: its default ``copy_info_dict=False``);
- ``masks``: MaskablePPO's ``env_method("action_masks")`` on every env, before every step;
- ``spec``: ``get_attr("spec")`` on every env (wrappers ask for attributes per step).

Each vector env holds N CartPole envs with those two methods: DummyVecEnv, SubprocVecEnv
(its default start method), ShmPoolVecEnv with ``n_workers`` 1, 2 and N (its default
start method) and ShmPoolVecEnv's default layout. All are alive at once and take turns,
their order rotated each round; each call is timed alone and the table gives medians in
µs. ``--other`` measures another checkout in turns with this one instead, one fresh
process each per round (as ``bench/gate.py`` runs the two trees), shmvec's rows only.

``--in-process``: every env in this process, where a fixed cost of a few µs a call is a few
percent, below what the table above resolves on a shared machine. ``ShmPoolVecEnv(n_workers=0)``
and ``DummyVecEnv`` of the same N sb3-contrib ``InvalidActionEnvDiscrete`` (as its MaskablePPO
tests build it: 80 actions, 60 invalid) live in this process and are timed in alternating blocks
(as ``bench/in_process.py`` times steps), in this thread's CPU time (``--wall``: wall time);
only the paired ratio of each block pair is kept, ``DummyVecEnv time / shmvec time`` (below 1:
shmvec is slower), its median and quartiles.
Usage::

    python bench/rare_calls.py                          # ~30 s on 2 cores
    python bench/rare_calls.py --n 8 --calls 300 --rounds 7
    python bench/rare_calls.py --other /tmp/before      # this checkout against another
    python bench/rare_calls.py --in-process             # N=1, 4, 8: 40 blocks of 300 calls (~4 min)
    python bench/rare_calls.py --in-process 8 --blocks 12 --calls 100
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLS = ("her", "masks", "spec")


class GoalCartPole(CartPoleEnv):
    """CartPole with a goal env's ``compute_reward`` and a maskable env's ``action_masks``."""

    def compute_reward(self, achieved_goal, desired_goal, infos):
        return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > 0.05).astype(np.float32)

    def action_masks(self):
        return np.array([True, self.state is None or self.state[0] < 0.5])


def vector_envs(n: int, names: list[str], start_method: str | None = None) -> dict[str, Callable[[], object]]:
    """Builders of the vector envs ``names`` (``dummy``, ``subproc``, ``shm k=K``, ``shm default``)."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import shmvec

    fns = [GoalCartPole] * n
    how = {} if start_method is None else {"start_method": start_method}
    builders = {
        "dummy": lambda: DummyVecEnv(fns),
        "subproc": lambda: SubprocVecEnv(fns, **how),
        "shm default": lambda: shmvec.ShmPoolVecEnv(fns, **how),
    }
    for name in names:
        if name.startswith("shm k="):
            builders[name] = lambda k=int(name[6:]): shmvec.ShmPoolVecEnv(fns, n_workers=k, **how)
    return {name: builders[name] for name in names}


def the_calls(batch: int = 256) -> dict[str, Callable[[object], object]]:
    rng = np.random.default_rng(0)
    achieved, desired = rng.uniform(-1, 1, (batch, 3)), rng.uniform(-1, 1, (batch, 3))
    infos = [{} for _ in range(batch)]
    return {
        "her": lambda env: env.env_method("compute_reward", achieved, desired, infos, indices=[0]),
        "masks": lambda env: env.env_method("action_masks"),
        "spec": lambda env: env.get_attr("spec"),
    }


def measure(
    n: int, names: list[str], calls: int, rounds: int, start_method: str | None = None, warmup: float = 0.3
) -> dict:
    """``{vector env: {call: median µs}}``, and each one's ``repr`` (the layout it runs).

    ``warmup``: seconds of calls to each vector env first. A new worker may start on this
    process's CPU; until the scheduler moves it (~50 ms of calls here), both share one core
    and a call costs twice as much.
    """
    envs = {}
    samples: dict[tuple[str, str], list[float]] = {}
    perf_counter = time.perf_counter
    try:
        for name, build in vector_envs(n, names, start_method).items():
            envs[name] = build()
            envs[name].reset()
        the = the_calls()
        for env in envs.values():  # warm-up: long enough for the scheduler to move a new worker off this CPU
            end = perf_counter() + warmup
            while perf_counter() < end:
                for call in the.values():
                    call(env)
        for r in range(rounds):
            order = list(envs)[r % len(envs) :] + list(envs)[: r % len(envs)]
            for call_name, call in the.items():
                for name in order:
                    env, times = envs[name], samples.setdefault((name, call_name), [])
                    for _ in range(calls):
                        start = perf_counter()
                        call(env)
                        times.append(perf_counter() - start)
        reprs = {name: repr(env) for name, env in envs.items()}
    finally:
        for env in envs.values():
            env.close()
    medians = {name: {c: statistics.median(samples[(name, c)]) * 1e6 for c in CALLS} for name in envs}
    return {"medians": medians, "reprs": reprs}


def masked_env() -> object:
    """sb3-contrib's ``InvalidActionEnvDiscrete`` as its MaskablePPO tests build it."""
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    return InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60)


def in_process_calls() -> dict[str, Callable[[object], object]]:
    """The calls ``--in-process`` pairs: MaskablePPO's, a wrapper's ``get_attr`` and a ``set_attr``."""
    return {
        "masks": lambda env: env.env_method("action_masks"),
        "spec": lambda env: env.get_attr("spec"),
        "set": lambda env: env.set_attr("shmvec_bench", 1),
    }


def in_process(
    n: int,
    blocks: int,
    calls: int,
    names: tuple[str, ...] = ("masks", "spec", "set"),
    clock: Callable[[], float] = time.thread_time,
) -> list[dict]:
    """One row per call of ``names``: ``ShmPoolVecEnv(n_workers=0)`` against ``DummyVecEnv`` (N envs), both
    in this process, timed in ``blocks`` alternating blocks of ``calls`` calls; µs per call (medians) and
    the paired ratios ``dummy / shmvec`` of the blocks (median, quartiles).

    ``clock``: this thread's CPU time by default: every env runs in this thread, so that is the whole
    cost of a call, less the time other processes held the CPU (``time.perf_counter``: wall time).
    """
    from stable_baselines3.common.vec_env import DummyVecEnv

    import shmvec

    # The same env objects in both, so both calls do the same work on the same memory (two sets of
    # like envs can differ by a few % per action_masks call, by where their objects lie in memory);
    # none of the calls changes an env's state (set_attr sets the same value again).
    envs = [masked_env() for _ in range(n)]
    fns = [lambda env=env: env for env in envs]
    shm, ref = shmvec.ShmPoolVecEnv(fns, n_workers=0), DummyVecEnv(fns)
    rows = []
    try:
        if shm.get_attr("unwrapped") != ref.get_attr("unwrapped") or shm.get_attr("unwrapped") != envs:
            raise RuntimeError("the two vector envs hold other envs: their calls would not do the same work")

        def block(call: Callable[[object], object], env: object) -> float:
            started = clock()
            for _ in range(calls):
                call(env)
            return (clock() - started) * 1e6 / calls

        for name in names:
            call = in_process_calls()[name]
            block(call, shm), block(call, ref)  # warm-up
            shm_us, ref_us = [], []
            gc.collect()
            for b in range(blocks):  # alternate which goes first
                if b % 2 == 0:
                    shm_us.append(block(call, shm))
                    ref_us.append(block(call, ref))
                else:
                    ref_us.append(block(call, ref))
                    shm_us.append(block(call, shm))
            ratios = [r / s for s, r in zip(shm_us, ref_us)]
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            rows.append(
                {
                    "call": name,
                    "n": n,
                    "shm_us": statistics.median(shm_us),
                    "ref_us": statistics.median(ref_us),
                    "ratio": statistics.median(ratios),
                    "ratio_q1": q[0],
                    "ratio_q3": q[-1],
                }
            )
    finally:
        shm.close()
        ref.close()
    return rows


def table(medians: dict[str, dict[str, float]], title: str) -> str:
    lines = [
        title,
        "",
        "| vector env | " + " | ".join(f"{c} (µs)" for c in CALLS) + " |",
        "|---" * (len(CALLS) + 1) + "|",
    ]
    for name, row in medians.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.1f}" for c in CALLS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4, help="envs per vector env (default 4)")
    p.add_argument("--calls", type=int, help="calls of each kind per turn (default 200; --in-process: per block, 300)")
    p.add_argument("--rounds", type=int, default=5, help="turns of every vector env (default 5)")
    p.add_argument("--start-method", default=None, help="shmvec's and SubprocVecEnv's (default: theirs)")
    p.add_argument("--other", help="measure this other checkout (a directory holding shmvec/) in turns with this one")
    p.add_argument(
        "--in-process",
        type=int,
        nargs="*",
        metavar="N",
        help="every env in this process: shmvec against DummyVecEnv in paired blocks, for these N (default 1 4 8)",
    )
    p.add_argument("--blocks", type=int, default=40, help="--in-process: block pairs (default 40)")
    p.add_argument("--wall", action="store_true", help="--in-process: wall time (default: this thread's CPU time)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.in_process is not None:
        calls = args.calls or 300
        print(f"{'call':<6} {'N':>3} {'shmvec µs':>10} {'dummy µs':>9} {'ratio':>6} {'[q1-q3]':>13}")
        for n in args.in_process or [1, 4, 8]:
            for row in in_process(n, args.blocks, calls, clock=time.perf_counter if args.wall else time.thread_time):
                print(
                    f"{row['call']:<6} {n:>3} {row['shm_us']:>10.1f} {row['ref_us']:>9.1f} {row['ratio']:>6.3f} "
                    f"[{row['ratio_q1']:.3f}-{row['ratio_q3']:.3f}]",
                    flush=True,
                )
        return 0
    args.calls = args.calls or 200
    shm = [f"shm k={k}" for k in sorted({1, 2, args.n})]
    if args.child:  # one round of shmvec's rows, for --other
        print(json.dumps(measure(args.n, shm, args.calls, 1, args.start_method)["medians"]))
        return 0
    if args.other is None:
        result = measure(args.n, ["dummy", "subproc", *shm, "shm default"], args.calls, args.rounds, args.start_method)
        print(table(result["medians"], f"Rare calls, N={args.n}, {os.cpu_count()} CPUs: median µs per call"))
        print("\n" + "\n".join(f"{name}: {text}" for name, text in result["reprs"].items()))
        return 0
    child_argv = [a for a in (argv if argv is not None else sys.argv[1:])]
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for checkout in (HERE, os.path.abspath(args.other)):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), *child_argv, "--child"],
                env={**os.environ, "PYTHONPATH": checkout},  # that checkout's shmvec, not the installed one
                cwd=checkout,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs.setdefault(checkout, []).append(json.loads(out.strip().splitlines()[-1]))
    for checkout, found in runs.items():
        medians = {name: {c: statistics.median(run[name][c] for run in found) for c in CALLS} for name in shm}
        print(table(medians, f"{checkout}: N={args.n}, median of {len(found)} processes' medians (µs per call)") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
