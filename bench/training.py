"""Wall time of training as users run it: SB3 ``learn()`` and CleanRL-style PPO scripts.

Usage (from the repository root)::

    python bench/training.py                                   # every workload, 3 repeats -> bench/results/training/
    python bench/training.py --workloads ppo-cartpole,ppo-humanoid --impls dummy,subproc,shm --repeats 3 --out /tmp/t
    python bench/training.py --workloads cleanrl-cartpole --scale 0.1 --repeats 1   # a quick check

Each run is one training job in a fresh Python process (torch's OpenMP threads and the
pool start clean; torch's thread count is left at its default), and the implementations
of a workload take turns, their order rotated each repeat. The child prints one JSON line
(rollout, update and total seconds, steps, the vector env's ``repr``); this process
takes the medians of the repeats and their ratios to the workload's reference
(DummyVecEnv for SB3, SyncVectorEnv for the scripts) and writes ``results.json``,
``training.md`` (a report section) and ``training.png`` (end-to-end ratios) into ``--out``.
Workloads and implementations: :mod:`bench.training_jobs`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `bench` and `shmvec` from this checkout, and not
    # bench/'s modules as top-level ones (one could hide a standard library module of the same name)
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here), *(p for p in sys.path if os.path.abspath(p or ".") != _here)]

from bench.training_jobs import IMPLS, REPO, WORKLOADS, child_main, impl_missing  # noqa: E402

HEADING = "## Training wall time: SB3 learn() and CleanRL-style PPO, side by side"
PHASES = ("rollout", "update", "total")


@dataclass
class Run:
    """One training job: which, in which repeat, what its child reported (or why it failed)."""

    workload: str
    impl: str
    repeat: int
    process: float = 0.0  # seconds of the whole child process, start-up and imports included
    result: dict | None = None
    error: str | None = None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument(
        "--impls",
        default=",".join(IMPLS),
        help=f"comma-separated, of {', '.join(IMPLS)}; a workload runs those it has, and always its "
        "reference (dummy for SB3, sync for the scripts)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of each (workload, impl), taking turns (default 3)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's timesteps (quick checks)")
    p.add_argument("--device", default="auto", help="SB3's device for the policy (default auto: cuda if present)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take before it counts as failed")
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "training"))
    p.add_argument("--report", help="also replace (or append) this section in that Markdown file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # run this SB3 workload here, print its JSON line
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.impls = [i for i in args.impls.split(",") if i]
    for name, known in (("workload", WORKLOADS), ("impl", IMPLS)):
        unknown = [x for x in getattr(args, name + "s") if x not in known]
        if unknown:
            p.error(f"unknown {name}(s) {unknown}; choose from {', '.join(known)}")
    return args


def plan(args: argparse.Namespace) -> tuple[list[Run], list[str]]:
    """The runs in the order they happen (per repeat, per workload, impls rotated), and what is skipped."""
    runs, skipped = [], []
    chosen = {}
    for name in args.workloads:
        workload = WORKLOADS[name]
        if why := workload.missing():
            skipped.append(why)
            continue
        impls = [i for i in workload.impls if i == workload.reference or i in args.impls]
        for impl in list(impls):
            if why := impl_missing(impl):
                skipped.append(f"{name} {impl}: {why}")
                impls.remove(impl)
        chosen[name] = impls
    for repeat in range(args.repeats):
        for name, impls in chosen.items():
            shift = repeat % len(impls)
            runs += [Run(name, impl, repeat) for impl in impls[shift:] + impls[:shift]]
    return runs, skipped


def execute(run: Run, args: argparse.Namespace) -> Run:
    """Run one job in a fresh interpreter that imports this checkout's shmvec; fill in its result."""
    command = WORKLOADS[run.workload].command(run.impl, args.scale, args.device)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.timeout, cwd=REPO, env=env, check=False
        )  # a failed run is reported with the others
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {args.timeout:.0f} s"
        return run
    run.process = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        run.error = f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}"
    else:
        run.result = json.loads(lines[-1])
    return run


@dataclass
class Row:
    """Medians of one (workload, impl) over its successful runs, and their ratios to the reference."""

    workload: str
    impl: str
    runs: int
    seconds: dict[str, float]  # rollout, update, total, process
    ratios: dict[str, float | None]  # reference seconds / these seconds: above 1 is faster
    steps: int
    vec_envs: list[str]


def summarize(runs: Sequence[Run]) -> list[Row]:
    rows: list[Row] = []
    for name in dict.fromkeys(r.workload for r in runs):
        for impl in dict.fromkeys(r.impl for r in runs if r.workload == name):
            ok = [r for r in runs if r.workload == name and r.impl == impl and r.result]
            if not ok:
                continue
            seconds = {k: statistics.median(r.result[k] for r in ok) for k in PHASES}
            seconds["process"] = statistics.median(r.process for r in ok)
            rows.append(
                Row(
                    name,
                    impl,
                    len(ok),
                    seconds,
                    {},
                    int(statistics.median(r.result["steps"] for r in ok)),
                    list(dict.fromkeys(r.result["vec_env"] for r in ok)),
                )
            )
    for row in rows:
        reference = WORKLOADS[row.workload].reference
        ref = next((r for r in rows if r.workload == row.workload and r.impl == reference), None)
        row.ratios = {
            k: ref.seconds[k] / row.seconds[k] if ref and row.seconds[k] > 0 else None for k in (*PHASES, "process")
        }
    return rows


