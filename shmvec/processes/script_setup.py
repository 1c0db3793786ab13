"""The script's process set-up, carried to workers that do not run the script.

Under forkserver and spawn a worker does not import the main script
(:mod:`~shmvec.processes.lean_start`), so what the script set up at its top would be lost.
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
                           go back to the main process's handlers, each once
                           (:mod:`~shmvec.processes.log_relay`)
``random``, ``np.random``  worker k starts each from a state derived from the parent's state
                           of it at pool creation, the pool's index in this process, k and
                           k's restarts so far (:func:`worker_rng_states`): streams that
                           differ between workers, pools and lives, and repeat when the
                           script seeds
Gymnasium                  the registry (the parent's spec wins, also over ids a plugin
                           registers again when an env_fn imports it) and
                           ``gym.logger``'s level
anything else              ``worker_init=`` (run in each worker after the above, before
                           its env_fns), or ``import_main=True``; see
                           :mod:`~shmvec.processes.script_check`
=========================  ==============================================================

Under fork a worker inherits all of it; applying it again changes nothing but the generators'
states (derived as above) and the parent's log handlers (removed: the relay hands each record to
the originals).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from shmvec.options import PoolOptions
from shmvec.processes.log_relay import LogRelay, relay_to
from shmvec.processes.script_check import main_script, setup_is_shared, warn_once


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
    pool_index: int = 0  # the pool's place among those this process made (pools_made)


@dataclass(frozen=True)
class WorkerStart:
    """What every worker of a pool starts with, besides its envs (the same on a restart, but
    for ``restarts``)."""

    setup: bytes  # the script's set-up, pickled (setup_blob)
    log_queue: Any  # where its log records go (LogRelay)
    worker_threads: int | None
    import_main: bool  # it imports the main script (lean_start.SCRIPT_WORKER_PREFIX)
    restarts: int = 0  # the worker's restarts before this start (the restarter sets it): its generators differ
    daemon: bool = True  # a daemonic process (multiprocessing's flag): False lets its envs start children


_pools_made = 0  # by this process: the next pool's index
_pools_lock = threading.Lock()


def pools_made() -> int:
    """How many pools this process has made so far: the index the next one takes."""
    return _pools_made


def _take_pool_index() -> int:
    global _pools_made
    with _pools_lock:
        index, _pools_made = _pools_made, _pools_made + 1
    return index


def worker_start(options: PoolOptions) -> WorkerStart:
    """What every worker of a pool made with ``options`` starts with; its log queue is set by
    :func:`for_workers` once the pool has workers."""
    import_main = options.import_main and options.start_method != "fork"  # a fork has the script already
    if import_main and getattr(sys.modules["__main__"], "__file__", None) is None:
        raise ValueError(
            "import_main=True: the main module has no file for workers to import (python -c, a piped script, "
            "a notebook); pass worker_init= instead, or run the code as a script file"
        )
    # Taken here, once per pool whatever its plan: the timing run and the layout change no index.
    setup = capture(options.worker_init, _take_pool_index())
    return WorkerStart(setup_blob(setup), None, options.worker_threads, import_main, daemon=options.daemon)


def for_workers(start: WorkerStart, options: PoolOptions) -> tuple[WorkerStart, LogRelay]:
    """``start`` with its workers' log records relayed to this process's handlers (the caller
    closes the relay after the workers); warns once if the script sets up what workers miss."""
    if not setup_is_shared(options):
        warn_once(main_script())
    relay = LogRelay()
    return dataclasses.replace(start, log_queue=relay.queue), relay


def capture(worker_init: Callable[[], Any] | None = None, pool_index: int = 0) -> ScriptSetup:
    """This process's set-up, as the workers of its pool ``pool_index`` should start with it."""
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
        pool_index=pool_index,
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


def apply(setup: ScriptSetup, log_queue: Any, worker: int | None = None, restarts: int = 0) -> None:
    """In worker ``worker``, restarted ``restarts`` times before, before its env_fns are loaded:
    take on ``setup``; log records go to ``log_queue`` (:mod:`~shmvec.processes.log_relay`).
    ``worker`` None (the timing process): the global generators take the parent's states as they are."""
    for name in set(os.environ) - set(setup.environ):
        del os.environ[name]
    os.environ.update(setup.environ)
    apply_filters(setup.warning_filters)
    logging.captureWarnings(setup.capture_warnings)
    relay_to(log_queue)
    for name, level in setup.log_levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.disable(setup.log_disable)
    random_state, numpy_state = setup.random_state, setup.numpy_state
    if worker is not None:
        random_state, numpy_state = worker_rng_states(
            random_state, numpy_state, worker, pool_index=setup.pool_index, restarts=restarts
        )
    random.setstate(random_state)
    np.random.set_state(numpy_state)
    gym.logger.min_level = setup.gym_log_level
    pin_registry(setup.registry)
    if setup.worker_init is not None:
        setup.worker_init()


def worker_rng_states(
    random_state: tuple, numpy_state: tuple, worker: int, *, pool_index: int = 0, restarts: int = 0
) -> tuple[tuple, tuple]:
    """The states worker ``worker`` of the process's pool ``pool_index`` (0 for its first pool: see
    :func:`pools_made`), restarted ``restarts`` times before, starts ``random`` and ``np.random``
    from, given the main process's states of them (``random.getstate()``, ``np.random.get_state()``)
    when the pool was made. Reads its arguments only: no generator of the caller moves.

    Each generator is seeded with 256 bits drawn from
    ``np.random.SeedSequence(entropy, spawn_key=(pool_index, worker, restarts))``, ``entropy`` being
    the SHA-256 of the parent's state of that same generator: workers, pools made one after the
    other (train envs, then eval envs) and a worker's lives draw independent streams, and a
    script that seeds a generator the same way gets the same streams again, as it makes its pools
    in the same order (one it leaves unseeded differs run to run, as in the main process).

    Example:
        >>> import random, numpy as np
        >>> seeded = random.Random(0).getstate(), np.random.RandomState(0).get_state()  # random.seed(0) ...
        >>> def first_draws(worker, **where):
        ...     stdlib, legacy = random.Random(), np.random.RandomState()
        ...     random_state, numpy_state = worker_rng_states(*seeded, worker, **where)
        ...     stdlib.setstate(random_state); legacy.set_state(numpy_state)
        ...     return stdlib.random(), legacy.random_sample()
        >>> first_draws(0) != first_draws(1), first_draws(0) == first_draws(0)
        (True, True)
        >>> first_draws(0) != first_draws(0, pool_index=1), first_draws(0) != first_draws(0, restarts=1)
        (True, True)
    """
    spawn_key = (pool_index, worker, restarts)
    version, words, gauss = random_state
    stdlib_bytes = np.array(words, np.uint32).tobytes() + repr(gauss).encode()
    stdlib_seed = _derived_seed(b"random", stdlib_bytes, spawn_key)
    name, key, position, has_gauss, cached = numpy_state
    numpy_bytes = np.asarray(key, np.uint32).tobytes() + repr((name, int(position), int(has_gauss), cached)).encode()
    numpy_seed = _derived_seed(b"numpy", numpy_bytes, spawn_key)
    stdlib = random.Random(int.from_bytes(stdlib_seed.tobytes(), "little"))
    return stdlib.getstate(), np.random.RandomState(numpy_seed).get_state()


def _derived_seed(generator: bytes, state: bytes, spawn_key: tuple[int, int, int]) -> np.ndarray:
    entropy = int.from_bytes(hashlib.sha256(generator + state).digest(), "little")
    return np.random.SeedSequence(entropy, spawn_key=spawn_key).generate_state(8)


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
