"""Timing an env at start-up: its step's wall time, how much of it is CPU, and this machine's speed.

:mod:`~shmvec.planning.plan` prices every layout with overheads calibrated on one machine
(its ``T_*`` constants); :func:`time_env_and_machine` says how long the user's env takes
against those overheads here, and whether it computes or waits.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

# reference_loop()'s time on the machine the T_* above were calibrated on. Estimated: the loop
# and CartPole-v1's step timed alongside on a slower VM (21.8 µs, 21.2 µs), and CartPole's
# step on the calibration machine (6.3 µs).
REFERENCE_LOOP_TIME = 6.5e-6
TIMING_BUDGET = 0.05  # seconds spent timing the env at start-up
TIMING_MAX_STEPS = 400
TIMING_BATCH = 10  # steps per timed batch; a median over batches decides (a first call or a hiccup does not)
TIMING_REFERENCE_LOOPS = 5  # reference_loop() calls timed after each batch (~30-70 µs)
# Env methods that known algorithms call through ``env_method`` once per step: sb3-contrib's
# MaskablePPO asks every env for ``action_masks`` before each step, SB3's HerReplayBuffer has
# env 0 ``compute_reward`` for every batch it samples (one per gradient step).
PER_STEP_CALLS = ("action_masks", "compute_reward")


class EnvTiming(NamedTuple):
    """What :func:`time_env_and_machine` measured."""

    t_env: float  # seconds per step (wall time)
    scale: float  # how many times slower than the calibration machine this one runs reference_loop()
    cpu_share: float  # the part of t_env that is the thread's CPU time (the rest, waiting in syscalls)
    per_step_calls: int = 0  # how many of PER_STEP_CALLS the env has: env_method round trips expected per step
    trains_every_step: bool = False  # it has compute_reward: HER trains on it with a gradient step per env step
    identity: str = ""  # what the env is, for the plan's memory (plan_memory.env_identity); "" not known


def time_env_and_machine(
    env_fn: Callable[[], object], budget: float = TIMING_BUDGET, max_steps: int = TIMING_MAX_STEPS
) -> EnvTiming:
    """Seconds per ``step()`` of one env built by ``env_fn`` (resets included), how many
    times slower than the calibration machine this one runs :func:`reference_loop` (the
    ``scale`` of the overheads), and how much of the step is CPU, timed in turns within ~``budget``.

    The plan depends on their ratio alone, so they are timed in turns: whatever slows this
    process meanwhile (another process on its core, a first run after an install) slows
    both alike and leaves the plan as it would be. The env is built in this process, reset,
    stepped with random actions (its action space seeded with 0) in batches of
    :data:`TIMING_BATCH`, each followed by :data:`TIMING_REFERENCE_LOOPS` reference loops,
    and closed (:mod:`~shmvec.engine.timing_run` runs this in a process of its own). The
    ratio is the median of each batch's CPU time against the loops' right after it
    (:func:`estimate`), so slowdowns
    that happen to hit more env batches than loops do not decide it (on a VM
    whose speed varied 2x between processes, 16 timings of Acrobot spread ±6 % where the
    ratio of the two medians spread ±15 %); the scale is the median of the loops. The CPU
    share is the median of each batch's :func:`cpu_share`: an env that waits on a simulator,
    a socket or a sleep uses its thread's CPU only around the wait, while a CPU-bound env on a
    loaded machine waits for a core, which the run queue's count tells apart. ``per_step_calls``
    counts the methods of :data:`PER_STEP_CALLS` the env has (looked up as ``env_method`` does).
    The time of those calls is not counted in the step's: with workers they run in parallel,
    but MaskablePPO on 8 envs whose masks cost 4x their step, planned so, took 2 workers and
    trained 1.5x slower than in the main process on 2 cores (its policy's many small ops
    slowed by the short OpenMP spins, :mod:`~shmvec.processes.omp_spin`; 1.0x without them).
    """
    env, run_queue = env_fn(), RunQueue()
    try:
        env.action_space.seed(0)
        env.reset(seed=0)
        _step_or_reset(env, env.action_space.sample())  # warm-up: first calls allocate
        reference_loop()
        env_cpu: list[float] = []
        loop_cpu: list[float] = []
        cpu_shares: list[float] = []
        deadline = time.perf_counter() + budget
        while len(env_cpu) * TIMING_BATCH < max_steps:
            actions = [env.action_space.sample() for _ in range(TIMING_BATCH)]  # drawn untimed
            # The run queue is read outside the clocks: a preemption on the way into or out of its read
            # (a system call's return is where one lands) then counts as queued, not as the env's wall time.
            start_queued = run_queue.wait()
            start, start_cpu = time.perf_counter(), time.thread_time()
            for action in actions:
                _step_or_reset(env, action)
            wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
            queued = run_queue.wait() - start_queued
            env_cpu.append(cpu / TIMING_BATCH)
            cpu_shares.append(cpu_share(wall, cpu, queued))
            loop_cpu.append(_time_reference_loops())
            if time.perf_counter() > deadline:
                break
        t_env, loop_time, share = estimate(env_cpu, loop_cpu, cpu_shares)
        calls = sum(_method(env, name) is not None for name in PER_STEP_CALLS)
        her = _method(env, "compute_reward") is not None
        return EnvTiming(t_env, loop_time / REFERENCE_LOOP_TIME, share, calls, her)
    finally:
        run_queue.close()
        env.close()


def estimate(env_cpu: list[float], loop_cpu: list[float], cpu_shares: list[float]) -> tuple[float, float, float]:
    """(seconds per step, seconds per :func:`reference_loop`, CPU share) from each batch's CPU time
    per step, the CPU time per loop timed right after it, and the batch's :func:`cpu_share`.

    CPU time, not wall time: what another process or the hypervisor takes from the timed
    thread (a preemption, a stolen time slice) counts in neither. A step's wall time is its
    CPU time over its CPU share (an env that waits on a socket half of its step takes twice
    its CPU time). On the 2-core VM with the other core and this one's siblings busy, the ratio
    of wall times over 12 fresh timings of HalfCheetah spread from 4.6 to 12.0, that of CPU
    times from 4.5 to 5.6.
    """
    share = statistics.median(cpu_shares)
    ratio = statistics.median(e / max(loop, 1e-9) for e, loop in zip(env_cpu, loop_cpu))
    loop_time = statistics.median(loop_cpu)
    return ratio / share * loop_time, loop_time, share


def cpu_share(wall: float, cpu: float, queued: float) -> float:
    """The share of a step that is CPU: CPU time over the wall time the thread was not kept off a
    core by others (``queued``: waiting on a run queue, preempted). On a loaded machine a
    CPU-bound env's wall time is mostly such waiting, which is not the env waiting."""
    ran = wall - queued
    return cpu / ran if 0 < ran and cpu < ran else 1.0


