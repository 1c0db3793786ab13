"""The default plan's timing run, in a throwaway process: nothing of it stays in the caller's.

``n_workers=None`` times one env before it plans (:mod:`~shmvec.planning.plan`). Timed in the
caller's process, that env would draw from the caller's global generators (an env whose
resets use ``np.random`` would then differ from ``DummyVecEnv``'s from the first reset),
would be one more instance of the env in the caller's process (wrong for a library that
allows one instance per process, a simulator with one licence seat, a robot), and could
take the caller down with it. So it runs in a process of its own, started as a worker is
(without the main script, with the script's set-up applied: its registered ids, its
environment), which builds the env, turns off what it would record outside the process
(:func:`~shmvec.planning.outside_effects.quieten`), times it
(:func:`~shmvec.planning.env_timing.time_env_and_machine`), closes it and exits. An explicit
``n_workers`` skips all of it.

It is started as workers are (:mod:`~shmvec.processes.starters`): from shmvec's forkserver
by default, whose preload makes the env factory's modules (SB3 and torch for ``make_vec_env``'s)
imported already; never as a fork of the caller unless ``start_method="fork"`` was asked for.

The process ends with the caller's need of it: a watchdog thread sees the main process die
(SIGKILL, the out-of-memory killer) within :data:`PARENT_CHECK_INTERVAL`; then, as when the
main process gives up on it (:data:`TIMING_TIMEOUT`, Ctrl-C), SIGTERM raises in its main thread
(a wait in ``time.sleep``, a socket or a lock is cut short) so the env is closed on the way
out, and after a grace period the process exits or is killed all the same.

Nothing the env started outlives the timing process: a simulator launched by its constructor,
which a stop cuts short before ``close()`` exists to be called, would otherwise be re-parented to
init and keep its port, GPU memory or licence seat from the workers. The timing process is a child
subreaper (``PR_SET_CHILD_SUBREAPER``: every orphan below it, a daemon that double-forked and
called ``setsid`` included, is re-parented to it) and leads a process group of its own. Before it
answers, and however else it ends (stopped, orphaned), it gives what is left below it SIGTERM, then
:data:`DESCENDANT_GRACE` to exit, then SIGKILL: the workers start only after all of it is gone.
The main process, when it has to kill a timing process that did not stop, stops it and SIGKILLs
its tree first (:func:`kill_tree`); once it has ended, the main process SIGKILLs what is left of
its group. What escapes: a descendant that left the group
(``setsid``, ``setpgid``) of a timing process killed by someone else (the out-of-memory killer, a
SIGKILL from outside), as it then had nobody to be re-parented to but init. Outside the terminal's
foreground group, the timing process and what it started get no Ctrl-C from the terminal: the main
process's KeyboardInterrupt stops them, as above.
"""

from __future__ import annotations

import ctypes
import functools
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from shmvec.engine.link import mp_context
from shmvec.engine.worker import ORPHAN_EXIT_CODE, limit_threads, parent_watch
from shmvec.planning.env_timing import EnvTiming, time_env_and_machine
from shmvec.planning.outside_effects import NotTimed, quieten
from shmvec.planning.plan_memory import env_identity
from shmvec.processes.lean_start import SCRIPT_WORKER_PREFIX, WORKER_NAME_PREFIX
from shmvec.processes.process_trees import end_descendants, kill_tree, status
from shmvec.processes.script_setup import WorkerStart, apply
from shmvec.processes.starters import preload_what_it_names

TIMING_TIMEOUT = 60.0  # seconds the timing process may take (building the env included) before the plan gives up
TIMING_PROCESS = "timing"  # its name after the worker prefix
CLOSE_GRACE = 5.0  # seconds a timing process told to stop (SIGTERM) has to close its env before it is killed
PARENT_CHECK_INTERVAL = 0.25  # seconds between the timing process's checks that the main process lives
ORPHAN_GRACE = 0.5  # seconds an orphaned timing process gives its env to close before it exits anyway
DESCENDANT_GRACE = 1.0  # seconds what the env started and did not end has, after SIGTERM, before SIGKILL
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


class TimingFailed(RuntimeError):
    """The timing process could not time the env (the env raised, or the process died or hung)."""


def timer(start_method: str, start: WorkerStart) -> Callable[[Callable[[], Any]], EnvTiming]:
    """:func:`time_in_process` with processes started by ``start_method`` as workers with ``start`` are."""
    return functools.partial(time_in_process, start_method, start)


def time_in_process(
    start_method: str, start: WorkerStart, env_fn: Callable[[], Any], timeout: float | None = None
) -> EnvTiming:
    """:func:`~shmvec.planning.env_timing.time_env_and_machine` of ``env_fn``, run in a new
    process started by ``start_method`` as a worker with ``start``; raises :class:`TimingFailed`,
    or :class:`~shmvec.planning.outside_effects.NotTimed` for an env that would be seen.
    ``timeout``: :data:`TIMING_TIMEOUT` (read at the call) if None."""
    timeout = TIMING_TIMEOUT if timeout is None else timeout
    env_fn_blob = cloudpickle.dumps(env_fn)
    preload_what_it_names(env_fn_blob)
    ctx = mp_context(start_method)
    receiver, sender = ctx.Pipe(duplex=False)
    prefix = SCRIPT_WORKER_PREFIX if start.import_main else WORKER_NAME_PREFIX
    args = (sender, start.setup, env_fn_blob, start.worker_threads, os.getpid())
    process = ctx.Process(target=_time_here, args=args, daemon=start.daemon, name=prefix + TIMING_PROCESS)
    try:
        process.start()
    finally:
        sender.close()
    answered = False
    try:
        if not receiver.poll(timeout):
            raise TimingFailed(f"the env was not timed within {timeout:g} s")
        kind, *result = pickle.loads(receiver.recv_bytes())
        answered = True
    except (EOFError, OSError) as exc:
        raise TimingFailed("the timing process died") from exc
    finally:
        receiver.close()
        _end(process, 1.0 if answered else 0.0)
    if kind == "not timed":
        raise NotTimed(result[0])
    if kind == "failed":
        raise TimingFailed(result[0])
    return EnvTiming(*result)


