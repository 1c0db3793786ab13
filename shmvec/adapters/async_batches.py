"""EnvPool-style async batches for :class:`~shmvec.ShmVectorEnv`: ``async_reset``, ``send``, ``recv``.

The engine side is :mod:`shmvec.engine.async_schedule`; this mixin only checks and writes actions and
turns a batch of rows into Gymnasium's return values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from shmvec.adapters import gym_resets
from shmvec.adapters.gym_infos import add_record_infos
from shmvec.adapters.public_calls import other_call, step_end, step_start
from shmvec.engine.validation import seconds
from shmvec.errors import InvalidActionError, NoPendingCallError, ResetNeededError
from shmvec.gymnasium_1_1 import AutoresetMode


class _BatchInfos:
    """Gymnasium's own ``_add_info`` over a batch: its arrays and masks get ``len(batch)`` rows, not ``num_envs``."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int):
        self.num_envs = num_envs


class AsyncBatches:
    """``async_reset`` / ``recv`` / ``send`` over ``batch_size`` envs at a time (mixed into ShmVectorEnv)."""

    batch_size: int
    _last_env_ids: np.ndarray | None = None

    @other_call
    def async_reset(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Start resetting every env (env ``i`` gets ``seed + i``); :meth:`recv` returns them.

        ``options["reset_mask"]`` (a bool array over the envs) resets only those envs, which
        must not have a send pending (e.g. the envs of a batch that ended, in ``DISABLED``
        mode); the others keep running.

        Example:
            >>> import gymnasium as gym
            >>> from shmvec import ShmVectorEnv
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2, batch_size=2)
            >>> envs.async_reset(seed=0)
            >>> obs, rewards, terminations, truncations, infos = envs.recv()
            >>> obs.shape, len(infos["env_id"])
            ((2, 4), 2)
            >>> envs.send(np.zeros(2, dtype=np.int64))  # actions for the envs of that batch
            >>> obs, rewards, terminations, truncations, infos = envs.recv()
            >>> envs.close()
        """
        self._check_open()
        seeds = gym_resets.seeds(seed, self.num_envs)
        targets = list(range(self.num_envs))
        if options is not None and "reset_mask" in options:  # only those envs, as reset() does
            options = dict(options)
            targets = np.flatnonzero(gym_resets.checked_mask(options.pop("reset_mask"), self.num_envs)).tolist()
        self._before_write(targets)
        self._pool.send_reset({i: {"seed": seeds[i], "options": options} for i in targets})
        self._needs_reset[targets] = False

    @step_start
    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Step the envs ``env_ids`` (default: those of the last :meth:`recv`) with ``actions``, one per env.

        Raises:
            InvalidActionError: ``len(actions) != len(env_ids)``, or actions of the wrong shape or dtype kind.
            AlreadyPendingError: an env in ``env_ids`` has a send pending (recv it first).
            ResetNeededError: ``DISABLED`` mode and an env whose episode ended.
        """
        self._check_open()
        env_ids = self._send_targets(env_ids)
        columns = self._actions.batch_columns(self._host_actions(actions), env_ids)
        if self.autoreset_mode == AutoresetMode.DISABLED and self._needs_reset[env_ids].any():
            raise ResetNeededError(
                f"autoreset_mode is DISABLED and the episodes of envs {env_ids[self._needs_reset[env_ids]].tolist()} "
                "ended: reset them with async_reset(options={'reset_mask': mask}) or reset() first"
            )
        self._pool.check_can_send(env_ids)
        write = self._pool.actions.write
        for path, part, column in columns:
            write(path, part, column, env_ids)
        self._before_write(env_ids)
        self._pool.send(env_ids)

    @step_end
    def recv(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The results of the first ``batch_size`` envs to finish, first finished first.

        Returns ``(obs, rewards, terminations, truncations, infos)`` with ``batch_size`` rows;
        ``infos["env_id"]`` gives the env index of each row. With ``batch_size == num_envs``
        the rows are in env order, as :meth:`step` returns them.
        """
        self._check_open()
        pool = self._pool
        env_ids, records = pool.recv(self.batch_size, seconds(timeout))
        self._last_env_ids = env_ids
        terminated, truncated = pool.terminated[env_ids], pool.truncated[env_ids]  # copies
        if self.autoreset_mode == AutoresetMode.DISABLED:
            self._needs_reset[env_ids] = terminated | truncated
            self._maybe_needs_reset = True
        rows = ((n, records[i]) for n, i in enumerate(env_ids.tolist()) if i in records)
        infos = add_record_infos({}, _BatchInfos(len(env_ids))._add_info, rows)
        infos["env_id"] = env_ids
        return (*self._batch_results(env_ids, terminated, truncated), infos)

    def _send_targets(self, env_ids: Any) -> np.ndarray:
        if env_ids is None:
            if self._last_env_ids is None:
                raise NoPendingCallError(
                    "send() without env_ids sends to the envs of the last recv(); call recv() first"
                )
            return self._last_env_ids
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or not (ids.dtype.kind in "iu" or (ids.size == 0 and ids.dtype.kind == "f")):
            raise InvalidActionError(f"env_ids must be a 1-D sequence of env indices, got {env_ids!r}")
        if ids.size and not (0 <= ids.min() and ids.max() < self.num_envs):
            raise IndexError(f"env_ids must be in [0, {self.num_envs}), got {ids.tolist()}")
        return ids.astype(np.int64)


def checked_batch_size(batch_size: Any, num_envs: int | None) -> int | None:
    """``batch_size`` checked against ``num_envs`` (``None``: all envs)."""
    if batch_size is None:
        return num_envs
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or not 1 <= batch_size <= (num_envs or batch_size)
    ):
        raise ValueError(f"batch_size must be an int between 1 and num_envs={num_envs}, got {batch_size!r}")
    return batch_size
