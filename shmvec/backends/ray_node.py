"""The node side of the Ray backend: what runs on each node, and what it sends back to the driver.

On each node one Ray actor (:class:`NodeShard`) runs a local :class:`~shmvec.engine.pool.ShmPool`
over its contiguous shard of the envs, so shared memory and semaphores stay on that node.
Its pool numbers the envs from 0; the actor turns the driver's global env indices into
local ones and back, in its answers and in the messages of the errors it reports.

Its calls (but ``close``) answer with a message, never with an exception: :class:`Rows`
(the node's rows of obs, rewards and flags, its records, a request's replies), an
:class:`~shmvec.ipc.protocol.ErrorReport`, or :class:`Reborn` after Ray re-created the actor.
:class:`NodeInfo` describes the node once it has built its envs. :func:`unlink_leftovers`
runs on a node as a small Ray task after its actor died. The driver side is
:mod:`shmvec.backends.ray`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

try:
    import ray
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('backend="ray" needs Ray: pip install "ray>=2.60,<2.61" (shmvec\'s [ray] extra)') from exc

from shmvec.engine.pool import ShmPool
from shmvec.errors import ShmVecError
from shmvec.ipc.action_rows import TakenRows
from shmvec.ipc.protocol import ErrorReport, Reset, RunOps, StepInfo
from shmvec.options import PoolOptions


class Reborn(NamedTuple):
    """A node actor's answer to any call after Ray re-created it, until the driver resets it:
    the driver must learn of the restart even when no call was in flight at the death."""


class Rows(NamedTuple):
    """A node's answer: its rows of the arrays (all its envs, or ``ids``), and what else it returned."""

    ids: np.ndarray | None  # global env ids of the rows; None: all of the node's envs, in order
    obs: dict[tuple, np.ndarray]
    rewards: np.ndarray | None = None  # None for a reset or an op: only observations changed
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    pickled_obs: dict[tuple, list] | None = None  # leaves with no fixed size: one value per row
    records: list[StepInfo] = []
    replies: dict[int, Any] | None = None  # a request's results by global env index
    busy: float = 0.0  # a step's seconds on the node, from its actions in to its rows out (envs.timings)


@dataclasses.dataclass
class NodeInfo:
    """What a node actor tells the driver once it has built its envs."""

    node_id: str
    ip: str
    pid: int  # the actor's process
    worker_pids: list[int]
    spaces: list[tuple[gym.Space, gym.Space]]
    metadata: dict[str, Any]
    render_mode: str | None
    spec: Any


