"""The script's process set-up, carried to workers that do not run the script.

Under forkserver and spawn a worker does not import the main script
(:mod:`~shmvec.engine.lean_start`), so what the script set up at its top would be lost.
What can be carried without running the script is captured once per pool, in the main
process (:func:`capture`), and applied in each worker before its env_fns are loaded
(:func:`apply`), so that every env of a vector env sees one set-up, in a worker or in
the main process:

=========================  ==============================================================
set-up                     carried as
=========================  ==============================================================
environment variables      ``os.environ`` at pool creation, whole (the forkserver keeps
                           the environment it started with)
``warnings`` filters       ``warnings.filters``, and ``logging.captureWarnings``
logging                    the levels of the root and of every logger given one; records
                           go back to the main process's handlers (:class:`LogRelay`)
``random``, ``np.random``  the global generators' states at pool creation (as a fork
                           would: every worker starts from the same state)
Gymnasium                  the registry (the parent's spec wins, also over ids a plugin
                           registers again when an env_fn imports it) and
                           ``gym.logger``'s level
anything else              ``worker_init=`` (run in each worker after the above, before
                           its env_fns), or ``import_main=True``; see
                           :mod:`~shmvec.engine.script_check`
=========================  ==============================================================

Under fork a worker inherits all of it; applying it again changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import logging.handlers
import os
import pickle
import random
import socket
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from shmvec.engine.script_check import main_script, setup_is_shared, warn_once
from shmvec.options import PoolOptions

RELAY_CLOSE_TIMEOUT = 1.0  # seconds close() waits for the log relay to take its last records
MAX_RECORD_BYTES = 60_000  # a pickled log record's most (a datagram; a longer message is cut)


@dataclass
class ScriptSetup:
    """What :func:`apply` gives a worker (see the module docstring)."""

    environ: dict[str, str]
    warning_filters: list
    capture_warnings: bool
    log_levels: dict[str, int]  # logger name ("" for the root) -> level set on it
    log_disable: int  # logging.disable's level
    random_state: tuple
    numpy_state: tuple
    gym_log_level: int
    registry: dict[str, gym.envs.registration.EnvSpec]
    worker_init: Callable[[], Any] | None = None


@dataclass(frozen=True)
class WorkerStart:
    """What every worker of a pool starts with, besides its envs (the same on a restart)."""

    setup: bytes  # the script's set-up, pickled (setup_blob)
    log_queue: Any  # where its log records go (LogRelay)
    worker_threads: int | None
    import_main: bool  # it imports the main script (lean_start.SCRIPT_WORKER_PREFIX)


def worker_start(options: PoolOptions) -> WorkerStart:
    """What every worker of a pool made with ``options`` starts with; its log queue is set by
    :func:`for_workers` once the pool has workers."""
    import_main = options.import_main and options.start_method != "fork"  # a fork has the script already
    if import_main and getattr(sys.modules["__main__"], "__file__", None) is None:
        raise ValueError(
            "import_main=True: the main module has no file for workers to import (python -c, a piped script, "
            "a notebook); pass worker_init= instead, or run the code as a script file"
        )
    return WorkerStart(setup_blob(capture(options.worker_init)), None, options.worker_threads, import_main)


def for_workers(start: WorkerStart, options: PoolOptions) -> tuple[WorkerStart, LogRelay]:
    """``start`` with its workers' log records relayed to this process's handlers (the caller
    closes the relay after the workers); warns once if the script sets up what workers miss."""
    if not setup_is_shared(options):
        warn_once(main_script())
    relay = LogRelay()
    return dataclasses.replace(start, log_queue=relay.queue), relay


def capture(worker_init: Callable[[], Any] | None = None) -> ScriptSetup:
    """This process's set-up, as a worker should start with it."""
    manager = logging.Logger.manager
    levels = {name: logger.level for name, logger in manager.loggerDict.items() if isinstance(logger, logging.Logger)}
    levels = {name: level for name, level in levels.items() if level != logging.NOTSET}
    levels[""] = logging.getLogger().level
    return ScriptSetup(
        environ=dict(os.environ),
        warning_filters=[
            (action, message, _portable(category), module, line)
            for action, message, category, module, line in warnings.filters
        ],
        capture_warnings=getattr(logging, "_warnings_showwarning", None) is not None,
        log_levels=levels,
        log_disable=manager.disable,
        random_state=random.getstate(),
        numpy_state=np.random.get_state(),
        gym_log_level=gym.logger.min_level,
        registry=registry_copy(),
        worker_init=worker_init,
    )


def setup_blob(setup: ScriptSetup) -> bytes:
    """``setup`` pickled for the workers; registry entries that do not pickle (kwargs holding a
    lock or a socket) stay behind, and ``gym.make`` of their ids fails there as for any unknown id."""
    if setup.worker_init is not None and not _pickles(setup.worker_init):
        raise TypeError(
            f"worker_init={setup.worker_init!r} cannot be pickled, so it cannot reach the workers: pass a function "
            "defined at a module's top level (or in your script), or a lambda"
        )
    try:
        return cloudpickle.dumps(setup)
    except Exception:
        kept = {env_id: spec for env_id, spec in setup.registry.items() if _pickles(spec)}
        return cloudpickle.dumps(dataclasses.replace(setup, registry=kept))


