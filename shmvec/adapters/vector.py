"""``ShmVectorEnv``: the shared-memory pool as a Gymnasium ``VectorEnv`` (Gymnasium 1.1 and later).

The engine (:class:`~shmvec.engine.pool.ShmPool`) steps the envs and auto-resets them inside the
workers in the requested :class:`~gymnasium.vector.AutoresetMode`; this adapter only checks and
writes actions, wraps the shared observation buffers in the structure Gymnasium's ``concatenate``
returns, and turns the rare per-env infos into Gymnasium's dict of arrays with ``_key`` masks
(through ``VectorEnv._add_info``, so the format is Gymnasium's own). With the same seeds and
actions it returns exactly what :class:`gymnasium.vector.SyncVectorEnv` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import Space, logger
from gymnasium.vector import VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import batch_space

from shmvec.adapters import dropin_args, gym_resets, gym_spaces
from shmvec.adapters.async_batches import AsyncBatches, checked_batch_size
from shmvec.adapters.env_calls import EnvCalls
from shmvec.adapters.gym_actions import GymActions
from shmvec.adapters.gym_results import GymResults
from shmvec.adapters.public_calls import other_call, step_end, step_start
from shmvec.adapters.timings_view import TimingsView
from shmvec.adapters.torch_device import DeviceHandoff
from shmvec.backends import make_pool
from shmvec.engine.interface import Engine
from shmvec.errors import SpaceMismatchError, StepTimeoutError, WorkerDiedError
from shmvec.gymnasium_1_1 import AutoresetMode, batch_differing_spaces, require_vector_api
from shmvec.ipc.protocol import Reset
from shmvec.options import PoolOptions, options_doc

__all__ = ["ShmVectorEnv"]


class ShmVectorEnv(EnvCalls, AsyncBatches, GymResults, TimingsView, VectorEnv):
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
        shared_memory, context, daemon: ``AsyncVectorEnv``'s, with their meaning there (below).
        copy: if ``True`` (default), :meth:`reset` and :meth:`step` return observations that belong
            to the caller and never change. If ``False`` they return *views into shared memory*: no
            copy is made, but their contents are overwritten by the next :meth:`step` or :meth:`reset`
            (as ``SyncVectorEnv(copy=False)``'s); copy what you keep, e.g. in a replay buffer.
        device: ``None`` (default): numpy results. A torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``,
            a ``torch.device``): :meth:`reset`, :meth:`step` and :meth:`recv` return observations
            (every fixed-size leaf), rewards, terminations and truncations as torch tensors on it, in
            the space's dtype (uint8 frames stay uint8), each the caller's (on ``"cpu"`` with
            ``copy=False``, observations are views as above); infos stay numpy. Actions may then be
            tensors on any device. On CUDA the shared arena is page-locked and copied from without
            blocking (:mod:`shmvec.adapters.torch_device`).
        autoreset_mode: ``AutoresetMode`` (or its string value) applied when an episode ends: ``NEXT_STEP``
            (default), ``SAME_STEP`` (the final observation and info are in ``infos["final_obs"]``/
            ``infos["final_info"]``) or ``DISABLED`` (reset ended envs: ``reset(options={"reset_mask": mask})``).
        observation_mode: as ``AsyncVectorEnv``'s: ``"same"`` (default: every env has env 0's
            observation space), ``"different"`` (spaces may differ in their bounds but not in
            structure, shapes and dtypes; :attr:`observation_space` is ``batch_differing_spaces`` of
            them) or a tuple ``(observation_space, single_observation_space)`` to use as given (the
            envs' spaces must share its shapes and dtypes). Action spaces must always be equal.
        batch_size: envs per :meth:`recv` in async batches (EnvPool's ``batch_size``), between 1
            and ``num_envs`` (default). Below ``num_envs`` use :meth:`async_reset`, :meth:`send` and
            :meth:`recv` instead of reset/step; with ``n_workers`` and ``use_main_process`` unset, every
            env then runs in a worker (a main shard's envs step inside :meth:`send`, where they
            cannot overlap the caller's policy).
        **pool_options: how the envs run, shared with every shmvec adapter
            (:class:`~shmvec.options.PoolOptions`): start_method, timeout, worker_threads, max_spin,
            use_main_process, on_worker_failure, max_restarts, as below. In restart mode the envs of a
            dead worker report, for that step, the reset observation, reward 0, ``terminated=False``,
            ``truncated=True`` and ``infos["shmvec_restarted"]`` (no ``final_obs``: it died with the
            worker; in ``SAME_STEP`` mode their reset info is in ``infos``); in ``NEXT_STEP`` mode
            their next step is an ordinary autoreset step (do not bootstrap from the observation
            returned with the truncation); in ``DISABLED`` mode reset them.

    Each env gets its action as ``SyncVectorEnv`` passes it: a row of the caller's array in
    the caller's dtype (float64 actions for a float32 space stay float64), or the caller's
    Python number or list (see :mod:`shmvec.ipc.action_rows`).

    Any space works. Box, Discrete, MultiDiscrete and MultiBinary leaves (nested in Dict
    and Tuple too) live in shared memory; leaves with no fixed size (Graph, Sequence,
    Text, OneOf, user-defined ``Space`` subclasses) travel pickled through each worker's
    pipe every step, batched as ``SyncVectorEnv`` batches them (a tuple with one value
    per env; pass their actions as a sequence of one action per env). That costs a pipe
    round trip per worker and step; spaces with only fixed-size leaves pay nothing for it.

    As in ``AsyncVectorEnv``, :meth:`step`, :meth:`reset` and :meth:`call` are each an
    ``*_async``/``*_wait`` pair, one call may be pending at a time, and misuse raises
    Gymnasium's errors with its messages (:mod:`shmvec.adapters.env_calls`); a wait that
    times out raises :class:`~shmvec.errors.StepTimeoutError`, after which the env is
    unusable: ``close()`` it.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_workers: int | None = None,
        *async_args: Any,  # AsyncVectorEnv's positional order after a bool second; its keywords: see dropin_args
        copy: bool = dropin_args.DEFAULT_TRUE,
        autoreset_mode: AutoresetMode | str = dropin_args.DEFAULT_NEXT_STEP,
        observation_mode: str | tuple[Space, Space] = dropin_args.DEFAULT_SAME,
        batch_size: int | None = None,
        device: Any = None,
        shared_memory: bool = dropin_args.DEFAULT_TRUE,
        context: str | None = dropin_args.DEFAULT_NONE,
        daemon: bool = dropin_args.DEFAULT_TRUE,
        **pool_options: Any,
    ):
        require_vector_api(type(self).__name__)  # before VectorEnv.__init__, whose 0.29 signature differs
        super().__init__()
        given = dict(copy=copy, autoreset_mode=autoreset_mode, observation_mode=observation_mode, context=context)
        given.update(shared_memory=shared_memory, daemon=daemon)  # AsyncVectorEnv's, as it takes them
        n_workers, (copy, autoreset_mode, observation_mode), pool_options = dropin_args.async_vector_env(
            type(self).__name__, n_workers, async_args, given, pool_options
        )
        self.env_fns = env_fns
        self.observation_mode = observation_mode
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = bool(copy)
        self._state = AsyncState.DEFAULT  # what is pending, as AsyncVectorEnv tracks it
        obs_space_match = gym_spaces.obs_space_match(observation_mode)
        options = PoolOptions.from_kwargs(type(self).__name__, n_workers=n_workers, **pool_options)
        self.batch_size = checked_batch_size(batch_size, len(env_fns) if isinstance(env_fns, Sequence) else None)
        self._device = None if device is None else DeviceHandoff(device, self.copy)  # checked before any worker starts
        try:
            self._pool: Engine = make_pool(
                env_fns,
                options,
                autoreset_mode=self.autoreset_mode,
                obs_space_match=obs_space_match,
                batch_size=self.batch_size,
            )
        except SpaceMismatchError as exc:
            if exc.space == "observation" and observation_mode == "different":
                batch_differing_spaces(exc.spaces)  # AsyncVectorEnv fails here first, if it fails
            raise gym_spaces.space_mismatch(exc.space, exc.spaces, observation_mode, type(self).__name__) from exc
        pool, self._clock = self._pool, self._pool.clock  # the clock: see timings
        pool.collect_info_rows(main_shard=True)  # step infos of shared rows come as groups: see gym_infos
        try:
            self.num_envs = pool.num_envs
            self.n_workers = pool.n_workers
            self.metadata = dict(pool.env_metadata)  # a copy: never touch the env's class-level dict
            self.metadata["autoreset_mode"] = self.autoreset_mode
            self.render_mode = pool.env_render_mode
            self.single_action_space = pool.single_action_space
            every_space = lambda: list(self.get_attr("observation_space"))  # noqa: E731
            self.single_observation_space, self.observation_space = gym_spaces.observation_spaces(
                observation_mode, pool.single_observation_space, self.num_envs, every_space, type(self).__name__
            )
            self.action_space = batch_space(self.single_action_space, self.num_envs)
            self._obs_leaves = pool.obs_leaves
            self._flat_obs = pool.obs_leaves.get(()) if len(pool.obs_leaves) == 1 else None
            leaves = pool.action_leaves, pool.pickled_action_paths
            self._actions = GymActions(self.single_action_space, self.action_space, self.num_envs, *leaves)
            # DISABLED mode: envs whose episode ended and that were not reset since.
            self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
            self._maybe_needs_reset = False  # False: _needs_reset is all False (set True where it may turn True)
            self._disabled = self.autoreset_mode is AutoresetMode.DISABLED
            self._reset_mask: np.ndarray | None = None  # the pending reset's, between reset_async and reset_wait
            # no worker and results in numpy: steps are direct calls (see shmvec.engine.local_step)
            here = bool(getattr(pool, "all_here", False)) and self._device is None
            self._all_here = here and self.batch_size == self.num_envs
            self._flat_action = pool.action_leaves.get(()) if not pool.pickled_action_paths else None
            if self._device is not None:
                self._device.start(pool)  # on CUDA, page-locks the arena: after the workers attached it
        except BaseException:
            pool.close()
            raise

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
        if self._all_here and self._state is AsyncState.DEFAULT and not self.closed and self._pool.idle_here():
            return self._reset_here(seed, options)
        return self._reset_held(seed, options)

    @other_call
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
        seeds = gym_resets.seeds(seed, self.num_envs)
        self._check_idle("reset_async")
        self._check_full_batches("reset")
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = gym_resets.checked_mask(options.pop("reset_mask"), self.num_envs)
        targets = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        self._before_write(None if mask is None else targets)
        self._pool.call_async(Reset({i: {"seed": seeds[i], "options": options} for i in targets}))
        self._reset_mask = mask
        self._state = AsyncState.WAITING_RESET

    @other_call
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
        if self._all_here and self._state is AsyncState.DEFAULT and not self.closed and self._pool.idle_here():
            return self._step_here(actions)
        return self._step_held(actions)

    @step_end
    def _step_held(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self.step_async(actions)
        return self.step_wait()

    @step_start
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
        actions = self._host_actions(actions)
        columns = self._actions.columns(actions)
        pickled = self._actions.pickled(actions)
        self._pool.ensure_can_step()
        self._check_needs_reset()
        write = self._pool.actions.write
        for path, part, column in columns:
            write(path, part, column)
        self._before_write()
        self._pool.step_async(pickled or None)
        self._state = AsyncState.WAITING_STEP

    @step_end
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
        return self._step_outcome(self._finish("step_wait", self._pool.step_wait, timeout))

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
            if self._device is not None:
                self._device.close()  # no copy may still read the arena when it is unregistered
            pool.close(terminate=terminate)

    def __repr__(self) -> str:
        """Gymnasium's ``ShmVectorEnv(id, num_envs=N)`` plus how the envs run (``n_workers=2, ...``)."""
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


ShmVectorEnv.__doc__ += dropin_args.ASYNC_ARGS_DOC + "\n    Pool options:" + options_doc() + "\n"
