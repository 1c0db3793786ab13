"""A shard: a contiguous run of envs stepped in place against the shared arena.

The same class serves inside worker processes and, with ``use_main_process=True``, inside
the main process, so both execute exactly the same stepping and auto-reset logic.

Leaves with no fixed size (``layout.Leaf.pickled``) have no shared buffer: their values
are kept per command in :attr:`Shard.pickled_out` and go back with the reply (a
:class:`~shmvec.ipc.protocol.StepInfo` per env for a step, a
:class:`~shmvec.ipc.protocol.ResetResult` per env for a reset); their actions come in a
:class:`~shmvec.ipc.protocol.PickledActions`.
"""

from __future__ import annotations

import copy
import operator
import time
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.info_rows import INFO_CODE, InfoWriter, fast_copy
from shmvec.ipc.protocol import PickledActions, Reset, ResetResult, RunOps, StepInfo
from shmvec.ipc.timing_rows import LANE_RING, LaneTimer


class Shard:
    """The envs ``[start, start + len(envs))``, wired to their rows of the shared buffers."""

    def __init__(
        self,
        envs: list[gym.Env],
        start: int,
        arena_views: dict[str, np.ndarray],
        layout: lay.ArenaLayout,
        autoreset_mode: AutoresetMode,
        action_space: gym.Space,
        info_writer: InfoWriter | None = None,
        lane: int | None = None,
    ):
        """``lane``: which lane's timing rows the steps go to (a worker's index; the main shard's is the last)."""
        self.envs = envs
        self.start = start
        self.stop = start + len(envs)
        self.reward = arena_views["reward"]
        self.terminated = arena_views["terminated"]
        self.truncated = arena_views["truncated"]
        self.autoreset = [False] * len(envs)  # NEXT_STEP: env j resets on its next step
        self.mode = autoreset_mode
        self._same_step = autoreset_mode == AutoresetMode.SAME_STEP
        self._next_step = autoreset_mode == AutoresetMode.NEXT_STEP
        self._action_space = action_space
        self._obs_buffers = [layout.obs_views(arena_views, b) for b in range(layout.obs_buffers)]
        self.select_obs_buffer(0)
        self._actions = ActionRows(layout, arena_views)
        self._pickled_obs_paths = tuple(leaf.path for leaf in layout.pickled_obs_leaves)
        # Whether a PickledActions message follows each STEP command on the pipe.
        self.pickled_actions = bool(layout.pickled_action_leaves)
        self.pickled_out: dict[int, dict[tuple, Any]] = {}  # env index -> its pickled obs leaves
        # Chosen once: fixed-size spaces pay nothing per env for the pickled leaves of others.
        self.write_obs = self._write_obs_keeping_pickled if self._pickled_obs_paths else self._write_obs
        self._final_obs = arena_views.get(lay.FINAL_OBS)  # present: episode ends travel in shm
        self._final_flag = arena_views.get(lay.FINAL_FLAG)
        # A worker's shard writes step infos into shared rows where they fit (the main shard's are in place).
        self._write_info = info_writer.write if info_writer is not None else None
        self._info_code = arena_views[INFO_CODE]
        self._coded = False  # whether the last step wrote any info code (they must be cleared)
        self.wrote_final = self.episode_ended = False  # since the pool looked: a final obs in its row; an episode end
        # A list (set by the in-process step): the step's plain final observations, (env, copy), kept
        # here rather than written to their rows for the pool to find by its flags.
        self.finals_here: list[tuple[int, np.ndarray]] | None = None
        timed = lane is not None and LANE_RING in arena_views  # a pool made with timings=False has no rows
        self.timer = LaneTimer(arena_views, lane, start, self.stop) if timed else None

    @property
    def wrote_infos(self) -> bool:
        """Whether the last step wrote any info to a shared row (their codes say which)."""
        return self._coded

    @property
    def writes_infos(self) -> bool:
        """Whether infos may go to shared rows (the pool then looks at their codes)."""
        return self._write_info is not None

    def write_infos_to(self, info_writer: InfoWriter) -> None:
        """Write the infos that fit into shared rows from now on (a worker's shard does from the start)."""
        self._write_info = info_writer.write

    # -- buffers -------------------------------------------------------------------

    @property
    def double_buffered(self) -> bool:
        """Whether each command says which observation buffer it writes (``CTRL_OBS_BUFFER``)."""
        return len(self._obs_buffers) > 1

    def select_obs_buffer(self, buffer: int) -> None:
        """Write observations into buffer ``buffer`` from now on."""
        leaves = self._obs_buffers[buffer]
        self._obs_leaves = [(view, path) for path, view in leaves.items()]
        self._flat_obs = leaves.get(()) if len(leaves) == 1 else None

    def _write_obs(self, i: int, obs: Any) -> None:
        if self._flat_obs is not None:
            self._flat_obs[i] = obs
        else:
            for view, path in self._obs_leaves:
                view[i] = lay.get_path(obs, path)

    def _write_obs_keeping_pickled(self, i: int, obs: Any) -> None:
        self._write_obs(i, obs)
        self.pickled_out[i] = {path: lay.get_path(obs, path) for path in self._pickled_obs_paths}

    def read_actions(self, pickled: PickledActions | None = None) -> list[Any]:
        """This shard's actions, copied out of shared memory (an env may keep them), each in
        the type and dtype the caller gave it.

        ``pickled`` holds the actions of the pickled action leaves for this shard's envs.
        """
        s, e, actions = self.start, self.stop, self._actions
        if pickled is None and actions.flat:
            return actions.column(0, s, e)
        columns = {path: actions.column(k, s, e) for k, path in enumerate(actions.paths)}
        if pickled is not None:
            columns.update(pickled.columns)
        return [lay.unflatten(self._action_space, {p: col[j] for p, col in columns.items()}) for j in range(e - s)]

    def _with_pickled_obs(self, infos: list[StepInfo]) -> list[StepInfo]:
        """One record per env, in env order, each carrying its pickled observation leaves."""
        pickled, self.pickled_out = self.pickled_out, {}
        by_env = {record.env_index: record for record in infos}
        return [by_env.get(i, StepInfo(i, {}))._replace(pickled_obs=pickled[i]) for i in range(self.start, self.stop)]

    # -- commands ------------------------------------------------------------------

    def step(self, actions: list[Any]) -> list[StepInfo]:
        """Step every env of the shard in place; return the infos worth sending."""
        if self.finals_here:  # a failed step's: dropped, as the flags of one are
            self.finals_here = []
        timer = self.timer
        stamps = timer.begin() if timer is not None else None
        resets: list[int] | None = [] if stamps is not None else None  # on the sampled steps only
        if not self._pickled_obs_paths:
            infos = self._step_batch(actions, stamps, resets)
        else:
            infos, step_env = [], self.step_env
            for j in range(len(self.envs)):
                record = step_env(j, actions[j])
                if record is not None:
                    infos.append(record)
            infos = self._with_pickled_obs(infos)
        if timer is not None:
            timer.end(stamps, resets)
        return infos

    def _step_batch(self, actions: list[Any], stamps: list[int] | None, resets: list[int] | None) -> list[StepInfo]:
        """:meth:`step_env` for every env, with one write per field for the whole shard.

        The rows are written after the loop (also when an env raises, for the envs before
        it): per-env writes and lookups cost ~0.55 µs per env, this loop ~0.25 (measured,
        zero-cost env; CartPole's step is ~7 µs). Infos that fit a shared row go there.
        ``stamps`` (a list on the steps the lane's timer samples): each env's end time is
        appended, and the envs that reset to ``resets``.
        """
        clock = time.perf_counter_ns
        envs, start, autoreset = self.envs, self.start, self.autoreset
        next_step, flat, write_info = self._next_step, self._flat_obs, self._write_info
        n = len(envs)
        rewards, terms, truncs, rows, codes = [0.0] * n, [False] * n, [False] * n, [None] * n, [0] * n
        infos: list[StepInfo] = []
        j = 0
        if stamps is not None:
            stamps.append(clock())
        try:
            for j in range(n):
                env = envs[j]
                if next_step and autoreset[j]:
                    obs, info = env.reset()
                    autoreset[j] = False
                    ended = False
                    if resets is not None:
                        resets.append(j)
                else:
                    obs, rewards[j], term, trunc, info = env.step(actions[j])
                    terms[j], truncs[j] = term, trunc
                    ended = term or trunc
                if ended:
                    obs, record = self._episode_end(j, obs, info)
                    if record is not None:
                        infos.append(record)
                    if resets is not None and self._same_step:
                        resets.append(j)
                elif info:
                    code = write_info(start + j, info) if write_info is not None else 0
                    if code:
                        codes[j] = code
                    else:
                        infos.append(StepInfo(start + j, info))
                if flat is None:
                    self._write_obs(start + j, obs)
                else:
                    rows[j] = obs
                if stamps is not None:
                    stamps.append(clock())
            j = n
        except Exception as exc:  # zero-cost until raised (3.11)
            self._write_rows(j, rewards, terms, truncs, rows, codes)
            raise EnvFailed(start + j) from exc
        self._write_rows(n, rewards, terms, truncs, rows, codes)
        return infos

    def _episode_end(self, j: int, obs: Any, info: dict) -> tuple[Any, StepInfo | None]:
        """Env ``start + j`` ended its episode: auto-reset it as the mode says; (its observation, record)."""
        i = self.start + j
        self.episode_ended = True
        if not self._same_step:
            self.autoreset[j] = self._next_step
            return obs, (StepInfo(i, info) if info else None)
        final_obs, final_info = obs, info
        obs, info = self.envs[j].reset()
        final_view, final_flag = self._final_obs, self._final_flag
        if final_view is not None and _fits(final_obs, final_view) and not final_info and not info:
            if self.finals_here is not None:  # the caller is in this process: no row, no flag
                self.finals_here.append((i, final_obs.copy()))
                return obs, None
            final_view[i] = final_obs  # the common case: nothing to pickle
            final_flag[i] = self.wrote_final = True
            return obs, None
        if final_flag is not None:
            final_flag[i] = False
        return obs, StepInfo(i, info, final_obs, final_info)

    def _write_rows(self, count: int, rewards: list, terms: list, truncs: list, rows: list, codes: list) -> None:
        """Write the first ``count`` envs' results, one slice per field, and every env's info code."""
        s, e = self.start, self.start + count
        if self._write_info is not None:
            coded = any(codes)
            if coded or self._coded:  # all of them: a code left from an earlier step would be read again
                self._coded = True  # before the write: a Ctrl-C between the two leaves them cleared next step
                self._info_code[s : self.stop] = codes
            self._coded = coded
        if count < len(rewards):  # an env raised: the envs before it
            rewards, terms, truncs, rows = rewards[:count], terms[:count], truncs[:count], rows[:count]
        flat = self._flat_obs  # None: observations that are not one flat array were written as they came
        if count == 1:  # one env: item writes (0.45 µs for CartPole's four fields, four slices 1.2)
            self.reward[s], self.terminated[s], self.truncated[s] = rewards[0], terms[0], truncs[0]
            if flat is not None:
                flat[s] = rows[0]
            return
        try:
            self.reward[s:e] = rewards
            self.terminated[s:e] = terms
            self.truncated[s:e] = truncs
            if flat is not None:
                flat[s:e] = rows
        except (ValueError, TypeError):  # values numpy cannot stack (e.g. (1, 4) observations): row by row
            for view, values in (
                (self.reward, rewards),
                (self.terminated, terms),
                (self.truncated, truncs),
                (flat, rows),
            ):
                for k in range(count if view is not None else 0):
                    view[s + k] = values[k]

    def step_env(self, j: int, action: Any) -> StepInfo | None:
        """Step env ``start + j`` in place (auto-resetting it as the mode says); its record, if worth sending."""
        i = self.start + j
        env = self.envs[j]
        record = None
        try:
            if self._next_step and self.autoreset[j]:
                obs, info = env.reset()
                rew, term, trunc = 0.0, False, False
            else:
                obs, rew, term, trunc, info = env.step(action)
            self.reward[i] = rew
            self.terminated[i] = term
            self.truncated[i] = trunc
            if term or trunc:
                self.episode_ended = True
                if self._same_step:
                    final_obs, final_info = obs, info
                    obs, info = env.reset()
                    final_view, final_flag = self._final_obs, self._final_flag
                    if final_view is not None and _fits(final_obs, final_view) and not final_info and not info:
                        final_view[i] = final_obs  # the common case: nothing to pickle
                        final_flag[i] = self.wrote_final = True
                    else:
                        if final_flag is not None:
                            final_flag[i] = False
                        record = StepInfo(i, info, final_obs, final_info)
                else:
                    self.autoreset[j] = self._next_step
                    if info:
                        record = StepInfo(i, info)
            else:
                self.autoreset[j] = False
                if info:
                    record = StepInfo(i, info)
            self.write_obs(i, obs)
        except Exception as exc:  # zero-cost until raised (3.11)
            raise EnvFailed(i) from exc
        return record

    def read_action(self, i: int) -> Any:
        """Env ``i``'s action (async batches: fixed-size action leaves only), copied out of shared memory."""
        actions = self._actions
        if actions.flat:
            return actions.value(0, i)
        return lay.unflatten(self._action_space, {path: actions.value(k, i) for k, path in enumerate(actions.paths)})

    def reset(self, request: Reset) -> dict[int, dict[str, Any]]:
        infos = {}
        i = None
        try:
            for i, kwargs in request.kwargs.items():
                j = i - self.start
                obs, infos[i] = self.envs[j].reset(**kwargs)
                self.write_obs(i, obs)
                self.autoreset[j] = False
                self.terminated[i] = self.truncated[i] = False
        except Exception as exc:
            raise EnvFailed(i) from exc
        return infos

    def handle(self, request: Reset | RunOps) -> dict[int, Any]:
        """Serve a rare request: operations on envs reply ``{i: result}``; a reset replies ``{i: info}``,
        or ``{i: ResetResult(info, pickled_obs)}`` when the observation space has pickled leaves."""
        if not isinstance(request, Reset):
            return dict(zip(request.ops, self.run_ops(request.ops.items())))
        self.pickled_out = {}
        infos = self.reset(request)
        if not self._pickled_obs_paths:
            return infos
        return {i: ResetResult(info, self.pickled_out[i]) for i, info in infos.items()}

    def run_ops(self, ops: Iterable[tuple[int, Callable[[gym.Env], Any]]]) -> list[Any]:
        """``op(env_i)`` for each ``(i, op)`` of ``ops``, in order (an env named twice runs twice): the
        results. The first op to raise raises ``EnvFailed(i)`` from its exception; those after it do not run."""
        results, envs, start, i = [], self.envs, self.start, None
        try:
            for i, op in ops:
                results.append(op(envs[i - start]))
        except Exception as exc:
            raise EnvFailed(i) from exc
        return results


