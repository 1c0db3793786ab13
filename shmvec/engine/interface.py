"""The engine interface: all that the adapters see of a pool, local or over Ray nodes.

:class:`Engine` is the contract; :class:`EngineBase` is what both backends
(:class:`~shmvec.engine.pool.ShmPool`, :class:`~shmvec.backends.ray.RayPool`) share to
meet it: the closed/broken/pending state (:class:`~shmvec.engine.breakable.Breakable`),
the observation buffers (:class:`~shmvec.ipc.obs_buffers.ObsBuffers`), and the calls that
go to a backend's own collaborators: its rare calls (``requests``: a reset or operations
on envs), its async schedule (``batches``: send/recv) and its pickled leaves (``pickled``:
observations and actions with no fixed size).

One step, as an adapter drives it: check (:meth:`Engine.ensure_can_step`), write the
actions into :attr:`Engine.actions`, :meth:`Engine.step_async`, :meth:`Engine.step_wait`,
then read :attr:`Engine.obs_leaves`, :attr:`Engine.rewards`, :attr:`Engine.terminated`,
:attr:`Engine.truncated` and :attr:`Engine.pickled_obs` (valid until the next call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from shmvec.clocks.call_clock import CallClock, NoClock
from shmvec.clocks.timings import Timings, snapshot
from shmvec.engine.breakable import Breakable
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.info_rows import InfoGroup
from shmvec.ipc.obs_buffers import ObsBuffers
from shmvec.ipc.protocol import Reset, RunOps, StepInfo
from shmvec.ipc.timing_rows import read_rows
from shmvec.planning.plan import describe_plan, usable_cores

Path = tuple[Any, ...]  # a leaf's path in a nested space; () for a flat one


class Engine(Protocol):
    """N envs stepped together, their results in shared rows. Env ids are 0..N-1."""

    num_envs: int
    n_workers: int
    single_observation_space: gym.Space
    single_action_space: gym.Space
    env_metadata: dict[str, Any]  # env 0's ``metadata``
    env_render_mode: str | None  # env 0's ``render_mode``
    timeout: float | None  # the default limit of a wait, in seconds
    closed: bool
    clock: CallClock  # where the main thread's time goes: the adapters wrap their calls in it
    actions: ActionRows  # the adapters write each step's actions here
    action_leaves: dict[Path, np.ndarray]  # per fixed-size action leaf, its rows in the space's dtype
    obs_leaves: dict[Path, np.ndarray]  # per fixed-size observation leaf, the rows the last call wrote
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info_groups: list[InfoGroup]  # the last step's infos of shared rows, once collect_info_rows was called

    @property
    def pickled_obs(self) -> dict[Path, list[Any]]:
        """Observation leaves with no fixed size, one value per env, as the last call left them."""

    @property
    def pickled_action_paths(self) -> tuple[Path, ...]:
        """Action leaves with no fixed size: :meth:`step_async` takes their values."""

    def ensure_can_step(self) -> None:
        """Raise at once if a step cannot start now (closed, broken, a call or sends pending)."""

    def step_async(self, pickled_actions: dict[Path, Sequence[Any]] | None = None) -> None:
        """Step every env with the actions written into :attr:`actions` (and ``pickled_actions``)."""

    def step_wait(self, timeout: float | None = None) -> list[StepInfo]:
        """Wait for the step; the records of envs that sent infos or ended an episode."""

    def collect_info_rows(self, main_shard: bool) -> None:
        """Leave the step infos that travel in shared rows in :attr:`info_groups`, for an adapter that
        reads them a column or a group at a time, instead of in :meth:`step_wait`'s records;
        ``main_shard``: the envs of the main process's shard too. (Ray: infos stay records.)"""

    def reset(self, kwargs: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Reset the envs of ``kwargs`` (env id -> ``reset`` keyword arguments); their infos."""

    def run(self, ops: dict[int, Callable[[gym.Env], Any]]) -> dict[int, Any]:
        """Call ``ops[i](env i)`` for each env id; the results by env id."""

    def timings(self) -> Timings:
        """Where the main thread's time went (:mod:`~shmvec.clocks.timings`)."""

    def call_async(self, request: Reset | RunOps, beside_sends: bool = False) -> None:
        """Start a reset or operations; ``beside_sends``: while other envs have sends in flight."""

    def call_wait(self, timeout: float | None = None) -> dict[int, Any]:
        """The results of the call started by :meth:`call_async`, by env id."""

    def check_can_send(self, env_ids: np.ndarray) -> None:
        """Raise unless every env of ``env_ids`` is held by the caller (an async batch)."""

    def send(self, env_ids: np.ndarray) -> None:
        """Step the envs ``env_ids`` with their actions in :attr:`actions`, without waiting."""

    def send_reset(self, kwargs: dict[int, dict[str, Any]]) -> None:
        """Reset the envs of ``kwargs`` without waiting: their results come through :meth:`recv`."""

    def recv(self, batch_size: int, timeout: float | None = None) -> tuple[np.ndarray, dict[int, StepInfo]]:
        """The first ``batch_size`` envs to finish (their ids, oldest first) and their records."""

    def page_lock(self, device: int | None = None) -> bool:
        """Page-lock the observation rows for CUDA copies from them (main process, once, after the
        workers attached; undone at :meth:`close`); whether they are. ``device``: the CUDA device to
        register with. A failure warns once and returns False."""

    def description(self) -> str:
        """How the envs run, for the adapters' ``repr``."""

    def close(self, terminate: bool = False) -> None:
        """Stop the workers and free shared memory; idempotent."""


class EngineBase(ObsBuffers, Breakable):
    """The part of :class:`Engine` both backends share, over their ``requests``, ``batches`` and ``pickled``."""

    requests: Any  # start/collect one rare call: send(request, beside_sends), wait(timeout)
    pickled: Any  # PickledLeaves: obs, action_paths
    _final_flag: np.ndarray | None = None
    info_columns = False  # whether step_wait leaves the infos of shared rows in info_groups
    info_groups: list[InfoGroup] = []  # noqa: RUF012  (never mutated: replaced by each step)

    def collect_info_rows(self, main_shard: bool) -> None:
        pass  # a backend without info rows: every info is in step_wait's records

    @property
    def final_flag(self) -> np.ndarray | None:
        """Per env, whether its final observation is in the rows (local pool, SAME_STEP); else None."""
        return self._final_flag

    @property
    def pickled_obs(self) -> dict[Path, list[Any]]:
        return self.pickled.obs

    @property
    def pickled_action_paths(self) -> tuple[Path, ...]:
        return self.pickled.action_paths

    def timings(self) -> Timings:
        """Where the time went since the pool started or since the last reset (:mod:`~shmvec.clocks.timings`)."""
        if isinstance(self.clock, NoClock):
            raise RuntimeError("envs.timings is off: this vector env was made with timings=False")
        views = getattr(self, "views", None)  # the local pool's arena; Ray's driver has none
        plan = getattr(self, "plan", None)
        layout = {
            "num_envs": self.num_envs,
            "n_workers": self.n_workers,
            "main_shard": bool(getattr(self, "main_shard", False)),
            "cores": usable_cores(),
            "plan": describe_plan(plan) if plan is not None else f"backend=ray, {self.n_workers} nodes",
            "remote": views is None,
        }
        rows = (lambda: read_rows(views)) if views is not None else (lambda: None)
        return snapshot(self.clock, rows, getattr(self, "shards", []), layout)

    def call_async(self, request: Reset | RunOps, beside_sends: bool = False) -> None:
        self.requests.send(request, beside_sends)

    def call_wait(self, timeout: float | None = None) -> dict[int, Any]:
        return self.requests.wait(timeout)

    def check_can_send(self, env_ids: np.ndarray) -> None:
        self.batches.check_can_send(env_ids)

    def send(self, env_ids: np.ndarray) -> None:
        self.batches.send(env_ids)

    def send_reset(self, kwargs: dict[int, dict[str, Any]]) -> None:
        self.batches.reset(kwargs)

    def recv(self, batch_size: int, timeout: float | None = None) -> tuple[np.ndarray, dict[int, StepInfo]]:
        return self.batches.recv(batch_size, timeout)

    def page_lock(self, device: int | None = None) -> bool:
        return False  # rows not in one arena of this process (Ray's driver): copies come from pageable memory

    def description(self) -> str:
        return f"n_workers={self.n_workers}"
