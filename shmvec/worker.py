"""The worker process: builds its shard of envs, then waits -> runs a command -> signals.

Steps read actions from and write observations, rewards and flags to the shared
arena in place; only non-empty infos, episode ends and rare requests go through the
pipe. Every exception is caught and reported with its traceback; the worker then
waits for the next command, so one failing env does not take the pool down.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
from typing import Any, Callable

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec import layout as lay
from shmvec.protocol import Attach, Command, ErrorReport, Hello, Reset, RunOps, Status, StepInfo
from shmvec.shm import attach
from shmvec.sync import Signal

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
PARENT_CHECK_INTERVAL = 1.0  # seconds a worker blocks before checking its parent is alive


def limit_threads(n_threads: int | None) -> None:
    """Keep BLAS/OpenMP/torch to ``n_threads`` so K workers do not each grab every core."""
    if n_threads is None:
        return
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n_threads)
    if "torch" in sys.modules:  # already imported (fork): env vars are read too late
        sys.modules["torch"].set_num_threads(n_threads)


def dumps(obj: Any) -> bytes:
    """Pickle fast, falling back to cloudpickle for lambdas and locally defined classes."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class Shard:
    """The envs of one worker, wired to their rows of the shared buffers."""

    def __init__(self, envs: list[gym.Env], start: int, arena_views: dict[str, np.ndarray], attach_msg: Attach):
        layout: lay.ArenaLayout = attach_msg.layout
        self.envs = envs
        self.start = start
        self.stop = start + len(envs)
        self.reward = arena_views["reward"]
        self.terminated = arena_views["terminated"]
        self.truncated = arena_views["truncated"]
        self.autoreset = [False] * len(envs)  # NEXT_STEP: env j resets on its next step
        self.mode = attach_msg.autoreset_mode
        self._obs_leaves = [(arena_views[lay.obs_field(leaf.path)], leaf.path) for leaf in layout.obs_leaves]
        self._action_leaves = [(arena_views[lay.action_field(leaf.path)], leaf.path) for leaf in layout.action_leaves]
        self._flat_obs = self._obs_leaves[0][0] if self._obs_leaves[0][1] == () else None

    # -- buffers -------------------------------------------------------------------

    def write_obs(self, i: int, obs: Any) -> None:
        if self._flat_obs is not None:
            self._flat_obs[i] = obs
        else:
            for view, path in self._obs_leaves:
                view[i] = lay.get_path(obs, path)

    def read_actions(self, action_space: gym.Space) -> list[Any]:
        """This shard's actions, copied out of shared memory (an env may keep them)."""
        s, e = self.start, self.stop
        if len(self._action_leaves) == 1 and self._action_leaves[0][1] == ():
            return list(self._action_leaves[0][0][s:e].copy())
        columns = {path: view[s:e].copy() for view, path in self._action_leaves}
        return [lay.unflatten(action_space, {p: col[j] for p, col in columns.items()}) for j in range(e - s)]

    # -- commands ------------------------------------------------------------------

    def step(self, actions: list[Any]) -> list[StepInfo]:
        """Step every env of the shard in place; return the infos worth sending."""
        infos: list[StepInfo] = []
        reward, terminated, truncated = self.reward, self.terminated, self.truncated
        write_obs, start, autoreset = self.write_obs, self.start, self.autoreset
        same_step = self.mode == AutoresetMode.SAME_STEP
        next_step = self.mode == AutoresetMode.NEXT_STEP
        i = start
        try:
            for j, env in enumerate(self.envs):
                i = start + j
                if next_step and autoreset[j]:
                    obs, info = env.reset()
                    rew, term, trunc = 0.0, False, False
                else:
                    obs, rew, term, trunc, info = env.step(actions[j])
                reward[i] = rew
                terminated[i] = term
                truncated[i] = trunc
                if term or trunc:
                    if same_step:
                        final_obs, final_info = obs, info
                        obs, info = env.reset()
                        infos.append(StepInfo(i, info, final_obs, final_info))
                    else:
                        autoreset[j] = next_step
                        if info:
                            infos.append(StepInfo(i, info))
                else:
                    autoreset[j] = False
                    if info:
                        infos.append(StepInfo(i, info))
                write_obs(i, obs)
        except Exception as exc:  # zero-cost until raised (3.11)
            raise EnvFailed(i) from exc
        return infos

    def reset(self, request: Reset) -> dict[int, dict[str, Any]]:
        infos = {}
        i = None
        try:
            for i, kwargs in request.kwargs.items():
                j = i - self.start
                obs, infos[i] = self.envs[j].reset(**kwargs)
                self.write_obs(i, obs)
                self.autoreset[j] = False
                self.terminated[i] = self.truncated[i] = False
        except Exception as exc:
            raise EnvFailed(i) from exc
        return infos

    def run_ops(self, request: RunOps) -> dict[int, Any]:
        results = {}
        i = None
        try:
            for i, op in request.ops.items():
                results[i] = op(self.envs[i - self.start])
        except Exception as exc:
            raise EnvFailed(i) from exc
        return results


