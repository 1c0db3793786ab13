"""The engine: N envs in K worker processes over one shared-memory arena.

Each worker is a :class:`~shmvec.engine.link.WorkerLink` here (process, pipe, signals ``cmd``,
``done`` and ``finished``, env range, what it still owes). Four flows run over the links
(what publishes each hand-off: :mod:`shmvec.ipc.protocol`).

Start-up handshake (and again for a restarted worker, see :mod:`shmvec.engine.restart`)::

    main process                                   worker k (envs [s_k, e_k))
    link.spawn(env_fns[s_k:e_k]) ────────────────▶ build the envs
    recv ◀──────────────────────────────────────── Hello (spaces, metadata) | ErrorReport
    plan the arena from the spaces, create it
    pipe: Attach(arena name, layout) ────────────▶ attach it (untracked), wait for commands

Synchronous step (nothing pickled unless an env returned an info or ended)::

    step_async: write the action rows,
      ctrl[k].next_wait (how to wait after it),
      ctrl[k].post = (seq, STEP), post cmd[k] ───▶ step each env, write obs/reward/flag rows
    (main_shard: step the main shard meanwhile)    ctrl[k].status = OK | REPLY | ERROR
    step_wait: wait done[k] ◀───────────────────── post done[k]; then, unless OK, the pipe:
      (spin, then block in slices that check        [StepInfo, ...] or an ErrorReport
       every worker is alive), read the rows

Rare calls (reset, get_attr, env_method, render, ...; :mod:`shmvec.engine.rare_calls`)::

    requests.send: ctrl[k].post = (seq, MESSAGE),
      post cmd[k], pipe: Reset | RunOps ─────────▶ run it on the named envs
    requests.wait: wait done[k], recv ◀────────── status REPLY | ERROR; pipe: {env: result}

Past 8 workers a step is posted through a tree of workers (:mod:`shmvec.engine.step_tree`). Every command
carries the number of its post on ``cmd[k]`` (its seq) in the same word (``ctrl[k].post``, one store): a worker
that reads the word before taking that post takes posts until it has, and runs the sends in its inbox first.

Async batches (``send``/``recv``, :mod:`shmvec.engine.async_schedule`; an async reset is a rare call
whose envs :meth:`recv` then returns)::

    batches.send(env_ids): write their action rows;
      inbox[k] += ids, ctrl[k].post =
      (seq, sent, SEND), post cmd[k] ────────────▶ for each id up to sent, in order: step that
                                                    env, write its rows, outbox[k] += id,
    batches.recv(M): for each post taken from       post finished[k], post ready (one signal
      finished[k], take an id from outbox[k];       for all workers: a wake-up);
      queue them oldest first until M are ◀──────── then the pipe: its info or error
      (else wait on ready, watching liveness)

A dead worker raises :class:`~shmvec.errors.WorkerDiedError` and breaks the pool (one transition:
:meth:`ShmPool._break`), unless restarts are on and budget is left. Workers: :mod:`shmvec.processes.script_setup`.
"""

from __future__ import annotations

import atexit
import bisect
import functools
import math
import operator
import pickle
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.clocks.call_clock import CallClock, NoClock
from shmvec.engine.async_schedule import AsyncSchedule
from shmvec.engine.env_building import build_envs, describe_envs
from shmvec.engine.failures import main_shard_error
from shmvec.engine.interface import EngineBase
from shmvec.engine.link import WorkerLink, mp_context
from shmvec.engine.local_step import LocalStep
from shmvec.engine.rare_calls import Requests
from shmvec.engine.resources import PoolResources, finalize_unclosed
from shmvec.engine.restart import Rebuild, Restarter
from shmvec.engine.shard import EnvFailed, Shard
from shmvec.engine.step_tree import StepTree
from shmvec.engine.timing_run import timer
from shmvec.engine.validation import check_env_fns, check_same_spaces
from shmvec.engine.worker_waits import WorkerWaits
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import interrupts, pickled
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.arena import OwnedArena
from shmvec.ipc.info_rows import InfoReader, InfoWriter
from shmvec.ipc.protocol import Attach, Command, Hello, NextWait, Reset, RunOps, StepInfo
from shmvec.ipc.signals import MAX_SPIN, Signal
from shmvec.options import PoolOptions
from shmvec.planning.plan import describe_plan, plan_pool, usable_cores
from shmvec.processes.caller_threads import CallerThreads, caller_threads_for_pool
from shmvec.processes.omp_spin import short_spin_for_pool
from shmvec.processes.script_setup import for_workers, worker_start

