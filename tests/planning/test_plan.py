"""``n_workers=None``: the choice of worker count, main shard and waits (pure, injected timings),
and pools built with it: they work, equal the references, and say what they chose."""

from __future__ import annotations

import logging
import time
import types

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.engine import pool as pool_module
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import NextWait
from shmvec.ipc.signals import MAX_SPIN
from shmvec.options import PoolOptions
from shmvec.planning import env_timing
from shmvec.planning import plan as autoconfig
from shmvec.planning.machine import Cpus
from shmvec.planning.plan import ISOLATION_TOLERANCE, candidates, choose, explicit, predicted_step_time
from shmvec.processes import caller_threads
from tests.envs import cartpole
from tests.helpers import assert_same

CORES = 2  # the decisions below are the 2-core machine's; the model is checked for other counts too


# ==== the decision (pure) ==================================================================


@pytest.mark.parametrize(
    "num_envs, t_env, expected",
    [
        (64, 7e-6, (1, True)),  # light envs, many: main process + one worker, nobody waits on a wake-up
        (8, 7e-6, (0, True)),  # a few: a worker's wake-up after the policy ran costs more than their step
        (2, 7e-6, (0, True)),  # too little work to pay a round trip: in-process
        (1, 7e-6, (0, True)),
        (8, 1e-3, (2, False)),  # heavy: two workers cost < 5 % more and keep the envs isolated
        (16, 150e-6, (2, False)),
        (1, 1e-3, (0, True)),  # one heavy env: a worker's wake-up adds 7 %
    ],
)
def test_choose_on_two_cores(num_envs, t_env, expected):
    plan = choose(num_envs, CORES, t_env)
    assert (plan.n_workers, plan.main_shard) == expected
    assert plan.reason.startswith("auto: ") and plan.t_env == t_env


@pytest.mark.parametrize("cores", [1, 2, 4, 16])
@pytest.mark.parametrize("num_envs", [1, 3, 8, 64, 257])
@pytest.mark.parametrize("t_env", [1e-6, 7e-6, 100e-6, 5e-3])
def test_choice_is_near_the_models_best_and_valid(cores, num_envs, t_env):
    plan = choose(num_envs, cores, t_env)
    lanes = plan.n_workers + plan.main_shard
    assert 1 <= lanes <= min(num_envs, cores)
    best = min(predicted_step_time(num_envs, cores, t_env, k, main) for k, main in candidates(num_envs, cores))
    assert (
        best / predicted_step_time(num_envs, cores, t_env, plan.n_workers, plan.main_shard) >= 1 - ISOLATION_TOLERANCE
    )


def test_the_model_is_a_training_loop_where_workers_wake_up_each_step():
    training = predicted_step_time(8, CORES, 7e-6, 1, True)
    bare = predicted_step_time(8, CORES, 7e-6, 1, True, caller_computes=False)
    assert training - bare == pytest.approx(autoconfig.T_SYNC_BLOCK + autoconfig.T_CALLER_TAX)
    assert predicted_step_time(8, CORES, 7e-6, 0, True) == predicted_step_time(
        8, CORES, 7e-6, 0, True, caller_computes=False
    )
    assert bare < predicted_step_time(8, CORES, 7e-6, 0, True) < training  # in a bare loop a worker would pay


def test_one_core_runs_in_process_for_light_envs():
    assert (choose(64, 1, 7e-6).n_workers, choose(64, 1, 7e-6).main_shard) == (0, True)


def test_main_shard_given_restricts_the_choice():
    assert choose(8, CORES, 1e-3, main_shard=True).main_shard is True
    assert choose(64, CORES, 7e-6, main_shard=False).main_shard is False


@pytest.mark.parametrize("cores, t_env", [(2, 9e-6), (2, 1e-3), (16, 9e-6), (16, 1e-3)])
def test_async_batches_run_every_env_in_a_worker(cores, t_env):
    sync, batched = choose(16, cores, t_env, main_shard=False), choose(16, cores, t_env, batch_size=8)
    assert (batched.n_workers, batched.main_shard) == (sync.n_workers, False)
    assert "async batches of 8" in batched.reason and "predicted" not in batched.reason
    assert choose(16, cores, t_env, batch_size=16) == choose(16, cores, t_env)  # a full batch is a synchronous step
    assert choose(16, cores, t_env, main_shard=True, batch_size=8).main_shard is True  # as given


