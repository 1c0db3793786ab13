"""Rare calls, main side: a reset or operations on envs, sent to the workers that hold them.

Each worker gets its own envs' part of the request on its pipe after a MESSAGE command;
the main shard's part runs in :meth:`Requests.wait`, while the workers run theirs. See
:mod:`shmvec.engine.pool` for the data flow.

Algorithms make such calls on their hot path (HER's ``compute_reward`` for every sampled
batch, MaskablePPO's ``action_masks`` every step), so one costs a step's hand-off plus its
pickling: only the workers of the envs it names hear of it; it is pickled by pickle, with
cloudpickle only where needed (:func:`~shmvec.ipc.wire.to_worker`); the main process
spins for the replies (:meth:`Requests.reply_spin`); and a worker then waits for its next
command as it did after the step before (:func:`shmvec.engine.worker._serve`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from shmvec.engine.failures import main_shard_error
from shmvec.engine.link import WorkerLink
from shmvec.engine.restart import Restart
from shmvec.engine.shard import EnvFailed, Shard
from shmvec.errors import ShmVecError
from shmvec.ipc.interrupts import env_code, holding
from shmvec.ipc.pickled import PickledLeaves
from shmvec.ipc.protocol import Reset, RunOps
from shmvec.ipc.wire import to_worker
from shmvec.planning.plan import usable_cores


class RequestsHost(Protocol):
    """What :class:`Requests` needs of its pool (a weak proxy: no reference cycle): its one
    pending call, and its waits on the workers."""

    pending: str | None
    options: Any  # PoolOptions: max_spin

    def ensure_can_step(self, beside_sends: bool = False) -> None: ...
    def take_pending(self, kind: str) -> None: ...
    def settle(self) -> None: ...
    def collect(self, links: Sequence[WorkerLink], timeout: float | None = None, **kwargs: Any) -> list[Any]: ...
    def blame_dead(self, link: WorkerLink) -> Restart | None: ...
    def break_for(self, reason: str) -> NoReturn: ...
    def break_on_interrupt(self, what: str) -> None: ...
    def write_request(self, link: WorkerLink, blob: bytes) -> None: ...


class Requests:
    """The one rare call a pool may have pending.

    ``links``: the workers, by index; the envs past theirs are the main shard's (``main``).
    ``shard_of(i)``: the index of the shard that runs env ``i`` (``len(links)``: the main shard).
    """

    def __init__(
        self,
        pool: RequestsHost,
        links: list[WorkerLink],
        shard_of: Callable[[int], int],
        num_envs: int,
        main: Shard | None,
        pickled: PickledLeaves,
    ):
        self.pool, self.links, self.shard_of, self.num_envs = pool, links, shard_of, num_envs
        self.main, self.pickled = main, pickled
        self.cores = usable_cores() if links else 0
        self._spin = 0.0  # how long the wait for the pending request's replies spins
        self._links: list[WorkerLink] = []  # the workers the pending request went to
        self._main_part: Reset | RunOps | None = None

    @holding  # Ctrl-C waits until the posts and counts agree (see ipc.interrupts)
    def send(self, request: Reset | RunOps, beside_sends: bool = False) -> None:
        """Send a rare request (keyed by env index) to the workers of the envs it names.

        The main shard's part runs in :meth:`wait`, while the workers run theirs.
        ``beside_sends``: async sends may be in flight (to other envs).

        Raises:
            AlreadyPendingError: a step, send or another request is pending.
        """
        pool = self.pool
        pool.ensure_can_step(beside_sends)
        by_env = request.kwargs if isinstance(request, Reset) else request.ops
        parts = {k: type(request)(part) for k, part in self._split(by_env).items()}
        self._main_part = parts.pop(len(self.links), None)
        # Pickled before any worker is woken: an unpicklable argument leaves no worker waiting.
        blobs = {k: to_worker(part) for k, part in parts.items()}
        pool.settle()
        self._links = [self.links[k] for k in blobs]
        self._spin = self.reply_spin(len(self._links), beside_sends)
        pool.pending = "request"
        for link in self._links:
            try:  # a large request is written while the worker's replies to async sends are read
                link.send(blobs[link.index], functools.partial(pool.write_request, link))
            except ShmVecError:  # the write's own verdict (StepTimeoutError is an OSError too)
                raise
            except (EOFError, OSError) as exc:
                restart = pool.blame_dead(link)  # a dead worker's pipe: say which worker died, and how
                if restart is not None:  # restarts happen in steps only
                    pool.break_for(restart.death)
                raise exc

    @holding
    def wait(self, timeout: float | None = None, resumable: bool = True) -> dict[int, Any]:
        """The merged ``{env index: result}`` of the pending request (a reset replies infos).

        ``resumable``: whether a Ctrl-C may stop the wait, leaving the pool to absorb the
        replies later; else it breaks the pool (an async reset: its envs would never come back).

        Raises:
            NoPendingCallError: no request is pending.
        """
        self.pool.take_pending("request")
        merged: dict[int, Any] = {}
        main_failure = None
        if self._main_part is not None:
            part, self._main_part = self._main_part, None
            try:  # a Ctrl-C raises in the main shard's envs; the workers' replies stay owed (settle absorbs them)
                merged.update(env_code(self.main.handle, part))
            except EnvFailed as failure:
                main_failure = failure
            except KeyboardInterrupt:
                if not resumable:  # an async reset: its envs would never come back
                    self.pool.break_on_interrupt("an async reset of envs of the main process")
                raise
        for reply in self.pool.collect(self._links, timeout, resumable=resumable, spin=self._spin):
            merged.update(reply)
        if main_failure is not None:
            raise main_shard_error(main_failure)
        return self.pickled.keep_reset_obs(merged)

    @holding  # one call: a Ctrl-C between the two would leave the request pending for good
    def call(self, request: Reset | RunOps) -> dict[int, Any]:
        """:meth:`send` ``request``, then :meth:`wait` for its replies."""
        self.send(request)
        return self.wait()

    def reply_spin(self, n_workers: int, beside_sends: bool) -> float:
        """How long a wait for the replies of ``n_workers`` workers spins before it blocks.

        As long as a wait for a step's (the plan's ``main_spin``, the links' ``done``), whatever the
        step's waits learned: a reply comes soon. Where the plan blocks as the workers outnumber the
        cores, still ``max_spin`` while those asked and this process each have a core: the others idle,
        unless async sends are in flight.
        """
        spin = self.links[0].done.max_spin if self.links else 0.0
        if spin == 0.0 and not beside_sends and n_workers < self.cores:
            spin = self.pool.options.max_spin
        return spin

    def _split(self, by_env: dict[int, Any]) -> dict[int, dict[int, Any]]:
        parts: dict[int, dict[int, Any]] = {}
        for i, value in by_env.items():
            if not 0 <= i < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
            parts.setdefault(self.shard_of(i), {})[i] = value
        return parts
