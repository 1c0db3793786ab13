"""The caller's OpenMP threads spin short while it steps a pool with workers, and long again
when it pauses (its update) or closes the pool.

The effect is checked where it matters: CPU time that torch's idle intra-op thread burns
while the main process sleeps between small forward passes (as it does while a pool steps).
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.processes.omp_spin import MAX_IDLE, MIN_IDLE, ShortSpin, loaded_libgomp
from tests.envs import cartpole
from tests.helpers import poll_until

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    loaded_libgomp() is None or len(os.sched_getaffinity(0)) < 2,
    reason="needs torch on GNU OpenMP and 2 CPUs (with 1, libgomp already spins short)",
)


def parked_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shmvec-omp-spin"]


def idle_thread_cpu(step=None, seconds: float = 0.4) -> float:
    """Share of one CPU the busiest other thread of this process burns while the main thread
    runs a batch-8 MLP forward pass every 2 ms, then ``step()`` if given, and sleeps in
    between (libgomp's spin after each op; the pool's step in a rollout)."""
    net = torch.nn.Sequential(torch.nn.Linear(376, 64), torch.nn.Tanh(), torch.nn.Linear(64, 17))
    x = torch.randn(8, 376)
    with torch.no_grad():
        net(x)  # the team exists before we count
    me = threading.get_native_id()
    before = _thread_ticks()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        with torch.no_grad():
            net(x)
        if step is not None:
            step()
        time.sleep(0.002)
    elapsed, after = time.perf_counter() - start, _thread_ticks()
    busiest = max((after[t] - before.get(t, 0) for t in after if t != me), default=0)
    return busiest / os.sysconf("SC_CLK_TCK") / elapsed


def _thread_ticks() -> dict[int, int]:
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that just ended
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def test_steps_shorten_the_spin_of_torchs_idle_threads_and_a_pause_or_close_restores_it(two_torch_threads):
    long_before = idle_thread_cpu()
    env = ShmPoolVecEnv([cartpole] * 4, n_workers=2, start_method="fork", torch_threads="unchanged")
    try:
        assert "omp_spin='short (torch: 2 threads)'" in repr(env)
        env.reset()
        assert parked_threads() == []  # nothing before the caller steps
        short = idle_thread_cpu(step=lambda: env.step(np.zeros(4, dtype=np.int64)))
        assert len(parked_threads()) == 1 and env._pool.caller.short_spin.engaged
        assert torch.get_num_threads() == 2  # the policy keeps its threads
        time.sleep(MAX_IDLE)  # no steps: the caller updates its policy
        assert poll_until(lambda: parked_threads() == [] and not env._pool.caller.short_spin.engaged, 5.0)
        long_paused = idle_thread_cpu()
        before = env._pool.caller.short_spin._thread
        env.step(np.zeros(4, dtype=np.int64))  # the next rollout parks a team again
        assert env._pool.caller.short_spin._thread is not before
    finally:
        env.close()
    assert parked_threads() == []
    long_after = idle_thread_cpu()
    assert short < 0.5 * min(long_before, long_paused, long_after), (short, long_before, long_paused, long_after)


@pytest.mark.parametrize(
    "kwargs, threads, expected",
    [
        ({"n_workers": 1}, 1, "unchanged (torch runs 1 thread)"),
        ({"n_workers": 0, "use_main_process": True}, 2, "unchanged (no workers)"),
        ({"n_workers": 1, "omp_spin": "unchanged"}, 2, "unchanged"),
        ({"n_workers": 0, "use_main_process": True, "omp_spin": "short"}, 1, "short (torch: 1 threads)"),
    ],
)
def test_when_it_engages_and_the_override(closing, kwargs, threads, expected):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        env = closing(ShmVectorEnv([cartpole] * 2, start_method="fork", **kwargs))
        assert f"omp_spin={expected!r}" in repr(env)
        env.reset(seed=0)
        env.step(np.zeros(2, dtype=np.int64))
        assert len(parked_threads()) == expected.startswith("short")
        env.close()
        assert parked_threads() == []
    finally:
        torch.set_num_threads(before)


def test_the_pause_that_lets_go_follows_the_callers_interval_between_steps():
    spin = ShortSpin(loaded_libgomp(), team=2)
    try:
        assert spin.idle == MAX_IDLE
        for _ in range(60):  # a rollout: a step every ~1 ms
            spin.step()
            spin.returned()
            time.sleep(0.001)
        assert MIN_IDLE <= spin.idle < 10e-3 and spin.engaged
        time.sleep(MAX_IDLE)  # an update
        assert poll_until(lambda: not spin.engaged, 5.0)
        before = spin._thread
        spin.step()  # the next rollout: parks a team again; its first interval (the pause) teaches nothing
        assert spin._thread is not before and spin.idle < 10e-3
    finally:
        spin.release()
    assert poll_until(lambda: not spin.engaged and parked_threads() == [], 5.0)


def test_a_step_in_flight_is_not_a_pause_however_long():
    """A step that waits for a worker the OS descheduled is no update: the team stays parked."""
    spin = ShortSpin(loaded_libgomp(), team=2)
    try:
        for _ in range(20):
            spin.step()
            spin.returned()
            time.sleep(0.001)
        spin.step()  # its results come back after several idle periods
        time.sleep(10 * spin.idle)
        assert spin.engaged and spin._thread.is_alive() and spin.paused_for(time.perf_counter()) is None
        spin.returned()
        assert poll_until(lambda: not spin.engaged, 5.0)  # the pause counts from the return
    finally:
        spin.release()


def test_the_team_is_let_go_within_an_idle_period_of_the_last_return():
    """The thread looked at the caller while a step was in flight: it must look again soon, not
    when the step would count as lost, or the team stays parked into the caller's update."""
    spin = ShortSpin(loaded_libgomp(), team=2)
    try:
        for _ in range(20):
            spin.step()
            spin.returned()
            time.sleep(0.001)
        for _ in range(3):  # slow steps: the thread wakes while one is in flight
            spin.step()
            time.sleep(3 * spin.idle)
            spin.returned()
        returned = time.perf_counter()
        assert poll_until(lambda: not spin.engaged, 5.0)
        # within two idle periods (<= 20 ms here) and the thread's wake-up, far below LOST_STEP (1 s)
        assert time.perf_counter() - returned < 0.3
    finally:
        spin.release()


