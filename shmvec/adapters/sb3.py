"""``ShmPoolVecEnv``: the shared-memory pool as a Stable-Baselines3 ``VecEnv``."""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.adapters import dropin_args
from shmvec.adapters.dropin_args import DEFAULT_NONE
from shmvec.adapters.timings_view import TimingsView
from shmvec.backends import make_pool
from shmvec.clocks.call_clock import timed_call, timed_step, timed_step_start
from shmvec.engine import ops
from shmvec.engine.interface import Engine
from shmvec.engine.validation import checked_column, split_actions
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import interrupts, pinning
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import handed_over
from shmvec.options import PoolOptions, options_doc

try:
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
    from stable_baselines3.common.vec_env.util import obs_space_info
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "ShmPoolVecEnv needs stable-baselines3: pip install 'stable-baselines3>=2.4' (shmvec's [sb3] extra), "
        "or use shmvec.ShmVectorEnv"
    ) from exc


_perf_counter = time.perf_counter
_NOT_TRUNCATED = (("TimeLimit.truncated", False),)  # what DummyVecEnv adds to the info of an env that goes on
# pin_memory=None: how many resets and steps look whether CUDA started. SB3 builds its model (and
# CUDA's context) after the env, and learn() resets first: a few looks cover it; later, none.
PIN_CHECKS = 100


