"""Peak memory of a vector env's whole process tree (main process + every descendant).

Three sums over the tree, sampled in a background thread while the env steps:

- RSS counts shared pages once *per process* (so shared buffers look N times bigger);
- USS counts only pages private to each process (shared buffers do not show at all);
- PSS splits each shared page among the processes mapping it: the honest total.

USS can go *down* with ``fork``: pages the parent shares with its new children leave
the parent's USS, so that column may be negative; read PSS.

Reported as the peak during build + reset + stepping, minus the tree before building,
each configuration in a fresh interpreter (``python -m bench.memory``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from multiprocessing import forkserver

import psutil

from bench.impls import get_impl
from bench.measure import Config, Session, Timing, actions_for, preload_forkserver
from bench.workloads import get_workload


def tree_memory(root: psutil.Process | None = None) -> tuple[int, int, int, int]:
    """(RSS, USS, PSS, processes) summed over ``root`` and all its descendants."""
    root = root or psutil.Process(os.getpid())
    rss = uss = pss = count = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        rss += info.rss
        uss += info.uss
        pss += getattr(info, "pss", info.uss)
        count += 1
    return rss, uss, pss, count


class PeakSampler:
    """Samples :func:`tree_memory` every ``interval`` seconds; keeps the peaks. A context manager."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = [0, 0, 0, 0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        self.peak = [max(p, v) for p, v in zip(self.peak, tree_memory())]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass
class MemoryResult:
    """Peak memory above the baseline, in bytes, for one configuration."""

    config: Config
    rss: int = 0
    uss: int = 0
    pss: int = 0
    processes: int = 0
    obs_bytes: int = 0  # bytes of one batch of N observations
    error: str | None = None

    @property
    def transport(self) -> str:
        return get_impl(self.config.impl).transport


def measure_memory(config: Config, seconds: float = 1.0) -> MemoryResult:
    """Build ``config``'s env here, step it for ``seconds``; peak memory above the baseline.

    The baseline is taken after the implementation's library is imported and the
    forkserver runs, so only what the vector env itself adds is counted. Prefer
    :func:`measure_memory_isolated`, which runs this in a fresh interpreter.
    """
    workload = get_workload(config.workload)
    result = MemoryResult(config, obs_bytes=workload.obs_bytes * config.n)
    actions = actions_for(workload, config.n)
    get_impl(config.impl).missing()  # import the library before the baseline
    if get_impl(config.impl).uses_k:
        forkserver.ensure_running()
    base = tree_memory()
    session = None
    try:
        with PeakSampler() as sampler:
            session = Session(config, actions)
            steps = session.warmup(Timing(warmup_time=0.0, block_time=0.1))
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                session.run(steps)
            sampler.sample()
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    finally:
        if session is not None:
            session.close()
    result.rss, result.uss, result.pss = (p - b for p, b in zip(sampler.peak[:3], base[:3]))
    result.processes = max(0, sampler.peak[3] - base[3])
    return result


def measure_memory_isolated(config: Config, seconds: float = 1.0, timeout: float = 300.0) -> MemoryResult:
    """:func:`measure_memory` in a fresh interpreter, so earlier runs leave nothing behind."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    args = [sys.executable, "-m", "bench.memory", json.dumps({**asdict(config), "seconds": seconds})]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
        fields = json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:
        tail = locals().get("proc") and proc.stderr.strip().splitlines()[-1:]
        return MemoryResult(config, error=f"{type(exc).__name__}: {exc} {tail or ''}".strip())
    return MemoryResult(config, **{k: v for k, v in fields.items() if k != "config"})


def _main() -> None:
    """``python -m bench.memory '{"workload": ..., "impl": ..., "n": ..., "k": ..., "seconds": ...}'``."""
    spec = json.loads(sys.argv[1])
    seconds = spec.pop("seconds")
    preload_forkserver()
    result = measure_memory(Config(**spec), seconds)
    fields = {k: v for k, v in vars(result).items() if k != "config"}
    print(json.dumps(fields))


if __name__ == "__main__":
    _main()
