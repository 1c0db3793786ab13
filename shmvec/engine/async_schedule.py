"""Async batches, main side: EnvPool-style ``send``/``recv`` over the pool's workers.

Every env is in one of three states: *held* (the caller has its latest result and owes
it an action), *in flight* (sent, being stepped) or *queued* (finished, waiting in the
FIFO for a ``recv``). ``send`` puts env ids in their workers' inboxes; each worker steps
them one by one and publishes each in its outbox with a timestamp, by a post on its
``finished`` signal. ``recv`` moves what the outboxes published into the FIFO, oldest
first across workers, and returns the first M: no env starves, and batches need not align
with shards. Envs of the main shard are stepped at ``send`` and queued at once. See
:mod:`shmvec.engine.pool` for the data flow and :mod:`shmvec.ipc.protocol` for what publishes what.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec.engine.env_states import HELD, IN_FLIGHT, QUEUED, EnvStates, check_available, check_held
from shmvec.engine.failures import main_shard_error, not_answered, remote_error
from shmvec.engine.link import LIVENESS_INTERVAL, WorkerLink
from shmvec.engine.restart import RestartNeeded
from shmvec.engine.shard import EnvFailed, with_shm_finals
from shmvec.errors import StepTimeoutError
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import ErrorReport, Reset, StepInfo

if TYPE_CHECKING:
    from shmvec.engine.pool import ShmPool

__all__ = ["HELD", "IN_FLIGHT", "QUEUED", "AsyncSchedule", "check_available", "check_held"]


class AsyncSchedule(EnvStates):
    """The send/recv state of one pool (the envs' states: :class:`~shmvec.engine.env_states.EnvStates`)."""

    def __init__(self, pool: ShmPool):
        super().__init__(pool.num_envs)
        self.pool = weakref.proxy(pool)  # no reference cycle: an unclosed pool is still collected at once
        views = pool.views
        self.inbox, self.outbox = views[lay.INBOX], views[lay.OUTBOX]
        self.ready_ns, self.env_status = views[lay.READY_NS], views[lay.ENV_STATUS]
        self._resetting: list[int] = []  # envs of an async reset not collected yet

    def queue_all(self, env_ids: list[int]) -> None:
        """After an async reset: these envs' results are in their rows, ready to be received.

        They are queued round-robin across shards (the first env of each shard, then the
        second, ...), so that every batch takes envs from every worker: each worker then
        steps its part of one batch while the caller works on another (Sample Factory's
        double buffering). Queued shard by shard, the first batch would be worker 0's
        envs only, and a worker would wait for the caller exactly as in a synchronous step.
        """
        pool = self.pool
        position = {i: (i - pool.shards[pool.shard_of(i)][0], pool.shard_of(i)) for i in env_ids}
        self._queue(sorted(env_ids, key=position.__getitem__))

    # -- reset -----------------------------------------------------------------------

    def reset(self, kwargs: dict[int, dict[str, Any]]) -> None:
        """Start ``env_i.reset(**kwargs[i])``; the envs come back through :meth:`recv`.

        The envs must be held by the caller; others may have sends in flight meanwhile.
        """
        ids = np.array(sorted(kwargs), dtype=np.int64)
        self.check_can_send(ids)
        self._finish_reset()  # one async reset at a time
        self.pool.requests.send(Reset(kwargs), beside_sends=True)
        self.state[ids] = IN_FLIGHT
        self._resetting = ids.tolist()

    def _finish_reset(self, timeout: float | None = None) -> None:
        if self._resetting:
            ids, self._resetting = self._resetting, []
            infos = self.pool.requests.wait(timeout)
            self.records.update((i, StepInfo(i, infos[i])) for i in ids)
            self.queue_all(ids)

    # -- send ----------------------------------------------------------------------

    def send(self, env_ids: np.ndarray) -> None:
        """Step ``env_ids`` (their actions are in the action rows); :meth:`recv` returns them."""
        pool = self.pool
        pool.ensure_can_send(resetting=bool(self._resetting))
        self.check_can_send(env_ids)
        self._finish_reset()
        pool.settle()
        self.state[env_ids] = IN_FLIGHT
        by_worker: dict[int, list[int]] = {}
        for i in self._unsent_restarted(env_ids.tolist()):  # those whose worker was re-created are reported now
            by_worker.setdefault(pool.shard_of(i), []).append(i)
        main_ids = by_worker.pop(pool.n_workers, [])
        if pool.short_spin is not None:
            pool.short_spin.step()
        for k, ids in by_worker.items():
            pool.links[k].put(ids, self.inbox)
        if main_ids:
            self._step_main(main_ids)

    def _step_main(self, ids: list[int]) -> None:
        main = self.pool.main
        for i in ids:
            try:
                record = main.step_env(i - main.start, main.read_action(i))
            except EnvFailed as failure:
                self.state[i] = HELD
                raise main_shard_error(failure) from None
            if main.pickled_out:  # observation leaves with no fixed size go with the record, as a worker's do
                record = (record or StepInfo(i, {}))._replace(pickled_obs=main.pickled_out.pop(i))
            if record is not None:
                self.records[i] = record
            self.state[i] = QUEUED
            self.fifo.append(i)

    # -- recv ----------------------------------------------------------------------

    def recv(self, batch_size: int, timeout: float | None = None) -> tuple[np.ndarray, dict[int, StepInfo]]:
        """The first ``batch_size`` envs to finish, and the records of those that sent one."""
        pool = self.pool
        pool.check_usable()
        self._finish_reset(timeout)
        check_available(self.state, batch_size)
        deadline = pool.deadline(timeout)
        ready = pool._res.ready
        self._check_alive(None, None)  # else a dead worker's envs could vanish while others keep the batches full
        while True:
            ready.drain()  # the posts of what this scan takes; later ones wake the wait below
            self._scan()
            if len(self.fifo) >= batch_size:
                break
            if not ready.wait(LIVENESS_INTERVAL):
                self._check_alive(deadline, timeout)
        ids = self._dequeue(batch_size)
        env_ids = np.array(ids, dtype=np.int64)
        records = [self.records.pop(i) for i in ids if i in self.records]
        if pool._final_flag is not None:
            ended = env_ids[pool._final_flag[env_ids] & (pool.terminated[env_ids] | pool.truncated[env_ids])]
            records = with_shm_finals(records, pool._final_obs, np.sort(ended))
        return env_ids, {record.env_index: record for record in pool.pickled.keep_obs(records)}

    def _scan(self) -> None:
        """Queue what the outboxes published since the last scan, oldest first; raise an env's error.

        A worker's outbox slot, and the rows of its env, are read only after taking the post
        on ``finished`` that published them: one slot per post.
        """
        finished: list[tuple[int, int]] = []
        error = None
        for link in self.pool.links:
            size = link.stop - link.start
            for _ in range(link.finished.drain()):
                i = int(self.outbox[link.start + link.taken % size])
                link.taken += 1
                if self.env_status[i] != 0:  # its record or error follows on the pipe
                    message = self.pool.message_from(link, send_reply=True).payload
                    if isinstance(message, ErrorReport):
                        self.state[i] = HELD  # no result: the caller may send to it again
                        error = error or message
                        continue
                    self.records[i] = message[0]
                finished.append((int(self.ready_ns[i]), i))
        finished.sort()
        for _, i in finished:
            self.state[i] = QUEUED
            self.fifo.append(i)
        if error is not None:
            raise remote_error(error)

    def _check_alive(self, deadline: float | None, timeout: float | None) -> None:
        """While waiting: a dead worker with envs in flight raises or restarts; then the deadline."""
        pool = self.pool
        for link in pool.links:
            if link.death() is None:
                continue
            try:
                pool.check_alive(link)
            except RestartNeeded:
                self._restart(link)
        if deadline is not None and time.monotonic() > deadline:
            silent = np.flatnonzero(self.state == IN_FLIGHT).tolist()
            pool._res.graceful = False  # they are stuck: closing will terminate them
            limit = pool.timeout if timeout is None else timeout
            pool._break(not_answered(silent, f"timeout={limit}s"), StepTimeoutError)

    def _restart(self, link: WorkerLink) -> None:
        """Re-create ``link``'s worker: its in-flight and queued envs report a truncation now,
        held ones at their next send."""
        self._scan()  # what it finished before dying stands
        reset_infos = self.pool.restarter.restart(link)
        lost = self._lose(range(link.start, link.stop))
        # The reset info goes with the observation only when that obs starts the next episode (SAME_STEP).
        self._queue_restarted(lost, reset_infos if self.pool.autoreset_mode == AutoresetMode.SAME_STEP else {})
