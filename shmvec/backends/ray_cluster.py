"""The Ray backend's node bookkeeping, driver side: each node's actor and envs, the resources a
pool holds on the cluster, how a node actor's answer is read, finding the cluster and its nodes, and
what the driver's rare calls and async batches need of their pool (:class:`Driver`).

:class:`Node` is one node as the driver sees it; :class:`NodeResources` holds the actors
and the placement group (released by ``close`` or a finalizer). Every answer of a node
actor passes through :func:`answer_of`, which turns Ray's actor errors into :class:`Lost`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, NamedTuple, NoReturn, Protocol

import numpy as np

try:
    import ray
    from ray.exceptions import ActorUnavailableError, ActorUnschedulableError, GetTimeoutError, RayActorError
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('backend="ray" needs Ray: pip install "ray>=2.60,<2.61" (shmvec\'s [ray] extra)') from exc

from shmvec.backends.ray_node import NodeInfo, Reborn, Rows, unlink_leftovers
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.protocol import ErrorReport, StepInfo

CLOSE_TIMEOUT = 10.0  # seconds close() gives the node actors to close their pools before killing them
SWEEP_TIMEOUT = 10.0  # seconds for the clean-up task after a node actor died


@dataclasses.dataclass
class Node:
    """One node as the driver sees it: its actor and its envs."""

    index: int
    start: int
    stop: int
    actor: Any = dataclasses.field(repr=False)
    info: NodeInfo | None = dataclasses.field(default=None, repr=False)

    @property
    def name(self) -> str:
        if self.info is None:
            return f"node {self.index} (envs {self.start}..{self.stop - 1})"
        return (
            f"node {self.index} ({self.info.ip}, node id {self.info.node_id[:8]}, envs {self.start}..{self.stop - 1})"
        )


class Driver(Protocol):
    """What the driver's rare calls and async batches need of their pool (a :class:`~shmvec.backends.ray.RayPool`)."""

    num_envs: int
    nodes: list[Node]
    pending: str | None
    actions: ActionRows
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_flag: np.ndarray | None

    def check_usable(self) -> None: ...
    def ensure_can_step(self, beside_sends: bool = False) -> None: ...
    def ensure_can_send(self, resetting: bool = False) -> None: ...
    def take_pending(self, kind: str) -> None: ...
    def node_of(self, i: int) -> Node: ...
    def limit(self, timeout: float | None) -> float | None: ...
    def time_out(self, silent: list[int], limit: float | None) -> NoReturn: ...
    def write_rows(self, node: Node, rows: Rows) -> list[StepInfo]: ...
    def restart_node(self, node: Node, death: BaseException) -> Rows: ...
    def collect_answers(self, refs: dict[int, Any], timeout: float | None, restart: bool = False) -> dict[int, Any]: ...
    def raise_report(self, report: ErrorReport) -> NoReturn: ...


class NodeResources:
    """The actors and placement group of one pool, so that a finalizer can release them without the pool."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.group: Any = None
        self.graceful = True  # False: the node pools terminate their workers instead of closing the envs
        self.stuck = False  # a node actor did not answer in time: its close() call would wait behind it

    def shutdown(self) -> None:
        """Have every actor close its pool (bounded wait), then kill the actors. Idempotent."""
        nodes, self.nodes = self.nodes, []
        if not ray.is_initialized():
            return  # the driver left Ray: its actors went with it
        if nodes:
            closing = [node.actor.close.remote(not self.graceful) for node in nodes]
            ray.wait(closing, num_returns=len(closing), timeout=1.0 if self.stuck else CLOSE_TIMEOUT)
        for node in nodes:
            ray.kill(node.actor)  # its pool is closed: the process has nothing left to release
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None


def finalize_unclosed(res: NodeResources) -> None:
    if res.nodes:
        warnings.warn(
            "a shmvec vector env was not closed; call close() or use it as a context manager",
            ResourceWarning,
            stacklevel=2,
        )
    res.shutdown()


class Lost(NamedTuple):
    """No answer to a call: its node actor failed; ``error`` is Ray's account of how."""

    error: BaseException

    @property
    def restarting(self) -> bool:
        """Ray is re-creating the actor (it failed the call as unavailable): it will answer again."""
        return isinstance(self.error, ActorUnavailableError)


def answer_of(ref: Any, timeout: float | None = None) -> Any:
    """A node actor's answer to the call ``ref``, or :class:`Lost` if the actor failed or was re-created.

    Raises:
        GetTimeoutError: no answer within ``timeout`` seconds.
    """
    try:
        answer = ray.get(ref, timeout=timeout)
    except (RayActorError, ActorUnschedulableError) as failure:  # dead, unavailable, or its node gone
        return Lost(failure)
    if isinstance(answer, Reborn):
        return Lost(RayActorError(error_msg="Ray re-created the actor; the call did not run"))
    return answer


def failed(error: BaseException) -> str:
    """How a node actor failed, for messages: Ray tells a dead actor from one it is re-creating."""
    if isinstance(error, ActorUnavailableError):
        return "is unavailable"
    return "did not answer" if isinstance(error, GetTimeoutError) else "died"


def sweep(node: Node) -> None:
    """A node actor was killed (OOM, ray.kill): Ray kills its children too, resource tracker included,
    so its shared memory stays. Remove it with a small task on that node; best effort (the node may be gone)."""
    if node.info is None:
        return
    task = ray.remote(num_cpus=0, max_retries=0)(unlink_leftovers).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.info.node_id, soft=False)
    )
    try:
        ray.get(task.remote(node.info.pid), timeout=SWEEP_TIMEOUT)
    except Exception:
        pass  # a lost node took its /dev/shm with it


def connect() -> None:
    """Join the Ray cluster the user started (``ray.init``), else the one ``ray start`` runs here."""
    if ray.is_initialized():
        return
    try:
        ray.init(address="auto")
    except ConnectionError as exc:
        raise ConnectionError(
            'backend="ray" found no Ray cluster: call ray.init(...) before creating the vector env, '
            'or start one with `ray start --head` (see the README, "More than one machine")'
        ) from exc


def node_count(n_nodes: int | None, cpus: int, num_envs: int) -> int:
    """How many node actors: ``n_nodes`` (checked against the cluster), or every alive node with ``cpus`` CPUs."""
    fit = [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= cpus]
    found = n_nodes if n_nodes is not None else len(fit)
    if not fit or found > len(fit):
        raise ValueError(
            f"n_nodes={n_nodes} needs {found or 1} alive Ray nodes with >= {cpus} CPU(s) (n_workers per node), "
            f"but the cluster has {len(fit)}; add nodes (`ray start --address=...`) or pass a smaller n_nodes"
        )
    if found > num_envs:
        raise ValueError(
            f"{found} nodes for {num_envs} envs: every node needs at least one env; pass n_nodes <= {num_envs}"
        )
    return found
