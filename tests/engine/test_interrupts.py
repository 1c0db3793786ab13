"""Ctrl-C at any instant (``shmvec.ipc.interrupts``), and one deadline per step.

- A storm (``ctrl_c_storm.py``): another process sends SIGINT every 0.1-1 ms to a process
  that steps 12 CartPoles with 4 workers (the main process posts each) and 12 (a step tree):
  sync and async batches of a ShmVectorEnv, sync steps with a main shard (where a Ctrl-C
  raises in the envs' code), and the ShmPool under it (as SB3's adapter drives it), with an
  idle helper thread (the kernel may deliver SIGINT to it: what ``pthread_sigmask`` could not
  cover) and without. After each KeyboardInterrupt it steps on,
  comparing every step that returned with ``SyncVectorEnv`` (re-synchronized by a seeded
  reset after each interrupt: an interrupted step may or may not have run). Each storm runs
  in its own process, so that a hang (a watchdog: the subprocess timeout) or an interrupt
  escaping the storm's own loop cannot touch pytest's; that process reports what it counted.
- The held interrupt itself: raised where the call ends, the handler left as it was found.
- A step of a tree pool times out after ``timeout``, not after a fresh ``timeout`` per wait.
"""

from __future__ import annotations

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

from shmvec import ShmVectorEnv, StepTimeoutError
from shmvec.ipc import interrupts
from tests.faulty import FaultyEnv
from tests.helpers import REPO

STORM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctrl_c_storm.py")


def run_storm(n_workers: int, mode: str, helper: bool) -> dict:
    args = [sys.executable, STORM, str(n_workers), mode, str(int(helper))]
    try:
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:  # the watchdog: a hang
        pytest.fail(f"the storm hung: {exc.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "n_workers, mode, helper",
    [(4, "sync", True), (12, "sync", True), (4, "async", True), (12, "async", True), (4, "engine", False)]
    + [(12, "engine", True), (12, "sb3", True), (2, "main", True)],
    ids=lambda value: {2: "two", 4: "flat", 12: "tree", True: "thread", False: "no-thread"}.get(value, value),
)
def test_a_ctrl_c_storm_leaves_every_step_right_and_sigint_as_it_was(n_workers, mode, helper):
    if mode == "sb3":
        pytest.importorskip("stable_baselines3")
    report = run_storm(n_workers, mode, helper)
    assert not report["errors"], report
    # the storm hit, and steps went on (on 2 busy cores, 12 workers and the sender get little time: a loaded
    # machine gave ~300 interrupts and 54-95 steps in the 4 s)
    assert report["interrupts"] >= 100 and report["steps"] >= 20, report
    assert report["mismatches"] == 0, report
    assert not any(report["sigint_blocked"].values()), report
    assert report["default_handler_left"], report


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


def test_only_the_default_handler_in_the_main_thread_is_swapped():
    seen = []

    @interrupts.holding
    def call():
        seen.append(signal.getsignal(signal.SIGINT))

    own = lambda signum, frame: seen.append("own")  # noqa: E731
    previous = signal.signal(signal.SIGINT, own)
    try:
        call()
        signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [own, "own"]  # another handler is left alone, and runs as it would
    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert seen[-1] is signal.default_int_handler  # no handler runs in another thread: nothing to swap


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
