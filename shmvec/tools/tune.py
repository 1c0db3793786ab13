"""``python -m shmvec.tune ENV --num-envs N``: measure ENV's vector envs on this machine, recommend one.

ENV is a registered Gymnasium id (``CartPole-v1``) or ``module:callable`` returning an
env. The tuner times one env's step (as ``n_workers=None`` does at start-up), then steps
SB3's ``DummyVecEnv`` and ``SubprocVecEnv``, Gymnasium's ``SyncVectorEnv`` and
``AsyncVectorEnv`` and every shmvec configuration :mod:`shmvec.planning.plan` considers,
all alive at once and taking turns (round-robin, medians), and prints a table and the
constructor line it recommends: the configuration ``n_workers=None`` chooses, which is
:func:`shmvec.planning.plan.choose` of the same timing; then ``envs.timings`` of that
configuration's last sample (the caller's share, the envs', ...: :mod:`shmvec.clocks.timings`).
Implementations that are not installed (SB3) are skipped.

Each step is followed by a stand-in policy's forward pass on the observations
(``--policy``, :mod:`shmvec.tools.stand_in`; default ``mlp``, SB3's MlpPolicy), since that is
the loop a vector env runs in: workers then wake up from a blocked wait every step, and
torch's threads share the cores. ``--policy none`` measures a bare stepping loop.

shmvec's rows start their processes as shmvec does by default: none is a fork of the tuner. The
references' rows are forks of it (``SubprocVecEnv(start_method="fork")``, ``AsyncVectorEnv`` with
multiprocessing's default, fork before Python 3.14), as they were measured before: their stepping
is what is compared, and a fresh process of theirs would import the tuner's script again (a
script without a ``__main__`` guard would run the tuner in each), lose envs registered at run
time, and import torch once per env (SB3's worker function), where shmvec's forkserver does not.

Example::

    python -m shmvec.tune CartPole-v1 --num-envs 64
    python -m shmvec.tune ALE/Breakout-v5 --num-envs 8 --policy cnn
    python -m shmvec.tune mypackage.envs:make_env --num-envs 16 --policy mypackage.nets:forward --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.gymnasium_1_1 import require_vector_api
from shmvec.planning import plan as autoconfig
from shmvec.planning.env_timing import time_env_and_machine
from shmvec.tools.demo import measure as steps_per_second
from shmvec.tools.stand_in import CHOICES, StandIn, stand_in_policy

MAX_PROCS = 64  # one-process-per-env implementations are skipped above this many envs


@dataclass
class Row:
    """One implementation measured: its name, how to build it, its samples (env steps/s)."""

    name: str
    api: str  # "sb3" or "gym"
    build: Callable[[], Any] = field(repr=False)
    plan: tuple[int, bool] | None = None  # shmvec rows: (n_workers, main_shard)
    predicted: float | None = None  # shmvec rows: the model's env steps/s
    samples: list[float] = field(default_factory=list)
    error: str | None = None
    timings: Any = field(default=None, repr=False)  # shmvec rows: envs.timings of the last sample

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def env_fn_from(spec: str) -> Callable[[], gym.Env]:
    """``module:callable`` -> that callable; anything else -> ``lambda: gym.make(spec)``."""
    if ":" in spec and not spec.startswith(":"):
        module, _, name = spec.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise SystemExit(f"cannot load {spec!r} ({exc}); expected a registered env id or module:callable") from None
    gym.spec(spec)  # a clear error for an unknown id before anything starts
    return _Make(spec)


class _Make:
    """A picklable ``gym.make(env_id)``."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self) -> gym.Env:
        return gym.make(self.env_id)


