"""The workers' log records in the main process: long ones cut with a marker, never lost; a main-process
filter or handler that raises neither ends the relay nor blocks the workers; a relay that does not
keep up costs a worker a bounded wait, then records dropped and counted; each record reaches each
handler once, under every start method.

The envs (tests/logging_envs.py) log from their worker; the records come back through
:class:`shmvec.processes.log_relay.LogRelay`, whose last ones are in once ``close()`` returns.
"""

from __future__ import annotations

import functools
import logging
import logging.handlers
import multiprocessing as mp
import pickle
import socket
import threading
import time

import numpy as np
import pytest

from shmvec import ShmVectorEnv
from shmvec.processes import log_relay
from tests.helpers import pool_pids
from tests.logging_envs import LoggingEnv

CUT_AT = 50_000  # the documented longest message a worker's record keeps (docs/process.md)
LENGTHS = (1_000, 40_000, 70_000, 100_000, 300_000)
START_METHODS = [method for method in ("fork", "forkserver", "spawn") if method in mp.get_all_start_methods()]


class Collected(logging.Handler):
    """Keeps the records it is handed."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


class Stuck(Collected):
    """A handler of the main process that takes no record until ``release`` is set."""

    def __init__(self, release: threading.Event):
        super().__init__()
        self.release = release

    def emit(self, record):
        self.release.wait(60)
        super().emit(record)


@pytest.fixture
def probe_logs():
    """A :class:`Collected` handler on logger ``probe`` at INFO, removed afterwards."""
    logger, handler = logging.getLogger("probe"), Collected()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_long_records_arrive_cut_with_a_marker_never_lost(probe_logs, closing):
    envs = closing(ShmVectorEnv([LoggingEnv], n_workers=1))
    for length in LENGTHS:
        envs.call("shout", length)
    envs.close()  # the relay takes the workers' last records
    shouts = [message for message in probe_logs.messages() if not message.startswith("reset in")]
    assert [message.split(":", 1)[0] for message in shouts] == [str(length) for length in LENGTHS]
    for length, message in zip(LENGTHS, shouts):
        whole = f"{length}:" + "x" * length
        if len(whole) <= CUT_AT:
            assert message == whole
        else:
            assert f"[... shmvec's log relay cut {len(whole) - CUT_AT:,} characters ...]" in message, message[:200]
            assert len(message) < CUT_AT + 200 and message.endswith("x" * 1000)
    assert log_relay.MAX_MESSAGE_CHARS == CUT_AT


def test_a_record_too_long_for_one_datagram_in_any_form_is_cut_in_the_sender():
    """Non-ASCII text (4 bytes a character) and big extra attributes are cut further; unpicklable extras
    travel as their repr; nothing raises."""
    sent = []

    class Socket:
        def send(self, data, flags=0):
            sent.append(data)

    sender = log_relay.RecordSender(Socket())
    for message, extra in (
        ("\U0001f600" * 40_000, {}),
        ("short", {"blob": "b" * 200_000}),
        ("lock", {"lock": threading.Lock()}),
    ):
        record = logging.LogRecord("probe", logging.INFO, __file__, 1, message, None, None)
        record.message = message  # as QueueHandler.prepare leaves it
        record.__dict__.update(extra)
        sender.put_nowait(record)
    assert len(sent) == 3 and all(len(data) <= log_relay.MAX_RECORD_BYTES for data in sent)


def test_a_record_too_large_for_a_datagram_in_every_way_leaves_the_logging_call_and_arrives_cut(probe_logs, closing):
    """Two-byte text and an ``extra=`` attribute, both too large: a cut that never ends would show as
    the call's timeout (the worker spinning inside one ``logging`` call)."""
    envs = closing(ShmVectorEnv([LoggingEnv], n_workers=1, timeout=10))
    (pid,) = envs.call("wide")
    envs.close()
    (record,) = [record for record in probe_logs.records if record.getMessage().startswith("wide:")]
    message = record.getMessage()
    assert "shmvec's log relay cut" in message and message.endswith("\u00e9" * 1000), message[:200]
    assert record.blob.startswith("bbb") and "shmvec's log relay cut" in record.blob  # a string stays one
    assert record.process == pid


def test_the_count_of_dropped_records_is_sent_once_the_relay_has_room_again(monkeypatch):
    """Without the worker logging again: a thread of its sends the count as the relay takes records."""
    monkeypatch.setattr(log_relay, "SEND_WAIT", 0.01)
    read, write = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        read.settimeout(20)  # a notice that never comes fails the test
        sender, queued = log_relay.RecordSender(write), 0
        while sender._send(b"filler", 0.0):
            queued += 1
        for _ in range(3):
            sender.put_nowait(logging.makeLogRecord({"msg": "lost"}))
        assert sender.dropped == 3
        for _ in range(queued):
            assert read.recv(1 << 18) == b"filler"
        note = pickle.loads(read.recv(1 << 18))
        assert note.name == "shmvec" and note.getMessage().startswith("shmvec: 3 log records of worker process")
        assert sender.dropped == 0
    finally:
        read.close()
        write.close()


