"""The constructor arguments of the classes the adapters replace, as their users pass them.

``AsyncVectorEnv(env_fns, shared_memory=True, copy=True, context=None, daemon=True, worker=None,
observation_mode="same", autoreset_mode=NEXT_STEP)`` and ``SubprocVecEnv(env_fns, start_method=None)``
take these by keyword or by position; the shmvec classes put ``n_workers`` second. Each
argument keeps its meaning here (:data:`ASYNC_ARGS_DOC`), so only the class name changes.
"""

from __future__ import annotations

import warnings
from typing import Any

from gymnasium.vector import AutoresetMode

# AsyncVectorEnv's parameters after shared_memory, in its order, with its defaults.
ASYNC_POSITIONAL = {
    "copy": True,
    "context": None,
    "daemon": True,
    "worker": None,
    "observation_mode": "same",
    "autoreset_mode": AutoresetMode.NEXT_STEP,
}

ASYNC_ARGS_DOC = """
    ``AsyncVectorEnv``'s arguments, accepted with their meaning there (by keyword, or in its
    positional order when the second argument is a bool: ``ShmVectorEnv(env_fns, False)``
    reads ``False`` as ``shared_memory``):

    - ``context``: the ``multiprocessing`` start method (``"fork"``, ``"forkserver"``,
      ``"spawn"``), i.e. shmvec's ``start_method``. ``None`` (default) means shmvec's default
      start method (forkserver), not ``multiprocessing``'s (fork before Python 3.14).
    - ``shared_memory``: an accepted no-op. shmvec always passes every fixed-size leaf
      (Box, Discrete, MultiDiscrete, MultiBinary) through shared memory and the others
      (custom spaces, Graph, Text, ...) through a pipe, whatever the value; the results are
      the same either way, as they are for ``AsyncVectorEnv``.
    - ``daemon``: ``True`` (default) is what shmvec always does: workers are daemonic
      processes, and they exit when the main process dies, even by SIGKILL. ``False`` is
      accepted but cannot be honoured, and warns (``RuntimeWarning``): an env that starts
      ``multiprocessing`` children of its own fails in a worker ("daemonic processes are
      not allowed to have children"; ``subprocess`` is fine). Keep such envs in the main
      process (``n_workers=0, main_shard=True``).
    - ``worker``: only ``None``; shmvec runs its own workers.
"""


def async_vector_env(
    owner: str, n_workers: Any, positional: tuple, keywords: dict[str, Any], pool_options: dict[str, Any]
) -> tuple[Any, tuple[Any, Any, Any], dict[str, Any]]:
    """``(n_workers, (copy, autoreset_mode, observation_mode), pool_options)`` for
    ``ShmVectorEnv(env_fns, n_workers, *positional, **keywords, **pool_options)``.

    ``keywords`` holds the constructor's own keyword arguments (``copy``, ``autoreset_mode``,
    ``observation_mode``, ``shared_memory``, ``context``, ``daemon``); ``context`` joins the
    pool options as ``start_method``.
    """
    keywords = dict(keywords)
    if isinstance(n_workers, bool):  # AsyncVectorEnv's shared_memory, in its slot
        if len(positional) > len(ASYNC_POSITIONAL):
            raise TypeError(f"{owner}() takes AsyncVectorEnv's positional arguments up to autoreset_mode, no more")
        given = {"shared_memory": n_workers, **dict(zip(ASYNC_POSITIONAL, positional))}
        defaults = {"shared_memory": True, **ASYNC_POSITIONAL}
        for name, value in given.items():
            if not _is_default(keywords.get(name, defaults[name]), defaults[name]):
                raise TypeError(f"{owner}() got multiple values for argument {name!r}")
            keywords[name] = value
        n_workers = None
    elif positional:
        raise TypeError(
            f"{owner}() takes env_fns and n_workers positionally, the rest by keyword "
            f"(or AsyncVectorEnv's positional order, with a bool shared_memory second)"
        )
    pool_options = dict(pool_options)
    if keywords.pop("worker", None) is not None or pool_options.pop("worker", None) is not None:
        raise TypeError(f"{owner}() runs its own workers: worker= must be None")
    keywords.pop("shared_memory", None)  # shared memory for fixed-size leaves, a pipe for the rest: always
    if not keywords.pop("daemon", True):
        warnings.warn(
            f"{owner}(daemon=False) is ignored: its workers are daemonic processes, so an env that starts "
            "multiprocessing children fails in a worker; keep such envs in the main process "
            "(n_workers=0, main_shard=True)",
            RuntimeWarning,
            stacklevel=3,
        )
    context = keywords.pop("context", None)
    if context is not None:
        start_method = pool_options.get("start_method")
        if start_method is not None and start_method != context:
            raise TypeError(f"{owner}() got context={context!r} and start_method={start_method!r}: pass one")
        pool_options["start_method"] = context
    return n_workers, (keywords["copy"], keywords["autoreset_mode"], keywords["observation_mode"]), pool_options


def _is_default(value: Any, default: Any) -> bool:
    """A keyword left at its default (a value equal to it and of its type: a mode's string is not)."""
    return type(value) is type(default) and value == default


def subproc_vec_env(n_workers: Any, start_method: Any) -> tuple[Any, Any]:
    """``(n_workers, start_method)`` for ``ShmPoolVecEnv(env_fns, n_workers, start_method)``:
    a string second means ``start_method``, as in ``SubprocVecEnv(env_fns, "spawn")``; with a
    start method given as well, it stays ``n_workers`` (and is refused as one)."""
    if isinstance(n_workers, str) and start_method is None:
        return None, n_workers
    return n_workers, start_method
