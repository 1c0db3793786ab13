"""The worker process: builds its shard of envs, then waits -> runs a command -> signals.

Steps read actions from and write observations, rewards and flags to the shared
arena in place; only non-empty infos, episode ends and rare requests go through the
pipe. Every exception is caught and reported with its traceback; the worker then
waits for the next command, so one failing env does not take the pool down. The worker
reads what the main process wrote only once it has taken the post that published it,
and publishes what it writes by a post (:mod:`shmvec.ipc.protocol`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import threadpoolctl

from shmvec.engine.env_building import build_envs, describe_envs
from shmvec.engine.shard import EnvFailed, Shard
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc import wire
from shmvec.ipc.arena import attach
from shmvec.ipc.info_rows import InfoWriter
from shmvec.ipc.protocol import (
    POST_SPAN,
    SENT_SHIFT,
    SENT_SPAN,
    SEQ_SHIFT,
    SEQ_SPAN,
    Attach,
    Command,
    ErrorReport,
    NextWait,
    Reset,
    SendReply,
    Status,
    StepInfo,
)
from shmvec.ipc.signals import MAX_SPIN, Signal
from shmvec.processes import script_setup
from shmvec.processes.process_trees import kill_tree

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
THREAD_ENV_VARS += ("VECLIB_MAXIMUM_THREADS",)
# Plain ints for the hot path: attribute access on an IntEnum member costs ~1 µs.
_COMMAND_STEP, _COMMAND_SEND, _COMMAND_CLOSE = int(Command.STEP), int(Command.SEND), int(Command.CLOSE)
_COMMAND_MESSAGE, _STATUS_OK, _STATUS_REPLY = int(Command.MESSAGE), int(Status.OK), int(Status.REPLY)
_COMMAND_MASK, _SENT_MASK, _SEQ_MASK = POST_SPAN - 1, SENT_SPAN - 1, SEQ_SPAN - 1  # fields of a protocol.post_word
_NEXT_SPIN = {int(NextWait.OWN): None, int(NextWait.BLOCK): 0.0, int(NextWait.SPIN): MAX_SPIN}  # see NextWait
PARENT_CHECK_INTERVAL = 1.0  # seconds a worker blocks before checking its parent is alive
ORPHAN_EXIT_CODE = 70  # the main process died while this worker was busy


def limit_threads(n_threads: int | None) -> None:
    """Keep BLAS/OpenMP/torch to ``n_threads`` so K workers do not each grab every core.

    The env vars reach only libraries loaded later. numpy's BLAS is already loaded (the
    forkserver preloads this module; fork copies the parent), its pool sized to the
    machine's cores: threadpoolctl resizes the pools of every BLAS and OpenMP library
    loaded so far (measured: ~3 ms per worker start, its scan of the loaded libraries; the
    limit stays after the call: no ``with`` block to leave).
    """
    if n_threads is None:
        return
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n_threads)
    try:
        threadpoolctl.threadpool_limits(limits=n_threads)
    except Exception:
        pass  # a library threadpoolctl cannot drive keeps its pool: slower at worst, the worker still runs
    if "torch" in sys.modules:  # already imported (fork): env vars are read too late
        sys.modules["torch"].set_num_threads(n_threads)


def dumps(obj: Any) -> bytes:
    """Pickle fast (``wire.dumps``), falling back to cloudpickle for lambdas and locally defined classes."""
    try:
        return wire.dumps(obj)
    except Exception:
        try:
            return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            _blame_unpicklable(obj)
            raise


def _blame_unpicklable(reply: Any) -> None:
    """Raise EnvFailed for the env whose value in ``reply`` cannot be sent, with a note saying so."""
    if isinstance(reply, SendReply):
        reply = reply.payload
    if isinstance(reply, dict):  # reset / run_ops reply: {env index: value}
        items = [(i, value, "returned a value") for i, value in reply.items()]
    elif isinstance(reply, list):  # step reply: [StepInfo, ...]
        items = [(info.env_index, info, "returned an info dict") for info in reply]
    else:
        return
    for i, value, what in items:
        try:
            cloudpickle.dumps(value)
        except Exception as cause:
            cause.add_note(
                f"shmvec: env {i} {what} that cannot be pickled, so it cannot be sent to the main "
                "process; return picklable values from the envs"
            )
            cause.__suppress_context__ = True  # the failed pickle attempts above say nothing more
            raise EnvFailed(i) from cause


def worker_main(
    worker: int,
    conn: mp.connection.Connection,
    setup_blob: bytes,
    env_fns_blob: bytes,
    log_queue: Any,
    first_env: int,
    stop_env: int,
    signal_names: tuple[str, str, str],
    max_spin: float,
    n_threads: int | None,
    main_pid: int,
    restarts: int,
) -> None:
    """Entry point of a worker process (see :mod:`shmvec.engine.pool` for the data flow)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    parent_alive = parent_watch(main_pid)
    _start_orphan_watchdog(parent_alive)
    cmd_name, done_name, finished_name = signal_names
    cmd, done, finished = Signal.open(cmd_name, max_spin), Signal.open(done_name), Signal.open(finished_name)
    envs: list[gym.Env] = []
    try:
        try:
            what = f"envs {first_env}..{stop_env - 1}"
            setup = _load(setup_blob, f"the set-up (worker_init, registered envs) of its {what}", worker)
            script_setup.apply(setup, log_queue, worker, restarts)  # first: the environment variables, read below
            limit_threads(n_threads)
            env_fns, env_wrapper = _load(env_fns_blob, f"the env_fns of its {what}", worker)
            env_fns = [_keeping_setup(env_fn, setup) for env_fn in env_fns]
            envs = build_envs(env_fns, env_wrapper, first_env, where=f"worker {worker}")
            hello = describe_envs(worker, envs)
        except Exception as exc:
            conn.send_bytes(dumps(capture(worker, exc)))
            return
        conn.send_bytes(dumps(hello))
        attach_msg: Attach = pickle.loads(conn.recv_bytes())  # the watchdog ends us if the main process dies
        arena = attach(attach_msg.arena_name, attach_msg.layout.nbytes)
        views = attach_msg.layout.views(arena)
        layout, mode = attach_msg.layout, attach_msg.autoreset_mode
        shard = Shard(envs, first_env, views, layout, mode, envs[0].action_space, InfoWriter(views, worker), worker)
        ready = Signal.open(attach_msg.ready_name)
        sends = _Sends(worker, conn, ready, finished, shard, views)
        if shard.double_buffered:  # a restarted worker joins the step in progress: its buffer
            shard.select_obs_buffer(int(views["ctrl"][worker][lay.CTRL_OBS_BUFFER]))
        children = [Signal.open(name) for name in attach_msg.step_children]  # see engine.step_tree
        if attach_msg.restart:
            _start_afresh(worker, conn, shard)
        try:
            _serve(worker, conn, cmd, done, shard, views, sends, [child.post for child in children])
        finally:
            ready.close()
            for child in children:
                child.close()
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
        finished.close()


