"""Ctrl-C at any instant (``shmvec.ipc.interrupts``), and one deadline per step.

- A storm (``ctrl_c_storm.py``): another process sends SIGINT every 0.1-1 ms to a process
  that steps 12 CartPoles with 4 workers (the main process posts each) and 12 (a step tree):
  sync and async batches of a ShmVectorEnv, sync steps with a main shard (where a Ctrl-C
  raises in the envs' code), and the ShmPool under it (as SB3's adapter drives it), with an
  idle helper thread (the kernel may deliver SIGINT to it: what ``pthread_sigmask`` could not
  cover) and without; SIGINT's handler is Python's default or one of the script's own. After
  each interrupt it steps on, comparing every step that returned with ``SyncVectorEnv``
  (re-synchronized by a seeded reset after each interrupt: an interrupted step may or may not
  have run). Each storm runs
  in its own process, so that a hang (a watchdog: the subprocess timeout) or an interrupt
  escaping the storm's own loop cannot touch pytest's; that process reports what it counted.
- The held interrupt itself: handed to the caller's handler (any Python function) where the call
  ends or a wait allows, once per Ctrl-C, the handler left as the caller's handlers chose.
- A step of a tree pool times out after ``timeout``, not after a fresh ``timeout`` per wait.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmvec import ShmVectorEnv, StepTimeoutError
from shmvec.ipc import interrupts
from tests.faulty import FaultyEnv
from tests.helpers import REPO

STORM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctrl_c_storm.py")

# Python's own SIGINT handler in every test, even when pytest was started with SIGINT ignored (a background job)
pytestmark = pytest.mark.usefixtures("default_sigint")


STORM_SECONDS = 2.0  # >= 1,300 interrupts, ~200 steps a storm on the 2-core VM at a load of 4 (floors: 75, 15)


def run_storm(n_workers: int, mode: str, helper: bool, handler: str) -> dict:
    args = [sys.executable, STORM, str(n_workers), mode, str(int(helper)), handler, str(STORM_SECONDS)]
    try:
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:  # the watchdog: a hang
        pytest.fail(f"the storm hung: {exc.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Each layout meets one of SIGINT's handlers: Python's default; ``flag`` (the first Ctrl-C sets a flag, every
# later one raises KeyboardInterrupt: asyncio.run's rule); ``pair`` (two that replace each other, one returns,
# one raises an exception that is not a KeyboardInterrupt). Each handler meets sync and async steps, the pool
# itself, and the main shard (where the handler runs in the envs' code) or SB3's adapter.
@pytest.mark.parametrize(
    "n_workers, mode, helper, handler",
    [(4, "sync", True, "default"), (12, "sync", True, "flag"), (4, "async", True, "pair")]
    + [(12, "async", True, "default"), (4, "engine", False, "default"), (12, "engine", True, "pair")]
    + [(12, "sb3", True, "flag"), (2, "main", True, "default"), (2, "main", True, "pair")],
    ids=lambda value: {2: "two", 4: "flat", 12: "tree", True: "thread", False: "no-thread"}.get(value, value),
)
def test_a_ctrl_c_storm_leaves_every_step_right_and_sigint_as_it_was(n_workers, mode, helper, handler):
    if mode == "sb3":
        pytest.importorskip("stable_baselines3")
    report = run_storm(n_workers, mode, helper, handler)
    assert not report["errors"], report
    # the storm hit, and steps went on (on 2 busy cores, 12 workers and the sender get little time: a loaded
    # machine once gave ~300 interrupts and 54-95 steps in 4 s; ``pair`` raises at every other Ctrl-C only)
    assert report["interrupts"] >= 75 and report["steps"] >= 15, report
    assert report["mismatches"] == 0, report
    assert not any(report["sigint_blocked"].values()), report
    assert report["handler_as_installed"], report  # the script's handler: its last choice, never the pool's


# ---- the held interrupt -------------------------------------------------------------------------


def test_a_ctrl_c_during_a_call_is_raised_as_it_ends():
    steps = []

    @interrupts.holding
    def call():
        signal.raise_signal(signal.SIGINT)  # the handler runs at once: it only records it
        steps.append(signal.getsignal(signal.SIGINT))
        assert interrupts.held()

    with pytest.raises(KeyboardInterrupt):
        call()
    assert steps and steps[0] is not signal.default_int_handler  # it was held...
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # ...and the default is back
    assert not interrupts.held()


class Stop(Exception):
    """A SIGINT handler's own exception (not a KeyboardInterrupt)."""


