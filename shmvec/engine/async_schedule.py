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
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import numpy as np

from shmvec.engine.env_states import HELD, IN_FLIGHT, QUEUED, EnvStates, check_available, check_held
from shmvec.engine.failures import main_shard_error, remote_error
from shmvec.engine.link import LIVENESS_INTERVAL, WorkerLink
from shmvec.engine.rare_calls import Requests
from shmvec.engine.restart import Restart, Restarter
from shmvec.engine.shard import EnvFailed, Shard, with_shm_finals
from shmvec.ipc import layout as lay
from shmvec.ipc.interrupts import holding, let_through, raise_held
from shmvec.ipc.pickled import PickledLeaves
from shmvec.ipc.protocol import ErrorReport, Reset, StepInfo
from shmvec.ipc.signals import Signal
from shmvec.processes.caller_threads import CallerThreads

__all__ = ["HELD", "IN_FLIGHT", "QUEUED", "AsyncSchedule", "check_available", "check_held"]


class ScheduleHost(Protocol):
    """What :class:`AsyncSchedule` needs of its pool (a weak proxy: no reference cycle): its
    call state and its waits on the workers."""

    def check_usable(self) -> None: ...
    def ensure_can_send(self, resetting: bool = False) -> None: ...
    def settle(self) -> None: ...
    def deadline(self, timeout: float | None) -> float | None: ...
    def message_from(self, link: WorkerLink, timeout: float | None = None, send_reply: bool = False) -> Any: ...
    def check_alive(self, link: WorkerLink) -> Restart | None: ...
    def time_out(self, silent: list[int], timeout: float | None) -> NoReturn: ...
    def break_on_interrupt(self, what: str) -> None: ...


