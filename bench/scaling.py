"""Scaling: envs that wait, many workers, memory and start-up per worker, many envs, many cores.

Usage (from the repository root; this script imports torch and SB3 at its top, as a
training script does, so the workers' memory and start-up are what users get)::

    python bench/scaling.py --out docs/bench          # everything (~10 min on 2 cores)
    python bench/scaling.py --sections waiting --ns 32,256 --out /tmp/s
    python bench/scaling.py --sections "" --out docs/bench  # the report again from its scaling.json

Sections (``--sections``):

- ``waiting``: envs whose step blocks ``--wait-ms`` in a syscall and uses almost no CPU
  (:class:`shmvec.tools.waiting_env.WaitingEnv`), N up to 1024, against DummyVecEnv,
  SubprocVecEnv (N <= 64: a process per env) and shmvec with 2 to 128 workers. They need
  no cores, so on 2 cores what shows is the coordination's own cost. The figure is the
  share of the limit N / wait (every env waiting at once).
- ``startup``: a fresh script that imports torch and SB3 at its top starts 16 and 32
  workers; median unique memory (USS) per worker, and seconds from the constructor to
  the end of the first reset, shmvec's default start method against SubprocVecEnv's.
- ``cpu``: CPU-bound envs (CartPole, Acrobot) with N up to 1024: DummyVecEnv,
  SyncVectorEnv, SubprocVecEnv and AsyncVectorEnv (N <= 64), EnvPool where installed,
  and the default ``ShmPoolVecEnv``. On 2 cores this is the ceiling check; on a big
  machine it is the scaling.
- ``projection``: the main process's own CPU time per step (``time.thread_time``), per
  worker (4 against 64 workers of one waiting env each, every wait blocking) and per env
  (16 against 256 zero-cost envs, with and without 11-key float infos), and what they
  imply for 16, 64 and 128 cores (Amdahl: the main process's work does not parallelize).

Every implementation of one table is alive at once and they take turns (round-robin,
medians of ``--rounds``). The section of ``--out/report.md`` is replaced, and the figures
go to ``--out/scaling.json`` and ``--out/scaling.png``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import stable_baselines3  # noqa: F401  (the user's script imports it: the workers must not pay for it)
import torch  # noqa: F401

if __package__ in (None, ""):  # run as a script: make `bench` and `shmvec` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from shmvec.planning.machine import usable_cpus  # noqa: E402
from shmvec.tools.waiting_env import WaitingEnv  # noqa: E402

HEADING = "## Scaling: envs that wait, many workers, many cores"
SECTIONS = ("waiting", "startup", "cpu", "projection")
MAX_PROCS = 64  # a process per env (SubprocVecEnv, AsyncVectorEnv) only up to this many envs
PROJECTED_CORES = (16, 64, 128)
PROJECTED_ENVS = {"CartPole-v1": 7e-6, "Acrobot-v1": 31e-6, "Humanoid-v5": 85e-6}  # µs a step on the 2-core VM


def steps_per_second(env, actions: np.ndarray, seconds: float) -> tuple[float, float]:
    """(env steps per second, main-thread CPU seconds per vector step) over ~``seconds``; one step at least."""
    steps, start, start_cpu = 0, time.perf_counter(), time.thread_time()
    while True:
        env.step(actions[steps % len(actions)])
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps * env.num_envs / elapsed, (time.thread_time() - start_cpu) / steps


def round_robin(builds: dict, seconds: float, rounds: int) -> dict[str, dict]:
    """Build every implementation, then step them in turns; each one's medians and its repr."""
    envs, found = {}, {}
    try:
        for name, build in builds.items():
            start = time.perf_counter()
            envs[name] = build()
            envs[name].reset()
            found[name] = {"start_s": time.perf_counter() - start, "repr": repr(envs[name]), "rates": [], "cpu": []}
            found[name]["workers_uss_mb"] = workers_uss(envs[name]) / 2**20
        actions = {name: np.zeros((16, env.num_envs), np.int64) for name, env in envs.items()}
        for name, env in envs.items():
            steps_per_second(env, actions[name], 0.2)  # warm-up
        names = list(envs)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rate, cpu = steps_per_second(envs[name], actions[name], seconds)
                found[name]["rates"].append(rate)
                found[name]["cpu"].append(cpu)
    finally:
        for env in envs.values():
            env.close()
    for row in found.values():
        row["steps_per_s"] = statistics.median(row["rates"])
        row["main_cpu_us"] = statistics.median(row["cpu"]) * 1e6
    return found