def _load(blob: bytes, what: str, worker: int) -> Any:
    """Unpickle ``blob``, which a worker needs before it builds its envs.

    A worker does not run the user's main script (:mod:`~shmvec.processes.lean_start`), so a
    module the blob needs must be importable by name here: if one is not, say which.
    """
    try:
        return cloudpickle.loads(blob)
    except ImportError as exc:
        exc.add_note(
            f"shmvec: worker {worker} could not load {what}: module {exc.name!r} cannot be "
            "imported there. Workers import your envs' modules by name and do not run your main script: make the "
            "module importable in a fresh Python (install it, or add its folder to sys.path before creating the "
            'vector env), or pass import_main=True or start_method="fork"'
        )
        raise


def _keeping_setup(env_fn: Callable[[], gym.Env], setup: script_setup.ScriptSetup) -> Callable[[], gym.Env]:
    """``env_fn``, after which what its imports undid of the set-up is done again (script_setup.after_env_built)."""

    def build() -> gym.Env:
        try:
            return env_fn()
        finally:
            script_setup.after_env_built(setup)

    return build


def parent_watch(main_pid: int) -> Callable[[], bool]:
    """A cheap test that the main process still lives.

    The parent sentinel alone is not enough under fork: siblings forked later inherit
    its write end, so it only closes when they exit too. A forked (or spawned) worker is
    re-parented when the main process dies, which ``getppid`` shows at once.
    """
    parent = mp.parent_process()
    direct = os.getppid() == main_pid  # False under forkserver: the server is our parent

    def alive() -> bool:
        if direct and os.getppid() != main_pid:
            return False
        return parent is None or parent.is_alive()

    return alive


