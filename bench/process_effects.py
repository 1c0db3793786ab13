"""What each effect of shmvec on your process buys: a training row with the default against the
same row with that effect turned off, fresh processes, the variants taking turns, medians.

    python bench/process_effects.py                 # 3 rounds at scale 1 (~15 min on 2 cores)
    python bench/process_effects.py --rounds 1 --scale 0.1

Rows (docs/process.md quotes them): torch's thread count (``torch_threads="unchanged"``) and the
parked OpenMP team (``omp_spin="unchanged"``) on SB3 PPO Humanoid x8, where the default runs
workers; the timing run's choice on SB3 PPO CartPole x8 against one worker per core (what the
default falls back to when it cannot time the env). A ratio above 1: the default is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = {  # effect: (workload, the default's impl, the impl without the effect)
    "torch's thread count": ("ppo-humanoid", "shm", "shm:torch_threads=unchanged"),
    "parked OpenMP team": ("ppo-humanoid", "shm", "shm:omp_spin=unchanged"),
    "the timing run's choice": ("ppo-cartpole", "shm", "shm:n_workers=2"),
}
CHILD = (
    "import json, sys; from bench.training_jobs import WORKLOADS, run_sb3; "
    "print(json.dumps(run_sb3(WORKLOADS[sys.argv[1]], sys.argv[2], float(sys.argv[3]), 'cpu')))"
)


def run(workload: str, impl: str, scale: float) -> dict:
    env = {**os.environ, "PYTHONPATH": REPO, "SHMVEC_PLAN_CACHE": "off"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, workload, impl, str(scale)], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{workload} {impl} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    args = p.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    times: dict[str, dict[str, list[float]]] = {row: {"default": [], "off": []} for row in rows}
    for round_ in range(args.rounds):
        for row in rows:
            workload, default, off = ROWS[row]
            order = [("default", default), ("off", off)][:: 1 if round_ % 2 == 0 else -1]
            for side, impl in order:
                result = run(workload, impl, args.scale)
                times[row][side].append(result["total"])
                print(
                    f"round {round_ + 1} {row} {side} ({impl}): {result['total']:.2f} s {result['vec_env']}", flush=True
                )
    print("\n| effect | workload | default (s) | turned off (s) | off / default |")
    print("|---|---|---|---|---|")
    for row in rows:
        d, o = times[row]["default"], times[row]["off"]
        ratios = [b / a for a, b in zip(d, o)]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        print(f"| {row} | {ROWS[row][0]} | {statistics.median(d):.2f} | {statistics.median(o):.2f} | "
              f"{statistics.median(ratios):.2f}x{spread} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
