"""``ShmVectorEnv``: the shared-memory pool as a Gymnasium ``VectorEnv``.

The engine (:class:`~shmvec.pool.ShmPool`) steps the envs and auto-resets them inside
the workers in the requested :class:`~gymnasium.vector.AutoresetMode`; this adapter only
checks and writes actions, wraps the shared observation buffers in the structure
Gymnasium's ``concatenate`` returns, and turns the rare per-env infos into Gymnasium's
dict of arrays with ``_key`` masks (through ``VectorEnv._add_info``, so the format is
Gymnasium's own). With the same seeds and actions it returns exactly what
:class:`gymnasium.vector.SyncVectorEnv` returns.
"""

from __future__ import annotations

import copy as copy_module
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from shmvec import layout as lay
from shmvec import ops
from shmvec.errors import ClosedEnvError, InvalidActionError, ResetNeededError
from shmvec.pool import DEFAULT_SPIN, ShmPool
from shmvec.validation import checked_column

__all__ = ["ShmVectorEnv", "make_vec"]

# Names `call` refuses, as AsyncVectorEnv does: they would bypass the shared buffers.
_RESERVED_CALLS = ("reset", "step", "close")


class ShmVectorEnv(VectorEnv):
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
        n_workers: worker processes; default ``min(len(env_fns), os.cpu_count())``.
        copy: if ``True`` (default), :meth:`reset` and :meth:`step` return observations
            that belong to the caller and never change. If ``False`` they return *views
            into shared memory*: no copy is made, but their contents are overwritten by
            the next :meth:`step` or :meth:`reset` (the same contract as
            ``SyncVectorEnv(copy=False)``); copy what you keep, e.g. in a replay buffer.
        autoreset_mode: ``AutoresetMode`` (or its string value) applied when an episode
            ends: ``NEXT_STEP`` (default), ``SAME_STEP`` (the final observation and info
            are in ``infos["final_obs"]``/``infos["final_info"]``) or ``DISABLED`` (reset
            ended envs yourself with ``reset(options={"reset_mask": mask})``).
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default forkserver where
            available. Non-fork methods need the ``if __name__ == "__main__":`` guard.
        timeout: default seconds to wait for the workers before raising
            :class:`~shmvec.errors.StepTimeoutError`; ``None`` waits while they live.
        worker_threads: torch/OpenMP/BLAS threads per worker (default 1); ``None`` leaves them.
        max_spin: upper bound in seconds of the adaptive spin-wait before blocking.
        main_shard: the main process steps one more shard of envs itself while the workers
            step theirs (fastest for light envs: on C cores use ``n_workers=C - 1``);
            those envs live in the main process, so a crash there is not isolated.
        on_worker_failure: ``"raise"`` (default): a worker process that dies makes the step
            raise :class:`~shmvec.errors.WorkerDiedError`. ``"restart"``: the worker is
            re-created from its env_fns and its envs are reset (seed ``None``); that step
            returns for each of them the reset observation, reward 0, ``terminated=False``,
            ``truncated=True`` and ``infos["shmvec_restarted"]`` (mask
            ``infos["_shmvec_restarted"]``); there is no ``final_obs``/``final_info``, as
            the last observation died with the worker. In ``SAME_STEP`` mode their reset
            info is in ``infos`` too. In ``NEXT_STEP`` mode their next step is an ordinary
            autoreset step, as after any truncation: reset again (seed ``None``), actions
            ignored, reward 0, not terminated or truncated, infos = the reset info; the
            observation returned with the truncation is a reset one, not the lost
            episode's last (do not bootstrap from it). In
            ``DISABLED`` mode reset them yourself, as any ended env. The other envs'
            results are unaffected. A worker found dead while idle is restarted at the
            next step. Each restart warns (``RuntimeWarning``). A death during ``reset``,
            ``call``, ``get_attr``, ... still raises.
        max_restarts: restarts allowed over the env's life with ``"restart"``; one more
            death raises ``WorkerDiedError`` saying the budget is used up.

    Actions are converted to the action space's dtype before they reach the envs
    (``SyncVectorEnv`` passes them as given): pass ``action_space``-typed actions.
    All envs must have equal observation and action spaces (``observation_mode="same"``).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_workers: int | None = None,
        *,
        copy: bool = True,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        start_method: str | None = None,
        timeout: float | None = None,
        worker_threads: int | None = 1,
        max_spin: float = DEFAULT_SPIN,
        main_shard: bool = False,
        on_worker_failure: Literal["raise", "restart"] = "raise",
        max_restarts: int = 3,
    ):
        super().__init__()
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.copy = bool(copy)
        self._pool = ShmPool(
            env_fns,
            n_workers,
            start_method=start_method,
            autoreset_mode=self.autoreset_mode,
            timeout=timeout,
            worker_threads=worker_threads,
            max_spin=max_spin,
            main_shard=main_shard,
            on_worker_failure=on_worker_failure,
            max_restarts=max_restarts,
        )
        pool = self._pool
        try:
            self.num_envs = pool.num_envs
            self.n_workers = pool.n_workers
            self.metadata = dict(pool.env_metadata)  # a copy: never touch the env's class-level dict
            self.metadata["autoreset_mode"] = self.autoreset_mode
            self.render_mode = pool.env_render_mode
            self.single_observation_space = pool.single_observation_space
            self.single_action_space = pool.single_action_space
            self._leaf_action_spaces = {path: lay.get_path(self.single_action_space, path) for path in pool.action_leaves}
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
            self.action_space = batch_space(self.single_action_space, self.num_envs)
            self._obs_leaves = pool.obs_leaves
            self._flat_obs = pool.obs_leaves.get(()) if len(pool.obs_leaves) == 1 else None
            self._action_leaves = list(pool.action_leaves.items())
            # DISABLED mode: envs whose episode ended and that were not reset since.
            self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
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
            >>> obs, infos = envs.reset(seed=[0, 1, 2, 3])
            >>> obs, infos = envs.reset(options={"reset_mask": np.array([True, False, False, True])})
        """
        self._check_open()
        seeds = self._seeds(seed)
        mask = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = self._check_reset_mask(options.pop("reset_mask"))
        targets = range(self.num_envs) if mask is None else np.flatnonzero(mask).tolist()
        env_infos = self._pool.reset({i: {"seed": seeds[i], "options": options} for i in targets})
        if mask is None:
            self._needs_reset[:] = False
        else:
            self._needs_reset[mask] = False
        infos: dict[str, Any] = {}
        for i in targets:
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
            >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Check the actions, write them to shared memory and start the step.

        Raises:
            InvalidActionError: actions of the wrong structure, shape or dtype kind.
            StepStateError: a step is already pending.
            ResetNeededError: ``DISABLED`` mode and an env whose episode ended was not reset.
        """
        self._check_open()
        columns = [(view, self._action_column(actions, path, view)) for path, view in self._action_leaves]
        self._pool.ensure_can_step()
        if self.autoreset_mode == AutoresetMode.DISABLED and self._needs_reset.any():
            raise ResetNeededError(
                f"autoreset_mode is DISABLED and the episodes of envs {np.flatnonzero(self._needs_reset).tolist()} "
                "ended: reset them first with reset(options={'reset_mask': mask})"
            )
        for view, column in columns:
            view[...] = column
        self._pool.step_async()

    def _action_column(self, actions: Any, path: tuple, view: np.ndarray) -> np.ndarray:
        try:
            column = np.asarray(lay.get_path(actions, path))
        except (KeyError, IndexError, TypeError) as exc:
            raise InvalidActionError(
                f"actions do not match the action space {self.action_space}: cannot find the part at {path}"
            ) from exc
        where = f" at {path}" if path else ""
        column = checked_column(column, view, self._leaf_action_spaces[path], f"actions{where}")
        return column

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step started by :meth:`step_async` and return its results.

        Args:
            timeout: seconds to wait; ``None`` uses the ``timeout`` given to the constructor.
                When it expires, :class:`~shmvec.errors.StepTimeoutError` (a ``TimeoutError``)
                is raised and the env is unusable: ``close()`` it.

        Raises:
            StepStateError: no step is pending.
            StepTimeoutError: the envs did not answer within ``timeout``.
        """
        self._check_open()
        pool = self._pool
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        records = pool.step_wait(timeout)
        terminated, truncated = pool.terminated.copy(), pool.truncated.copy()
        if self.autoreset_mode == AutoresetMode.DISABLED:
            self._needs_reset = terminated | truncated
        infos: dict[str, Any] = {}
        add_info = self._add_info
        for record in records:  # sorted by env index, as SyncVectorEnv adds them
            if record.final_info is not None:
                infos = add_info(
                    infos, {"final_obs": record.final_obs, "final_info": record.final_info}, record.env_index
                )
            elif record.restarted:  # its worker died: no final_obs, the last observation is lost
                infos = add_info(infos, {"shmvec_restarted": True}, record.env_index)
            infos = add_info(infos, record.info, record.env_index)
        return self._observations(), pool.rewards.copy(), terminated, truncated, infos

    def _observations(self) -> Any:
        flat = self._flat_obs
        if flat is not None:
            return flat.copy() if self.copy else flat
        if self.copy:
            leaves = {path: view.copy() for path, view in self._obs_leaves.items()}
        else:
            leaves = self._obs_leaves
        return lay.unflatten(self.single_observation_space, leaves)

    # -- rare calls ----------------------------------------------------------------

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``env.get_wrapper_attr(name)(*args, **kwargs)`` in every env, or return the attribute if not callable.

        Example:
            >>> envs.call("render_mode")  # an attribute: returned as is
            (None, None, None, None)
            >>> envs.call("get_wrapper_attr", "gravity")  # a method: called with the arguments
            (9.8, 9.8, 9.8, 9.8)
        """
        self._check_open()
        if name in _RESERVED_CALLS:
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` directly instead.")
        return self._run_all(ops.CallOrGet(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return ``env.get_wrapper_attr(name)`` of every env (called if callable, as Gymnasium does)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """``env.set_wrapper_attr(name, value)`` in every env.

        Args:
            name: the attribute.
            values: a list or tuple with one value per env, or any other object to set in all envs.

        Example:
            >>> envs.set_attr("gravity", [9.8, 9.8, 1.6, 1.6])  # one value per env
            >>> envs.get_attr("gravity")
            (9.8, 9.8, 1.6, 1.6)
        """
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._pool.run({i: ops.SetWrapperAttr(name, value) for i, value in enumerate(values)})

    def render(self) -> tuple[Any, ...]:
        """Return ``env.render()`` of every env, in env order."""
        self._check_open()
        return self._run_all(ops.Render())

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The ``np_random_seed`` of every env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of every env's ``np_random`` generator."""
        return self.get_attr("np_random")

    def _run_all(self, op: Callable[[gym.Env], Any]) -> tuple[Any, ...]:
        results = self._pool.run(dict.fromkeys(range(self.num_envs), op))
        return tuple(results[i] for i in range(self.num_envs))

    # -- lifetime ------------------------------------------------------------------

    def close_extras(self, **kwargs: Any) -> None:
        """Close the envs, stop the workers and release the shared memory."""
        pool = getattr(self, "_pool", None)  # None if the constructor failed
        if pool is not None:
            pool.close()

    def _check_open(self) -> None:
        if self.closed or self._pool.closed:
            raise ClosedEnvError("this vector env is closed; create a new one")

    def __enter__(self) -> ShmVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Gymnasium's VectorEnv.__del__ closes silently; leave an unclosed env to the pool's
        # finalizer instead, which releases everything too but warns (ResourceWarning).
        pass


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
        n_workers: worker processes (default ``min(num_envs, os.cpu_count())``).
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
