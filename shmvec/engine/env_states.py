"""Where each env stands in async batches (``send``/``recv``), for both backends' schedules.

Every env is in one of three states: *held* (the caller has its latest result and owes
it an action), *in flight* (sent, being stepped) or *queued* (finished, waiting in the
FIFO for a ``recv``, its record if it sent one kept aside). :class:`EnvStates` holds that
bookkeeping, the checks of ``send`` and ``recv`` against it, and the report of a restart
as a truncation; the schedules (:class:`~shmvec.engine.async_schedule.AsyncSchedule`,
:class:`~shmvec.backends.ray_batches.RayBatches`) move the envs between the states.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from shmvec.engine.failures import ranges
from shmvec.errors import AlreadyPendingError, NoPendingCallError
from shmvec.ipc.protocol import StepInfo

HELD, IN_FLIGHT, QUEUED = 0, 1, 2
_count_nonzero = np.count_nonzero


class EnvStates:
    """The held / in-flight / queued state of a pool's envs, the FIFO of queued ones and their records.

    A restart writes the result rows of :meth:`_result_rows`: by default those of ``pool``
    (set by the subclass).
    """

    pool: Any
    sent = False  # whether a send (or async reset) ever passed check_can_send: until then every env is held

    def __init__(self, num_envs: int):
        self.state = np.full(num_envs, HELD, dtype=np.int8)
        self.fifo: deque[int] = deque()
        self.records: dict[int, StepInfo] = {}  # queued envs whose step sent a record
        self.restarted: set[int] = set()  # held envs whose worker was restarted: their next send reports it

    @property
    def busy(self) -> bool:
        """Whether any env is in flight or queued (the synchronous calls must wait)."""
        if self.fifo:
            return True
        if not self.sent:  # only synchronous calls so far (an in-process env_method every step: no numpy call)
            return False
        if not _count_nonzero(self.state):  # the synchronous steps' case: every env held; ~0.2 µs, not ~2
            return False
        return bool((self.state == IN_FLIGHT).any())

    def check_can_send(self, env_ids: np.ndarray) -> None:
        """Raise unless every env of ``env_ids`` is held by the caller (before its action row is written).
        Every send and async reset calls it before its envs leave the held state."""
        check_held(self.state, env_ids)
        self.sent = True

    def _queue(self, ids: list[int]) -> None:
        """These envs finished, in this order: ``recv`` returns them after those queued before."""
        self.state[ids] = QUEUED
        self.fifo.extend(ids)

    def _dequeue(self, batch_size: int) -> list[int]:
        """The first ``batch_size`` queued envs, now held by the caller (in env order if that is all of them)."""
        ids = [self.fifo.popleft() for _ in range(batch_size)]
        if batch_size == len(self.state):
            ids.sort()  # the synchronous step's order
        self.state[ids] = HELD
        return ids

    def _unsent_restarted(self, env_ids: list[int]) -> list[int]:
        """At a send: queue the envs restarted since they were held (a truncation, as a step would
        report); return the others, to be sent."""
        if not self.restarted:
            return env_ids
        restarted = [i for i in env_ids if i in self.restarted]
        self._queue_restarted(restarted, {})
        return [i for i in env_ids if i not in restarted] if restarted else env_ids

    def _lose(self, envs: range) -> list[int]:
        """The worker (or node) of ``envs`` was re-created: their held envs report it at their next
        send; return the others (in flight or queued), out of the FIFO, to report it now."""
        lost = [i for i in envs if self.state[i] != HELD]
        for i in lost:
            if self.state[i] == QUEUED:
                self.fifo.remove(i)
        self.restarted.update(i for i in envs if self.state[i] == HELD)
        return lost

    def _result_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The rows a restart writes: rewards, terminated, truncated and final_flag (None: no final observations)."""
        pool = self.pool
        return pool.rewards, pool.terminated, pool.truncated, pool.final_flag

    def _queue_restarted(self, ids: list[int], infos: dict[int, Any]) -> None:
        """Queue ``ids`` as truncated by a restart (reward 0, no final observation), with their reset ``infos``."""
        rewards, terminated, truncated, final_flag = self._result_rows()
        for i in ids:
            self.restarted.discard(i)
            rewards[i], terminated[i], truncated[i] = 0.0, False, True
            if final_flag is not None:
                final_flag[i] = False
            self.records[i] = StepInfo(i, infos.get(i, {}), restarted=True)
        self._queue(ids)


def check_held(state: np.ndarray, env_ids: np.ndarray) -> None:
    """Raise unless every env of ``env_ids`` is held by the caller (no send pending) and none repeats."""
    if _count_nonzero(state[env_ids]):  # HELD is 0; the details only on the error path (it runs per send)
        pending = env_ids[state[env_ids] != HELD]
        raise AlreadyPendingError(
            f"envs {ranges(sorted(set(pending.tolist())))} have a send pending: recv() their results before "
            "sending them actions again",
            "send",
        )
    ids = env_ids.tolist()
    if len(set(ids)) != len(ids):
        raise ValueError(f"env_ids must not repeat an env, got {ids}")


def check_available(state: np.ndarray, batch_size: int) -> None:
    """Raise unless ``batch_size`` envs are in flight or queued, so that a recv can return."""
    available = int(np.count_nonzero(state))  # in flight or queued: not held
    if available < batch_size:
        raise NoPendingCallError(
            f"recv() returns batch_size={batch_size} envs, but only {available} are in flight or ready; "
            "send() actions to the envs of the last recv() first (or call async_reset())",
            "send",
        )
