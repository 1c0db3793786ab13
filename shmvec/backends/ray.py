"""Shards on Ray nodes: :class:`RayPool`, the engine's interface over one local pool per node.

The envs are split into contiguous shards, one per node. On each node one Ray actor
(:class:`~shmvec.backends.ray_node.NodeShard`) runs a local :class:`~shmvec.engine.pool.ShmPool` over its
shard, so shared memory and semaphores stay on that node. This module is the driver's side (its node
bookkeeping: :mod:`shmvec.backends.ray_cluster`; its rare calls and async batches: :mod:`shmvec.backends.ray_requests`,
:mod:`shmvec.backends.ray_batches`); the node's (the actor, and its answers) is :mod:`shmvec.backends.ray_node`.
The driver keeps plain numpy arrays with the local pool's names and shapes (``obs_leaves``, ``rewards``, ...)
and fills them from the nodes' answers: the adapters cannot tell the two engines apart. Env indices are global
on the driver and in every record; a node's pool numbers its envs from 0, and the actor translates both ways.

Synchronous step (one Ray call per node per step; numpy through the object store)::

    driver                                        node actor n (envs [s_n, e_n))
    step_async: actor.step.remote(action rows ──▶ write them into its pool, step it
                [s_n, e_n)) for every node        (its workers, its shared memory)
    step_wait: ray.wait(all, timeout) ◀────────── Rows: obs, rewards, flags of [s_n, e_n),
      write each node's rows                      records (global env indices) | ErrorReport

Rare calls (reset, get_attr, ...) travel the same way (``actor.request``). Async batches (``send``/``recv``) are
per node: ``send`` makes one call per node that holds some of the envs, and ``recv`` takes a node's envs when
its call answers (``ray.wait``, first come first served), so a batch never waits for a slower node, but one
node's envs come back together.

A node actor that dies (node lost, OOM kill, ``ray.kill``) raises :class:`~shmvec.errors.WorkerDiedError` naming
the node and its envs; with ``on_worker_failure="restart"`` Ray's own actor restart (``max_restarts``) re-creates
it, its envs are reset and report a truncation, as in the local restart mode. Ray fails a call to an actor it is
re-creating as *unavailable* (not dead): the driver then waits for the new actor, within
:meth:`RayPool.restart_limit`. Every answer of a node actor passes through
:func:`~shmvec.backends.ray_cluster.answer_of`, which turns Ray's actor errors into :class:`Lost`.
"""

from __future__ import annotations

import atexit
import dataclasses
import operator
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np

try:
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('backend="ray" needs Ray: pip install "ray>=2.60,<2.61" (shmvec\'s [ray] extra)') from exc

from shmvec.backends.ray_batches import RayBatches
from shmvec.backends.ray_cluster import (
    Lost,
    Node,
    NodeResources,
    answer_of,
    connect,
    failed,
    finalize_unclosed,
    node_count,
    sweep,
)
from shmvec.backends.ray_node import NodeInfo, NodeShard, Rows
from shmvec.backends.ray_requests import RayRequests
from shmvec.clocks.call_clock import CallClock, NoClock
from shmvec.engine.failures import not_answered, rebuilt
from shmvec.engine.interface import EngineBase
from shmvec.engine.pool import START_TIMEOUT
from shmvec.engine.validation import check_env_fns, check_same_spaces
from shmvec.errors import RemoteTraceback, StepTimeoutError, WorkerDiedError
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.pickled import PickledLeaves
from shmvec.ipc.protocol import ErrorReport, Reset, RunOps, StepInfo
from shmvec.options import PoolOptions

# A node's own pool times out first (it gets the same timeout); the driver waits this much
# longer for that node to say so, before blaming the node actor itself.
NODE_GRACE = 10.0
RESTART_POLL = 0.2  # seconds between calls to a node actor while Ray re-creates it