def apply(setup: ScriptSetup, log_queue: Any) -> None:
    """In a worker, before its env_fns are loaded: take on ``setup``; log records go to ``log_queue``."""
    for name in set(os.environ) - set(setup.environ):
        del os.environ[name]
    os.environ.update(setup.environ)
    apply_filters(setup.warning_filters)
    logging.captureWarnings(setup.capture_warnings)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if log_queue is not None:
        root.addHandler(logging.handlers.QueueHandler(log_queue))
    for name, level in setup.log_levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(setup.log_disable)
    random.setstate(setup.random_state)
    np.random.set_state(setup.numpy_state)
    gym.logger.min_level = setup.gym_log_level
    pin_registry(setup.registry)
    if setup.worker_init is not None:
        setup.worker_init()


def after_env_built(setup: ScriptSetup) -> None:
    """In a worker, after each env_fn: what its imports may have undone or made possible."""
    pin_registry(setup.registry)
    if len(_resolved(setup.warning_filters)) > _applied_filters:
        apply_filters(setup.warning_filters)


_applied_filters = 0  # how many of the parent's warnings filters this worker has applied


def apply_filters(filters: list) -> None:
    """The parent's warnings ``filters`` (as :func:`capture` made them portable) whose categories
    can be found in this process, in the parent's order, before those this process added itself.

    A category from a module this process has not imported (``torch.jit.TracerWarning``) is not
    imported for it (that would cost a worker torch): its filter waits until an env_fn imports
    the module (:func:`after_env_built`).
    """
    global _applied_filters
    parents = _resolved(filters)
    own = [entry for entry in warnings.filters if entry not in parents]
    warnings.filters[:] = parents + own
    warnings._filters_mutated()  # the cache of "once"/"default" warnings shown is keyed on the filters
    _applied_filters = len(parents)


def _portable(category: type[Warning]) -> Any:
    """``category``, or ``(module, qualname)`` to find it by where it is not a builtin or the script's."""
    origin = category.__module__
    return category if origin in ("builtins", "__main__") else (origin, category.__qualname__)


def _resolved(filters: list) -> list:
    found = []
    for action, message, category, module, line in filters:
        if isinstance(category, tuple):
            category = _find(*category)
            if category is None:
                continue
        found.append((action, message, category, module, line))
    return found


def _find(module: str, qualname: str) -> Any:
    obj = sys.modules.get(module)
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    return obj


def registry_copy() -> dict[str, gym.envs.registration.EnvSpec]:
    """This process's Gymnasium registry, for a worker to take on (~1 ms to pickle, with ale_py's
    hundreds of ids).

    An entry point written ``"__main__:MyEnv"`` is replaced by the object itself, which
    cloudpickle then carries by value: a worker's ``__main__`` is not the script.
    """
    specs = {}
    for env_id, spec in gym.registry.items():
        entry = spec.entry_point
        if isinstance(entry, str) and entry.startswith("__main__:"):
            spec = dataclasses.replace(spec, entry_point=_main_attribute(entry))
        specs[env_id] = spec
    return specs


def pin_registry(specs: dict[str, gym.envs.registration.EnvSpec]) -> None:
    """Enter the parent's ``specs`` in this process's registry, over its own.

    Called again after each env is built: a plugin whose module an env_fn imports
    (ale_py, at ``gym.make("ALE/...")``) registers its ids again with its defaults, which
    must not replace what the script registered. Gymnasium would warn once per id
    (~700 lines per worker for ale_py), so workers do not show that warning.
    """
    gym.registry.update(specs)
    warnings.filterwarnings("ignore", message=".*Overriding environment .* already in registry", category=UserWarning)


class LogRelay:
    """The main process's end of the workers' logging: a datagram socket pair and a thread that
    hands each record to the logger of its name here, so the script's handlers and levels apply.

    Each record is one datagram, whole or not at all whichever workers write at once, so the
    workers need no lock; and unlike ``multiprocessing.Queue`` it leaves no named semaphore in
    ``/dev/shm`` when a process group is killed.
    """

    def __init__(self):
        self._read, write = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.queue = RecordSender(write)  # what workers log to (kept here for restarted ones)
        self._thread = threading.Thread(target=self._relay, name="shmvec-log-relay", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        while True:
            try:
                data = self._read.recv(MAX_RECORD_BYTES + 4096)
            except OSError:  # closed
                return
            if not data:  # close()'s
                return
            try:
                record = pickle.loads(data)
            except Exception:  # a record of a class this process cannot load: the worker's problem, not ours
                continue
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)

    def close(self) -> None:
        """Take the records the workers sent (call after they exited), then stop. Idempotent."""
        if self._thread.is_alive():
            self.queue.sock.send(b"")
            self._thread.join(RELAY_CLOSE_TIMEOUT)
        self.queue.sock.close()
        self._read.close()


class RecordSender:
    """A worker's end of the :class:`LogRelay`, for ``logging.handlers.QueueHandler``: one datagram a record."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def put_nowait(self, record: logging.LogRecord) -> None:
        data = pickle.dumps(record)  # QueueHandler.prepare made its message a string, without args
        if len(data) > MAX_RECORD_BYTES:
            record.msg = f"{str(record.msg)[: MAX_RECORD_BYTES // 2]} [... cut by shmvec's log relay]"
            data = pickle.dumps(record)
        self.sock.send(data)


def _pickles(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


def _main_attribute(entry_point: str) -> Any:
    """The object an ``"__main__:Name"`` entry point names, or the string if the main module lacks it."""
    name = entry_point.split(":", 1)[1]
    obj: Any = sys.modules["__main__"]
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return entry_point  # gym.make will say what is missing, as it would here
    return obj
