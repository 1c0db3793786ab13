"""Run a benchmark grid and write a Markdown report with PNG plots.

Usage (from the repository root)::

    python bench/report.py                       # quick grid -> bench/results/
    python bench/report.py --grid full --out /tmp/full
    python bench/report.py --grid custom --envs CartPole-v1,synth:1ms:4 --n 8,64 --k 1,2
    python bench/report.py --targets             # only the issue's target ratios, PASS/FAIL
    python bench/report.py --targets --target-set default   # only the default configuration's
    python bench/report.py --sections async --out docs/bench   # async batches: appended to report.md
    python bench/report.py --sections ray --out docs/bench     # backend="ray": appended to report.md

Sections (``--sections``): ``grid`` (throughput per implementation/env/N/K, speed-up over
DummyVecEnv, plots), ``overhead`` (zero-cost env: per-step overhead, fitted
``a + b*N``, and the overhead model checked against the grid), ``memory`` (peak
PSS/USS/RSS of the process tree with 84x84x4 uint8 observations), ``targets``, ``async``
(send/recv vs synchronous steps: stragglers, overlap, the PPO examples), ``ray``
(backend="ray" per-step overhead on simulated nodes, break-even model). Run alone,
``async`` or ``ray`` replaces its section in an existing ``--out/report.md`` and leaves the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `shmvec` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tqdm import tqdm  # noqa: E402

from bench import markdown as md  # noqa: E402
from bench.impls import CORES, IMPLS, SHMVEC  # noqa: E402
from bench.measure import SMOKE_TIMING, Plan, Result, Timing, measure_cell, plan_grid, preload_forkserver  # noqa: E402
from bench.memory import measure_memory_isolated  # noqa: E402
from bench.overhead import fit_overheads, model_points  # noqa: E402
from bench.targets import AUTO, DEFAULT_TARGETS, all_targets, plan_targets, run_targets  # noqa: E402
from bench.workloads import IMAGE_150US, ZERO_COST, get_workload, raw_step_cost  # noqa: E402

SECTIONS = ("grid", "overhead", "memory", "targets", "async", "ray")
KS = list(range(1, CORES + 1))


@dataclass(frozen=True)
class Preset:
    """A named grid: envs, N, K, timing, and the N of the overhead and memory sections."""

    envs: list[str]
    ns: list[int]
    timing: Timing
    overhead_ns: list[int]
    memory_ns: list[int]
    ks: list[int] = field(default_factory=lambda: KS)


HEAVY = ["HumanoidStandup-v5", "ALE/Breakout-v5"]
PRESETS = {
    "smoke": Preset(["CartPole-v1", ZERO_COST], [2, 4], SMOKE_TIMING, [1, 2], [4]),
    "quick": Preset(
        ["CartPole-v1", "Acrobot-v1", IMAGE_150US, "synth:1ms:4", *HEAVY],
        [1, 8, 64],
        Timing(warmup_time=0.2, block_time=0.3, repeats=3),
        [1, 8, 64],
        [16],
    ),
    "full": Preset(
        [
            "CartPole-v1",
            "Acrobot-v1",
            *HEAVY,
            "synth:1us:4",
            "synth:10us:4",
            "synth:100us:4",
            "synth:1ms:4",
            "synth:10ms:4",
            IMAGE_150US,
            "synth:100us:512x512x4:uint8",
            "synth:100us:1024x1024x4:uint8",
        ],
        [1, 2, 4, 8, 16, 32, 64, 128, 256],
        Timing(warmup_time=0.5, block_time=0.5, repeats=5),
        [1, 2, 4, 8, 16, 32, 64, 128, 256],
        [16, 64],
    ),
}
PRESETS["custom"] = PRESETS["quick"]
TARGET_TIMING = Timing(warmup_time=0.3, block_time=0.5, repeats=5)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Env names: Gymnasium ids or synth:<cost>:<shape>[:<dtype>], e.g. synth:150us:84x84x4:uint8",
    )
    p.add_argument(
        "--grid",
        choices=sorted(PRESETS),
        default="quick",
        help="preset grid (custom = quick timing + your --envs/--n/--k)",
    )
    p.add_argument("--envs", type=_csv(str), help="comma-separated env names (overrides the preset)")
    p.add_argument("--n", type=_csv(int), help="comma-separated N values")
    p.add_argument("--k", type=_csv(int), help=f"comma-separated K values (default 1..{CORES})")
    p.add_argument("--impls", type=_csv(str), default=list(IMPLS), help=f"subset of {','.join(IMPLS)}")
    p.add_argument("--repeats", type=int, help="round-robin samples per configuration (median quoted)")
    p.add_argument("--block-time", type=float, help="seconds per timed sample")
    p.add_argument("--warmup-time", type=float, help="seconds of warm-up steps per vector env")
    p.add_argument("--max-procs", type=int, default=64, help="skip one-process-per-env implementations above this N")
    p.add_argument(
        "--sections", type=_csv(str), default=["grid", "overhead", "memory"], help=f"any of {','.join(SECTIONS)}"
    )
    p.add_argument("--ppo-timesteps", type=int, default=50_000, help="async section: timesteps of each PPO run")
    p.add_argument("--targets", action="store_true", help="only check the target ratios (same as --sections targets)")
    p.add_argument(
        "--target-set",
        choices=("all", "default"),
        default="all",
        help="targets section: every target, or only the default configuration's",
    )
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), help="output directory"
    )
    args = p.parse_args(argv)
    if args.targets:
        args.sections = ["targets"]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    if args.grid == "custom" and not (args.envs or args.n or args.k):
        p.error("--grid custom needs at least one of --envs, --n, --k")
    return args


def _csv(kind):
    def parse(text: str) -> list:
        return [kind(x) for x in text.split(",") if x.strip()]

    return parse


def run_plan(plan: Plan, timing: Timing, desc: str) -> list[Result]:
    """Measure every cell of ``plan`` with a progress bar; return all results."""
    results = []
    with tqdm(total=plan.n_samples * timing.repeats, desc=desc, unit="sample", file=sys.stderr) as bar:
        for cell in plan.cells:
            c = cell[0]
            bar.set_postfix_str(f"{c.workload} N={c.n}")
            results += measure_cell(cell, timing, on_sample=lambda _: bar.update())
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preload_forkserver()
    if args.sections in (["async"], ["ray"]):
        return write_alone(args, argv, args.sections[0])
    preset = PRESETS[args.grid]
    timing = replace(
        preset.timing,
        **{
            k: v
            for k, v in {
                "repeats": args.repeats,
                "block_time": args.block_time,
                "warmup_time": args.warmup_time,
            }.items()
            if v is not None
        },
    )
    envs, ns, ks = args.envs or preset.envs, args.n or preset.ns, args.k or preset.ks
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    doc = [
        "# shmvec benchmark report",
        f"Machine: {machine()}. Command: `{command(argv)}`. "
        f"Timing: {timing.repeats} round-robin samples of ~{timing.block_time}s per configuration after "
        f"{timing.warmup_time}s warm-up; medians quoted. Throughput = env.step() calls per second (vector steps x N).",
    ]
    skipped: list[str] = []
    dump: dict = {"args": vars(args), "timing": asdict(timing)}

    results: list[Result] = []
    if "grid" in args.sections:
        plan = plan_grid(envs, ns, ks, args.impls, max_procs=args.max_procs)
        skipped += plan.skipped
        results = run_plan(plan, timing, "grid")
        dump["grid"] = [r.to_dict() for r in results]
        doc += [
            "## Throughput (env steps/s, median; in brackets: speed-up over SB3 DummyVecEnv)",
            md.throughput_tables(results),
        ]
        light = {e for e in envs if get_workload(e).light}
        doc += ["### Light envs: never meaningfully slower than DummyVecEnv?", md.slower_than_dummy(results, light)]
        from bench.plots import plot_all

        files = plot_all(results, args.out)
        doc += ["### Plots", "\n".join(f"![{f}]({f})" for f in files)]

    if "overhead" in args.sections:
        plan = plan_grid(
            [ZERO_COST], preset.overhead_ns if not args.n else args.n, ks, args.impls, max_procs=args.max_procs
        )
        zero = run_plan(plan, timing, "overhead")
        fits = fit_overheads(zero)
        dump["overhead"] = [r.to_dict() for r in zero]
        doc += [
            "## Per-step overhead, no env work (`synth:0us:4`)",
            "Seconds per synchronous vector step with a zero-cost env, fitted as `t_overhead(N) = a + b*N`.",
            md.overhead_table(fits),
        ]
        from bench.plots import model_plot, overhead_plot

        doc.append(f"![overhead]({overhead_plot(fits, os.path.join(args.out, 'overhead.png'))})")
        if results:
            measured_envs = [e for e in dict.fromkeys(r.config.workload for r in results) if e != ZERO_COST]
            t_env = {
                e: raw_step_cost(get_workload(e)) for e in tqdm(measured_envs, desc="raw env cost", file=sys.stderr)
            }
            points = model_points(results, fits, t_env)
            dump["t_env"] = t_env
            doc += [
                "### Overhead model",
                "`fps_model = N / (N*t_env/P + t_overhead(N))`, i.e. "
                "`fps / (P/t_env) = N*t_env/P / (N*t_env/P + t_overhead)` with P envs stepping at once "
                "(1 in-process, min(K, cores) for shmvec, min(N, cores) for one process per env); "
                "with P = 1 this is `fps_parallel/fps_serial = N*t_env/(N*t_env + t_overhead)`. "
                "t_env is the raw single-env step cost measured in this process:",
                md.env_cost_table(t_env),
                md.model_table(points),
                f"![model]({model_plot(points, os.path.join(args.out, 'overhead_model.png'))})",
            ]

    if "memory" in args.sections:
        mem_plan = plan_grid([IMAGE_150US], preset.memory_ns, [max(ks)], args.impls, max_procs=args.max_procs)
        configs = [c for cell in mem_plan.cells for c in cell]
        mems = [measure_memory_isolated(c) for c in tqdm(configs, desc="memory", file=sys.stderr)]
        dump["memory"] = [
            {**vars(m.config), "rss": m.rss, "uss": m.uss, "pss": m.pss, "processes": m.processes, "error": m.error}
            for m in mems
        ]
        doc += [
            f"## Peak memory, 84x84x4 uint8 observations (`{IMAGE_150US}`)",
            "Peak over build + reset + 1 s of steps of the whole process tree, minus the tree before building, "
            "each configuration in a fresh interpreter. "
            "PSS splits shared pages among the processes that map them (the honest total); USS counts private "
            "pages only (it can fall with fork: the parent's pages become shared); "
            "RSS counts shared pages once per process.",
            md.memory_table(mems),
        ]

    if "targets" in args.sections:
        targets = all_targets() if args.target_set == "all" else DEFAULT_TARGETS
        cells, checks = plan_targets(targets, [i for i in (*SHMVEC, *AUTO) if i in args.impls])
        total = sum(len(c) for c in cells) * TARGET_TIMING.repeats
        with tqdm(total=total, desc="targets", unit="sample", file=sys.stderr) as bar:
            checks, target_results = run_targets(
                timing=replace(TARGET_TIMING, **({"repeats": args.repeats} if args.repeats else {})),
                on_sample=lambda _: bar.update(),
                cells_and_checks=(cells, checks),
            )
        dump["targets"] = [r.to_dict() for r in target_results]
        doc += ["## Targets, each measured side by side in one run", md.targets_table(checks)]
        print("\n".join(c.line() for c in checks))

    if "async" in args.sections:
        text, dump["async"] = run_async_section(args, argv)
        doc.append(text)

    errors = md.errors_list(results)
    if skipped or errors:
        doc += ["## Skipped and failed", "\n".join(f"- {s}" for s in skipped) + ("\n" + errors if errors else "")]
    doc.append(f"_Wall time: {time.time() - started:.0f} s._")
    report = "\n\n".join(doc) + "\n"
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dump, f, indent=1, default=str)
    if "targets" not in args.sections:
        print(report)
    print(f"wrote {os.path.join(args.out, 'report.md')}", file=sys.stderr)
    return 0


def machine(with_platform: bool = True) -> str:
    where = f", {platform.platform()}" if with_platform else ""
    return f"{platform.machine()}, {CORES} cores, Python {platform.python_version()}{where}"


def command(argv: list[str] | None) -> str:
    return f"python bench/report.py {' '.join(argv if argv is not None else sys.argv[1:])}"


def run_async_section(args: argparse.Namespace, argv: list[str] | None) -> tuple[str, dict]:
    """Measure the async-batches section; its Markdown and its samples."""
    from bench import async_batches as ab

    overrides = {"repeats": args.repeats, "block_time": args.block_time, "warmup_time": args.warmup_time}
    timing = replace(ab.ASYNC_TIMING, **{k: v for k, v in overrides.items() if v is not None})
    ppo_repeats = args.repeats or 3
    total = 3 * 2 * timing.repeats + len(ab.PPO_CONFIGS) * 2 * ppo_repeats  # 3 micro comparisons of 2 loops
    with tqdm(total=total, desc="async", unit="sample", file=sys.stderr) as bar:
        section = ab.run_section(timing, args.ppo_timesteps, ppo_repeats, on_sample=bar.update)
    where = f"{machine()}, load average {os.getloadavg()[0]:.2f} at the end"
    return ab.markdown(section, where, command(argv), timing, ppo_repeats), section.to_dict()


def run_ray_section(args: argparse.Namespace, argv: list[str] | None) -> tuple[str, list]:
    """Measure the backend="ray" section (and draw its plot into ``--out``); its Markdown and its cells."""
    from bench import ray_overhead as ro

    with tqdm(total=len(ro.COSTS) * len(ro.SHAPES), desc="ray", unit="cell", file=sys.stderr) as bar:
        cells = ro.run(block_time=args.block_time or 0.5, repeats=args.repeats or 3, on_sample=bar.update)
    ro.plot(cells, os.path.join(args.out, "ray_overhead.png"))
    where = f"{machine(with_platform=False)}, load average {os.getloadavg()[0]:.2f} at the end"
    return ro.markdown(cells, where, command(argv), "ray_overhead.png"), ro.section_dict(cells)


def write_alone(args: argparse.Namespace, argv: list[str] | None, section: str) -> int:
    """``--sections async`` or ``ray`` alone: replace (or append) that section of ``--out/report.md``
    and its key of ``results.json``; keep the rest."""
    from bench.async_batches import HEADING as ASYNC_HEADING
    from bench.ray_overhead import HEADING as RAY_HEADING

    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    text, dump = (run_async_section if section == "async" else run_ray_section)(args, argv)
    text += f"\n\n_Wall time of this section: {time.time() - started:.0f} s._"
    report_path, json_path = os.path.join(args.out, "report.md"), os.path.join(args.out, "results.json")
    heading = ASYNC_HEADING if section == "async" else RAY_HEADING
    md.write_section(report_path, text, heading, new_file="# shmvec benchmark report\n")
    results = json.loads(Path(json_path).read_text()) if os.path.exists(json_path) else {}
    results[section] = dump
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(text)
    print(f"wrote {report_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
