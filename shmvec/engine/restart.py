"""Restart mode (``on_worker_failure="restart"``): re-create a worker that died during a step.

The new process gets the dead one's link (rows, signals) and runs the start-up handshake
again; its Attach says ``restart=True``, so it resets its envs (seed ``None``) and replies
their reset infos. The step then reports those envs as truncated with reward 0 and a
``restarted`` record, while the other workers' results of the step stand.

A wait that finds a worker dead claims a restart for it (:meth:`Restarter.claim`) and
returns the claim, a :class:`Restart`, to its caller: a step or an async ``recv`` restarts
the worker; a rare call, which cannot, breaks the pool.
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, Protocol

import gymnasium as gym
import numpy as np

from shmvec.engine.failures import describe_exit, remote_error
from shmvec.engine.link import IDLE, WorkerLink, mp_context
from shmvec.errors import SpaceMismatchError
from shmvec.ipc import layout as lay
from shmvec.ipc.info_rows import InfoReader
from shmvec.ipc.pickled import PickledLeaves
from shmvec.ipc.protocol import Attach, ErrorReport, StepInfo


class Restart(NamedTuple):
    """A restart claimed for ``link``'s worker, which died: what a wait returns instead of its answer."""

    link: WorkerLink
    death: str  # how it died: the error where it cannot be restarted


class RestartHost(Protocol):
    """What a :class:`Restarter` needs of its pool (a weak proxy: no reference cycle)."""

    obs_buffer: int  # the observation buffer the step in progress writes

    def message_from(self, link: WorkerLink, timeout: float | None = None) -> Any: ...
    def break_for(self, reason: str, error: BaseException | type[BaseException] = ...) -> NoReturn: ...


@dataclasses.dataclass(frozen=True)
class Rebuild:
    """What re-creating a worker repeats of the pool's start-up handshake."""

    spawn_args: tuple  # WorkerLink.spawn's, after the context: env_fns, env_wrapper, max_spin, WorkerStart
    start_method: str
    start_limit: float | None  # how long building its envs may take
    spaces: tuple[gym.Space, gym.Space]  # the pool's observation and action spaces, which its envs must match
    obs_space_match: Callable[[gym.Space, gym.Space], bool]
    attach: Attach  # with restart=True: the new worker resets its envs and replies their infos


class Restarter:
    """Restarts the pool's dead workers within ``max_restarts``.

    ``same_step``: the autoreset mode is SAME_STEP, where a restarted env's reset info goes
    with its record (in NEXT_STEP the next step resets again and brings its own).
    """

    def __init__(
        self,
        pool: RestartHost,
        rebuild: Rebuild,
        views: dict[str, np.ndarray],
        info_reader: InfoReader,
        pickled: PickledLeaves,
        same_step: bool,
        max_restarts: int,
    ):
        self.pool = pool
        self.rebuild, self.info_reader, self.pickled, self.same_step = rebuild, info_reader, pickled, same_step
        self.rewards, self.terminated, self.truncated = views["reward"], views["terminated"], views["truncated"]
        self.final_flag = views.get(lay.FINAL_FLAG)  # None: no final observations in the rows
        self.max_restarts = max_restarts
        self.count = 0  # workers re-created so far
        self.restarts_of: dict[int, int] = {}  # worker -> its restarts so far: each life draws its own numbers
        self.claimed: set[int] = set()  # workers whose death was found and not restarted yet
        self.used_up = f"; no restart left (max_restarts={max_restarts} used up)"

    def claim(self, link: WorkerLink) -> Restart | None:
        """``link``'s worker died: claim a restart for it while the budget lasts (once per death), else None."""
        if link.index not in self.claimed and self.count + len(self.claimed) >= self.max_restarts:
            return None
        self.claimed.add(link.index)
        return Restart(link, link.death())

    def restart_in_step(self, link: WorkerLink) -> list[StepInfo]:
        """Restart ``link``'s worker; report its envs' step as a truncation. Returns their records."""
        reset_infos = self.restart(link)
        start, stop = link.start, link.stop
        self.rewards[start:stop] = 0.0
        self.terminated[start:stop] = False
        self.truncated[start:stop] = True
        if self.final_flag is not None:  # no final obs: it died with the worker
            self.final_flag[start:stop] = False
        return [StepInfo(i, reset_infos.get(i, {}), restarted=True) for i in range(start, stop)]

    def restart(self, link: WorkerLink) -> dict[int, dict[str, Any]]:
        """Replace dead ``link``'s process by a new one on the same rows and signals.

        Returns the reset infos its envs report (none in NEXT_STEP: see the class docstring)."""
        old = link.process
        # Warn first: should warnings be errors, the pool stays as it was and the death
        # is found again at the next step.
        warnings.warn(
            f"shmvec: worker {link.index} ({link.envs}, pid {old.pid}) died with {describe_exit(old.exitcode)}; "
            f"restarting it (restart {self.count + 1} of max_restarts={self.max_restarts})",
            RuntimeWarning,
            stacklevel=5,  # the adapter's step_wait
        )
        self.count += 1
        self.restarts_of[link.index] = self.restarts_of.get(link.index, 0) + 1
        self.claimed.discard(link.index)
        link.release_process()  # reaped already (exitcode is set): returns at once
        link.conn.close()
        self._forget_old(link)
        self.info_reader.forget(link.index, link.start, link.stop)  # the new one learns its info schemas anew
        link.ctrl[lay.CTRL_OBS_BUFFER] = self.pool.obs_buffer  # its reset observations belong to the step in progress
        try:
            reply = self._handshake(link)
        except BaseException as exc:
            self.pool.break_for(f"restarting worker {link.index} ({link.envs}) failed", exc)
        link.owes = IDLE
        reset_infos = self.pickled.keep_reset_obs(reply)
        return reset_infos if self.same_step else {}

    @staticmethod
    def _forget_old(link: WorkerLink) -> None:
        """Posts the dead worker never took (our commands) or that we never took (its done,
        any finished send left), and the counts that went with them: the new one starts at 0."""
        link.cmd.drain()
        link.done.drain()
        link.finished.drain()
        link.seq = link.sent = 0
        link.send_replies.clear()
        link.ctrl[:] = 0

    def _handshake(self, link: WorkerLink) -> dict[int, Any]:
        """Start the new worker and attach it; return its reply to the Attach (its envs' reset results)."""
        rebuild = self.rebuild
        env_fns, env_wrapper, max_spin, start = rebuild.spawn_args
        start = dataclasses.replace(start, restarts=self.restarts_of[link.index])
        link.spawn(mp_context(rebuild.start_method), env_fns, env_wrapper, max_spin, start)
        hello = self._message_from(link)
        if isinstance(hello, ErrorReport):  # an env_fn raised
            raise remote_error(hello)
        expected = rebuild.spaces
        for i, (obs_space, action_space) in enumerate(hello.spaces, link.start):
            if not rebuild.obs_space_match(expected[0], obs_space) or action_space != expected[1]:
                raise SpaceMismatchError(
                    f"env {i}, rebuilt after its worker died, has spaces {(obs_space, action_space)}; "
                    f"the pool's are {expected}"
                )
        link.conn.send_bytes(pickle.dumps(rebuild.attach))
        reply = self._message_from(link)
        if isinstance(reply, ErrorReport):  # an env's reset raised
            raise remote_error(reply)
        return reply

    def _message_from(self, link: WorkerLink) -> Any:
        message = self.pool.message_from(link, self.rebuild.start_limit)
        if isinstance(message, Restart):  # the new worker died too: this restart failed
            self.pool.break_for(message.death)
        return message
