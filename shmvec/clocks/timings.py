"""Where a run's time went, from the vector env's own clocks: ``envs.timings``.

The main thread's wall time since the pool started (or since :meth:`Timings.reset`) is split
into parts that add up to it (:mod:`~shmvec.clocks.call_clock`):

- **caller**: between the vector env's calls (the policy, the updates, logging);
- **envs**: stepping the main shard's envs, and waiting while the typical worker stepped its envs;
- **stragglers**: waiting while the last worker of a step stepped longer than the typical one;
- **shmvec**: the rest of the step calls (actions in, results out, infos, copies, and the
  hand-off: posts, wake-ups, noticing the workers' ends);
- **other calls**: resets, ``env_method``, attributes;
- with Ray, **network**: waiting for the nodes beyond the slowest node's own step (each node
  says how long its step took), the envs' part being that step.

The workers' rows (:mod:`~shmvec.ipc.timing_rows`) say how busy each lane was, how much of its
stepping was CPU (the rest: envs waiting on a socket, a simulator, a sleep), and each env's
step time (sampled on one step in 16). The stragglers are measured on the last
:data:`~shmvec.ipc.timing_rows.RING` steps and scaled to the whole wait. :meth:`Timings.verdicts`
turns the shares into what would help, and by how much at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shmvec.clocks.call_clock import CallClock
from shmvec.ipc import timing_rows as tr

CALLER_DOMINATES = 0.4  # shares of the wall time from which a part gets a verdict
ENVS_DOMINATE = 0.4
STRAGGLERS_MATTER = 0.05
LIBRARY_MATTERS = 0.15
CALLS_MATTER = 0.1
WAITING_ENVS = 0.5  # envs whose lanes are under this share CPU wait rather than compute
MAX_LANE_LINES = 8  # more lanes than this: one line for them all


@dataclass(frozen=True)
class Lane:
    """One lane's stepping: a worker's, or the main process's shard (``worker`` None)."""

    worker: int | None
    envs: range
    steps: int
    busy: float  # seconds stepping its envs (wall)
    cpu: float  # ... of which its thread's CPU time (estimated from the steps whose CPU clock it read)

    @property
    def name(self) -> str:
        where = "main process" if self.worker is None else f"worker {self.worker}"
        return f"{where} (envs {self.envs.start}-{self.envs.stop - 1})"


@dataclass(frozen=True)
class EnvSteps:
    """Each env's step times, sampled on one lane step in 16 (resets apart)."""

    mean: np.ndarray  # seconds per step, NaN for an env with no sample
    p50: np.ndarray
    p99: np.ndarray
    samples: np.ndarray
    reset_mean: np.ndarray


