"""Where an SB3 rollout's time goes: the policy, the envs, the hand-offs, and who held the cores.

Usage (from the repository root)::

    python bench/probes/rollout_timeline.py                                # PPO, Acrobot-v1 x8, DummyVecEnv vs default
    python bench/probes/rollout_timeline.py --env HalfCheetah-v5 --n 8 --timesteps 16384
    python bench/probes/rollout_timeline.py --impl shm:n_workers=2 --impl shm:n_workers=1,main_shard=False
    python bench/probes/rollout_timeline.py --env atari:BreakoutNoFrameskip-v4 --timesteps 4096

It runs SB3's ``PPO("MlpPolicy")`` ``learn()`` (SB3's defaults, ``n_steps=256``) over each
implementation in turn, ``--rounds`` times, alternating; on ``atari:<id>``, ``CnnPolicy``
over SB3's Atari preprocessing and ``VecFrameStack(4)``, with ``bench/training.py``'s
Atari hyperparameters. Every env is wrapped in
:class:`bench.probes.timeline.Probe` (when each ``step`` starts and ends, in whichever process
runs it) and the vector env's ``step_async``/``step_wait`` are timed in the main
process. For each vector step of the rollouts the table gives medians (µs):

- *caller*: from the previous step's return to this step's call: SB3's policy forward,
  action sampling, the rollout buffer and callbacks (the caller's compute);
- *vector step*: the call to ``step`` until it returns, split into the slowest shard's
  stepping (first env start to last env end), the delay until a worker's first env starts
  (its wake-up) and the rest (hand-offs and result rows);
- *env work*: the sum of the envs' own step times (what DummyVecEnv runs one after another);

then the mean vector step, the share of the steps where an episode ended and their extra
time over the median step (a rollout pays the mean: such a step runs the env's reset, a
lost Atari life a few more frames, and with static shards the shard holding that env
steps on while the others wait); and, over the rollouts' wall time, the cores each kind
of thread kept busy (CPU seconds per second, from ``/proc`` through psutil): the main
thread, the main process's other threads (torch's OpenMP team: spinning after each op
counts as busy) and the workers.
The bound on the rollout speed-up from parallel envs follows from these figures: the
caller's part and the hand-offs stay serial.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from bench.probes.timeline import _first_after, _last_before, probed  # noqa: E402
from bench.training_jobs import WORKLOADS, shm_kwargs  # noqa: E402

_now = time.perf_counter


def build(impl: str, env_id: str, n: int):
    """``dummy``, ``subproc``, or ``shm[:key=value,...]`` (ShmPoolVecEnv's keyword arguments) over probed envs."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from shmvec import ShmPoolVecEnv

    env_fns = [functools.partial(probed_atari if env_id.startswith("atari:") else probed, env_id)] * n
    if impl == "dummy":
        return DummyVecEnv(env_fns)
    if impl == "subproc":
        return SubprocVecEnv(env_fns)
    return ShmPoolVecEnv(env_fns, **shm_kwargs(impl))


def probed_atari(env_id: str):
    """``atari:<id>`` as ``bench/training.py`` makes it (SB3's ``make_atari_env``), with a probe."""
    from bench.probes.timeline import Probe
    from bench.training_jobs import make_atari

    return Probe(make_atari(env_id.removeprefix("atari:")))


def sb3_model(venv, env_id: str, seed: int):
    """SB3's PPO over ``venv`` as a user wraps it: MlpPolicy, or CnnPolicy on 4 stacked Atari frames."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecFrameStack, VecMonitor

    if env_id.startswith("atari:"):
        hyper = WORKLOADS["ppo-atari"].hyper
        return PPO("CnnPolicy", VecFrameStack(venv, n_stack=4), seed=seed, **hyper)
    return PPO("MlpPolicy", VecMonitor(venv), n_steps=256, seed=seed)


class CpuShares:
    """CPU seconds of the main thread, the main process's other threads and the workers, summed over windows."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.main_thread = threading.get_native_id()
        self.seconds = {"main thread": 0.0, "main: other threads": 0.0, "workers": 0.0}
        self._start: dict[str, float] | None = None

    def _sample(self) -> dict[str, float]:
        threads = {t.id: t.user_time + t.system_time for t in self.process.threads()}
        workers = 0.0
        for child in self.process.children(recursive=True):
            try:
                times = child.cpu_times()
                workers += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        main = threads.pop(self.main_thread, 0.0)
        return {"main thread": main, "main: other threads": sum(threads.values()), "workers": workers}

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> None:
        end = self._sample()
        for key in self.seconds:
            self.seconds[key] += end[key] - self._start[key]


def run(impl: str, env_id: str, n: int, timesteps: int, seed: int) -> dict:
    """One ``learn()`` over ``impl``; per-step phases (seconds) and core shares of its rollouts."""
    venv = build(impl, env_id, n)
    try:
        calls, sent, returned, ended = [], [], [], []
        step_async, step_wait = venv.step_async, venv.step_wait

        def timed_async(actions):
            calls.append(_now())
            step_async(actions)
            sent.append(_now())

        def timed_wait():
            result = step_wait()
            returned.append(_now())
            ended.append(bool(np.any(result[2])))
            return result

        venv.step_async, venv.step_wait = timed_async, timed_wait
        model = sb3_model(venv, env_id, seed)
        cpu, rollouts = CpuShares(), []
        collect = model.collect_rollouts

        def timed_collect(*args, **kwargs):
            cpu.start()
            start = _now()
            try:
                return collect(*args, **kwargs)
            finally:
                rollouts.append((start, _now()))
                cpu.stop()

        model.collect_rollouts = timed_collect
        start = _now()
        model.learn(timesteps)
        total = _now() - start
        times = dict(enumerate(venv.get_attr("probe_times")))
        shards, n_workers = _shards(venv, n)
        description = repr(venv) if hasattr(venv, "_pool") else type(venv).__name__
    finally:
        venv.close()
    rollout = sum(stop - start for start, stop in rollouts)
    phases = _phases(calls, sent, returned, ended, rollouts, times, shards, n_workers)
    cores = {key: value / rollout for key, value in cpu.seconds.items()}
    return {
        "impl": impl,
        "description": description,
        "total": total,
        "rollout": rollout,
        "phases": phases,
        "cores": cores,
    }


def _shards(venv, n: int) -> tuple[list[tuple[int, int]], int]:
    pool = getattr(venv, "_pool", None)
    if pool is None:  # DummyVecEnv: one shard in the main process; SubprocVecEnv: one per env
        return ([(0, n)], 0) if type(venv).__name__ == "DummyVecEnv" else ([(i, i + 1) for i in range(n)], n)
    return list(pool.shards), pool.n_workers


def _phases(calls, sent, returned, ended, rollouts, times, shards, n_workers) -> dict[str, float]:
    starts = {i: np.asarray(t[0::2]) for i, t in times.items()}
    ends = {i: np.asarray(t[1::2]) for i, t in times.items()}
    rows = []
    for s in range(1, len(calls)):
        if not any(start <= returned[s - 1] and calls[s] <= stop for start, stop in rollouts):
            continue  # the first step of a rollout follows an update, not the policy
        call, done = calls[s], returned[s]
        row = {"caller (policy, SB3)": call - returned[s - 1], "vector step": done - call}
        firsts, lasts, stepping, wakeups = [], [], [], []
        for k, (lo, hi) in enumerate(shards):
            first = min(_first_after(starts[i], call) for i in range(lo, hi))
            last = max(_last_before(ends[i], done) for i in range(lo, hi))
            firsts.append(first)
            lasts.append(last)
            stepping.append(last - first)
            if k < n_workers:
                wakeups.append(first - call)
        row["  slowest shard stepping"] = max(stepping)
        row["  first worker env starts after the call"] = min(wakeups) if wakeups else 0.0
        row["  rest: hand-offs, rows"] = row["vector step"] - max(stepping)
        row["env work (sum of the envs' steps)"] = sum(
            _last_before(ends[i], done) - _first_after(starts[i], call) for i in range(len(times))
        )
        row["ended"] = ended[s]
        rows.append(row)
    phases = {key: statistics.median(row[key] for row in rows) for key in rows[0] if key != "ended"}
    return phases | _episode_ends([row["vector step"] for row in rows], [row["ended"] for row in rows])


def _episode_ends(steps: list[float], ended: list[bool]) -> dict[str, float]:
    """The mean vector step, and what the steps where an episode ended add to it."""
    with_end = [step for step, end in zip(steps, ended) if end]
    extra = statistics.fmean(with_end) - statistics.median(steps) if with_end else 0.0
    return {
        "vector step, mean": statistics.fmean(steps),
        "steps where an episode ended (share)": len(with_end) / len(steps),
        "  their extra time over the median step": extra,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="Acrobot-v1")
    p.add_argument("--n", type=int, default=8, help="envs")
    p.add_argument("--timesteps", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--impl", action="append", help="dummy, subproc, shm or shm:key=value,... (repeatable; default: dummy and shm)"
    )
    args = p.parse_args(argv)
    impls = args.impl or ["dummy", "shm"]
    results: dict[str, list[dict]] = {impl: [] for impl in impls}
    for r in range(args.rounds):
        for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
            results[impl].append(run(impl, args.env, args.n, args.timesteps, seed=r))
    reference = statistics.median(res["rollout"] for res in results[impls[0]])
    policy = "CnnPolicy" if args.env.startswith("atari:") else "MlpPolicy"
    print(f"PPO {policy}, {args.env} x{args.n}, {args.timesteps} steps, medians of {args.rounds} rounds")
    for impl, runs in results.items():
        rollout = statistics.median(res["rollout"] for res in runs)
        print(f"\n{impl}: {runs[-1]['description']}")
        print(
            f"  rollout {rollout:.2f} s ({reference / rollout:.2f}x {impls[0]}), "
            f"learn() {statistics.median(res['total'] for res in runs):.2f} s"
        )
        for key in runs[0]["phases"]:
            value = statistics.median(res["phases"][key] for res in runs)
            if key.endswith("(share)"):
                print(f"  {key:45s} {value * 100:8.1f} %")
            else:
                print(f"  {key:45s} {value * 1e6:8.1f} µs")
        for key in runs[0]["cores"]:
            print(f"  cores busy, {key:33s} {statistics.median(res['cores'][key] for res in runs):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