# With a timeout set, start-up gets at least this long: spawned workers import modules first.
START_TIMEOUT = 30.0
# A caller back within this long (a bare stepping loop, ~40 µs; an MLP policy's forward pass,
# 0.3-0.8 ms) is back before a worker's spin (signals.MAX_SPIN) runs out: spinning through
# it spares the worker a ~80 µs wake-up, and a spinner yields its core to the caller's threads
# on every turn (an MLP's forward pass measured no slower). A CNN's forward pass takes longer.
CALLER_SPIN = MAX_SPIN / 2
_COMMAND_STEP = int(Command.STEP)  # plain ints for the hot path (IntEnum access costs ~1 µs)
_WAIT_OWN, _WAIT_BLOCK, _WAIT_SPIN = int(NextWait.OWN), int(NextWait.BLOCK), int(NextWait.SPIN)


class ShmPool(LocalStep, WorkerWaits, EngineBase):
    """Runs ``len(env_fns)`` envs in worker processes, stepping them through shared memory.

    This is the engine behind :class:`~shmvec.ShmPoolVecEnv` and
    :class:`~shmvec.ShmVectorEnv`; most users want one of those.

    Args:
        env_fns: callables that each build a new env (lambdas and closures are fine).
        options: how to run them (:class:`~shmvec.options.PoolOptions`).
        autoreset_mode: what a step does when an episode ends (gymnasium's AutoresetMode).
        env_wrapper: picklable callable applied to each env right after it is built.
        obs_space_match: ``obs_space_match(env0_space, env_space)``: whether an env's observation
            space fits env 0's (default: equality). The arena is laid out from env 0's space, so it
            must require the same leaves, shapes and dtypes (as ``is_space_dtype_shape_equiv``).
        obs_buffers: 2 double-buffers the observation leaves: each :meth:`step_async` and each :meth:`reset` of
            every env writes the other buffer, and :attr:`obs_leaves` then names it, so the caller may read the
            previous observations, in place, until the call after next starts (SB3's ``_last_obs``, zero-copy).
        batch_size: the caller collects in async batches of this many envs (``send``/``recv``), which the
            automatic plan runs in workers only (:func:`~shmvec.planning.plan.choose`).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        options: PoolOptions | None = None,
        *,
        autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
        env_wrapper: Callable[[gym.Env], gym.Env] | None = None,
        obs_space_match: Callable[[gym.Space, gym.Space], bool] = operator.eq,
        obs_buffers: int = 1,
        batch_size: int | None = None,
    ):
        env_fns = check_env_fns(env_fns)
        self.options = options = options or PoolOptions()
        self.num_envs = len(env_fns)
        if options.n_workers is not None:
            options.workers_for(self.num_envs)  # an explicit count is checked, then obeyed
        self.worker_start = worker_start(options)  # the script's set-up, taken before the timing run needs it
        timing = timer(options.start_method, self.worker_start)
        self.plan = plan_pool(options, env_fns, env_wrapper, batch_size, timing)
        self.n_workers, self.main_shard = self.plan.n_workers, self.plan.main_shard
        self.shards = lay.shard_bounds(self.num_envs, self.n_workers + self.main_shard)
        self._shard_starts = [start for start, _ in self.shards]
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.timeout = options.timeout
        self.start_limit = None if self.timeout is None else max(self.timeout, START_TIMEOUT)  # building envs
        self.pending: str | None = None  # "step" or "request": what the next wait collects
        self.omp_spin = "unchanged"  # what the pool does to the caller's OpenMP spins (set once started)
        self.caller = CallerThreads(None, False, None, "unchanged")  # the caller's threads (set once started)
        self._res = PoolResources()
        self._finalizer = weakref.finalize(self, finalize_unclosed, self._res)
        if not options.daemon:  # before multiprocessing's exit handler, which joins non-daemonic workers
            atexit.register(self._finalizer)
        self.restarter: Restarter | None = None  # restart mode, once started: a death during start-up raises
        try:
            self._start(env_fns, env_wrapper, obs_space_match, obs_buffers)
        except BaseException:
            self.close()  # also detaches the finalizer: no ResourceWarning for a failed start
            raise
        # where the main thread's time goes from now on (the adapters' calls wrap it)
        self.clock = CallClock() if self.options.timings else NoClock()

    # -- start-up ------------------------------------------------------------------

    @property
    def links(self) -> list[WorkerLink]:
        return self._res.links

    def _start(self, env_fns, env_wrapper, obs_space_match, obs_buffers) -> None:
        res, opts, plan = self._res, self.options, self.plan
        ctx = mp_context(opts.start_method)
        if self.n_workers:  # their log records are relayed here; the script's lines they miss, named
            self.worker_start, res.log_relay = for_workers(self.worker_start, opts)
        for k in range(self.n_workers):
            res.links.append(WorkerLink(k, *self.shards[k], plan.main_spin))
            res.links[k].spawn(ctx, env_fns, env_wrapper, plan.worker_spin, self.worker_start)
        if self.main_shard:  # built while the workers build theirs
            start, stop = self.shards[-1]
            failure = None
            try:
                res.main_envs = build_envs(env_fns[start:stop], env_wrapper, start, where="the main process")
            except EnvFailed as failed:
                failure = failed
            if failure is not None:  # outside the except: the env_fn's own exception, as a worker's comes
                raise main_shard_error(failure)
        hellos: list[Hello] = [self.message_from(link, self.start_limit) for link in self.links]
        if self.main_shard:
            hellos.append(describe_envs(-1, res.main_envs))
        spaces = [pair for hello in hellos for pair in hello.spaces]
        check_same_spaces(spaces, obs_space_match)
        self.single_observation_space, self.single_action_space = spaces[0]
        self.env_metadata, self.env_render_mode, self.env_spec = (
            hellos[0].metadata,
            hellos[0].render_mode,
            hellos[0].spec,
        )

        self.layout = lay.ArenaLayout.plan(
            self.single_observation_space,
            self.single_action_space,
            self.num_envs,
            self.n_workers,
            final_obs=self.autoreset_mode == AutoresetMode.SAME_STEP,
            obs_buffers=obs_buffers,
            timings=opts.timings,
        )
        res.arena = OwnedArena(self.layout.nbytes)
        res.ready = Signal.create(opts.max_spin)
        self.views = views = self.layout.views(res.arena.buf)
        self.rewards, self.terminated, self.truncated = views["reward"], views["terminated"], views["truncated"]
        self._init_obs_buffers(self.layout, views)
        self.actions = ActionRows(self.layout, views)  # written through this, in the callers' dtypes
        self.action_leaves = self.actions.leaves  # the shapes and dtypes to check actions against
        self._final_obs, self._final_flag = views.get(lay.FINAL_OBS), views.get(lay.FINAL_FLAG)
        self.pickled = pickled.PickledLeaves(self.layout, self.shards, self.num_envs)
        self.info_reader = InfoReader(views, self.shards, self.n_workers + self.main_shard)
        tree = self._step_tree = StepTree.of(self.links, views["ctrl"], opts.on_worker_failure == "restart")
        for link in self.links:
            link.ctrl = views["ctrl"][link.index]
            children = tree.children_names[link.index] if tree else ()
            link.conn.send_bytes(pickle.dumps(self.attach_message(step_children=children)))
        self.main: Shard | None = None  # the main process's shard, shards[-1], if main_shard
        if self.main_shard:
            start, space = self.shards[-1][0], self.single_action_space
            self.main = Shard(res.main_envs, start, views, self.layout, self.autoreset_mode, space, lane=self.n_workers)
        short_spin, self.omp_spin = short_spin_for_pool(opts.omp_spin, self.n_workers)
        # told of every step (and async send) and its return: see caller_threads
        busy = min(self.n_workers, math.ceil(self.n_workers * plan.cpu_share))  # workers of envs that wait idle
        self.caller = res.caller = caller_threads_for_pool(opts.torch_threads, busy, usable_cores(), short_spin)
        self._start_collaborators(env_fns, env_wrapper, obs_space_match)

    def _start_collaborators(self, env_fns, env_wrapper, obs_space_match) -> None:
        """The restarter (restart mode), the rare calls and the async schedule, each handed what it uses."""
        me = weakref.proxy(self)  # no reference cycle: an unclosed pool is still collected at once
        opts, views = self.options, self.views
        if opts.on_worker_failure == "restart":
            rebuild = Rebuild(
                spawn_args=(env_fns, env_wrapper, self.plan.worker_spin, self.worker_start),
                start_method=opts.start_method,
                start_limit=self.start_limit,
                spaces=(self.single_observation_space, self.single_action_space),
                obs_space_match=obs_space_match,
                attach=self.attach_message(restart=True),
            )
            same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
            self.restarter = Restarter(me, rebuild, views, self.info_reader, self.pickled, same_step, opts.max_restarts)
        shard_of = functools.partial(_shard_of, self._shard_starts)
        self.requests = Requests(me, self.links, shard_of, self.num_envs, self.main, self.pickled)
        self.batches = AsyncSchedule(
            me,
            self.requests,
            links=self.links,
            shards=self.shards,
            shard_of=shard_of,
            views=views,
            ready=self._res.ready,
            main=self.main,
            pickled=self.pickled,
            caller=self.caller,
            restarter=self.restarter,
        )

    def attach_message(self, restart: bool = False, step_children: tuple[str, ...] = ()) -> Attach:
        res = self._res
        return Attach(res.arena.name, self.layout, self.autoreset_mode, res.ready.name, restart, step_children)

    # -- the synchronous step ------------------------------------------------------

    @interrupts.holding  # Ctrl-C waits until the posts and counts agree
    def step_async(self, pickled_actions: dict[tuple, Sequence[Any]] | None = None) -> None:
        """Start a step with the actions already written into :attr:`actions`.

        ``pickled_actions``: leaf path -> one action per env, for the action leaves with no
        fixed size (:attr:`pickled.action_paths`); required when there are such leaves.
        """
        self.ensure_can_step()
        blobs = self.pickled.action_blobs(pickled_actions)  # before any post: a bad action sends nothing
        self.settle()
        if len(self._obs_buffers) > 1:
            self._next_obs_buffer()
        self.caller.step()
        if self.links:
            next_wait = self._next_wait()
            if self._step_tree is not None:  # many workers: they post each other (see step_tree)
                self._step_tree.post(next_wait)
            else:
                for link in self.links:
                    link.ctrl[lay.CTRL_NEXT_WAIT] = next_wait  # before the post: the worker reads it after the step
                    link.post(_COMMAND_STEP)
            for link in self.links if blobs is not None else ():
                self.pickled.send(link, blobs[link.index])
        self.pending = "step"

    def _next_wait(self) -> int:
        """How the workers wait for the step after this one: see protocol.NextWait."""
        if not self.plan.tight_loop_spin:
            return _WAIT_OWN
        return _WAIT_SPIN if time.perf_counter() - self.caller.returned_at < CALLER_SPIN else _WAIT_BLOCK

    @interrupts.holding
    def step_wait(self, timeout: float | None = None) -> list[StepInfo]:
        """Wait for the pending step (``timeout`` overrides the pool's); results are in the arena views.
        Returns the records the workers sent (infos, episode ends)."""
        self.take_pending("step")
        main_infos, main_failure, clock = [], None, self.clock
        started = time.perf_counter()
        if self.main is not None:  # step ours while the workers step theirs
            try:  # a Ctrl-C raises in the envs (interrupts.env_code); the workers' answers stay owed
                main_infos = interrupts.env_code(self.main.step, self.main.read_actions(self.pickled.main_actions))
            except EnvFailed as failure:
                main_failure = failure
            clock.stepped(time.perf_counter() - started)
        dead: list[WorkerLink] | None = [] if self.restarter else None
        tree, end = self._step_tree, self.deadline(timeout)  # one deadline, however many waits the step takes
        waiting = time.perf_counter()
        replies = tree.collect(self.collect, timeout, end) if tree else self.collect(self.links, timeout, dead, end)
        clock.waited(waiting, time.perf_counter())
        if main_failure is not None:
            raise main_shard_error(main_failure)
        for link in dead or ():
            replies[link.index] = self.restarter.restart_in_step(link)
        records = self.step_records(main_infos, replies)
        self.caller.returned()
        return records

    def collect_info_rows(self, main_shard: bool) -> None:
        """From now on :meth:`step_wait` leaves the infos of shared rows in :attr:`info_groups`; with
        ``main_shard``, the main shard's envs write theirs into rows too (otherwise they come as records)."""
        self.info_columns = True
        if main_shard and self.main is not None:
            self.main.write_infos_to(InfoWriter(self.views, self.n_workers))

    # -- rare calls ----------------------------------------------------------------

    def reset(self, kwargs: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """``env_i.reset(**kwargs[i])`` for each named env; observations land in the arena
        (pickled leaves in :attr:`pickled.obs <shmvec.ipc.pickled.PickledLeaves.obs>`). Returns their infos."""
        self._turn_for_reset(kwargs)
        return self.requests.call(Reset(kwargs))

    def _next_obs_buffer(self) -> None:
        super()._next_obs_buffer()
        for link in self.links:
            link.ctrl[lay.CTRL_OBS_BUFFER] = self.obs_buffer  # before the post: the worker reads it after
        if self.main is not None:
            self.main.select_obs_buffer(self.obs_buffer)

    def run(self, ops: dict[int, Callable[[gym.Env], Any]]) -> dict[int, Any]:
        """Apply ``ops[i](env_i)`` inside the workers; return ``{i: result}``."""
        return self.requests.call(RunOps(ops))

    # -- placement -----------------------------------------------------------------

    def shard_of(self, i: int) -> int:
        """The shard (worker index; ``n_workers`` for the main shard) that runs env ``i``."""
        return _shard_of(self._shard_starts, i)

    def page_lock(self, device: int | None = None) -> bool:
        """Page-lock the arena for CUDA copies once every worker attached it (``PoolResources.page_lock``)."""
        return self._res.page_lock(self.run, self.shards[: self.n_workers], device)

    # -- the end -------------------------------------------------------------------

    def close(self, terminate: bool = False) -> None:
        """Stop the workers and release every OS resource; safe to call twice. ``terminate=True``
        terminates the workers at once instead of asking them to close their envs and exit."""
        if terminate:
            self._res.graceful = False
        self.closed = True
        self._res.shutdown()  # idempotent, and resumes a close() that Ctrl-C interrupted
        self._finalizer.detach()
        atexit.unregister(self._finalizer)

    def description(self) -> str:
        return f"{describe_plan(self.plan)}, omp_spin={self.omp_spin!r}, torch_threads={self.caller.description()!r}"

    def __repr__(self) -> str:
        return f"ShmPool(num_envs={self.num_envs}, {self.description()})"

    def __enter__(self) -> ShmPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _shard_of(starts: list[int], i: int) -> int:
    """The shard of env ``i``, given where each shard starts."""
    return bisect.bisect_right(starts, i) - 1