@dataclass
class Timings:
    """A snapshot of where the time went; ``str()`` is a table and the verdicts.

    All times are seconds of the main thread's wall time over ``wall``, except the lanes'.
    """

    wall: float
    steps: int  # vector steps (or async batches) completed
    caller: float
    envs: float
    stragglers: float
    library: float
    calls: float
    num_envs: int
    n_workers: int
    cores: int
    lanes: list[Lane] = field(default_factory=list)
    env_steps: EnvSteps | None = None
    plan: str = ""
    remote: bool = False  # Ray: the envs' part is the slowest node's steps; the rest of the wait, the network's
    network: float = 0.0  # Ray: waiting for the nodes beyond their steps (the network, the object store)
    # The raw data (shmvec.tools.timeline draws from it): the main thread's clock, with its ring of
    # the last steps, and a copy of the lanes' timing rows at the snapshot (None with Ray).
    clock: CallClock | None = field(default=None, repr=False)
    rows: tr.Rows | None = field(default=None, repr=False)
    read_rows: Callable[[], tr.Rows | None] | None = field(default=None, repr=False)  # the rows as they are now

    def reset(self) -> None:
        """Count from now on (the next ``envs.timings`` covers only what follows): the baseline is the
        rows as they are now, not as this snapshot saw them (steps since would be counted twice)."""
        if self.clock is not None:
            self.clock.reset(self.read_rows() if self.read_rows is not None else self.rows)

    def share(self, part: str) -> float:
        return getattr(self, part) / self.wall if self.wall > 0 else 0.0

    @property
    def env_cpu_share(self) -> float | None:
        """How much of the lanes' stepping was CPU (None: nothing measured)."""
        busy = sum(lane.busy for lane in self.lanes)
        return sum(lane.cpu for lane in self.lanes) / busy if busy > 0 else None

    @property
    def parts(self) -> dict[str, str]:
        """The parts of the wall time (name: label), ``network`` with Ray only."""
        return {**PARTS, "network": "network (Ray)"} if self.remote else PARTS

    def scalars(self) -> dict[str, float]:
        """Flat numbers for a logger (``timings/<name>``): shares of the wall time, and rates."""
        out = {f"{part}_share": float(self.share(part)) for part in self.parts}
        out["steps_per_second"] = self.steps / self.wall if self.wall > 0 else 0.0
        cpu = self.env_cpu_share
        if cpu is not None:
            out["env_cpu_share"] = float(cpu)
        workers = [lane for lane in self.lanes if lane.worker is not None]
        if workers and self.wall > 0:
            out["worker_busy_share"] = float(sum(lane.busy for lane in workers) / (len(workers) * self.wall))
        return out

    def slowest_env(self) -> tuple[int, float, float] | None:
        """(env, its p99 step, the median env's p99) when one env's p99 is the largest; None without samples."""
        if self.env_steps is None:
            return None
        p99 = self.env_steps.p99
        if np.isnan(p99).all() or len(p99) < 2:
            return None
        worst = int(np.nanargmax(p99))
        return worst, float(p99[worst]), float(np.nanmedian(p99))

    def verdicts(self) -> list[str]:
        """What the numbers say would help, largest share first."""
        return [text for _, text in sorted(_verdicts(self), key=lambda v: -v[0])]

    def __str__(self) -> str:
        rate = self.steps / self.wall if self.wall > 0 else 0.0
        lines = [f"shmvec timings: {self.steps} steps in {self.wall:.2f} s ({rate:,.0f} steps/s); {self.plan}"]
        for part, label in self.parts.items():
            seconds = getattr(self, part)
            lines.append(f"  {label:<34}{seconds:9.3f} s {self.share(part):7.1%}")
        wall = self.wall if self.wall > 0 else 1.0
        if len(self.lanes) > MAX_LANE_LINES:
            busy = sorted(lane.busy / wall for lane in self.lanes)
            lines.append(
                f"  {len(busy)} lanes: busy {busy[0]:.0%} to {busy[-1]:.0%} of the wall time (median "
                f"{busy[len(busy) // 2]:.0%}), {self.env_cpu_share or 0.0:.0%} of it CPU"
            )
        for lane in self.lanes if len(self.lanes) <= MAX_LANE_LINES else ():
            own_cpu = f", {lane.cpu / lane.busy:.0%} of it CPU" if lane.busy > 0 else ""
            lines.append(f"  {lane.name}: busy {lane.busy / wall:.0%} of the wall time{own_cpu}")
        slowest = self.slowest_env()
        if slowest is not None and self.env_steps is not None:
            p50 = float(np.nanmedian(self.env_steps.p50))
            env, p99, median = slowest
            lines.append(
                f"  env step, median env: p50 {_fmt(p50)}, p99 {_fmt(median)}; slowest env {env}: p99 {_fmt(p99)}"
            )
        lines += [f"* {text}" for text in self.verdicts()]
        return "\n".join(lines)


PARTS = {
    "caller": "caller (policy, updates, logging)",
    "envs": "envs",
    "stragglers": "waiting for the slowest worker",
    "library": "shmvec's own work (main process)",
    "calls": "other calls (reset, env_method)",
}


