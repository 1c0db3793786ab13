"""The default plan's timing run (:mod:`shmvec.engine.timing_run`) leaves no trace in the caller's
process, and a loaded machine does not flip its verdict (:mod:`shmvec.planning.env_timing`).

- Building a default pool leaves the caller's ``np.random`` and ``random`` states as they
  were, and builds in the caller's process exactly the envs of the main shard (the timed
  env is built in a process of its own); an explicit ``n_workers`` times nothing.
- With every CPU kept busy by other processes, CPU-bound envs (CartPole, Acrobot, a 150 µs
  and a 500 µs busy loop) are still judged CPU-bound and get no more lanes than cores, and
  an env that sleeps 2 ms is still judged waiting: the CPU share discounts the time the
  timed thread waited on a run queue (``/proc/thread-self/schedstat``), which grows while
  another process holds its CPU. (Measured as CPU time over wall time, the 500 µs env's
  share read 0.1-0.4 under this load on the 2-core VM: judged waiting, given 16 lanes.)
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
import time
from contextlib import contextmanager

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.engine import timing_run
from shmvec.options import PoolOptions
from shmvec.planning import env_timing
from shmvec.planning.machine import usable_cpus
from shmvec.planning.plan import WAITING_SHARE, plan_pool
from shmvec.processes.script_setup import worker_start
from tests.global_rng_env import BusyEnv, CountingEnv, GlobalRngEnv, WaitingEnv, builds
from tests.goal_envs import GoalReach, MaskedWalk

NUM_ENVS = 4


@pytest.fixture
def global_generators():
    """Seeds both global generators for the test and gives the rest of the session its states back."""
    numpy_state, random_state = np.random.get_state(), random.getstate()
    np.random.seed(0)
    random.seed(0)
    yield
    np.random.set_state(numpy_state)
    random.setstate(random_state)


def main_shard_size(envs) -> int:
    pool = envs._pool
    start, stop = pool.shards[-1]
    return stop - start if pool.main_shard else 0


# ==== no trace in the caller's process ======================================================


@pytest.mark.parametrize("adapter", [ShmVectorEnv, ShmPoolVecEnv])
def test_the_timing_run_leaves_the_global_generators_alone(adapter, global_generators):
    numpy_before, random_before = np.random.get_state(), random.getstate()
    with adapter([GlobalRngEnv] * NUM_ENVS) as envs:
        numpy_after, random_after = np.random.get_state(), random.getstate()
        plan = repr(envs)
    assert random_after == random_before, plan
    for after, before in zip(numpy_after, numpy_before):
        np.testing.assert_array_equal(after, before, err_msg=plan)
    assert "why='auto: " in plan  # the env was timed (elsewhere)


def test_the_timing_run_builds_no_env_in_the_callers_process(tmp_path):
    path = tmp_path / "builds"
    with ShmVectorEnv([functools.partial(CountingEnv, str(path))] * NUM_ENVS) as envs:
        plan, in_main = repr(envs), main_shard_size(envs)
        worker_pids = {link.process.pid for link in envs._pool.links}
    pids = builds(path)
    here = pids.count(os.getpid())
    assert here == in_main, f"{here} envs built in the caller's process, {in_main} in its shard: {plan}"
    elsewhere = [pid for pid in pids if pid != os.getpid() and pid not in worker_pids]
    assert len(elsewhere) == 1, f"the timing process built {len(elsewhere)} envs: {pids}, {plan}"
    assert len(pids) == NUM_ENVS + 1, (pids, plan)


def test_an_explicit_worker_count_starts_no_timing_process(tmp_path):
    path = tmp_path / "builds"
    with ShmVectorEnv([functools.partial(CountingEnv, str(path))] * NUM_ENVS, n_workers=2) as envs:
        worker_pids = {link.process.pid for link in envs._pool.links}
    pids = builds(path)
    assert len(pids) == NUM_ENVS, pids
    assert set(pids) == worker_pids, (pids, worker_pids)


# ==== a loaded machine ==========================================================================


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@contextmanager
def busy_processes(cpu_list: list[int]):
    """One process spinning on each CPU of ``cpu_list`` (pinned there), killed on exit."""
    processes = []
    try:
        for cpu in cpu_list:
            process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            processes.append(process)
            os.sched_setaffinity(process.pid, {cpu})
        time.sleep(0.2)  # they are running
        yield
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()


needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to load")


def planned_under_load(env_fn, num_envs: int):
    options = PoolOptions()
    timer = timing_run.timer(options.start_method, worker_start(options))
    with busy_processes(cpus()[:2]):
        return plan_pool(options, [env_fn] * num_envs, time_env=timer)


@needs_two_cpus
@pytest.mark.parametrize(
    "env_fn, num_envs",
    [
        (functools.partial(gym.make, "CartPole-v1"), 64),
        (functools.partial(gym.make, "Acrobot-v1"), 64),
        (functools.partial(BusyEnv, 150e-6), 16),
        (functools.partial(BusyEnv, 500e-6), 16),  # batches longer than a time slice: most are preempted
    ],
    ids=["CartPole-v1", "Acrobot-v1", "busy-150us", "busy-500us"],
)
def test_a_loaded_machine_leaves_cpu_bound_envs_cpu_bound(env_fn, num_envs):
    plan = planned_under_load(env_fn, num_envs)
    assert plan.reason.startswith("auto: ") and plan.t_env is not None, plan
    assert plan.cpu_share >= WAITING_SHARE, plan
    assert plan.n_workers + plan.main_shard <= usable_cpus().physical, plan


@needs_two_cpus
def test_a_loaded_machine_leaves_waiting_envs_waiting():
    plan = planned_under_load(functools.partial(WaitingEnv, 0.002), 32)
    assert plan.reason.startswith("auto: ") and plan.t_env is not None, plan
    assert plan.cpu_share < WAITING_SHARE, plan
    assert plan.n_workers + plan.main_shard > usable_cpus().physical, plan


# ==== the CPU share ================================================================================


@pytest.mark.parametrize(
    "wall, cpu, queued, share",
    [
        (1.0, 0.1, 0.9, 1.0),  # preempted the whole time it was not computing: CPU-bound
        (1.0, 0.1, 0.0, 0.1),  # never kept off a core: it waited 90 % of the time
        (1.0, 0.1, 0.5, 0.2),
        (1.0, 0.5, 0.0, 0.5),
        (1.0, 0.3, 1.0, 1.0),  # no time left unqueued (clock granularity): counted as CPU
        (1.0, 0.9, 0.5, 1.0),  # CPU over what ran (counters read apart): capped
    ],
)
def test_cpu_share_discounts_the_run_queue_wait(wall, cpu, queued, share):
    assert env_timing.cpu_share(wall, cpu, queued) == pytest.approx(share)


@needs_two_cpus
def test_the_run_queue_wait_grows_while_another_process_holds_this_threads_cpu():
    before = os.sched_getaffinity(0)
    cpu = cpus()[0]
    run_queue = env_timing.RunQueue()
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only
        with busy_processes([cpu]):
            start, start_cpu = time.perf_counter(), time.thread_time()
            start_queued = run_queue.wait()
            while time.perf_counter() - start < 0.5:
                pass
            queued = run_queue.wait() - start_queued
            wall, used = time.perf_counter() - start, time.thread_time() - start_cpu
    finally:
        os.sched_setaffinity(0, before)
        run_queue.close()
    assert queued > 0.1 * wall, (wall, used, queued)  # about half of it, where both share the CPU fairly
    assert env_timing.cpu_share(wall, used, queued) > 0.8, (wall, used, queued)  # a busy loop stays CPU-bound


@pytest.mark.parametrize(
    "env_fn, calls",
    [
        (lambda: gym.make("CartPole-v1"), 0),
        (lambda: gym.wrappers.TimeLimit(MaskedWalk(), 50), 1),  # found through a wrapper, as env_method finds it
        (GoalReach, 1),
    ],
    ids=["cartpole", "action_masks", "compute_reward"],
)
def test_the_timing_counts_the_methods_algorithms_call_every_step(env_fn, calls):
    timing = env_timing.time_env_and_machine(env_fn, budget=0.01)
    assert timing.per_step_calls == calls and timing.trains_every_step == (env_fn is GoalReach)


def test_the_timing_process_reports_the_per_step_calls():
    options = PoolOptions()
    timing = timing_run.timer(options.start_method, worker_start(options))(GoalReach)
    assert timing.per_step_calls == 1 and timing.t_env > 0


# ==== preemptions, counted by the run queue ========================================================


class FakeThread:
    """Clocks of a timed thread: wall time, its CPU time and its run-queue wait (``RunQueue``'s
    stand-in), moved by the env's steps and by preemptions."""

    def __init__(self):
        self.wall = self.cpu = self.queued = 0.0

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.cpu += seconds

    def preempted(self, seconds: float) -> None:
        self.wall += seconds
        self.queued += seconds


