"""Checks of user input that run before anything reaches a worker."""

from __future__ import annotations

import functools
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec.errors import InvalidActionError, SpaceMismatchError


def checked_column(values: object, view: np.ndarray, leaf_space: spaces.Space, context: str) -> np.ndarray:
    """``values`` as an array, checked against the shape and dtype of the leaf's rows.

    The shape must equal ``view``'s ``[num_envs, *leaf_shape]``, and the dtype must be of
    a kind the space's dtype takes: any integer or bool dtype for an integer space (Python
    ints arrive as int64, also for a uint8 space), no floats for it, except for MultiBinary
    spaces: SB3's PPO/A2C sample their actions as floats, and 0./1. are valid there. The
    envs get the values in their own dtype (:mod:`shmvec.ipc.action_rows`).

    Args:
        values: the user's actions for this leaf.
        view: the leaf's action rows, in the space's dtype.
        leaf_space: the single-env space of this leaf.
        context: how to name the actions in error messages (e.g. "actions at ('a',)").
    """
    try:
        column = np.asarray(values)
    except ValueError as exc:  # ragged: e.g. per-env actions of differing shapes
        raise InvalidActionError(
            f"expected {context} of shape {view.shape} (num_envs={view.shape[0]}, action space "
            f"{leaf_space}), got values that do not form one array: {exc}"
        ) from None
    if column.shape != view.shape:
        raise InvalidActionError(
            f"expected {context} of shape {view.shape} (num_envs={view.shape[0]}, action space "
            f"{leaf_space}), got shape {column.shape}"
        )
    if _same_kind(column.dtype, view.dtype):
        return column
    if column.dtype.kind in "biu" and view.dtype.kind in "iu":  # signed ints for an unsigned space
        return column
    if isinstance(leaf_space, spaces.MultiBinary) and column.dtype.kind in "biuf" and np.isin(column, (0, 1)).all():
        return column
    raise InvalidActionError(
        f"{context} of dtype {column.dtype} are not of the kind of the action space's dtype "
        f"{view.dtype}; pass {view.dtype} actions"
    )


@functools.cache
def _same_kind(given: np.dtype, expected: np.dtype) -> bool:
    """``np.can_cast(given, expected, casting="same_kind")``, remembered: ~1 µs a step, ~0.1 cached."""
    return bool(np.can_cast(given, expected, casting="same_kind"))


def split_actions(actions: object, space: spaces.Space, n_envs: int) -> dict[tuple[Any, ...], list[Any]]:
    """Per-env actions of a Dict/Tuple space -> ``{leaf path: [env 0's value, env 1's, ...]}``.

    ``actions`` holds one action per env, as SB3's ``DummyVecEnv`` indexes them
    (``actions[i]``): a list (or tuple, or object array) of dicts for a Dict space, of
    tuples for a Tuple space, nested as the space is. Dict actions may list their keys in
    any order but must have exactly the space's keys, since the env gets only those.

    Args:
        actions: the user's batch of actions.
        space: the single-env action space.
        n_envs: how many actions the batch must hold.

    Raises:
        InvalidActionError: a wrong count, a missing or extra key, a wrong tuple length.

    Example:
        >>> space = spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Tuple((spaces.Discrete(2),))})
        >>> split_actions([{"move": 1, "aim": (0,)}, {"aim": (1,), "move": 2}], space, 2)
        {('aim', 0): [0, 1], ('move',): [1, 2]}
    """
    if isinstance(actions, Mapping):
        raise InvalidActionError(
            f"expected a list of {n_envs} actions, one per env, each an element of {space} (as DummyVecEnv "
            f"takes them), got a {type(actions).__name__} with keys {list(actions)}"
        )
    try:
        count = len(actions)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidActionError(
            f"expected a list of {n_envs} actions, one per env, each an element of {space}, "
            f"got a {type(actions).__name__}"
        ) from None
    if count != n_envs:
        raise InvalidActionError(f"expected {n_envs} actions (one per env, each an element of {space}), got {count}")
    columns: dict[tuple[Any, ...], list[Any]] = {}
    _split_column(list(actions), space, (), columns)  # type: ignore[call-overload]
    return columns


