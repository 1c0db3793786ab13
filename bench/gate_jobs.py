"""The release gate's jobs, each as its child process (:mod:`bench.gate_child`) runs it (:mod:`bench.gate`).

A child imports torch first, as training scripts do, then shmvec from the tree it was given
(``--tree``: a folder whose only package is that tree's ``shmvec``), and prints one JSON line:
``total`` (seconds) for a training row, ``value`` for the others, and ``vec_env`` (the vector
env's ``repr``: the layout it chose).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

from bench.training_jobs import WORKLOADS, build_vec_env, make_model, scaled

BARE_ENVS, BARE_SECONDS = 64, 3.0
CPU_SECONDS, CPU_ALTERNATIONS = 1.0, 3


class InfoEnv(gym.Env):
    """No work per step, an 11-key info dict of floats (as MuJoCo envs return): the per-env cost."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    KEYS = tuple(f"reward_{i}" for i in range(11))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, False, False, dict.fromkeys(self.KEYS, 0.5)


class WaitingEnv(InfoEnv):
    """A step that sleeps 1 ms and returns no infos: each worker's cost, every wait blocking."""

    def step(self, action):
        time.sleep(1e-3)
        return np.zeros(4, np.float32), 0.0, False, False, {}


def phase_timed_learn(model: Any, steps: int) -> dict[str, float]:
    """``model.learn(steps)``: the whole call's seconds, and those of its rollouts and updates."""
    seconds = {"rollout": 0.0, "update": 0.0}

    def timed(name, method):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start

        return call

    if hasattr(model, "collect_rollouts"):
        model.collect_rollouts = timed("rollout", model.collect_rollouts)
    if hasattr(model, "train"):
        model.train = timed("update", model.train)
    start = time.perf_counter()
    model.learn(steps)
    return {"total": time.perf_counter() - start, **seconds}


def training(name: str, impl: str, scale: float) -> dict[str, Any]:
    workload = WORKLOADS[name]
    venv = build_vec_env(workload, "dummy" if impl == "reference" else "shm")
    try:
        model = make_model(workload, venv, device="cpu")
        result = phase_timed_learn(model, scaled(workload.timesteps, scale))
        described = repr(venv.unwrapped) if impl != "reference" else type(venv.unwrapped).__name__
    finally:
        venv.close()
    return {**result, "vec_env": described}


def bare(impl: str) -> dict[str, Any]:
    """CartPole x64, random actions drawn beforehand: env steps per second."""
    import shmvec

    fns = [lambda: gym.make("CartPole-v1")] * BARE_ENVS
    envs = gym.vector.SyncVectorEnv(fns) if impl == "reference" else shmvec.ShmVectorEnv(fns)
    try:
        envs.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, (1024, BARE_ENVS))
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:  # warm-up
            envs.step(actions[steps % 1024])
            steps += 1
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < BARE_SECONDS:
            envs.step(actions[steps % 1024])
            steps += 1
        return {"value": steps * BARE_ENVS / (time.perf_counter() - start), "vec_env": repr(envs)}
    finally:
        envs.close()


def main_thread_cpu(env_cls: type, n: int, k: int) -> Any:
    """A pool of ``n`` envs on ``k`` workers, every wait blocking: a callable that measures the
    main thread's CPU µs per step for a while."""
    import shmvec

    venv = shmvec.ShmPoolVecEnv([env_cls] * n, n_workers=k, main_shard=False, max_spin=0.0)
    venv.reset()
    actions = np.zeros(n, np.int64)

    def sample() -> float:
        steps, start, cpu = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - start < CPU_SECONDS:
            venv.step(actions)
            steps += 1
        return (time.thread_time() - cpu) / steps * 1e6

    sample.close = venv.close
    return sample


def cpu_slope(env_cls: type, small: tuple[int, int], large: tuple[int, int], per: int) -> dict[str, Any]:
    """µs of the main thread per step that each added env (or worker) costs: two layouts, alternated."""
    samplers = [main_thread_cpu(env_cls, *small), main_thread_cpu(env_cls, *large)]
    try:
        samples = [[], []]
        for _ in range(CPU_ALTERNATIONS):
            for i, sampler in enumerate(samplers):
                samples[i].append(sampler())
    finally:
        for sampler in samplers:
            sampler.close()
    low, high = (statistics.median(s) for s in samples)
    return {"value": max(1e-3, (high - low) / per), "vec_env": f"{small} -> {large}: {low:.1f} -> {high:.1f} µs/step"}


def child_main(name: str, impl: str, scale: float, tree: str) -> int:
    import torch  # noqa: F401  (first, as training scripts import it)

    sys.path.insert(0, tree)
    import shmvec

    if not shmvec.__file__.startswith(tree):
        raise RuntimeError(f"shmvec was imported from {shmvec.__file__}, not from {tree}")
    if name == "bare":
        result = bare(impl)
    elif name == "cpu-per-env":
        result = cpu_slope(InfoEnv, (16, 2), (128, 2), 112)
    elif name == "cpu-per-worker":
        result = cpu_slope(WaitingEnv, (4, 4), (16, 16), 12)
    else:
        result = training(name, impl, scale)
    print(json.dumps(result), flush=True)
    return 0
