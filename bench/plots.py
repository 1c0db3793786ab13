"""matplotlib figures of the report (PNG, no display needed)."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.impls import BASELINE  # noqa: E402
from bench.measure import Result  # noqa: E402
from bench.overhead import ModelPoint, OverheadFit  # noqa: E402
from bench.workloads import get_workload  # noqa: E402


def _series(results: Sequence[Result], workload: str) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in results:
        if r.config.workload == workload and r.samples:
            series[r.config.tag].append((r.config.n, r.median))
    return {tag: sorted(points) for tag, points in sorted(series.items())}


_PALETTE = plt.get_cmap("tab20").colors
_COLORS: dict[str, tuple] = {}  # implementation tag -> its color, the same in every plot


def _style(tag: str) -> dict:
    color = _COLORS.setdefault(tag, _PALETTE[len(_COLORS) % len(_PALETTE)])
    if tag.startswith("shm"):
        return {"linewidth": 2.5, "marker": "o", "color": color}
    return {"linewidth": 1.2, "marker": ".", "linestyle": "--", "color": color}


def throughput_plot(results: Sequence[Result], workload: str, path: str) -> str:
    """env.step() calls per second vs N, one line per implementation (and K)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tag, points in _series(results, workload).items():
        ax.plot([n for n, _ in points], [f for _, f in points], label=tag, **_style(tag))
    ax.set(xscale="log", yscale="log", xlabel="N (envs)", ylabel="env steps / s", title=f"Throughput: {workload}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def speedup_plot(results: Sequence[Result], workload: str, path: str) -> str:
    """Throughput / DummyVecEnv's at the same N, one line per implementation (and K)."""
    series = _series(results, workload)
    base = dict(series.get(BASELINE, []))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tag, points in series.items():
        pts = [(n, f / base[n]) for n, f in points if n in base]
        if pts:
            ax.plot([n for n, _ in pts], [s for _, s in pts], label=tag, **_style(tag))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xscale="log", xlabel="N (envs)", ylabel="speed-up over DummyVecEnv", title=f"Speed-up: {workload}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def overhead_plot(fits: dict[str, OverheadFit], path: str) -> str:
    """Seconds per vector step with a zero-cost env vs N, with the fitted a + b*N lines."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tag, fit in sorted(fits.items()):
        ns = [n for n, _ in fit.points]
        line = ax.plot(
            ns, [t * 1e6 for _, t in fit.points], "o", label=f"{tag}: {fit.a * 1e6:.1f} + {fit.b * 1e6:.2f}·N µs"
        )
        ax.plot(ns, [fit.t_overhead(n) * 1e6 for n in ns], "-", color=line[0].get_color(), alpha=0.6)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="N (envs)",
        ylabel="µs per vector step (no env work)",
        title="Per-step overhead (zero-cost env)",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def model_plot(points: Sequence[ModelPoint], path: str) -> str:
    """Measured efficiency (fps / ideal) against the overhead model's prediction, per implementation."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_tag: dict[str, list[ModelPoint]] = defaultdict(list)
    for p in points:
        by_tag[p.tag].append(p)
    for tag, pts in sorted(by_tag.items()):
        ax.plot([p.efficiency_model for p in pts], [p.efficiency for p in pts], "o", label=tag, alpha=0.8)
    ax.plot([0, 1.05], [0, 1.05], color="black", linewidth=0.8, label="model = measured")
    ax.set(
        xlabel="model: N·t_env/P / (N·t_env/P + t_overhead(N))",
        ylabel="measured: fps / (P / t_env)",
        title="Overhead model vs measurement",
        xlim=(0, 1.05),
        ylim=(0, 1.3),
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def ratio_bars(groups: dict[str, dict[str, float]], path: str, title: str, ylabel: str) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per implementation in it, its ratio on top."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * sum(len(g) for g in groups.values()) + 1), 4.5))
    x, ticks, labelled = 0.0, [], set()
    for group, bars in groups.items():
        start = x
        for tag, ratio in bars.items():
            color = _style(tag)["color"]
            ax.bar(x, ratio, width=0.8, color=color, label=None if tag in labelled else tag)
            ax.annotate(f"{ratio:.2f}", (x, ratio), ha="center", va="bottom", fontsize=7)
            labelled.add(tag)
            x += 1
        ticks.append(((start + x - 1) / 2, group))
        x += 0.8  # a gap between groups
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([t for t, _ in ticks], [g for _, g in ticks], rotation=20, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_all(results: Sequence[Result], out: str) -> list[str]:
    """Throughput and speed-up plots for every env in ``results``; return the file names."""
    files = []
    for workload in dict.fromkeys(r.config.workload for r in results):
        short = get_workload(workload).short()
        files.append(throughput_plot(results, workload, os.path.join(out, f"throughput_{short}.png")))
        files.append(speedup_plot(results, workload, os.path.join(out, f"speedup_{short}.png")))
    return files


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.path.basename(path)