def workers_uss(env) -> float:
    """Bytes of unique memory (USS) of ``env``'s worker processes together (0 for none)."""
    import psutil

    pool = getattr(env, "_pool", None)
    pids = [link.process.pid for link in getattr(pool, "links", [])]
    pids += [process.pid for process in getattr(env, "processes", [])]  # SubprocVecEnv's
    return float(sum(psutil.Process(pid).memory_full_info().uss for pid in pids))


# ---- envs that wait ------------------------------------------------------------------------


def waiting_section(ns: list[int], ks: list[int], wait: float, seconds: float, rounds: int) -> dict:
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec import ShmPoolVecEnv

    results = {}
    for n in ns:
        fns = [functools.partial(WaitingEnv, wait)] * n
        builds = {}
        if n * wait <= 0.1:  # a step of DummyVecEnv takes n * wait
            builds["DummyVecEnv"] = lambda fns=fns: DummyVecEnv(fns)
        if n <= MAX_PROCS:
            builds["SubprocVecEnv"] = lambda fns=fns: SubprocVecEnv(fns)
        builds["shmvec default"] = lambda fns=fns: ShmPoolVecEnv(fns)
        for k in (k for k in ks if k <= n):
            builds[f"shmvec n_workers={k}"] = lambda fns=fns, k=k: ShmPoolVecEnv(fns, n_workers=k)
        print(f"waiting: N={n} ({len(builds)} implementations)", file=sys.stderr)
        rows = round_robin(builds, max(seconds, 3 * n * wait), rounds)
        for row in rows.values():
            row["of_limit"] = row["steps_per_s"] / (n / wait)
        results[str(n)] = rows
    return results


