"""``copy=False`` with large observations, run after run: is the speed-up steady?

32 envs of a synthetic env that does no work and returns 210x160x3 uint8 frames
(``synth:0us:210x160x3:uint8``); ``DummyVecEnv`` against ``ShmPoolVecEnv(copy=False)`` with
the main process and one worker (``n_workers=1, main_shard=True``; ``--default``: the
default layout), both alive in one process, taking turns for ``--rounds`` rounds of
``--seconds``. Each run is a fresh process (torch loaded, as in training: SB3 imports it);
one JSON line per run with the median ratio of env steps/s and the rounds' ratios::

    python bench/zero_copy.py --runs 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(default: bool, rounds: int, seconds: float) -> dict:
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv

    from bench.synthetic import SyntheticEnv
    from shmvec import ShmPoolVecEnv

    fns = [functools.partial(SyntheticEnv, 0.0, (210, 160, 3), "uint8")] * 32
    layout = {} if default else {"n_workers": 1, "main_shard": True}
    envs = {"dummy": DummyVecEnv(fns), "shm": ShmPoolVecEnv(fns, copy=False, **layout)}
    actions = np.zeros(32, dtype=np.int64)
    rates: dict[str, list[float]] = {name: [] for name in envs}
    try:
        for venv in envs.values():
            venv.reset()
            for _ in range(50):
                venv.step(actions)
        for r in range(rounds):
            for name in list(envs) if r % 2 == 0 else list(envs)[::-1]:
                venv, steps, start = envs[name], 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    venv.step(actions)
                    steps += 1
                rates[name].append(steps * 32 / (time.perf_counter() - start))
        described = repr(envs["shm"])
    finally:
        for venv in envs.values():
            venv.close()
    ratios = [s / d for s, d in zip(rates["shm"], rates["dummy"])]
    return {
        "ratio": statistics.median(ratios),
        "rounds": [round(x, 2) for x in ratios],
        "shm_steps_per_s": statistics.median(rates["shm"]),
        "dummy_steps_per_s": statistics.median(rates["dummy"]),
        "shm": described,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="fresh processes, one after the other (default 5)")
    p.add_argument("--rounds", type=int, default=6, help="turns of each vector env per run (default 6)")
    p.add_argument("--seconds", type=float, default=0.5, help="seconds per turn (default 0.5)")
    p.add_argument("--default", action="store_true", help="the default layout instead of the main process + 1 worker")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(args.default, args.rounds, args.seconds)))
        return 0
    command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--seconds", str(args.seconds)]
    command += ["--default"] if args.default else []
    ratios = []
    for _ in range(args.runs):
        done = subprocess.run(command, cwd=HERE, capture_output=True, text=True, check=True)
        line = done.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        ratios.append(json.loads(line)["ratio"])
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}x"
    print(f"median of the runs: {statistics.median(ratios):.2f}x DummyVecEnv, runs {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