def _start_orphan_watchdog(parent_alive: Callable[[], bool]) -> None:
    """Exit the process soon after the main process dies, whatever the main thread is doing.

    The command loop notices a dead parent only between commands; an env stuck inside
    ``step()`` (measured: alive 8 s after the main process was SIGKILLed, burning a core)
    never gets there. A daemon thread does, as Python code releases the GIL every few ms.
    Linux's parent-death signal is no substitute: under forkserver the parent is the
    server, and it fires when the parent *thread* exits, not the process. The processes its
    envs started are killed first: none outlives the main process either.
    """

    def watch() -> None:
        while parent_alive():
            time.sleep(PARENT_CHECK_INTERVAL)
        kill_tree(os.getpid())  # what its envs started (a simulator, multiprocessing children) goes with it
        os._exit(ORPHAN_EXIT_CODE)  # nobody is left to clean up for; the OS frees the rest

    threading.Thread(target=watch, name="shmvec-orphan-watchdog", daemon=True).start()


def _start_afresh(worker: int, conn: mp.connection.Connection, shard: Shard) -> None:
    """A worker replacing a dead one: reset its envs (seed None) and reply their reset infos.

    In NEXT_STEP mode their next step is then an autoreset, as after any truncation: the
    main process reports this restart as one.
    """
    try:
        infos = shard.handle(Reset({i: {} for i in range(shard.start, shard.stop)}))  # pickled obs leaves too
        blob = dumps(infos)
        shard.autoreset[:] = [shard.mode == AutoresetMode.NEXT_STEP] * len(shard.envs)
    except Exception as exc:
        blob = dumps(capture(worker, exc))
    conn.send_bytes(blob)


def _serve(
    worker,
    conn,
    cmd: Signal,
    done: Signal,
    shard: Shard,
    views: dict[str, np.ndarray],
    sends: _Sends,
    post_children: Sequence[Callable[[], None]] = (),
) -> None:
    """Run the commands the main process posts until CLOSE. ``post_children``: the posts that
    start this worker's children in the step tree (:mod:`shmvec.engine.step_tree`), made as a
    STEP is taken, before stepping."""
    row = views["ctrl"][worker]
    posts = 0  # posts taken from cmd (mod SEQ_SPAN): the word with this seq is published
    double_buffered = shard.double_buffered
    spin = None  # how long to spin for the next command (None: adaptively)
    while True:
        if not cmd.wait(PARENT_CHECK_INTERVAL, spin):
            spin = None
            continue  # idle; should the main process die, the orphan watchdog ends us
        posts = (posts + 1) & _SEQ_MASK
        word = int(row[lay.CTRL_POST])  # read once: the command goes with its seq and count
        if word >> SEQ_SHIFT != posts:
            word, posts = _catch_up(cmd, row, posts)
        command = word & _COMMAND_MASK
        if double_buffered:
            shard.select_obs_buffer(int(row[lay.CTRL_OBS_BUFFER]))
        if command == _COMMAND_STEP:
            for post_child in post_children:
                post_child()
            spin = _NEXT_SPIN[row[lay.CTRL_NEXT_WAIT]]
        elif command != _COMMAND_MESSAGE:  # after a rare call, wait as after the step before it (HER, masks)
            spin = None
        sends.run((word >> SENT_SHIFT) & _SENT_MASK)  # sends come first: a reset of other envs may follow them
        if command == _COMMAND_SEND:
            continue
        payload: Any = None
        try:
            if command == _COMMAND_STEP:
                # Pickled action leaves follow the command on the pipe; fixed-size ones are in shm.
                pickled = wire.from_main(conn.recv_bytes()) if shard.pickled_actions else None
                payload = shard.step(shard.read_actions(pickled)) or None
            elif command == _COMMAND_MESSAGE:
                request = wire.from_main(conn.recv_bytes())
                payload = shard.handle(request)
            elif command == Command.CLOSE:
                row[lay.CTRL_STATUS] = Status.OK
                done.post()
                return
            else:
                raise RuntimeError(f"unknown command {command}")
            status = _STATUS_OK if payload is None else _STATUS_REPLY
            blob = dumps(payload) if payload is not None else b""
        except Exception as exc:  # an env's, or ours (e.g. an unpicklable request or result)
            status, blob = Status.ERROR, dumps(capture(worker, exc))
        row[lay.CTRL_STATUS] = status
        done.post()  # publishes the status and rows; before sending: a large payload must not block on a full pipe
        if status != _STATUS_OK:
            conn.send_bytes(blob)


