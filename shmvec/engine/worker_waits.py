"""Waiting on a local pool's workers: their replies, their liveness, the deadline, and what a death
or a silence raises (:class:`WorkerWaits`, a part of :class:`~shmvec.engine.pool.ShmPool`).

In restart mode a worker found dead is not raised: the wait claims a restart for it and
returns the claim (a :class:`~shmvec.engine.restart.Restart`), which its caller acts on.

Every wait runs inside a pool call that holds Ctrl-C (:mod:`shmvec.ipc.interrupts`); a wait
hands a held Ctrl-C to the caller's SIGINT handler (the default raises KeyboardInterrupt) after
a slice that ended without an answer, where what is owed is still counted as owed
(:meth:`WorkerWaits.collect`)."""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from shmvec.engine.breakable import Breakable
from shmvec.engine.failures import not_answered, ranges, remote_error
from shmvec.engine.link import AWAIT_DONE, IDLE, LIVENESS_INTERVAL, NOTHING, WorkerLink
from shmvec.engine.restart import Restart
from shmvec.errors import ShmVecError, StepTimeoutError, WorkerDiedError
from shmvec.ipc.interrupts import held, raise_held
from shmvec.ipc.protocol import ErrorReport


class WorkerWaits(Breakable):
    """The waits of :class:`~shmvec.engine.pool.ShmPool` on its workers (its ``links``),
    watching every one's liveness."""

    links: list[WorkerLink]
    timeout: float | None  # the default limit of a wait, in seconds
    restarter: Any  # a Restarter in restart mode once the pool has started, else None
    options: Any  # PoolOptions
    _res: Any  # PoolResources: ``arena`` (None while starting), ``graceful``

    def collect(
        self,
        links: Sequence[WorkerLink],
        timeout: float | None = None,
        dead: list | None = None,
        deadline: float | None = None,
        resumable: bool = True,
        spin: float | None = None,
    ) -> list[Any]:
        """Wait until each link answered; return their replies (by position), raising the first error.

        With a ``dead`` list (restart mode, steps), a worker that died is appended to it,
        while the restart budget lasts, with an empty reply in its place, instead of raising.
        ``deadline``: the call's, when it waits more than once (else one from ``timeout``).
        ``spin``: how long each wait spins before it blocks (else as the link's ``done`` learned).

        A Ctrl-C held during the call (:mod:`shmvec.ipc.interrupts`) goes to the caller's handler
        after a slice that ended without an answer: nothing was taken and left uncounted there,
        and what is still owed stays owed, for :meth:`settle` to absorb, should the handler raise.
        Unless the wait is ``resumable`` (an async reset's, whose envs would never come back) the
        pool then breaks.
        """
        if not links:  # everything runs in the main process
            return []
        deadline = self.deadline(timeout) if deadline is None else deadline
        replies, error = [], None
        for link in links:
            restart = None
            if link.owes == AWAIT_DONE:
                while not link.wait(LIVENESS_INTERVAL, spin):
                    if held():
                        self._interrupted(resumable and not dead)
                    restart = self.check_alive(link, deadline, timeout)
                    if restart is not None:
                        break
            if link.owes == IDLE:
                message = []
            else:
                message = restart
                if restart is None:
                    message = self.message_from(link, timeout, deadline=deadline, interruptible=resumable and not dead)
                if isinstance(message, Restart):
                    if dead is None:  # restarts happen in steps only
                        self.break_for(message.death)
                    dead.append(link)
                    message = []
            if isinstance(message, ErrorReport):
                error = error or message
                message = []
            replies.append(message)
        if error is not None:
            raise remote_error(error)
        return replies

    def _interrupted(self, resumable: bool) -> None:
        """Hand the Ctrl-Cs held during the call to the caller's SIGINT handler (the default raises
        KeyboardInterrupt); should it raise, the pool breaks unless the wait is resumable."""
        try:
            raise_held()
        except BaseException:
            if not resumable:
                self.break_on_interrupt("a wait that cannot resume (an async reset, or a restart)")
            raise

    def break_on_interrupt(self, what: str) -> None:
        """A KeyboardInterrupt stopped ``what``, which cannot resume: the pool is unusable (its next call says so)."""
        self._broken = f"a KeyboardInterrupt stopped {what}"

    def deadline(self, timeout: float | None) -> float | None:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def message_from(
        self,
        link: WorkerLink,
        timeout: float | None = None,
        send_reply: bool = False,
        deadline: float | None = None,
        interruptible: bool = False,
    ) -> Any:
        """One message from ``link`` (``send_reply``: an async send's), watching every worker's liveness;
        a :class:`~shmvec.engine.restart.Restart` instead if ``link`` died and a restart is claimed for it.
        ``deadline``: the call's (else one from ``timeout``); ``interruptible``: a Ctrl-C held during the
        call is raised after a slice with no message (see :meth:`collect`)."""
        timeout = self.timeout if timeout is None else timeout
        deadline = self.deadline(timeout) if deadline is None else deadline
        while True:
            try:
                message = link.recv(LIVENESS_INTERVAL, send_reply)
            except (EOFError, OSError) as exc:
                restart = self.blame_dead(link)
                if restart is not None:
                    return restart
                raise exc
            if message is not NOTHING:
                break
            if interruptible:
                raise_held()
            restart = self.check_alive(link, deadline, timeout)
            if restart is not None:
                return restart
        if isinstance(message, ErrorReport) and not self._res.arena:
            raise remote_error(message)  # start-up failure
        return message

    def check_alive(
        self, link: WorkerLink, deadline: float | None = None, timeout: float | None = None
    ) -> Restart | None:
        """Raise if a worker died (any, or only ``link`` in restart mode) or the deadline passed;
        in restart mode, return the restart claimed for ``link`` if it died."""
        for other in (link,) if self.restarter else self.links:
            if other.death() is not None:
                return self._on_death(other)
        if deadline is not None and time.monotonic() > deadline:
            self._time_out_on(link, self.timeout if timeout is None else timeout)
        return None

    def _on_death(self, link: WorkerLink) -> Restart:
        """What ``link``'s death means: raise its last error or WorkerDiedError, or, in restart
        mode while the budget lasts, return a claimed restart."""
        report = link.last_words()
        if report is not None:
            raise remote_error(report)
        if self.restarter is None:
            self._break(link.death())
        restart = self.restarter.claim(link)
        if restart is None:
            self._break(link.death() + self.restarter.used_up)
        return restart

    def break_for(self, reason: str, error: BaseException | type[BaseException] = WorkerDiedError) -> NoReturn:
        """Make the pool unusable for ``reason`` and raise ``error`` (by default, a worker died
        where it cannot be restarted: WorkerDiedError)."""
        self._break(reason, error)

    def write_request(self, link: WorkerLink, blob: bytes) -> None:
        """Write a request too large for the socket's buffer to ``link`` (posted already), as its pipe frames it.

        Its worker may be writing its async sends' replies first (more than the other buffer
        holds): each side would wait for the other. So the write never blocks: it reads
        whatever the worker sends meanwhile (kept for :meth:`~WorkerLink.recv`), and each slice
        without progress checks the deadline, every worker's liveness and a held Ctrl-C. A
        request left half written breaks the pool.
        """
        n = len(blob)
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)  # Connection.send_bytes'
        deadline = self.deadline(None)
        with socket.socket(fileno=os.dup(link.conn.fileno())) as sock:  # its own flags: recv stays blocking
            ready = select.poll()
            ready.register(sock, select.POLLIN | select.POLLOUT)
            for part in (memoryview(header), memoryview(blob)):
                while part:
                    try:
                        part = part[sock.send(part, socket.MSG_DONTWAIT) :]
                        continue
                    except BlockingIOError:
                        pass
                    events = ready.poll(LIVENESS_INTERVAL * 1000.0)
                    if any(event & select.POLLIN for _, event in events) and link.recv(0.0) is not NOTHING:
                        self.break_for(f"worker {link.index} answered a request it had not read", ShmVecError)
                    if not events:
                        self._write_stalled(link, deadline)

    def _write_stalled(self, link: WorkerLink, deadline: float | None) -> None:
        """A slice of :meth:`write_request` without progress: raise a held Ctrl-C, a death or the deadline."""
        if held():
            try:
                raise_held()
            except BaseException:
                self.break_on_interrupt(f"a request half written to worker {link.index}")
                raise
        restart = self.check_alive(link, deadline)
        if restart is not None:
            self.break_for(restart.death)

    def blame_dead(self, link: WorkerLink) -> Restart | None:
        """The link's pipe broke: it is exiting. Raise what killed it once the exit is visible
        (in restart mode, return the restart claimed for it)."""
        link.process.join(3.0)
        return self.check_alive(link)

    def settle(self) -> None:
        """Absorb answers to commands whose wait was interrupted (e.g. by KeyboardInterrupt)."""
        if self.pending is not None:
            return  # the next wait collects them
        behind = [link for link in self.links if link.owes != IDLE]
        if behind:
            try:
                self.collect(behind)
            except ShmVecError:
                raise
            except Exception:
                if any(link.owes != IDLE for link in behind):  # a SIGINT handler's exception stopped the wait
                    raise
                # else an env error of a step nobody waited for

    def time_out(self, silent: list[int], timeout: float | None) -> NoReturn:
        """Envs ``silent`` did not answer within ``timeout`` (None: the pool's): they are stuck, and so is the pool."""
        self._res.graceful = False  # they are stuck: closing will terminate them
        limit = self.timeout if timeout is None else timeout
        self._break(not_answered(silent, f"timeout={limit}s"), StepTimeoutError)

    def _time_out_on(self, link: WorkerLink, limit: float | None) -> NoReturn:
        """The deadline of a wait on ``link`` passed: it and the workers that owe an answer are silent."""
        silent = [
            i for other in self.links if other is link or not other.answered() for i in range(other.start, other.stop)
        ]
        if self._res.arena is None:  # still starting
            self._res.graceful = False
            self._break(f"envs {ranges(silent)} were not built within {limit}s (an env_fn hangs?)", StepTimeoutError)
        self.time_out(silent, limit)