def _fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _verdicts(t: Timings) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    caller, envs, stragglers = t.share("caller"), t.share("envs"), t.share("stragglers")
    library, calls = t.share("library"), t.share("calls")
    if caller >= CALLER_DOMINATES:
        out.append(
            (
                caller,
                f"The caller (policy, updates, logging) took {caller:.0%} of the wall time: faster envs can "
                f"speed this run up by at most {1 / caller:.2f}x; the time to win is in the caller.",
            )
        )
    if envs >= ENVS_DOMINATE:
        out.append((envs, _envs_verdict(t, envs)))
    slowest = t.slowest_env()
    if stragglers >= STRAGGLERS_MATTER:
        named = ""
        if slowest is not None and slowest[2] > 0:
            env, p99, median = slowest
            ratio = f"{p99 / median:.1f}x slower than the median env at p99 ({_fmt(p99)} against {_fmt(median)})"
            named = f"; env {env} is {ratio}"
        out.append(
            (
                stragglers,
                f"Waiting for the slowest worker took {stragglers:.0%} of the wall time{named}: async batches "
                f"(ShmVectorEnv's send/recv with batch_size below {t.num_envs}) would hide it.",
            )
        )
    if library >= LIBRARY_MATTERS:
        out.append((library, _library_verdict(t, library, envs)))
    if calls >= CALLS_MATTER:
        hint = (
            "with the envs in this process (n_workers=0) they are direct calls"
            if t.n_workers
            else "they are direct calls already"
        )
        out.append((calls, f"Calls other than steps (reset, env_method, attributes) took {calls:.0%}: {hint}."))
    if not out:
        largest = max(t.parts, key=t.share)
        out.append((0.0, f"No part dominates; the largest is {t.parts[largest]} at {t.share(largest):.0%}."))
    return out


def _library_verdict(t: Timings, library: float, envs: float) -> str:
    head = f"shmvec's own work in the main process took {library:.0%} of the wall time"
    lanes = len(t.lanes)
    if not t.n_workers:
        return f"{head} (results out, infos, copies): copy=False skips the observation copy."
    if lanes > 1 and library > envs * (lanes - 1):  # stepping every env here would cost less than the hand-off
        return (
            f"{head}, more than the envs' stepping would add in this process ({envs:.0%} on {lanes} lanes): "
            "n_workers=0 (every env in this process) has no hand-off."
        )
    return f"{head}: the hand-off to {t.n_workers} workers (a post and a wake-up each), results, infos and copies."


def _envs_verdict(t: Timings, envs: float) -> str:
    head = f"The envs took {envs:.0%} of the wall time"
    if t.remote:
        return f"{head} (the slowest node's steps): more nodes, or more workers on each, would help."
    cpu, lanes = t.env_cpu_share, len(t.lanes)
    if cpu is not None and cpu < WAITING_ENVS:
        if t.n_workers < t.num_envs:
            return (
                f"{head}, and their steps were {cpu:.0%} CPU (they wait): more workers, up to one per env "
                f"(n_workers={t.num_envs}), would overlap the waits."
            )
        return f"{head}, and their steps were {cpu:.0%} CPU (they wait): each env has its own worker already."
    if lanes < min(t.cores, t.num_envs):
        return f"{head}: more workers would use the idle cores ({lanes} busy lanes, {t.cores} cores)."
    return f"{head} with every core stepping envs: faster envs or more cores would help."


def snapshot(
    clock: CallClock,
    read_rows: Callable[[], tr.Rows | None],
    shards: list[tuple[int, int]],
    layout: dict,
) -> Timings:
    """The :class:`Timings` of a pool: ``read_rows`` reads its lanes' rows (None: it has none, Ray),
    ``layout`` has its num_envs, n_workers, main_shard, cores, plan, remote."""
    rows = read_rows()
    now = time.perf_counter()
    wall = now - clock.since
    waiting = clock.waiting
    since_rows = rows.minus(clock.baseline) if rows is not None and clock.baseline is not None else rows
    remote = layout.get("remote", False)
    stepping, late = _split_waiting(clock, rows) if rows is not None else (0.0, 0.0)
    stragglers = late * waiting
    envs = clock.main_envs + (min(clock.remote, waiting) if remote else stepping * waiting)
    network = waiting - envs if remote else 0.0
    library = clock.in_steps - envs - stragglers - network
    lanes = _lanes(since_rows, shards, layout["n_workers"], layout["main_shard"]) if since_rows is not None else []
    return Timings(
        wall=wall,
        steps=clock.steps,
        caller=clock.caller + (now - clock.left_at if not clock.depth else 0.0),
        envs=envs,
        stragglers=stragglers,
        library=max(0.0, library),
        calls=clock.in_calls,
        num_envs=layout["num_envs"],
        n_workers=layout["n_workers"],
        cores=layout["cores"],
        lanes=lanes,
        env_steps=_env_steps(since_rows) if since_rows is not None else None,
        plan=layout["plan"],
        remote=remote,
        network=network,
        clock=clock,
        rows=rows,
        read_rows=read_rows,
    )