def test_candidates_are_every_lane_count_up_to_the_cores():
    assert candidates(8, 2) == [(0, True), (1, False), (1, True), (2, False)]
    assert candidates(1, 4) == [(0, True), (1, False)]


def test_waits_spin_longer_only_when_every_busy_process_has_a_core():
    light = choose(64, CORES, 7e-6)  # main + 1 worker on 2 cores: the main process spins through the worker's shard
    assert light.main_spin == pytest.approx(2 * 32 * (7e-6 + autoconfig.T_WRITE_PER_ENV))
    assert 200e-6 < light.worker_spin <= MAX_SPIN and light.tight_loop_spin
    heavy = choose(16, CORES, 150e-6)  # 2 workers of 8 x 150 µs: no spin covers that wait, so it blocks
    assert (heavy.n_workers, heavy.main_spin) == (2, 200e-6)
    two = explicit(64, CORES, 2, False)  # 2 workers on 2 cores; the main process only waits, sharing a core
    assert (two.main_spin, two.worker_spin, two.tight_loop_spin) == (autoconfig.SHARED_CORE_SPIN, 200e-6, True)
    assert explicit(64, 4, 2, False).main_spin == MAX_SPIN  # a core of its own: it spins as long as it may
    crowded = explicit(64, CORES, 3, False)  # more workers than cores: nobody spins on a core another needs
    assert (crowded.main_spin, crowded.worker_spin, crowded.tight_loop_spin) == (0.0, 0.0, False)
    assert explicit(64, CORES, 1, True).tight_loop_spin  # main shard + 1 worker fit 2 cores
    assert not explicit(64, CORES, 2, True).tight_loop_spin  # 3 lanes on 2 cores do not
    never = choose(64, CORES, 7e-6, max_spin=0.0)  # max_spin=0 always blocks
    assert (never.worker_spin, never.main_spin, never.tight_loop_spin) == (0.0, 0.0, False)


def test_a_main_process_sharing_a_core_spins_only_through_short_shards():
    per_env = 7e-6 + autoconfig.T_WRITE_PER_ENV
    # max_spin=50 µs: the spins below are the plan's, not that floor
    short = autoconfig._with_waits(16, CORES, 7e-6, 2, False, 50e-6, "timed")  # shards of 8 envs: ~120 µs
    assert short.main_spin == pytest.approx(2 * 8 * per_env)
    long = autoconfig._with_waits(64, CORES, 7e-6, 2, False, 50e-6, "timed")  # 32 envs: ~470 µs, beyond the limit
    assert 2 * 32 * per_env > autoconfig.SHARED_CORE_SPIN and long.main_spin == 50e-6
    alone = autoconfig._with_waits(64, 4, 7e-6, 2, False, 50e-6, "timed")  # the same shards, a free core
    assert alone.main_spin == pytest.approx(2 * 32 * per_env)


def test_explicit_is_obeyed():
    plan = explicit(64, CORES, 5, False)
    assert (plan.n_workers, plan.main_shard, plan.reason) == (5, False, "n_workers=5 given")
    assert explicit(4, CORES, 1, True).constructor_args() == "n_workers=1, use_main_process=True"


def test_plan_pool_falls_back_to_workers_when_the_env_cannot_be_timed():
    def broken():
        raise RuntimeError("no env here")

    plan = autoconfig.plan_pool(PoolOptions(), [broken] * 4)
    assert (plan.n_workers, plan.main_shard) == (min(4, autoconfig.usable_cores()), False)
    assert "timing env 3 failed: no env here" in plan.reason


