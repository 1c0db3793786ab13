"""Unit tests of shmvec.ipc.signals.Signal: posts, waits, timeouts, and when a wait spins.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test.
"""

from __future__ import annotations

import os

import pytest

from shmvec.ipc import signals as sync


@pytest.fixture
def signals():
    """``signals(max_spin)``: a new owned Signal, closed at teardown."""
    made = []

    def create(max_spin: float = 0.0) -> sync.Signal:
        made.append(sync.Signal.create(max_spin))
        return made[-1]

    yield create
    for signal in made:
        signal.close()


def sem_file(signal: sync.Signal) -> str:
    return os.path.join("/dev/shm", "sem." + signal.name.lstrip("/"))


def test_signal_post_then_wait(signals):
    signal = signals()
    assert signal.name.startswith(f"/shmvec_{os.getpid()}_sem_")
    signal.post()
    assert signal.wait(1.0) is True
    assert signal.wait(0.05) is False  # the one post was taken


@pytest.mark.parametrize("max_spin", [0.0, 0.01])
def test_signal_wait_times_out_with_false(signals, max_spin):
    assert signals(max_spin).wait(0.05) is False


def test_signal_drain_counts_pending_posts(signals):
    signal = signals()
    assert signal.drain() == 0
    for _ in range(3):
        signal.post()
    assert signal.drain() == 3
    assert signal.wait(0.0) is False


def test_signal_close_unlinks_once_and_is_idempotent():
    signal = sync.Signal.create()
    assert os.path.exists(sem_file(signal))
    signal.close()
    assert not os.path.exists(sem_file(signal))
    signal.close()  # idempotent


def test_signal_open_by_name_shares_the_semaphore(signals):
    owner = signals()
    other = sync.Signal.open(owner.name)
    try:
        owner.post()
        assert other.wait(1.0) is True
        other.post()
        assert owner.wait(1.0) is True
    finally:
        other.close()
    assert os.path.exists(sem_file(owner))  # only the owner unlinks
    other.close()  # idempotent too


class FakeTime:
    """Stands in for sync's clock and sched_yield, so that spin learning is deterministic:
    each yield advances the clock by ``step`` seconds and then, unless ``late``, posts
    ``signal``, as a peer answering after ``step`` would (a spinning wait takes that post
    right after the yield). With ``late`` the peer answers only once the wait blocks."""

    def __init__(self, monkeypatch, signal: sync.Signal, step: float, late: bool = False):
        self.now, self.step, self.signal, self.yields, self.late = 100.0, step, signal, 0, late
        monkeypatch.setattr(sync, "_perf_counter", lambda: self.now)
        monkeypatch.setattr(sync, "_sched_yield", self.sched_yield)
        if late:
            monkeypatch.setattr(signal, "_sem", AnswerWhenBlocked(signal._sem))

    def sched_yield(self) -> None:
        self.yields += 1
        self.now += self.step
        if not self.late:
            self.signal.post()


class AnswerWhenBlocked:
    """A semaphore whose peer posts just as a waiter blocks on it (a wait longer than any spin)."""

    def __init__(self, sem):
        self.sem = sem

    def __getattr__(self, name: str):  # value, unlink, close, ...
        return getattr(self.sem, name)

    def acquire(self, timeout: float | None = None) -> None:
        if timeout != 0:
            self.sem.release()
        self.sem.acquire(timeout)


def test_signal_spins_while_waits_end_within_its_bound(monkeypatch, signals):
    signal = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, signal, step=10e-6)  # the peer answers within 10 µs
    for _ in range(60):
        assert signal.wait(1.0) is True
    assert clock.yields == 60  # every wait spun (and was answered while spinning)
    assert (signal._hits, signal._spin) == (1.0, 1e-3)


def test_signal_stops_spinning_after_a_run_of_long_waits_not_after_one(monkeypatch, signals):
    signal = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, signal, step=10e-3, late=True)  # the peer takes 10 ms: beyond max_spin
    assert signal.wait(1.0) is True
    assert signal._spin == 1e-3  # one long wait (a hiccup): still spinning
    assert signal.wait(1.0) is True
    assert signal.wait(1.0) is True
    assert signal._spin == 0.0  # three in a row: blocking
    clock.step, clock.late = 10e-6, False
    for _ in range(sync.PROBE_EVERY * 3):  # short waits again: probes see it and turn spinning back on
        assert signal.wait(1.0) is True
    assert signal._spin == 1e-3


def test_signal_takes_a_pending_post_at_once_and_learns_nothing(monkeypatch, signals):
    signal = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, signal, step=10e-6)
    signal.post()
    assert signal.wait(1.0) is True
    assert clock.yields == 0
    assert (signal._hits, signal._spin) == (1.0, 1e-3)


def test_signal_spins_as_told_for_one_wait_and_learns_nothing(monkeypatch, signals):
    signal = signals(max_spin=0.0)  # would never spin on its own
    clock = FakeTime(monkeypatch, signal, step=10e-6)
    assert signal.wait(1.0, spin=1e-3) is True
    assert clock.yields == 1
    spinning = signals(max_spin=1e-3)
    clock = FakeTime(monkeypatch, spinning, step=10e-6, late=True)
    assert spinning.wait(1.0, spin=0.0) is True  # told to block: no spin
    assert clock.yields == 0 and (spinning._hits, spinning._spin) == (1.0, 1e-3)


def test_signal_with_no_spin_never_spins(monkeypatch, signals):
    signal = signals(max_spin=0.0)
    clock = FakeTime(monkeypatch, signal, step=1e-6)
    assert signal.wait(0.02) is False
    assert clock.yields == 0
