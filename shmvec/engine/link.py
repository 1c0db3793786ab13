"""One worker process as the main process sees it: :class:`WorkerLink`.

A link owns the worker's process, its pipe and its three signals (``cmd``: main -> worker,
``done``: worker -> main, per command; ``finished``: worker -> main, per env of an async
send), knows the worker's env range and remembers what the worker still owes, so that an
interrupted wait (Ctrl-C, a timeout) never lets a late answer be taken for the next
command's. The pool holds one link per worker. What each signal publishes:
:mod:`shmvec.ipc.protocol`.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import time
from collections import deque
from typing import Any

import numpy as np

from shmvec.engine.failures import describe_exit
from shmvec.engine.worker import worker_main
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import Command, ErrorReport, SendReply, Status, post_word
from shmvec.ipc.signals import Signal
from shmvec.processes.lean_start import SCRIPT_WORKER_PREFIX, WORKER_NAME_PREFIX, env_fns_blob
from shmvec.processes.script_setup import WorkerStart
from shmvec.processes.starters import preload_what_it_names, start_context

LIVENESS_INTERVAL = 0.1  # seconds between checks that every worker is still alive while waiting
# What the main process still expects from a worker.
IDLE, AWAIT_DONE, AWAIT_PAYLOAD = 0, 1, 2
# Plain ints for the hot path: attribute access on an IntEnum member costs ~1 µs.
_STATUS_OK, _COMMAND_SEND, _COMMAND_MESSAGE = int(Status.OK), int(Command.SEND), int(Command.MESSAGE)
# A reply follows its done post at once: waiting for it this long costs less than a wake-up from poll (~15-30 µs).
PAYLOAD_SPIN = 50e-6
WRITE_FIRST_MAX = 64 * 1024  # the largest request written before its post (see WorkerLink.send)
NOTHING = object()  # recv(): no message within the time slice


class WorkerLink:
    """The main process's end of worker ``index``, which runs envs ``[start, stop)``."""

    def __init__(self, index: int, start: int, stop: int, max_spin: float):
        self.index, self.start, self.stop = index, start, stop
        self.cmd = Signal.create()  # only the worker waits on it (with its own max_spin)
        self.done = Signal.create(max_spin)
        self.finished = Signal.create()  # one post per env the worker puts in its outbox: publishes its rows
        self.conn: Any = None
        self._readable: Any = None  # a select.poll of conn: Connection.poll builds a selector per call (~3 µs)
        self._write_first = 0  # requests up to this size are written before their post (see send)
        self.process: Any = None
        self._exit_watch: ExitWatch | None = None  # forkserver: exitcode asks the server (~10 µs); this polls (~1)
        self.ctrl: np.ndarray | None = None  # its row of the control block, once the arena exists
        self.owes = IDLE
        self.send_replies: deque[SendReply] = deque()  # read ahead of a rare call's reply
        self.seq = 0  # posts on cmd so far: the seq of the last command word
        self.sent = 0  # async sends: env ids put in its inbox (taken from its outbox: ctrl's CTRL_TAKEN)

    @property
    def envs(self) -> str:
        return f"envs {self.start}..{self.stop - 1}"

    def spawn(self, ctx: Any, env_fns: list, env_wrapper: Any, max_spin: float, start: WorkerStart) -> None:
        """Start the worker process on its envs with a new pipe (at start-up and on restart)."""
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.conn = parent_conn
        self._readable = select.poll()
        self._readable.register(parent_conn.fileno(), select.POLLIN)
        self._write_first = _write_first_limit(parent_conn.fileno())
        blob = env_fns_blob(list(env_fns[self.start : self.stop]), env_wrapper)
        preload_what_it_names(blob)
        names = (self.cmd.name, self.done.name, self.finished.name)
        args = (self.index, child_conn, start.setup, blob, start.log_queue, self.start, self.stop, names, max_spin)
        args += (start.worker_threads, os.getpid(), start.restarts)
        prefix = SCRIPT_WORKER_PREFIX if start.import_main else WORKER_NAME_PREFIX
        process = ctx.Process(target=worker_main, args=args, daemon=start.daemon, name=f"{prefix}{self.index}")
        try:
            process.start()
        except BaseException:
            child_conn.close()
            raise
        self.process = process  # only a started one: the clean-up joins it
        if ctx.get_start_method() == "forkserver":
            self._exit_watch = ExitWatch.of(self.process.pid)
        child_conn.close()
        self.owes = AWAIT_PAYLOAD  # its Hello

    # -- the per-step path -----------------------------------------------------------

    def post(self, command: int) -> None:
        """Have the worker run ``command``; it answers through ``done`` (then the pipe if flagged).

        The word, the seq and the post happen together or not at all: a word without its post
        would leave the worker's count of posts one behind the seqs for good. Every caller runs
        inside a pool call that holds Ctrl-C (:mod:`shmvec.ipc.interrupts`), so no
        KeyboardInterrupt falls in between, nor between a ``done`` taken in :meth:`wait` and
        :attr:`owes`, or a message read in :meth:`recv` and :attr:`owes`.
        """
        seq = self.seq + 1
        word = post_word(seq, self.sent, command)
        self.ctrl[lay.CTRL_POST] = word  # published by the post below, with every store before it
        self.seq = seq
        self.owes = AWAIT_DONE
        self.cmd.post()

    def put(self, env_ids: list[int], inbox: np.ndarray) -> None:
        """Async batches: have the worker step ``env_ids`` (their action rows are written); they
        come back through the outbox, each published by a post on :attr:`finished`."""
        start, size = self.start, self.stop - self.start
        for i in env_ids:
            inbox[start + self.sent % size] = i
            self.sent += 1
        self.post(_COMMAND_SEND)  # publishes the slots: the worker reads them after taking it
        self.owes = IDLE  # its answers come through the outbox, not through done

    def wait(self, timeout: float, spin: float | None = None) -> bool:
        """Wait up to ``timeout`` for the posted command to finish; False if it has not yet.
        ``spin``: spin this long first (else as ``done`` learned)."""
        if not self.done.wait(timeout, spin):
            return False
        self.owes = IDLE if self.ctrl[lay.CTRL_STATUS] == _STATUS_OK else AWAIT_PAYLOAD
        return True

    def recv(self, timeout: float, send_reply: bool = False) -> Any:
        """One message from the worker, or :data:`NOTHING` if none came within ``timeout``.

        ``send_reply``: the next :class:`~shmvec.ipc.protocol.SendReply` (an async send's), else
        the next other message. A SendReply read while waiting for another reply is kept,
        in order, for a later ``recv(send_reply=True)``.

        Raises ``EOFError``/``OSError`` when the pipe broke (the worker is exiting).
        """
        if send_reply and self.send_replies:
            return self.send_replies.popleft()
        conn = self.conn
        if self.owes == AWAIT_PAYLOAD and not send_reply:  # its reply is on the way (usually there once woken)
            end = time.perf_counter() + PAYLOAD_SPIN
            while not (conn.closed or self._readable.poll(0)) and time.perf_counter() < end:
                os.sched_yield()
        while conn.closed or self._readable.poll(timeout * 1000.0):  # closed: recv_bytes raises OSError
            message = pickle.loads(conn.recv_bytes())
            if isinstance(message, SendReply) and not send_reply:
                self.send_replies.append(message)
                continue
            if not send_reply:
                self.owes = IDLE
            return message
        return NOTHING

    def send(self, blob: bytes, write_large: Any = None) -> None:
        """Post a rare (pickled) request.

        One that fits the socket's buffer is written before its post: the worker, once it has
        taken the post, reads it at once instead of blocking on the read until it comes (a second
        wake-up, ~30 µs). Nothing else is in that buffer: a worker reads each message as it takes
        its post. A larger one is written after the post, so that it cannot block on a full buffer,
        by ``write_large(blob)`` if given (the pool's, which reads the worker's replies meanwhile).
        """
        if len(blob) <= self._write_first:
            self.conn.send_bytes(blob)
            self.post(_COMMAND_MESSAGE)
        else:
            self.post(_COMMAND_MESSAGE)
            (write_large or self.conn.send_bytes)(blob)

    # -- failures --------------------------------------------------------------------

    def death(self) -> str | None:
        """How the worker died (``None`` while it lives)."""
        process = self.process
        watch = self._exit_watch
        if process is None or (watch is not None and not watch.exited()) or process.exitcode is None:
            return None
        return f"worker {self.index} ({self.envs}, pid {process.pid}) died with {describe_exit(process.exitcode)}"

    def last_words(self) -> ErrorReport | None:
        """The error report a dead worker sent before exiting, if any."""
        try:
            while self.conn.poll(0):  # async sends' replies may come first
                message = pickle.loads(self.conn.recv_bytes())
                if isinstance(message, ErrorReport):
                    return message
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        return None

    def answered(self) -> bool:
        """Whether the worker owes nothing now (consumes its answer: only for a pool being declared broken)."""
        if self.owes == AWAIT_DONE:
            return self.done.wait(0.0)
        return self.owes == IDLE or self.conn.poll(0)

    # -- the end ---------------------------------------------------------------------

    def ask_to_close(self) -> None:
        """Post CLOSE if the worker lives and the control block exists (it then exits by itself)."""
        if self.process is not None and self.process.exitcode is None and self.ctrl is not None:
            self.done.drain()  # a step the user never waited for
            self.post(Command.CLOSE)

    def join_or_kill(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the process to exit, then terminate or kill it."""
        process = self.process
        if process is None:
            return
        if process.exitcode is None and grace > 0:
            process.join(grace)
        if process.exitcode is None:  # stuck (hung env) or never attached: stop it
            process.terminate()
            process.join(1.0)
        if process.exitcode is None:
            process.kill()
        self.release_process()

    def release_process(self) -> None:
        """Reap the exited process and close its handles."""
        self.process.join()
        self.process.close()
        if self._exit_watch is not None:
            self._exit_watch.close()
        self.process = self._exit_watch = None

    def close_pipe(self) -> None:
        if self.conn is not None:  # a worker blocked on its pipe gets EOF instead of waiting for us
            self.conn.close()

    def release(self) -> None:
        """Close the signals (the owner unlinks them). Idempotent."""
        self.cmd.close()
        self.done.close()
        self.finished.close()
        self.ctrl = None


def _write_first_limit(fd: int) -> int:
    """The largest message a write into the empty socket ``fd`` surely takes without blocking (0 if unknown)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return min(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4, WRITE_FIRST_MAX)
    except OSError:
        return 0


class ExitWatch:
    """Whether a process has exited, in one ``poll`` of its pidfd (readable from its exit on).

    Not the process's sentinel: under forkserver, reading ``exitcode`` (a join) consumes it.
    """

    def __init__(self, pidfd: int):
        self.pidfd = pidfd
        self._poll = select.poll()
        self._poll.register(pidfd, select.POLLIN)

    @classmethod
    def of(cls, pid: int) -> ExitWatch | None:
        """A watch on ``pid``, or None where pidfds are missing (not Linux >= 5.3): then ask exitcode."""
        try:
            return cls(os.pidfd_open(pid))
        except (AttributeError, OSError):
            return None

    def exited(self) -> bool:
        return bool(self._poll.poll(0))

    def close(self) -> None:
        os.close(self.pidfd)


def mp_context(start_method: str) -> Any:
    """The multiprocessing context that starts workers (:func:`~shmvec.processes.starters.start_context`)."""
    return start_context(start_method)