def plan_rows(
    env_fn: Callable[[], gym.Env],
    num_envs: int,
    cores: int,
    t_env: float,
    scale: float = 1.0,
    caller_computes: bool = True,
    cpu_share: float = 1.0,
    plan: autoconfig.Plan | None = None,
) -> list[Row]:
    """The implementations to measure: the references (those installed) and shmvec's candidates
    (for envs that wait, also worker counts beyond the cores: :func:`shmvec_candidates`), with
    ``plan``'s among them."""
    require_vector_api("shmvec.tune")  # it measures ShmVectorEnv and Gymnasium's vector envs
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

    from shmvec.adapters.vector import ShmVectorEnv

    fns = [env_fn] * num_envs
    rows = []
    try:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        rows.append(Row("DummyVecEnv", "sb3", lambda: DummyVecEnv(fns)))
        if num_envs <= MAX_PROCS:
            rows.append(Row("SubprocVecEnv", "sb3", lambda: SubprocVecEnv(fns, start_method="fork")))
    except ImportError:
        pass
    rows.append(Row("SyncVectorEnv", "gym", lambda: SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)))
    if num_envs <= MAX_PROCS:
        rows.append(
            Row(
                "AsyncVectorEnv",
                "gym",
                lambda: AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=AutoresetMode.SAME_STEP),
            )
        )
    pairs = shmvec_candidates(num_envs, cores, cpu_share)
    if plan is not None and (plan.n_workers, plan.main_shard) not in pairs:
        pairs.append((plan.n_workers, plan.main_shard))
    for k, main in pairs:
        step = autoconfig.predicted_step_time(num_envs, cores, t_env, k, main, scale, caller_computes, cpu_share)
        predicted = None if caller_computes else num_envs / step  # the model leaves the policy's time out
        args = autoconfig.explicit(num_envs, cores, k, main).constructor_args()
        rows.append(
            Row(
                f"shmvec {args}",
                "gym",
                lambda k=k, main=main: ShmVectorEnv(fns, k, use_main_process=main, autoreset_mode="SameStep"),
                (k, main),
                predicted,
            )
        )
    return rows


def shmvec_candidates(num_envs: int, cores: int, cpu_share: float = 1.0) -> list[tuple[int, bool]]:
    """The plan's candidates up to the cores; for envs that wait, also powers of two beyond them.

    Example:
        >>> shmvec_candidates(64, 2, cpu_share=0.01)[-4:]
        [(8, False), (16, False), (32, False), (64, False)]
    """
    pairs = autoconfig.candidates(num_envs, cores)
    if cpu_share < autoconfig.WAITING_SHARE:
        limit, k = autoconfig.max_lanes(num_envs), 2 * cores
        while k < limit:
            pairs.append((k, False))
            k *= 2
        pairs.append((limit, False))
    return list(dict.fromkeys(pairs))


def measure(
    rows: list[Row],
    num_envs: int,
    seconds: float,
    repeats: int,
    progress: Callable[[], None],
    policy: StandIn | None = None,
) -> None:
    """Build every row, then sample each ``repeats`` times round-robin (order rotated), ``seconds``
    each, with ``policy`` called on the observations between steps."""
    live = []
    try:
        for row in rows:
            try:
                env = row.build()
                space = env.action_space if row.api == "sb3" else env.single_action_space
                space.seed(0)
                actions = np.asarray([[space.sample() for _ in range(num_envs)] for _ in range(64)], dtype=space.dtype)
                env.reset() if row.api == "sb3" else env.reset(seed=0)
                steps_per_second(env, actions, min(0.2, seconds), policy)  # warm-up
                live.append((row, env, actions))
            except Exception as exc:
                row.error = f"{type(exc).__name__}: {exc}"
            progress()
        for r in range(repeats):
            turn = live[r % len(live) :] + live[: r % len(live)] if live else []
            for row, env, actions in turn:
                if row.plan is not None:
                    env.timings.reset()  # the sample's own: not the other rows' turns
                row.samples.append(steps_per_second(env, actions, seconds, policy))
                if row.plan is not None:
                    row.timings = env.timings
                progress()
    finally:
        for _, env, _ in live:
            env.close()


