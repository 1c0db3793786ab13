"""Timing: env.step() calls per second, measured fairly.

Fairness rules, applied to every implementation alike:

- the same pre-generated actions (one seeded batch sequence per env and N);
- a warm-up after ``reset`` (caches, lazy allocations, adaptive spin budgets settle);
- blocks of whole ``step()`` calls timed with ``perf_counter``, sized to about
  ``block_time`` seconds per implementation;
- all implementations of one *cell* (env, N) are alive at once and timed round-robin,
  rotating the order each repeat, so machine noise hits them alike; medians are quoted;
- every vector env is closed in a ``finally``.

Throughput is ``steps * N / seconds`` (env.step() calls per second).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from bench.impls import IMPLS, VecRunner, get_impl, pregenerate_actions
from bench.workloads import Workload, get_workload


@dataclass(frozen=True)
class Config:
    """One implementation on one env at one (N, K). ``k`` is ``None`` when K does not apply."""

    workload: str
    impl: str
    n: int
    k: int | None = None

    @property
    def tag(self) -> str:
        return get_impl(self.impl).tag(self.k)


@dataclass
class Result:
    """Throughput samples (steps/s), one per repeat, of one :class:`Config`."""

    config: Config
    samples: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    def to_dict(self) -> dict:
        return {**asdict(self.config), "samples": self.samples, "median": self.median, "error": self.error}


@dataclass(frozen=True)
class Timing:
    """How long to measure. ``quick`` defaults; tests use :data:`SMOKE_TIMING`."""

    warmup_time: float = 0.2  # seconds of steps after reset, per implementation
    block_time: float = 0.3  # seconds per timed block (one sample)
    repeats: int = 3  # samples per implementation, taken round-robin
    min_steps: int = 2  # vector steps per block at least
    max_steps: int = 100_000


def preload_forkserver() -> None:
    """Make forkserver children start in milliseconds instead of seconds.

    On Python 3.11 the forkserver never preloads ``__main__`` (it asks for the key
    ``main_path`` but the preparation data calls it ``init_main_from_path``), so every
    child re-runs the main script and re-imports all it imports (gymnasium, SB3, torch):
    2-8 s per shmvec worker on this machine. Preloading the modules a worker needs makes
    those re-imports cache hits. Start-up only: the per-step cost is unchanged. Must run
    before the first forkserver process starts.
    """
    mp.set_forkserver_preload(["shmvec.engine.worker", "bench.workloads"])


SMOKE_TIMING = Timing(warmup_time=0.0, block_time=0.0, repeats=1, min_steps=2)

_actions_cache: dict[tuple[str, int, int], np.ndarray] = {}


def actions_for(workload: Workload, n: int, seed: int = 0) -> list[np.ndarray]:
    """The pre-generated action batches for ``workload`` with ``n`` envs (cached)."""
    key = (workload.name, n, seed)
    if key not in _actions_cache:
        env = workload.make()
        try:
            _actions_cache[key] = pregenerate_actions(env.action_space, n, seed=seed)
        finally:
            env.close()
    return list(_actions_cache[key])


class Session:
    """One live vector env with its actions, ready to be timed. Close it."""

    def __init__(self, config: Config, actions: list[np.ndarray], seed: int = 0):
        self.config = config
        self.actions = actions
        self._t = 0
        self.runner = VecRunner(get_impl(config.impl), get_workload(config.workload).env_fns(config.n), config.k)
        try:
            self.runner.reset(seed)
        except BaseException:
            self.runner.close()
            raise

    def run(self, steps: int) -> float:
        """Run ``steps`` vector steps; return the seconds they took."""
        step, actions, count, t = self.runner.step, self.actions, len(self.actions), self._t
        start = time.perf_counter()
        for _ in range(steps):
            step(actions[t % count])
            t += 1
        elapsed = time.perf_counter() - start
        self._t = t
        return elapsed

    def warmup(self, timing: Timing) -> int:
        """Warm up; return the vector steps per timed block (about ``block_time`` seconds)."""
        per_step = self.run(2) / 2
        if timing.warmup_time > 0:
            steps = max(1, int(timing.warmup_time / max(per_step, 1e-7)))
            per_step = self.run(steps) / steps
        steps = int(timing.block_time / max(per_step, 1e-7))
        return max(timing.min_steps, min(timing.max_steps, steps))

    def sample(self, steps: int) -> float:
        """One throughput sample: env.step() calls per second."""
        return steps * self.config.n / self.run(steps)

    def close(self) -> None:
        self.runner.close()


def measure_cell(
    configs: Sequence[Config],
    timing: Timing = Timing(),
    on_sample: Callable[[Config], None] | None = None,
    seed: int = 0,
) -> list[Result]:
    """Time ``configs`` (same env and N) side by side, round-robin; return one Result each.

    A config that fails to build or step gets ``Result.error`` instead of samples; the
    others go on. Every vector env is closed before returning.
    """
    results = {c: Result(c) for c in configs}
    sessions: list[tuple[Session, int]] = []
    try:
        for config in configs:
            try:
                session = Session(config, actions_for(get_workload(config.workload), config.n, seed), seed)
            except Exception as exc:
                results[config].error = _describe(exc)
                continue
            sessions.append((session, 0))
            try:
                sessions[-1] = (session, session.warmup(timing))
            except Exception as exc:
                results[config].error = _describe(exc)
        live = [(s, steps) for s, steps in sessions if results[s.config].error is None]
        for r in range(timing.repeats):
            rotation = r % len(live) if live else 0
            for session, steps in live[rotation:] + live[:rotation]:
                if results[session.config].error is None:
                    try:
                        results[session.config].samples.append(session.sample(steps))
                    except Exception as exc:
                        results[session.config].error = _describe(exc)
                if on_sample:
                    on_sample(session.config)
    finally:
        for session, _ in sessions:
            try:
                session.close()
            except Exception as exc:
                results[session.config].error = results[session.config].error or f"close: {_describe(exc)}"
    return [results[c] for c in configs]


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}".replace("\n", " ")[:300]


# -- grids ---------------------------------------------------------------------


@dataclass
class Plan:
    """Cells to measure (each a list of configs of one env and N) and what was skipped why."""

    cells: list[list[Config]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        return sum(len(cell) for cell in self.cells)


def plan_grid(
    workloads: Iterable[str],
    ns: Iterable[int],
    ks: Iterable[int],
    impls: Iterable[str] = tuple(IMPLS),
    max_procs: int = 64,
    max_bytes: int = 256 * 2**20,
) -> Plan:
    """Every available (impl, N, K) for every available env, grouped into cells.

    Implementations with one process per env are limited to ``N <= max_procs``; envs
    whose N observations exceed ``max_bytes`` are skipped at that N.
    """
    plan = Plan()
    impls = list(dict.fromkeys(impls))
    available = []
    for name in impls:
        why = get_impl(name).missing()
        if why:
            plan.skipped.append(why)
        else:
            available.append(get_impl(name))
    ks = sorted(set(ks))
    for wname in workloads:
        workload = get_workload(wname)
        why = workload.missing()
        if why:
            plan.skipped.append(why)
            continue
        for n in sorted(set(ns)):
            if workload.obs_bytes * n > max_bytes:
                plan.skipped.append(
                    f"{wname} N={n}: {workload.obs_bytes * n / 2**20:.0f} MiB of observations > max_bytes"
                )
                continue
            cell = []
            for impl in available:
                if impl.procs_per_env and n > max_procs:
                    plan.skipped.append(f"{impl.name} {wname} N={n}: {n} processes > --max-procs {max_procs}")
                elif impl.uses_k:
                    cell += [Config(wname, impl.name, n, k) for k in ks if k <= n]
                else:
                    cell.append(Config(wname, impl.name, n))
            if cell:
                plan.cells.append(cell)
    return plan
