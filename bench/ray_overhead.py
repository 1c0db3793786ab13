"""What ``backend="ray"`` costs per step against the local pool, and when two nodes pay off.

Nodes are simulated on this machine (``ray.cluster_utils.Cluster``, 2 nodes of 1 CPU, every
daemon on 127.0.0.1): both "nodes" share its cores, so the measured overhead is real but
no speed-up from a second machine can show. The break-even env cost comes from the model:

    one node, K workers:   T1 = N*c/K     + o_local
    two nodes, K each:     T2 = N*c/(2K)  + o_ray (+ rtt + bytes/bandwidth on a real network)
    T2 < T1  <=>  c > c* = 2K * (o_ray + rtt + bytes/bw - o_local) / N

Run: ``python bench/report.py --sections ray --out docs/bench`` (appends its own section).
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray starts: every daemon binds 127.0.0.1

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from bench.workloads import get_workload

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADING = '## More than one machine: backend="ray"'
N_ENVS = 8
COSTS = ["0us", "100us", "1ms"]
SHAPES = ["4", "84x84x4:uint8"]
ASSUMED_RTT = 200e-6  # seconds: one round trip between two machines of a rack (a switched 10 GbE LAN)
ASSUMED_BANDWIDTH = 1.0e9  # bytes/s usable on that link


@dataclass
class Cell:
    workload: str
    obs_bytes: int  # one step's observations, all envs
    local: float  # seconds per vector step, median
    ray: float

    @property
    def overhead(self) -> float:
        return self.ray - self.local


def start_cluster():
    """A simulated 2-node cluster on 127.0.0.1; the bench modules importable on its nodes."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def stop_cluster(cluster) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


def step_time(env, steps: int) -> float:
    actions = np.zeros(env.num_envs, dtype=np.int64)
    start = time.perf_counter()
    for _ in range(steps):
        env.step(actions)
    return (time.perf_counter() - start) / steps


def measure(workload: str, block_time: float, repeats: int) -> Cell:
    """Local pool (2 workers) and Ray (2 nodes x 1 worker) on the same envs, taking turns; medians."""
    from shmvec import ShmVectorEnv

    work = get_workload(workload)
    fns = work.env_fns(N_ENVS)
    envs = {
        "local": ShmVectorEnv(fns, n_workers=2, start_method="fork"),
        "ray": ShmVectorEnv(fns, n_workers=1, start_method="fork", backend="ray", n_nodes=2),
    }
    try:
        samples: dict[str, list[float]] = {name: [] for name in envs}
        for env in envs.values():
            env.reset(seed=0)
            steps = max(3, int(block_time / max(step_time(env, 3), 1e-6)))
            env.bench_steps = steps  # type: ignore[attr-defined]
        for _ in range(repeats):
            for name, env in envs.items():
                samples[name].append(step_time(env, env.bench_steps))
        return Cell(
            workload, work.obs_bytes * N_ENVS, statistics.median(samples["local"]), statistics.median(samples["ray"])
        )
    finally:
        for env in envs.values():
            env.close()


def run(block_time: float = 0.5, repeats: int = 3, on_sample: Callable[[], None] | None = None) -> list[Cell]:
    cluster = start_cluster()
    try:
        cells = []
        for shape in SHAPES:
            for cost in COSTS:
                cells.append(measure(f"synth:{cost}:{shape}", block_time, repeats))
                if on_sample:
                    on_sample()
        return cells
    finally:
        stop_cluster(cluster)


def break_even(overhead: float, n_envs: int, cores_per_node: int, obs_bytes: int = 0, rtt: float = 0.0) -> float:
    """Env step cost (seconds) above which 2 nodes beat 1 (the model in the module docstring)."""
    extra = overhead + rtt + obs_bytes / ASSUMED_BANDWIDTH
    return 2 * cores_per_node * max(extra, 0.0) / n_envs


