"""Gymnasium's reset arguments, checked as ``AsyncVectorEnv`` checks them: seeds and ``reset_mask``."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def seeds(seed: Any, num_envs: int) -> list[int | None]:
    """One seed (or None) per env: ``None``, an int ``s`` (env ``i`` gets ``s + i``) or one per env."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(num_envs)]
    seeds = [int(s) if isinstance(s, numbers.Integral) else s for s in seed]
    if len(seeds) != num_envs:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} but got length={len(seeds)}."
        )
    return seeds


def checked_mask(reset_mask: Any, num_envs: int) -> np.ndarray:
    """Gymnasium's validation of ``options["reset_mask"]``, with its exact errors."""
    if not isinstance(reset_mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
    if reset_mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {reset_mask.shape}")
    if reset_mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}")
    if not np.any(reset_mask):
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            f"got reset_mask={reset_mask}"
        )
    return reset_mask
