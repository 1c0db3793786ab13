"""Checking user actions against an action-leaf buffer before anything reaches a worker."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from shmvec.errors import InvalidActionError


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