class NodeShard:
    """Runs envs ``[start, start + len(env_fns))`` on one node in a local pool (the body of a Ray actor)."""

    def __init__(self, index: int, start: int, env_fns: list, options: PoolOptions, engine_kwargs: dict):
        self.index, self.start = index, start
        self.pool: ShmPool | None = None
        self.failure: ErrorReport | None = None
        self.reborn = ray.get_runtime_context().was_current_actor_reconstructed
        try:
            self.pool = ShmPool(env_fns, options, **engine_kwargs)
        except BaseException as exc:  # reported by describe(): a failed actor constructor loses the exception
            self.failure = self._report(exc)

    def describe(self) -> NodeInfo | ErrorReport:
        if self.failure is not None:
            return self.failure
        pool = self.pool
        return NodeInfo(
            ray.get_runtime_context().get_node_id(),
            ray.util.get_node_ip_address(),
            os.getpid(),
            [link.process.pid for link in pool.links],
            [(pool.single_observation_space, pool.single_action_space)] * pool.num_envs,
            pool.env_metadata,
            pool.env_render_mode,
            pool.env_spec,
        )

    def step(self, actions: TakenRows, pickled_actions: dict | None) -> Rows | ErrorReport:
        return self._guard(self._step, actions, pickled_actions)

    def send(self, ids: np.ndarray, actions: TakenRows) -> Rows | ErrorReport:
        return self._guard(self._send, ids, actions)

    def reset_some(self, kwargs: dict[int, dict]) -> Rows | ErrorReport:
        return self._guard(self._reset_some, kwargs)

    def request(self, request: Reset | RunOps) -> Rows | ErrorReport:
        return self._guard(self._request, request)

    def reset_all(self) -> Rows | ErrorReport:
        """After Ray re-created this actor: reset every env (seed None), as a restarted worker does."""
        self.reborn = False
        return self._guard(self._request, Reset({i: {} for i in range(self.pool.num_envs)}))

    def close(self, terminate: bool) -> None:
        if self.pool is not None:
            self.pool.close(terminate=terminate)

    def _step(self, actions: TakenRows, pickled_actions: dict | None) -> Rows:
        pool, started = self.pool, time.perf_counter()
        pool.actions.put(actions)
        pool.step_async(pickled_actions)
        rows = self._rows(None, pool.step_wait(), step=True)
        return rows._replace(busy=time.perf_counter() - started)

    def _send(self, ids: np.ndarray, actions: TakenRows) -> Rows:
        pool = self.pool
        pool.actions.put(actions, ids)
        pool.batches.send(ids)
        done, records = pool.batches.recv(len(ids))  # this call's envs only: the actor runs one call at a time
        return self._rows(done, list(records.values()), step=True)

    def _reset_some(self, kwargs: dict) -> Rows:
        self.pool.batches.reset(kwargs)
        done, records = self.pool.batches.recv(len(kwargs))
        return self._rows(done, list(records.values()), step=True)

    def _request(self, request: Reset | RunOps) -> Rows:
        if isinstance(request, Reset):
            infos = self.pool.reset(request.kwargs)
            ids = np.array(sorted(infos), dtype=np.int64)
            return self._rows(ids, [])._replace(replies=self._global(infos))
        return Rows(None, {}, replies=self._global(self.pool.run(request.ops)))

    def _rows(self, ids: np.ndarray | None, records: list[StepInfo], step: bool = False) -> Rows:
        pool = self.pool
        where = slice(None) if ids is None else ids
        rows = range(pool.num_envs) if ids is None else ids.tolist()
        pickled = {path: [column[i] for i in rows] for path, column in pool.pickled.obs.items()}
        return Rows(
            None if ids is None else ids + self.start,
            {path: leaf[where] for path, leaf in pool.obs_leaves.items()},  # Ray copies them into the object store
            pool.rewards[where] if step else None,
            pool.terminated[where] if step else None,
            pool.truncated[where] if step else None,
            pickled,
            [record._replace(env_index=record.env_index + self.start) for record in records],
        )

    def _global(self, by_env: dict[int, Any]) -> dict[int, Any]:
        return {i + self.start: value for i, value in by_env.items()}

    def _guard(self, method: Callable, *args: Any) -> Any:
        """Run ``method``; an exception comes back as an ErrorReport (global env index), never as a Ray error."""
        if self.failure is not None:
            return self.failure
        if self.reborn:
            return Reborn()
        try:
            return method(*args)
        except BaseException as exc:
            return self._report(exc)

    def _report(self, exc: BaseException) -> ErrorReport:
        local = getattr(exc, "env_index", None)
        if isinstance(exc, ShmVecError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (_global_envs(exc.args[0], self.start),)  # e.g. a timeout or a worker death naming envs
        # The local pool's note numbers envs from 0 on this node: the driver writes the global one.
        notes = [note for note in getattr(exc, "__notes__", []) if not note.startswith("shmvec: raised in")]
        if hasattr(exc, "__notes__"):
            exc.__notes__ = notes
        return ErrorReport.capture(self.index, None if local is None else local + self.start, exc)


def _global_envs(message: str, start: int) -> str:
    """A local pool's message with its env numbers ("env 1", "envs 0..1, 3") made global."""
    shift = lambda number: str(int(number[0]) + start)  # noqa: E731
    return _ENV_NUMBERS.sub(lambda found: found[1] + re.sub(r"\d+", shift, found[2]), message)


_ENV_NUMBERS = re.compile(r"(\benvs? )(\d+(?:\.\.\d+)?(?:, \d+(?:\.\.\d+)?)*)")


def unlink_leftovers(pid: int) -> list[str]:
    """On a node: remove the /dev/shm entries of a dead node actor ``pid`` (named ``shmvec_<pid>_...``)."""
    removed = []
    for name in os.listdir("/dev/shm"):
        if name.startswith((f"shmvec_{pid}_", f"sem.shmvec_{pid}_")):
            try:
                os.unlink(os.path.join("/dev/shm", name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
