"""The release gate's jobs, each as its child process (:mod:`bench.gate_child`) runs it (:mod:`bench.gate`).

A child imports torch first, as training scripts do, then shmvec from the tree it was given
(``--tree``: a folder whose only package is that tree's ``shmvec``), and prints one JSON line:
``total`` (seconds) for a training row, ``value`` for the others, and ``vec_env`` (the vector
env's ``repr``: the layout it chose).

The start-up rows (``startup-*``) import stable_baselines3 before shmvec, point shmvec's plan
memory (``SHMVEC_PLAN_CACHE``) at a fresh file of their own, and time the build of SB3's
``make_vec_env("CartPole-v1", 8, vec_env_cls=ShmPoolVecEnv)`` (its default constructor): the
process's first pool (``startup-cold``) or its second, identical one (``startup-warm``); the first
reset and ``close()`` are timed apart and shown in ``vec_env``.

The in-process rows (``inproc-*``) hold their reference in the same process: a fixed cost of a
few µs a step is below what separate processes resolve, so the child alternates shmvec's vector
env and the reference in blocks (:mod:`bench.in_process`) and reports the median of the paired
ratios, reference time / shmvec time. ``bench/`` is this checkout's on both sides, so what
it passes must suit every tree: ``n_workers=0, main_shard=True`` (older trees refuse
``n_workers=0`` alone).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import gymnasium as gym
import numpy as np

from bench.training_jobs import WORKLOADS, build_vec_env, make_model, scaled

BARE_ENVS, BARE_SECONDS = 64, 3.0
CPU_SECONDS, CPU_ALTERNATIONS = 1.0, 3
IN_PROCESS_BLOCKS, IN_PROCESS_STEPS = 40, 300  # as bench/in_process.py's default
AGENTS_ROLLOUTS = 16  # of 32 steps x 24 slots: ~12k agent steps, ~3 s on 2 cores
RL_ZOO_ROLLOUT = 8 * 32  # PPO CartPole's rollout in RL Zoo (n_envs 8, n_steps 32): the fewest steps a scaled run takes
RL_ZOO_SHORT = 20_000  # rl-zoo-ppo-20k: a fifth of RL Zoo's run, before its first evaluation (every 25,000 steps)
STARTUP_ENVS = 8
PLAN_CACHE_VAR = "SHMVEC_PLAN_CACHE"  # shmvec.planning.plan_memory.CACHE_VAR (older trees have no such module)


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


def bare(impl: str, **layout: Any) -> dict[str, Any]:
    """CartPole x64, random actions drawn beforehand: env steps per second (``layout``: ShmVectorEnv's)."""
    import shmvec

    fns = [lambda: gym.make("CartPole-v1")] * BARE_ENVS
    envs = gym.vector.SyncVectorEnv(fns) if impl == "reference" else shmvec.ShmVectorEnv(fns, **layout)
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


def in_process_pair(pair: str, n: int) -> tuple[Any, Any]:
    """(shmvec's vector env with every env in this process, the reference), reset alike: ``pair``
    ``sb3`` (against DummyVecEnv) or an autoreset mode's name (against SyncVectorEnv)."""
    from gymnasium.vector import AutoresetMode

    import shmvec

    fns = [lambda: gym.make("CartPole-v1")] * n
    if pair == "sb3":
        from stable_baselines3.common.vec_env import DummyVecEnv

        shm, ref = shmvec.ShmPoolVecEnv(fns, n_workers=0, main_shard=True), DummyVecEnv(fns)
        for env in (shm, ref):
            env.seed(0)
            env.reset()
        return shm, ref
    mode = AutoresetMode[pair.upper()]
    shm = shmvec.ShmVectorEnv(fns, n_workers=0, main_shard=True, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    for env in (shm, ref):
        env.reset(seed=0)
    return shm, ref


def in_process(pair: str, n: int) -> dict[str, Any]:
    """The median over alternating blocks of reference µs / shmvec µs per step (above 1: shmvec faster)."""
    from bench.in_process import block, stepper

    shm, ref = in_process_pair(pair, n)
    try:
        actions = np.random.default_rng(n).integers(0, 2, size=(IN_PROCESS_STEPS, n))
        steps = (stepper(pair, shm), stepper(pair, ref))
        for step in steps:  # warm-up
            block(step, actions[:50])
        us: tuple[list[float], list[float]] = ([], [])
        gc.collect()
        for b in range(IN_PROCESS_BLOCKS):  # alternate which goes first
            for i in (0, 1) if b % 2 == 0 else (1, 0):
                us[i].append(block(steps[i], actions))
        described = f"{shm!r}: {statistics.median(us[0]):.1f} µs a step, the reference {statistics.median(us[1]):.1f}"
    finally:
        shm.close()
        ref.close()
    return {"value": statistics.median(r / s for s, r in zip(*us)), "vec_env": described}


def rl_zoo_timesteps(algo: str = "ppo", env_id: str = "CartPole-v1") -> int:
    """``n_timesteps`` of ``env_id`` in the installed RL Zoo's ``hyperparams/<algo>.yml`` (PPO
    CartPole-v1: 100,000), the length of a run of its ``train.py`` without ``-n``."""
    import rl_zoo3
    import yaml

    with open(os.path.join(os.path.dirname(rl_zoo3.__file__), "hyperparams", f"{algo}.yml")) as f:
        return int(float(yaml.safe_load(f)[env_id]["n_timesteps"]))


def rl_zoo(impl: str, scale: float, timesteps: int | None = None) -> dict[str, Any]:
    """RL Zoo's own ``train.py``, PPO CartPole with its hyperparameters and defaults (an
    ``EvalCallback`` every 25,000 steps on one env of the same class, 5 episodes): the whole
    call's seconds. ``timesteps`` (default: RL Zoo's own ``n_timesteps``) times ``scale`` steps;
    ``-n`` is passed only where that differs from RL Zoo's. shmvec's side maps ``--vec-env
    subproc`` to ``ShmPoolVecEnv``'s defaults, as a user who swaps the class in does; the
    reference is ``--vec-env dummy`` (train.py's default)."""
    import rl_zoo3.exp_manager
    import rl_zoo3.train

    import shmvec

    own = rl_zoo_timesteps()
    steps = scaled(own if timesteps is None else timesteps, scale, at_least=RL_ZOO_ROLLOUT)
    made: list[str] = []

    def shm_vec_env(env_fns, **kwargs):
        venv = shmvec.ShmPoolVecEnv(env_fns, **kwargs)
        made.append(repr(venv))
        return venv

    rl_zoo3.exp_manager.SubprocVecEnv = shm_vec_env
    with tempfile.TemporaryDirectory(prefix="gate-rl-zoo-") as logs:
        sys.argv = [
            "rl_zoo3.train", "--algo", "ppo", "--env", "CartPole-v1", "--seed", "0", "--device", "cpu", "-f", logs,
            "--vec-env", "dummy" if impl == "reference" else "subproc",
            *(["-n", str(steps)] if steps != own else []),
        ]  # fmt: skip
        start = time.perf_counter()
        rl_zoo3.train.train()
        total = time.perf_counter() - start
    # RL Zoo makes its eval env (one env) before the training envs
    return {"total": total, "steps": steps, "vec_env": "; ".join(made) or "DummyVecEnv"}


def startup_build() -> dict[str, Any]:
    """A default pool as SB3 users build one: ``make_vec_env("CartPole-v1", 8, vec_env_cls=ShmPoolVecEnv)``;
    seconds of the build, of the first reset and of ``close()``, and the layout."""
    from stable_baselines3.common.env_util import make_vec_env

    import shmvec

    start = time.perf_counter()
    venv = make_vec_env("CartPole-v1", STARTUP_ENVS, vec_env_cls=shmvec.ShmPoolVecEnv)
    built = time.perf_counter() - start
    try:
        start = time.perf_counter()
        venv.reset()
        reset = time.perf_counter() - start
        described = repr(venv)
    finally:
        start = time.perf_counter()
        venv.close()
        closed = time.perf_counter() - start
    return {"build": built, "reset": reset, "close": closed, "vec_env": described}


def startup(builds: int) -> dict[str, Any]:
    """The ``builds``-th identical default pool of this process, the plan memory a fresh file at first
    (1: cold, 2: warm): its build's seconds; every build's, reset's and close's in ``vec_env``."""
    before = os.environ.get(PLAN_CACHE_VAR)
    with tempfile.TemporaryDirectory(prefix="gate-startup-") as folder:
        os.environ[PLAN_CACHE_VAR] = os.path.join(folder, "plans.json")
        try:
            done = [startup_build() for _ in range(builds)]
        finally:
            if before is None:
                del os.environ[PLAN_CACHE_VAR]
            else:
                os.environ[PLAN_CACHE_VAR] = before
    times = "; ".join(f"build {d['build']:.3f} s, reset {d['reset']:.4f} s, close {d['close']:.3f} s" for d in done)
    return {"value": done[-1]["build"], "vec_env": f"{done[-1]['vec_env']}: {times}"}


def agents_learn(impl: str, scale: float) -> dict[str, Any]:
    """SB3 PPO ``learn()`` on MPE2 simple_spread's agents as vector slots (8 copies x 3 agents),
    bench/agents.py's run: SuperSuit's ``concat_vec_envs_v1(num_cpus=0)`` (the reference) or
    ``shmvec.concat_vec_envs_v1``'s default. A tree without it says so (the row is new there)."""
    import shmvec
    from bench import agents

    if impl != "reference" and not hasattr(shmvec, "concat_vec_envs_v1"):
        return {"absent": "this tree has no shmvec.concat_vec_envs_v1"}
    venv = agents.build("simple_spread", "supersuit k=0" if impl == "reference" else "shmvec")
    try:
        total = agents.learn_seconds(venv, n_steps=32, rollouts=max(1, round(AGENTS_ROLLOUTS * scale)))
        return {"total": total, "vec_env": repr(getattr(venv, "venv", venv))}
    finally:
        venv.close()


def main_thread_cpu(env_cls: type, n: int, k: int, adapter: str = "sb3") -> Any:
    """A pool of ``n`` envs on ``k`` workers, every wait blocking: a callable that measures the
    main thread's CPU µs per step for a while (``adapter``: ``sb3``, ShmPoolVecEnv; ``gym``, ShmVectorEnv)."""
    import shmvec

    vec_env = shmvec.ShmPoolVecEnv if adapter == "sb3" else shmvec.ShmVectorEnv
    venv = vec_env([env_cls] * n, n_workers=k, main_shard=False, max_spin=0.0)
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


def cpu_slope(
    env_cls: type, small: tuple[int, int], large: tuple[int, int], per: int, adapter: str = "sb3"
) -> dict[str, Any]:
    """µs of the main thread per step that each added env (or worker) costs: two layouts, alternated."""
    samplers = [main_thread_cpu(env_cls, *small, adapter), main_thread_cpu(env_cls, *large, adapter)]
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

    if name.startswith("startup-"):
        import stable_baselines3  # noqa: F401  (as an SB3 user's script does, before the pool)
    sys.path.insert(0, tree)
    import shmvec

    if not shmvec.__file__.startswith(tree):
        raise RuntimeError(f"shmvec was imported from {shmvec.__file__}, not from {tree}")
    if name == "bare":
        result = bare(impl)
    elif name == "bare-2workers":
        result = bare(impl, n_workers=2)
    elif name.startswith("inproc-"):
        _, adapter, n = name.split("-")
        result = in_process("sb3" if adapter == "sb3" else "next_step", int(n))
    elif name == "rl-zoo-ppo":
        result = rl_zoo(impl, scale)
    elif name == "rl-zoo-ppo-20k":
        result = rl_zoo(impl, scale, RL_ZOO_SHORT)
    elif name in ("startup-cold", "startup-warm"):
        result = startup(1 if name == "startup-cold" else 2)
    elif name == "agents-ppo":
        result = agents_learn(impl, scale)
    elif name.startswith("cpu-per-"):  # cpu-per-env, cpu-per-worker; a -gym suffix: ShmVectorEnv's
        adapter = "gym" if name.endswith("-gym") else "sb3"
        if name.startswith("cpu-per-env"):
            result = cpu_slope(InfoEnv, (16, 2), (128, 2), 112, adapter)
        else:
            result = cpu_slope(WaitingEnv, (4, 4), (16, 16), 12, adapter)
    else:
        result = training(name, impl, scale)
    print(json.dumps(result), flush=True)
    return 0
