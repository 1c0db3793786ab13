"""The default plan's timing run, in a throwaway process: nothing of it stays in the caller's.

``n_workers=None`` times one env before it plans (:mod:`~shmvec.engine.plan`). Timed in the
caller's process, that env would draw from the caller's global generators (an env whose
resets use ``np.random`` would then differ from ``DummyVecEnv``'s from the first reset),
would be one more instance of the env in the caller's process (wrong for a library that
allows one instance per process, a simulator with one licence seat, a robot), and could
take the caller down with it. So it runs in a process of its own, started as a worker is
(without the main script, with the script's set-up applied: its registered ids, its
environment), which builds the env, turns off what it would record outside the process
(:func:`~shmvec.engine.outside_effects.quieten`), times it
(:func:`~shmvec.engine.env_timing.time_env_and_machine`), closes it and exits. An explicit
``n_workers`` skips all of it.

The process ends with the caller's need of it: a watchdog thread sees the main process die
(SIGKILL, the out-of-memory killer) within :data:`PARENT_CHECK_INTERVAL`; then, as when the
main process gives up on it (:data:`TIMING_TIMEOUT`, Ctrl-C), SIGTERM raises in its main thread
(a wait in ``time.sleep``, a socket or a lock is cut short) so the env is closed on the way
out, and after a grace period the process exits or is killed all the same.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from shmvec.engine.env_timing import EnvTiming, time_env_and_machine
from shmvec.engine.lean_start import SCRIPT_WORKER_PREFIX, WORKER_NAME_PREFIX
from shmvec.engine.link import mp_context
from shmvec.engine.outside_effects import NotTimed, quieten
from shmvec.engine.plan_memory import env_identity
from shmvec.engine.script_setup import WorkerStart, apply
from shmvec.engine.worker import ORPHAN_EXIT_CODE, limit_threads, parent_watch

TIMING_TIMEOUT = 60.0  # seconds the timing process may take (building the env included) before the plan gives up
TIMING_PROCESS = "timing"  # its name after the worker prefix
CLOSE_GRACE = 5.0  # seconds a timing process told to stop (SIGTERM) has to close its env before it is killed
PARENT_CHECK_INTERVAL = 0.25  # seconds between the timing process's checks that the main process lives
ORPHAN_GRACE = 0.5  # seconds an orphaned timing process gives its env to close before it exits anyway


class TimingFailed(RuntimeError):
    """The timing process could not time the env (the env raised, or the process died or hung)."""


def timer(start_method: str, start: WorkerStart) -> Callable[[Callable[[], Any]], EnvTiming]:
    """:func:`time_in_process` in processes started by ``start_method`` as workers with ``start``."""
    return functools.partial(time_in_process, mp_context(start_method), start)


def time_in_process(
    ctx: Any, start: WorkerStart, env_fn: Callable[[], Any], timeout: float = TIMING_TIMEOUT
) -> EnvTiming:
    """:func:`~shmvec.engine.env_timing.time_env_and_machine` of ``env_fn``, run in a new process
    of ``ctx`` that starts as a worker with ``start``; raises :class:`TimingFailed`, or
    :class:`~shmvec.engine.outside_effects.NotTimed` for an env that would be seen."""
    receiver, sender = ctx.Pipe(duplex=False)
    prefix = SCRIPT_WORKER_PREFIX if start.import_main else WORKER_NAME_PREFIX
    args = (sender, start.setup, cloudpickle.dumps(env_fn), start.worker_threads, os.getpid())
    process = ctx.Process(target=_time_here, args=args, daemon=True, name=prefix + TIMING_PROCESS)
    process.start()
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
    """Let ``process`` exit within ``wait`` seconds, else tell it to stop (its env closes) and
    kill it after :data:`CLOSE_GRACE`."""
    process.join(wait)
    if process.exitcode is None:
        process.terminate()
        process.join(CLOSE_GRACE)
    if process.exitcode is None:
        process.kill()
        process.join()


class _Stop(BaseException):
    """Raised in the timing process's main thread by SIGTERM: unwinds through the env's ``close()``.
    A BaseException, so that an env's ``except Exception`` does not hold it."""


def _stop(signum, frame) -> None:
    raise _Stop


def _time_here(sender: Any, setup_blob: bytes, env_fn_blob: bytes, n_threads: int | None, main_pid: int) -> None:
    """The timing process: take on the script's set-up, time the env, send back
    ``("timed", *EnvTiming)``, ``("not timed", why)`` or ``("failed", the error in a line)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, _stop)
    _start_orphan_watchdog(main_pid)
    try:
        try:
            apply(cloudpickle.loads(setup_blob), None)
            limit_threads(n_threads)  # as a worker's: the env is timed as it will run
            result: tuple = _time_quietly(cloudpickle.loads(env_fn_blob))
        except Exception as exc:
            result = ("failed", f"{type(exc).__name__}: {exc}")
        sender.send_bytes(pickle.dumps(result))
    except (_Stop, OSError):
        pass  # told to stop, or nobody is listening any more: the env closed on the way here
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
        os._exit(ORPHAN_EXIT_CODE)  # the env did not close in time; nobody is left to report to

    threading.Thread(target=watch, name="shmvec-orphan-watchdog", daemon=True).start()