def timed_on(thread: FakeThread, monkeypatch, step, on_read: float = 0.0) -> env_timing.EnvTiming:
    class Stepped(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            step()
            return np.zeros(1, np.float32), 0.0, False, False, {}

    class Queue:
        def wait(self) -> float:
            thread.preempted(on_read)  # on the read's return: counted in what it reads
            return thread.queued

        def close(self) -> None:
            pass

    monkeypatch.setattr(env_timing, "RunQueue", Queue)
    monkeypatch.setattr(env_timing.time, "perf_counter", lambda: thread.wall)
    monkeypatch.setattr(env_timing.time, "thread_time", lambda: thread.cpu)
    monkeypatch.setattr(env_timing, "_time_reference_loops", lambda: env_timing.REFERENCE_LOOP_TIME)
    return env_timing.time_env_and_machine(Stepped, budget=10.0, max_steps=10 * env_timing.TIMING_BATCH)


def test_a_preemption_as_the_run_queue_is_read_is_not_the_env_waiting(monkeypatch):
    """A system call's return is where a preemption lands: 10 ms on a run queue at each read of
    it must not make a CPU-bound env look waiting (it read 0.1 % CPU) nor slower."""
    thread = FakeThread()
    timing = timed_on(thread, monkeypatch, lambda: thread.run(10e-6), on_read=10e-3)
    assert timing.cpu_share == 1.0
    assert timing.t_env == pytest.approx(10e-6)


def test_preemptions_in_most_batches_leave_the_step_time_alone(monkeypatch):
    """6 batches of 10 lose 1 ms each to another process (the run queue counts it): the median of
    wall times would have read each step 100 µs slower; CPU times read it as it is."""
    thread, steps = FakeThread(), [0]

    def step():
        thread.run(10e-6)
        steps[0] += 1
        if steps[0] <= 6 * env_timing.TIMING_BATCH and steps[0] % env_timing.TIMING_BATCH == 5:
            thread.preempted(1e-3)

    timing = timed_on(thread, monkeypatch, step)
    assert timing.cpu_share == 1.0
    assert timing.t_env == pytest.approx(10e-6)
    assert timing.scale == pytest.approx(1.0)
