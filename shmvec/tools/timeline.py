"""A picture of the last vector steps: what the main thread and each lane did, when.

:func:`plot_timeline` draws, for the last ``steps`` vector steps since the timings were last
reset, one row for the main thread (the caller's time between the vector env's calls, the
step calls, and the waiting for the workers within them, from the pool's
:class:`~shmvec.clocks.call_clock.CallClock`) and one row per lane (a worker, or the main
process's shard: when it stepped its envs, and how much of that was its thread's CPU time (read on some steps),
from :mod:`~shmvec.ipc.timing_rows`), on one time axis in ms from the first step shown. The
title is the first verdict of ``envs.timings``. :func:`timeline` returns the same data
without matplotlib.

Example::

    from shmvec.tools.timeline import plot_timeline

    plot_timeline(envs, "timeline.png", steps=30)  # envs: ShmPoolVecEnv, ShmVectorEnv, or a wrapper of one
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from shmvec.adapters.timings_view import TimingsView
from shmvec.clocks.timings import Timings
from shmvec.ipc import timing_rows as tr

MAIN_THREAD = "main thread"
# What a span shows; the main thread's first, then the lanes'.
CALLER, STEP_CALL, WAITING, BUSY, CPU = "caller", "step call", "waiting for workers", "stepping envs", "of which CPU"
_COLORS = {CALLER: "#f28e2b", STEP_CALL: "#4e79a7", WAITING: "#bab0ac", BUSY: "#59a14f", CPU: "#1b5e20"}
_LABELS = {
    CALLER: "caller (policy, updates, logging)",
    STEP_CALL: "step call (shmvec's work, the main shard's envs)",
    WAITING: "waiting for the workers",
    BUSY: "lane stepping its envs (wall)",
    CPU: "of which the lane's CPU time",
}


@dataclass
class Timeline:
    """Rows of spans ``(start_ms, end_ms, kind)``, top to bottom; ``labels[0]`` is the main thread."""

    labels: list[str]
    spans: list[list[tuple[float, float, str]]]
    steps: int  # vector steps shown
    title: str  # the first verdict
    timings: Timings = field(repr=False)
    path: str | None = None  # where plot_timeline wrote the PNG


def shmvec_env_of(env: Any) -> TimingsView | None:
    """The ShmPoolVecEnv or ShmVectorEnv in ``env``, under SB3 ``VecEnvWrapper`` s (``.venv``) and
    Gymnasium vector wrappers (``.env``); None if there is none."""
    for _ in range(64):  # wrappers deep
        if env is None or isinstance(env, TimingsView):
            return env
        inner = vars(env).get("venv", vars(env).get("env")) if hasattr(env, "__dict__") else None
        env = inner if inner is not env else None
    return None


def _timings_of(source: Any) -> Timings:
    """``envs.timings`` of a vector env or a wrapper of one; a :class:`Timings` as it is."""
    if isinstance(source, Timings):
        return source
    env = shmvec_env_of(source)
    if env is None:
        raise TypeError(f"plot_timeline needs a shmvec vector env (ShmPoolVecEnv, ShmVectorEnv), got {source!r}")
    return env.timings


def timeline(source: Any, steps: int = 50) -> Timeline:
    """The spans of the last ``steps`` vector steps (at most :data:`~shmvec.ipc.timing_rows.RING`)
    since the timings were last reset; ``source``: as :func:`plot_timeline`'s."""
    timings = _timings_of(source)
    clock = timings.clock
    ring = timings.rows.lane_ring if timings.rows is not None else None  # Ray's driver has none: the main thread
    count = min(steps, clock.steps, tr.RING)
    if count < 1:
        raise ValueError(
            "no vector steps since the timings were last reset (TimingsCallback resets them at each "
            "rollout's end): step the envs, then plot"
        )
    slots = [(clock.steps - count + s) % tr.RING for s in range(count)]
    entered, left = [clock.ring_in[s] for s in slots], [clock.ring_out[s] for s in slots]
    wait_from, wait_to = [clock.ring_wait_from[s] for s in slots], [clock.ring_wait_to[s] for s in slots]
    origin, stop = entered[0], left[-1]

    def ms(t: float) -> float:
        return (t - origin) * 1e3

    main: list[tuple[float, float, str]] = []
    for i in range(count):
        if i:
            main.append((ms(left[i - 1]), ms(entered[i]), CALLER))
        main.append((ms(entered[i]), ms(left[i]), STEP_CALL))
        if wait_to[i] > wait_from[i]:
            main.append((ms(wait_from[i]), ms(wait_to[i]), WAITING))
    labels, spans = [MAIN_THREAD], [main]
    for lane in timings.lanes:
        index = timings.n_workers if lane.worker is None else lane.worker  # the main shard's lane is the last
        row: list[tuple[float, float, str]] = []
        if ring is not None:
            for start, end, cpu in (ring[index] * 1e-9).tolist():
                if end > start and start >= origin - 1e-3 and end <= stop:
                    row.append((ms(start), ms(end), BUSY))
                    if cpu >= 0:  # read on one lane step in 16
                        row.append((ms(start), ms(start + min(cpu, end - start)), CPU))
        labels.append(lane.name)
        spans.append(sorted(row))
    verdicts = timings.verdicts()
    return Timeline(labels, spans, count, verdicts[0] if verdicts else "", timings)


def plot_timeline(source: Any, path: str, steps: int = 50) -> Timeline:
    """Write a PNG of the last ``steps`` vector steps to ``path`` (see the module); its data.

    ``source``: a ShmPoolVecEnv or ShmVectorEnv, an SB3 ``VecEnvWrapper`` or a Gymnasium vector
    wrapper around one, or a :class:`Timings` snapshot. Needs matplotlib (shmvec's ``[plot]`` extra:
    ``pip install "matplotlib>=3.7"``).
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: Agg renders the PNG, the caller's backend is left alone
    except ImportError:
        raise ImportError(
            'plot_timeline needs matplotlib: pip install "matplotlib>=3.7" (shmvec\'s [plot] extra)'
        ) from None
    data = timeline(source, steps)
    rows = len(data.labels)
    fig = Figure(figsize=(10, 1.0 + 0.45 * rows))
    ax = fig.add_subplot()
    drawn = set()
    for r, row in enumerate(data.spans):
        y = rows - 1 - r  # the main thread on top
        for kind in (CALLER, STEP_CALL, WAITING, BUSY, CPU):
            bars = [(start, end - start) for start, end, k in row if k == kind]
            if not bars:
                continue
            height = 0.35 if kind == CPU else 0.7
            ax.broken_barh(
                bars,
                (y - height / 2, height),
                facecolors=_COLORS[kind],
                label=None if kind in drawn else _LABELS[kind],
            )
            drawn.add(kind)
    ax.set_yticks(range(rows), list(reversed(data.labels)), fontsize=8)
    ax.set_ylim(-0.6, rows - 0.4)
    ax.set_xlabel(f"ms from the first of the last {data.steps} vector steps")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.5 / rows - 0.15), ncol=3)
    t = data.timings
    scope = f"(the verdict of envs.timings: {t.steps} vector steps in {t.wall:.2f} s since the last reset)"
    ax.set_title("\n".join([*textwrap.wrap(data.title, 110), scope]), fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    data.path = str(path)
    return data
