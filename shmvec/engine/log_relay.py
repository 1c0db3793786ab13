"""The workers' log records, handed to the main process's loggers.

Each record a worker logs travels as one datagram over a socket pair to a thread of the main
process (:class:`LogRelay`), which hands it to the logger of its name there: the script's
handlers, levels and filters then apply as to its own records. What holds:

- **Once per handler.** A worker keeps no handler of its own: :func:`relay_to` removes the
  copies of the parent's handlers that a forked worker inherits (they would write each record
  a second time) and sends every record, whatever its logger's ``propagate``, to the relay.
- **Cut, never lost.** A message longer than :data:`MAX_MESSAGE_CHARS` characters (a traceback
  included) is cut: its first and last parts are kept, with a marker between them saying how
  many characters were cut. Fewer are kept where the record would not fit one datagram of
  :data:`MAX_RECORD_BYTES` (non-ASCII text, large ``extra=`` attributes).
- **The relay goes on.** A main-process filter or handler that raises on a worker's record is
  reported on stderr as ``logging`` reports a handler's error (once per logger and kind of
  error), and the relay hands on the next record.
- **A worker never waits long.** While the relay keeps up, a burst of records waits for room in
  the socket's buffer; when it does not (a handler of the main process stuck on a full disk or a
  dead network share), a record waits at most :data:`SEND_WAIT` seconds, then the worker drops
  records without waiting until the relay takes one again, and the first record that goes
  through is preceded by a warning on logger ``shmvec`` saying how many were dropped. Waiting
  forever would stop every worker's steps behind a stuck handler; never waiting would drop the
  records of a burst the relay takes a few milliseconds later.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import pickle
import select
import socket
import sys
import threading
import time
import traceback
from typing import Any

MAX_MESSAGE_CHARS = 50_000  # the longest message a worker's record keeps (documented in docs/process.md)
MAX_RECORD_BYTES = 60_000  # a pickled record's most: one datagram
SEND_WAIT = 0.5  # seconds a record waits for room in the socket's buffer, unless the relay is known stuck
SEND_BUFFER = 4 << 20  # bytes asked for the workers' socket (the kernel caps it at net.core.wmem_max)
RELAY_CLOSE_TIMEOUT = 1.0  # seconds close() waits for the relay to take the last records
_RECEIVE_BYTES = 1 << 18  # more than any datagram a sender sends
_EXTRA_CHARS = 1_000  # an extra attribute too large for the datagram travels as its repr, cut to this
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class LogRelay:
    """The main process's end of the workers' logging: a datagram socket pair and a thread that
    hands each record to the logger of its name here.

    Each record is one datagram, whole or not at all whichever workers write at once, so the
    workers need no lock; and unlike ``multiprocessing.Queue`` it leaves no named semaphore in
    ``/dev/shm`` when a process group is killed.
    """

    def __init__(self):
        self._read, write = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        write.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)  # room for bursts
        self.queue = RecordSender(write)  # what workers log to (kept here for restarted ones)
        self._reported: set[tuple[str, type]] = set()  # (logger name, error type) already reported
        self._thread = threading.Thread(target=self._relay, name="shmvec-log-relay", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        while True:
            try:
                data = self._read.recv(_RECEIVE_BYTES)
            except OSError:  # closed
                return
            if not data:  # close()'s
                return
            try:
                record = pickle.loads(data)
            except Exception as exc:  # an attribute of a class this process cannot import
                self._report("?", exc, "could not be unpickled here")
                continue
            logger = logging.getLogger(record.name)
            try:
                if logger.isEnabledFor(record.levelno):
                    logger.handle(record)
            except Exception as exc:  # the main process's filters and handlers, not ours to stop on
                self._report(record.name, exc, f"raised in a filter or handler here: {record.getMessage()[:200]!r}")

    def _report(self, name: str, exc: Exception, what: str) -> None:
        """Like ``logging.Handler.handleError``: a traceback on stderr, once per logger and error type."""
        if (name, type(exc)) in self._reported or not logging.raiseExceptions or sys.stderr is None:
            return
        self._reported.add((name, type(exc)))
        try:
            sys.stderr.write("--- Logging error in shmvec's log relay ---\n")
            traceback.print_exception(exc, file=sys.stderr)
            sys.stderr.write(
                f"A worker's record on logger {name!r} {what}. The relay goes on with the next records; "
                "further errors of this kind on this logger are not shown.\n"
            )
        except Exception:  # stderr closed: nowhere left to say it
            pass

    def close(self) -> None:
        """Take the records the workers sent (call after they exited), then stop. Idempotent."""
        if self._thread.is_alive() and self.queue._send(b"", RELAY_CLOSE_TIMEOUT):
            self._thread.join(RELAY_CLOSE_TIMEOUT)
        if self._thread.is_alive():  # stuck in a handler of this process: its next read ends it
            try:
                self._read.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.queue.sock.close()
        self._read.close()


class RecordSender:
    """A worker's end of the :class:`LogRelay`, for ``logging.handlers.QueueHandler``: one datagram a record."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.dropped = 0  # records dropped since the relay last took one (in this worker)

    def put_nowait(self, record: logging.LogRecord) -> None:
        """Send ``record`` (as ``QueueHandler.prepare`` left it: its message a string), cut to fit."""
        data = datagram(record)
        if not self._send(data, wait=0.0 if self.dropped else SEND_WAIT):
            self.dropped += 1
            return
        if self.dropped:  # the relay takes records again: say how many it missed
            note = logging.makeLogRecord(
                {
                    "name": "shmvec",
                    "levelno": logging.WARNING,
                    "levelname": "WARNING",
                    "msg": f"shmvec: {self.dropped:,} log records of worker process {os.getpid()} were dropped: the "
                    f"main process's log handlers did not take them within {SEND_WAIT:g} s",
                }
            )
            if self._send(pickle.dumps(note), wait=0.0):
                self.dropped = 0

    def _send(self, data: bytes, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while True:
            try:
                self.sock.send(data, socket.MSG_DONTWAIT)
                return True
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller = select.poll()
                poller.register(self.sock, select.POLLOUT)
                poller.poll(left * 1000)
            except OSError:  # the relay is closed (the pool closes): nobody is left to read it
                return False


def datagram(record: logging.LogRecord) -> bytes:
    """``record`` pickled in at most :data:`MAX_RECORD_BYTES`, its message cut to fit (see the module docstring)."""
    message = record.msg if isinstance(record.msg, str) else str(record.msg)
    limit = MAX_MESSAGE_CHARS
    while True:
        record.msg = record.message = _cut(message, limit)
        data = _dumps(record)
        if len(data) <= MAX_RECORD_BYTES:
            return data
        large = [name for name in vars(record) if name not in _STANDARD and len(_dumps(getattr(record, name))) > 1000]
        for name in large:
            setattr(record, name, _cut(repr(getattr(record, name)), _EXTRA_CHARS))
        if not large:
            if limit <= _EXTRA_CHARS:  # logging's own attributes alone are that large: the send will fail, counted
                return data
            limit //= 2  # characters that take several bytes each


def _cut(text: str, limit: int) -> str:
    """``text``, or its first and last parts with a marker between them that says how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    return f"{text[:head]}\n[... shmvec's log relay cut {len(text) - limit:,} characters ...]\n{text[head - limit :]}"


def _dumps(obj: Any) -> bytes:
    """``obj`` pickled; a record's attributes that do not pickle (``extra=`` holding a lock) become their repr."""
    try:
        return pickle.dumps(obj)
    except Exception:
        if not isinstance(obj, logging.LogRecord):
            return pickle.dumps(repr(obj))
    for name, value in list(vars(obj).items()):
        try:
            pickle.dumps(value)
        except Exception:
            setattr(obj, name, _cut(repr(value), _EXTRA_CHARS))
    return pickle.dumps(obj)


def relay_to(queue: RecordSender | None) -> None:
    """In a worker: send every record to ``queue`` (none: keep none), and through no handler of this process.

    Under fork the worker holds copies of the parent's handlers, on the root and on any logger:
    they would write each record once more, next to the original handler the relay hands it to.
    Every logger propagates, so that each record reaches the root's handler here; the relay hands
    it to the logger of its name in the main process, where its ``propagate`` applies.
    """
    root = logging.getLogger()
    loggers = [root, *(logger for logger in list(logging.Logger.manager.loggerDict.values()))]
    for logger in loggers:
        if not isinstance(logger, logging.Logger):  # a PlaceHolder
            continue
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    if queue is not None:
        root.addHandler(logging.handlers.QueueHandler(queue))