class RayPool(EngineBase):
    """The engine's interface (see :class:`~shmvec.engine.pool.ShmPool`) over one local pool per Ray node.

    Args:
        env_fns: callables that each build a new env; they are pickled to the nodes.
        options: :class:`~shmvec.options.PoolOptions` with ``backend="ray"``; ``n_workers``
            is per node.
        autoreset_mode, env_wrapper, obs_space_match, obs_buffers: as :class:`~shmvec.engine.pool.ShmPool`'s
            (the double buffers are the driver's: the nodes' pools copy into Ray's object store).
        batch_size: as ShmPool's; not passed on: a node's pool steps each call's envs together.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        options: PoolOptions,
        *,
        autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
        env_wrapper: Callable[[gym.Env], gym.Env] | None = None,
        obs_space_match: Callable[[gym.Space, gym.Space], bool] = operator.eq,
        obs_buffers: int = 1,
        batch_size: int | None = None,
    ):
        env_fns = check_env_fns(env_fns)
        self.options = options
        self._n_obs_buffers = obs_buffers
        self.num_envs = len(env_fns)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.timeout = options.timeout
        self.pending: str | None = None
        self._step_refs: dict[int, Any] = {}
        self.restarts = 0
        connect()
        self._res = NodeResources()
        self._finalizer = weakref.finalize(self, finalize_unclosed, self._res)
        atexit.register(self._finalizer)  # runs before Ray's own atexit shutdown (registered earlier)
        engine_kwargs = {
            "autoreset_mode": self.autoreset_mode,
            "env_wrapper": env_wrapper,
            "obs_space_match": obs_space_match,
        }
        try:
            self._start(env_fns, engine_kwargs, obs_space_match)
        except BaseException:
            self.close()
            raise
        self.clock = CallClock() if self.options.timings else NoClock()  # the driver's time (adapters' calls wrap it)

    @property
    def nodes(self) -> list[Node]:
        return self._res.nodes

    def _start(self, env_fns: list, engine_kwargs: dict, obs_space_match: Callable) -> None:
        opts = self.options
        cpus = opts.n_workers or 1
        n_nodes = node_count(opts.n_nodes, cpus, self.num_envs)
        bounds = lay.shard_bounds(self.num_envs, n_nodes)
        if opts.n_workers is not None:
            opts.workers_for(min(stop - start for start, stop in bounds))  # checked here, not on every node
        self._res.group = group = placement_group([{"CPU": cpus}] * n_nodes, strategy="STRICT_SPREAD")
        if not group.wait(START_TIMEOUT):
            raise RuntimeError(
                f"Ray could not reserve {cpus} CPU(s) on each of {n_nodes} distinct nodes within {START_TIMEOUT}s "
                "(other work holds them?); free them or pass a smaller n_nodes / n_workers"
            )
        actor_class = ray.remote(NodeShard)
        local_options = dataclasses.replace(opts, backend="local", n_nodes=None)
        restarts = opts.max_restarts if opts.on_worker_failure == "restart" else 0
        for n, (start, stop) in enumerate(bounds):
            actor = actor_class.options(
                num_cpus=cpus,
                max_restarts=restarts,
                max_task_retries=0,  # a step that died is reported (or restarted), never silently run again
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=n),
            ).remote(n, start, env_fns[start:stop], local_options, engine_kwargs)
            self._res.nodes.append(Node(n, start, stop, actor))
        answers = self.collect_answers({node.index: node.actor.describe.remote() for node in self.nodes}, None)
        for node in self.nodes:
            node.info = answers[node.index]
        check_same_spaces([pair for node in self.nodes for pair in node.info.spaces], obs_space_match)
        self._adopt(self.nodes[0].info, bounds)

    def _adopt(self, info: NodeInfo, bounds: list[tuple[int, int]]) -> None:
        """The driver's arrays: the same fields, dtypes and shapes as a local pool's arena, in plain memory."""
        self.single_observation_space, self.single_action_space = info.spaces[0]
        self.env_metadata, self.env_render_mode, self.env_spec = info.metadata, info.render_mode, info.spec
        self.n_workers = sum(len(node.info.worker_pids) for node in self.nodes)
        layout = lay.ArenaLayout.plan(
            self.single_observation_space,
            self.single_action_space,
            self.num_envs,
            len(bounds),
            obs_buffers=self._n_obs_buffers,
        )
        views = layout.views(bytearray(layout.nbytes))
        self.rewards, self.terminated, self.truncated = views["reward"], views["terminated"], views["truncated"]
        self._init_obs_buffers(layout, views)
        self.actions = ActionRows(layout, views)  # written through this, in the callers' dtypes
        self.action_leaves = self.actions.leaves  # the shapes and dtypes to check actions against
        self.pickled = PickledLeaves(layout, bounds, self.num_envs)
        self.requests = RayRequests(self)
        self.batches = RayBatches(self)

    # -- the synchronous step ------------------------------------------------------------

    def step_async(self, pickled_actions: dict[tuple, Sequence[Any]] | None = None) -> None:
        """Send each node its rows of :attr:`actions` (and of ``pickled_actions``) and start its step."""
        self.ensure_can_step()
        self.pickled.action_blobs(pickled_actions)  # checks them: a bad action sends nothing
        if self._n_obs_buffers > 1:
            self._next_obs_buffer()
        self._step_refs = {}
        for node in self.nodes:
            rows = self.actions.take(slice(node.start, node.stop))
            part = None
            if pickled_actions:
                part = {
                    path: tuple(pickled_actions[path][node.start : node.stop]) for path in self.pickled.action_paths
                }
            self._step_refs[node.index] = node.actor.step.remote(rows, part)
        self.pending = "step"

    def step_wait(self, timeout: float | None = None) -> list[StepInfo]:
        """Wait for every node's step and write its rows; return the records, in env order."""
        self.take_pending("step")
        waiting = time.perf_counter()
        answers = self.collect_answers(self._step_refs, timeout, restart=True)
        slowest = max((getattr(answer, "busy", 0.0) for answer in answers.values()), default=0.0)
        self.clock.waited(waiting, time.perf_counter(), slowest)  # the slowest node's step, the rest the network
        records: list[StepInfo] = []
        for node in self.nodes:
            records += self.write_rows(node, answers[node.index])
        return records

    def reset(self, kwargs: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """``env_i.reset(**kwargs[i])`` for each named env; returns their infos."""
        self._turn_for_reset(kwargs)
        self.requests.send(Reset(kwargs))
        return self.requests.wait()

    def run(self, ops: dict[int, Callable[[gym.Env], Any]]) -> dict[int, Any]:
        """Apply ``ops[i](env_i)`` on the nodes; return ``{i: result}``."""
        self.requests.send(RunOps(ops))
        return self.requests.wait()

    def write_rows(self, node: Node, rows: Rows) -> list[StepInfo]:
        """Copy a node's answer into the driver's arrays; return its records."""
        where = slice(node.start, node.stop) if rows.ids is None else rows.ids
        for path, values in rows.obs.items():
            self.obs_leaves[path][where] = values
        if rows.rewards is not None:
            self.rewards[where], self.terminated[where], self.truncated[where] = (
                rows.rewards,
                rows.terminated,
                rows.truncated,
            )
        ids = range(node.start, node.stop) if rows.ids is None else rows.ids.tolist()
        for path, values in (rows.pickled_obs or {}).items():
            column = self.pickled.obs[path]
            for i, value in zip(ids, values):
                column[i] = value
        return rows.records

    # -- waiting -------------------------------------------------------------------------

    def node_of(self, i: int) -> Node:
        for node in self.nodes:
            if node.start <= i < node.stop:
                return node
        raise IndexError(f"env index {i} out of range for {self.num_envs} envs")

    def limit(self, timeout: float | None) -> float | None:
        """How long the driver waits for a node: the timeout, plus time for the node to report its own."""
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else timeout + NODE_GRACE

    def collect_answers(self, refs: dict[int, Any], timeout: float | None, restart: bool = False) -> dict[int, Any]:
        """Each node's answer to its call in ``refs``; raise the first node's error once all answered.

        ``restart`` (steps): a node actor that died is restarted while the budget lasts,
        its answer then being its envs' truncation.
        """
        limit = self.limit(timeout)
        pending = list(refs.values())
        if not pending:
            return {}
        _, late = ray.wait(pending, num_returns=len(pending), timeout=limit)
        if late:
            self.time_out(
                [i for n, ref in refs.items() if ref in late for i in range(self.nodes[n].start, self.nodes[n].stop)],
                limit,
            )
        answers, error = {}, None
        for n, ref in refs.items():
            answer = answer_of(ref)
            if isinstance(answer, Lost):
                if not restart:
                    self._node_died(self.nodes[n], answer.error)
                answer = self.restart_node(self.nodes[n], answer.error)
            if isinstance(answer, ErrorReport):
                error = error or answer
            answers[n] = answer
        if error is not None:
            self.raise_report(error)
        return answers

    def raise_report(self, report: ErrorReport) -> NoReturn:
        """Re-raise a node's exception here, saying where; a node pool that broke breaks this pool too."""
        node = self.nodes[report.worker]
        exc = rebuilt(report, node.name if report.env_index is None else f"env {report.env_index} on {node.name}")
        exc.node = node.name  # type: ignore[attr-defined]
        if isinstance(exc, (WorkerDiedError, StepTimeoutError)):
            self._broken = f"{node.name}: {report.message}"
        raise exc

    def time_out(self, silent: list[int], limit: float | None) -> NoReturn:
        """Envs ``silent`` did not answer within ``limit``: their node actors are stuck, break the pool."""
        self._res.graceful, self._res.stuck = False, True
        self._break(not_answered(silent, f"{limit}s", "an env step hangs, or a node is stuck?"), StepTimeoutError)

    # -- failures --------------------------------------------------------------------------

    def _node_died(self, node: Node, death: BaseException, why: str = "") -> NoReturn:
        sweep(node)
        text = str(death).strip()
        cause = text.splitlines()[0] if text else type(death).__name__
        try:
            self._break(f"the Ray actor of {node.name} {failed(death)} ({cause}){why}")
        except WorkerDiedError as exc:
            if "\n" in text:  # Ray's account (e.g. why the actor could not be created): shown above ours
                exc.__cause__ = RemoteTraceback(text)
            raise

    def restart_limit(self) -> float:
        """How long the driver waits for Ray to re-create a node actor: its pool builds its envs
        again (as long as at the start, never less than the timeout), then the node's grace."""
        return max(self.timeout or 0.0, START_TIMEOUT) + NODE_GRACE

    def restart_node(self, node: Node, death: BaseException) -> Rows:
        """Ray re-creates a failed node actor (``max_restarts``): reset its envs, report them truncated."""
        limit = self.options.max_restarts
        if self.options.on_worker_failure != "restart":
            self._node_died(node, death)
        if self.restarts >= limit:
            self._node_died(node, death, f"; no restart left (max_restarts={limit} used up)" if limit else "")
        self.restarts += 1
        warnings.warn(
            f"shmvec: the Ray actor of {node.name} {failed(death)}; "
            f"Ray restarts it (restart {self.restarts} of max_restarts={limit})",
            RuntimeWarning,
            stacklevel=4,
        )
        info, rows = self._reborn(node)
        if info.pid != node.info.pid:  # an actor that was only unavailable for a moment keeps its pool
            sweep(node)
        node.info = info  # a new process, maybe on another node
        ids = np.arange(node.start, node.stop)
        same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        records = [StepInfo(i, rows.replies[i] if same_step else {}, restarted=True) for i in ids.tolist()]
        return rows._replace(
            ids=ids,
            rewards=np.zeros(len(ids)),
            terminated=np.zeros(len(ids), dtype=bool),
            truncated=np.ones(len(ids), dtype=bool),
            records=records,
        )

    def _reborn(self, node: Node) -> tuple[NodeInfo, Rows]:
        """Wait for ``node``'s actor to answer again, then reset its envs; its description and their rows.

        While Ray re-creates the actor it fails calls as unavailable: ask again until the
        restart limit. ``describe`` asks, as it changes nothing if it ran unseen.
        """
        limit = self.restart_limit()
        deadline = time.monotonic() + limit
        info = self._answer_in_time(node, node.actor.describe.remote(), deadline, limit)
        while isinstance(info, Lost) and info.restarting and time.monotonic() + RESTART_POLL < deadline:
            time.sleep(RESTART_POLL)
            info = self._answer_in_time(node, node.actor.describe.remote(), deadline, limit)
        rows = info
        if isinstance(info, NodeInfo):
            rows = self._answer_in_time(node, node.actor.reset_all.remote(), deadline, limit)
        if isinstance(rows, Lost):
            within = f" within {limit}s" if rows.restarting else ""
            self._node_died(node, rows.error, f"; Ray could not restart it{within}")
        if isinstance(rows, ErrorReport):
            self.raise_report(rows)
        return info, rows

    def _answer_in_time(self, node: Node, ref: Any, deadline: float, limit: float) -> Any:
        """:func:`answer_of` ``ref`` by ``deadline``; past it, the node counts as dead."""
        try:
            return answer_of(ref, timeout=max(0.0, deadline - time.monotonic()))
        except GetTimeoutError as late:
            self._node_died(node, late, f"; Ray did not restart it within {limit}s")

    # -- the end -----------------------------------------------------------------------------

    def close(self, terminate: bool = False) -> None:
        """Have every node close its pool (workers, shared memory), then end the actors. Safe to call twice."""
        if terminate or self._broken is not None:
            self._res.graceful = False
        self.closed = True
        self._res.shutdown()
        self._finalizer.detach()
        atexit.unregister(self._finalizer)

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
