"""What shmvec takes from Gymnasium 1.1's API, on the older releases that SB3 accepts (0.29.1, 1.0).

The SB3 side (``ShmPoolVecEnv``, ``ShmAgentVecEnv``, ``envs.timings``) runs on Gymnasium 0.29.1
and later: the engine only needs the autoreset modes as names, which this module defines where
Gymnasium lacks them (the same members and values as 1.1's). The Gymnasium side (``ShmVectorEnv``,
``ShmAgentVectorEnv``, ``make_vec``, ``register``) is 1.1's ``VectorEnv`` contract and nothing
else: on an older release it refuses at construction (:func:`require_vector_api`), naming the
version it needs, instead of failing later or behaving as neither release does.
"""

from __future__ import annotations

import enum

import gymnasium as gym

from shmvec.errors import GymnasiumVersionError

# The first release whose VectorEnv has the autoreset modes (and metadata["autoreset_mode"]).
VECTOR_API = "1.1.0"

try:
    from gymnasium.vector import AutoresetMode
except ImportError:  # Gymnasium < 1.1: SB3's autoreset (the engine's SAME_STEP) needs only the names

    class AutoresetMode(enum.Enum):  # type: ignore[no-redef]
        """Gymnasium 1.1's ``gymnasium.vector.AutoresetMode``: the same members and values."""

        NEXT_STEP = "NextStep"
        SAME_STEP = "SameStep"
        DISABLED = "Disabled"


HAS_VECTOR_API = AutoresetMode is getattr(gym.vector, "AutoresetMode", None)


def require_vector_api(name: str) -> None:
    """Raise :class:`~shmvec.errors.GymnasiumVersionError` unless Gymnasium has the 1.1 ``VectorEnv`` API."""
    if not HAS_VECTOR_API:
        raise GymnasiumVersionError(
            f"{name} needs Gymnasium {VECTOR_API} or later (the VectorEnv API with autoreset modes); "
            f"this is Gymnasium {gym.__version__}, on which shmvec's SB3 VecEnvs work (ShmPoolVecEnv, "
            f"ShmAgentVecEnv); for {name}, pip install 'gymnasium>={VECTOR_API}'"
        )


if HAS_VECTOR_API:
    from gymnasium.spaces.utils import is_space_dtype_shape_equiv
    from gymnasium.vector.utils import batch_differing_spaces
else:  # Gymnasium < 1.1: only the Gymnasium side calls these, and it refuses these releases first

    def batch_differing_spaces(spaces):
        require_vector_api("batch_differing_spaces")

    def is_space_dtype_shape_equiv(space_1, space_2):
        require_vector_api("is_space_dtype_shape_equiv")


__all__ = [
    "VECTOR_API",
    "HAS_VECTOR_API",
    "AutoresetMode",
    "batch_differing_spaces",
    "is_space_dtype_shape_equiv",
    "require_vector_api",
]
