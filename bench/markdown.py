"""Markdown tables of the report."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.impls import BASELINE, IMPLS, SHMVEC
from bench.measure import Result
from bench.memory import MemoryResult
from bench.overhead import ModelPoint, OverheadFit
from bench.targets import NO_SLOWER, Check


def fmt_fps(x: float) -> str:
    if x is None or math.isnan(x):
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def _mib(x: int) -> str:
    return f"{x / 2**20:+,.0f}"


def replace_section(report: str, section: str, heading: str) -> str:
    """``report`` with its ``heading`` section (up to the next ``## `` heading) replaced by ``section``, or appended."""
    start = report.find(heading)
    if start < 0:
        return report.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    following = report.find("\n## ", start + len(heading))
    rest = report[following + 1 :] if following >= 0 else ""
    return report[:start] + section.rstrip("\n") + "\n" + ("\n" + rest if rest else "")


def write_section(path: str | Path, section: str, heading: str, new_file: str = "") -> None:
    """Replace (or append) the ``heading`` section of the Markdown file at ``path``; the rest stays."""
    path = Path(path)
    path.write_text(replace_section(path.read_text() if path.exists() else new_file, section, heading))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _tag_order(tags) -> list[str]:
    rank = {name: i for i, name in enumerate([BASELINE, "sync", "subproc", "async", *SHMVEC])}
    return sorted(tags, key=lambda t: (rank.get(t.split()[0], 99), t))


def throughput_tables(results: Sequence[Result]) -> str:
    """Per env: one row per N, one column per implementation (and K): median steps/s (x Dummy)."""
    out = []
    by_env: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_env[r.config.workload].append(r)
    for env, rs in by_env.items():
        tags = _tag_order(dict.fromkeys(r.config.tag for r in rs))
        cell = {(r.config.n, r.config.tag): r for r in rs}
        rows = []
        for n in sorted({r.config.n for r in rs}):
            base = cell.get((n, BASELINE))
            row = [str(n)]
            for tag in tags:
                r = cell.get((n, tag))
                if r is None:
                    row.append("")
                elif not r.samples:
                    row.append("error")
                elif base is not None and base.samples and tag != BASELINE:
                    row.append(f"{fmt_fps(r.median)} ({r.median / base.median:.2f}x)")
                else:
                    row.append(fmt_fps(r.median))
            rows.append(row)
        out.append(f"#### {env}\n\n" + table(["N", *tags], rows))
    return "\n\n".join(out)


def errors_list(results: Sequence[Result]) -> str:
    errs = [f"- {r.config.workload} N={r.config.n} {r.config.tag}: {r.error}" for r in results if r.error]
    return "\n".join(errs)


def slower_than_dummy(results: Sequence[Result], light_envs: set[str]) -> str:
    """The grid's light-env configs (N >= 2) where shmvec is below NO_SLOWER x DummyVecEnv."""
    base = {(r.config.workload, r.config.n): r.median for r in results if r.config.impl == BASELINE and r.samples}
    rows = []
    checked = 0
    for r in results:
        c = r.config
        if c.impl in SHMVEC and c.workload in light_envs and c.n >= 2 and r.samples and (c.workload, c.n) in base:
            checked += 1
            ratio = r.median / base[(c.workload, c.n)]
            if ratio < NO_SLOWER:
                rows.append([c.workload, c.n, c.tag, f"{ratio:.2f}x"])
    head = f"{checked} light-env configs with N >= 2 checked against DummyVecEnv (threshold {NO_SLOWER}x): "
    if not rows:
        return head + "none slower."
    return head + f"{len(rows)} slower:\n\n" + table(["env", "N", "impl", "vs Dummy"], rows)


def overhead_table(fits: dict[str, OverheadFit]) -> str:
    ns = sorted({n for f in fits.values() for n, _ in f.points})
    rows = []
    for tag in _tag_order(fits):
        f = fits[tag]
        measured = dict(f.points)
        rows.append(
            [
                tag,
                f"{f.a * 1e6:.1f}",
                f"{f.b * 1e6:.2f}",
                *(f"{measured[n] * 1e6:.1f}" if n in measured else "" for n in ns),
            ]
        )
    return table(["impl", "a (µs)", "b (µs/env)", *(f"N={n} (µs)" for n in ns)], rows)


def model_table(points: Sequence[ModelPoint]) -> str:
    """Per implementation: how well ``fps = N / (N·t_env/P + a + b·N)`` predicts the grid."""
    by_tag: dict[str, list[ModelPoint]] = defaultdict(list)
    for p in points:
        by_tag[p.tag].append(p)
    rows = []
    for tag in _tag_order(by_tag):
        pts = by_tag[tag]
        err = statistics.median(abs(p.fps / p.fps_model - 1) for p in pts)
        best = max(pts, key=lambda p: p.fps / p.machine_ideal)
        rows.append(
            [
                tag,
                len(pts),
                f"{err * 100:.0f} %",
                f"{statistics.median(p.efficiency for p in pts):.2f}",
                f"{best.fps / best.machine_ideal:.2f} ({best.workload}, N={best.n})",
            ]
        )
    return table(
        [
            "impl",
            "points",
            "median abs error of model",
            "median efficiency (fps / (P/t_env))",
            "best fraction of machine ideal (cores/t_env)",
        ],
        rows,
    )


def env_cost_table(t_env: dict[str, float]) -> str:
    return table(
        ["env", "raw step (µs)", "serial ideal (steps/s)"],
        [[env, f"{t * 1e6:.1f}", fmt_fps(1 / t)] for env, t in t_env.items()],
    )


def memory_table(results: Sequence[MemoryResult]) -> str:
    rows = []
    for m in sorted(results, key=lambda m: (m.config.n, list(IMPLS).index(m.config.impl), m.config.k or 0)):
        if m.error:
            rows.append([m.config.tag, m.config.n, m.transport, "error", m.error, "", "", ""])
            continue
        rows.append(
            [
                m.config.tag,
                m.config.n,
                m.transport,
                m.processes,
                _mib(m.pss),
                _mib(m.uss),
                _mib(m.rss),
                f"{m.obs_bytes / 2**20:.2f}",
            ]
        )
    return table(
        [
            "impl",
            "N",
            "observations travel",
            "extra processes",
            "PSS (MiB)",
            "USS (MiB)",
            "RSS (MiB)",
            "one obs batch (MiB)",
        ],
        rows,
    )


def targets_table(checks: Sequence[Check]) -> str:
    rows = []
    for c in checks:
        t = c.target
        ratio = f"{c.ratio:.2f}x" if c.ratio is not None else c.note
        fps = f"{fmt_fps(c.shm_fps)} / {fmt_fps(c.base_fps)}" if c.ratio is not None else ""
        rows.append(
            [
                c.status,
                t.group,
                f"{c.impl} K={t.k}",
                f"{t.baseline}",
                f"{t.workload} N={t.n}",
                ratio,
                f">= {t.min_ratio}x",
                fps,
            ]
        )
    return table(["", "target", "shmvec", "vs", "env", "measured", "needed", "steps/s (shm / base)"], rows)