class RunQueue:
    """Seconds the calling thread has spent runnable but waiting for a CPU: Linux's
    ``/proc/thread-self/schedstat`` (second field), kept open and read with one ``pread``
    (~2 µs); always 0 where it is not available. Use it from the thread that made it."""

    def __init__(self):
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def wait(self) -> float:
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_REFERENCE_ROWS, _REFERENCE_FLAGS = np.zeros((64, 4), np.float32), np.zeros(64, bool)  # reference_loop's buffers


def reference_loop() -> None:
    """A fixed piece of the kind of Python work the overheads are: small dicts, numpy slices and scalar writes."""
    rows, flags = _REFERENCE_ROWS, _REFERENCE_FLAGS
    infos = [{"TimeLimit.truncated": False} for _ in range(64)]
    for i in range(64):
        flags[i] = False
        infos[i]["env"] = i
    rows[:32] = rows[32:]
    (flags | flags).nonzero()


def _time_reference_loops() -> float:
    """CPU seconds per :func:`reference_loop`, over :data:`TIMING_REFERENCE_LOOPS` calls after an untimed one.

    The untimed call is for envs that wait: Python right after a pause runs several times
    slower for a while (caches gone cold; 3-4x after 1 ms on the 2-core VM), which would
    make the machine look that much slower than it is.
    """
    reference_loop()
    start = time.thread_time()
    for _ in range(TIMING_REFERENCE_LOOPS):
        reference_loop()
    return (time.thread_time() - start) / TIMING_REFERENCE_LOOPS


def _step_or_reset(env, action) -> None:
    _, _, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
        env.reset()


def _method(env, name: str):
    """The method ``env_method(name)`` would call (looked up through the wrappers, as SB3's vec envs do), or None."""
    lookup = getattr(env, "get_wrapper_attr", None)
    try:
        method = lookup(name) if lookup is not None else getattr(env, name)
    except AttributeError:
        return None
    return method if callable(method) else None