def _progress_bar(total: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """(advance, close) of a tqdm bar on stderr, or of a plain dot counter without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        sys.stderr.write(f"measuring {total} samples ")

        def close() -> None:
            sys.stderr.write("\n")

        return lambda: sys.stderr.write("."), close
    bar = tqdm(total=total, desc="measuring", unit="sample", file=sys.stderr, leave=False)
    return lambda: bar.update(), bar.close


def report(
    env: str,
    num_envs: int,
    cores: int,
    t_env: float,
    plan: autoconfig.Plan,
    rows: list[Row],
    scale: float = 1.0,
    policy: str = "none",
) -> dict:
    """What the tuner found, as a dict (the ``--json`` output)."""
    baseline = next((r.median for r in rows if r.name == "DummyVecEnv" and r.samples), None)
    baseline = baseline or next((r.median for r in rows if r.name == "SyncVectorEnv" and r.samples), None)
    shm = [r for r in rows if r.plan is not None and r.samples]
    chosen = next((r for r in shm if r.plan == (plan.n_workers, plan.main_shard)), None)
    best = max(shm, key=lambda r: r.median, default=None)
    return {
        "env": env,
        "num_envs": num_envs,
        "cores": cores,
        "t_env_us": t_env * 1e6,
        "cpu_share": plan.cpu_share,
        "machine_scale": scale,
        "policy": policy,
        "recommended": {
            "n_workers": plan.n_workers,
            "use_main_process": plan.main_shard,
            "main_shard": plan.main_shard,  # its former name, for scripts that read it
            "reason": plan.reason,
            "constructor": f"ShmPoolVecEnv(env_fns)  # or ShmVectorEnv(env_fns): here {plan.constructor_args()}",
            "explicit": f"ShmPoolVecEnv(env_fns, {plan.constructor_args()})",
            "measured_vs_best_shmvec": (chosen.median / best.median) if chosen and best else None,
            "timings": chosen.timings.scalars() if chosen and chosen.timings else None,
        },
        "rows": [
            {
                "name": r.name,
                "steps_per_s": r.median if r.samples else None,
                "vs_baseline": (r.median / baseline) if (baseline and r.samples) else None,
                "predicted_steps_per_s": r.predicted,
                "samples": r.samples,
                "error": r.error,
            }
            for r in rows
        ],
    }


def format_table(found: dict) -> str:
    lines = [
        f"{found['env']}, {found['num_envs']} envs, {found['cores']} usable cores, "
        f"{found['t_env_us']:.1f} µs per env step ({found['cpu_share']:.0%} of it CPU), "
        f"policy between steps: {found['policy']}",
        "",
        f"{'implementation':<40} {'steps/s':>10} {'vs baseline':>11} {'model':>10}",
    ]
    for row in found["rows"]:
        if row["steps_per_s"] is None:
            lines.append(f"{row['name']:<40} {'-':>10}  {row['error'] or 'not measured'}")
            continue
        ratio = f"{row['vs_baseline']:.2f}x" if row["vs_baseline"] else "-"
        model = f"{row['predicted_steps_per_s']:,.0f}" if row["predicted_steps_per_s"] else ""
        lines.append(f"{row['name']:<40} {row['steps_per_s']:>10,.0f} {ratio:>11} {model:>10}")
    rec = found["recommended"]
    lines += ["", f"recommended: {rec['constructor']}", f"  ({rec['reason']})"]
    if rec["measured_vs_best_shmvec"] is not None:
        lines.append(f"  measured: {rec['measured_vs_best_shmvec']:.2f}x the best shmvec configuration measured here")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shmvec.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("env", help="a registered env id (CartPole-v1) or module:callable returning an env")
    parser.add_argument("--num-envs", type=int, default=16, help="envs per vector env (default 16)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per sample (default 0.5)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="samples per implementation, round-robin; medians (default 5)"
    )
    parser.add_argument(
        "--policy",
        default="mlp",
        help=f"compute between steps: one of {', '.join(CHOICES)} or module:callable (default mlp)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = parser.parse_args(argv)
    require_vector_api("python -m shmvec.tune")  # before timing the env: see plan_rows
    if args.num_envs < 1:
        parser.error("--num-envs must be at least 1")
    env_fn = env_fn_from(args.env)
    try:
        policy = stand_in_policy(args.policy, *_obs_shape_and_actions(env_fn))
    except (ValueError, ImportError) as exc:
        parser.error(str(exc))
    cores = autoconfig.usable_cores()
    timing = time_env_and_machine(env_fn)  # as n_workers=None times them
    t_env, scale, cpu_share = timing.t_env, timing.scale, timing.cpu_share
    plan = autoconfig.choose(  # as n_workers=None
        args.num_envs,
        cores,
        t_env,
        scale=scale,
        cpu_share=cpu_share,
        calls_per_step=timing.per_step_calls,
        trains_every_step=timing.trains_every_step,
    )
    rows = plan_rows(env_fn, args.num_envs, cores, t_env, scale, policy is not None, cpu_share, plan)
    advance, close = _progress_bar(len(rows) * (args.repeats + 1))
    try:
        measure(rows, args.num_envs, args.seconds, args.repeats, advance, policy)
    finally:
        close()
    found = report(args.env, args.num_envs, cores, t_env, plan, rows, scale, args.policy)
    print(json.dumps(found, indent=2) if args.json else format_table(found))
    chosen = next((r for r in rows if r.plan == (plan.n_workers, plan.main_shard) and r.timings), None)
    if chosen is not None and not args.json:
        print(f"\nwhere the time went in the recommended configuration's last sample (envs.timings):\n{chosen.timings}")
    return 0


def _obs_shape_and_actions(env_fn: Callable[[], gym.Env]) -> tuple[tuple[int, ...], int]:
    """One env's observation shape and its number of discrete actions (2 for other spaces)."""
    env = env_fn()
    try:
        shape = env.observation_space.shape or (gym.spaces.flatdim(env.observation_space),)
        return tuple(shape), int(getattr(env.action_space, "n", 2))
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(main())