def with_shm_finals(records: list[StepInfo], final_obs: np.ndarray, ended: np.ndarray) -> list[StepInfo]:
    """Main side: ``records`` plus one for each episode end ``ended`` that travelled through
    shared memory (``FINAL_OBS`` rows, empty infos), in env order."""
    if not len(ended):
        return records
    # half the cost of one fancy-indexed copy
    return with_plain_finals(records, [(i, final_obs[i].copy()) for i in ended.tolist()])


def with_plain_finals(records: list[StepInfo], finals: list[tuple[int, np.ndarray]]) -> list[StepInfo]:
    """``records`` plus one for each episode end with empty infos, ``(env, final observation)``, in env order."""
    ours = [StepInfo(i, {}, final_obs, {}) for i, final_obs in finals]
    if not records:
        return ours
    return sorted(records + ours, key=_env_index)  # adapters add infos in env order, like the references


_env_index = operator.attrgetter("env_index")


def _fits(obs: Any, view: np.ndarray) -> bool:
    """Whether ``obs`` survives a trip through a row of ``view`` exactly (type, dtype, shape)."""
    return type(obs) is np.ndarray and obs.dtype == view.dtype and obs.shape == view.shape[1:]


class EnvFailed(Exception):
    """Raised by :class:`Shard` when env ``env_index`` raised; the env's exception is ``__cause__``."""

    def __init__(self, env_index: int | None):
        super().__init__(env_index)
        self.env_index = env_index


def copied_record(record: StepInfo) -> StepInfo:
    """``record`` with nothing the env may change later (most are a plain info: copied cheaply)."""
    if record.final_obs is None and record.final_info is None and record.pickled_obs is None:
        return record._replace(info=fast_copy(record.info))
    return copy.deepcopy(record)


def merged_records(records: list[StepInfo], more: list[StepInfo]) -> list[StepInfo]:
    """Two lists of records in env order, as one in env order (adapters add infos in that order)."""
    if not records:
        return more
    return sorted(records + more, key=operator.attrgetter("env_index"))