class AsyncSchedule(EnvStates):
    """The send/recv state of one pool (the envs' states: :class:`~shmvec.engine.env_states.EnvStates`).

    ``links`` are the workers, by index; ``shards[k]`` the envs of shard k (the main shard's
    last: ``main``), and ``shard_of(i)`` the shard of env ``i``. ``ready`` is posted by every
    worker per finished env; ``restarter`` is None unless workers are restarted.
    """

    def __init__(
        self,
        pool: ScheduleHost,
        requests: Requests,
        links: list[WorkerLink],
        shards: list[tuple[int, int]],
        shard_of: Callable[[int], int],
        views: dict[str, np.ndarray],
        ready: Signal,
        main: Shard | None,
        pickled: PickledLeaves,
        caller: CallerThreads,
        restarter: Restarter | None,
    ):
        super().__init__(shards[-1][1])
        self.pool, self.requests, self.restarter = pool, requests, restarter
        self.links, self.shards, self.shard_of, self.main = links, shards, shard_of, main
        self.ready, self.pickled, self.caller = ready, pickled, caller
        self.inbox, self.outbox = views[lay.INBOX], views[lay.OUTBOX]
        self.ready_ns, self.env_status = views[lay.READY_NS], views[lay.ENV_STATUS]
        self.rewards, self.terminated, self.truncated = views["reward"], views["terminated"], views["truncated"]
        self.final_obs, self.final_flag = views.get(lay.FINAL_OBS), views.get(lay.FINAL_FLAG)
        self.ctrl = views["ctrl"]
        self.env_shard = np.repeat(np.arange(len(shards)), [stop - start for start, stop in shards])  # env -> shard
        self._liveness_at = 0.0  # when recv last checked that every worker lives
        self._resetting: list[int] = []  # envs of an async reset not collected yet

    def queue_all(self, env_ids: list[int]) -> None:
        """After an async reset: these envs' results are in their rows, ready to be received.

        They are queued round-robin across shards (the first env of each shard, then the
        second, ...), so that every batch takes envs from every worker: each worker then
        steps its part of one batch while the caller works on another (Sample Factory's
        double buffering). Queued shard by shard, the first batch would be worker 0's
        envs only, and a worker would wait for the caller exactly as in a synchronous step.
        """
        position = {i: (i - self.shards[self.shard_of(i)][0], self.shard_of(i)) for i in env_ids}
        self._queue(sorted(env_ids, key=position.__getitem__))

    # -- reset -----------------------------------------------------------------------

    @holding  # Ctrl-C waits until the envs' states and the posts agree (see ipc.interrupts)
    def reset(self, kwargs: dict[int, dict[str, Any]]) -> None:
        """Start ``env_i.reset(**kwargs[i])``; the envs come back through :meth:`recv`.

        The envs must be held by the caller; others may have sends in flight meanwhile.
        """
        ids = np.array(sorted(kwargs), dtype=np.int64)
        self.check_can_send(ids)
        self._finish_reset()  # one async reset at a time
        self.requests.send(Reset(kwargs), beside_sends=True)
        self.state[ids] = IN_FLIGHT
        self._resetting = ids.tolist()

    def _finish_reset(self, timeout: float | None = None) -> None:
        if self._resetting:
            ids, self._resetting = self._resetting, []
            infos = self.requests.wait(timeout, resumable=False)  # else its envs would stay in flight for good
            self.records.update((i, StepInfo(i, infos[i])) for i in ids)
            self.queue_all(ids)

    # -- send ----------------------------------------------------------------------

    @holding
    def send(self, env_ids: np.ndarray) -> None:
        """Step ``env_ids`` (their actions are in the action rows); :meth:`recv` returns them."""
        self.pool.ensure_can_send(resetting=bool(self._resetting))
        self.check_can_send(env_ids)
        self._finish_reset()
        self.pool.settle()
        self.state[env_ids] = IN_FLIGHT
        ids = self._unsent_restarted(env_ids.tolist())  # those whose worker was re-created are reported now
        by_worker: dict[int, list[int]] = {}
        for i, k in zip(ids, self.env_shard[ids].tolist()):
            by_worker.setdefault(k, []).append(i)
        main_ids = by_worker.pop(len(self.links), [])
        self.caller.step()
        for k, worker_ids in by_worker.items():
            self.links[k].put(worker_ids, self.inbox)
        if main_ids:
            self._step_main(main_ids)

    def _step_main(self, ids: list[int]) -> None:
        main = self.main
        for i in ids:
            try:  # a Ctrl-C raises in the env (interrupts.let_through)
                record = let_through(main.step_env, i - main.start, main.read_action(i))
            except EnvFailed as failure:
                self.state[i] = HELD
                raise main_shard_error(failure) from None
            except KeyboardInterrupt:  # env i stopped mid-step, the envs after it never stepped
                self.pool.break_on_interrupt(f"the step of env {i} in the main process during send()")
                raise
            if main.pickled_out:  # observation leaves with no fixed size go with the record, as a worker's do
                record = (record or StepInfo(i, {}))._replace(pickled_obs=main.pickled_out.pop(i))
            if record is not None:
                self.records[i] = record
            self.state[i] = QUEUED
            self.fifo.append(i)

    # -- recv ----------------------------------------------------------------------

    @holding
    def recv(self, batch_size: int, timeout: float | None = None) -> tuple[np.ndarray, dict[int, StepInfo]]:
        """The first ``batch_size`` envs to finish, and the records of those that sent one."""
        self.pool.check_usable()
        self._finish_reset(timeout)
        check_available(self.state, batch_size)
        deadline = self.pool.deadline(timeout)
        ready = self.ready
        if time.monotonic() - self._liveness_at > LIVENESS_INTERVAL:
            self._check_alive(None, None)  # else a dead worker's envs could vanish while others keep the batches full
        waiting = time.perf_counter()
        while True:
            ready.drain()  # the posts of what this scan takes; later ones wake the wait below
            self._scan()
            if len(self.fifo) >= batch_size:
                break
            if not ready.wait(LIVENESS_INTERVAL):
                raise_held()  # a Ctrl-C held meanwhile: what the scans took is queued, nothing is half-counted
                self._check_alive(deadline, timeout)
        self.pool.clock.waited(waiting, time.perf_counter())
        ids = self._dequeue(batch_size)
        env_ids = np.array(ids, dtype=np.int64)
        records = [self.records.pop(i) for i in ids if i in self.records]
        if self.final_flag is not None:
            ended = np.sort(env_ids[self.final_flag[env_ids] & (self.terminated[env_ids] | self.truncated[env_ids])])
            records = with_shm_finals(records, self.final_obs, ended)
            self.final_flag[ended] = False  # taken
        self.caller.returned()
        return env_ids, {record.env_index: record for record in self.pickled.keep_obs(records)}

    def _scan(self) -> None:
        """Queue what the outboxes published since the last scan, oldest first; raise an env's error.

        A worker's outbox slot, and the rows of its env, are read only after taking the post
        on ``finished`` that published them: one slot per post.
        """
        finished: list[tuple[int, int]] = []
        error = None
        ctrl, outbox, env_status, ready_ns = self.ctrl, self.outbox, self.env_status, self.ready_ns
        # Only the workers whose count of published envs moved. The count is a hint, read without
        # a post: an update not visible yet comes with a later post on ``ready``, which wakes recv
        # to scan again (every ``ready`` post taken makes its worker's count visible).
        for k in np.flatnonzero(ctrl[:, lay.CTRL_PUBLISHED] != ctrl[:, lay.CTRL_TAKEN]).tolist():
            link, row = self.links[k], ctrl[k]
            start, size, taken = link.start, link.stop - link.start, int(row[lay.CTRL_TAKEN])
            for _ in range(link.finished.drain()):
                i = int(outbox[start + taken % size])
                taken += 1
                row[lay.CTRL_TAKEN] = taken
                if env_status[i] != 0:  # its record or error follows on the pipe
                    reply = self.pool.message_from(link, send_reply=True)
                    if isinstance(reply, Restart):
                        # It died before sending it (so this env was its last): the env stays in
                        # flight, and the restart that _check_alive makes of the claim reports it.
                        break
                    message = reply.payload
                    if isinstance(message, ErrorReport):
                        self.state[i] = HELD  # no result: the caller may send to it again
                        error = error or message
                        continue
                    self.records[i] = message[0]
                finished.append((int(ready_ns[i]), i))
        finished.sort()
        for _, i in finished:
            self.state[i] = QUEUED
            self.fifo.append(i)
        if error is not None:
            raise remote_error(error)

    def _check_alive(self, deadline: float | None, timeout: float | None) -> None:
        """While waiting: a dead worker with envs in flight raises or restarts; then the deadline."""
        self._liveness_at = time.monotonic()
        for link in self.links:
            if link.death() is None:
                continue
            restart = self.pool.check_alive(link)
            if restart is not None:
                self._restart(restart.link)
        if deadline is not None and time.monotonic() > deadline:
            self.pool.time_out(np.flatnonzero(self.state == IN_FLIGHT).tolist(), timeout)

    def _restart(self, link: WorkerLink) -> None:
        """Re-create ``link``'s worker: its in-flight and queued envs report a truncation now,
        held ones at their next send."""
        self._scan()  # what it finished before dying stands
        reset_infos = self.restarter.restart(link)  # none in NEXT_STEP: see Restarter
        lost = self._lose(range(link.start, link.stop))
        self._queue_restarted(lost, reset_infos)

    def _result_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        return self.rewards, self.terminated, self.truncated, self.final_flag