def test_time_env_and_machine_measures_and_closes():
    closed = []

    class Slow(gym.Wrapper):
        def step(self, action):
            for _ in range(2000):
                pass
            return super().step(action)

        def close(self):
            closed.append(True)
            super().close()

    t_fast, scale_fast, *_ = env_timing.time_env_and_machine(cartpole)
    t_slow, scale_slow, *_ = env_timing.time_env_and_machine(lambda: Slow(cartpole()))
    assert 0 < t_fast < t_slow and closed == [True]
    assert scale_fast > 0 and scale_slow > 0


class TickClock:
    """A fake ``time.perf_counter`` and ``time.thread_time`` that advances one tick per call: 1 ms, or 2 ms while it
    reads less than ``slowed`` (another process took half the core): every timed interval
    reads one tick."""

    def __init__(self, slowed: float = 0.0):
        self.now, self.slowed = 0.0, slowed

    def __call__(self) -> float:
        self.now += 2e-3 if self.now < self.slowed else 1e-3
        return self.now


def test_a_slowdown_over_most_of_the_timing_slows_the_env_and_the_machine_alike(monkeypatch):
    """The plan depends on t_env / scale alone: a slowdown over most of the timing window
    must move both, not the env's time alone (as timing one after the other would)."""
    timings = []
    for clock in (TickClock(), TickClock(slowed=0.95 * env_timing.TIMING_BUDGET)):
        monkeypatch.setattr(env_timing.time, "perf_counter", clock)  # the deadline's
        monkeypatch.setattr(env_timing.time, "thread_time", clock)  # the timed batches' and loops'
        timings.append(env_timing.time_env_and_machine(cartpole))
    (t_env, scale, *_), (t_slowed, scale_slowed, *_) = timings
    assert t_slowed == pytest.approx(2 * t_env)  # most of the window ran at half speed
    assert t_slowed / scale_slowed == pytest.approx(t_env / scale)


