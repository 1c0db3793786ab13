"""The default plan's timing run, in a throwaway process: nothing of it stays in the caller's.

``n_workers=None`` times one env before it plans (:mod:`~shmvec.engine.plan`). Timed in the
caller's process, that env would draw from the caller's global generators (an env whose
resets use ``np.random`` would then differ from ``DummyVecEnv``'s from the first reset),
would be one more instance of the env in the caller's process (wrong for a library that
allows one instance per process, a simulator with one licence seat, a robot), and could
take the caller down with it. So it runs in a process of its own, started as a worker is
(without the main script, with the script's set-up applied: its registered ids, its
environment), which builds the env from ``env_fns[0]``, times it
(:func:`~shmvec.engine.env_timing.time_env_and_machine`), closes it and exits. An explicit
``n_workers`` skips all of it.
"""

from __future__ import annotations

import functools
import pickle
import signal
from collections.abc import Callable
from typing import Any

import cloudpickle

from shmvec.engine.env_timing import EnvTiming, time_env_and_machine
from shmvec.engine.lean_start import SCRIPT_WORKER_PREFIX, WORKER_NAME_PREFIX
from shmvec.engine.link import mp_context
from shmvec.engine.script_setup import WorkerStart, apply
from shmvec.engine.worker import limit_threads

TIMING_TIMEOUT = 60.0  # seconds the timing process may take (building the env included) before the plan gives up
TIMING_PROCESS = "timing"  # its name after the worker prefix


class TimingFailed(RuntimeError):
    """The timing process could not time the env (the env raised, or the process died or hung)."""


def timer(start_method: str, start: WorkerStart) -> Callable[[Callable[[], Any]], EnvTiming]:
    """:func:`time_in_process` in processes started by ``start_method`` as workers with ``start``."""
    return functools.partial(time_in_process, mp_context(start_method), start)


def time_in_process(
    ctx: Any, start: WorkerStart, env_fn: Callable[[], Any], timeout: float = TIMING_TIMEOUT
) -> EnvTiming:
    """:func:`~shmvec.engine.env_timing.time_env_and_machine` of ``env_fn``, run in a new process
    of ``ctx`` that starts as a worker with ``start``; raises :class:`TimingFailed`."""
    receiver, sender = ctx.Pipe(duplex=False)
    prefix = SCRIPT_WORKER_PREFIX if start.import_main else WORKER_NAME_PREFIX
    args = (sender, start.setup, cloudpickle.dumps(env_fn), start.worker_threads)
    process = ctx.Process(target=_time_here, args=args, daemon=True, name=prefix + TIMING_PROCESS)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise TimingFailed(f"the env was not timed within {timeout:g} s")
        result = pickle.loads(receiver.recv_bytes())
    except (EOFError, OSError) as exc:
        raise TimingFailed("the timing process died") from exc
    finally:
        receiver.close()
        process.join(1.0)
        if process.exitcode is None:
            process.kill()
            process.join()
    if isinstance(result, str):
        raise TimingFailed(result)
    return EnvTiming(*result)


def _time_here(sender: Any, setup_blob: bytes, env_fn_blob: bytes, n_threads: int | None) -> None:
    """The timing process: take on the script's set-up, time the env, send back the numbers (or
    the error's one-line description)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    try:
        apply(cloudpickle.loads(setup_blob), None)
        limit_threads(n_threads)  # as a worker's: the env is timed as it will run
        result: Any = tuple(time_env_and_machine(cloudpickle.loads(env_fn_blob)))
    except Exception as exc:
        result = f"{type(exc).__name__}: {exc}"
    try:
        sender.send_bytes(pickle.dumps(result))
    finally:
        sender.close()