def test_a_handler_of_the_callers_own_is_held_and_runs_once_per_ctrl_c_as_the_call_ends():
    seen = []

    def own(signum, frame):
        seen.append(("own", signum, frame.f_code.co_name))
        save()  # a call into a pool from the handler (a checkpoint's env.call) is held on its own

    @interrupts.holding
    def save():
        assert signal.getsignal(signal.SIGINT) is not own

    @interrupts.holding
    def call():
        for _ in range(3):
            signal.raise_signal(signal.SIGINT)
        seen.append(signal.getsignal(signal.SIGINT))
        return "done"

    previous = signal.signal(signal.SIGINT, own)
    try:
        assert call() == "done"  # a handler that returns lets the call return
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen[0] is not own  # held...
    # ...then run once per Ctrl-C, in the caller's frame, as if they came right after the call returned
    assert (
        seen[1:]
        == [
            (
                "own",
                signal.SIGINT,
                "test_a_handler_of_the_callers_own_is_held_and_runs_once_per_ctrl_c_as_the_call_ends",
            )
        ]
        * 3
    )


def test_a_raising_handler_raises_once_as_the_call_ends_and_the_next_call_holds_afresh():
    runs = []

    def own(signum, frame):
        runs.append(signum)
        raise Stop

    @interrupts.holding
    def call(n):
        for _ in range(n):
            signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, own)
    try:
        with pytest.raises(Stop):
            call(3)
        assert runs == [signal.SIGINT]  # the first exception ends the delivery: the other two are dropped
        call(0)
        assert runs == [signal.SIGINT]  # nothing left over for the next call
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_handler_that_replaces_itself_during_a_call_is_held_and_left_in_place():
    """A wait hands a held Ctrl-C to the handler (raise_held); it installs another, which is held in turn."""
    seen = []

    def second(signum, frame):
        seen.append("second")
        raise Stop

    def first(signum, frame):
        seen.append("first")
        signal.signal(signal.SIGINT, second)

    @interrupts.holding
    def call():
        signal.raise_signal(signal.SIGINT)
        interrupts.raise_held()  # first runs, and returns: the call goes on
        seen.append(signal.getsignal(signal.SIGINT) in (first, second))
        signal.raise_signal(signal.SIGINT)  # held: second must not raise here
        seen.append("after")

    previous = signal.signal(signal.SIGINT, first)
    try:
        with pytest.raises(Stop):
            call()
        assert signal.getsignal(signal.SIGINT) is second  # the one the caller's handler installed
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == ["first", False, "after", "second"]


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL], ids=["ignored", "default-action"])
def test_sigint_ignored_or_left_to_the_kernel_is_not_swapped(disposition):
    seen = []

    @interrupts.holding
    def call():
        seen.append(signal.getsignal(signal.SIGINT))
        if disposition == signal.SIG_IGN:
            signal.raise_signal(signal.SIGINT)  # ignored, during the call as outside it

    previous = signal.signal(signal.SIGINT, disposition)
    try:
        call()
        assert signal.getsignal(signal.SIGINT) == disposition
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [disposition]


BEHAVIOURS = ["returns", "raises", "replaces", "replaces-and-raises", "default"]


