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
from hypothesis import given, settings
from hypothesis import strategies as st

from shmvec import ClosedEnvError, ShmPoolVecEnv, ShmVectorEnv
from shmvec.processes.caller_threads import HEAVY, LIGHT, WINDOW, CallerThreads
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
        ({"n_workers": 0, "use_main_process": True}, 2, "unchanged (no workers)"),
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


# ---- adversarial: whatever the caller does, its counts come back --------------------------------


def light_window(caller: CallerThreads) -> None:
    for _ in range(WINDOW):
        caller.step()
        caller.returned()


def heavy_window(caller: CallerThreads) -> None:
    for _ in range(WINDOW):
        caller.returned_at -= 1.0  # a second of the caller's compute since the last return
        caller.step()
        caller.returned()


def release_elsewhere(caller: CallerThreads) -> None:
    thread = threading.Thread(target=caller.release)
    thread.start()
    thread.join()


# What a caller does between opening its pools (one inside another) and closing them (in any order).
ACTIONS = ["set", "light", "heavy", "limits", "close", "close elsewhere"]
POOLS = [(1, True), (2, True), (3, True), (1, False), (2, False)]  # (count, an explicit one) or "auto" up to it


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_the_callers_counts_come_back_whatever_the_order(data):
    """Generated callers: pools (an explicit count, or "auto") opened, stepped light and heavy,
    closed in any order, twice, or from another thread; torch.set_num_threads and threadpoolctl
    limits before, between and during. Once every pool is closed, the caller's thread has the
    count it last set itself, and at every point a thread started anew gets that count too.

    The caller's own counts (4, 5) are never one a pool sets (1 to 3): a count the caller set that
    equals the one a pool set cannot be told from it (see shmvec.processes.caller_threads)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = torch.get_num_threads()
    try:
        run_generated_caller(data, threadpoolctl)
    finally:
        torch.set_num_threads(before)


def run_generated_caller(data, threadpoolctl) -> None:
    last_set = data.draw(st.sampled_from([4, 5]), label="the caller's count")
    torch.set_num_threads(last_set)
    kinds = data.draw(st.lists(st.sampled_from(POOLS), min_size=1, max_size=3), label="pools (count, fixed)")
    pools = [CallerThreads(count, fixed, None, "test") for count, fixed in kinds]
    for pool, (count, fixed) in zip(pools, kinds):  # opened one inside another, each stepped
        light_window(pool)
        if fixed:
            assert torch.get_num_threads() == count  # an explicit count from the first step
    open_pools = list(range(len(pools)))
    for _ in range(data.draw(st.integers(0, 8), label="actions")):
        action = data.draw(st.sampled_from(ACTIONS))
        if action == "set":
            last_set = data.draw(st.sampled_from([4, 5]), label="set")
            torch.set_num_threads(last_set)
        elif action in ("light", "heavy"):
            (light_window if action == "light" else heavy_window)(pools[data.draw(st.sampled_from(range(len(pools))))])
        elif action == "limits":
            limit, entry = data.draw(st.integers(1, 5), label="limits"), torch.get_num_threads()
            with threadpoolctl.threadpool_limits(limits=limit, user_api="openmp"):
                for i in data.draw(st.permutations(open_pools), label="stepped in the block"):
                    if kinds[i][0] != entry:  # the block's end sets `entry` again: not a count this pool sets
                        light_window(pools[i])
        else:  # a close, maybe of a pool closed already
            i = data.draw(st.sampled_from(range(len(pools))), label=action)
            if action == "close elsewhere":
                release_elsewhere(pools[i])
                # settled now: a settling inside a limits block would see the block's count as the caller's
                gc.collect()
            else:
                pools[i].release()
            open_pools = [k for k in open_pools if k != i]
        assert in_a_new_thread(torch.get_num_threads) == last_set  # the default for threads to come
    for i in data.draw(st.permutations(open_pools), label="closed in this order"):
        release_elsewhere(pools[i]) if data.draw(st.booleans(), label="elsewhere") else pools[i].release()
        assert in_a_new_thread(torch.get_num_threads) == last_set
    gc.collect()  # a thread whose pool another closed gets its count back here at the latest
    assert torch.get_num_threads() == last_set
    assert in_a_new_thread(torch.get_num_threads) == last_set


def nested(counts: list[int]) -> list[CallerThreads]:
    """Pools with explicit counts, opened one inside another, each stepped once (in this order)."""
    pools = [CallerThreads(count, True, None, "test") for count in counts]
    for pool in pools:
        light_window(pool)
    return pools


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["first-opened-first", "last-opened-first"])
@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_nested_pools_closed_in_any_order_from_any_thread_give_the_count_back(order, where):
    """torch at 4; a pool sets 3, a pool opened inside it sets 1; they close in either order, here
    or both from another thread: the caller's thread is at 4 again, threads started later at 4 all along."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        pools = nested([3, 1])
        assert torch.get_num_threads() == 1
        for i in order:
            pools[i].release() if where == "here" else release_elsewhere(pools[i])
            assert in_a_new_thread(torch.get_num_threads) == 4
        gc.collect()  # where this thread gets back what other threads closed, at the latest
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


def test_a_threadpool_limits_block_between_nested_pools_is_the_callers_own_and_passes():
    """A pool sets 3; inside a threadpool_limits(2) block a second pool steps (2 -> 1); the block
    ends (3 again); the pools close, the first first: the caller's 4 is back."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        first, second = nested([3]) + [CallerThreads(1, True, None, "test")]
        with threadpoolctl.threadpool_limits(limits=2, user_api="openmp"):
            light_window(second)
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
        first.release()
        second.release()
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


def test_a_count_the_caller_set_between_nested_pools_stays():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        first = nested([3])[0]
        torch.set_num_threads(5)  # the caller's own, while the first pool runs
        second = nested([1])[0]
        first.release()
        assert torch.get_num_threads() == 1  # the second pool's, still open
        second.release()
        assert torch.get_num_threads() == 5
    finally:
        torch.set_num_threads(before)
