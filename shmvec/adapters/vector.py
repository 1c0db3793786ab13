"""``ShmVectorEnv``: the shared-memory pool as a Gymnasium ``VectorEnv``.

The engine (:class:`~shmvec.engine.pool.ShmPool`) steps the envs and auto-resets them inside
the workers in the requested :class:`~gymnasium.vector.AutoresetMode`; this adapter only
checks and writes actions, wraps the shared observation buffers in the structure
Gymnasium's ``concatenate`` returns, and turns the rare per-env infos into Gymnasium's
dict of arrays with ``_key`` masks (through ``VectorEnv._add_info``, so the format is
Gymnasium's own). With the same seeds and actions it returns exactly what
:class:`gymnasium.vector.SyncVectorEnv` returns.
"""

from __future__ import annotations

import copy as copy_module
import dataclasses
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import Space, logger
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from shmvec.ipc import layout as lay
from shmvec.engine import ops
from shmvec.errors import (
    AlreadyPendingError,
    ClosedEnvError,
    InvalidActionError,
    NoPendingCallError,
    ResetNeededError,
    SpaceMismatchError,
    StepStateError,
    StepTimeoutError,
    UnbatchedActionError,
    WorkerDiedError,
)
from shmvec.options import PoolOptions, options_doc
from shmvec.backends import make_pool
from shmvec.engine.interface import Engine
from shmvec.ipc.protocol import Reset, RunOps
from shmvec.engine.validation import checked_column, seconds
from shmvec.adapters.async_batches import AsyncBatches, add_record_infos

__all__ = ["ShmVectorEnv", "make_vec"]

# Names `call` refuses, as AsyncVectorEnv does: they would bypass the shared buffers
# (the last two are AsyncVectorEnv's own worker commands, refused to the letter).
_RESERVED_CALLS = ("reset", "step", "close", "_setattr", "_check_spaces")


