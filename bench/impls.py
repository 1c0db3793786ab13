"""The vector env implementations compared, behind one small interface.

Each :class:`Impl` builds a vector env from ``env_fns`` (and ``K`` workers where that
means something) and the :class:`VecRunner` it returns resets, steps and closes it the
same way whichever library it comes from.

=============  ======================================  =========================
name           what                                    processes
=============  ======================================  =========================
``shm_sb3``    ``shmvec.ShmPoolVecEnv``                K workers
``shm_gym``    ``shmvec.ShmVectorEnv``                 K workers
``shm_sb3_main`` ``ShmPoolVecEnv(use_main_process=True)``    main + K-1 workers
``shm_gym_main`` ``ShmVectorEnv(use_main_process=True)``     main + K-1 workers
``shm_sb3_auto`` ``ShmPoolVecEnv(env_fns)`` (default)  chosen at start-up
``shm_gym_auto`` ``ShmVectorEnv(env_fns)`` (default)   chosen at start-up
``dummy``      SB3 ``DummyVecEnv``                     none (in-process)
``subproc``    SB3 ``SubprocVecEnv``                   one per env
``sync``       Gymnasium ``SyncVectorEnv``             none (in-process)
``async``      Gymnasium ``AsyncVectorEnv(shared_memory=True)``  one per env
=============  ======================================  =========================

``SubprocVecEnv`` is started with ``fork`` here: with its default (forkserver) every one
of N children imports SB3 and torch, which takes about a minute for N=64 on 2 cores;
the start method does not change the per-step cost measured.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class Impl:
    """One vector env implementation.

    Attributes:
        name: short id (CLI, tables).
        label: human name (plots).
        api: ``"sb3"`` (``step`` returns 4 values, ``seed()`` then ``reset()``) or ``"gym"``.
        uses_k: takes a worker count K; otherwise K is ignored (and reported as ``-``).
        procs_per_env: starts one process per env (N processes).
        transport: how observations reach the main process.
    """

    name: str
    label: str
    api: str
    uses_k: bool
    procs_per_env: bool
    transport: str
    _build: Callable[[list, int | None], Any]

    def missing(self) -> str | None:
        """Why this implementation cannot run here, or ``None`` if it can."""
        try:
            self._build(None, None)  # a dry call: only imports
        except Exception as exc:  # ImportError, or a module mid-edit that does not import
            return f"{self.label} unavailable: {type(exc).__name__}: {exc}"
        return None

    def build(self, env_fns: list, k: int | None) -> Any:
        return self._build(env_fns, k)

    def lanes(self, n: int, k: int | None) -> int:
        """How many envs can step at the same time (the parallelism the ideal allows)."""
        if self.uses_k:
            return min(k or 1, CORES)
        return min(n, CORES) if self.procs_per_env else 1

    def tag(self, k: int | None) -> str:
        """Column name: ``shm_sb3 K=2`` for K-aware implementations, else the name."""
        return f"{self.name} K={k}" if self.uses_k else self.name


def _shm_sb3(env_fns, k):
    from shmvec import ShmPoolVecEnv

    return None if env_fns is None else ShmPoolVecEnv(env_fns, n_workers=k)


def _shm_gym(env_fns, k):
    from shmvec import ShmVectorEnv  # being written; skipped until it imports

    return None if env_fns is None else ShmVectorEnv(env_fns, n_workers=k)


def _shm_sb3_main(env_fns, k):
    from shmvec import ShmPoolVecEnv

    # K shards in parallel: the main process steps one of them, K-1 workers the rest.
    return None if env_fns is None else ShmPoolVecEnv(env_fns, n_workers=(k or 1) - 1, use_main_process=True)


def _shm_gym_main(env_fns, k):
    from shmvec import ShmVectorEnv

    return None if env_fns is None else ShmVectorEnv(env_fns, n_workers=(k or 1) - 1, use_main_process=True)


def _shm_sb3_auto(env_fns, k):
    from shmvec import ShmPoolVecEnv

    return None if env_fns is None else ShmPoolVecEnv(env_fns)  # n_workers=None: the automatic choice


def _shm_gym_auto(env_fns, k):
    from shmvec import ShmVectorEnv

    return None if env_fns is None else ShmVectorEnv(env_fns)


def _shm_sb3_zero_copy(env_fns, k):
    from shmvec import ShmPoolVecEnv

    return None if env_fns is None else ShmPoolVecEnv(env_fns, copy=False)  # the default execution, no obs copy


def _dummy(env_fns, k):
    from stable_baselines3.common.vec_env import DummyVecEnv

    return None if env_fns is None else DummyVecEnv(env_fns)


def _subproc(env_fns, k):
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return None if env_fns is None else SubprocVecEnv(env_fns, start_method="fork")


def _sync(env_fns, k):
    from gymnasium.vector import SyncVectorEnv

    return None if env_fns is None else SyncVectorEnv(env_fns)


def _sync_same_step(env_fns, k):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    # SB3's auto-reset: the baseline the issue names for ShmPoolVecEnv
    return None if env_fns is None else SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)


def _async(env_fns, k):
    from gymnasium.vector import AsyncVectorEnv

    return None if env_fns is None else AsyncVectorEnv(env_fns, shared_memory=True)


IMPLS: dict[str, Impl] = {
    impl.name: impl
    for impl in [
        Impl("shm_sb3", "shmvec ShmPoolVecEnv", "sb3", True, False, "shared memory", _shm_sb3),
        Impl("shm_gym", "shmvec ShmVectorEnv", "gym", True, False, "shared memory", _shm_gym),
        Impl("shm_sb3_main", "shmvec ShmPoolVecEnv main_shard", "sb3", True, False, "shared memory", _shm_sb3_main),
        Impl("shm_gym_main", "shmvec ShmVectorEnv main_shard", "gym", True, False, "shared memory", _shm_gym_main),
        Impl("shm_sb3_auto", "shmvec ShmPoolVecEnv default", "sb3", False, False, "shared memory", _shm_sb3_auto),
        Impl("shm_gym_auto", "shmvec ShmVectorEnv default", "gym", False, False, "shared memory", _shm_gym_auto),
        Impl(
            "shm_sb3_zero_copy",
            "shmvec ShmPoolVecEnv(copy=False)",
            "sb3",
            False,
            False,
            "shared memory, no copy",
            _shm_sb3_zero_copy,
        ),
        Impl("dummy", "SB3 DummyVecEnv", "sb3", False, False, "in-process copy", _dummy),
        Impl("subproc", "SB3 SubprocVecEnv", "sb3", False, True, "pickled over pipes", _subproc),
        Impl("sync", "Gymnasium SyncVectorEnv", "gym", False, False, "in-process copy", _sync),
        Impl(
            "sync_same", "Gymnasium SyncVectorEnv(SAME_STEP)", "gym", False, False, "in-process copy", _sync_same_step
        ),
        Impl("async", "Gymnasium AsyncVectorEnv(shm)", "gym", False, True, "shared memory (infos pickled)", _async),
    ]
}
SHMVEC = ("shm_sb3", "shm_gym", "shm_sb3_main", "shm_gym_main")
BASELINE = "dummy"


def get_impl(name: str) -> Impl:
    try:
        return IMPLS[name]
    except KeyError:
        raise ValueError(f"unknown implementation {name!r}; choose from {', '.join(IMPLS)}") from None


class VecRunner:
    """A live vector env of either API: ``reset(seed)``, ``step(actions)``, ``close()``.

    Builds the env on construction; always ``close()`` it (it is a context manager).
    """

    def __init__(self, impl: Impl, env_fns: list, k: int | None):
        self.impl = impl
        self.num_envs = len(env_fns)
        self.env = impl.build(env_fns, k)
        self.step = self.env.step  # bound once: no adapter frame on the timed path

    @property
    def single_action_space(self):
        env = self.env
        return env.single_action_space if self.impl.api == "gym" else env.action_space

    def reset(self, seed: int = 0) -> Any:
        if self.impl.api == "gym":
            return self.env.reset(seed=seed)
        self.env.seed(seed)
        return self.env.reset()

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> VecRunner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def pregenerate_actions(action_space, n_envs: int, n_steps: int = 64, seed: int = 0) -> np.ndarray:
    """``n_steps`` batches of ``n_envs`` actions, the same for every implementation."""
    action_space.seed(seed)
    batch = [[action_space.sample() for _ in range(n_envs)] for _ in range(n_steps)]
    return np.asarray(batch, dtype=action_space.dtype)
