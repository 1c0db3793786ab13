"""Checks of user input that run before anything reaches a worker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec.errors import InvalidActionError, SpaceMismatchError


def checked_column(values: object, view: np.ndarray, leaf_space: spaces.Space, context: str) -> np.ndarray:
    """``values`` as an array that ``view[...] = values`` converts without surprises.

    The shape must equal the buffer's ``[num_envs, *leaf_shape]``, and the dtype must keep
    its kind when converted (no float -> int truncation), except for MultiBinary spaces:
    SB3's PPO/A2C sample their actions as floats, and 0./1. are valid there.

    Args:
        values: the user's actions for this leaf.
        view: the shared action buffer of this leaf.
        leaf_space: the single-env space of this leaf.
        context: how to name the actions in error messages (e.g. "actions at ('a',)").
    """
    column = np.asarray(values)
    if column.shape != view.shape:
        raise InvalidActionError(
            f"expected {context} of shape {view.shape} (num_envs={view.shape[0]}, action space "
            f"{leaf_space}), got shape {column.shape}"
        )
    if np.can_cast(column.dtype, view.dtype, casting="same_kind"):
        return column
    if isinstance(leaf_space, spaces.MultiBinary) and column.dtype.kind in "biuf" and np.isin(column, (0, 1)).all():
        return column
    raise InvalidActionError(
        f"{context} of dtype {column.dtype} cannot be converted to the action space's dtype "
        f"{view.dtype} without changing their kind; pass {view.dtype} actions"
    )


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


def check_same_spaces(spaces: list[tuple[gym.Space, gym.Space]]) -> None:
    obs0, act0 = spaces[0]
    for i, (obs, act) in enumerate(spaces):
        if obs != obs0:
            raise SpaceMismatchError(f"env {i} has observation space {obs}, but env 0 has {obs0}; all envs must match")
        if act != act0:
            raise SpaceMismatchError(f"env {i} has action space {act}, but env 0 has {act0}; all envs must match")
