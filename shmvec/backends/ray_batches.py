"""Async batches over Ray nodes, driver side: ``send`` makes one call per node that holds some of
the envs, and ``recv`` takes a node's envs when its call answers (``ray.wait``, first come first
served), so a batch never waits for a slower node, but one node's envs come back together.
The envs' states (held, in flight, queued) are :class:`~shmvec.engine.env_states.EnvStates`'.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import numpy as np

try:
    import ray
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('backend="ray" needs Ray: pip install "ray>=2.60,<2.61" (shmvec\'s [ray] extra)') from exc

from shmvec.backends.ray_cluster import Driver, Lost, Node, answer_of
from shmvec.engine.env_states import HELD, IN_FLIGHT, EnvStates, check_available
from shmvec.ipc.protocol import ErrorReport, StepInfo


class RayBatches(EnvStates):
    """Async batches over nodes: a node's envs come back when its actor answers (see the module docstring)."""

    def __init__(self, pool: Driver):
        super().__init__(pool.num_envs)
        self.pool = weakref.proxy(pool)
        self.calls: dict[Any, tuple[Node, list[int]]] = {}  # in flight: ref -> (node, env ids)

    def reset(self, kwargs: dict[int, dict[str, Any]]) -> None:
        """Start ``env_i.reset(**kwargs[i])``; the envs come back through :meth:`recv`."""
        self.pool.ensure_can_step(beside_sends=True)
        self.check_can_send(np.array(sorted(kwargs), dtype=np.int64))
        for node, ids in self._by_node(sorted(kwargs)):
            ref = node.actor.reset_some.remote({i - node.start: kwargs[i] for i in ids})
            self._launch(ref, node, ids)

    def send(self, env_ids: np.ndarray) -> None:
        """Step ``env_ids`` (their actions are in the action rows): one call per node."""
        pool = self.pool
        pool.ensure_can_send()
        self.check_can_send(env_ids)
        ids = self._unsent_restarted(env_ids.tolist())  # those whose node was re-created are reported now
        for node, part in self._by_node(ids):
            rows = np.array(part, dtype=np.int64)
            actions = pool.actions.take(rows)
            self._launch(node.actor.send.remote(rows - node.start, actions), node, part)

    def recv(self, batch_size: int, timeout: float | None = None) -> tuple[np.ndarray, dict[int, StepInfo]]:
        """The first ``batch_size`` envs to come back (a node's envs come together), and their records."""
        pool = self.pool
        pool.check_usable()
        check_available(self.state, batch_size)
        if self.calls:  # take every answer there is, failed calls too: a dead node must not go unnoticed
            done, _ = ray.wait(list(self.calls), num_returns=len(self.calls), timeout=0, fetch_local=False)
            for ref in done:
                self._take(ref)
        limit = pool.limit(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        while len(self.fifo) < batch_size:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(self.calls), num_returns=1, timeout=left, fetch_local=False)
            if not ready:
                pool.time_out(sorted(i for _, ids in self.calls.values() for i in ids), limit)
            self._take(ready[0])
        ids = self._dequeue(batch_size)
        return np.array(ids, dtype=np.int64), {i: self.records.pop(i) for i in ids if i in self.records}

    def _by_node(self, ids: list[int]) -> list[tuple[Node, list[int]]]:
        parts: dict[int, list[int]] = {}
        for i in ids:
            parts.setdefault(self.pool.node_of(i).index, []).append(i)
        return [(self.pool.nodes[n], part) for n, part in parts.items()]

    def _launch(self, ref: Any, node: Node, ids: list[int]) -> None:
        self.calls[ref] = (node, ids)
        self.state[ids] = IN_FLIGHT

    def _take(self, ref: Any) -> None:
        """One node's answer: queue its envs, or raise its error, or restart it."""
        node, ids = self.calls.pop(ref)
        rows = answer_of(ref)
        if isinstance(rows, Lost):
            self._restart(node, rows.error)
            return
        if isinstance(rows, ErrorReport):
            self.state[ids] = HELD  # no result: the caller may send to them again
            self.pool.raise_report(rows)
        for record in self.pool.write_rows(node, rows):
            self.records[record.env_index] = record
        self._queue(rows.ids.tolist())

    def _restart(self, node: Node, death: BaseException) -> None:
        """Ray re-created ``node``'s actor: in-flight and queued envs report a truncation now,
        held ones at their next send."""
        pool = self.pool
        rows = pool.restart_node(node, death)
        for ref in [ref for ref, (other, _) in self.calls.items() if other is node]:
            del self.calls[ref]  # sent to the dead actor: they fail, and their envs are reported below
        pool.write_rows(node, rows._replace(rewards=None, records=[]))
        lost = self._lose(range(node.start, node.stop))
        self._queue_restarted(lost, {record.env_index: record.info for record in rows.records})