class Raising(logging.Filter):
    """A filter that expects what a ``LoggerAdapter`` of the main process adds."""

    def filter(self, record):
        return record.request_id is not None


def test_a_main_process_filter_that_raises_neither_ends_the_relay_nor_blocks_the_workers(probe_logs, closing, capsys):
    noisy, handler = logging.getLogger("probe.noisy"), Collected()
    handler.addFilter(Raising())
    noisy.addHandler(handler)
    try:
        env_fns = [functools.partial(LoggingEnv, per_step=100, size=1000)] * 2
        envs = closing(ShmVectorEnv(env_fns, n_workers=2, timeout=20))  # a hang fails the test
        envs.reset()
        for _ in range(20):  # 4,000 records of ~1 KB: far more than a socket buffer holds
            envs.step(np.zeros(2, np.int64))
        envs.reset()
        pids = pool_pids(envs)
        envs.close()
    finally:
        noisy.removeHandler(handler)
    resets = [message for message in probe_logs.messages() if message.startswith("reset in")]
    assert sorted(resets) == sorted(f"reset in {pid}" for pid in pids * 2)  # the relay went on
    err = capsys.readouterr().err
    assert err.count("--- Logging error in shmvec's log relay ---") == 1, err[-3000:]  # reported once, not per record
    assert "request_id" in err


def test_a_relay_that_does_not_keep_up_costs_workers_a_bounded_wait_then_counted_drops(probe_logs, closing):
    noisy, shmvec_logger, release = logging.getLogger("probe.noisy"), logging.getLogger("shmvec"), threading.Event()
    sent = 5 * 2000

    stuck, notes = Stuck(release), Collected()
    noisy.addHandler(stuck)
    shmvec_logger.addHandler(notes)
    try:
        envs = closing(ShmVectorEnv([functools.partial(LoggingEnv, per_step=2000, size=1000)], n_workers=1, timeout=30))
        envs.reset()
        for _ in range(5):  # 10,000 records of ~1 KB against a relay stuck on the first: a hang fails the test
            envs.step(np.zeros(1, np.int64))
        release.set()
        taken = -1
        while taken != len(stuck.records):  # the relay drains what it holds: then a record has room again
            taken = len(stuck.records)
            time.sleep(0.2)
        envs.reset()  # a record that goes through: the count of those dropped is sent with it
        (pid,) = pool_pids(envs)
        envs.close()
    finally:
        release.set()
        noisy.removeHandler(stuck)
        shmvec_logger.removeHandler(notes)
    (note,) = [message for message in notes.messages() if "dropped" in message]
    dropped = int(note.split(" log records")[0].rsplit(" ", 1)[-1].replace(",", ""))
    assert f"worker process {pid}" in note
    assert 0 < dropped < sent and dropped + len(stuck.records) == sent, (note, len(stuck.records))
    assert f"reset in {pid}" in probe_logs.messages()


def test_the_count_of_dropped_records_arrives_though_the_worker_logs_nothing_more(probe_logs, closing):
    noisy, shmvec_logger, release = logging.getLogger("probe.noisy"), logging.getLogger("shmvec"), threading.Event()
    sent = 10_000  # records of ~1 KB: more than the socket buffer holds

    stuck, notes = Stuck(release), Collected()
    noisy.addHandler(stuck)
    shmvec_logger.addHandler(notes)
    try:
        envs = closing(ShmVectorEnv([functools.partial(LoggingEnv, size=1000)], n_workers=1, timeout=30))
        envs.call("burst", sent)  # against a relay stuck on the first record; then the worker logs nothing
        release.set()
        (pid,) = pool_pids(envs)
        envs.close()  # the relay takes the workers' last records
    finally:
        release.set()
        noisy.removeHandler(stuck)
        shmvec_logger.removeHandler(notes)
    (note,) = [message for message in notes.messages() if "dropped" in message]
    dropped = int(note.split(" log records")[0].rsplit(" ", 1)[-1].replace(",", ""))
    assert f"worker process {pid}" in note
    assert 0 < dropped < sent and dropped + len(stuck.records) == sent, (note, len(stuck.records))


