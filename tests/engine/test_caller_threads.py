"""torch's thread count while the caller steps a pool: fewer while its compute between steps
is light, back when it turns heavy and at ``close()`` (in every thread, wherever it is called);
an explicit count and "unchanged" obeyed."""

from __future__ import annotations

import gc
import logging
import threading
import time

import numpy as np
import pytest

from shmvec import ClosedEnvError, ShmPoolVecEnv, ShmVectorEnv
from shmvec.engine.caller_threads import HEAVY, LIGHT, WINDOW, CallerThreads
from tests.envs import cartpole

torch = pytest.importorskip("torch")


def busy(seconds: float) -> None:
    """The caller's compute between two steps (a policy's forward pass)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def steps(env, n: int, compute: float) -> None:
    for _ in range(n):
        busy(compute)
        env.step(np.zeros(env.num_envs, dtype=np.int64))


@pytest.mark.parametrize("make", [ShmPoolVecEnv, ShmVectorEnv])
def test_a_light_policy_runs_on_the_cores_the_workers_leave_until_close(two_torch_threads, make, caplog):
    env = make([cartpole] * 4, n_workers=2, start_method="fork")
    try:
        assert "torch_threads='at most 1 while the policy is light'" in repr(env)
        env.reset()
        with caplog.at_level(logging.INFO, logger="shmvec"):
            steps(env, WINDOW - 1, compute=LIGHT / 10)
            assert torch.get_num_threads() == 2  # not decided before a window of steps
            steps(env, 1, compute=LIGHT / 10)
            assert torch.get_num_threads() == 1
        assert "torch runs 1 thread(s) instead of 2" in caplog.text
        time.sleep(0.05)  # the update between rollouts: one long sample in the next window
        steps(env, 2 * WINDOW, compute=LIGHT / 10)
        assert torch.get_num_threads() == 1
    finally:
        env.close()
    assert torch.get_num_threads() == 2


def test_a_heavy_policy_keeps_its_threads_and_one_that_turns_heavy_gets_them_back(two_torch_threads):
    env = ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method="fork")
    try:
        env.reset()
        steps(env, 2 * WINDOW, compute=1.5 * HEAVY)  # a CNN's forward pass
        assert torch.get_num_threads() == 2
        steps(env, WINDOW, compute=0.0)
        assert torch.get_num_threads() == 1
        steps(env, WINDOW, compute=1.5 * HEAVY)  # e.g. a gradient step between steps
        assert torch.get_num_threads() == 2
    finally:
        env.close()


def test_async_batches_reduce_the_threads_too(two_torch_threads):
    env = ShmVectorEnv([cartpole] * 4, n_workers=1, start_method="fork", batch_size=2)
    try:
        env.async_reset(seed=0)
        env.recv()
        for _ in range(WINDOW):
            env.send(np.zeros(2, dtype=np.int64))
            env.recv()
        assert torch.get_num_threads() == 1
    finally:
        env.close()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(
    "kwargs, during, description",
    [
        ({"n_workers": 1, "torch_threads": "unchanged"}, 2, "unchanged"),
        ({"n_workers": 0, "main_shard": True}, 2, "unchanged (no workers)"),
        ({"n_workers": 1, "torch_threads": 3}, 3, "3 while stepping"),
    ],
)
def test_unchanged_no_workers_and_an_explicit_count_are_obeyed(two_torch_threads, kwargs, during, description):
    env = ShmPoolVecEnv([cartpole] * 2, start_method="fork", **kwargs)
    try:
        assert f"torch_threads={description!r}" in repr(env)
        env.reset()
        steps(env, 2 * WINDOW, compute=2 * HEAVY if "torch_threads" in kwargs else 0.0)
        assert torch.get_num_threads() == during
    finally:
        env.close()
    assert torch.get_num_threads() == 2


def test_auto_never_adds_threads(two_torch_threads):
    torch.set_num_threads(1)
    env = ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method="fork")
    try:
        env.reset()
        steps(env, 2 * WINDOW, compute=0.0)
        assert torch.get_num_threads() == 1
    finally:
        env.close()
    assert torch.get_num_threads() == 1


def test_a_count_the_caller_set_meanwhile_is_kept_at_close(two_torch_threads):
    env = ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method="fork")
    try:
        env.reset()
        steps(env, WINDOW, compute=0.0)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(3)  # the caller's own choice
    finally:
        env.close()
    assert torch.get_num_threads() == 3


def test_only_the_thread_that_stepped_gets_its_count_back():
    caller = CallerThreads(1, fixed=True, short_spin=None, why="1 while stepping")
    before = torch.get_num_threads()
    seen = {}

    def collect():
        torch.set_num_threads(2)
        for _ in range(WINDOW):
            caller.step()
        seen["during"] = torch.get_num_threads()
        caller.release()
        seen["after"] = torch.get_num_threads()

    thread = threading.Thread(target=collect)
    thread.start()
    thread.join()
    assert seen == {"during": 1, "after": 2}
    assert torch.get_num_threads() == before  # this thread's count was never touched


def in_a_new_thread(fn):
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


@pytest.mark.parametrize("make", [ShmPoolVecEnv, ShmVectorEnv])
def test_a_close_from_another_thread_leaves_every_thread_as_it_was(two_torch_threads, make):
    """A training thread steps (its count goes down); the main thread closes the env (a ``finally:``
    block) while the training thread computes; the training thread's next step finds the env closed.
    Then the training thread, this one and threads started later (also while the pool runs) see
    their counts of before."""
    env = make([cartpole] * 4, n_workers=2, start_method="fork")
    seen, stepped, closed = {}, threading.Event(), threading.Event()

    def train():
        seen["before"] = torch.get_num_threads()
        env.reset()
        steps(env, WINDOW, compute=LIGHT / 10)
        seen["during"] = torch.get_num_threads()
        stepped.set()
        closed.wait(60)  # its policy computes
        with pytest.raises(ClosedEnvError):
            steps(env, 1, compute=0.0)
        seen["after"] = torch.get_num_threads()
        seen["after, a new thread"] = in_a_new_thread(torch.get_num_threads)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        stepped.wait(60)
        seen["new thread, during"] = in_a_new_thread(torch.get_num_threads)
    finally:
        env.close()
        closed.set()
        thread.join()
    assert seen == {"before": 2, "during": 1, "new thread, during": 2, "after": 2, "after, a new thread": 2}
    assert torch.get_num_threads() == 2 and in_a_new_thread(torch.get_num_threads) == 2


def test_a_thread_that_never_calls_again_gets_its_count_back_at_its_next_collection(two_torch_threads):
    env = ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method="fork")
    seen, stepped, closed = {}, threading.Event(), threading.Event()

    def train():
        env.reset()
        steps(env, WINDOW, compute=0.0)
        seen["during"] = torch.get_num_threads()
        stepped.set()
        closed.wait(60)
        gc.collect()  # the allocations of a training step start one soon
        seen["after"] = torch.get_num_threads()

    thread = threading.Thread(target=train)
    thread.start()
    try:
        stepped.wait(60)
    finally:
        env.close()
        closed.set()
        thread.join()
    assert seen == {"during": 1, "after": 2}


def test_a_bad_value_is_refused():
    with pytest.raises(ValueError, match='torch_threads must be "auto", "unchanged" or an int >= 1'):
        ShmPoolVecEnv([cartpole] * 2, torch_threads=0)
    with pytest.raises(ValueError, match="torch_threads must be"):
        ShmPoolVecEnv([cartpole] * 2, torch_threads="one")
