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
  :data:`MAX_RECORD_BYTES` (non-ASCII text, large ``extra=`` attributes, cut too), in a bounded
  number of rounds (:func:`datagram`): any record leaves the ``logging`` call, whole or cut.
- **The relay goes on.** A main-process filter or handler that raises on a worker's record is
  reported on stderr as ``logging`` reports a handler's error (once per logger and kind of
  error), and the relay hands on the next record.
- **A worker never waits long.** While the relay keeps up, a burst of records waits for room in
  the socket's buffer; when it does not (a handler of the main process stuck on a full disk or a
  dead network share), a record waits at most :data:`SEND_WAIT` seconds, then the worker drops
  records without waiting until the relay takes one again. A warning on logger ``shmvec`` says
  how many were dropped: a thread of the worker sends it as soon as the relay has room again,
  ahead of the worker's next record, and the worker sends it as it exits (``close()``) if it
  could not before; a worker that drops nothing runs no such thread. Waiting forever would stop
  every worker's steps behind a stuck handler; never waiting would drop the records of a burst
  the relay takes a few milliseconds later.
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
from multiprocessing import util as mp_util
from typing import Any

MAX_MESSAGE_CHARS = 50_000  # the longest message a worker's record keeps (documented in docs/process.md)
MAX_RECORD_BYTES = 60_000  # a pickled record's most: one datagram
SEND_WAIT = 0.5  # seconds a record waits for room in the socket's buffer, unless the relay is known stuck
SEND_BUFFER = 4 << 20  # bytes asked for the workers' socket (the kernel caps it at net.core.wmem_max)
RELAY_CLOSE_TIMEOUT = 1.0  # seconds close() waits for the relay to take the last records
_RECEIVE_BYTES = 1 << 18  # more than any datagram a sender sends
_EXTRA_CHARS = 1_000  # an extra attribute too large for the datagram: cut to this (others: their repr), then less
_CUT_ROUNDS = 8  # rounds of halving the limits before a record too large travels bare (_bare)
_BARE_MESSAGE_CHARS = 1_000  # a bare record's message (4 bytes a character at most)
_BARE_FIELD_CHARS = 200  # each of logging's own attributes of a bare record
_PLAIN = logging.Formatter()  # a raw record's message, with its exception and stack
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
                self._report(record.name, exc, f"raised in a filter or handler here: {_message(record)[:200]!r}")

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
        # The count, between the logging threads and the notice's thread; reentrant: a signal handler
        # that logs may run in a thread that holds it (while a send waits for room).
        self._lock = threading.RLock()
        self._notice_waits = False  # a thread waits to send the notice of those dropped
        self._closed = False  # the relay is gone: nothing will be taken again
        self._exit_notice = False  # the notice is due at this process's exit too

    def __reduce__(self):  # to a spawned worker: the socket alone (a lock does not pickle)
        return RecordSender, (self.sock,)

    def put_nowait(self, record: logging.LogRecord) -> None:
        """Send ``record`` (as ``QueueHandler.prepare`` left it: its message a string), cut to fit."""
        data = datagram(record)
        # After drops, the notice goes first; while the relay takes nothing, records wait no longer.
        if (self.dropped and not self._say_dropped(wait=0.0)) or not self._send(data, SEND_WAIT):
            self._drop()

    def _drop(self) -> None:
        """Count a dropped record; the notice goes once the relay takes records again, or at this
        process's exit, even if nothing more is logged."""
        with self._lock:
            self.dropped += 1
            if self._notice_waits or self._closed:
                return
            self._notice_waits = True
            if not self._exit_notice:  # run by multiprocessing as a worker process exits (at close())
                self._exit_notice = True
                mp_util.Finalize(None, self._say_dropped_at_exit, exitpriority=10)
        threading.Thread(target=self._say_dropped_once_taken, name="shmvec-log-dropped", daemon=True).start()

    def _say_dropped_once_taken(self) -> None:
        """Wait, asleep, until the relay has room again, then send the notice of the records dropped."""
        poller = select.poll()
        poller.register(self.sock, select.POLLOUT)
        while True:
            events = poller.poll()
            with self._lock:
                gone = any(event & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, event in events)
                if gone or self._closed or not self.dropped or self._send_notice(wait=0.0):
                    self._notice_waits = False
                    return

    def _say_dropped_at_exit(self) -> None:
        """The notice as this process exits; on its stderr if the relay still has no room (nothing after it)."""
        if self._say_dropped(wait=SEND_WAIT) or not self.dropped:
            return
        try:
            sys.stderr.write(
                f"shmvec: {self.dropped:,} log records of worker process {os.getpid()} were dropped: the main "
                f"process's log handlers did not take them before the worker exited\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # no stderr left to say it on
            pass

    def _say_dropped(self, wait: float) -> bool:
        """Send the notice of the records dropped, if any; False if the relay has no room within ``wait``."""
        with self._lock:
            return not self.dropped or self._send_notice(wait)

    def _send_notice(self, wait: float) -> bool:
        # Counted as said before the send: a handler that logs inside it must not say it again.
        count, self.dropped = self.dropped, 0
        note = logging.makeLogRecord(
            {
                "name": "shmvec",
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": f"shmvec: {count:,} log records of worker process {os.getpid()} were dropped: the "
                f"main process's log handlers did not take them within {SEND_WAIT:g} s",
            }
        )
        if not self._send(pickle.dumps(note), wait):
            self.dropped += count
            return False
        return True

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
                self._closed = True
                return False


def datagram(record: logging.LogRecord) -> bytes:
    """``record`` pickled in at most :data:`MAX_RECORD_BYTES` (see the module docstring).

    Bounded work whatever the record holds: a record too large for one datagram is pickled again
    for at most :data:`_CUT_ROUNDS` rounds, each halving the message's limit and that of its large
    ``extra=`` attributes (strings cut, other values sent as their repr, cut); one still too large
    then travels bare: its extra attributes dropped (named in its message), its message and
    logging's own attributes cut short enough that it fits whatever characters they hold.
    """
    _settle(record)
    message = record.msg
    if len(message) <= MAX_MESSAGE_CHARS:  # the common case: pickled once
        data = _dumps_or_none(record)
        if data is not None and len(data) <= MAX_RECORD_BYTES:
            return data
    extras = {name: value for name, value in vars(record).items() if name not in _STANDARD}
    _keep_standard_picklable(record)
    sizes = {name: len(data) if (data := _dumps_or_none(value)) is not None else None for name, value in extras.items()}
    reprs: dict[str, str] = {}
    for cut_round in range(_CUT_ROUNDS):
        extra_limit = _EXTRA_CHARS >> max(cut_round - 1, 0)  # round 0 keeps whole the extras that pickle
        for name, value in extras.items():
            size = sizes[name]
            if type(value) is str and cut_round:  # stays a string
                value = _cut(value, extra_limit)
            elif size is None or (cut_round and size > extra_limit):
                if name not in reprs:
                    reprs[name] = _safe_repr(value)
                value = _cut(reprs[name], extra_limit)
            setattr(record, name, value)
        record.msg = record.message = _cut(message, MAX_MESSAGE_CHARS >> cut_round)
        data = _dumps_or_none(record)
        if data is not None and len(data) <= MAX_RECORD_BYTES:
            return data
    return pickle.dumps(_bare(record, message, list(extras)))


def _settle(record: logging.LogRecord) -> None:
    """Give ``record`` its whole message as a string, as ``QueueHandler.prepare`` does (which leaves
    nothing to do); a record handed in raw has its args, exception and stack folded in too."""
    if record.args is None and type(record.msg) is str and getattr(record, "message", None) is record.msg:
        record.stack_info = None  # prepared: its stack is in the message already (3.11's prepare leaves it set)
    elif type(record.msg) is not str or record.args or record.exc_info or record.exc_text or record.stack_info:
        try:
            text = _PLAIN.format(record)
        except Exception as exc:  # args that do not fit the message: say what there was
            text = f"{_safe_repr(record.msg)} % {_safe_repr(record.args)} (could not be formatted: {_safe_repr(exc)})"
        record.msg = text
        record.args = record.exc_info = record.exc_text = record.stack_info = None
    record.message = record.msg


def _keep_standard_picklable(record: logging.LogRecord) -> None:
    """A filter may have set logging's own attributes to anything: those that do not pickle become their repr."""
    for name, value in list(vars(record).items()):
        if name in _STANDARD and _dumps_or_none(value) is None:
            setattr(record, name, _cut(_safe_repr(value), _EXTRA_CHARS))


def _bare(record: logging.LogRecord, message: str, dropped: list[str]) -> logging.LogRecord:
    """``record`` with only logging's own attributes, each a short string or a number, and its message
    cut short: at most ~30 KB pickled, whatever characters they hold."""
    fields: dict[str, Any] = {}
    for name, value in vars(record).items():
        if name not in _STANDARD:
            continue
        if type(value) is str:
            value = _cut(value, _BARE_FIELD_CHARS)
        elif not (value is None or type(value) in (bool, float) or (type(value) is int and value.bit_length() <= 64)):
            value = _cut(_safe_repr(value), _BARE_FIELD_CHARS)
        fields[name] = value
    text = _cut(message, _BARE_MESSAGE_CHARS)
    if dropped:
        names = _cut(", ".join(dropped), _BARE_FIELD_CHARS)
        text += f"\n[... shmvec's log relay dropped {len(dropped):,} extra attributes to fit: {names} ...]"
    fields["msg"] = fields["message"] = text
    fields["args"] = None  # its repr, "()", would make getMessage() raise
    return logging.makeLogRecord(fields)


def _cut(text: str, limit: int) -> str:
    """``text``, or its first and last parts with a marker between them that says how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = text[len(text) - (limit - head) :]
    return f"{text[:head]}\n[... shmvec's log relay cut {len(text) - limit:,} characters ...]\n{tail}"


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a filter here may have set args that do not fit
        return _safe_repr(record.msg)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a repr that raises: say what it was
        return f"<{type(value).__qualname__} object (its repr raised {type(exc).__name__})>"


def _dumps_or_none(obj: Any) -> bytes | None:
    try:
        return pickle.dumps(obj)
    except Exception:  # a lock, a generator, a class that does not pickle
        return None


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
