"""Observation spaces of a :class:`~shmvec.ShmVectorEnv` as ``AsyncVectorEnv`` builds and checks them.

``observation_mode`` is ``AsyncVectorEnv``'s: ``"same"`` (every env has env 0's space),
``"different"`` (spaces may differ in their bounds but not in structure, shapes and
dtypes) or a tuple ``(observation_space, single_observation_space)`` to use as given.
The errors are Gymnasium's, word for word.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from gymnasium import Space
from gymnasium.vector.utils import batch_space

from shmvec.errors import SpaceMismatchError
from shmvec.gymnasium_1_1 import batch_differing_spaces, is_space_dtype_shape_equiv


def obs_space_match(observation_mode: Any) -> Callable[[Space, Space], bool]:
    """How the pool compares each env's observation space with env 0's, after AsyncVectorEnv's checks of the mode."""
    if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
        if not isinstance(observation_mode[0], Space) or not isinstance(observation_mode[1], Space):
            raise TypeError(
                "Expected both elements of observation_mode to be Spaces, "
                f"got {type(observation_mode[0])} and {type(observation_mode[1])}"
            )
        return is_space_dtype_shape_equiv
    if observation_mode == "same":
        return operator.eq
    if observation_mode == "different":
        return is_space_dtype_shape_equiv
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch observation "
        f"space, actual got {observation_mode}"
    )


def observation_spaces(
    observation_mode: Any, env0_space: Space, num_envs: int, all_spaces: Callable[[], list[Space]], owner: str
) -> tuple[Space, Space]:
    """``(single_observation_space, observation_space)``; ``all_spaces()`` gives every env's (``"different"``)."""
    if isinstance(observation_mode, tuple):
        batched, single = observation_mode
        if not is_space_dtype_shape_equiv(single, env0_space):  # the pool compared every env with env 0's
            raise space_mismatch("observation", None, observation_mode, owner)
        return single, batched
    if observation_mode == "different":
        return env0_space, batch_differing_spaces(all_spaces())
    return env0_space, batch_space(env0_space, num_envs)


def space_mismatch(
    space: str | None, spaces: list[Space] | None, observation_mode: Any, owner: str
) -> SpaceMismatchError:
    """``AsyncVectorEnv``'s error for envs whose ``space`` spaces (env 0's first) do not match.

    ``owner``: the vector env's class name, as the message names it."""
    if space == "action":
        return SpaceMismatchError(
            f"Some environments have an action space different from `{spaces[0]}`. "
            "In order to batch actions, the action spaces from all environments must be equal."
        )
    if observation_mode == "same":
        return SpaceMismatchError(
            f"{owner}(..., observation_mode='same') however some of the sub-environments "
            "observation spaces are not equivalent. If this is intentional, use `observation_mode='different'` instead."
        )
    return SpaceMismatchError(
        f"{owner}(..., observation_mode='different' or custom space) however the "
        "sub-environment's observation spaces do not share a common shape and dtype."
    )