class EnvFailed(Exception):
    """Raised by :class:`Shard` when env ``env_index`` raised; the env's exception is ``__cause__``."""

    def __init__(self, env_index: int | None):
        super().__init__(env_index)
        self.env_index = env_index


def worker_main(
    worker: int,
    conn: mp.connection.Connection,
    env_fns_blob: bytes,
    first_env: int,
    cmd_name: str,
    done_name: str,
    max_spin: float,
    n_threads: int | None,
) -> None:
    """Entry point of a worker process (see :mod:`shmvec.pool` for the data flow)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    limit_threads(n_threads)
    cmd, done = Signal.open(cmd_name, max_spin), Signal.open(done_name)
    envs: list[gym.Env] = []
    try:
        env_index = first_env
        try:
            env_fns, env_wrapper = cloudpickle.loads(env_fns_blob)
            for env_index, env_fn in enumerate(env_fns, start=first_env):
                env = env_fn()
                envs.append(env_wrapper(env) if env_wrapper is not None else env)
            _check_distinct(envs, first_env)
            first = envs[0]
            hello = Hello(
                worker,
                [(env.observation_space, env.action_space) for env in envs],
                first.metadata,
                first.render_mode,
                _picklable_or_none(first.spec),
            )
        except Exception as exc:
            conn.send_bytes(dumps(ErrorReport.capture(worker, env_index, exc)))
            return
        conn.send_bytes(dumps(hello))
        attach_msg: Attach = pickle.loads(conn.recv_bytes())
        arena = attach(attach_msg.arena_name, attach_msg.layout.nbytes)
        views = attach_msg.layout.views(arena)
        shard = Shard(envs, first_env, views, attach_msg)
        _serve(worker, conn, cmd, done, shard, views["ctrl"], envs[0].action_space)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process went away; nobody is left to tell
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:
                pass
        cmd.close()
        done.close()


def _serve(worker, conn, cmd: Signal, done: Signal, shard: Shard, ctrl: np.ndarray, action_space) -> None:
    parent = mp.parent_process()
    row = ctrl[worker]
    while True:
        if not cmd.wait(PARENT_CHECK_INTERVAL):
            if parent is not None and not parent.is_alive():
                return  # orphaned: the main process died without closing us
            continue
        command = row[lay.CTRL_COMMAND]
        payload: Any = None
        try:
            if command == Command.STEP:
                actions = shard.read_actions(action_space)
                payload = shard.step(actions) or None
            elif command == Command.MESSAGE:
                request = pickle.loads(conn.recv_bytes())
                if isinstance(request, Reset):
                    payload = shard.reset(request)
                else:
                    payload = shard.run_ops(request)
            elif command == Command.CLOSE:
                row[lay.CTRL_STATUS] = Status.OK
                done.post()
                return
            else:
                raise RuntimeError(f"unknown command {command}")
            status = Status.OK if payload is None else Status.REPLY
            blob = dumps(payload) if payload is not None else b""
        except EnvFailed as failure:
            report = ErrorReport.capture(worker, failure.env_index, failure.__cause__)
            status, blob = Status.ERROR, dumps(report)
        except Exception as exc:  # a failure of ours (e.g. unpicklable request or result)
            status, blob = Status.ERROR, dumps(ErrorReport.capture(worker, None, exc))
        row[lay.CTRL_STATUS] = status
        done.post()  # before sending: a large payload must not block on a full pipe
        if status != Status.OK:
            conn.send_bytes(blob)


def _check_distinct(envs: list[gym.Env], first_env: int) -> None:
    seen: dict[int, int] = {}
    for j, env in enumerate(envs):
        other = seen.setdefault(id(env.unwrapped), j)
        if other != j:
            raise ValueError(
                f"env_fns[{first_env + other}] and env_fns[{first_env + j}] returned the same env instance. "
                "Each env_fn must create a new env (e.g. `lambda: gym.make(...)`), not return a shared one."
            )


def _picklable_or_none(obj: Any) -> Any:
    try:
        pickle.dumps(obj)
        return obj
    except Exception:
        return None
