"""The release gate: this tree against a reference commit on the training matrix, side by side.

    python bench/gate.py --against 5f49815            # the full matrix, 3 rounds (~1 h on 2 cores)
    python bench/gate.py --against HEAD~1 --quick     # the rows that catch most, ~10 min on 2 cores
    python bench/gate.py --against v1 --rows ppo-halfcheetah,bare --rounds 5

The reference is checked out as a ``git worktree`` under ``.gate/`` (kept for the next run).
Both sides run in the same interpreter, so the packages are the same and only shmvec's code
differs: a child process of the reference imports shmvec from the worktree, a child of the
current tree from this checkout (``--ref-python`` runs the reference in another venv).

Each row is measured in fresh processes: its reference implementation (DummyVecEnv for SB3,
SyncVectorEnv for the scripts and the bare loop; none for the CPU and start-up rows), the reference commit
(REF) and this tree (current), one after the other, their order rotated each round. A round
gives a paired ratio, REF's cost / current's cost (above 1: current is faster), so a phase in
which the machine runs slow touches both sides of a ratio. The table gives each row's medians,
the median ratio and its spread over the rounds, and a verdict: SLOWER when every round's ratio
is below 1 and their median is below ``1 - --noise``. The exit status is 1 if any row is
SLOWER or failed.

Rows: the SB3 and CleanRL-style workloads of :mod:`bench.training_jobs` (wall time of the whole
``learn()`` / script loop; ``cleanrl-acrobot``: ``examples/ppo_sync.py`` on 8 Acrobots),
``rl-zoo-ppo`` (RL Zoo's own ``train.py``, PPO CartPole-v1 at RL Zoo's hyperparameters and its own
``n_timesteps``, read from the installed ``rl_zoo3``'s ``hyperparams/ppo.yml``: 100,000 steps with
its default evaluation every 25,000; ``--vec-env subproc`` mapped to ``ShmPoolVecEnv``'s defaults
against ``--vec-env dummy``; ``--scale`` shortens it) and ``rl-zoo-ppo-20k`` (the same for 20,000
steps, no evaluation), both skipped without ``rl_zoo3``; ``agents-ppo`` (SB3 PPO ``learn()`` on
MPE2 simple_spread's agents as vector slots, ``shmvec.concat_vec_envs_v1``'s default against
SuperSuit's single-process one; "new" against a tree without it), ``bare`` (CartPole x64 stepped by
``ShmVectorEnv``'s default against ``SyncVectorEnv``, steps/s), ``bare-2workers`` (the same on
``n_workers=2``), ``startup-cold`` and ``startup-warm`` (seconds to build SB3's
``make_vec_env("CartPole-v1", 8, vec_env_cls=ShmPoolVecEnv)`` in a fresh process that imported
stable_baselines3, the plan memory a fresh file: the process's first pool, and a second identical
one after the first was closed; no reference), ``cpu-per-env`` and
``cpu-per-worker`` (the main thread's CPU time per step that each env and each worker adds, µs,
from two layouts each: the Amdahl terms of a big machine; ``ShmPoolVecEnv``'s, and with ``-gym``
``ShmVectorEnv``'s), and ``inproc-sb3-N`` / ``inproc-gym-N``
(N = 1, 4, 8 CartPoles, every env in the process: ``ShmPoolVecEnv`` against ``DummyVecEnv``,
``ShmVectorEnv`` against ``SyncVectorEnv``). A fixed tax of a few µs a step is below what fresh
processes resolve, so an in-process row's child holds its reference too and alternates the two
in blocks: its value is the median paired ratio, reference time / shmvec time ("x Dummy"), and
the row compares REF's ratio with current's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

if __package__ in (None, ""):  # run as a script: this checkout's bench/, never bench/'s modules as top-level ones
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here), *(p for p in sys.path if os.path.abspath(p or ".") != _here)]

from bench.training_jobs import REPO, WORKLOADS, ScriptWorkload  # noqa: E402

TRAINING_ROWS = (
    "ppo-cartpole",
    "ppo-halfcheetah",
    "ppo-humanoid",
    "a2c-cartpole",
    "her-fetchreach",
    "maskable-ppo",
    "cleanrl-cartpole",
    "cleanrl-acrobot",
    "cleanrl-halfcheetah",
)
IN_PROCESS_ROWS = tuple(f"inproc-{adapter}-{n}" for adapter in ("sb3", "gym") for n in (1, 4, 8))
CPU_ROWS = ("cpu-per-env", "cpu-per-worker", "cpu-per-env-gym", "cpu-per-worker-gym")
STARTUP_ROWS = ("startup-cold", "startup-warm")
RL_ZOO_ROWS = ("rl-zoo-ppo", "rl-zoo-ppo-20k")
PROBE_ROWS = (*RL_ZOO_ROWS, "agents-ppo", "bare", "bare-2workers", *STARTUP_ROWS, *CPU_ROWS, *IN_PROCESS_ROWS)
QUICK_ROWS = ("ppo-cartpole", "ppo-halfcheetah", "cleanrl-cartpole", "bare", "cpu-per-env")
QUICK_IN_PROCESS = ("inproc-sb3-1", "inproc-gym-1")  # where a fixed tax weighs most; ~25 s for 3 rounds
QUICK = {"rows": QUICK_ROWS + QUICK_IN_PROCESS, "scale": 0.5}
GATE_DIR = os.path.join(REPO, ".gate")


@dataclass
class Row:
    """One row's samples: {side: [value per round]}; ``higher_is_better`` for throughputs."""

    name: str
    unit: str
    higher_is_better: bool = False
    values: dict[str, list[float]] = field(default_factory=dict)
    described: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    absent: dict[str, str] = field(default_factory=dict)  # side: why that tree has no such row

    def ratios(self) -> list[float]:
        """Per round: REF's cost / current's (above 1: current is better)."""
        pairs = zip(self.values.get("ref", []), self.values.get("current", []))
        return [c / r if self.higher_is_better else r / c for r, c in pairs if r > 0 and c > 0]

    def verdict(self, noise: float) -> str:
        ratios = self.ratios()
        if "ref" in self.absent and not self.errors and self.values.get("current"):
            return "new"  # nothing to compare it with: REF has no such thing
        if self.errors or not ratios:
            return "FAILED"
        if max(ratios) < 1.0 and statistics.median(ratios) < 1.0 - noise:
            return "SLOWER"
        return "ok"