class ShmPoolVecEnv(TimingsView, VecEnv):
    """A drop-in replacement for SB3's ``SubprocVecEnv``/``DummyVecEnv`` backed by shared memory.

    ``len(env_fns)`` envs run in ``n_workers`` processes; observations, rewards and dones are
    written by the workers straight into shared numpy buffers, so a step pickles nothing
    unless an env returns a non-empty info or ends an episode. With the same seeds and
    actions it returns exactly what ``DummyVecEnv`` returns (same-step auto-reset,
    ``terminal_observation`` and ``TimeLimit.truncated`` infos, ``reset_infos``).

    Example:
        >>> import gymnasium as gym
        >>> from shmvec import ShmPoolVecEnv
        >>> with ShmPoolVecEnv([lambda: gym.make("CartPole-v1")] * 8, n_workers=2) as env:
        ...     obs = env.reset()
        ...     obs, rewards, dones, infos = env.step(np.zeros(8, dtype=np.int64))
        >>> obs.shape
        (8, 4)

    Args:
        env_fns: callables that each build a new Gymnasium env (lambdas are fine).
        n_workers: worker processes (see the pool options below).
        start_method: as SubprocVecEnv's (see the pool options below). A string second, in
            ``n_workers``' place, is the start method, as in ``SubprocVecEnv(env_fns, "spawn")``.
        copy: ``True`` (default): :meth:`reset` and :meth:`step` return copies, which never
            change. ``False``: zero-copy, they return views of the shared observation rows,
            which are double-buffered: *an observation stays valid until the second
            ``step``/``reset`` after the one that returned it starts*; that is, through the
            next step, which is as long as SB3's algorithms and wrappers read it (they
            read ``_last_obs`` after the next step returns, and copy what they keep into
            their buffers). Copy what you keep longer. Infos (``terminal_observation``
            included) are always your own objects.
        pin_memory: page-lock the shared arena for CUDA (once, in this process, after the
            workers attached it; undone at :meth:`close`), so that a copy of an observation
            view to the GPU is one DMA with no bounce buffer: with ``copy=False``, SB3's
            ``obs_as_tensor`` then copies straight from shared memory. ``None`` (default):
            only where it pays and costs nothing: with ``copy=False`` (with ``True``, SB3
            gets copies, in pageable memory) once CUDA is already initialised in this process
            (``torch.cuda.is_initialized()``; shmvec never creates a CUDA context itself),
            looked at by the constructor, then by the first resets and steps (SB3 moves its
            model to the GPU after building the env). ``True``: at once, always (this makes
            the CUDA context if none exists). ``False``: never. If registration fails, one
            ``RuntimeWarning`` and everything works as without it.
        **pool_options: how the envs run, shared with every shmvec adapter
            (:class:`~shmvec.options.PoolOptions`): timeout, worker_threads, max_spin,
            use_main_process, on_worker_failure, max_restarts, as below. In restart mode the envs
            of a dead worker return, for that step, the reset observation, reward 0,
            ``done=True`` and the info ``{"shmvec_restarted": True, "TimeLimit.truncated":
            True}`` with *no* ``terminal_observation`` (the last observation died with the
            worker, so on-policy algorithms do not bootstrap; off-policy replay buffers
            that handle timeouts bootstrap from the reset observation); ``reset_infos``
            gets their reset infos.

    Dict and Tuple action spaces (nested too) take one action per env, a list of dicts or
    tuples, as ``DummyVecEnv`` does; each env gets a dict (tuple) of its leaves' values, in
    the space's order. Each value reaches the env as ``DummyVecEnv`` passes it: the
    caller's numpy scalar or array in the caller's dtype (float64 actions for a float32
    space stay float64), or the caller's Python number or list (see :mod:`shmvec.ipc.action_rows`).
    Returned observations are copies, unless ``copy=False`` (see Args).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_workers: int | None = None,
        start_method: str | None = DEFAULT_NONE,  # SubprocVecEnv's second: one given twice is a TypeError there
        *,
        copy: bool = True,
        pin_memory: bool | None = None,
        **pool_options: Any,
    ):
        n_workers, start_method = dropin_args.subproc_vec_env(type(self).__name__, n_workers, start_method)
        options = PoolOptions.from_kwargs(
            type(self).__name__, n_workers=n_workers, start_method=start_method, **pool_options
        )
        self.copy = bool(copy)
        self._pool: Engine = make_pool(
            env_fns,
            options,
            autoreset_mode=AutoresetMode.SAME_STEP,
            env_wrapper=ops.patch_legacy_env,
            obs_buffers=1 if self.copy else 2,  # zero-copy: the caller reads one buffer while a step writes the other
        )
        self._clock = self._pool.clock  # see timings
        # before VecEnv.__init__, whose get_attr("render_mode") runs through them
        self._env_range = range(len(env_fns))
        self._all_here = bool(getattr(self._pool, "all_here", False))  # no worker: steps and calls are direct calls
        try:
            observation_space = self._pool.single_observation_space
            lay.require_fixed_size(observation_space, "observation", "ShmPoolVecEnv")  # SB3 needs arrays
            lay.require_fixed_size(self._pool.single_action_space, "action", "ShmPoolVecEnv")
            self.keys, _, _ = obs_space_info(observation_space)  # SB3's own check: no nested spaces
            self._obs_paths = [(key, () if key is None else (key,)) for key in self.keys]
            action_space = self._pool.single_action_space
            # (path, shared buffer, leaf space) per action leaf; one with path () for a flat space
            self._action_leaves = [
                (path, view, lay.get_path(action_space, path)) for path, view in self._pool.action_leaves.items()
            ]
            self._flat_action = self._pool.action_leaves.get(())
            super().__init__(len(env_fns), observation_space, action_space)
            # pin_memory=None: look again at the first resets and steps (0: no more looks)
            self._pin_checks = PIN_CHECKS + 1 if pin_memory is None and not self.copy else 0
            if pin_memory:
                self._pool.page_lock()
            elif self._pin_checks:
                self._pin_if_cuda_started()
        except BaseException:
            self._pool.close()
            raise
        # Infos of workers' shared rows come as groups, turned into dicts here; the main shard's
        # are the envs' own dicts, copied (cheaper than a row's round trip for a list of dicts).
        self._pool.collect_info_rows(main_shard=False)
        self.metadata = self._pool.env_metadata  # as DummyVecEnv
        self.n_workers = self._pool.n_workers

    # -- stepping ------------------------------------------------------------------

    def step(self, actions: np.ndarray | Sequence[Any]) -> VecEnvStepReturn:
        """Step every env with ``actions`` (see :meth:`step_async`); SB3's ``VecEnv.step``."""
        pool = self._pool
        if self._all_here and pool.idle_here():
            return self._step_here(actions)
        return self._step_held(actions)

    def _step_here(self, actions: np.ndarray | Sequence[Any]) -> VecEnvStepReturn:
        """Every env in this process: the step as one direct call (see :mod:`shmvec.engine.local_step`);
        a flat array of actions goes to the envs as it is (no other process reads the rows)."""
        entered = _perf_counter()
        try:
            pool, flat, each = self._pool, self._flat_action, None
            if flat is not None:  # the common case: one array, no per-env work
                column = checked_column(actions, flat, self.action_space, "actions")
                each = handed_over(actions, column)
                columns = [((), actions, column)] if each is None else []
            else:
                columns = self._action_columns(actions)
            if self._pin_checks:
                self._pin_if_cuda_started()
            write = pool.actions.write
            for path, values, column in columns:
                write(path, values, column)
            return self._results(pool.step_here(None, each))
        finally:
            self._clock.whole_step(entered, _perf_counter())

    @interrupts.holding  # one call: a Ctrl-C between the halves would leave the step pending
    @timed_step
    def _step_held(self, actions: np.ndarray | Sequence[Any]) -> VecEnvStepReturn:
        self.step_async(actions)
        return self.step_wait()

    @timed_step_start
    def step_async(self, actions: np.ndarray | Sequence[Any]) -> None:
        """Check the actions, write them to shared memory and start the step.

        Args:
            actions: one action per env: an array of shape ``(num_envs, *action_shape)``
                for a flat action space; for a Dict or Tuple action space (nested too), a
                list of ``num_envs`` dicts or tuples, as ``DummyVecEnv`` takes them.

        Raises:
            InvalidActionError: a wrong count, structure, shape or dtype kind.
        """
        columns = self._action_columns(actions)
        self._pool.ensure_can_step()
        if self._pin_checks:
            self._pin_if_cuda_started()
        write = self._pool.actions.write
        for path, values, column in columns:
            write(path, values, column)
        self._pool.step_async()

    def _action_columns(self, actions: Any) -> list[tuple[tuple, Any, np.ndarray]]:
        """(leaf path, its actions as given, those checked as an array) per action leaf;
        raises before anything is written."""
        if self._flat_action is not None:  # the common case: one array, no per-env work
            return [((), actions, checked_column(actions, self._flat_action, self.action_space, "actions"))]
        by_path = split_actions(actions, self.action_space, self.num_envs)
        return [
            (path, by_path[path], checked_column(by_path[path], view, leaf_space, f"actions at {path}"))
            for path, view, leaf_space in self._action_leaves
        ]

    @timed_step
    def step_wait(self) -> VecEnvStepReturn:
        return self._results(self._pool.step_wait())

    def _results(self, sent: list) -> VecEnvStepReturn:
        """What SB3's ``step_wait`` returns, from the rows and the step's records ``sent``."""
        pool = self._pool
        terminated, truncated = pool.terminated, pool.truncated
        dones = terminated | truncated
        infos = self._row_infos(pool.info_groups)
        for record in sent:
            i = record.env_index
            if record.final_info is not None:  # the episode ended and the env auto-reset
                info = record.final_info
                info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                info["terminal_observation"] = record.final_obs
                self.reset_infos[i] = record.info
            elif record.restarted:  # its worker died: the last observation is lost, hence no terminal_observation
                info = {"shmvec_restarted": True, "TimeLimit.truncated": True}
                self.reset_infos[i] = record.info
            else:
                info = record.info
                info["TimeLimit.truncated"] = False
            infos[i] = info
        return self._observations(), pool.rewards.astype(np.float32), dones, infos

    def _row_infos(self, groups: list) -> list[dict[str, Any]]:
        """N fresh dicts, as DummyVecEnv returns (callers and wrappers add keys to them): the infos
        of shared rows (envs whose episode goes on), ``{"TimeLimit.truncated": False}`` for the others."""
        if not groups:
            return [{"TimeLimit.truncated": False} for _ in self._env_range]
        infos: list[Any] = [None] * self.num_envs
        for group in groups:
            dicts = group.dicts(_NOT_TRUNCATED)
            if type(group.envs) is slice:
                infos[group.envs] = dicts
            else:
                for i, info in zip(group.envs.tolist(), dicts):
                    infos[i] = info
        return [info if info is not None else {"TimeLimit.truncated": False} for info in infos]

    def _pin_if_cuda_started(self) -> None:
        """``pin_memory=None``: page-lock the arena, once, if CUDA has started meanwhile (never starts it)."""
        self._pin_checks -= 1
        if pinning.cuda_host.cuda_initialized():
            self._pin_checks = 0
            self._pool.page_lock()

    @timed_call
    def reset(self) -> VecEnvObs:
        if self._pin_checks:
            self._pin_if_cuda_started()
        kwargs = {}
        for i in range(self.num_envs):
            kwargs[i] = {"seed": self._seeds[i]}
            if self._options[i]:
                kwargs[i]["options"] = self._options[i]
        reset_infos = self._pool.reset(kwargs)
        self.reset_infos = [reset_infos[i] for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return self._observations()

    def _observations(self) -> VecEnvObs:
        """The observations of the last step or reset: copies, or views with ``copy=False``."""
        leaves = self._pool.obs_leaves  # with copy=False, the buffer the last call wrote
        if self.keys == [None]:
            return leaves[()].copy() if self.copy else leaves[()]
        values = OrderedDict((key, leaves[path].copy() if self.copy else leaves[path]) for key, path in self._obs_paths)
        if isinstance(self.observation_space, gym.spaces.Tuple):
            return tuple(values.values())
        return values

    # -- rare calls ----------------------------------------------------------------

    def _run(self, op: Callable[[gym.Env], Any], indices: VecEnvIndices) -> list[Any]:
        """``op(env_i)`` for each env ``indices`` names, in their order: the results."""
        if self._all_here and self._pool.idle_here():
            return self._run_here(op, indices)
        return self._run_held(op, indices)

    def _run_here(self, op: Callable[[gym.Env], Any], indices: VecEnvIndices) -> list[Any]:
        """Every env in this process: the call as one direct call, as ``DummyVecEnv`` makes it (see
        :mod:`shmvec.engine.local_step`): the same checks, results and errors, one clock update."""
        entered = _perf_counter()
        try:
            return self._pool.run_here(op, self._env_range if indices is None else self._indices(indices))
        finally:
            self._clock.whole_call(entered, _perf_counter())

    @timed_call
    def _run_held(self, op: Callable[[gym.Env], Any], indices: VecEnvIndices) -> list[Any]:
        targets = self._indices(indices)
        if len(set(targets)) == len(targets):
            results = self._pool.run({i: op for i in targets})
            return [results[i] for i in targets]
        # An index listed twice runs twice, as in DummyVecEnv (env_method("step") has effects):
        # one round per repetition, each round naming every env at most once.
        out: list[Any] = []
        for rnd in range(max(targets.count(i) for i in targets)):
            batch = [i for n, i in enumerate(targets) if targets[:n].count(i) == rnd]
            results = self._pool.run({i: op for i in batch})
            out += [(n, results[i]) for n, i in enumerate(targets) if targets[:n].count(i) == rnd]
        return [result for _, result in sorted(out, key=lambda pair: pair[0])]

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        targets = []
        for i in self._get_indices(indices):
            i = int(i)
            if not -self.num_envs <= i < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
            targets.append(i % self.num_envs)
        return targets

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return attribute from vectorized environment (see base class)."""
        return self._run(ops.GetWrapperAttr(attr_name), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute inside vectorized environments (see base class)."""
        self._run(ops.SetAttr(attr_name, value), indices)

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has the attribute, checked inside the workers."""
        return all(self._run(ops.HasWrapperAttr(attr_name), None))

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """Call instance methods of vectorized environments."""
        return self._run(ops.CallMethod(method_name, method_args, method_kwargs), indices)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Check if worker environments are wrapped with a given wrapper."""
        return self._run(ops.IsWrapped(wrapper_class), indices)

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return self._run(ops.Render(), None)

    def close(self) -> None:
        """Close the envs, stop the workers and release the shared memory. Safe to call twice."""
        self._pool.close()

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def __repr__(self) -> str:
        """``ShmPoolVecEnv(num_envs=N, n_workers=K, use_main_process=..., why='...')``: how the envs run."""
        return f"{type(self).__name__}(num_envs={self.num_envs}, {self._pool.description()})"

    def __enter__(self) -> ShmPoolVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


ShmPoolVecEnv.__doc__ += "\n    Pool options:" + options_doc() + "\n"
