"""Timings remembered between runs: a later run of the same script starts no timing process.

The default plan times one env (:mod:`~shmvec.engine.timing_run`); without a memory, each run
pays for a process that builds it, ~1.5 s on 2 cores for a ``make_vec_env`` factory, whose
pickle imports SB3 and torch. The timing is remembered beside the plan memory's file
(:func:`~shmvec.planning.plan_memory.timings_file`) under :func:`factory_key`, for
:data:`~shmvec.planning.plan_memory.TIMING_MAX_AGE`; ``SHMVEC_PLAN_CACHE=off`` turns it off
with the rest of the memory.
"""

from __future__ import annotations

import hashlib
import os
import pickletools
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from shmvec.options import PoolOptions
from shmvec.planning.env_timing import EnvTiming
from shmvec.planning.plan_memory import VERSION, cpu_model, recall_entry, remember_entry, timings_file
from shmvec.processes.starters import modules_named_by

TIMING_MAX_AGE = 7 * 24 * 3600.0  # seconds a remembered timing is used before the env is timed again
MAX_KEYED_PICKLE = 2**20  # bytes: a larger factory (one that carries data) is timed afresh each time
LARGE_INT = 2**20  # numbers at least this large are left out of factory_key (seeds), smaller ones kept (sizes, skips)
_INT_OPCODES = {"INT", "LONG", "BININT", "BININT1", "BININT2", "LONG1", "LONG4"}


def timing_of(
    env_fn: Callable[[], Any], time_env: Callable[[Callable[[], Any]], EnvTiming], options: PoolOptions
) -> EnvTiming:
    """``time_env(env_fn)``, or the timing remembered for the same factory with the same options on
    this machine (see :func:`~shmvec.planning.plan_memory.factory_key`): a run that made this pool
    before starts no timing process. A timing is remembered only if it found the env's identity."""
    key = None
    if timings_file() is not None:
        try:
            key = factory_key(
                cloudpickle.dumps(env_fn), [options.worker_threads, cloudpickle.dumps(options.worker_init)]
            )
        except Exception:
            key = None  # an env_fn that does not pickle: time_env says why
    remembered = recall_timing(key)
    if remembered is not None:
        return EnvTiming(*remembered)
    timing = time_env(env_fn)
    if timing.identity:
        remember_timing(key, tuple(timing))
    return timing


def factory_key(pickle_bytes: bytes, options: Any = ()) -> str | None:
    """The memory's key for the env an env factory (pickled) builds with ``options`` (what else
    shapes its timing: the workers' thread count, a ``worker_init``), on this machine; None if
    there is none (a pickle over :data:`MAX_KEYED_PICKLE` bytes: a factory that carries data).

    What changes from run to run and not what an env costs is left out: large numbers (a seed
    drawn at random: RL Zoo draws one per run) and the paths of folders, or of files not there
    yet (a log folder numbered per run). What changes the env is in: an existing file's path
    with its size and time of change (a configuration file), the registration of an env id it
    names (``gym.register``'s arguments), and the size and time of change of the files of the
    modules it names (an edited env module, an upgraded library)."""
    if len(pickle_bytes) > MAX_KEYED_PICKLE:
        return None
    digest = hashlib.sha256(repr([platform.node(), cpu_model(), sys.version_info[:2], VERSION, options]).encode())
    try:
        for opcode, arg, _ in pickletools.genops(pickle_bytes):
            if opcode.name in _INT_OPCODES and isinstance(arg, int) and abs(arg) >= LARGE_INT:
                arg = "<number>"
            elif isinstance(arg, str):
                arg = _str_token(arg)
            digest.update(repr((opcode.name, arg)).encode())
    except Exception:
        return None  # not a pickle genops can read: nothing to remember it by
    digest.update(repr([_file_stamp(name) for name in modules_named_by(pickle_bytes)]).encode())
    return digest.hexdigest()[:24]


def _str_token(text: str) -> Any:
    """A string of the factory's pickle as the key takes it (see :func:`factory_key`)."""
    if len(text) > 4096 or "\n" in text:
        return text
    if os.sep in text and (os.path.isabs(text) or os.path.isdir(text.split(os.sep, 1)[0])):
        return (text, _stamp(text)) if os.path.isfile(text) else "<path>"
    registry = getattr(sys.modules.get("gymnasium"), "registry", None)
    spec = registry.get(text) if isinstance(registry, dict) else None
    if spec is not None:
        return (text, repr(getattr(spec, "entry_point", None)), repr(getattr(spec, "kwargs", None)))
    return text


def _stamp(path: str) -> tuple:
    try:
        info = os.stat(path)
    except OSError:
        return ()
    return (info.st_size, info.st_mtime_ns)


def recall_timing(key: str | None) -> tuple | None:
    """The fields of the :class:`~shmvec.planning.env_timing.EnvTiming` remembered for ``key`` within
    :data:`TIMING_MAX_AGE`, if any."""
    entry = recall_entry(key, timings_file())
    if entry is None or "timing" not in entry or not 0 <= time.time() - entry["when"] <= TIMING_MAX_AGE:
        return None
    return tuple(entry["timing"])


def _file_stamp(name: str) -> tuple:
    """What tells an edited or upgraded module ``name`` apart: its file's size and time of change."""
    path = getattr(sys.modules.get(name), "__file__", None)
    return (name, *_stamp(path)) if isinstance(path, str) else (name,)


def remember_timing(key: str | None, timing: tuple) -> None:
    """Remember an env's timing (an ``EnvTiming``) under ``key`` (see :func:`remember`)."""
    remember_entry(key, {"timing": list(timing), "when": time.time()}, timings_file())


def unpicklable(env_fn: Callable[[], Any]) -> str | None:
    """Why ``env_fn`` cannot be sent to another process (cloudpickle's error), or None."""
    try:
        cloudpickle.dumps(env_fn)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
