"""What :class:`~shmvec.ShmVectorEnv` hands back from the shared rows: numpy arrays, or tensors on a device.

Without ``device`` the results are what ``SyncVectorEnv`` returns: observations in the
structure Gymnasium's ``concatenate`` builds (copies, or views of the shared rows with
``copy=False``), ``float64`` rewards and ``bool`` flags, all copies. With ``device`` the same
values come as torch tensors on it (:mod:`shmvec.adapters.torch_device`).
"""

from __future__ import annotations

import copy as copy_module
import time
from typing import Any

import numpy as np
from gymnasium import Space

from shmvec.adapters import gym_resets
from shmvec.adapters.gym_infos import add_step_infos
from shmvec.adapters.public_calls import other_call
from shmvec.adapters.torch_device import DeviceHandoff
from shmvec.engine.interface import Engine
from shmvec.engine.validation import checked_column
from shmvec.errors import ResetNeededError
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import handed_over

_perf_counter = time.perf_counter
_count_nonzero = np.count_nonzero  # a bool array's any(): ~0.1 µs, .any() ~1


class GymResults:
    """Mixin of ShmVectorEnv: its results after a reset, a step or a ``recv``, and the device's hooks."""

    copy: bool
    single_observation_space: Space
    _pool: Engine
    _obs_leaves: dict[tuple, np.ndarray]
    _flat_obs: np.ndarray | None
    _device: DeviceHandoff | None = None
    autoreset_mode: AutoresetMode
    num_envs: int
    _needs_reset: np.ndarray
    _maybe_needs_reset: bool  # False: _needs_reset is all False (its count skipped)
    _disabled: bool  # autoreset_mode is DISABLED
    _actions: Any  # GymActions
    _flat_action: np.ndarray | None  # the action rows of a space with one fixed-size leaf
    single_action_space: Space
    _clock: Any  # the pool's CallClock
    _add_info: Any  # VectorEnv._add_info
    reset_async: Any
    reset_wait: Any

    def _host_actions(self, actions: Any) -> Any:
        """The caller's actions, with torch tensors as numpy arrays when a device is set."""
        return actions if self._device is None else self._device.host_actions(actions)

    def _before_write(self, env_ids: Any = None) -> None:
        """Before a command lets the workers rewrite rows ``env_ids`` (None: all): copies still reading them end."""
        if self._device is not None:
            self._device.before_write(env_ids)

    def _step_here(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Every env in this process: the step as one direct call (see :mod:`shmvec.engine.local_step`);
        a flat array of actions goes to the envs as it is (no other process reads the rows)."""
        entered = _perf_counter()
        try:
            pool, flat, each = self._pool, self._flat_action, None
            if flat is not None and type(actions) is np.ndarray and actions.ndim:  # what columns() makes of it
                column = checked_column(actions, flat, self.single_action_space, "actions")
                each = handed_over(actions, column)
                columns, pickled = ([((), actions, column)] if each is None else []), None
            else:
                columns = self._actions.columns(actions)
                pickled = self._actions.pickled(actions)
            self._check_needs_reset()
            write = pool.actions.write
            for path, part, column in columns:
                write(path, part, column)
            return self._step_outcome(pool.step_here(pickled or None, each), pool.episode_ended)
        finally:
            self._clock.whole_step(entered, _perf_counter())

    @other_call
    def _reset_held(self, seed: Any, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def _reset_here(self, seed: Any, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """Every env in this process: ``reset`` as one direct call (``reset_async`` and ``reset_wait``'s
        checks and results, the main shard resetting the envs; see :mod:`shmvec.engine.local_step`)."""
        entered = _perf_counter()
        try:
            seeds = gym_resets.seeds(seed, self.num_envs)
            mask = None
            if options is not None and "reset_mask" in options:
                options = dict(options)
                mask = gym_resets.checked_mask(options.pop("reset_mask"), self.num_envs)
            targets = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
            env_infos = self._pool.reset_here({i: {"seed": seeds[i], "options": options} for i in targets})
            if mask is None:
                self._needs_reset[:] = False
            else:
                self._needs_reset[mask] = False
            infos: dict[str, Any] = {}
            for i in sorted(env_infos):  # in env order, as the references add them
                infos = self._add_info(infos, env_infos[i], i)
            return self._observations(), infos
        finally:
            self._clock.whole_call(entered, _perf_counter())

    def _check_needs_reset(self) -> None:
        if self._disabled and self._maybe_needs_reset and _count_nonzero(self._needs_reset):
            raise ResetNeededError(
                f"autoreset_mode is DISABLED and the episodes of envs {np.flatnonzero(self._needs_reset).tolist()} "
                "ended: reset them first with reset(options={'reset_mask': mask})"
            )

    def _step_outcome(
        self, records: list, episode_ended: bool = True
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """A step's results, from the rows and its ``records``. ``episode_ended`` False: no env's
        episode ended in it (the in-process step knows), so every flag is False."""
        pool = self._pool
        terminated, truncated = pool.terminated.copy(), pool.truncated.copy()
        if self._disabled:
            if episode_ended:
                self._needs_reset, self._maybe_needs_reset = terminated | truncated, True
            else:  # the step ran, so none needed a reset before it, and none ended in it (~0.8 µs less)
                self._maybe_needs_reset = False
        # records are sorted by env index, as SyncVectorEnv adds them; the rows' infos come as columns
        infos = add_step_infos({}, self._add_info, self.num_envs, records, pool.info_groups)
        return (*self._step_results(terminated, truncated), infos)

    def _on_device(self, env_ids: np.ndarray | None = None, scalars: bool = True) -> tuple[Any, ...]:
        pool = self._pool
        rows = (pool.rewards, pool.terminated, pool.truncated) if scalars else ()
        return self._device.results(self.single_observation_space, pool.obs_leaves, pool.pickled_obs, rows, env_ids)

    def _observations(self) -> Any:
        """Every env's observation, after a reset or a step."""
        if self._device is not None:
            return self._on_device(scalars=False)[0]
        flat = self._flat_obs
        if flat is not None:
            return flat.copy() if self.copy else flat
        if self.copy:
            leaves = {path: view.copy() for path, view in self._obs_leaves.items()}
        else:
            leaves = self._obs_leaves
        pickled = self._pool.pickled_obs
        if pickled:  # leaves with no fixed size: a tuple of one value per env, as `concatenate` makes
            leaves = {**leaves, **{path: tuple(column) for path, column in pickled.items()}}
            if self.copy:  # the pool keeps these objects for the envs that a masked reset leaves alone
                leaves.update(copy_module.deepcopy({path: leaves[path] for path in pickled}))
        return lay.unflatten(self.single_observation_space, leaves)

    def _step_results(self, terminated: np.ndarray, truncated: np.ndarray) -> tuple[Any, Any, Any, Any]:
        """``(obs, rewards, terminations, truncations)`` of a step; ``terminated``/``truncated``: copies of the rows."""
        if self._device is not None:
            return self._on_device()
        return self._observations(), self._pool.rewards.copy(), terminated, truncated

    def _batch_results(self, env_ids: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> tuple:
        """``(obs, rewards, terminations, truncations)`` of the rows ``env_ids`` of an async batch."""
        if self._device is not None:
            return self._on_device(env_ids)
        return self._batch_observations(env_ids), self._pool.rewards[env_ids], terminated, truncated

    def _batch_observations(self, env_ids: np.ndarray) -> Any:
        if self._flat_obs is not None:
            return self._flat_obs[env_ids]
        leaves: dict[tuple, Any] = {path: view[env_ids] for path, view in self._obs_leaves.items()}
        for path, column in self._pool.pickled_obs.items():  # no fixed size: a tuple, as `concatenate` makes
            leaves[path] = copy_module.deepcopy(tuple(column[i] for i in env_ids.tolist()))
        return lay.unflatten(self.single_observation_space, leaves)