def rows_of(names: Sequence[str]) -> list[Row]:
    rows = []
    for name in names:
        if name.startswith("bare"):
            rows.append(Row(name, "steps/s", higher_is_better=True))
        elif name.startswith("cpu-"):
            rows.append(Row(name, "µs"))
        elif name.startswith("inproc-"):
            rows.append(Row(name, "x Dummy" if "-sb3-" in name else "x Sync", higher_is_better=True))
        else:
            rows.append(Row(name, "s"))
    return rows


def sides_of(row: Row) -> list[str]:
    """The children of a round: the in-process rows hold their reference in the child itself; the CPU and
    start-up rows have none."""
    no_reference = row.name.startswith(("cpu-", "inproc-", "startup-"))
    return ["ref", "current"] if no_reference else ["reference", "ref", "current"]


def missing(name: str) -> str | None:
    """Why row ``name`` cannot run here, or None."""
    if name in WORKLOADS:
        return WORKLOADS[name].missing()
    if name in RL_ZOO_ROWS and importlib.util.find_spec("rl_zoo3") is None:
        return "needs rl_zoo3, not installed (pip install rl_zoo3, or shmvec's [bench] extra)"
    if name == "agents-ppo":
        absent = [m for m in ("pettingzoo", "supersuit", "mpe2") if importlib.util.find_spec(m) is None]
        if absent:
            return f"needs {', '.join(absent)}, not installed (shmvec's [bench] extra)"
    return None


# -- the parent: worktree, children, table ----------------------------------------------------


def worktree(ref: str) -> tuple[str, str]:
    """(commit, import root) of a worktree of ``ref`` under .gate/, made if absent. The import root
    is a folder whose only entry is a link to the worktree's ``shmvec``: the jobs' own modules
    (``bench``, the examples) come from this checkout on both sides."""
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = os.path.join(GATE_DIR, commit[:12])
    if not os.path.isdir(path):
        subprocess.run(
            ["git", "-C", REPO, "worktree", "add", "--detach", path, commit], check=True, capture_output=True
        )
    root = path + ".path"
    if not os.path.isdir(root):
        os.makedirs(root)
        os.symlink(os.path.join(path, "shmvec"), os.path.join(root, "shmvec"))
    return commit, root


def command(row: str, side: str, tree: str, scale: float, python: str) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment: ``side``'s implementation of ``row``, shmvec from ``tree``."""
    # the tree's shmvec first, then this checkout (bench, the examples' helpers)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, REPO, os.environ.get("PYTHONPATH")]))}
    workload = WORKLOADS.get(row)
    if isinstance(workload, ScriptWorkload):
        impl = workload.reference if side == "reference" else "shm"
        argv = workload.command(impl, scale, "cpu")
        return [python, *argv[1:]], env
    impl = "reference" if side == "reference" else "shm"
    return [python, "-m", "bench.gate_child", row, impl, str(scale), tree], env


