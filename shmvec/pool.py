"""The engine: N envs in K worker processes over one shared-memory arena.

Data flow of one step (nothing is pickled unless an env returned an info or ended)::

    main process                                    worker k (envs [s_k, e_k))
    ------------                                    --------------------------
    step_async(actions)
      arena.action[:] = actions
      ctrl[k].command = STEP
      cmd[k].post()  ───────────────────────────▶  cmd[k].wait()    (spin, then block)
                                                    for i in s_k..e_k:
                                                        env_i.step(arena.action[i])
                                                        arena.obs/reward/terminated/truncated[i] = ...
                                                    ctrl[k].status = OK | REPLY | ERROR
    step_wait()                                     done[k].post()
      done[k].wait()  ◀─────────────────────────── (pipe: [StepInfo, ...] or ErrorReport,
        (spin, then block in slices that                 only if status != OK)
         check every worker is alive)
      read the arena views; recv flagged pipes

The adapters (:mod:`shmvec.sb3`, :mod:`shmvec.vector`) turn the arena views and
:class:`~shmvec.protocol.StepInfo` records into their library's return values.
"""

from __future__ import annotations

import bisect
import copy
import multiprocessing as mp
import operator
import os
import pickle
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec import layout as lay
from shmvec.errors import (
    ClosedEnvError,
    SpaceMismatchError,
    StepStateError,
    StepTimeoutError,
    WorkerDiedError,
)
from shmvec.failures import (
    CLOSE_HINT,
    describe_exit,
    main_shard_error,
    ranges,
    remote_error,
)
from shmvec.protocol import (
    Attach,
    Command,
    ErrorReport,
    Hello,
    Reset,
    RunOps,
    Status,
    StepInfo,
)
from shmvec.resources import CLOSE_TIMEOUT, PoolResources, finalize_unclosed
from shmvec.shard import EnvFailed, Shard, build_envs, describe_envs
from shmvec.shm import OwnedArena
from shmvec.sync import Signal
from shmvec.validation import check_env_fns, check_same_spaces
from shmvec.worker import worker_main

LIVENESS_INTERVAL = 0.1  # seconds between checks that every worker is still alive while waiting
# With a timeout set, start-up gets at least this long: spawned workers import modules first.
START_TIMEOUT = 30.0
# Upper bound (seconds) of the adaptive spin on either side. Measured here (CartPole N=64,
# 2 cores, vs SyncVectorEnv): 50 µs -> 1.29x (K=2) / 1.47x (main_shard); 200 µs -> 1.63x /
# 1.88x; with K=4 on 2 cores (oversubscribed) 1.35x / 1.50x at 50 µs and 1.27x / 1.37x at
# 200 µs: no collapse, as waits that outgrow it turn the spin off.
DEFAULT_SPIN = 200e-6


# What the main process still expects from a worker.
_IDLE, _AWAIT_DONE, _AWAIT_PAYLOAD = 0, 1, 2
# Plain ints for the hot path: attribute access on an IntEnum member costs ~1 µs.
_COMMAND_STEP, _STATUS_OK = int(Command.STEP), int(Status.OK)