def test_a_pool_that_was_not_closed_releases_it_when_collected(two_torch_threads):
    env = ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method="fork")
    env.reset()
    env.step(np.zeros(2, dtype=np.int64))
    assert len(parked_threads()) == 1
    with pytest.warns(ResourceWarning):
        del env
        gc.collect()
    assert parked_threads() == []


def test_a_bad_value_is_refused_early():
    with pytest.raises(ValueError, match="omp_spin must be"):
        ShmPoolVecEnv([cartpole] * 2, omp_spin="off")


def test_a_caller_that_computes_for_long_between_steps_keeps_libgomps_own_spin(two_torch_threads):
    """SAC's gradient step after every env step: back-to-back ops, which short spins would slow;
    once a window of steps shows it, no team is parked again."""
    env = ShmPoolVecEnv([cartpole] * 4, n_workers=2, start_method="fork", torch_threads="unchanged")
    try:
        env.reset()
        spin = env._pool.caller.short_spin
        for _ in range(40):
            env.step(np.zeros(4, dtype=np.int64))
            end = time.thread_time() + 4e-3  # the caller's own CPU: a gradient step
            while time.thread_time() < end:
                pass
        assert not env._pool.caller.light
        assert poll_until(lambda: not spin.engaged and parked_threads() == [], 5.0)
        env.step(np.zeros(4, dtype=np.int64))
        assert not spin.engaged
    finally:
        env.close()
