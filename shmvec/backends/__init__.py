"""The one place the adapters get their engine from: a local pool or a pool over Ray nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from shmvec.engine.interface import Engine
from shmvec.engine.pool import ShmPool
from shmvec.options import PoolOptions


def make_pool(
    env_fns: Sequence[Callable[[], gym.Env]], options: PoolOptions | None = None, **engine_kwargs: Any
) -> Engine:
    """The engine ``options.backend`` names: :class:`~shmvec.engine.pool.ShmPool` (``"local"``) or
    :class:`~shmvec.backends.ray.RayPool` (``"ray"``, imported only then): both meet
    :class:`~shmvec.engine.interface.Engine`.

    ``engine_kwargs`` (autoreset_mode, env_wrapper, obs_space_match, obs_buffers, batch_size) go to the
    engine as given.
    """
    options = options or PoolOptions()
    if options.backend == "ray":
        from shmvec.backends.ray import RayPool  # Ray is an optional extra: import it only when asked

        return RayPool(env_fns, options, **engine_kwargs)
    return ShmPool(env_fns, options, **engine_kwargs)