class ShmVectorEnv(AsyncBatches, VectorEnv):
    """A drop-in replacement for Gymnasium's ``AsyncVectorEnv``/``SyncVectorEnv`` over shared memory.

    ``len(env_fns)`` envs run in ``n_workers`` processes (contiguous shards, sizes differing
    by at most one). Workers write observations, rewards and termination flags straight
    into shared numpy buffers and auto-reset their envs themselves, so a step pickles
    nothing unless an env returns a non-empty info or ends an episode. With the same seeds
    and actions, every result (observations, rewards, terminations, truncations, infos
    with their ``_key`` masks, ``final_obs``/``final_info``) equals ``SyncVectorEnv``'s.

    Example:
        >>> import gymnasium as gym
        >>> from shmvec import ShmVectorEnv
        >>> with ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2) as envs:
        ...     obs, infos = envs.reset(seed=42)
        ...     obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        >>> obs.shape, rewards.dtype
        ((4, 4), dtype('float64'))

    Args:
        env_fns: callables that each build a new env (lambdas and closures are fine).
        n_workers: worker processes (see the pool options below).
        copy: if ``True`` (default), :meth:`reset` and :meth:`step` return observations
            that belong to the caller and never change. If ``False`` they return *views
            into shared memory*: no copy is made, but their contents are overwritten by
            the next :meth:`step` or :meth:`reset` (the same contract as
            ``SyncVectorEnv(copy=False)``); copy what you keep, e.g. in a replay buffer.
        autoreset_mode: ``AutoresetMode`` (or its string value) applied when an episode
            ends: ``NEXT_STEP`` (default), ``SAME_STEP`` (the final observation and info
            are in ``infos["final_obs"]``/``infos["final_info"]``) or ``DISABLED`` (reset
            ended envs yourself with ``reset(options={"reset_mask": mask})``).
        observation_mode: as ``AsyncVectorEnv``'s: ``"same"`` (default: every env has env
            0's observation space), ``"different"`` (spaces may differ in their bounds but
            not in structure, shapes and dtypes; :attr:`observation_space` is
            ``batch_differing_spaces`` of them) or a tuple ``(observation_space,
            single_observation_space)`` to use as given (the envs' spaces must share its
            shapes and dtypes). Action spaces must always be equal.
        batch_size: envs per :meth:`recv` in async batches (EnvPool's ``batch_size``),
            between 1 and ``num_envs`` (default). Below ``num_envs`` use
            :meth:`async_reset`, :meth:`send` and :meth:`recv` instead of reset/step;
            with ``n_workers`` and ``main_shard`` unset, every env then runs in a worker
            (a main shard's envs step inside :meth:`send`, where they cannot overlap
            the caller's policy).
        **pool_options: how the envs run, shared with every shmvec adapter
            (:class:`~shmvec.options.PoolOptions`): start_method, timeout, worker_threads,
            max_spin, main_shard, on_worker_failure, max_restarts, as below. In restart
            mode the envs of a dead worker report, for that step, the reset observation,
            reward 0, ``terminated=False``, ``truncated=True`` and
            ``infos["shmvec_restarted"]`` (no ``final_obs``: it died with the worker; in
            ``SAME_STEP`` mode their reset info is in ``infos``); in ``NEXT_STEP`` mode
            their next step is an ordinary autoreset step (do not bootstrap from the
            observation returned with the truncation); in ``DISABLED`` mode reset them.

    Each env gets its action as ``SyncVectorEnv`` passes it: a row of the caller's array in
    the caller's dtype (float64 actions for a float32 space stay float64), or the caller's
    Python number or list (see :mod:`shmvec.ipc.action_rows`).

    Any space works. Box, Discrete, MultiDiscrete and MultiBinary leaves (nested in Dict
    and Tuple too) live in shared memory; leaves with no fixed size (Graph, Sequence,
    Text, OneOf, user-defined ``Space`` subclasses) travel pickled through each worker's
    pipe, leaf by leaf, every step: their observations back (batched as ``SyncVectorEnv``
    batches them: a tuple with one value per env), their actions out (pass a sequence of
    one action per env, as ``action_space.sample()`` gives). That costs a pipe round trip
    per worker: on a 2-core machine with 8 trivial envs in 2 workers, one pickled
    observation leaf made a step about 3x slower (~200-430 µs instead of ~55-160 µs),
    one pickled action leaf about 2x. Spaces with only fixed-size leaves pickle nothing
    for them and pay nothing for this.

    As in ``AsyncVectorEnv``, :meth:`step`, :meth:`reset` and :meth:`call` are each an
    ``*_async``/``*_wait`` pair, one call may be pending at a time, and misuse raises
    Gymnasium's errors with its messages: :class:`~shmvec.errors.NoPendingCallError` (a
    ``NoAsyncCallError``), :class:`~shmvec.errors.AlreadyPendingError` (an
    ``AlreadyPendingCallError``), :class:`~shmvec.errors.ClosedEnvError` (a
    ``ClosedEnvironmentError``); a wait that times out raises
    :class:`~shmvec.errors.StepTimeoutError` (a ``multiprocessing.TimeoutError``), after
    which the env is unusable: ``close()`` it.

    Example:
        >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
        >>> envs.reset_async(seed=0)
        >>> obs, infos = envs.reset_wait(timeout=30)
        >>> envs.call_async("gravity")
        >>> envs.call_wait()
        (9.8, 9.8, 9.8, 9.8)
        >>> envs.close(terminate=True)
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_workers: int | None = None,
        *,
        copy: bool = True,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        observation_mode: str | tuple[Space, Space] = "same",
        batch_size: int | None = None,
        **pool_options: Any,
    ):
        super().__init__()
        self.env_fns = env_fns
        self.observation_mode = observation_mode
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = bool(copy)
        self._state = AsyncState.DEFAULT  # what is pending, as AsyncVectorEnv tracks it
        obs_space_match = _obs_space_match(observation_mode)
        options = PoolOptions.from_kwargs(type(self).__name__, n_workers=n_workers, **pool_options)
        self.batch_size = _batch_size(batch_size, len(env_fns) if isinstance(env_fns, Sequence) else None)
        async_batches = self.batch_size is not None and self.batch_size < len(env_fns)
        if async_batches and options.n_workers is None and options.main_shard is None:
            options = dataclasses.replace(options, main_shard=False)  # every env steps beside the policy
        try:
            self._pool: Engine = make_pool(env_fns, options, autoreset_mode=self.autoreset_mode, obs_space_match=obs_space_match)
        except SpaceMismatchError as exc:
            if exc.space == "observation" and observation_mode == "different":
                batch_differing_spaces(exc.spaces)  # AsyncVectorEnv fails here first, if it fails
            raise self._space_mismatch(exc.space, exc.spaces) from exc
        pool = self._pool
        try:
            self.num_envs = pool.num_envs
            self.n_workers = pool.n_workers
            self.metadata = dict(pool.env_metadata)  # a copy: never touch the env's class-level dict
            self.metadata["autoreset_mode"] = self.autoreset_mode
            self.render_mode = pool.env_render_mode
            self.single_action_space = pool.single_action_space
            self._leaf_action_spaces = {path: lay.get_path(self.single_action_space, path) for path in pool.action_leaves}
            self.single_observation_space, self.observation_space = self._observation_spaces(observation_mode)
            self.action_space = batch_space(self.single_action_space, self.num_envs)
            self._obs_leaves = pool.obs_leaves
            self._flat_obs = pool.obs_leaves.get(()) if len(pool.obs_leaves) == 1 else None
            self._action_leaves = list(pool.action_leaves.items())
            # DISABLED mode: envs whose episode ended and that were not reset since.
            self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
            self._reset_mask: np.ndarray | None = None  # the pending reset's, between reset_async and reset_wait
        except BaseException:
            pool.close()
            raise

    def _observation_spaces(self, observation_mode: str | tuple[Space, Space]) -> tuple[Space, Space]:
        """``(single_observation_space, observation_space)``, built as ``AsyncVectorEnv`` builds them."""
        env0_space = self._pool.single_observation_space
        if isinstance(observation_mode, tuple):
            batched, single = observation_mode
            if not is_space_dtype_shape_equiv(single, env0_space):  # the pool compared every env with env 0's
                raise self._space_mismatch("observation")
            return single, batched
        if observation_mode == "different":
            return env0_space, batch_differing_spaces(list(self.get_attr("observation_space")))
        return env0_space, batch_space(env0_space, self.num_envs)

    def _space_mismatch(self, space: str | None, spaces: list[Space] | None = None) -> SpaceMismatchError:
        """``AsyncVectorEnv``'s error for envs whose ``space`` spaces (env 0's first) do not match, word for word."""
        if space == "action":
            return SpaceMismatchError(
                f"Some environments have an action space different from `{spaces[0]}`. "
                "In order to batch actions, the action spaces from all environments must be equal."
            )
        if self.observation_mode == "same":
            return SpaceMismatchError(
                f"{type(self).__name__}(..., observation_mode='same') however some of the sub-environments "
                "observation spaces are not equivalent. If this is intentional, use `observation_mode='different'` instead."
            )
        return SpaceMismatchError(
            f"{type(self).__name__}(..., observation_mode='different' or custom space) however the "
            "sub-environment's observation spaces do not share a common shape and dtype."
        )

    # -- reset ---------------------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs (all, or those in ``options["reset_mask"]``) and return ``(obs, infos)``.

        Args:
            seed: ``None`` (random seeds), an ``int`` ``s`` (env ``i`` gets ``s + i``) or a
                list with one seed (or ``None``) per env.
            options: passed to every reset env's ``reset``. The key ``"reset_mask"`` (a bool
                array of shape ``(num_envs,)``) resets only the envs where it is ``True``; it
                is removed from the options the envs see. The caller's dict is not modified.

        Returns:
            The batched observations (all envs; rows of envs not reset are unchanged) and
            the infos of the reset envs as a dict of arrays with ``_key`` masks.

        Example:
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> first, infos = envs.reset(seed=[0, 1, 2, 3])  # seed=0 gives the same seeds
            >>> obs, infos = envs.reset(options={"reset_mask": np.array([True, False, False, True])})
            >>> bool((obs[1:3] == first[1:3]).all())  # envs 1 and 2 were not reset
            True
            >>> envs.close()
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """Start resetting the envs, as :meth:`reset` does; :meth:`reset_wait` returns the results.

        Raises:
            AlreadyPendingError: another call is pending (e.g. a ``step_async`` not yet waited for).
        """
        self._check_open()
        seeds = self._seeds(seed)
        self._check_idle("reset_async")
        self._check_full_batches("reset")
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = self._check_reset_mask(options.pop("reset_mask"))
        targets = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        self._pool.call_async(Reset({i: {"seed": seeds[i], "options": options} for i in targets}))
        self._reset_mask = mask
        self._state = AsyncState.WAITING_RESET

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset started by :meth:`reset_async` and return ``(obs, infos)``, as :meth:`reset` does.

        Args:
            timeout: seconds to wait (any real number; ``0`` only takes what is ready);
                ``None`` uses the ``timeout`` given to the constructor.

        Raises:
            NoPendingCallError: no reset is pending.
            StepTimeoutError: the envs did not answer within ``timeout`` (the env is then unusable).
        """
        self._check_open()
        self._check_pending(AsyncState.WAITING_RESET, "reset_wait", "reset_async")
        env_infos = self._finish("reset_wait", self._pool.call_wait, timeout)
        if self._reset_mask is None:
            self._needs_reset[:] = False
        else:
            self._needs_reset[self._reset_mask] = False
        infos: dict[str, Any] = {}
        for i in sorted(env_infos):  # in env order, as the references add them
            infos = self._add_info(infos, env_infos[i], i)
        return self._observations(), infos

    def _seeds(self, seed: Any) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = [int(s) if isinstance(s, numbers.Integral) else s for s in seed]
        if len(seeds) != self.num_envs:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={self.num_envs} but got length={len(seeds)}."
            )
        return seeds

    def _check_reset_mask(self, reset_mask: Any) -> np.ndarray:
        """Gymnasium's validation of ``options["reset_mask"]``, with its exact errors."""
        if not isinstance(reset_mask, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
        if reset_mask.shape != (self.num_envs,):
            raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {reset_mask.shape}")
        if reset_mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}")
        if not np.any(reset_mask):
            raise ValueError(
                "`options['reset_mask']` must contain a boolean array with at least one True value, "
                f"got reset_mask={reset_mask}"
            )
        return reset_mask

    # -- stepping ------------------------------------------------------------------

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action; return ``(obs, rewards, terminations, truncations, infos)``.

        Args:
            actions: a batch of actions, an element of :attr:`action_space` (for a
                ``Discrete`` single action space: an int array of shape ``(num_envs,)``).

        Returns:
            Batched observations, ``float64`` rewards, ``bool`` terminations and truncations,
            and infos as a dict of arrays with ``_key`` masks.

        Raises:
            InvalidActionError: actions of the wrong structure, shape or dtype kind.
            ResetNeededError: ``DISABLED`` mode and an env whose episode ended was not reset.

        Example:
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> obs, infos = envs.reset(seed=42)
            >>> obs, rewards, terminations, truncations, infos = envs.step(np.array([0, 1, 0, 1]))
            >>> rewards, terminations
            (array([1., 1., 1., 1.]), array([False, False, False, False]))
            >>> envs.close()
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Check the actions, write them to shared memory and start the step.

        Raises:
            UnbatchedActionError: a single action where a batch is expected (a ``TypeError``,
                as in ``AsyncVectorEnv``).
            InvalidActionError: actions of the wrong count, structure, shape or dtype kind
                (a ``ValueError``).
            AlreadyPendingError: another call is pending (e.g. ``step_async`` twice).
            ResetNeededError: ``DISABLED`` mode and an env whose episode ended was not reset.
        """
        self._check_open()
        self._check_idle("step_async")
        self._check_full_batches("step")
        self._check_action_batch(actions)
        columns = [self._action_column(actions, path, view) for path, view in self._action_leaves]
        pickled = {path: self._pickled_column(actions, path) for path in self._pool.pickled_action_paths}
        self._pool.ensure_can_step()
        if self.autoreset_mode == AutoresetMode.DISABLED and self._needs_reset.any():
            raise ResetNeededError(
                f"autoreset_mode is DISABLED and the episodes of envs {np.flatnonzero(self._needs_reset).tolist()} "
                "ended: reset them first with reset(options={'reset_mask': mask})"
            )
        write = self._pool.actions.write
        for path, part, column in columns:
            write(path, part, column)
        self._pool.step_async(pickled or None)
        self._state = AsyncState.WAITING_STEP

    def _check_action_batch(self, actions: Any) -> None:
        """A ``TypeError`` for a single action where a batch is expected, as ``AsyncVectorEnv`` raises.

        Wrong counts, shapes and structures are left to the checks of each leaf, whose
        :class:`~shmvec.errors.InvalidActionError` is the ``ValueError`` AsyncVectorEnv raises there.
        """
        paths = [path for path, _ in self._action_leaves] + list(self._pool.pickled_action_paths)
        for path in [()] + [path for path in paths if path]:
            try:
                part = lay.get_path(actions, path)
            except (KeyError, IndexError, TypeError):
                continue  # not the action space's structure: the leaf checks say so
            if _is_single_value(part):
                where = f" at {path}" if path else ""
                raise UnbatchedActionError(
                    f"expected a batch of {self.num_envs} actions{where} (an element of {self.action_space}), "
                    f"got the single value {part!r}; pass one action per env"
                )

    def _action_part(self, actions: Any, path: tuple) -> Any:
        try:
            return lay.get_path(actions, path)
        except (KeyError, IndexError, TypeError) as exc:
            raise InvalidActionError(
                f"actions do not match the action space {self.action_space}: cannot find the part at {path}"
            ) from exc

    def _action_column(self, actions: Any, path: tuple, view: np.ndarray) -> tuple[tuple, Any, np.ndarray]:
        """``(path, the leaf's actions as given, those checked against its shared view as an array)``."""
        part = self._action_part(actions, path)
        where = f" at {path}" if path else ""
        return path, part, checked_column(part, view, self._leaf_action_spaces[path], f"actions{where}")

    def _pickled_column(self, actions: Any, path: tuple) -> tuple:
        """The actions of a leaf with no fixed size, a tuple of one per env, as ``iterate`` yields them."""
        part = self._action_part(actions, path)
        where = f" at {path}" if path else ""
        wanted = f"expected actions{where} as a sequence of {self.num_envs} actions (one per env)"
        try:
            column = tuple(part)
        except TypeError as exc:
            raise InvalidActionError(f"{wanted}, got a {type(part).__name__}") from exc
        if len(column) != self.num_envs:
            raise InvalidActionError(f"{wanted}, got {len(column)}")
        return column

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step started by :meth:`step_async` and return its results.

        Args:
            timeout: seconds to wait (any real number; ``0`` only takes what is ready);
                ``None`` uses the ``timeout`` given to the constructor. When it expires,
                :class:`~shmvec.errors.StepTimeoutError` (a ``TimeoutError`` and a
                ``multiprocessing.TimeoutError``) is raised and the env is unusable: ``close()`` it.

        Raises:
            NoPendingCallError: no step is pending.
            StepTimeoutError: the envs did not answer within ``timeout``.
        """
        self._check_open()
        self._check_pending(AsyncState.WAITING_STEP, "step_wait", "step_async")
        pool = self._pool
        records = self._finish("step_wait", pool.step_wait, timeout)
        terminated, truncated = pool.terminated.copy(), pool.truncated.copy()
        if self.autoreset_mode == AutoresetMode.DISABLED:
            self._needs_reset = terminated | truncated
        # records are sorted by env index, as SyncVectorEnv adds them
        infos = add_record_infos({}, self._add_info, ((record.env_index, record) for record in records))
        return self._observations(), pool.rewards.copy(), terminated, truncated, infos

    def _observations(self) -> Any:
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

    # -- rare calls ----------------------------------------------------------------

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``env.get_wrapper_attr(name)(*args, **kwargs)`` in every env, or return the attribute if not callable.

        Example:
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> envs.call("render_mode")  # an attribute: returned as is
            (None, None, None, None)
            >>> envs.call("get_wrapper_attr", "gravity")  # a method: called with the arguments
            (9.8, 9.8, 9.8, 9.8)
            >>> envs.close()
        """
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Start :meth:`call` in every env; :meth:`call_wait` returns the results.

        Raises:
            AlreadyPendingError: another call is pending.
            ValueError: ``name`` is ``"reset"``, ``"step"`` or ``"close"`` (use those methods).
                ``AsyncVectorEnv`` raises it from ``call_wait``; this raises it at once.
        """
        self._check_open()
        self._check_idle("call_async")
        if name in _RESERVED_CALLS:
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` directly instead.")
        self._pool.call_async(RunOps(dict.fromkeys(range(self.num_envs), ops.CallOrGet(name, args, kwargs))))
        self._state = AsyncState.WAITING_CALL

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call started by :meth:`call_async`; return one result per env, in env order.

        Args:
            timeout: seconds to wait (any real number); ``None`` uses the constructor's ``timeout``.

        Raises:
            NoPendingCallError: no call is pending.
            StepTimeoutError: the envs did not answer within ``timeout`` (the env is then unusable).
        """
        self._check_open()
        self._check_pending(AsyncState.WAITING_CALL, "call_wait", "call_async")
        results = self._finish("call_wait", self._pool.call_wait, timeout)
        return tuple(results[i] for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return ``env.get_wrapper_attr(name)`` of every env (called if callable, as Gymnasium does)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """``env.set_wrapper_attr(name, value)`` in every env.

        Args:
            name: the attribute.
            values: a list or tuple with one value per env, or any other object to set in all envs.

        Example:
            >>> envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2)
            >>> envs.set_attr("gravity", [9.8, 9.8, 1.6, 1.6])  # one value per env
            >>> envs.get_attr("gravity")
            (9.8, 9.8, 1.6, 1.6)
            >>> envs.close()
        """
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._check_idle("set_attr")
        self._pool.run({i: ops.SetWrapperAttr(name, value) for i, value in enumerate(values)})

    def render(self) -> tuple[Any, ...]:
        """Return ``env.render()`` of every env, in env order (``call("render")``, as ``AsyncVectorEnv``)."""
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The ``np_random_seed`` of every env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of every env's ``np_random`` generator."""
        return self.get_attr("np_random")

    # -- the pending call, as AsyncVectorEnv tracks it -------------------------------

    def _check_idle(self, caller: str) -> None:
        """Raise AsyncVectorEnv's ``AlreadyPendingCallError`` if a call is pending."""
        if self._state != AsyncState.DEFAULT:
            end = "" if caller == "reset_async" else "."  # AsyncVectorEnv's reset_async message has no period
            raise AlreadyPendingError(
                f"Calling `{caller}` while waiting for a pending call to `{self._state.value}` to complete{end}",
                str(self._state.value),
            )

    def _check_full_batches(self, call: str) -> None:
        """reset()/step() act on every env: with smaller async batches, say what to use instead."""
        if self.batch_size != self.num_envs:
            raise StepStateError(
                f"{call}() is for batch_size == num_envs; this env has batch_size={self.batch_size} of "
                f"num_envs={self.num_envs}: use async_reset(), send() and recv()"
            )

    def _check_pending(self, state: AsyncState, caller: str, starter: str) -> None:
        """Raise AsyncVectorEnv's ``NoAsyncCallError`` unless ``state`` is what is pending."""
        if self._state != state:
            raise NoPendingCallError(f"Calling `{caller}` without any prior call to `{starter}`.", state.value)

    def _finish(self, caller: str, wait: Callable[[float | None], Any], timeout: Any) -> Any:
        """Run the pool's ``wait`` for the pending call; the call is no longer pending afterwards, whatever happens."""
        limit = seconds(timeout)  # before the state changes: a bad timeout leaves the call pending
        try:
            return wait(limit)
        except StepTimeoutError as exc:
            shown = self._pool.timeout if timeout is None else timeout
            raise StepTimeoutError(f"The call to `{caller}` has timed out after {shown} second(s): {exc}") from None
        finally:
            self._state = AsyncState.DEFAULT

    # -- lifetime ------------------------------------------------------------------

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the envs, stop the workers and release the shared memory (``close(**kwargs)`` calls this).

        Args:
            timeout: seconds to wait for a pending call before terminating the workers;
                ``None`` waits as a ``*_wait`` call would.
            terminate: terminate the workers at once, without waiting for a pending call or
                letting the envs close.

        As ``AsyncVectorEnv``, closing with a call pending warns (``gymnasium.logger.warn``)
        and waits for it first; an error that call raises is raised after the env is closed.
        """
        pool = getattr(self, "_pool", None)  # None if the constructor failed
        if pool is None:
            return
        try:
            if self._state != AsyncState.DEFAULT:
                logger.warn(f"Calling `close` while waiting for a pending call to `{self._state.value}` to complete.")
                if not terminate:
                    getattr(self, f"{self._state.value}_wait")(timeout)
        except (StepTimeoutError, WorkerDiedError):
            terminate = True  # stuck or dead workers cannot close their envs
        finally:
            self._state = AsyncState.DEFAULT
            pool.close(terminate=terminate)

    def _check_open(self) -> None:
        """Raise AsyncVectorEnv's ``ClosedEnvironmentError`` after ``close()``."""
        if self.closed or self._pool.closed:
            raise ClosedEnvError(f"Trying to operate on `{type(self).__name__}`, after a call to `close()`.")

    def __repr__(self) -> str:
        """Gymnasium's ``ShmVectorEnv(id, num_envs=N)`` plus how the envs run, e.g.
        ``ShmVectorEnv(num_envs=4, n_workers=2, main_shard=False, why='n_workers=2 given')``."""
        head = super().__repr__()[:-1]
        return f"{head}, {self._pool.description()})"

    def __enter__(self) -> ShmVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Gymnasium's VectorEnv.__del__ closes silently; leave an unclosed env to the pool's
        # finalizer instead, which releases everything too but warns (ResourceWarning).
        pass


def _batch_size(batch_size: Any, num_envs: int | None) -> int | None:
    """``batch_size`` checked against ``num_envs`` (``None``: all envs)."""
    if batch_size is None:
        return num_envs
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= (num_envs or batch_size):
        raise ValueError(f"batch_size must be an int between 1 and num_envs={num_envs}, got {batch_size!r}")
    return batch_size


def _obs_space_match(observation_mode: Any) -> Callable[[Space, Space], bool]:
    """How the pool compares each env's observation space with env 0's, after AsyncVectorEnv's checks of the mode."""
    if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
        if not isinstance(observation_mode[0], Space) or not isinstance(observation_mode[1], Space):
            raise TypeError(
                "Expected both elements of observation_mode to be Spaces, "
                f"got {type(observation_mode[0])} and {type(observation_mode[1])}"
            )
        return is_space_dtype_shape_equiv
    if observation_mode == "same":
        return operator.eq
    if observation_mode == "different":
        return is_space_dtype_shape_equiv
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch observation "
        f"space, actual got {observation_mode}"
    )


def _is_single_value(value: Any) -> bool:
    """Whether ``value`` is one action (0-d) rather than a batch or a dict/tuple of batches."""
    return not isinstance(value, (Mapping, tuple, list)) and np.ndim(value) == 0


def make_vec(
    env_id: str | gym.envs.registration.EnvSpec,
    num_envs: int = 1,
    n_workers: int | None = None,
    *,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] | None = None,
    **kwargs: Any,
) -> ShmVectorEnv:
    """Like ``gym.make_vec(env_id, num_envs, ...)``, vectorized with :class:`ShmVectorEnv`.

    Args:
        env_id: a registered env id (or an ``EnvSpec``), as for ``gym.make``.
        num_envs: number of envs.
        n_workers: worker processes; ``None`` (default) chooses them, and whether the main
            process steps envs too, from the cores and the envs' step cost (see :class:`ShmVectorEnv`).
        vector_kwargs: keyword arguments of :class:`ShmVectorEnv` (``autoreset_mode``,
            ``copy``, ``start_method``, ``timeout``, ...).
        wrappers: wrapper functions applied in order to each single env.
        **kwargs: passed to ``gym.make`` for each env (e.g. ``max_episode_steps``, ``g``).

    Returns:
        The vector env, its ``spec`` set as ``gym.make_vec`` sets it.

    Example:
        >>> import shmvec
        >>> envs = shmvec.make_vec("CartPole-v1", num_envs=8, n_workers=2,
        ...                        vector_kwargs={"autoreset_mode": "SameStep"})
        >>> envs.close()
    """
    vector_kwargs = dict(vector_kwargs or {})
    wrappers = list(wrappers or [])
    if isinstance(env_id, gym.envs.registration.EnvSpec):
        env_spec = copy_module.deepcopy(env_id)
    else:
        env_spec = copy_module.deepcopy(gym.spec(env_id))
    env_kwargs = {**env_spec.kwargs, **kwargs}
    env_spec.kwargs = {}

    def make_one() -> gym.Env:
        env = gym.make(env_spec, **env_kwargs)
        for wrapper in wrappers:
            env = wrapper(env)
        return env

    envs = ShmVectorEnv([make_one] * num_envs, n_workers, **vector_kwargs)
    vector_spec = copy_module.deepcopy(env_spec)
    vector_spec.kwargs = dict(env_kwargs)
    if num_envs != 1:
        vector_spec.kwargs["num_envs"] = num_envs
    if wrappers:
        vector_spec.kwargs["wrappers"] = wrappers
    envs.spec = vector_spec
    return envs


ShmVectorEnv.__doc__ += "\n    Pool options:" + options_doc() + "\n"