def test_the_ratio_is_taken_batch_by_batch(monkeypatch):
    """Slowdowns that hit more env batches than reference loops (6 of 10 against 4 of 10:
    the ratio of the two medians would be off by 2x) must not move t_env / scale: each
    batch is compared with the loops timed right after it."""
    now, batch = [0.0], [0]  # the fake clock; the batch being timed

    class Clocked(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            now[0] += 2e-6 if batch[0] < 6 else 1e-6  # batches 0-5 run at half speed
            return np.zeros(1, np.float32), 0.0, False, False, {}

    def reference_loops():
        slowed = batch[0] < 4  # ... and the loops after batches 0-3
        batch[0] += 1
        return (2.0 if slowed else 1.0) * env_timing.REFERENCE_LOOP_TIME

    monkeypatch.setattr(env_timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(env_timing.time, "thread_time", lambda: now[0])  # the step is all CPU
    monkeypatch.setattr(env_timing, "_time_reference_loops", reference_loops)
    t_env, scale, *_ = env_timing.time_env_and_machine(Clocked, budget=1.0, max_steps=10 * env_timing.TIMING_BATCH)
    assert batch[0] == 10
    assert scale == pytest.approx(1.0)  # the median loop ran at full speed
    assert t_env / scale == pytest.approx(1e-6)  # the unslowed ratio


# ==== envs that wait ========================================================================


@pytest.mark.parametrize("num_envs", [32, 256, 1024])
def test_envs_that_wait_get_lanes_beyond_the_cores(num_envs):
    plan = choose(num_envs, CORES, 2e-3, cpu_share=0.01, lanes=autoconfig.MAX_LANES)
    lanes = plan.n_workers + plan.main_shard
    assert CORES < lanes <= min(num_envs, autoconfig.MAX_LANES) and not plan.main_shard
    assert "(1% CPU: waits)" in plan.reason
    assert (plan.worker_spin, plan.main_spin) == (0.0, 0.0)  # more processes than cores: every wait blocks
    if num_envs == 32:
        assert plan.n_workers == 32  # one env each: every env waits at once


def test_the_workers_own_cycles_stop_the_lanes_from_growing():
    """Each worker's wake-up and post take CPU on the shared cores and a turn in the main process:
    beyond some count another worker costs more than it saves, and the model knows it."""
    assert choose(256, CORES, 2e-3, cpu_share=0.01, lanes=256).n_workers < 256
    many_cores = choose(256, 64, 2e-3, cpu_share=0.01, lanes=256)  # cores to spare: one env per worker pays
    assert many_cores.n_workers == 256
    assert predicted_step_time(256, CORES, 2e-3, 128, False, cpu_share=0.01) < predicted_step_time(
        256, CORES, 2e-3, 256, False, cpu_share=0.01
    )


def test_envs_that_compute_stay_within_the_cores():
    for share in (1.0, 0.6):  # 0.6: a VM that stole some of the timing's CPU, or an env that waits a little
        plan = choose(256, CORES, 2e-3, cpu_share=share, lanes=256)
        assert plan.n_workers + plan.main_shard <= CORES and "waits" not in plan.reason
    assert choose(64, CORES, 7e-6, cpu_share=1.0) == choose(64, CORES, 7e-6)


def test_lanes_are_bounded_by_memory_and_file_descriptors(monkeypatch):
    monkeypatch.setattr(autoconfig, "available_memory", lambda: 10 * autoconfig.WORKER_MEMORY)
    assert autoconfig.max_lanes(1000) == 10
    monkeypatch.setattr(autoconfig, "available_memory", lambda: None)
    assert autoconfig.max_lanes(1000) == min(
        autoconfig.MAX_LANES, autoconfig.resource.getrlimit(autoconfig.resource.RLIMIT_NOFILE)[0] // 8
    )
    assert autoconfig.max_lanes(3) == 3
    monkeypatch.setattr(autoconfig, "available_memory", lambda: 0)
    assert autoconfig.max_lanes(1000) == 1


def test_more_workers_cost_the_main_process_a_turn_each(monkeypatch):
    monkeypatch.setattr(autoconfig, "T_WRITE_PER_ENV", 0.0)  # envs that cost nothing: only the overheads remain
    two, three, many = (predicted_step_time(64, 64, 0.0, k, False) for k in (2, 3, 34))
    assert (three - two, many - two) == pytest.approx((autoconfig.T_PER_WORKER, 32 * autoconfig.T_PER_WORKER))
    crowded = predicted_step_time(64, 2, 0.0, 33, False, cpu_share=0.0)  # 33 workers on 2 cores
    c = autoconfig
    per_step = 2 * c.T_SYNC_BLOCK + c.T_CALLER_TAX + c.T_BOOK_FIXED + 64 * c.T_BOOK_PER_ENV  # wake-up, sync, books
    assert crowded == pytest.approx(max(33 * c.T_PER_CROWDED_WORKER, 33 * c.T_WORKER_CYCLE / 2) + per_step)
    monkeypatch.undo()
    heavy = choose(64, 16, 7e-6)  # light envs on 16 cores: 15 workers' turns cost more than their envs save
    assert heavy.n_workers + heavy.main_shard < 16


class Sleeper(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(1e-3)  # a syscall that waits: no CPU
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_the_timing_tells_an_env_that_waits_from_one_that_computes():
    assert env_timing.time_env_and_machine(Sleeper).cpu_share < 0.2
    assert env_timing.time_env_and_machine(cartpole).cpu_share > 0.5


def test_a_cpu_quota_caps_the_plan(monkeypatch, closing):
    monkeypatch.setattr(autoconfig, "usable_cpus", lambda: Cpus(1, 1, "cgroup CPU quota 1 of 64 CPUs"))
    plan = autoconfig.plan_pool(PoolOptions(), [lambda: bench_like_heavy()] * 8)
    assert plan.n_workers + plan.main_shard == 1 and "1 cores" in plan.reason


def bench_like_heavy() -> gym.Env:
    class Heavy(Sleeper):
        def step(self, action):
            end = time.perf_counter() + 200e-6
            while time.perf_counter() < end:
                pass
            return np.zeros(1, np.float32), 0.0, False, False, {}

    return Heavy()


# ==== pools built with n_workers=None ======================================================


def test_default_pool_works_equals_sync_and_says_what_it_chose(closing, caplog):
    with caplog.at_level(logging.INFO, logger="shmvec"):
        shm = closing(ShmVectorEnv([cartpole] * 6, start_method="fork", autoreset_mode=AutoresetMode.SAME_STEP))
    ref = closing(SyncVectorEnv([cartpole] * 6, autoreset_mode=AutoresetMode.SAME_STEP))
    plan = shm._pool.plan
    chosen = f"n_workers={plan.n_workers}, use_main_process={plan.main_shard}, why={plan.reason!r}"
    threads = f"omp_spin={shm._pool.omp_spin!r}, torch_threads={shm._pool.caller.description()!r}"
    described = f"{chosen}, {threads}"
    assert repr(shm) == f"ShmVectorEnv(num_envs=6, {described})"
    assert repr(shm._pool) == f"ShmPool(num_envs=6, {described})"
    assert "why='auto: " in repr(shm) and shm.n_workers == plan.n_workers
    assert any(chosen in record.getMessage() for record in caplog.records)
    assert_same(shm.reset(seed=3), ref.reset(seed=3))
    rng = np.random.default_rng(0)
    for _ in range(40):
        actions = rng.integers(0, 2, size=6)
        assert_same(shm.step(actions), ref.step(actions))


def test_default_sb3_pool_repr(closing):
    shm = closing(ShmPoolVecEnv([cartpole] * 3, start_method="fork"))
    assert repr(shm).startswith("ShmPoolVecEnv(num_envs=3, n_workers=")
    assert "why='auto: " in repr(shm)
    shm.reset()
    obs, rewards, dones, infos = shm.step(np.zeros(3, dtype=np.int64))
    assert obs.shape == (3, 4) and len(infos) == 3


def test_explicit_n_workers_gives_exactly_that_many_workers_and_no_main_shard(closing):
    shm = closing(ShmPoolVecEnv([cartpole] * 3, 3, start_method="fork"))
    plan = shm._pool.plan
    assert (plan.n_workers, plan.main_shard, plan.reason) == (3, False, "n_workers=3 given")
    assert len(shm._pool.links) == 3 and shm._pool.main is None


@pytest.mark.parametrize(
    "caller_time, expected", [(10e-6, NextWait.SPIN), (500e-6, NextWait.SPIN), (5e-3, NextWait.BLOCK)]
)
def test_workers_spin_for_the_next_step_only_while_the_caller_comes_back_soon(
    closing, monkeypatch, caller_time, expected
):
    clock = [100.0]
    fake_time = types.SimpleNamespace(
        perf_counter=lambda: clock[0], monotonic=time.monotonic, thread_time=time.thread_time
    )
    monkeypatch.setattr(pool_module, "time", fake_time)  # the pool's clock ...
    monkeypatch.setattr(caller_threads, "time", fake_time)  # ... and the one that notes the caller's return
    shm = closing(ShmPoolVecEnv([cartpole] * 2, n_workers=1, start_method="fork"))
    assert shm._pool.plan.tight_loop_spin  # one worker fits the cores
    shm.reset()
    shm.step(np.zeros(2, dtype=np.int64))
    clock[0] += caller_time  # the caller's time between two steps
    shm.step(np.zeros(2, dtype=np.int64))
    assert shm._pool.links[0].ctrl[lay.CTRL_NEXT_WAIT] == expected


def test_workers_of_an_oversubscribed_pool_wait_as_their_own_policy_says(closing):
    shm = closing(ShmPoolVecEnv([cartpole] * 4, n_workers=autoconfig.usable_cores() + 1, start_method="fork"))
    assert not shm._pool.plan.tight_loop_spin
    shm.reset()
    for _ in range(3):
        shm.step(np.zeros(4, dtype=np.int64))
    assert {link.ctrl[lay.CTRL_NEXT_WAIT] for link in shm._pool.links} == {NextWait.OWN}


@pytest.mark.parametrize("t_env, n_workers", [(49e-6, 0), (68e-6, 1)])
def test_in_a_training_loop_eight_envs_go_to_a_worker_only_from_about_60_us_a_step(t_env, n_workers):
    """On the 2-core VM (scale ~1.8): 8 Acrobots (49 µs) trained 0.83x DummyVecEnv with a worker
    and torch's threads left alone, 8 HalfCheetahs (68 µs) 1.04x: what the worker saves must pay
    for the policy's slower ops too. (With torch on one thread, Acrobot gained 1.2x; but SAC, a
    gradient step between steps, took 1.7x as long with 4 HalfCheetahs split main + worker.)"""
    plan = choose(8, CORES, t_env, scale=1.8)
    assert (plan.n_workers, plan.main_shard) == (n_workers, True)


def test_a_slower_machine_keeps_few_light_envs_in_process():
    fast, slow = choose(6, CORES, 60e-6, scale=1.0), choose(6, CORES, 60e-6, scale=3.0)
    assert (fast.n_workers, fast.main_shard) == (1, True)  # a round trip pays for three envs' steps
    assert (slow.n_workers, slow.main_shard) == (0, True)  # three times the overheads: it does not
    assert predicted_step_time(64, CORES, 7e-6, 1, True, scale=2.0) > predicted_step_time(64, CORES, 7e-6, 1, True)


def test_the_machine_scale_is_the_reference_loops_time_against_the_calibration(monkeypatch):
    clock = iter(range(0, 10_000, 2))  # every timed stretch takes 2 s of CPU on the fake clock
    monkeypatch.setattr(env_timing.time, "thread_time", lambda: next(clock))
    t_env, scale, *_ = env_timing.time_env_and_machine(cartpole)
    assert t_env == pytest.approx(2 / env_timing.TIMING_BATCH)
    assert scale == pytest.approx(2 / env_timing.TIMING_REFERENCE_LOOPS / env_timing.REFERENCE_LOOP_TIME)


def test_async_batches_put_every_env_in_a_worker_unless_told_otherwise(closing):
    chosen = closing(ShmVectorEnv([cartpole] * 4, batch_size=2, start_method="fork"))
    assert chosen._pool.main is None and chosen.n_workers >= 1  # a main shard would step inside send()
    told = closing(ShmVectorEnv([cartpole] * 4, batch_size=2, use_main_process=True, start_method="fork"))
    assert told._pool.main is not None
    sync = closing(ShmVectorEnv([cartpole] * 4, start_method="fork"))
    assert sync._pool.plan.reason.startswith("auto: ") and sync._pool.plan.main_shard  # light envs, sync: in-process


def test_env_method_calls_every_step_price_the_layouts_with_workers():
    """A few 80 µs envs: one worker beside the main shard pays for its wake-up, but not for an
    env_method round trip on top of it each step (HER's compute_reward, MaskablePPO's masks)."""
    alone = choose(num_envs=4, cores=2, t_env=80e-6)
    called = choose(num_envs=4, cores=2, t_env=80e-6, calls_per_step=1)
    assert alone.n_workers == 1 and called.n_workers == 0
    assert "1 env_method call(s) per step" in called.reason
    in_process = predicted_step_time(4, 2, 80e-6, 0, True)
    assert predicted_step_time(4, 2, 80e-6, 0, True, calls_per_step=2) == in_process  # direct calls are free
    assert predicted_step_time(4, 2, 80e-6, 2, False, calls_per_step=1) == pytest.approx(
        predicted_step_time(4, 2, 80e-6, 2, False) + autoconfig.T_RARE_CALL
    )


def test_an_env_trained_every_step_stays_in_process_unless_workers_pay_for_the_spinning_caller():
    """HER (compute_reward): SAC's gradient step between every two steps. 4 FetchReach-like envs
    (850 µs) stay in the main process; 16 of them take workers, on 2 cores or 16."""
    her = {"calls_per_step": 1, "trains_every_step": True, "scale": 1.8}
    assert choose(num_envs=4, cores=2, t_env=850e-6, calls_per_step=1, scale=1.8).n_workers > 0
    assert choose(num_envs=4, cores=2, t_env=850e-6, **her).n_workers == 0
    assert choose(num_envs=16, cores=2, t_env=850e-6, **her).n_workers > 0
    assert choose(num_envs=16, cores=16, t_env=850e-6, **her).n_workers > 0
    assert "trained every step (HER)" in choose(num_envs=4, cores=2, t_env=850e-6, **her).reason