def _end(process: Any, wait: float) -> None:
    """Let ``process`` exit within ``wait`` seconds, else tell it to stop (its env closes, what the
    env started ends) and kill it and its tree after :data:`CLOSE_GRACE`; then kill what is left of
    its process group. A Ctrl-C during the grace skips to the kill."""
    try:
        process.join(wait)
        if process.exitcode is None:
            process.terminate()
            process.join(CLOSE_GRACE)
    finally:
        if process.exitcode is None:
            kill_tree(process.pid, root_too=True)
            process.join()
        _kill_group_left_of(process.pid)


# ==== the timing process ====================================================================


class _Stop(BaseException):
    """Raised in the timing process's main thread by SIGTERM: unwinds through the env's ``close()``.
    A BaseException, so that an env's ``except Exception`` does not hold it."""


_stop_armed = True  # SIGTERM raises _Stop once, and never while the process ends what its env started


def _stop(signum, frame) -> None:
    global _stop_armed
    if _stop_armed:
        _stop_armed = False  # a second SIGTERM (the watchdog's, then the main process's) must not cut close() short
        raise _Stop


def _time_here(sender: Any, setup_blob: bytes, env_fn_blob: bytes, n_threads: int | None, main_pid: int) -> None:
    """The timing process: take on the script's set-up, time the env unpickled from ``env_fn_blob``,
    end all it started, send back ``("timed", *EnvTiming)``, ``("not timed", why)`` or
    ``("failed", the error in a line)``."""
    global _stop_armed
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _adopt_what_the_env_starts()  # before anything here can start a process
    signal.signal(signal.SIGTERM, _stop)
    _start_orphan_watchdog(main_pid)
    result: tuple | None = None
    try:
        try:
            apply(cloudpickle.loads(setup_blob), None)
            limit_threads(n_threads)  # as a worker's: the env is timed as it will run
            result = _time_quietly(cloudpickle.loads(env_fn_blob))
        except Exception as exc:
            result = ("failed", f"{type(exc).__name__}: {exc}")
    except _Stop:
        pass  # told to stop: the env closed on the way here, if it existed
    finally:
        _stop_armed = False  # first, before any call (where a handler may run): a SIGTERM cannot cut this short
        end_descendants(DESCENDANT_GRACE)
    try:
        if result is not None:  # the answer comes once all the env started is gone: the workers start after it
            sender.send_bytes(pickle.dumps(result))
    except OSError:
        pass  # nobody is listening any more
    finally:
        sender.close()


def _time_quietly(env_fn: Callable[[], Any]) -> tuple:
    env = env_fn()
    closes = False  # time_env_and_machine closes what it times
    try:
        why = quieten(env)
        if why is not None:
            return ("not timed", why)
        identity = env_identity(env)
        closes = True
        return ("timed", *time_env_and_machine(lambda: env)._replace(identity=identity))
    finally:
        if not closes:
            env.close()


def _start_orphan_watchdog(main_pid: int) -> None:
    """End this process soon after the main process dies, closing the env if it can: the main
    thread may be building the env or stepping it for many seconds (a simulator starting up)."""
    alive, main_thread = parent_watch(main_pid), threading.main_thread().ident

    def watch() -> None:
        while alive():
            time.sleep(PARENT_CHECK_INTERVAL)
        signal.pthread_kill(main_thread, signal.SIGTERM)  # _Stop in the main thread: the env closes
        time.sleep(ORPHAN_GRACE)
        kill_tree(os.getpid())  # the env did not close in time: what it started goes with it
        os._exit(ORPHAN_EXIT_CODE)  # nobody is left to report to

    threading.Thread(target=watch, name="shmvec-orphan-watchdog", daemon=True).start()


def _adopt_what_the_env_starts() -> None:
    """Make this process the child subreaper of all that the env starts, and the leader of a process group
    of its own. Outside the terminal's foreground group it would be stopped writing to the terminal
    (``stty tostop``) or reading from it: it ignores SIGTTOU (the write goes through) and SIGTTIN
    (the read fails with EIO), as do the processes it starts."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # the subreaper still covers all but a kill from outside
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    signal.signal(signal.SIGTTIN, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: orphans go to init, though the main process still ends what stays in the group


def _kill_group_left_of(pid: int) -> None:
    """SIGKILL what is left of the process group that the ended timing process ``pid`` led: orphans
    of a timing process killed from outside (they went to init). Its number can be no other group's
    while one of its members lives; it is left alone if ``pid`` is some new process's already."""
    if status(pid) is not None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no group left (the usual case), or it was never made
