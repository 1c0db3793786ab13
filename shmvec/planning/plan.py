"""How a pool runs when nobody said: worker count, main shard and wait policy.

``n_workers=None`` (the default) times the env at start-up
(:func:`~shmvec.planning.env_timing.time_env_and_machine`: one extra env built from ``env_fns[-1]`` in a
throwaway process, :mod:`~shmvec.engine.timing_run`, a few random steps within ~50 ms, closed again) and
picks, among everything in the main process (``n_workers=0, use_main_process=True``), the main process plus
``P - 1`` workers (``use_main_process=True``) and ``P`` workers (the main process only waits), for ``P`` up to the
usable cores (:mod:`~shmvec.planning.machine`: the affinity set within the cgroup CPU quota, SMT siblings
counted once), the one the overhead model predicts fastest::

    step time = max(largest shard * t_env + per worker * (P - 2), CPU of all lanes / cores)
                + wake-up + sync(P) + bookkeeping(N)

(``sync``: 0 in-process, :data:`T_SYNC_SPIN` when every busy process has a core, :data:`T_SYNC_BLOCK` when the
main process waiting for workers would need one more; the main process posts to and collects from each worker
in turn, :data:`T_PER_WORKER`; with more workers than cores that turn and the wait for a core overlap the
shards' wait), that is ``fps_parallel / fps_serial ≈ N·t_env / (N·t_env / P + t_overhead)``.

Envs that wait rather than compute (a simulator answering over a socket, a robot) need no core while they
wait: the timing measures the share of an env's step that is CPU (thread CPU time against wall time), and when
it is under :data:`WAITING_SHARE` the candidates go beyond the cores, up to one worker per env (at most
:func:`max_lanes`: memory, within the cgroup memory limit, and file descriptors), each extra worker charged
its own cycle's CPU (:data:`T_WORKER_CYCLE`) on the shared cores and its turn in the main process (lanes are
processes: 256 envs waiting 2 ms reached 0.17 of the N/wait limit from one process of 256 threads, 0.3 from 128
processes, on 2 cores). The overheads are Python work, so they are scaled by how fast this machine runs Python
(a reference loop timed in turns with the env, :func:`~shmvec.planning.env_timing.time_env_and_machine`).

The model is that of a training loop, the loop users run: the caller computes (a policy's forward pass) between steps,
and every step with workers is charged a wake-up (:data:`T_SYNC_BLOCK`) on its critical path: workers block through a
long forward pass rather than hold its cores, and even spinning through a short one they share the cores with the
caller's threads (:class:`~shmvec.ipc.protocol.NextWait`); the policy's own threads then run slower too
(:data:`T_CALLER_TAX`). A few light envs then stay in the main process, where this would cost more than the envs' whole
step. The plan is made before the caller's first step, so it prices a caller whose compute between steps is heavy
(SAC's gradient step per env step, a CNN): with a light one (an MLP policy) the pool gives torch's threads to the
workers' cores (:mod:`~shmvec.processes.caller_threads`), and a worker would cost less than this. Calls the caller
makes every step are priced from what the env has: an ``env_method`` round trip each for ``action_masks`` (MaskablePPO)
and ``compute_reward`` (HER), and for the latter a gradient step between every two steps (:data:`T_TRAINING_CALLER`).
Among the candidates within :data:`ISOLATION_TOLERANCE` of the fastest it prefers those with no env in the main
process, and a layout chosen before on this machine for this env (:mod:`~shmvec.planning.plan_memory`) within its
margin of it. When the lanes outnumber the cores nobody spins: every wait blocks. A run that made the pool before
reuses its timing (:mod:`~shmvec.planning.remembered_timings`).

An explicit ``n_workers=K`` is obeyed as given (``use_main_process`` only if asked); only the wait policy is chosen.
Everything here but the timing and :func:`usable_cores` is pure: :func:`choose` is unit-tested with injected
timings and is what ``python -m shmvec.tune`` recommends.

Isolation: only ``n_workers=len(env_fns)`` with ``use_main_process`` unset (or False) guarantees one env per process
and no env in the main process; ``n_workers=None`` may step envs in the main process."""