def run_child(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    # Not run in this checkout: a forkserver imports from its working directory first (Python 3.11)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=GATE_DIR, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-800:]}")
    return json.loads(lines[-1])


def measure(rows: list[Row], trees: dict[str, str], args: argparse.Namespace) -> None:
    pythons = {"reference": sys.executable, "ref": args.ref_python or sys.executable, "current": sys.executable}
    for round_ in range(args.rounds):
        for row in rows:
            sides = sides_of(row)
            shift = round_ % len(sides)
            for side in sides[shift:] + sides[:shift]:
                argv, env = command(row.name, side, trees[side], args.scale, pythons[side])
                try:
                    result = run_child(argv, env, args.timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    row.errors.append(f"{side} (round {round_ + 1}): {exc}")
                    print(f"[round {round_ + 1}] {row.name} {side}: FAILED {str(exc)[-300:]}", flush=True)
                    continue
                if "absent" in result:
                    row.absent[side] = result["absent"]
                    print(f"[round {round_ + 1}] {row.name} {side}: {result['absent']}", flush=True)
                    continue
                value = result["total"] if "total" in result else result["value"]
                row.values.setdefault(side, []).append(value)
                row.described.setdefault(side, result.get("vec_env", ""))
                print(f"[round {round_ + 1}] {row.name} {side}: {value:,.2f} {row.unit}", flush=True)


def _median(values: list[float] | None) -> str:
    return f"{statistics.median(values):,.2f}" if values else "-"


def report(rows: list[Row], commit: str, args: argparse.Namespace) -> str:
    from bench.markdown import table

    head = (
        f"Release gate: this tree ({current_commit()}) against {args.against} ({commit[:10]}), {args.rounds} rounds, "
        f"scale {args.scale}, {len(os.sched_getaffinity(0))} usable cores. Medians; ratio = REF's cost / current's "
        f"per round (above 1: current is better), median [min-max]; SLOWER: every round below 1 and the median "
        f"below {1 - args.noise:.2f}."
    )
    body = []
    for row in rows:
        ratios = row.ratios()
        spread = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]" if ratios else "-"
        reference = row.values.get("reference")
        versus = "-"
        if row.unit.startswith("x ") and row.values.get("ref") and row.values.get("current"):
            versus = " / ".join(f"{statistics.median(row.values[s]):.2f}x" for s in ("ref", "current"))
        elif reference and row.values.get("current") and row.values.get("ref"):
            ref_m, cur_m, dum_m = (statistics.median(row.values[s]) for s in ("ref", "current", "reference"))
            flip = row.higher_is_better
            versus = (
                f"{(ref_m / dum_m if flip else dum_m / ref_m):.2f}x / {(cur_m / dum_m if flip else dum_m / cur_m):.2f}x"
            )
        elif reference and row.values.get("current"):  # a row new in this tree: current against the reference only
            cur_m, dum_m = statistics.median(row.values["current"]), statistics.median(reference)
            versus = f"- / {(cur_m / dum_m if row.higher_is_better else dum_m / cur_m):.2f}x"
        body.append(
            [
                row.name,
                row.unit,
                _median(reference),
                _median(row.values.get("ref")),
                _median(row.values.get("current")),
                spread,
                versus,
                row.verdict(args.noise),
            ]
        )
    text = (
        head
        + "\n\n"
        + table(
            ["row", "unit", "Dummy/Sync", "REF", "current", "current vs REF", "REF / current vs Dummy", "verdict"], body
        )
    )
    layouts = [f"- {row.name} {side}: `{d}`" for row in rows for side, d in row.described.items() if d]
    if layouts:
        text += "\n\nLayouts (first round):\n\n" + "\n".join(layouts)
    if errors := [f"- {row.name} {e}" for row in rows for e in row.errors]:
        text += "\n\nFailures:\n\n" + "\n".join(errors)
    return text + "\n"


def current_commit() -> str:
    done = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="the reference commit (a tag, a hash, HEAD~1)")
    p.add_argument("--quick", action="store_true", help=f"rows {', '.join(QUICK['rows'])} at scale {QUICK['scale']}")
    p.add_argument("--rows", help=f"comma-separated, of {', '.join(TRAINING_ROWS + PROBE_ROWS)}")
    p.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--scale", type=float, help="multiplies the training rows' timesteps (default 1, quick 0.5)")
    p.add_argument("--noise", type=float, default=0.05, help="a median ratio within 1 - noise is never SLOWER")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one child may take")
    p.add_argument("--ref-python", help="the interpreter of the reference's own venv (default: this one)")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args = p.parse_args(argv)
    if not args.against:
        p.error("--against REF is required")
    names = args.rows.split(",") if args.rows else list(QUICK["rows"] if args.quick else TRAINING_ROWS + PROBE_ROWS)
    unknown = [n for n in names if n not in TRAINING_ROWS + PROBE_ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {', '.join(TRAINING_ROWS + PROBE_ROWS)}")
    args.names = [n for n in names if n in PROBE_ROWS or n in WORKLOADS]
    args.scale = (QUICK["scale"] if args.quick else 1.0) if args.scale is None else args.scale
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    commit, ref_tree = worktree(args.against)
    rows = rows_of(args.names)
    skipped = [f"{n}: {why}" for n in args.names if (why := missing(n))]
    rows = [r for r in rows if not missing(r.name)]
    start = time.perf_counter()
    measure(rows, {"reference": REPO, "ref": ref_tree, "current": REPO}, args)
    text = report(rows, commit, args)
    if skipped:
        text += "\nSkipped: " + "; ".join(skipped) + "\n"
    text += f"\n({time.perf_counter() - start:.0f} s)\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if all(r.verdict(args.noise) in ("ok", "new") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
