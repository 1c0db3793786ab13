"""The constructor arguments of the classes the adapters replace, as their users pass them.

``AsyncVectorEnv(env_fns, shared_memory=True, copy=True, context=None, daemon=True, worker=None,
observation_mode="same", autoreset_mode=NEXT_STEP, max_concurrency=None)`` and
``SubprocVecEnv(env_fns, start_method=None)`` take these by keyword or by position; the shmvec
classes put ``n_workers`` second. Each argument keeps its meaning here (:data:`ASYNC_ARGS_DOC`),
so only the class name changes: the same calls bind the same values, and an argument given
twice (by position and by keyword) is the same ``TypeError``.

An argument given twice can only be told from one left at its default if the default is not a
plain value: the adapters' keywords default to a :class:`Default`, whose ``repr`` is its value's
(so their signatures read as before).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmvec.gymnasium_1_1 import AutoresetMode


class Default:
    """A keyword's default, told apart from the same value passed explicitly."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


# The adapters' keyword defaults (one object each: a signature's defaults are built once anyway).
DEFAULT_TRUE, DEFAULT_NONE, DEFAULT_SAME = Default(True), Default(None), Default("same")
DEFAULT_NEXT_STEP = Default(AutoresetMode.NEXT_STEP)


def value_of(argument: Any) -> Any:
    """The value an argument stands for: a :class:`Default`'s own value, else the argument."""
    return argument.value if isinstance(argument, Default) else argument


def is_bool(value: Any) -> bool:
    """A bool, Python's or numpy's (``np.True_`` is not an ``int``, ``True`` is)."""
    return isinstance(value, (bool, np.bool_))


# AsyncVectorEnv's parameters after env_fns, in its order, with its defaults.
ASYNC_DEFAULTS = {
    "shared_memory": True,
    "copy": True,
    "context": None,
    "daemon": True,
    "worker": None,
    "observation_mode": "same",
    "autoreset_mode": AutoresetMode.NEXT_STEP,
    "max_concurrency": None,
}
# Those ShmVectorEnv declares itself (defaulting to a Default); worker and max_concurrency come with the pool options.
ASYNC_KEYWORDS = ("shared_memory", "copy", "context", "daemon", "observation_mode", "autoreset_mode")
ASYNC_FROM_POOL_OPTIONS = ("worker", "max_concurrency")

ASYNC_ARGS_DOC = """
    ``AsyncVectorEnv``'s arguments, accepted with their meaning there (by keyword, or in its
    positional order when the second argument is a bool, Python's or numpy's:
    ``ShmVectorEnv(env_fns, False)`` reads ``False`` as ``shared_memory``; one given both by
    position and by keyword is a ``TypeError``, as there):

    - ``context``: the ``multiprocessing`` start method (``"fork"``, ``"forkserver"``,
      ``"spawn"``), i.e. shmvec's ``start_method``. ``None`` (default) means shmvec's default
      start method (forkserver), not ``multiprocessing``'s (fork before Python 3.14).
    - ``shared_memory``: an accepted no-op. shmvec always passes every fixed-size leaf
      (Box, Discrete, MultiDiscrete, MultiBinary) through shared memory and the others
      (custom spaces, Graph, Text, ...) through a pipe, whatever the value; the results are
      the same either way, as they are for ``AsyncVectorEnv``.
    - ``daemon``: ``True`` (default): workers are daemonic processes. ``False``: they are not,
      so an env may start ``multiprocessing`` children of its own (a daemonic process may
      not). Either way they exit when the main process dies, even by SIGKILL.
    - ``worker`` and ``max_concurrency``: only ``None``; shmvec runs its own workers, each
      stepping its envs one after another (``n_workers`` bounds how many run at once).
"""


