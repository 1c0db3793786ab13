"""Where a shmvec step spends its time: py-spy on the main process and one worker.

Usage (from the repository root; needs ``pip install py-spy`` and ptrace rights)::

    python bench/probes/pyspy.py                                 # CartPole-v1, N=64, K=2, shm_sb3
    python bench/probes/pyspy.py --impl shm_gym --env Acrobot-v1 --n 32 --k 2 --seconds 10

It steps the env in a loop while ``py-spy record`` samples the main process and
worker 0 (``--idle`` keeps idle/blocked samples, so waiting shows up), then prints the
functions with the most samples, self and inclusive, for each. Raw stacks are kept
in ``--out`` for flame graphs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import Counter

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import psutil  # noqa: E402

from bench.measure import Config, Session, Timing, actions_for, preload_forkserver  # noqa: E402
from bench.workloads import get_workload  # noqa: E402


def summarize(raw_path: str, top: int = 12) -> str:
    """Top functions by self samples and by inclusive samples from a py-spy raw file."""
    self_c, incl, total = Counter(), Counter(), 0
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            frames = [fr for fr in stack.split(";") if not fr.startswith("process ") and not fr.startswith("thread ")]
            names = [_short(fr) for fr in frames]
            if names:
                self_c[names[-1]] += n
            for name in set(names):
                incl[name] += n
    lines = [f"{total} samples", "  self%  function"]
    lines += [f"  {100 * v / total:5.1f}  {k}" for k, v in self_c.most_common(top)]
    lines += ["  incl%  function"]
    lines += [f"  {100 * v / total:5.1f}  {k}" for k, v in incl.most_common(top + 8)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)": one entry per function, not per line
    name, _, where = frame.partition(" (")
    return f"{name} ({os.path.basename(where.rstrip(')')).split(':')[0]})" if where else name


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="shm_sb3")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--out", default="/tmp/shmvec_profile")
    args = p.parse_args(argv)
    if not shutil.which("py-spy"):
        p.error("py-spy not found: pip install py-spy")
    preload_forkserver()
    os.makedirs(args.out, exist_ok=True)
    config = Config(args.env, args.impl, args.n, args.k)
    session = Session(config, actions_for(get_workload(args.env), args.n))
    try:
        steps = session.warmup(Timing(warmup_time=0.5, block_time=0.1))
        main_pid = os.getpid()
        workers = [
            c
            for c in psutil.Process(main_pid).children(recursive=True)
            if "forkserver" in " ".join(c.cmdline()) and c.ppid() != main_pid
        ] or psutil.Process(main_pid).children()
        worker = min(workers, key=lambda c: c.create_time())  # the first worker: envs 0..N/K-1
        targets = {"main": main_pid, f"worker (pid {worker.pid})": worker.pid}
        procs = {}
        for label, pid in targets.items():
            raw = os.path.join(args.out, f"{label.split()[0]}.txt")
            cmd = [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(args.seconds)),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--idle",
                "--output",
                raw,
            ]
            procs[label] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), raw)
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds + 1:  # py-spy needs a moment to attach
            session.run(steps)
            count += steps
        fps = count * args.n / (time.perf_counter() - start)
        for label, (proc, raw) in procs.items():
            _, err = proc.communicate()
            print(f"== {label}: {config.tag} on {args.env} N={args.n} ==")
            print(summarize(raw) if os.path.exists(raw) else err)
        print(f"throughput while profiled: {fps:,.0f} env steps/s (py-spy slows it)")
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