def _lanes(rows: tr.Rows, shards: list[tuple[int, int]], n_workers: int, main_shard: bool) -> list[Lane]:
    lanes = []
    for k in range(n_workers + main_shard):
        row = rows.lane_totals[k if k < n_workers else n_workers]
        start, stop = shards[k]
        worker = k if k < n_workers else None
        busy, sampled = row[tr.LANE_BUSY] * 1e-9, row[tr.LANE_CPU_BUSY]
        cpu = busy * row[tr.LANE_CPU] / sampled if sampled > 0 else 0.0  # read on sampled steps (timing_rows)
        lanes.append(Lane(worker, range(start, stop), int(row[tr.LANE_STEPS]), busy, cpu))
    return lanes


def _env_steps(rows: tr.Rows) -> EnvSteps:
    totals, hist = rows.env_totals.astype(np.float64), rows.env_hist
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = totals[:, tr.ENV_STEP_NS] * 1e-9 / totals[:, tr.ENV_STEPS]
        reset_mean = totals[:, tr.ENV_RESET_NS] * 1e-9 / totals[:, tr.ENV_RESETS]
    return EnvSteps(mean, _percentile(hist, 0.5), _percentile(hist, 0.99), totals[:, tr.ENV_STEPS], reset_mean)


def _percentile(hist: np.ndarray, q: float) -> np.ndarray:
    counts = hist.sum(axis=1)
    cumulative = np.cumsum(hist, axis=1)
    bins = (cumulative < (q * counts)[:, None]).sum(axis=1)
    out = np.asarray(tr.bin_seconds(np.minimum(bins, tr.HIST_BINS - 1)), dtype=np.float64)
    out[counts == 0] = np.nan
    return out


def _split_waiting(clock: CallClock, rows: tr.Rows) -> tuple[float, float]:
    """The shares of the recent steps' waiting for workers that were (the typical lane stepping its
    envs, the last lane stepping longer than the typical one); the rest is the hand-off (posts,
    wake-ups, the main process noticing the end)."""
    count = min(clock.steps, tr.RING)
    if count == 0:
        return 0.0, 0.0
    slots = [(clock.steps - count + s) % tr.RING for s in range(count)]
    entered, left = np.array([clock.ring_in[s] for s in slots]), np.array([clock.ring_out[s] for s in slots])
    wait_from = np.array([clock.ring_wait_from[s] for s in slots])
    waited = np.array([clock.ring_wait_to[s] for s in slots]) - wait_from
    total = float(waited.sum())
    if total <= 0:
        return 0.0, 0.0
    ring = rows.lane_ring.reshape(-1, 3) * 1e-9
    ring = ring[(ring[:, tr.RING_END] >= entered[0]) & (ring[:, tr.RING_END] <= left[-1])]
    ring = ring[np.argsort(ring[:, tr.RING_END])]
    starts, ends = ring[:, tr.RING_START], ring[:, tr.RING_END]
    first, last = np.searchsorted(ends, entered, side="left"), np.searchsorted(ends, left, side="right")
    stepping = late = 0.0
    for s in np.flatnonzero(waited > 0).tolist():
        step_starts, step_ends = starts[first[s] : last[s]], ends[first[s] : last[s]]
        if not len(step_ends):
            continue
        typical = len(step_ends) // 2  # the lane that finished in the middle (the upper one of two)
        stepping += max(
            0.0, min(step_ends[typical], wait_from[s] + waited[s]) - max(wait_from[s], step_starts[typical])
        )
        busy = step_ends - step_starts
        longer = float(busy[-1] - np.median(busy))
        late += min(max(0.0, longer), max(0.0, step_ends[-1] - max(wait_from[s], step_ends[typical])))
    return min(1.0, stepping / total), min(1.0, late / total)