def bind_async_vector_env(
    owner: str, n_workers: Any, positional: tuple, keywords: dict[str, Any], pool_options: dict[str, Any]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(n_workers, AsyncVectorEnv's arguments, the pool options)`` for
    ``ShmVectorEnv(env_fns, n_workers, *positional, **keywords, **pool_options)``, bound as
    ``AsyncVectorEnv(env_fns, ...)`` binds them: every one of :data:`ASYNC_DEFAULTS`, its
    default where not given; those of :data:`ASYNC_FROM_POOL_OPTIONS` are taken out of the
    pool options.

    ``keywords`` holds :data:`ASYNC_KEYWORDS` as the constructor got them (a :class:`Default`
    where not given). A bool second argument is ``shared_memory``, and ``positional`` the
    arguments that follow it; else the second is ``n_workers``, and there are no more.
    """
    pool_options = dict(pool_options)
    given = {name: keywords[name] for name in ASYNC_KEYWORDS if not isinstance(keywords[name], Default)}
    given.update((name, pool_options.pop(name)) for name in ASYNC_FROM_POOL_OPTIONS if name in pool_options)
    if is_bool(n_workers):  # AsyncVectorEnv's shared_memory, in its slot
        if len(positional) >= len(ASYNC_DEFAULTS):
            raise TypeError(
                f"{owner}() takes AsyncVectorEnv's positional arguments up to {list(ASYNC_DEFAULTS)[-1]}, no more"
            )
        for name, value in zip(ASYNC_DEFAULTS, (n_workers, *positional)):
            if name in given:
                raise TypeError(f"{owner}() got multiple values for argument {name!r}")
            given[name] = value
        n_workers = None
    elif positional:
        raise TypeError(
            f"{owner}() takes env_fns and n_workers positionally, the rest by keyword "
            f"(or AsyncVectorEnv's positional order, with a bool shared_memory second)"
        )
    return n_workers, {name: given.get(name, default) for name, default in ASYNC_DEFAULTS.items()}, pool_options


def async_vector_env(
    owner: str, n_workers: Any, positional: tuple, keywords: dict[str, Any], pool_options: dict[str, Any]
) -> tuple[Any, tuple[Any, Any, Any], dict[str, Any]]:
    """``(n_workers, (copy, autoreset_mode, observation_mode), pool_options)`` for
    ``ShmVectorEnv(env_fns, n_workers, *positional, **keywords, **pool_options)``: the
    arguments bound by :func:`bind_async_vector_env`, then given their meaning; ``context``
    joins the pool options as ``start_method``.
    """
    n_workers, args, pool_options = bind_async_vector_env(owner, n_workers, positional, keywords, pool_options)
    if args["worker"] is not None:
        raise TypeError(f"{owner}() runs its own workers: worker= must be None")
    if args["max_concurrency"] is not None:
        raise TypeError(
            f"{owner}() steps each worker's envs one after another: max_concurrency= must be None "
            "(n_workers bounds how many envs step at once)"
        )
    # shared_memory: shared memory for fixed-size leaves, a pipe for the rest, always
    if not args["daemon"]:  # AsyncVectorEnv's daemon is shmvec's pool option of that name
        pool_options["daemon"] = False
    context = args["context"]
    if context is not None:
        start_method = pool_options.get("start_method")
        if start_method is not None and start_method != context:
            raise TypeError(f"{owner}() got context={context!r} and start_method={start_method!r}: pass one")
        pool_options["start_method"] = context
    return n_workers, (args["copy"], args["autoreset_mode"], args["observation_mode"]), pool_options


def subproc_vec_env(owner: str, n_workers: Any, start_method: Any) -> tuple[Any, Any]:
    """``(n_workers, start_method)`` for ``ShmPoolVecEnv(env_fns, n_workers, start_method)``,
    ``start_method`` a :class:`Default` where not given: a string second means
    ``start_method``, as in ``SubprocVecEnv(env_fns, "spawn")``, and one given by keyword as
    well is a ``TypeError``, as there."""
    if isinstance(n_workers, str):
        if not isinstance(start_method, Default):
            raise TypeError(
                f"{owner}() got multiple values for argument 'start_method' (a string second argument is "
                f"SubprocVecEnv's start_method; n_workers must be an int, got {n_workers!r})"
            )
        return None, n_workers
    return n_workers, value_of(start_method)
