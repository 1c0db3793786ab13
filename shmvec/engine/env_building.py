"""Building a shard's envs from their env_fns, and what the main process learns of them."""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym

from shmvec.engine.shard import EnvFailed
from shmvec.ipc.protocol import Hello


def build_envs(env_fns, env_wrapper, first_env: int, where: str) -> list[gym.Env]:
    """Call each env_fn (then ``env_wrapper``); an error names the env index and ``where``."""
    envs: list[gym.Env] = []
    for i, env_fn in enumerate(env_fns, start=first_env):
        try:
            env = env_fn()
            envs.append(env_wrapper(env) if env_wrapper is not None else env)
        except Exception as exc:
            for built in envs:
                _close_quietly(built)
            raise EnvFailed(i) from exc
    seen: dict[int, int] = {}
    for j, env in enumerate(envs):
        other = seen.setdefault(id(env.unwrapped), j)
        if other != j:
            for built in envs:
                _close_quietly(built)
            raise ValueError(
                f"env_fns[{first_env + other}] and env_fns[{first_env + j}] returned the same env instance "
                f"(in {where}). Each env_fn must create a new env (e.g. `lambda: gym.make(...)`), not return "
                "a shared one."
            )
    return envs


def describe_envs(worker: int, envs: list[gym.Env]) -> Hello:
    """What the main process needs to know about a shard's envs."""
    first = envs[0]
    return Hello(
        worker,
        [(env.observation_space, env.action_space) for env in envs],
        first.metadata,
        first.render_mode,
        _picklable_or_none(first.spec),
    )


def _picklable_or_none(obj: Any) -> Any:
    try:
        pickle.dumps(obj)
        return obj
    except Exception:
        return None


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:
        pass
