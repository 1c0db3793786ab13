"""Rare calls over Ray nodes, driver side: a reset or operations on envs, one call per node that holds some."""

from __future__ import annotations

import weakref
from typing import Any

from shmvec.backends.ray_cluster import Driver
from shmvec.ipc.protocol import Reset, RunOps


class RayRequests:
    """The one rare call a Ray pool may have pending: ``send``/``wait``, as
    :class:`~shmvec.engine.rare_calls.Requests`."""

    def __init__(self, pool: Driver):
        self.pool = weakref.proxy(pool)
        self._refs: dict[int, Any] = {}

    def send(self, request: Reset | RunOps, beside_sends: bool = False) -> None:
        pool = self.pool
        pool.ensure_can_step(beside_sends)
        by_env = request.kwargs if isinstance(request, Reset) else request.ops
        parts: dict[int, dict[int, Any]] = {}
        for i, value in by_env.items():
            node = pool.node_of(i)
            parts.setdefault(node.index, {})[i - node.start] = value
        self._refs = {n: pool.nodes[n].actor.request.remote(type(request)(part)) for n, part in parts.items()}
        pool.pending = "request"

    def wait(self, timeout: float | None = None) -> dict[int, Any]:
        pool = self.pool
        pool.take_pending("request")
        merged: dict[int, Any] = {}
        for n, rows in pool.collect_answers(self._refs, timeout).items():
            pool.write_rows(pool.nodes[n], rows)
            merged.update(rows.replies)
        return merged