def default_start_method() -> str:
    """forkserver where available, else spawn (the choice SB3's SubprocVecEnv makes)."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _preload_in_forkserver(ctx: Any) -> None:
    """Have the forkserver import the worker module once, before it forks any worker.

    Otherwise each forkserver worker imports numpy, gymnasium and shmvec itself: seconds
    per worker on a small machine. Only takes effect if the server has not started yet;
    modules the user asked to preload are kept.
    """
    from multiprocessing import forkserver

    preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    if "shmvec.worker" not in preload:
        ctx.set_forkserver_preload([*preload, "shmvec.worker"])


class ShmPool:
    """Runs ``len(env_fns)`` envs in ``n_workers`` processes, stepping them through shared memory.

    This is the engine behind :class:`~shmvec.ShmPoolVecEnv` and
    :class:`~shmvec.ShmVectorEnv`; most users want one of those.

    Args:
        env_fns: callables that each build a new env (lambdas and closures are fine).
        n_workers: worker processes; default ``min(len(env_fns), os.cpu_count())``, one
            less with ``main_shard``. Envs are split into contiguous shards whose sizes
            differ by at most one.
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default forkserver.
        autoreset_mode: what a step does when an episode ends (see gymnasium's AutoresetMode).
        timeout: seconds to wait for any answer from the workers before raising
            :class:`~shmvec.errors.StepTimeoutError`; ``None`` waits as long as they live.
            Building the envs at start-up gets at least ``START_TIMEOUT`` (30 s).
        worker_threads: torch/OpenMP/BLAS threads per worker; ``None`` leaves them alone.
        env_wrapper: picklable callable applied to each env right after it is built.
        max_spin: seconds a waiter may spin before blocking (adaptive below this bound);
            ``0`` always blocks.
        main_shard: the main process steps one more shard itself (the last one) while the
            workers step theirs. Fastest for light envs, as no wake-up sits on the critical
            path, but those envs share the main process: a crash there is not isolated.
        on_worker_failure: what a worker process dying (exit, signal) during a step does.
            ``"raise"`` (default): :class:`~shmvec.errors.WorkerDiedError`, and the pool is
            unusable. ``"restart"``: the worker is re-created from its envs' env_fns (same
            rows, same shared memory), its new envs are reset (seed ``None``) and that step
            reports each of them with reward 0, ``terminated=False``, ``truncated=True``
            and a :class:`~shmvec.protocol.StepInfo` with ``restarted=True`` carrying the
            reset info (the adapters turn it into the info flag ``"shmvec_restarted"``);
            the other workers' results of the step are kept. A worker found dead while
            idle is restarted at the next step, the same way. In NEXT_STEP mode the
            restarted envs' next step is an autoreset, as after any truncation. Each
            restart emits a ``RuntimeWarning``. Deaths during other calls (reset,
            get_attr, ...) still raise ``WorkerDiedError``.
        max_restarts: restarts allowed over the pool's life with ``"restart"``; a death
            beyond them raises ``WorkerDiedError`` saying the budget is used up.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        n_workers: int | None = None,
        *,
        start_method: str | None = None,
        autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
        timeout: float | None = None,
        worker_threads: int | None = 1,
        env_wrapper: Callable[[gym.Env], gym.Env] | None = None,
        max_spin: float = DEFAULT_SPIN,
        main_shard: bool = False,
        on_worker_failure: Literal["raise", "restart"] = "raise",
        max_restarts: int = 3,
    ):
        env_fns = check_env_fns(env_fns)
        self.num_envs = len(env_fns)
        main_shard = bool(main_shard)
        if n_workers is None:
            n_workers = min(self.num_envs, os.cpu_count() or 1) - main_shard
        lowest, highest = (0, self.num_envs - 1) if main_shard else (1, self.num_envs)
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or not lowest <= n_workers <= highest:
            raise ValueError(
                f"n_workers must be an int between {lowest} and {highest} for {self.num_envs} envs"
                f"{' with main_shard=True' if main_shard else ''}, got {n_workers!r}"
            )
        if start_method is None:  # only None means "the default": "" is a typo, as for mp.get_context
            start_method = default_start_method()
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, got {start_method!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        if on_worker_failure not in ("raise", "restart"):
            raise ValueError(f'on_worker_failure must be "raise" or "restart", got {on_worker_failure!r}')
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        self.on_worker_failure = on_worker_failure
        self._restart = on_worker_failure == "restart"
        self.max_restarts = max_restarts
        self.restarts = 0  # workers re-created so far
        self.n_workers = n_workers
        self.shards = lay.shard_bounds(self.num_envs, n_workers + main_shard)  # worker k: shards[k]
        self._shard_starts = [start for start, _ in self.shards]
        self._main: Shard | None = None  # the main process's shard, shards[-1], if main_shard
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.timeout = timeout
        self.closed = False
        self._pending_step = False
        self._broken: str | None = None
        self._awaiting = [_IDLE] * n_workers  # per worker: what answer is still owed

        ctx = mp.get_context(start_method)
        self._res = PoolResources()
        self._finalizer = weakref.finalize(self, finalize_unclosed, self._res)
        try:
            self._start_workers(ctx, env_fns, env_wrapper, max_spin, worker_threads, main_shard)
        except BaseException:
            self.close()  # also detaches the finalizer: no ResourceWarning for a failed start
            raise

    # -- start-up ------------------------------------------------------------------

    def _start_workers(self, ctx, env_fns, env_wrapper, max_spin, worker_threads, main_shard) -> None:
        res = self._res
        if ctx.get_start_method() == "forkserver":
            _preload_in_forkserver(ctx)
        self._spawn_args = (ctx, env_fns, env_wrapper, max_spin, worker_threads)  # kept for restarts
        for k in range(self.n_workers):
            res.cmd.append(Signal.create(max_spin))
            res.done.append(Signal.create(max_spin))
            res.conns.append(None)
            res.processes.append(None)
            self._spawn_worker(k)
        if main_shard:  # built while the workers build theirs
            start, stop = self.shards[-1]
            res.main_envs = build_envs(env_fns[start:stop], env_wrapper, start, where="the main process")
        self._awaiting[:] = [_AWAIT_PAYLOAD] * self.n_workers  # so a timeout names the silent envs
        hellos: list[Hello] = []
        start_limit = None if self.timeout is None else max(self.timeout, START_TIMEOUT)
        for k in range(self.n_workers):
            hellos.append(self._recv(k, start_limit))
            self._awaiting[k] = _IDLE
        if main_shard:
            hellos.append(describe_envs(-1, res.main_envs))
        spaces = [pair for hello in hellos for pair in hello.spaces]
        self.single_observation_space, self.single_action_space = spaces[0]
        check_same_spaces(spaces)
        self.env_metadata = hellos[0].metadata
        self.env_render_mode = hellos[0].render_mode
        self.env_spec = hellos[0].spec

        self.layout = lay.ArenaLayout.plan(
            self.single_observation_space,
            self.single_action_space,
            self.num_envs,
            self.n_workers,
            final_obs=self.autoreset_mode == AutoresetMode.SAME_STEP,
        )
        res.arena = OwnedArena(self.layout.nbytes)
        views = self.layout.views(res.arena.buf)
        self._ctrl = res.ctrl = views["ctrl"]
        self.rewards = views["reward"]
        self.terminated = views["terminated"]
        self.truncated = views["truncated"]
        self.obs_leaves = {leaf.path: views[lay.obs_field(leaf.path)] for leaf in self.layout.obs_leaves}
        self._final_obs = views.get(lay.FINAL_OBS)
        self._final_flag = views.get(lay.FINAL_FLAG)
        self.action_leaves = {leaf.path: views[lay.action_field(leaf.path)] for leaf in self.layout.action_leaves}
        attach = pickle.dumps(Attach(res.arena.name, self.layout, self.autoreset_mode))
        for conn in res.conns:
            conn.send_bytes(attach)
        if main_shard:
            start = self.shards[-1][0]
            self._main = Shard(
                res.main_envs, start, views, self.layout, self.autoreset_mode, self.single_action_space
            )

    def _spawn_worker(self, k: int) -> None:
        """Start worker k's process on its shard with a new pipe (at start-up and on restart)."""
        ctx, env_fns, env_wrapper, max_spin, worker_threads = self._spawn_args
        res = self._res
        start, stop = self.shards[k]
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        res.conns[k] = parent_conn
        blob = cloudpickle.dumps((list(env_fns[start:stop]), env_wrapper))
        args = (k, child_conn, blob, start, res.cmd[k].name, res.done[k].name, max_spin, worker_threads, os.getpid())
        process = ctx.Process(target=worker_main, args=args, daemon=True, name=f"shmvec-worker-{k}")
        process.start()
        child_conn.close()
        res.processes[k] = process

    # -- stepping ------------------------------------------------------------------

    def ensure_can_step(self) -> None:
        """Raise at once if a step cannot start now (closed, broken, or one already pending)."""
        self._check_usable()
        if self._pending_step:
            raise StepStateError("step_async() called while a step is already pending; call step_wait() first")

    def step_async(self) -> None:
        """Start a step with the actions already written into :attr:`action_leaves`."""
        self.ensure_can_step()
        self._settle()
        ctrl, cmd, awaiting = self._ctrl, self._res.cmd, self._awaiting
        for k in range(self.n_workers):
            ctrl[k, lay.CTRL_COMMAND] = _COMMAND_STEP
            awaiting[k] = _AWAIT_DONE
            cmd[k].post()
        self._pending_step = True

    def step_wait(self, timeout: float | None = None) -> list[StepInfo]:
        """Wait for the pending step; results are in the arena views. Returns the sent infos.

        ``timeout`` (seconds) overrides the pool's for this wait.
        """
        self._check_usable()
        if not self._pending_step:
            raise StepStateError("step_wait() called with no pending step; call step_async() first")
        self._pending_step = False
        main_infos, main_failure = [], None
        if self._main is not None:  # step ours while the workers step theirs
            try:
                main_infos = self._main.step(self._main.read_actions())
            except EnvFailed as failure:
                main_failure = failure
        dead: list[int] | None = [] if self._restart else None
        replies = self._collect(range(self.n_workers), timeout, dead)
        if main_failure is not None:
            raise main_shard_error(main_failure)
        if dead:
            self._restart_dead(dead, replies)
        if main_infos:  # the envs' own objects; worker infos arrive as (pickled) copies
            main_infos = copy.deepcopy(main_infos)
        records = [info for reply in replies for info in reply] + main_infos
        if self._final_flag is not None:
            records = self._add_shm_finals(records)
        return records

    def _add_shm_finals(self, records: list[StepInfo]) -> list[StepInfo]:
        """Records for the episode ends that travelled through shared memory (empty infos)."""
        ended = np.flatnonzero(self._final_flag & (self.terminated | self.truncated))
        if not len(ended):
            return records
        finals = self._final_obs[ended]  # one copy for all; rows are independent arrays
        ours = [StepInfo(i, {}, finals[n], {}) for n, i in enumerate(ended.tolist())]
        if not records:
            return ours
        records += ours
        records.sort(key=_env_index)  # adapters add infos in env order, like the references
        return records

    def reset(self, kwargs: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """``env_i.reset(**kwargs[i])`` for each named env; observations land in the arena."""
        return self._request({k: Reset(part) for k, part in self._split(kwargs).items()})

    def run(self, ops: dict[int, Callable[[gym.Env], Any]]) -> dict[int, Any]:
        """Apply ``ops[i](env_i)`` inside the workers; return ``{i: result}``."""
        return self._request({k: RunOps(part) for k, part in self._split(ops).items()})

    # -- plumbing ------------------------------------------------------------------

    def _split(self, by_env: dict[int, Any]) -> dict[int, dict[int, Any]]:
        parts: dict[int, dict[int, Any]] = {}
        for i, value in by_env.items():
            if not 0 <= i < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
            parts.setdefault(self._shard_of(i), {})[i] = value
        return parts

    def _shard_of(self, i: int) -> int:
        return bisect.bisect_right(self._shard_starts, i) - 1

    def _request(self, requests: dict[int, Any]) -> dict[int, Any]:
        self._check_usable()
        if self._pending_step:
            raise StepStateError("a step is pending; call step_wait() before other calls")
        self._settle()
        res = self._res
        main_request = requests.pop(self.n_workers, None)  # the main shard's part, if any
        for k, request in requests.items():
            self._ctrl[k, lay.CTRL_COMMAND] = Command.MESSAGE
            self._awaiting[k] = _AWAIT_DONE
            res.cmd[k].post()  # post first: a large request must not block on a full pipe
            try:
                res.conns[k].send_bytes(cloudpickle.dumps(request))
                continue
            except OSError as exc:
                failed = exc
            self._blame_dead(k)  # a dead worker's pipe: say which worker died, and how
            raise failed
        merged: dict[int, Any] = {}
        main_failure = None
        if main_request is not None:
            try:
                merged.update(self._main.handle(main_request))
            except EnvFailed as failure:
                main_failure = failure
        for reply in self._collect(list(requests)):
            merged.update(reply)
        if main_failure is not None:
            raise main_shard_error(main_failure)
        return merged

    def _collect(self, workers: Sequence[int], timeout: float | None = None, dead: list[int] | None = None) -> list[Any]:
        """Wait until each worker answered; return their replies, raising the first error.

        Progress is kept in ``self._awaiting`` so that an interruption (Ctrl-C, a dead
        peer) never leaves an answer to be mistaken for the next command's. With a ``dead``
        list (restart mode, steps), a worker that died is appended to it, while the restart
        budget lasts, with an empty reply in its place, instead of raising.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        done, ctrl, awaiting = self._res.done, self._ctrl, self._awaiting
        replies, error = [], None
        for k in workers:
            try:  # free in 3.11 until raised
                if awaiting[k] == _AWAIT_DONE:
                    while not done[k].wait(LIVENESS_INTERVAL):
                        self._check_alive(k)
                        if deadline is not None and time.monotonic() > deadline:
                            self._fail_timeout(k, timeout)
                    awaiting[k] = _IDLE if ctrl[k, lay.CTRL_STATUS] == _STATUS_OK else _AWAIT_PAYLOAD
                if awaiting[k] == _IDLE:
                    replies.append([])
                    continue
                message = self._recv(k, timeout)
            except WorkerDiedError:
                if dead is None:
                    raise
                if self.restarts + len(dead) >= self.max_restarts:
                    self._broken += f"; no restart left (max_restarts={self.max_restarts} used up)"
                    raise WorkerDiedError(self._broken + CLOSE_HINT) from None
                self._broken = None  # not broken after all: _restart_dead replaces it
                awaiting[k] = _IDLE
                dead.append(k)
                replies.append([])
                continue
            awaiting[k] = _IDLE
            if isinstance(message, ErrorReport):
                error = error or message
            else:
                replies.append(message)
        if error is not None:
            raise remote_error(error)
        return replies

    def _settle(self) -> None:
        """Absorb answers to commands whose wait was interrupted (e.g. by KeyboardInterrupt)."""
        behind = [k for k, state in enumerate(self._awaiting) if state != _IDLE]
        if behind:
            try:
                self._collect(behind)
            except (WorkerDiedError, StepTimeoutError):
                raise
            except Exception:
                pass  # an env error of a step nobody waited for

    def _recv(self, k: int, timeout: float | None = None) -> Any:
        """Receive one message from worker k, watching every worker's liveness meanwhile.

        ``timeout`` defaults to the pool's (``None`` there: wait while the workers live).
        """
        conn = self._res.conns[k]
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while not conn.poll(LIVENESS_INTERVAL):
            self._check_alive(k)
            if deadline is not None and time.monotonic() > deadline:
                self._fail_timeout(k, timeout)
        try:
            blob = conn.recv_bytes()
        except (EOFError, OSError) as exc:
            failed = exc
        else:
            failed = None
        if failed is not None:
            self._blame_dead(k)
            raise failed
        message = pickle.loads(blob)
        if isinstance(message, ErrorReport) and not self._res.arena:
            raise remote_error(message)  # start-up failure
        return message

    def _check_alive(self, k: int) -> None:
        """Raise WorkerDiedError if a worker died while we wait for worker k.

        Any worker by default; in restart mode only k: the others are checked when their
        turn comes, as one may have died after answering (its results then stand).
        """
        for w in (k,) if self._restart else range(self.n_workers):
            process = self._res.processes[w]
            if process.exitcode is not None:
                self._raise_last_words(w)
                start, stop = self.shards[w]
                self._broken = (
                    f"worker {w} (envs {start}..{stop - 1}, pid {process.pid}) died with {describe_exit(process.exitcode)}"
                )
                raise WorkerDiedError(self._broken + CLOSE_HINT)

    def _blame_dead(self, k: int) -> None:
        """Worker k's pipe broke: it is exiting. Raise what killed it once the exit is visible."""
        process = self._res.processes[k]
        process.join(CLOSE_TIMEOUT)
        self._check_alive(k)

    # -- restart mode --------------------------------------------------------------

    def _restart_dead(self, dead: list[int], replies: list[Any]) -> None:
        """Re-create the dead workers; report the step of their envs as a truncation."""
        # The reset info belongs with the observation only when that obs starts the next
        # episode (SAME_STEP); in NEXT_STEP the next step resets again and brings its own.
        same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        for k in dead:
            reset_infos = self._restart_worker(k)
            start, stop = self.shards[k]
            self.rewards[start:stop] = 0.0
            self.terminated[start:stop] = False
            self.truncated[start:stop] = True
            if self._final_flag is not None:  # no final obs: it died with the worker
                self._final_flag[start:stop] = False
            replies[k] = [StepInfo(i, reset_infos[i] if same_step else {}, restarted=True) for i in range(start, stop)]

    def _restart_worker(self, k: int) -> dict[int, dict[str, Any]]:
        """Replace dead worker k by a new process on the same rows and signals; return its reset infos."""
        res = self._res
        old = res.processes[k]
        start, stop = self.shards[k]
        # Warn first: should warnings be errors, the pool stays as it was and the death
        # is found again at the next step.
        warnings.warn(
            f"shmvec: worker {k} (envs {start}..{stop - 1}, pid {old.pid}) died with {describe_exit(old.exitcode)}; "
            f"restarting it (restart {self.restarts + 1} of max_restarts={self.max_restarts})",
            RuntimeWarning,
            stacklevel=4,  # the adapter's step_wait
        )
        self.restarts += 1
        old.join()  # reaped already (exitcode is set): returns at once
        old.close()
        res.processes[k] = None
        res.conns[k].close()
        # Posts the dead worker never took (our STEP) or that we never took (its done).
        res.cmd[k].drain()
        res.done[k].drain()
        try:
            self._awaiting[k] = _AWAIT_PAYLOAD  # so a timeout names its envs
            self._spawn_worker(k)
            limit = None if self.timeout is None else max(self.timeout, START_TIMEOUT)
            hello = self._recv(k, limit)
            if isinstance(hello, ErrorReport):  # an env_fn raised
                raise remote_error(hello)
            for i, pair in enumerate(hello.spaces, start):
                if pair != (self.single_observation_space, self.single_action_space):
                    raise SpaceMismatchError(
                        f"env {i}, rebuilt after its worker died, has spaces {pair}; the pool's are "
                        f"{(self.single_observation_space, self.single_action_space)}"
                    )
            attach = Attach(res.arena.name, self.layout, self.autoreset_mode, restart=True)
            res.conns[k].send_bytes(pickle.dumps(attach))
            reply = self._recv(k, limit)
            if isinstance(reply, ErrorReport):  # an env's reset raised
                raise remote_error(reply)
        except BaseException:
            self._broken = self._broken or f"restarting worker {k} (envs {start}..{stop - 1}) failed"
            raise
        self._awaiting[k] = _IDLE
        return reply

    def _raise_last_words(self, k: int) -> None:
        """If dead worker k sent an error report before exiting, raise that instead."""
        conn = self._res.conns[k]
        try:
            if not conn.poll(0):
                return
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError, pickle.UnpicklingError):
            return
        if isinstance(message, ErrorReport):
            raise remote_error(message)

    def _fail_timeout(self, k: int, limit: float | None = None) -> None:
        silent = [i for w in range(self.n_workers) if w == k or not self._answered(w) for i in range(*self.shards[w])]
        self._res.graceful = False  # they are stuck: closing will terminate them
        if self._res.arena is None:  # still starting
            self._broken = f"envs {ranges(silent)} were not built within {limit}s"
            raise StepTimeoutError(self._broken + " (an env_fn hangs?)")
        self._broken = f"envs {ranges(silent)} did not answer within timeout={limit or self.timeout}s"
        raise StepTimeoutError(self._broken + " (an env step hangs?); close() the env and create a new one")

    def _answered(self, w: int) -> bool:
        """Whether worker w owes nothing now (consumes its answer: only for a pool being declared broken)."""
        state = self._awaiting[w]
        if state == _AWAIT_DONE:
            return self._res.done[w].wait(0.0)
        return state == _IDLE or self._res.conns[w].poll(0)

    def _check_usable(self) -> None:
        if self.closed:
            raise ClosedEnvError("this vector env is closed; create a new one")
        if self._broken is not None:
            raise WorkerDiedError(f"the pool is unusable: {self._broken}; close() it and create a new one")

    def close(self) -> None:
        """Stop the workers and release every OS resource. Safe to call twice."""
        self.closed = True
        self._res.shutdown()  # idempotent, and resumes a close() that Ctrl-C interrupted
        self._finalizer.detach()

    def __enter__(self) -> ShmPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


_env_index = operator.attrgetter("env_index")
