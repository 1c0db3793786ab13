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

import multiprocessing as mp
import os
import pickle
import signal
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec import layout as lay
from shmvec.errors import (
    ClosedEnvError,
    EnvError,
    RemoteTraceback,
    SpaceMismatchError,
    StepStateError,
    StepTimeoutError,
    WorkerDiedError,
)
from shmvec.protocol import Attach, Command, ErrorReport, Hello, Reset, RunOps, Status, StepInfo
from shmvec.shm import OwnedArena
from shmvec.sync import Signal
from shmvec.worker import worker_main

LIVENESS_INTERVAL = 0.1  # seconds between checks that every worker is still alive while waiting
CLOSE_TIMEOUT = 3.0  # seconds close() gives workers to exit before terminating them
DEFAULT_SPIN = 50e-6  # seconds; upper bound of the adaptive spin on either side


# What the main process still expects from a worker.
_IDLE, _AWAIT_DONE, _AWAIT_PAYLOAD = 0, 1, 2


def default_start_method() -> str:
    """forkserver where available, else spawn (the choice SB3's SubprocVecEnv makes)."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class ShmPool:
    """Runs ``len(env_fns)`` envs in ``n_workers`` processes, stepping them through shared memory.

    This is the engine behind :class:`~shmvec.ShmPoolVecEnv` and
    :class:`~shmvec.ShmVectorEnv`; most users want one of those.

    Args:
        env_fns: callables that each build a new env (lambdas and closures are fine).
        n_workers: worker processes; default ``min(len(env_fns), os.cpu_count())``.
            Envs are split into contiguous shards whose sizes differ by at most one.
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default forkserver.
        autoreset_mode: what a step does when an episode ends (see gymnasium's AutoresetMode).
        timeout: seconds to wait for any answer from the workers before raising
            :class:`~shmvec.errors.StepTimeoutError`; ``None`` waits as long as they live.
        worker_threads: torch/OpenMP/BLAS threads per worker; ``None`` leaves them alone.
        env_wrapper: picklable callable applied to each env right after it is built.
        max_spin: seconds a waiter may spin before blocking (adaptive below this bound);
            ``0`` always blocks.
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
    ):
        env_fns = _check_env_fns(env_fns)
        self.num_envs = len(env_fns)
        if n_workers is None:
            n_workers = min(self.num_envs, os.cpu_count() or 1)
        if not isinstance(n_workers, int) or not 1 <= n_workers <= self.num_envs:
            raise ValueError(f"n_workers must be an int between 1 and len(env_fns)={self.num_envs}, got {n_workers!r}")
        start_method = start_method or default_start_method()
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, got {start_method!r}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        self.n_workers = n_workers
        self.shards = lay.shard_bounds(self.num_envs, n_workers)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.timeout = timeout
        self.closed = False
        self._pending_step = False
        self._broken: str | None = None
        self._awaiting = [_IDLE] * n_workers  # per worker: what answer is still owed

        ctx = mp.get_context(start_method)
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, _finalize, self._res)
        try:
            self._start_workers(ctx, env_fns, env_wrapper, max_spin, worker_threads)
        except BaseException:
            self._res.shutdown()
            raise

    # -- start-up ------------------------------------------------------------------

    def _start_workers(self, ctx, env_fns, env_wrapper, max_spin, worker_threads) -> None:
        res = self._res
        for k, (start, stop) in enumerate(self.shards):
            res.cmd.append(Signal.create(max_spin))
            res.done.append(Signal.create(max_spin))
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            res.conns.append(parent_conn)
            blob = cloudpickle.dumps((list(env_fns[start:stop]), env_wrapper))
            args = (k, child_conn, blob, start, res.cmd[k].name, res.done[k].name, max_spin, worker_threads)
            process = ctx.Process(target=worker_main, args=args, daemon=True, name=f"shmvec-worker-{k}")
            process.start()
            child_conn.close()
            res.processes.append(process)
        hellos: list[Hello] = [self._recv(k) for k in range(self.n_workers)]
        spaces = [pair for hello in hellos for pair in hello.spaces]
        self.single_observation_space, self.single_action_space = spaces[0]
        _check_same_spaces(spaces)
        self.env_metadata = hellos[0].metadata
        self.env_render_mode = hellos[0].render_mode
        self.env_spec = hellos[0].spec

        self.layout = lay.ArenaLayout.plan(
            self.single_observation_space, self.single_action_space, self.num_envs, self.n_workers
        )
        res.arena = OwnedArena(self.layout.nbytes)
        views = self.layout.views(res.arena.buf)
        self._ctrl = res.ctrl = views["ctrl"]
        self.rewards = views["reward"]
        self.terminated = views["terminated"]
        self.truncated = views["truncated"]
        self.obs_leaves = {leaf.path: views[lay.obs_field(leaf.path)] for leaf in self.layout.obs_leaves}
        self.action_leaves = {leaf.path: views[lay.action_field(leaf.path)] for leaf in self.layout.action_leaves}
        attach = pickle.dumps(Attach(res.arena.name, self.layout, self.autoreset_mode))
        for conn in res.conns:
            conn.send_bytes(attach)

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
            ctrl[k, lay.CTRL_COMMAND] = Command.STEP
            awaiting[k] = _AWAIT_DONE
            cmd[k].post()
        self._pending_step = True

    def step_wait(self) -> list[StepInfo]:
        """Wait for the pending step; results are in the arena views. Returns the sent infos."""
        self._check_usable()
        if not self._pending_step:
            raise StepStateError("step_wait() called with no pending step; call step_async() first")
        self._pending_step = False
        replies = self._collect(range(self.n_workers))
        if len(replies) == 1:
            return replies[0]
        return [info for reply in replies for info in reply]

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
            parts.setdefault(self._worker_of(i), {})[i] = value
        return parts

    def _worker_of(self, i: int) -> int:
        base, extra = divmod(self.num_envs, self.n_workers)
        cut = extra * (base + 1)  # envs below this sit in the larger shards
        return i // (base + 1) if i < cut else extra + (i - cut) // base

    def _request(self, requests: dict[int, Any]) -> dict[int, Any]:
        self._check_usable()
        if self._pending_step:
            raise StepStateError("a step is pending; call step_wait() before other calls")
        self._settle()
        res = self._res
        for k, request in requests.items():
            self._ctrl[k, lay.CTRL_COMMAND] = Command.MESSAGE
            self._awaiting[k] = _AWAIT_DONE
            res.cmd[k].post()  # post first: a large request must not block on a full pipe
            res.conns[k].send_bytes(cloudpickle.dumps(request))
        merged: dict[int, Any] = {}
        for reply in self._collect(list(requests)):
            merged.update(reply)
        return merged

    def _collect(self, workers: Sequence[int]) -> list[Any]:
        """Wait until each worker answered; return their replies, raising the first error.

        Progress is kept in ``self._awaiting`` so that an interruption (Ctrl-C, a dead
        peer) never leaves an answer to be mistaken for the next command's.
        """
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        done, ctrl, awaiting = self._res.done, self._ctrl, self._awaiting
        replies, error = [], None
        for k in workers:
            if awaiting[k] == _AWAIT_DONE:
                while not done[k].wait(LIVENESS_INTERVAL):
                    self._check_alive()
                    if deadline is not None and time.monotonic() > deadline:
                        self._fail_timeout(k)
                awaiting[k] = _IDLE if ctrl[k, lay.CTRL_STATUS] == Status.OK else _AWAIT_PAYLOAD
            if awaiting[k] == _IDLE:
                replies.append([])
                continue
            message = self._recv(k)
            awaiting[k] = _IDLE
            if isinstance(message, ErrorReport):
                error = error or message
            else:
                replies.append(message)
        if error is not None:
            raise _rebuild(error, self.shards)
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

    def _recv(self, k: int) -> Any:
        """Receive one message from worker k, watching every worker's liveness meanwhile."""
        conn = self._res.conns[k]
        while not conn.poll(LIVENESS_INTERVAL):
            self._check_alive()
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self._check_alive()
            raise
        if isinstance(message, ErrorReport) and not self._res.arena:
            raise _rebuild(message, self.shards)  # start-up failure
        return message

    def _check_alive(self) -> None:
        for k, process in enumerate(self._res.processes):
            if process.exitcode is not None:
                self._raise_last_words(k)
                start, stop = self.shards[k]
                self._broken = (
                    f"worker {k} (envs {start}..{stop - 1}, pid {process.pid}) died with {_describe_exit(process.exitcode)}"
                )
                raise WorkerDiedError(self._broken + "; close() the env and create a new one")

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
            raise _rebuild(message, self.shards)

    def _fail_timeout(self, k: int) -> None:
        silent = [i for w, (s, e) in enumerate(self.shards) if w >= k for i in range(s, e)]
        self._broken = f"envs {silent} did not answer within timeout={self.timeout}s"
        self._res.graceful = False  # they are stuck: closing will terminate them
        raise StepTimeoutError(self._broken + " (an env step hangs?); close() the env and create a new one")

    def _check_usable(self) -> None:
        if self.closed:
            raise ClosedEnvError("this vector env is closed; create a new one")
        if self._broken is not None:
            raise WorkerDiedError(f"the pool is unusable: {self._broken}; close() it and create a new one")

    def close(self) -> None:
        """Stop the workers and release every OS resource. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self._finalizer.detach()
        self._res.shutdown()

    def __enter__(self) -> ShmPool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class _Resources:
    """Every OS resource of one pool, so that a finalizer can release them without the pool."""

    def __init__(self):
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.cmd: list[Signal] = []
        self.done: list[Signal] = []
        self.arena: OwnedArena | None = None
        self.ctrl: np.ndarray | None = None
        self.graceful = True

    def shutdown(self) -> None:
        alive = [k for k, p in enumerate(self.processes) if p.exitcode is None]
        if self.graceful and self.ctrl is not None:
            for k in alive:
                self.done[k].drain()  # a step the user never waited for
                self.ctrl[k, lay.CTRL_COMMAND] = Command.CLOSE
                self.cmd[k].post()
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for process in self.processes:
            if process.exitcode is None and self.graceful and self.ctrl is not None:
                process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.terminate()
                process.join(1.0)
            if process.exitcode is None:
                process.kill()
                process.join()
            process.close()
        self.processes = []
        for conn in self.conns:
            conn.close()
        self.conns = []
        for sig in self.cmd + self.done:
            sig.close()
        self.cmd, self.done = [], []
        self.ctrl = None
        if self.arena is not None:
            self.arena.close()


def _finalize(res: _Resources) -> None:
    warnings.warn(
        "a shmvec vector env was not closed; call close() or use it as a context manager",
        ResourceWarning,
        stacklevel=2,
    )
    res.shutdown()


def _rebuild(report: ErrorReport, shards: list[tuple[int, int]]) -> BaseException:
    """The worker's exception, re-raisable here, with where it happened and its traceback."""
    where = f"worker {report.worker}"
    if report.env_index is not None:
        where = f"env {report.env_index} ({where})"
    exc = report.exception
    if not isinstance(exc, BaseException):
        exc = EnvError(f"{report.exc_type}: {report.message}")
    exc.add_note(f"shmvec: raised in {where}; the remote traceback is shown above")
    exc.__cause__ = RemoteTraceback(report.traceback)
    exc.env_index = report.env_index  # type: ignore[attr-defined]
    exc.worker_index = report.worker  # type: ignore[attr-defined]
    return exc


def _describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def _check_env_fns(env_fns: Any) -> list[Callable[[], gym.Env]]:
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence):
        raise TypeError(f"env_fns must be a list of callables that each build an env, got {type(env_fns).__name__}")
    env_fns = list(env_fns)
    if not env_fns:
        raise ValueError("env_fns is empty: pass at least one callable that builds an env")
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(
                f"env_fns[{i}] is a {type(fn).__name__}, not a callable; pass functions that build envs, "
                "e.g. [lambda: gym.make('CartPole-v1')] * 8"
            )
    return env_fns


def _check_same_spaces(spaces: list[tuple[gym.Space, gym.Space]]) -> None:
    obs0, act0 = spaces[0]
    for i, (obs, act) in enumerate(spaces):
        if obs != obs0:
            raise SpaceMismatchError(f"env {i} has observation space {obs}, but env 0 has {obs0}; all envs must match")
        if act != act0:
            raise SpaceMismatchError(f"env {i} has action space {act}, but env 0 has {act0}; all envs must match")
