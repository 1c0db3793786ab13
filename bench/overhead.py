"""Per-step overhead of each implementation, and the overhead model built on it.

The overhead is measured with a zero-cost env (``synth:0us:4``: the step does no work),
as seconds per synchronous vector step, at several N, and fitted as
``t_overhead(N) = a + b * N`` (``a``: fixed cost of one round trip, ``b``: per-env cost
of dispatching, copying, pickling).

The model predicts the throughput of an env that costs ``t_env`` per step when up to
``P`` envs can step at once (``P`` = 1 in-process, min(K, cores) for shmvec,
min(N, cores) for one process per env)::

    fps_model = N / (N * t_env / P + t_overhead(N))
    efficiency = fps / (P / t_env) ≈ (N * t_env / P) / (N * t_env / P + t_overhead)

With ``P = 1`` this is the targets' ``fps_parallel / fps_serial ≈ N·t_env / (N·t_env + t_overhead)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from bench.impls import CORES, get_impl
from bench.measure import Result


@dataclass
class OverheadFit:
    """``t_overhead(N) = a + b * N`` seconds per vector step for one implementation tag."""

    tag: str
    impl: str
    k: int | None
    a: float
    b: float
    points: list[tuple[int, float]]  # (N, measured seconds per vector step)

    def t_overhead(self, n: int) -> float:
        return max(0.0, self.a + self.b * n)

    def predict_fps(self, n: int, t_env: float) -> float:
        lanes = get_impl(self.impl).lanes(n, self.k)
        return n / (n * t_env / lanes + self.t_overhead(n))


def fit_overheads(zero_cost_results: Iterable[Result]) -> dict[str, OverheadFit]:
    """Fit ``a + b*N`` per implementation tag from zero-cost-env results (least squares)."""
    by_tag: dict[str, list[Result]] = {}
    for r in zero_cost_results:
        if r.samples:
            by_tag.setdefault(r.config.tag, []).append(r)
    fits = {}
    for tag, results in by_tag.items():
        points = sorted((r.config.n, r.config.n / r.median) for r in results)
        ns = np.array([p[0] for p in points], float)
        ts = np.array([p[1] for p in points], float)
        if len(set(ns)) >= 2:
            b, a = np.polyfit(ns, ts, 1)
        else:
            a, b = ts[0], 0.0
        c = results[0].config
        fits[tag] = OverheadFit(tag, c.impl, c.k, float(a), float(b), points)
    return fits


@dataclass
class ModelPoint:
    """One grid measurement next to the overhead model's prediction."""

    tag: str
    workload: str
    n: int
    t_env: float
    fps: float
    fps_model: float
    ideal: float  # P / t_env: the implementation's own parallel ideal
    machine_ideal: float  # cores / t_env

    @property
    def efficiency(self) -> float:
        return self.fps / self.ideal

    @property
    def efficiency_model(self) -> float:
        return self.fps_model / self.ideal


def model_points(results: Iterable[Result], fits: dict[str, OverheadFit], t_env: dict[str, float]) -> list[ModelPoint]:
    """Pair every grid result whose env cost is known with the model's prediction."""
    points = []
    for r in results:
        c = r.config
        fit = fits.get(c.tag)
        if fit is None or not r.samples or c.workload not in t_env:
            continue
        t = t_env[c.workload]
        lanes = get_impl(c.impl).lanes(c.n, c.k)
        points.append(ModelPoint(c.tag, c.workload, c.n, t, r.median, fit.predict_fps(c.n, t), lanes / t, CORES / t))
    return points
