"""Does the default choose the same layout run after run? Fresh processes, each building one default vector env.

Usage (from the repository root)::

    python bench/stability.py                      # CartPole-v1 x64 (ShmVectorEnv), HalfCheetah-v5 x8 (ShmPoolVecEnv)
    python bench/stability.py --runs 8 --cases cartpole64
    python bench/stability.py --checkout /tmp/old  # also the same processes on another checkout, alternating

Each run is a new Python process that builds the vector env with ``n_workers=None``, prints what
the timing measured (the env's step, this machine's scale against the calibration machine, their
ratio: the only figure the choice depends on) and the layout it chose, and closes it. The
table ends with how many distinct layouts each case got. With ``--checkout`` the runs of the
two trees alternate, so both see the same load. The default's memory of its earlier choices
(``SHMVEC_PLAN_CACHE``) is a temporary file per tree and case, shared by its runs, as it
would be on one machine; ``--no-cache`` turns it off.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "cartpole64": ("ShmVectorEnv", "CartPole-v1", 64),
    "halfcheetah8": ("ShmPoolVecEnv", "HalfCheetah-v5", 8),
}

# Runs in the fresh process: build the default vector env, print what its plan says.
CHILD = """
import json, sys, time
import gymnasium as gym
import shmvec
adapter, env_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
envs = getattr(shmvec, adapter)([lambda: gym.make(env_id)] * n)
built = time.perf_counter() - start
plan = envs._pool.plan
envs.close()
print(json.dumps({
    "t_env": plan.t_env, "scale": getattr(plan, "scale", None), "cpu_share": plan.cpu_share,
    "layout": plan.constructor_args(), "reason": plan.reason, "start_s": built,
}))
"""


def run_once(checkout: str, case: str, cache: str | None) -> dict:
    adapter, env_id, n = CASES[case]
    env = dict(os.environ, PYTHONPATH=checkout)
    if cache is None:
        env["SHMVEC_PLAN_CACHE"] = "off"
    else:
        env["SHMVEC_PLAN_CACHE"] = cache
    out = subprocess.run(
        [sys.executable, "-c", CHILD, adapter, env_id, str(n)],
        capture_output=True,
        text=True,
        cwd=checkout,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{case} on {checkout} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(tree: str, case: str, k: int, r: dict) -> str:
    t_env, scale = r["t_env"], r["scale"]
    ratio = f"{t_env / scale * 1e6:7.1f}" if t_env and scale else "      -"
    scale_text = f"{scale:5.2f}" if scale else "    -"
    t_text = f"{t_env * 1e6:7.1f}" if t_env else "      -"
    kept = " (kept)" if "kept" in r["reason"] else ""
    return f"{tree:8s} {case:13s} {k:3d} {t_text} {scale_text} {ratio} {r['start_s']:6.2f}  {r['layout']}{kept}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--checkout", help="another checkout to run alternately (e.g. a git archive of the release before)")
    p.add_argument("--no-cache", action="store_true", help="SHMVEC_PLAN_CACHE=off: every run chooses afresh")
    args = p.parse_args(argv)
    trees = [("current", REPO)] + ([("other", os.path.abspath(args.checkout))] if args.checkout else [])
    layouts: dict[tuple[str, str], Counter] = {}
    print("tree     case           run  µs/step scale µs@cal  start  layout")
    with tempfile.TemporaryDirectory() as folder:
        for case in args.cases:
            for k in range(args.runs):
                for name, checkout in trees:
                    cache = None if args.no_cache else os.path.join(folder, f"{name}-{case}.json")
                    r = run_once(checkout, case, cache)
                    layouts.setdefault((name, case), Counter())[r["layout"]] += 1
                    print(row(name, case, k, r), flush=True)
    print("\nµs@cal: the step in the calibration machine's time (µs/step / scale), what the choice depends on")
    for (name, case), counts in layouts.items():
        print(f"{name:8s} {case:13s} {len(counts)} layout(s): " + ", ".join(f"{c}x {lay}" for lay, c in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