@pytest.mark.parametrize("propagate", [True, False])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_each_worker_record_reaches_each_handler_once(start_method, propagate, tmp_path, closing):
    probe, root = logging.getLogger("probe"), logging.getLogger()
    on_probe, on_root = logging.FileHandler(tmp_path / "probe.log"), logging.FileHandler(tmp_path / "root.log")
    level = probe.level
    probe.addHandler(on_probe)
    root.addHandler(on_root)
    probe.setLevel(logging.INFO)
    probe.propagate = propagate
    try:
        envs = closing(ShmVectorEnv([LoggingEnv] * 2, n_workers=2, start_method=start_method))
        envs.reset()
        pids = pool_pids(envs)
        envs.close()
    finally:
        probe.propagate = True
        probe.setLevel(level)
        for logger, handler in ((probe, on_probe), (root, on_root)):
            logger.removeHandler(handler)
            handler.close()
    expected = sorted(f"reset in {pid}" for pid in pids)
    assert sorted((tmp_path / "probe.log").read_text().splitlines()) == expected
    in_root = [line for line in (tmp_path / "root.log").read_text().splitlines() if line.startswith("reset in")]
    assert sorted(in_root) == (expected if propagate else [])


def test_a_record_logged_by_a_signal_handler_while_a_send_holds_the_lock_does_not_deadlock():
    """A handler that logs runs between two bytecodes of the thread it interrupts, which may hold the
    sender's lock (its notice waiting for room): the inner call must neither wait on it nor lose the record."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender = log_relay.RecordSender(ours)
    sender.dropped = 3  # the notice is due: the next record takes the lock to send it first
    send, nested = sender._send, []

    def send_with_a_handler_inside(data, wait):
        if not nested:  # what a SIGALRM handler that logs does in the middle of this send
            nested.append(True)
            sender.put_nowait(logging.makeLogRecord({"msg": "from the handler"}))
        return send(data, wait)

    sender._send = send_with_a_handler_inside
    done = threading.Thread(target=sender.put_nowait, args=(logging.makeLogRecord({"msg": "outer"}),), daemon=True)
    try:
        done.start()
        done.join(10)
        assert not done.is_alive(), "the record logged from inside a send waited forever on the sender's lock"
        theirs.setblocking(False)
        messages = []
        while True:
            try:
                messages.append(pickle.loads(theirs.recv(70_000)).getMessage())
            except BlockingIOError:
                break
        notices = [message for message in messages if message.startswith("shmvec: 3 log records")]
        assert len(notices) == 1, messages  # said once, though the handler's record came inside its send
        assert messages.index(notices[0]) < messages.index("outer")
        assert sorted(set(messages) - set(notices)) == ["from the handler", "outer"]
    finally:
        ours.close()
        theirs.close()


def test_a_record_sent_bare_formats_in_the_main_process():
    """The bare form (extras dropped to fit) must still be a record logging can format."""
    record = logging.makeLogRecord({"name": "env", "msg": "short"})
    for i in range(40):  # extra names are never cut: long ones leave only the bare form
        setattr(record, f"extra_{i}_" + "k" * 2_000, "v")
    data = log_relay.datagram(record)
    assert len(data) <= log_relay.MAX_RECORD_BYTES
    arrived = pickle.loads(data)
    message = arrived.getMessage()  # raised TypeError: its args were the string "()"
    # 40, and what a record factory of this process adds to every record (Ray's adds a time stamp)
    extra = 40 + len(set(vars(logging.makeLogRecord({}))) - log_relay._STANDARD)
    assert message.startswith("short") and f"dropped {extra} extra attributes" in message
    assert logging.Formatter().format(arrived).startswith("short")


def test_a_prepared_record_with_its_stack_carries_the_stack_once():
    """QueueHandler.prepare puts the stack in the message (Python 3.11 leaves stack_info set too)."""
    stack = "Stack (most recent call last):\n  here"
    record = logging.getLogger("env").makeRecord("env", logging.WARNING, __file__, 1, "look", (), None, sinfo=stack)
    prepared = logging.handlers.QueueHandler(None).prepare(record)
    arrived = pickle.loads(log_relay.datagram(prepared))
    assert logging.Formatter().format(arrived).count("Stack (most recent call last)") == 1


def test_the_count_of_dropped_records_goes_to_stderr_if_the_relay_has_no_room_at_exit(monkeypatch, capsys):
    """A worker that exits while the main process's handlers are stuck: the count is not lost silently."""
    monkeypatch.setattr(log_relay, "SEND_WAIT", 0.01)
    read, write = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sender = log_relay.RecordSender(write)
        while sender._send(b"filler", 0.0):
            pass
        sender._notice_waits = True  # no thread to send it later: only the exit is left
        sender._exit_notice = True
        for _ in range(4):
            sender.put_nowait(logging.makeLogRecord({"msg": "lost"}))
        sender._say_dropped_at_exit()
        assert "shmvec: 4 log records of worker process" in capsys.readouterr().err
    finally:
        read.close()
        write.close()