def plot(cells: list[Cell], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [cell.workload.removeprefix("synth:") for cell in cells]
    x = np.arange(len(cells))
    left.bar(x - 0.2, [c.local * 1e3 for c in cells], 0.4, label="local pool (2 workers)")
    left.bar(x + 0.2, [c.ray * 1e3 for c in cells], 0.4, label='backend="ray" (2 simulated nodes)')
    left.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    left.set_ylabel("ms per vector step (N=8)")
    left.set_yscale("log")
    left.set_title("Measured here (nodes simulated on one machine)")
    left.legend(fontsize=8)
    small = min(cells, key=lambda c: c.obs_bytes)
    costs = np.logspace(-5, -1.5, 60)
    n, k = 64, 8
    t1 = n * costs / k + small.local
    t2 = n * costs / (2 * k) + small.ray + ASSUMED_RTT
    right.loglog(costs * 1e3, t1 * 1e3, label=f"1 node, {k} workers")
    right.loglog(costs * 1e3, t2 * 1e3, label=f"2 nodes, {k} workers each (+{ASSUMED_RTT * 1e6:.0f} µs RTT)")
    c_star = break_even(small.overhead, n, k, small.obs_bytes * n // N_ENVS, ASSUMED_RTT)
    right.axvline(c_star * 1e3, color="grey", ls="--", label=f"break-even {c_star * 1e6:.0f} µs/env step")
    right.set_xlabel("env step cost (ms)")
    right.set_ylabel("ms per vector step")
    right.set_title(f"Model for real nodes, N={n}, small observations")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def markdown(cells: list[Cell], machine: str, command: str, plot_name: str) -> str:
    rows = [
        "| workload (N=8) | obs bytes/step | local pool | ray, 2 simulated nodes | overhead |",
        "|---|---|---|---|---|",
    ]
    for c in cells:
        rows.append(
            f"| `{c.workload}` | {c.obs_bytes:,} | {c.local * 1e3:.3f} ms | {c.ray * 1e3:.3f} ms "
            f"| {c.overhead * 1e3:+.3f} ms |"
        )
    small = min(cells, key=lambda c: c.obs_bytes)
    big = max(cells, key=lambda c: c.obs_bytes)
    fixed = statistics.median(c.overhead for c in cells if c.obs_bytes == small.obs_bytes)
    per_byte = max(
        0.0,
        (statistics.median(c.overhead for c in cells if c.obs_bytes == big.obs_bytes) - fixed)
        / (big.obs_bytes - small.obs_bytes),
    )
    models = [
        "| N envs | workers per node | obs bytes/env | break-even here (no network) "
        "| real nodes (RTT 200 µs, 1 GB/s) |",
        "|---|---|---|---|---|",
    ]
    for n, k in ((8, 1), (64, 8), (256, 32)):
        for env_bytes in (small.obs_bytes // N_ENVS, big.obs_bytes // N_ENVS):
            overhead = fixed + per_byte * env_bytes * n
            here = break_even(overhead, n, k)
            real = break_even(overhead, n, k, env_bytes * n, ASSUMED_RTT)
            models.append(f"| {n} | {k} | {env_bytes:,} | {here * 1e6:,.0f} µs | {real * 1e6:,.0f} µs |")
    return "\n\n".join(
        [
            HEADING,
            f"Machine: {machine}. Command: `{command}`. The two Ray nodes are **simulated on this one machine** "
            "(`ray.cluster_utils.Cluster`, 2 nodes of 1 CPU, all daemons on 127.0.0.1): they share its 2 cores, "
            "so the table shows Ray's per-step overhead, not a speed-up. Each step is one Ray call per node "
            "carrying that node's action rows out and its observation rows back through the object store. "
            "Medians of round-robin samples; synthetic envs (`synth:<step cost>:<obs shape>`).",
            "\n".join(rows),
            f"Overhead model fitted to these rows: **{fixed * 1e3:.2f} ms per step** plus "
            f"**{per_byte * 1e9:.2f} ns per observation byte** (the local pool copies nothing between processes).",
            "Break-even, from the model in `bench/ray_overhead.py`: one node with K workers takes "
            "`N*c/K + o_local` per step; two nodes take `N*c/(2K) + o_ray`, plus on a real network one round "
            "trip and the bytes over the link. Two nodes win when the env step cost `c` exceeds "
            "`c* = 2K * (o_ray - o_local + rtt + bytes/bandwidth) / N`. "
            f"For real nodes we assume a {ASSUMED_RTT * 1e6:.0f} µs round trip and {ASSUMED_BANDWIDTH / 1e9:.0f} GB/s "
            "(one rack, 10 GbE); Ray's own per-call cost is taken as measured here.",
            "\n".join(models),
            "Read: for light envs (CartPole, a few µs) one machine always wins; a second node pays off for envs of "
            "a few hundred µs to a few ms per step (physics sims, emulators, games) once each node has enough envs "
            "to hide the per-call latency. Large observations move the break-even up through the bytes term.",
            f"![ray overhead]({plot_name})",
        ]
    )


def section_dict(cells: list[Cell]) -> list[dict]:
    return [asdict(cell) | {"overhead": cell.overhead} for cell in cells]
