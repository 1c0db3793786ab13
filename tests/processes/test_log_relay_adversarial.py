"""Generated records thrown at the log relay's sender (:func:`shmvec.processes.log_relay.datagram`):
any message length and character width, any number and size of ``extra=`` attributes (some that
do not pickle, some whose repr raises), args that do not fit the message, an exception, a huge
logger name. Whatever comes in, ``datagram`` returns after a bounded number of picklings, its
output fits one datagram and unpickles to a ``LogRecord``, and whatever was cut or dropped says so.

A pure function: each example costs milliseconds. The end-to-end case (a worker's env logging such
a record) is in tests/processes/test_log_relay.py.
"""

from __future__ import annotations

import logging
import logging.handlers
import pickle
import sys
import threading
import types
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmvec.processes import log_relay

CUT = "shmvec's log relay cut"
DROPPED = "shmvec's log relay dropped"

# Code points of each UTF-8 width, and lone surrogates (file names decoded with surrogateescape).
WIDTHS = {
    "ascii": (0x20, 0x7E),
    "two bytes": (0x80, 0x7FF),
    "three bytes": (0x800, 0xD7FF),
    "four bytes": (0x10000, 0x10FFFF),
    "surrogates": (0xD800, 0xDFFF),
}


class ReprRaises:
    def __repr__(self):
        raise RuntimeError("no repr")


class NeitherPicklesNorReprs(ReprRaises):
    def __reduce__(self):
        raise TypeError("no pickle")


def text(width: str, length: int, seed: int) -> str:
    """``length`` characters of ``width``, distinct for each ``seed`` (pickle would share equal strings)."""
    low, high = WIDTHS[width]
    chunk = "".join(chr(low + (seed * 7919 + i * 104729) % (high - low + 1)) for i in range(64))
    return (chunk * (length // len(chunk) + 1))[:length]


def extra_value(kind: str, width: str, size: int, seed: int):
    if kind == "text":
        return text(width, size, seed)
    if kind == "bytes":
        return bytes([seed % 256]) * size + seed.to_bytes(4, "little")
    if kind == "list":
        return list(range(seed, seed + size // 4))
    if kind == "lock":  # does not pickle
        return threading.Lock()
    if kind == "repr raises":  # pickles, but a cut would need its repr
        return [ReprRaises(), text(width, size, seed)]
    return NeitherPicklesNorReprs()


KINDS = ["text", "bytes", "list", "lock", "repr raises", "neither"]

extras = st.lists(
    st.tuples(st.sampled_from(KINDS), st.sampled_from(list(WIDTHS)), st.integers(0, 20_000)),
    max_size=80,
)


class CountingPickle(types.SimpleNamespace):
    """``pickle`` as the sender sees it, failing past ``limit`` calls of ``dumps``: a loop that does not
    end fails the test instead of hanging it."""

    def __init__(self, limit: int):
        super().__init__(loads=pickle.loads, PicklingError=pickle.PicklingError, calls=0, limit=limit)

    def dumps(self, obj, *args, **kwargs):
        self.calls += 1
        if self.calls > self.limit:
            raise AssertionError(f"datagram() pickled {self.calls} times: a cut that does not end")
        return pickle.dumps(obj, *args, **kwargs)


def make_record(message, args, exc_info, name, extra: dict, prepared: bool) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.INFO, __file__, 1, message, args, exc_info)
    record.__dict__.update(extra)
    return logging.handlers.QueueHandler(None).prepare(record) if prepared else record  # as a worker's are


def send(record: logging.LogRecord, n_extras: int) -> logging.LogRecord:
    with mock.patch.object(log_relay, "pickle", CountingPickle(limit=64 + 2 * n_extras)):  # more than needed
        data = log_relay.datagram(record)
    assert len(data) <= log_relay.MAX_RECORD_BYTES
    received = pickle.loads(data)
    assert isinstance(received, logging.LogRecord)
    return received


def assert_cuts_are_marked(received: logging.LogRecord, message: str, extra: dict) -> None:
    """What did not arrive whole says so: the message its cut, a dropped attribute in the message."""
    arrived = received.getMessage()
    if not arrived.startswith(message):
        assert CUT in arrived, arrived[:300]
    for name, value in extra.items():
        if name not in vars(received):
            assert DROPPED in arrived, (name, arrived[-300:])
        elif isinstance(value, str) and received.__dict__[name] != value:
            assert CUT in received.__dict__[name]


try:
    raise ValueError("an env's error")
except ValueError:
    EXC_INFO = sys.exc_info()


@given(
    width=st.sampled_from(list(WIDTHS)),
    length=st.integers(0, 300_000),
    extra_specs=extras,
    formatting=st.sampled_from(["plain", "args", "args that fail", "exc_info"]),
    prepared=st.booleans(),
    name_length=st.sampled_from([5, 30_000, 100_000]),  # logging's own attributes too large: the record travels bare
)
def test_any_record_fits_one_datagram_after_bounded_work(width, length, extra_specs, formatting, prepared, name_length):
    message = text(width, length, seed=length)
    args, exc_info = None, None
    if formatting == "args":
        message, args = message.replace("%", "%%") + " %s", ("arg",)
    elif formatting == "args that fail":
        message, args = message + " %d %d", ("not a number",)
    elif formatting == "exc_info":
        exc_info = EXC_INFO
    extra = {f"x{i}": extra_value(kind, w, size, seed=i) for i, (kind, w, size) in enumerate(extra_specs)}
    if prepared and formatting == "args that fail":
        prepared = False  # QueueHandler.prepare would raise: no record reaches the sender
    record = make_record(message, args, exc_info, "probe." + text(width, name_length, seed=1), extra, prepared)
    received = send(record, len(extra))
    assert received.args is None and received.exc_info is None
    if formatting == "plain":
        assert_cuts_are_marked(received, message, extra)
    if formatting == "args that fail":
        assert "could not be formatted" in received.getMessage()
    if formatting == "exc_info" and len(message) < 1000 and name_length < 1000 and not extra:
        assert received.getMessage().endswith("ValueError: an env's error")


@pytest.mark.parametrize(
    "message, extra",
    [
        ("\u00e9" * 40_000, {"blob": "b" * 2_000}),
        ("\u4e2d" * 25_000, {"blob": "b" * 2_000}),
        ("short", {f"x{i}": str(i) * 1_500 for i in range(60)}),
        ("short", {f"x{i}": str(i) for i in range(20_000)}),
    ],
    ids=["2-byte text and a 2 KB extra", "CJK text and a 2 KB extra", "60 extras of 1.5 KB", "20,000 small extras"],
)
def test_records_that_once_made_the_sender_loop_forever(message, extra):
    record = make_record(message, None, None, "probe", extra, prepared=True)
    received = send(record, len(extra))
    assert_cuts_are_marked(received, message, extra)
    assert received.getMessage().startswith(message[:1000])