@given(
    chain=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=4),
    events=st.lists(st.sampled_from(["sigint", "deliver"]), max_size=12),
)
def test_held_ctrl_cs_reach_the_handler_installed_when_they_are_delivered(chain, events):
    """Any chain of handlers (each returns, raises, or installs the next; ``default`` is Python's), any
    Ctrl-Cs and delivery points (a wait's raise_held) in a call: each Ctrl-C reaches, in order, the
    handler installed when it is delivered, at a delivery point or as the call ends, until one raises
    (the rest are dropped); none runs where it is held, and the handler left is the last one installed."""
    log: list[tuple[int, int]] = []  # (handler, event it ran at: len(events) for the call's end)
    at = [0]

    def make(k: int):
        if chain[k] == "default":
            return signal.default_int_handler

        def handler(signum, frame):
            log.append((k, at[0]))
            if chain[k].startswith("replaces") and k + 1 < len(chain):
                signal.signal(signal.SIGINT, handlers[k + 1])
            if chain[k].endswith("raises"):
                raise Stop

        return handler

    handlers = [make(k) for k in range(len(chain))]

    @interrupts.holding
    def call():
        for at[0], event in enumerate(events):
            if event == "sigint":
                signal.raise_signal(signal.SIGINT)
            else:
                interrupts.raise_held()
        at[0] = len(events)

    # the model
    want_log, want_raised, current, pending = [], None, 0, 0
    for i, event in enumerate([*events, "deliver"]):
        pending += event == "sigint"
        while event == "deliver" and pending and want_raised is None:
            pending, ran = pending - 1, current
            want_log.append((ran, i))
            if chain[ran] == "default":
                want_raised = (KeyboardInterrupt, i)
                break
            if chain[ran].startswith("replaces") and ran + 1 < len(chain):
                current = ran + 1
            if chain[ran].endswith("raises"):
                want_raised = (Stop, i)
        if want_raised is not None:
            break

    previous = signal.signal(signal.SIGINT, handlers[0])
    try:
        raised = None
        try:
            call()
        except (Stop, KeyboardInterrupt) as exc:
            raised = (type(exc), at[0])
        left = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert log == [(k, i) for k, i in want_log if chain[k] != "default"]
    assert raised == want_raised
    assert left is handlers[current]


def test_asyncio_runs_handler_sees_the_ctrl_c_as_the_call_returns():
    """``asyncio.run`` installs its own handler (the first Ctrl-C cancels the main task): held like any other,
    it runs as the pool call returns, and the task is cancelled at its next await, as without the pool."""
    order = []

    @interrupts.holding
    def call():
        signal.raise_signal(signal.SIGINT)
        order.append("call ended")

    async def main():
        call()
        order.append("returned")
        await asyncio.sleep(5)
        order.append("slept")

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert order == ["call ended", "returned"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # asyncio put back the one it found


def test_a_call_from_another_thread_swaps_nothing():
    seen = []

    @interrupts.holding
    def call():
        seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]  # no handler runs in another thread: nothing to swap


def test_a_ctrl_c_still_ends_a_long_wait_and_the_step_after_it_is_right(closing):
    env = closing(ShmVectorEnv([functools.partial(FaultyEnv, wait=0.5)] * 2, 2, start_method="fork", timeout=5.0))
    env.reset(seed=0)
    ctrl_c = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    ctrl_c.start()
    with pytest.raises(KeyboardInterrupt):
        env.step(np.zeros(2, dtype=np.int64))
    elapsed = time.monotonic() - start
    assert elapsed < 0.4, f"raised after {elapsed:.2f} s"  # a slice (0.1 s) after the signal, not the step's end
    obs, rewards, *_ = env.step(np.zeros(2, dtype=np.int64))  # after the interrupted step's answers
    assert (obs == np.float32(0.02)).all() and rewards.tolist() == [1.0, 1.0]  # the second step's, not the first


# ---- one deadline per step ----------------------------------------------------------------------


def test_a_tree_step_times_out_once(closing):
    """Worker 8 (the last posted, waited for first) answers after 1.5 s, worker 0 hangs: ``timeout=2.0``
    raises after ~2 s, not after the last worker's 1.5 s plus a fresh 2 s for the others."""
    fns = [functools.partial(FaultyEnv, "hang", at=1)] + [FaultyEnv] * 7 + [functools.partial(FaultyEnv, wait=1.5)]
    env = closing(ShmVectorEnv(fns, n_workers=9, start_method="fork", timeout=2.0))
    assert env._pool._step_tree is not None
    env.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(StepTimeoutError, match="envs 0"):
        env.step(np.zeros(9, dtype=np.int64))
    elapsed = time.monotonic() - start
    assert 1.9 < elapsed < 3.0, f"raised after {elapsed:.2f} s"