from __future__ import annotations

import dataclasses
import logging
import math
import resource
from collections.abc import Callable
from typing import Any

from shmvec.ipc.signals import MAX_SPIN
from shmvec.options import PoolOptions
from shmvec.planning.env_timing import EnvTiming, time_env_and_machine
from shmvec.planning.machine import available_memory, usable_cpus
from shmvec.planning.outside_effects import NotTimed
from shmvec.planning.plan_memory import KEEP_MARGIN, plan_key, recall, remember
from shmvec.planning.remembered_timings import timing_of, unpicklable
from shmvec.processes.script_check import setup_is_shared

logger = logging.getLogger("shmvec")

# Calibrated on the 2-core machine (CartPole-v1 and a zero-cost env, round-robin medians):
T_SYNC_SPIN = 12e-6  # one synchronous round trip when waiter and workers each have a core (spin)
T_SYNC_BLOCK = 70e-6  # ... when they do not: the main process blocks and pays a wake-up per step
# What a policy's forward pass loses per step while workers share the cores (its OpenMP threads sleep between
# ops, see omp_spin): +80 µs (HalfCheetah's MLP) to +200 µs (Acrobot's) on a 2-core VM at scale ~1.8.
T_CALLER_TAX = 45e-6
T_BOOK_FIXED = 10e-6  # the main process's per-step bookkeeping (adapters), any configuration
T_BOOK_PER_ENV = 0.15e-6  # ... per env (observation copy, infos)
T_WRITE_PER_ENV = 0.4e-6  # a shard writing one env's rows into shared memory, on top of the step
# The main process posts to each worker and collects its answer in turn: each worker beyond the two that
# T_SYNC_* were calibrated with adds this (~5 µs of main-thread CPU per worker, 2-core VM, scale ~2, K = 4-64).
T_PER_WORKER = 2.5e-6
# ... and with more workers than cores, each woken worker also waits for a core: fitted to 32 to 1024 envs that
# wait 2 ms on 2 cores, 8 to 256 workers (step = max(largest shard's wait + K * this, CPU / cores) within 5 %).
T_PER_CROWDED_WORKER = 12e-6
# A worker's CPU per step outside its envs (woken from a futex, its command loop, its post, the
# context switches around its env's wait), which lanes beyond the cores share them for (same fit).
T_WORKER_CYCLE = 55e-6
T_RARE_CALL = 50e-6  # an env_method round trip to blocked workers: HER's compute_reward, 92 µs at scale ~1.8
# A caller training between steps (HER: SAC's gradient step) leaves torch's idle threads spinning on the cores the
# workers need: SAC + HER, FetchReach x4, 2 workers: 1.65 ms a step slower than in-process, 1.7 ms of envs saved.
T_TRAINING_CALLER = 1.8e-3
# Envs whose step is less than this share CPU (thread CPU time / wall time) are planned as waiting:
# lanes beyond the cores are considered for them.
WAITING_SHARE = 0.5
MAX_LANES = 256  # most workers the plan starts for waiting envs
WORKER_MEMORY = 64 * 2**20  # memory budgeted per worker for waiting envs: ~7 MB of its own, the rest its envs'
ISOLATION_TOLERANCE = 0.05  # give up at most 5 % of predicted speed to keep envs out of the main process
# A main process with no shard, beside workers on every core, spins at most this long (about
# three wake-ups): it shares a core with a worker, and spinning through a longer shard slows
# that worker more than a wake-up costs.
SHARED_CORE_SPIN = 300e-6


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a pool runs: ``n_workers`` processes, maybe a main shard, and how each side waits.

    Attributes:
        n_workers: worker processes.
        main_shard: the main process steps the last shard itself.
        worker_spin: bound (seconds) of a worker's adaptive spin while it waits for a command.
        main_spin: bound of the main process's adaptive spin while it waits for the workers.
        reason: why, in a few words (shown by ``repr`` and logged).
        t_env: the measured seconds per env step, if it was measured.
        tight_loop_spin: whether workers spin (up to :data:`~shmvec.ipc.signals.MAX_SPIN`) for
            their next step while the caller steps in a tight loop (see
            :class:`~shmvec.ipc.protocol.NextWait`); otherwise they spin within ``worker_spin``.
        cpu_share: the part of ``t_env`` that was CPU time (the rest, waiting: see :func:`choose`).
        scale: how many times slower than the calibration machine this one ran Python, if timed.
    """

    n_workers: int
    main_shard: bool
    worker_spin: float
    main_spin: float
    reason: str
    t_env: float | None = None
    tight_loop_spin: bool = False
    cpu_share: float = 1.0
    scale: float | None = None

    def constructor_args(self) -> str:
        """The keyword arguments that build this plan explicitly, e.g. ``n_workers=1, use_main_process=True``."""
        return f"n_workers={self.n_workers}" + (", use_main_process=True" if self.main_shard else "")


def describe_plan(plan: Plan) -> str:
    """What ``repr()`` of a pool shows: ``n_workers=1, use_main_process=True`` (rebuilds the layout), ``why=...``."""
    return f"n_workers={plan.n_workers}, use_main_process={plan.main_shard}, why={plan.reason!r}"


def usable_cores() -> int:
    """Cores this process may keep busy: its affinity set within the cgroup CPU quota, SMT siblings counted once."""
    return usable_cpus().physical


def max_lanes(num_envs: int) -> int:
    """Most workers worth starting for ``num_envs`` waiting envs: one per env, within
    :data:`MAX_LANES`, the memory available (:data:`WORKER_MEMORY` each; ``MemAvailable``
    within the cgroup memory limits, see :func:`~shmvec.planning.machine.available_memory`)
    and the file descriptors the main process may open (a few per worker)."""
    limit = min(num_envs, MAX_LANES)
    try:
        limit = min(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 8)
    except (ValueError, OSError):
        pass
    available = available_memory()
    if available is not None:
        limit = min(limit, available // WORKER_MEMORY)
    return max(1, limit)


def shard_sizes(num_envs: int, n_workers: int, main_shard: bool) -> tuple[int, int]:
    """(largest shard, main shard size) as :func:`shmvec.ipc.layout.shard_bounds` splits them."""
    lanes = n_workers + main_shard
    largest = math.ceil(num_envs / lanes)
    main = num_envs // lanes if main_shard else 0  # the main shard is the last, a smaller one if uneven
    return largest, main


def predicted_step_time(
    num_envs: int,
    cores: int,
    t_env: float,
    n_workers: int,
    main_shard: bool,
    scale: float = 1.0,
    caller_computes: bool = True,
    cpu_share: float = 1.0,
    calls_per_step: int = 0,
    trains_every_step: bool = False,
) -> float:
    """Seconds per synchronous vector step of this configuration (the overhead model);
    ``scale`` multiplies the overheads (:mod:`~shmvec.planning.env_timing`). ``caller_computes``: the
    caller runs a policy between steps, so workers wake up from a blocked wait each step
    and the policy's threads pay :data:`T_CALLER_TAX` (``False``: a bare stepping loop,
    where they spin). ``cpu_share``: the part of ``t_env`` that is CPU (the rest waits).
    ``calls_per_step``: ``env_method`` calls each step, a round trip (:data:`T_RARE_CALL`) with workers;
    ``trains_every_step``: a gradient step between every two steps (:data:`T_TRAINING_CALLER` with workers)."""
    lanes = n_workers + main_shard
    largest, _ = shard_sizes(num_envs, n_workers, main_shard)
    per_env = t_env + T_WRITE_PER_ENV * scale
    cpu = num_envs * (t_env * cpu_share + T_WRITE_PER_ENV * scale)
    turns = T_PER_WORKER * max(0, n_workers - 2)  # the main process's turn with each worker beyond the sync's two
    if lanes > cores:  # the workers' own cycles compete for the cores, and each woken worker waits for one
        cpu += n_workers * T_WORKER_CYCLE * scale
        turns = T_PER_CROWDED_WORKER * n_workers
    stepping = max(largest * per_env + turns * scale, cpu / cores)
    if n_workers == 0:
        sync = 0.0
    elif n_workers + 1 <= cores or (main_shard and lanes <= cores):
        sync = T_SYNC_SPIN
    else:
        sync = T_SYNC_BLOCK
    wake = T_SYNC_BLOCK + T_CALLER_TAX if caller_computes and n_workers else 0.0
    calls = (T_RARE_CALL * calls_per_step + T_TRAINING_CALLER * trains_every_step) if n_workers else 0.0
    return stepping + (wake + sync + calls + T_BOOK_FIXED + T_BOOK_PER_ENV * num_envs) * scale


def candidates(
    num_envs: int, cores: int, main_shard: bool | None = None, max_lanes: int | None = None, mix: bool = True
) -> list[tuple[int, bool]]:
    """(n_workers, main_shard) pairs worth considering, up to ``max_lanes`` lanes (default: the
    cores); ``main_shard`` True/False restricts them, and so does ``mix=False`` (envs all in the
    main process or all in workers)."""
    pairs = []
    for lanes in range(1, min(num_envs, cores if max_lanes is None else max_lanes) + 1):
        if main_shard is not False and (mix or lanes == 1):
            pairs.append((lanes - 1, True))
        if main_shard is not True:
            pairs.append((lanes, False))
    return pairs


def choose(
    num_envs: int,
    cores: int,
    t_env: float,
    main_shard: bool | None = None,
    max_spin: float = 200e-6,
    scale: float = 1.0,
    batch_size: int | None = None,
    cpu_share: float = 1.0,
    lanes: int | None = None,
    mix: bool = True,
    calls_per_step: int = 0,
    trains_every_step: bool = False,
    keep: tuple[int, bool] | None = None,
) -> Plan:
    """The configuration the model predicts fastest, preferring envs out of the main process on near-ties
    and ``keep`` (``(n_workers, main_shard)`` chosen before) within :data:`~shmvec.planning.plan_memory.KEEP_MARGIN`.

    ``scale``: how much slower than the calibration machine this one runs Python (:mod:`~shmvec.planning.env_timing`).
    ``cpu_share``: the share of ``t_env`` that is CPU; under :data:`WAITING_SHARE` the env is
    planned as waiting, with up to ``lanes`` workers (default :func:`max_lanes`).
    ``mix=False``: no plan with envs both in the main process and in workers.
    ``calls_per_step``: ``env_method`` calls each step (:data:`~shmvec.planning.env_timing.PER_STEP_CALLS`);
    ``trains_every_step``: the env has ``compute_reward`` (HER: a gradient step per env step).
    ``batch_size`` (fewer than ``num_envs``): the caller collects in async batches, so every env
    runs in a worker (``main_shard`` False unless given), stepping one batch while the caller
    works on another; the worker count is the one a synchronous step would use, and the reason
    says so rather than predict a synchronous speed-up.

    Example:
        >>> choose(num_envs=64, cores=2, t_env=8e-6).constructor_args()  # CartPole-like: a main shard pays
        'n_workers=1, use_main_process=True'
        >>> choose(num_envs=8, cores=2, t_env=8e-6).constructor_args()  # ... but not for a few of them
        'n_workers=0, use_main_process=True'
        >>> choose(num_envs=8, cores=2, t_env=1e-3).constructor_args()  # heavy: workers cost nothing extra
        'n_workers=2'
        >>> choose(num_envs=2, cores=2, t_env=20e-6, scale=3.0).constructor_args()  # a slow machine: dearer round trips
        'n_workers=0, use_main_process=True'
        >>> choose(num_envs=4, cores=2, t_env=80e-6).constructor_args()  # 4 robot arms: a worker pays...
        'n_workers=1, use_main_process=True'
        >>> choose(num_envs=4, cores=2, t_env=80e-6, calls_per_step=1).constructor_args()  # ... unless HER calls env 0
        'n_workers=0, use_main_process=True'
        >>> choose(num_envs=32, cores=2, t_env=2e-3, cpu_share=0.02, lanes=32).constructor_args()  # envs that wait 2 ms
        'n_workers=32'
        >>> choose(num_envs=8, cores=2, t_env=38e-6).constructor_args()  # HalfCheetah-like, 8 of them: a near-tie...
        'n_workers=1, use_main_process=True'
        >>> choose(num_envs=8, cores=2, t_env=38e-6, keep=(0, True)).constructor_args()  # ... keeps the layout it had
        'n_workers=0, use_main_process=True'
    """
    batched = batch_size is not None and batch_size < num_envs
    if batched and main_shard is None:
        main_shard = False  # the main process runs the caller: every env steps beside it
    waiting = cpu_share < WAITING_SHARE
    if waiting:
        lanes = max(cores, max_lanes(num_envs) if lanes is None else lanes)
    else:
        lanes = cores

    def predicted(k: int, main: bool) -> float:
        return predicted_step_time(
            num_envs, cores, t_env, k, main, scale, True, cpu_share, calls_per_step, trains_every_step
        )

    timed = [(predicted(k, main), k, main) for k, main in candidates(num_envs, cores, main_shard, lanes, mix)]
    best = min(t for t, _, _ in timed)
    near = [(t, k, main) for t, k, main in timed if best / t >= 1.0 - ISOLATION_TOLERANCE]
    # No env in the main process if that is near the best, then the fastest, then fewest processes.
    step, k, main = min(near, key=lambda c: (c[2], c[0], c[1]))
    kept = [t for t, *layout in timed if tuple(layout) == keep != (k, main) and t <= step * (1.0 + KEEP_MARGIN)]
    if kept:  # near a point where two layouts cost the same: the timing's noise does not flip the choice
        step, (k, main) = kept[0], keep
    serial = predicted(0, True)
    kind = f" ({cpu_share:.0%} CPU: waits)" if waiting else ""
    kind += f", {calls_per_step} env_method call(s) per step" if calls_per_step else ""
    kind += ", trained every step (HER)" if trains_every_step else ""
    reason = (
        f"auto: {t_env * 1e6:.1f} µs/env step{kind}, {cores} cores, "
        + (
            f"async batches of {batch_size}: the workers step one while the caller works on another"
            if batched
            else f"predicted {serial / step:.2f}x in-process in a training loop"
        )
        + (", as chosen before on this machine" if kept else "")
    )
    plan = _with_waits(num_envs, cores, t_env, k, main, max_spin, reason, scale, cpu_share)
    return dataclasses.replace(plan, scale=scale)


def explicit(num_envs: int, cores: int, n_workers: int, main_shard: bool, max_spin: float = 200e-6) -> Plan:
    """The plan for ``n_workers`` given by the caller: as asked, only the waits are chosen."""
    reason = f"n_workers={n_workers} given" + (", use_main_process=True" if main_shard else "")
    return _with_waits(num_envs, cores, None, n_workers, main_shard, max_spin, reason)


def _with_waits(num_envs, cores, t_env, n_workers, main_shard, max_spin, reason, scale=1.0, cpu_share=1.0) -> Plan:
    """Add the wait policy: how long each side may spin (adaptively, see :mod:`shmvec.ipc.signals`).

    When the lanes (workers, plus the main process if it steps a shard) fit the cores,
    every busy process has a core: while the workers step, a main process with no shard
    only waits, sharing a core with a worker it yields to on every turn. Then

    - the main process spins through the workers' shards: for twice the largest one's
      expected time, if spinning that long is worth it (at most its limit, else
      ``max_spin``, after which it blocks), and for its limit when the env was not timed
      (the adaptive spin then turns itself off if most waits outlast it). A wake-up from
      a blocked wait costs ~80 µs on a 2-core VM, a spinning one ~15 µs. The limit is
      :data:`~shmvec.ipc.signals.MAX_SPIN`, or :data:`SHARED_CORE_SPIN` when the main process
      has no shard and the workers fill every core (it then shares a core with one);
    - a worker waits for its next step as the main process says with each step
      (``tight_loop_spin``, :class:`~shmvec.ipc.protocol.NextWait`): spinning while the caller
      comes back soon (a tight loop, an MLP policy's forward pass), blocking at once while it
      computes for long between steps (a CNN's forward pass);
      between other commands it spins within twice the main process's expected cycle
      (its shard and bookkeeping; ``max_spin`` when not timed).

    When the lanes outnumber the cores, both sides block: a spinner would take a core from
    a process with work to do. ``max_spin=0`` always blocks.
    """
    lanes = n_workers + main_shard
    if max_spin == 0 or lanes > cores:
        return Plan(n_workers, main_shard, 0.0, 0.0, reason, t_env, cpu_share=cpu_share)
    spin_limit = MAX_SPIN if main_shard or lanes < cores else max(max_spin, SHARED_CORE_SPIN)
    worker_spin, main_spin = max_spin, spin_limit
    if t_env is not None:
        largest, main_envs = shard_sizes(num_envs, n_workers, main_shard)
        per_env = t_env + T_WRITE_PER_ENV * scale
        main_cycle = main_envs * per_env + (T_BOOK_FIXED + T_BOOK_PER_ENV * num_envs) * scale
        worker_spin = min(MAX_SPIN, max(max_spin, 2.0 * main_cycle))
        main_spin = max(max_spin, 2.0 * largest * per_env)
        main_spin = main_spin if main_spin <= spin_limit else max_spin  # a spin that cannot cover the wait only costs
    return Plan(n_workers, main_shard, worker_spin, main_spin, reason, t_env, True, cpu_share)


def plan_pool(
    options: PoolOptions,
    env_fns: list,
    env_wrapper=None,
    batch_size: int | None = None,
    time_env: Callable[[Callable[[], Any]], EnvTiming] = time_env_and_machine,
) -> Plan:
    """The plan for a pool of ``env_fns`` with ``options``: :func:`explicit` if ``n_workers`` is set, else timed by
    ``time_env`` (in a throwaway process, :mod:`~shmvec.engine.timing_run`) on the last env's factory (scripts that
    treat one env apart treat env 0: CleanRL records its episodes), and chosen (:func:`choose`), keeping a layout
    chosen before near the best (:mod:`~shmvec.planning.plan_memory`). With ``main_shard`` unset, envs go both to
    the main process and to workers only where they see one set-up there
    (:func:`~shmvec.processes.script_check.setup_is_shared`). An env that cannot be timed (it raises) or would be
    seen (rendering to a window, :mod:`~shmvec.planning.outside_effects`) runs in one worker per core (a worker
    reports its error); one that cannot be pickled, in this process.
    """
    num_envs, cpus = len(env_fns), usable_cpus()
    cores, main_shard, max_spin = cpus.physical, options.main_shard, options.max_spin
    if options.n_workers is not None:
        plan = explicit(num_envs, cores, options.n_workers, bool(main_shard), max_spin)
    elif main_shard is not False and (why_not := unpicklable(env_fns[-1])):  # in no other process: in this one
        plan = Plan(0, True, max_spin, max_spin, f"auto, env {num_envs - 1}'s factory cannot be pickled ({why_not})")
    else:
        try:
            timing = timing_of(_wrapped(env_fns[-1], env_wrapper), time_env, options)
        except Exception as exc:  # reported again, properly, when a worker builds it
            k = min(num_envs, cores) - bool(main_shard)
            why = f"not timed, as {exc}" if isinstance(exc, NotTimed) else f"timing env {num_envs - 1} failed: {exc}"
            plan = Plan(k, bool(main_shard), max_spin, max_spin, f"auto, {why}: one worker per core")
        else:
            mix = main_shard is not None or setup_is_shared(options)
            key = plan_key(timing.identity, num_envs, cpus.why, [main_shard, batch_size, mix, cores])
            args = (num_envs, cores, timing.t_env, main_shard, max_spin, timing.scale, batch_size, timing.cpu_share)
            per_step = {"calls_per_step": timing.per_step_calls, "trains_every_step": timing.trains_every_step}
            plan = choose(*args, mix=mix, keep=recall(key), **per_step)
            remember(key, plan.n_workers, plan.main_shard)
    logger.info("shmvec pool of %d envs (%s): %s", num_envs, cpus.why, describe_plan(plan))
    return plan


def _wrapped(env_fn, env_wrapper):
    return env_fn if env_wrapper is None else (lambda: env_wrapper(env_fn()))