def _catch_up(cmd: Signal, row: np.ndarray, posts: int) -> tuple[int, int]:
    """The word was written for a post we have not taken yet (several posts came at once, or
    its own is about to come): take posts until the word read is the last one's; return
    ``(word, posts)``. The main process posts right after writing, so this never waits long.

    A CLOSE is acted on at once: it needs nothing published, and a post still due from a
    parent in the step tree may never come (the parent closed first)."""
    while True:
        word = int(row[lay.CTRL_POST])
        if word & _COMMAND_MASK == _COMMAND_CLOSE:
            return word, posts
        ahead = ((word >> SEQ_SHIFT) - posts) & _SEQ_MASK
        if ahead == 0 or ahead > _SEQ_MASK // 2:  # ours (or behind, never written: no waiting forever)
            return word, posts
        if cmd.wait(PARENT_CHECK_INTERVAL, MAX_SPIN):
            posts = (posts + 1) & _SEQ_MASK


def capture(worker: int, exc: Exception) -> ErrorReport:
    """The report of ``exc``: an env's own exception (with its index) if a shard raised it."""
    if isinstance(exc, EnvFailed):
        return ErrorReport.capture(worker, exc.env_index, exc.__cause__)
    return ErrorReport.capture(worker, None, exc)


class _Sends:
    """Async batches, worker side: step the envs put in the inbox one by one, publishing each.

    For every env: write its rows, its status and the time, put its id in the outbox, count it
    in ``CTRL_PUBLISHED``, post ``finished`` (which publishes all of that) and ``ready`` (which
    wakes the main process);
    then, unless its status is OK, send its record or error report on the pipe (after
    publishing: the main process reads the pipe only for envs it has seen finish, so
    sending first could deadlock on a full pipe).
    """

    def __init__(self, worker: int, conn, ready: Signal, finished: Signal, shard: Shard, views: dict[str, np.ndarray]):
        self.worker, self.conn, self.ready, self.finished, self.shard = worker, conn, ready, finished, shard
        self.inbox, self.outbox = views[lay.INBOX], views[lay.OUTBOX]
        self.ready_ns, self.env_status = views[lay.READY_NS], views[lay.ENV_STATUS]
        self.ctrl = views["ctrl"][worker]
        self.start, self.size = shard.start, shard.stop - shard.start
        self.taken = self.published = 0

    def run(self, sent: int) -> None:
        """Step the envs put in the inbox up to the ``sent``-th (mod SENT_SPAN), published by the post
        taken with it; never more: a count read again could be ahead of the slots it covers."""
        shard, start, size = self.shard, self.start, self.size
        for _ in range((sent - self.taken) & _SENT_MASK):
            i = int(self.inbox[start + self.taken % size])
            self.taken += 1
            blob = None
            try:
                record = shard.step_env(i - start, shard.read_action(i))
                if shard.pickled_out:  # observation leaves with no fixed size travel with the record
                    record = (record or StepInfo(i, {}))._replace(pickled_obs=shard.pickled_out.pop(i))
                if record is not None:
                    blob = dumps(SendReply(i, [record]))
            except Exception as exc:
                blob = dumps(SendReply(i, capture(self.worker, exc)))
            self.env_status[i] = _STATUS_OK if blob is None else _STATUS_REPLY
            self.ready_ns[i] = time.monotonic_ns()
            self.outbox[start + self.published % size] = i
            self.published += 1
            self.ctrl[lay.CTRL_PUBLISHED] = self.published  # before the posts: see AsyncSchedule._scan
            self.finished.post()
            self.ready.post()
            if blob is not None:
                self.conn.send_bytes(blob)
