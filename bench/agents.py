"""PettingZoo envs as SB3 vector slots: shmvec's ``concat_vec_envs_v1`` against SuperSuit's.

For each env, three vector envs over ``pettingzoo_env_to_vec_env_v1(env)``, as an SB3 user
builds them (``base_class="stable_baselines3"``):

- ``supersuit k=0``: SuperSuit's ``concat_vec_envs_v1(..., num_cpus=0)`` (``ConcatVecEnv``, one process);
- ``supersuit k=2``: ``num_cpus=2`` (``ProcConcatVec``, two worker processes);
- ``shmvec``: ``shmvec.concat_vec_envs_v1`` with no ``num_cpus`` (shmvec chooses its layout).

Numbers each: **bare** stepping (agent steps per second: vector steps x slots / seconds, the
same pre-drawn random actions for all, after a warm-up), the wall time of SB3
``PPO("MlpPolicy").learn()`` (four rollouts: with two, the first rollout's warm-up weighed as much
as the stepping; model construction not timed) and of the **job** (build + learn + close: what a
user waits for, the layout choice and worker start-up included).
Every (env, vector env) runs in a fresh process that imports torch first, as a training script
does; they take turns, their order rotated each round, and the tables give medians over rounds
and ratios: SuperSuit's faster / shmvec's (above 1: shmvec is faster).

Two comparisons, alternating in each round:

- **defaults**: torch's own thread count everywhere, what a user sees (shmvec lowers torch's
  threads to 1 while the policy is light and workers step, and says so in its ``repr``);
- **equal threads**: ``torch.set_num_threads(1)`` in every run, what the stepping itself does.

Envs (skipped with the reason when their package is missing): MPE2 ``simple_spread_v3`` (3
agents), KAZ (``knights_archers_zombies_v11``, vector observations, 4 agents, SuperSuit's
``black_death_v3`` as its tutorial: SuperSuit needs it where agents die), ``multiwalker_v9`` (3
walkers, ``black_death_v3``; needs box2d) and ``pursuit_v5`` (8 pursuers). Usage::

    python bench/agents.py --quick                    # one round, short runs (~4 min on 2 cores)
    python bench/agents.py                            # 3 rounds
    python bench/agents.py --envs simple_spread,kaz --rounds 5 --modes equal
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

if __package__ in (None, ""):  # run as a script: bench/ as this checkout's package (agents_pufferlib)
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [os.path.dirname(_here), *(p for p in sys.path if os.path.abspath(p or ".") != _here)]

SUPERSUIT_CPUS = {"supersuit k=0": 0, "supersuit k=2": 2}
IMPLS: tuple[str, ...] = ("supersuit k=0", "supersuit k=2", "shmvec")
# PufferLib's PettingZoo emulation and Multiprocessing vectorization, where pufferlib-core imports
# (bench/agents_pufferlib.py: a venv of its own, as it pins another torch)
PUFFERLIB = "pufferlib"
MODES = {"defaults": None, "equal": 1}  # torch.set_num_threads in every run (None: torch's own)


@dataclass(frozen=True)
class AgentEnv:
    make: Callable[[], object]  # a PettingZoo ParallelEnv, wrapped as SuperSuit needs it
    copies: int
    needs: tuple[str, ...]  # modules that must import


def _simple_spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=25)


def _kaz():
    import supersuit as ss
    from pettingzoo.butterfly import knights_archers_zombies_v11

    return ss.black_death_v3(knights_archers_zombies_v11.parallel_env(max_zombies=4, obs_method="vector"))


def _multiwalker():
    import supersuit as ss
    from pettingzoo.sisl import multiwalker_v9

    return ss.black_death_v3(multiwalker_v9.parallel_env())


def _pursuit():
    from pettingzoo.sisl import pursuit_v5

    return pursuit_v5.parallel_env()


ENVS = {
    "simple_spread": AgentEnv(_simple_spread, 8, ("mpe2",)),
    "kaz": AgentEnv(_kaz, 8, ("pygame",)),
    "multiwalker": AgentEnv(_multiwalker, 4, ("pygame", "Box2D")),
    "pursuit": AgentEnv(_pursuit, 4, ("pygame", "scipy")),
}


def missing(env_name: str) -> str | None:
    """Why ``env_name`` cannot run here (a module that does not import), or None."""
    for module in ("pettingzoo", "supersuit", "stable_baselines3", *ENVS[env_name].needs):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{env_name}: {module} does not import ({exc})"
    return None


def build(env_name: str, impl: str, copies: int | None = None):
    """The SB3 vector env ``impl`` over ``copies`` copies of ``env_name`` (default: the env's own count)."""
    import supersuit as ss

    spec = ENVS[env_name]
    copies = spec.copies if copies is None else copies
    if impl == PUFFERLIB:
        from bench import agents_pufferlib

        cores = len(os.sched_getaffinity(0))
        return agents_pufferlib.build(env_name, copies, max(w for w in range(1, cores + 1) if copies % w == 0))
    vec_env = ss.pettingzoo_env_to_vec_env_v1(spec.make())
    if impl == "shmvec":
        import shmvec

        return shmvec.concat_vec_envs_v1(vec_env, copies, base_class="stable_baselines3")
    return ss.concat_vec_envs_v1(vec_env, copies, num_cpus=SUPERSUIT_CPUS[impl], base_class="stable_baselines3")


def bare_steps_per_second(venv, steps: int, warmup: int) -> float:
    """Agent steps per second over ``steps`` vector steps of seeded random actions, after ``warmup`` steps."""
    venv.action_space.seed(0)
    actions = [np.stack([venv.action_space.sample() for _ in range(venv.num_envs)]) for _ in range(steps + warmup)]
    venv.reset()
    for action in actions[:warmup]:
        venv.step(action)
    start = time.perf_counter()
    for action in actions[warmup:]:
        venv.step(action)
    return steps * venv.num_envs / (time.perf_counter() - start)


def learn_seconds(venv, n_steps: int, rollouts: int) -> float:
    """Seconds of ``PPO("MlpPolicy", venv, n_steps=n_steps).learn(rollouts x n_steps x slots)``."""
    import torch
    from stable_baselines3 import PPO

    torch.manual_seed(0)  # not PPO(seed=...): through SuperSuit's wrapper it fails (no seed())
    model = PPO("MlpPolicy", venv, n_steps=n_steps, batch_size=min(256, n_steps * venv.num_envs), device="cpu")
    start = time.perf_counter()
    model.learn(rollouts * n_steps * venv.num_envs)
    return time.perf_counter() - start


def measure(env_name: str, impl: str, steps: int, warmup: int, n_steps: int, rollouts: int, copies=None) -> dict:
    """Two runs of ``impl`` on ``env_name``: bare agent steps/s over one vector env; then a job
    (build, ``learn()``, close) over another, its seconds and its ``learn()``'s; and the vector env's repr."""
    venv = build(env_name, impl, copies)
    try:
        result = {"slots": venv.num_envs, "vec_env": repr(getattr(venv, "venv", venv))}
        result["steps_per_s"] = bare_steps_per_second(venv, steps, warmup)
    finally:
        venv.close()
    start = time.perf_counter()
    venv = build(env_name, impl, copies)
    try:
        result["learn_s"] = learn_seconds(venv, n_steps, rollouts)
    finally:
        venv.close()
    result["job_s"] = time.perf_counter() - start
    return result


def run_child(env_name: str, impl: str, args: argparse.Namespace, threads: int | None = None) -> dict:
    """:func:`measure` in a fresh interpreter that imports torch first, as a training script does
    (``threads``: its ``torch.set_num_threads``; None: torch's own)."""
    command = [sys.executable, os.path.abspath(__file__), "--child", env_name, impl, *_sizes(args)]
    command += [f"--torch-threads={threads}"] if threads else []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=args.child_timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{env_name} / {impl} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sizes(args: argparse.Namespace) -> list[str]:
    return [
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--n-steps={args.n_steps}",
        f"--rollouts={args.rollouts}",
    ]


def rotated(items: tuple[str, ...] | list[str], r: int) -> list[str]:
    """``items`` rotated by ``r``: round ``r`` starts with a different vector env."""
    items = list(items)
    return items[r % len(items) :] + items[: r % len(items)]


def summarize(runs: dict[tuple[str, str], list[dict]]) -> dict[str, dict[str, dict]]:
    """``{env: {impl: {steps_per_s, learn_s, job_s (medians), slots, vec_env, rounds}}}``."""
    out: dict[str, dict[str, dict]] = {}
    for (env_name, impl), found in runs.items():
        out.setdefault(env_name, {})[impl] = {
            "steps_per_s": statistics.median(r["steps_per_s"] for r in found),
            "learn_s": statistics.median(r["learn_s"] for r in found),
            "job_s": statistics.median(r.get("job_s", float("nan")) for r in found),
            "slots": found[0]["slots"],
            "vec_env": found[0]["vec_env"],
            "rounds": len(found),
        }
    return out


def table(summary: dict[str, dict[str, dict]], impls: tuple[str, ...] = IMPLS) -> str:
    """Markdown: per env, each vector env's medians and shmvec's ratios to the faster SuperSuit one
    (bare stepping, ``learn()``, the whole job), and to PufferLib's where it ran."""
    puffer = PUFFERLIB in impls
    header = ["env", "slots"]
    for what, unit in (("bare", "steps/s"), ("learn", "s"), ("job", "s")):
        header += [*(f"{i} {what} {unit}" for i in impls), f"{what}: shmvec / best SuperSuit"]
        header += [f"{what}: shmvec / PufferLib"] if puffer else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for env_name, rows in summary.items():
        cells = [env_name, str(next(iter(rows.values()))["slots"])]
        for key, faster in (("steps_per_s", max), ("learn_s", min), ("job_s", min)):
            values = {i: rows[i][key] if i in rows else float("nan") for i in impls}
            speed = (lambda x: x) if key == "steps_per_s" else (lambda x: 1 / x)  # above 1: shmvec faster
            best = faster(values["supersuit k=0"], values["supersuit k=2"])
            cells += [f"{x:,.0f}" if key == "steps_per_s" else f"{x:.2f}" for x in values.values()]
            cells.append(f"{speed(values['shmvec']) / speed(best):.2f}x")
            cells += [f"{speed(values['shmvec']) / speed(values[PUFFERLIB]):.2f}x"] if puffer else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated, of {', '.join(ENVS)}")
    p.add_argument("--rounds", type=int, default=None, help="turns of every vector env (medians over them; default 3)")
    p.add_argument("--steps", type=int, default=500, help="timed vector steps of bare stepping")
    p.add_argument("--warmup", type=int, default=50, help="vector steps before the timed ones")
    p.add_argument("--n-steps", type=int, default=128, help="PPO's n_steps (per slot)")
    p.add_argument(
        "--rollouts", type=int, default=4, help="PPO rollouts per learn() (default 4: 12,288 steps on simple_spread)"
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated, of defaults (torch's own threads) and equal (torch at 1 thread in every run)",
    )
    p.add_argument("--torch-threads", type=int, default=None, help=argparse.SUPPRESS)  # a child's
    p.add_argument(
        "--quick", action="store_true", help="100 steps, PPO rollouts of 32 steps, one round unless --rounds"
    )
    p.add_argument("--child-timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=2, metavar=("ENV", "IMPL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.n_steps, args.rollouts = 100, 10, 32, 2
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    args.envs = [e for e in args.envs.split(",") if e]
    unknown = [e for e in args.envs if e not in ENVS]
    if unknown:
        p.error(f"unknown envs {unknown}: choose among {', '.join(ENVS)}")
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: choose among {', '.join(MODES)}, got {args.modes}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        import torch  # first, as a training script imports it

        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        env_name, impl = args.child
        print(json.dumps(measure(env_name, impl, args.steps, args.warmup, args.n_steps, args.rollouts)))
        return 0
    envs = []
    for env_name in args.envs:
        why = missing(env_name)
        if why:
            print(f"skipped {why}")
        else:
            envs.append(env_name)
    impls = IMPLS
    from bench import agents_pufferlib

    why = agents_pufferlib.available()
    if why:
        print(f"skipped PufferLib: {why}")
    else:
        impls = (*IMPLS, PUFFERLIB)
    runs: dict[str, dict[tuple[str, str], list[dict]]] = {mode: {} for mode in args.modes}
    for r in range(args.rounds):
        for env_name in envs:
            for mode in rotated(args.modes, r):
                for impl in rotated(impls, r):
                    result = run_child(env_name, impl, args, MODES[mode])
                    runs[mode].setdefault((env_name, impl), []).append(result)
                    print(
                        f"round {r}, {mode}: {env_name} {impl}: {result['steps_per_s']:,.0f} agent steps/s, "
                        f"learn {result['learn_s']:.2f} s, job {result['job_s']:.2f} s",
                        flush=True,
                    )
    for mode in args.modes:
        summary = summarize(runs[mode])
        threads = "torch's own" if MODES[mode] is None else f"{MODES[mode]} in every run"
        print(
            f"\n{mode}: PettingZoo envs as SB3 vector slots, {os.cpu_count()} CPUs, torch threads: {threads}, "
            f"medians of {args.rounds} rounds (bare: {args.steps} vector steps; learn: PPO, {args.rollouts} "
            f"rollouts of {args.n_steps} steps; job: build + learn + close)\n"
        )
        print(table(summary, impls))
        print("\n" + "\n".join(f"{e} {i}: {row['vec_env']}" for e, rows in summary.items() for i, row in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
