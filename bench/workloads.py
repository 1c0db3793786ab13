"""The envs benchmarked, by name, each with what it needs installed.

Names are Gymnasium ids (``CartPole-v1``, ``Acrobot-v1``, ``HumanoidStandup-v5``,
``ALE/Breakout-v5``) or synthetic specs ``synth:<cost>:<shape>[:<dtype>]``, e.g.
``synth:150us:84x84x4:uint8`` or ``synth:0us:4`` (cost units: ns, us, ms, s).

Example:
    >>> w = get_workload("synth:150us:84x84x4:uint8")
    >>> w.obs_bytes, w.light
    (28224, False)
"""

from __future__ import annotations

import functools
import importlib.util
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from bench.synthetic import SyntheticEnv

ZERO_COST = "synth:0us:4"  # no env work: what is left is the vector env's own overhead
IMAGE_150US = "synth:150us:84x84x4:uint8"  # the image target
LARGE_OBS = "synth:0us:210x160x3:uint8"  # Atari-sized frames and no env work: the cost of copying them

_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Workload:
    """One env to benchmark.

    Attributes:
        name: its name on the CLI and in tables.
        make: picklable zero-argument callable that builds one env.
        light: a cheap env (a few µs a step), where per-step overhead dominates.
        requires: module that must be importable (``None``: always available).
        obs_bytes: bytes of one observation (filled in from the space).
    """

    name: str
    make: Callable[[], gym.Env]
    light: bool = False
    requires: str | None = None
    obs_bytes: int = 0

    def missing(self) -> str | None:
        """Why this workload cannot run here, or ``None`` if it can."""
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"{self.name} needs `pip install {self.requires.replace('_', '-')}` (or shmvec[bench])"
        return None

    def env_fns(self, n: int) -> list[Callable[[], gym.Env]]:
        return [self.make] * n

    def short(self) -> str:
        """A file-name-safe version of the name."""
        return re.sub(r"[^A-Za-z0-9.-]+", "_", self.name).strip("_")


def make_atari(env_id: str) -> gym.Env:
    """Build an ALE env; Gymnasium 1.x needs ale_py's envs registered in each process."""
    import ale_py

    gym.register_envs(ale_py)
    return gym.make(env_id)


def parse_synthetic(name: str) -> dict:
    """``synth:150us:84x84x4:uint8`` -> ``SyntheticEnv`` keyword arguments."""
    parts = name.split(":")
    if len(parts) not in (3, 4) or parts[0] != "synth":
        raise ValueError(f"synthetic workloads look like synth:<cost>:<shape>[:<dtype>], got {name!r}")
    match = re.fullmatch(r"([0-9.]+)(ns|us|ms|s)", parts[1])
    if not match:
        raise ValueError(f"step cost must be like 0us, 150us, 1ms; got {parts[1]!r}")
    shape = tuple(int(x) for x in parts[2].split("x"))
    dtype = parts[3] if len(parts) == 4 else "float32"
    return {"step_cost": float(match[1]) * _UNITS[match[2]], "obs_shape": shape, "dtype": dtype}


def get_workload(name: str) -> Workload:
    """The workload called ``name`` (see the module docstring for the names)."""
    if name.startswith("synth:"):
        kwargs = parse_synthetic(name)
        nbytes = int(np.prod(kwargs["obs_shape"])) * np.dtype(kwargs["dtype"]).itemsize
        light = kwargs["step_cost"] <= 10e-6 and nbytes <= 1024
        return Workload(name, functools.partial(SyntheticEnv, **kwargs), light=light, obs_bytes=nbytes)
    if name.startswith("ALE/"):
        return Workload(name, functools.partial(make_atari, name), requires="ale_py", obs_bytes=210 * 160 * 3)
    known = {
        "CartPole-v1": (True, None, 4 * 4),
        "Acrobot-v1": (True, None, 6 * 4),
        "Pendulum-v1": (True, None, 3 * 4),
    }
    if name in known:
        light, requires, nbytes = known[name]
        return Workload(name, functools.partial(gym.make, name), light=light, requires=requires, obs_bytes=nbytes)
    requires = "mujoco" if name.split("-")[0] in _MUJOCO else None
    return Workload(name, functools.partial(gym.make, name), requires=requires)


_MUJOCO = {
    "Ant",
    "HalfCheetah",
    "Hopper",
    "Humanoid",
    "HumanoidStandup",
    "InvertedDoublePendulum",
    "InvertedPendulum",
    "Pusher",
    "Reacher",
    "Swimmer",
    "Walker2d",
}


def raw_step_cost(workload: Workload, seconds: float = 0.3, seed: int = 0) -> float:
    """Seconds one ``env.step()`` takes in this process, no vector env (the serial ideal)."""
    env = workload.make()
    try:
        env.action_space.seed(seed)
        actions = [env.action_space.sample() for _ in range(64)]
        env.reset(seed=seed)
        steps, start = 0, time.perf_counter()
        while True:
            for action in actions:
                _, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    env.reset()
            steps += len(actions)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return elapsed / steps
    finally:
        env.close()
