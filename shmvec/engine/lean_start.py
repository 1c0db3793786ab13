"""Worker processes that start without the user's main script.

Under forkserver and spawn, multiprocessing has every child import the parent's
``__main__`` (as ``__mp_main__``) before it runs anything. For a training script that
imports torch and SB3 at its top, that costs each worker ~150 MB of its own memory and
~0.6 s; a script without the ``if __name__ == "__main__":`` guard would build its vector
env again in every worker, and a script piped through stdin cannot be imported at all.

A worker needs none of it. Its env_fns come by cloudpickle, which carries the functions
and classes defined in ``__main__`` by value, and it imports their modules by name. What
it does need of the parent's state travels explicitly:

- ``sys.path`` and the working directory (multiprocessing sends them with every child),
  so an env module beside the script imports as it does in the parent;
- the env ids the script registered with Gymnasium (:func:`registry_additions`, entered
  in the worker's registry by :func:`register_missing`), so ``gym.make("MyEnv-v0")``
  inside an env_fn works, whether ``MyEnv`` is defined in the script or in a plugin the
  script imported (``ale_py``).

:func:`start_without_main` makes multiprocessing leave the main module out of what it
sends to processes named ``shmvec-worker-*`` (``multiprocessing.spawn.get_preparation_data``,
which both the spawn and the forkserver starters call); every other process is started
as before. Under fork a worker inherits the parent's memory, main module included.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from multiprocessing import spawn
from typing import Any

import cloudpickle
import gymnasium as gym

WORKER_NAME_PREFIX = "shmvec-worker-"
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")  # what has a child import the parent's __main__


def start_without_main() -> None:
    """From now on, ``shmvec-worker-*`` processes started by spawn or forkserver skip the main module. Idempotent."""
    original = spawn.get_preparation_data
    if getattr(original, "_shmvec_lean", False):
        return

    @functools.wraps(original)
    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if name.startswith(WORKER_NAME_PREFIX):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data

    get_preparation_data._shmvec_lean = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def registry_additions() -> dict[str, gym.envs.registration.EnvSpec]:
    """This process's Gymnasium registry, for a worker to add the ids its own lacks: those that
    plugins or the script registered, whatever their entry point (~1 ms to pickle, with
    ale_py's hundreds of ids).

    An entry point written ``"__main__:MyEnv"`` is replaced by the object itself, which
    cloudpickle then carries by value: a worker's ``__main__`` is not the script.
    """
    additions = {}
    for env_id, spec in gym.registry.items():
        entry = spec.entry_point
        if isinstance(entry, str) and entry.startswith("__main__:"):
            spec = dataclasses.replace(spec, entry_point=_main_attribute(entry))
        additions[env_id] = spec
    return additions


def env_fns_blob(env_fns: list, env_wrapper: Any) -> bytes:
    """What a worker unpickles first: its env_fns, the wrapper and the :func:`registry_additions`
    (those of them that pickle: an entry whose kwargs hold a lock or a socket stays behind, and
    ``gym.make`` of its id fails in the worker as for any unknown id)."""
    additions = registry_additions()
    try:
        return cloudpickle.dumps((env_fns, env_wrapper, additions))
    except Exception:
        kept = {env_id: spec for env_id, spec in additions.items() if _pickles(spec)}
        return cloudpickle.dumps((env_fns, env_wrapper, kept))  # unpicklable env_fns raise here, as before


def _pickles(obj: Any) -> bool:
    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


def register_missing(specs: dict[str, gym.envs.registration.EnvSpec]) -> None:
    """Enter the ``specs`` this process's registry lacks (a worker's; ids it has are kept).

    A plugin whose module an env_fn imports later (ale_py, at ``gym.make("ALE/...")``)
    registers its ids again over these copies of the parent's own entries: Gymnasium would
    warn once per id (~700 lines per worker for ale_py), so workers do not show that warning.
    """
    for env_id, spec in specs.items():
        gym.registry.setdefault(env_id, spec)
    warnings.filterwarnings("ignore", message=".*Overriding environment .* already in registry", category=UserWarning)


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