def waiting_markdown(results: dict, wait: float) -> str:
    lines = [
        f"Envs that wait {wait * 1e3:g} ms per step in a syscall (almost no CPU). Share of the limit N / wait "
        "(every env waiting at once), env steps/s, main-thread CPU per vector step, start-up (constructor to "
        "the end of the first reset, beside the pools built before it), unique memory of all its workers:",
        "",
        "| N | implementation | of the limit | steps/s | main CPU / step | start-up | workers' USS |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, rows in results.items():
        for name, row in rows.items():
            lines.append(
                f"| {n} | {name} | {row['of_limit']:.2f} | {row['steps_per_s']:,.0f} | "
                f"{row['main_cpu_us']:,.0f} µs | {row['start_s']:.2f} s | {row['workers_uss_mb']:,.0f} MB |"
            )
    chosen = [f"- N={n}: `{rows['shmvec default']['repr']}`" for n, rows in results.items()]
    return "\n".join([*lines, "", "What the default chose:", "", *chosen])


# ---- start-up and memory per worker --------------------------------------------------------

STARTUP_SCRIPT = """\
import json, statistics, sys, time
import torch  # a training script imports torch and SB3 at its top
import stable_baselines3
import gymnasium as gym
import psutil

def uss_of(pids):
    return [psutil.Process(pid).memory_full_info().uss for pid in pids]

if __name__ == "__main__":
    impl, n = sys.argv[1], int(sys.argv[2])
    fns = [lambda: gym.make("CartPole-v1")] * n
    start = time.perf_counter()
    if impl == "SubprocVecEnv":
        from stable_baselines3.common.vec_env import SubprocVecEnv
        env = SubprocVecEnv(fns)
        pids = [p.pid for p in env.processes]
    else:
        from shmvec import ShmPoolVecEnv
        env = ShmPoolVecEnv(fns, n_workers=n, **({{}} if impl == "shmvec" else {{"start_method": impl.split()[-1]}}))
        pids = [link.process.pid for link in env._pool.links]
    env.reset()
    seconds = time.perf_counter() - start
    uss = uss_of(pids)
    env.close()
    print(json.dumps({{"start_s": seconds, "uss": uss}}))
"""


def startup_section(counts: list[int], rounds: int) -> dict:
    script = Path(os.environ.get("TMPDIR", "/tmp")) / "shmvec_scaling_startup.py"
    script.write_text(STARTUP_SCRIPT.format())
    impls = ["shmvec", "shmvec spawn", "SubprocVecEnv"]
    results: dict[str, dict] = {}
    for n in counts:
        for r in range(rounds):
            for impl in impls[r % 3 :] + impls[: r % 3]:
                print(f"startup: {impl} x{n} (round {r + 1})", file=sys.stderr)
                out = subprocess.run(
                    [sys.executable, str(script), impl, str(n)], capture_output=True, text=True, timeout=600
                )
                if out.returncode != 0:
                    raise RuntimeError(out.stderr)
                found = json.loads(out.stdout.strip().splitlines()[-1])
                row = results.setdefault(f"{impl} x{n}", {"start_s": [], "uss_mb": [], "total_uss_mb": []})
                row["start_s"].append(found["start_s"])
                row["uss_mb"].append(statistics.median(found["uss"]) / 2**20)
                row["total_uss_mb"].append(sum(found["uss"]) / 2**20)
    return {name: {key: statistics.median(v) for key, v in row.items()} for name, row in results.items()}


def startup_markdown(results: dict) -> str:
    lines = [
        "A fresh script that imports torch and SB3 at its top starts CartPole workers (`n_workers` = N; "
        "SubprocVecEnv: a process per env, its default start method). Medians of fresh runs:",
        "",
        "| implementation | start-up (constructor to first reset) | USS per worker (median) | USS of all workers |",
        "|---|---|---|---|",
    ]
    for name, row in results.items():
        lines.append(f"| {name} | {row['start_s']:.2f} s | {row['uss_mb']:.1f} MB | {row['total_uss_mb']:,.0f} MB |")
    return "\n".join(lines)


# ---- CPU-bound envs, many of them ----------------------------------------------------------


def cpu_section(env_ids: list[str], ns: list[int], seconds: float, rounds: int) -> dict:
    results = {}
    for env_id in env_ids:
        for n in ns:
            print(f"cpu: {env_id} N={n}", file=sys.stderr)
            rows = round_robin(cpu_builds(env_id, n), seconds, rounds)
            for row in rows.values():
                row["vs_dummy"] = row["steps_per_s"] / rows["DummyVecEnv"]["steps_per_s"]
            results[f"{env_id} x{n}"] = rows
    return results


def cpu_builds(env_id: str, n: int) -> dict:
    """How to build each implementation of ``n`` envs ``env_id`` (a process per env only up to MAX_PROCS)."""
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec import ShmPoolVecEnv

    fns = [lambda: gym.make(env_id)] * n
    builds = {"DummyVecEnv": lambda: DummyVecEnv(fns), "SyncVectorEnv": lambda: SyncVectorEnv(fns)}
    if n <= MAX_PROCS:
        builds["SubprocVecEnv"] = lambda: SubprocVecEnv(fns)
        builds["AsyncVectorEnv"] = lambda: AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envpool = _envpool_build(env_id, n)
    if envpool is not None:
        builds["EnvPool"] = envpool
    builds["shmvec default"] = lambda: ShmPoolVecEnv(fns)
    return builds


def _envpool_build(env_id: str, n: int):
    try:
        import envpool  # noqa: F401
    except ImportError:
        return None
    return lambda: _EnvPoolSteps(envpool.make_gymnasium(env_id, num_envs=n))


class _EnvPoolSteps:
    """EnvPool's gymnasium env with ``num_envs`` (its vector size) and ``step(actions)``."""

    def __init__(self, env):
        self.env, self.num_envs = env, env.config["num_envs"]

    def reset(self):
        return self.env.reset()

    def step(self, actions):
        return self.env.step(actions)

    def close(self):
        self.env.close()


def cpu_markdown(results: dict) -> str:
    names = sorted({name for rows in results.values() for name in rows}, key=_impl_order)
    lines = [
        "CPU-bound envs: env steps/s (median) and, in brackets, against DummyVecEnv. A process per env only up "
        f"to N={MAX_PROCS}; EnvPool only where installed.",
        "",
        "| env, N | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for case, rows in results.items():
        cells = [
            f"{rows[name]['steps_per_s']:,.0f} ({rows[name]['vs_dummy']:.2f}x)" if name in rows else "-"
            for name in names
        ]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _impl_order(name: str) -> int:
    order = ["DummyVecEnv", "SyncVectorEnv", "SubprocVecEnv", "AsyncVectorEnv", "EnvPool", "shmvec default"]
    return order.index(name) if name in order else len(order)


# ---- the main process's own cost, and what it implies -------------------------------------


class InfoEnv(WaitingEnv):
    """A zero-cost step that returns an 11-key info dict of floats, as MuJoCo envs do."""

    KEYS = tuple(f"reward_{i}" for i in range(11))

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, {key: 0.5 for key in self.KEYS}


def projection_section(seconds: float, rounds: int) -> dict:
    from shmvec import ShmPoolVecEnv, ShmVectorEnv

    def per_worker(k):
        return lambda: ShmPoolVecEnv([functools.partial(WaitingEnv, 1e-3)] * k, n_workers=k, max_spin=0.0)

    workers = round_robin({"K=4": per_worker(4), "K=64": per_worker(64)}, seconds, rounds)
    slope_worker = (workers["K=64"]["main_cpu_us"] - workers["K=4"]["main_cpu_us"]) / 60
    per_env = {}
    for label, env_cls in (("no infos", functools.partial(WaitingEnv, 0.0)), ("11-key infos", InfoEnv)):
        for adapter, cls in (("ShmPoolVecEnv", ShmPoolVecEnv), ("ShmVectorEnv", ShmVectorEnv)):
            rows = {}
            for n in (16, 256):
                fns = [env_cls if label != "11-key infos" else functools.partial(InfoEnv, 0.0)] * n
                rows[n] = round_robin(
                    {"pool": lambda fns=fns, cls=cls: cls(fns, n_workers=2, max_spin=0.0)}, seconds, rounds
                )
            slope = (rows[256]["pool"]["main_cpu_us"] - rows[16]["pool"]["main_cpu_us"]) / 240
            per_env[f"{adapter}, {label}"] = slope
    batches = {f"K={k}": async_batch_cpu(k, seconds, rounds) for k in (4, 64)}
    slope_async = (batches["K=64"] - batches["K=4"]) / 60
    return {
        "per_worker_us": slope_worker,
        "workers": workers,
        "per_env_us": per_env,
        "async_per_worker_us": slope_async,
        "async_batch_cpu_us": batches,
    }


def async_batch_cpu(k: int, seconds: float, rounds: int) -> float:
    """Main-thread CPU (µs, median of ``rounds``) of one recv and send of half the envs, K workers
    of two waiting envs each, every wait blocking: what the async path costs per worker."""
    from shmvec import ShmVectorEnv

    n = 2 * k
    env = ShmVectorEnv([functools.partial(WaitingEnv, 1e-3)] * n, n_workers=k, max_spin=0.0, batch_size=k)
    try:
        env.async_reset(seed=0)
        actions, samples = np.zeros(k, np.int64), []
        for r in range(rounds + 1):  # the first round warms up
            batches, start, cpu = 0, time.perf_counter(), time.thread_time()
            while time.perf_counter() - start < seconds:
                env.send(actions, env.recv()[4]["env_id"])
                batches += 1
            if r:
                samples.append((time.thread_time() - cpu) / batches * 1e6)
    finally:
        env.close()
    return statistics.median(samples)


def projected_speedup(t_env: float, cores: int, num_envs: int, per_env: float, per_worker: float) -> float:
    """Amdahl: the envs' work spread over K lanes (the best K up to ``cores``), the main process's
    per-env and per-worker work not."""
    return max(
        num_envs * t_env / (num_envs * t_env / lanes + num_envs * per_env + (lanes - 1) * per_worker)
        for lanes in range(1, cores + 1)
    )


def projection_markdown(results: dict) -> str:
    per_worker = results["per_worker_us"]
    before = results.get("baseline")  # the same section run on an earlier commit (--baseline)
    lines = [
        f"The main process's CPU per vector step: **{per_worker:.1f} µs per worker** (4 against 64 workers, one "
        "waiting env each, every wait blocking; "
        f"{results['workers']['K=4']['main_cpu_us']:.0f} and {results['workers']['K=64']['main_cpu_us']:.0f} µs "
        "a step), and per env (16 against 256 zero-cost envs, 2 workers; every wait blocking, so that waiting "
        "costs no CPU):",
        "",
        "| adapter, infos | main CPU per env per step |" + (f" {before['label']} |" if before else ""),
        "|---|---|" + ("---|" if before else ""),
    ]
    for name, us in results["per_env_us"].items():
        old = f" {before['per_env_us'][name]:.2f} µs |" if before else ""
        lines.append(f"| {name} | {us:.2f} µs |{old}")
    if "async_per_worker_us" in results:
        cpu = results["async_batch_cpu_us"]
        lines += [
            "",
            f"Async batches (`send`/`recv` of half the envs, two waiting envs per worker): "
            f"**{results['async_per_worker_us']:.1f} µs per worker and its env of the batch** "
            f"({cpu['K=4']:.0f} µs a batch with 4 workers, {cpu['K=64']:.0f} with 64)"
            + (
                f"; {before['label']}: {before['async_per_worker_us']:.1f} µs."
                if before and "async_per_worker_us" in before
                else "."
            ),
        ]
    if before:
        lines += [
            "",
            f"Per worker, {before['label']}: {before['per_worker_us']:.1f} µs "
            f"({before['workers']['K=4']['main_cpu_us']:.0f} and {before['workers']['K=64']['main_cpu_us']:.0f} µs "
            "a step); wall time of a step with 64 workers "
            f"{1e6 / before['workers']['K=64']['steps_per_s'] * 64:.0f} µs before, "
            f"{1e6 / results['workers']['K=64']['steps_per_s'] * 64:.0f} µs now.",
        ]
    lines += [
        "",
        "What that work allows on C cores: the speed-up over one process of N = 1024 envs stepped by the best "
        "number of lanes up to C, if nothing else limited it (an upper bound: the main process's work does not "
        "parallelize; env step times measured on this VM):",
        "",
        "| env (µs a step), adapter | " + " | ".join(f"{c} cores" for c in PROJECTED_CORES) + " |",
        "|---|" + "---|" * len(PROJECTED_CORES),
    ]
    for env_id, t_env in PROJECTED_ENVS.items():
        for name, us in results["per_env_us"].items():
            if "11-key" in name and not env_id.startswith("Humanoid"):
                continue
            cells = [f"{projected_speedup(t_env, c, 1024, us * 1e-6, per_worker * 1e-6):.1f}x" for c in PROJECTED_CORES]
            lines.append(f"| {env_id} ({t_env * 1e6:.0f}), {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- the report ----------------------------------------------------------------------------


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    waiting = results.get("waiting")
    if not waiting:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for n, rows in waiting.items():
        ks = sorted(int(name.split("=")[1]) for name in rows if name.startswith("shmvec n_workers="))
        line = ax.plot(ks, [rows[f"shmvec n_workers={k}"]["of_limit"] for k in ks], marker="o", label=f"N={n}")[0]
        default = rows["shmvec default"]
        chosen = int(default["repr"].split("n_workers=")[1].split(",")[0])
        ax.scatter([chosen], [default["of_limit"]], marker="*", s=180, color=line.get_color(), zorder=3)
        if "SubprocVecEnv" in rows:
            ax.axhline(rows["SubprocVecEnv"]["of_limit"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("shmvec workers (★: the default's choice; dotted: SubprocVecEnv, a process per env)")
    ax.set_ylabel("share of the limit N / wait")
    ax.set_title(f"Envs that wait 2 ms a step, {usable_cpus().why}")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict, args: argparse.Namespace) -> str:
    cpus = usable_cpus()
    parts = [
        HEADING,
        "",
        f"`python bench/scaling.py --out docs/bench` on {cpus.why}, Python {sys.version.split()[0]}, "
        f"{time.strftime('%Y-%m-%d')}. The script imports torch and SB3 at its top, as a training script does.",
    ]
    if "waiting" in results:
        parts += ["", "### Envs that wait", "", waiting_markdown(results["waiting"], args.wait_ms / 1e3)]
        parts += ["", "![envs that wait](scaling.png)"]
    if "startup" in results:
        parts += ["", "### Start-up and memory per worker", "", startup_markdown(results["startup"])]
    if "cpu" in results:
        parts += ["", "### CPU-bound envs, many of them", "", cpu_markdown(results["cpu"])]
    if "projection" in results:
        parts += ["", "### The main process's own work, and many cores", "", projection_markdown(results["projection"])]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    p.add_argument("--ns", default="32,256,1024", help="waiting section: numbers of envs")
    p.add_argument("--ks", default="2,8,32,128,256", help="waiting section: explicit worker counts")
    p.add_argument("--wait-ms", type=float, default=2.0, help="waiting section: each step's wait")
    p.add_argument("--cpu-envs", default="CartPole-v1,Acrobot-v1", help="cpu section: env ids")
    p.add_argument("--cpu-ns", default="64,256,1024", help="cpu section: numbers of envs")
    p.add_argument("--startup-ns", default="16,32", help="startup section: numbers of workers")
    p.add_argument("--seconds", type=float, default=1.0, help="stepping time per sample")
    p.add_argument("--rounds", type=int, default=3, help="samples per implementation (medians)")
    p.add_argument("--out", default="bench/results", help="folder of report.md, scaling.json, scaling.png")
    p.add_argument("--baseline", help="projection section: a scaling.json from an earlier commit, shown beside")
    p.add_argument("--baseline-label", default="the previous release", help="what --baseline is")
    args = p.parse_args(argv)
    sections = [section for section in args.sections.split(",") if section]  # none: the report from --out only
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "scaling.json"
    results: dict = json.loads(saved.read_text()) if saved.exists() else {}  # sections not run again stay
    runs = {
        "waiting": lambda: waiting_section(ints(args.ns), ints(args.ks), args.wait_ms / 1e3, args.seconds, args.rounds),
        "startup": lambda: startup_section(ints(args.startup_ns), args.rounds),
        "cpu": lambda: cpu_section(args.cpu_envs.split(","), ints(args.cpu_ns), args.seconds, args.rounds),
        "projection": lambda: projection_section(args.seconds, args.rounds),
    }
    for section in sections:
        results[section] = runs[section]()
        if section == "projection" and args.baseline:
            baseline = json.loads(Path(args.baseline).read_text())["projection"]
            results[section]["baseline"] = {**baseline, "label": args.baseline_label}
        saved.write_text(json.dumps(results, indent=1, default=float))  # kept should a later section fail
    plot(results, out / "scaling.png")
    text = markdown(results, args)
    from bench.markdown import write_section

    write_section(out / "report.md", text, HEADING)
    print(text)


if __name__ == "__main__":
    main()