def _split_column(values: list[Any], space: spaces.Space, path: tuple[Any, ...], out: dict) -> None:
    """Check one node of the action structure across all envs; collect its leaves into ``out``."""
    if isinstance(space, spaces.Dict):
        for i, value in enumerate(values):
            _check_dict_action(value, space, _where(i, path))
        for key, sub in space.spaces.items():
            _split_column([value[key] for value in values], sub, (*path, key), out)
    elif isinstance(space, spaces.Tuple):
        for i, value in enumerate(values):
            _check_tuple_action(value, space, _where(i, path))
        for k, sub in enumerate(space.spaces):
            _split_column([value[k] for value in values], sub, (*path, k), out)
    else:
        out[path] = values


def _check_dict_action(value: Any, space: spaces.Dict, where: str) -> None:
    expected = list(space.spaces)
    if not isinstance(value, Mapping):
        raise InvalidActionError(f"{where} is a {type(value).__name__}, expected a dict with keys {expected} ({space})")
    if value.keys() != space.spaces.keys():
        missing = [key for key in expected if key not in value]
        extra = [key for key in value if key not in space.spaces]
        problems = [f"misses key(s) {missing}"] if missing else []
        problems += [f"has unknown key(s) {extra}"] if extra else []
        raise InvalidActionError(f"{where} {' and '.join(problems)}; expected exactly the keys {expected} ({space})")


def _check_tuple_action(value: Any, space: spaces.Tuple, where: str) -> None:
    is_sequence = isinstance(value, (tuple, list)) or (isinstance(value, np.ndarray) and value.ndim >= 1)
    if not is_sequence:
        raise InvalidActionError(
            f"{where} is a {type(value).__name__}, expected a tuple of {len(space.spaces)} actions ({space})"
        )
    if len(value) != len(space.spaces):
        raise InvalidActionError(f"{where} has {len(value)} elements, expected {len(space.spaces)} ({space})")


def _where(env_index: int, path: tuple[Any, ...]) -> str:
    """How an error names one env's action part, e.g. ``actions[3]['mode'][0]``."""
    return f"actions[{env_index}]" + "".join(f"[{key!r}]" for key in path)


def check_env_fns(env_fns: Any) -> list[Callable[[], gym.Env]]:
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence):
        raise TypeError(f"env_fns must be a list of callables that each build an env, got {type(env_fns).__name__}")
    env_fns = list(env_fns)
    if not env_fns:
        raise ValueError("env_fns is empty: pass at least one callable that builds an env")
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(
                f"env_fns[{i}] is a {type(fn).__name__}, not a callable; pass functions that build envs, "
                "e.g. [lambda: gym.make('CartPole-v1')] * 8"
            )
    return env_fns


def check_same_spaces(
    spaces: list[tuple[gym.Space, gym.Space]],
    obs_space_match: Callable[[gym.Space, gym.Space], bool] = operator.eq,
) -> None:
    """Raise :class:`SpaceMismatchError` unless every env's spaces match env 0's.

    Args:
        spaces: ``(observation_space, action_space)`` of every env, in env order.
        obs_space_match: ``obs_space_match(env0_space, space)`` says whether an observation
            space fits env 0's; default equality. Action spaces must always be equal.
    """
    obs_spaces, action_spaces = [obs for obs, _ in spaces], [act for _, act in spaces]
    for i, (obs, act) in enumerate(spaces):
        if not obs_space_match(obs_spaces[0], obs):
            raise _mismatch("observation", i, obs_spaces)
        if act != action_spaces[0]:
            raise _mismatch("action", i, action_spaces)


def _mismatch(space: str, i: int, all_spaces: list[gym.Space]) -> SpaceMismatchError:
    exc = SpaceMismatchError(
        f"env {i} has {space} space {all_spaces[i]}, but env 0 has {all_spaces[0]}; all envs must match"
    )
    exc.space, exc.spaces = space, all_spaces  # for adapters that word it as their reference does
    return exc


def seconds(timeout: Any) -> float | None:
    """A wait's ``timeout`` as seconds >= 0 (any real number, numpy's too, as AsyncVectorEnv takes), or None."""
    if timeout is None:
        return None
    if not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    return max(float(timeout), 0.0)