def machine() -> dict:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "-"


def markdown(rows: Sequence[Row], runs: Sequence[Run], skipped: Sequence[str], meta: dict, plot: str | None) -> str:
    """The report section: conditions, workloads, the table of medians and ratios, the plot, what ran."""
    from bench.markdown import table

    m = meta["machine"]
    threads = ", ".join(map(str, sorted({r.result.get("torch_threads") for r in runs if r.result} - {None})))
    head = [
        HEADING,
        (
            f"Machine: {m['nproc']} usable cores (nproc; os.cpu_count() {m['cpu_count']}), {m['cpu']}, Python "
            f"{m['python']}, {m['platform']}. Date: {meta['date']}. Command: `{meta['command']}`."
        ),
        (
            f"Each run is one training job in a fresh process, torch's threads at their default ({threads or '?'}); "
            f"the implementations of a workload take turns, their order rotated each repeat; medians of "
            f"{meta['repeats']} repeats. Rollout: SB3's `collect_rollouts` / the scripts' stepping loop; update: "
            "`train` / the PPO update; total: the whole `learn()` call / the script's loop; process: the child "
            "process's wall time (start-up, imports and env construction included). Ratio = the reference's "
            "seconds / these seconds (above 1: faster than DummyVecEnv for SB3, SyncVectorEnv for the scripts)."
        ),
        "\n".join(f"- `{name}`: {WORKLOADS[name].describe()}" for name in dict.fromkeys(r.workload for r in runs)),
    ]
    body = table(
        ["workload", "impl", "rollout s", "update s", "total s", "process s", "rollout", "update", "total", "runs"],
        [
            [
                r.workload,
                r.impl,
                *(f"{r.seconds[k]:.2f}" for k in (*PHASES, "process")),
                *(_x(r.ratios[k]) for k in PHASES),
                r.runs,
            ]
            for r in rows
        ],
    )
    tail = [f"![end-to-end ratio per workload and implementation]({plot})"] if plot else []
    tail.append(
        "Vector envs at the end of the runs (`repr`):\n\n"
        + "\n".join(f"- {r.workload} {r.impl}: `{v}`" for r in rows for v in r.vec_envs)
    )
    if skipped:
        tail.append("Skipped: " + "; ".join(skipped) + ".")
    if errors := [f"- {r.workload} {r.impl} (repeat {r.repeat + 1}): {r.error}" for r in runs if r.error]:
        tail.append("Failed runs:\n\n" + "\n".join(errors))
    return "\n\n".join([*head, body, *tail]) + "\n"


def write_outputs(args, rows: list[Row], runs: list[Run], skipped: list[str], meta: dict) -> str:
    """results.json, training.png and training.md into ``args.out``; the Markdown section."""
    from bench.plots import ratio_bars

    os.makedirs(args.out, exist_ok=True)
    groups = {r.workload: {} for r in rows}
    for r in rows:
        if r.ratios["total"] is not None and r.impl != WORKLOADS[r.workload].reference:
            groups[r.workload][r.impl] = r.ratios["total"]
    groups = {name: bars for name, bars in groups.items() if bars}
    plot = None
    if groups:
        plot = ratio_bars(
            groups,
            os.path.join(args.out, "training.png"),
            "Training end to end vs DummyVecEnv (SB3) / SyncVectorEnv (scripts)",
            "reference seconds / seconds",
        )
    text = markdown(rows, runs, skipped, meta, plot)
    with open(os.path.join(args.out, "training.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(
            {**meta, "skipped": skipped, "runs": [asdict(r) for r in runs], "summary": [asdict(r) for r in rows]},
            f,
            indent=1,
        )
    if args.report:
        from bench.markdown import write_section

        link = os.path.relpath(os.path.join(args.out, plot), Path(args.report).parent) if plot else None  # from its dir
        write_section(args.report, markdown(rows, runs, skipped, meta, link), HEADING)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, args.impls[0], args.scale, args.device)
    runs, skipped = plan(args)
    for why in skipped:
        print(f"skipped: {why}", flush=True)
    meta = {
        "machine": machine(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python bench/training.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "repeats": args.repeats,
        "scale": args.scale,
    }
    for i, run in enumerate(runs):
        execute(run, args)
        got = run.result
        what = (
            f"rollout {got['rollout']:.2f} s, update {got['update']:.2f} s, total {got['total']:.2f} s"
            if got
            else "FAILED: " + "".join((run.error or "").splitlines()[-1:])
        )
        print(f"[{i + 1}/{len(runs)}] {run.workload} {run.impl} (repeat {run.repeat + 1}): {what}", flush=True)
    rows = summarize(runs)
    print(write_outputs(args, rows, runs, skipped, meta))
    return 0 if rows and not any(r.error for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
