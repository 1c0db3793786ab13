"""Pure layout: spaces -> shared-memory buffer specs, and shard slices.

Nothing here touches IPC. A space is flattened into *leaves* (one numpy buffer
each, shaped ``[N, *leaf_shape]``); :class:`ArenaLayout` places every buffer of
one pool (observation leaves, action leaves, rewards, flags, control block) at
a cache-line aligned offset inside a single byte arena.

Example:
    >>> from gymnasium import spaces
    >>> [(leaf.path, leaf.shape) for leaf in flatten_space(spaces.Dict(
    ...     {"pos": spaces.Box(0, 1, (3,)), "id": spaces.Discrete(4)}))]
    [(('pos',), (3,)), (('id',), ())]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.errors import UnsupportedSpaceError

ALIGNMENT = 64  # bytes; one cache line, so neighbouring fields never share one

# Columns of the per-worker control block (one int64 row of 8 = 64 bytes per worker).
CTRL_COMMAND = 0  # written by the main process: a protocol.Command
CTRL_STATUS = 1  # written by the worker: a protocol.Status
CTRL_WIDTH = 8

FINAL_OBS = "final_obs"  # optional fields, see ArenaLayout.plan
FINAL_FLAG = "final_flag"


@dataclass(frozen=True)
class Leaf:
    """One array-valued component of a (possibly nested) space."""

    path: tuple[Any, ...]  # keys from the root space to this leaf; () for a flat space
    shape: tuple[int, ...]  # shape for one env
    dtype: np.dtype


@functools.singledispatch
def flatten_space(space: spaces.Space, path: tuple[Any, ...] = ()) -> list[Leaf]:
    """Return the leaves of ``space`` in a fixed order (Dict key order, Tuple index order)."""
    raise UnsupportedSpaceError(
        f"shmvec cannot place a {type(space).__name__} space in shared memory ({space!r}). "
        "Supported: Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of those. "
        "Wrap the env (e.g. gymnasium.wrappers.FlattenObservation) to use a supported space."
    )


@flatten_space.register(spaces.Box)
@flatten_space.register(spaces.Discrete)
@flatten_space.register(spaces.MultiDiscrete)
@flatten_space.register(spaces.MultiBinary)
def _flatten_array_space(space: spaces.Space, path: tuple[Any, ...] = ()) -> list[Leaf]:
    return [Leaf(path, tuple(space.shape), np.dtype(space.dtype))]


@flatten_space.register(spaces.Dict)
def _flatten_dict(space: spaces.Dict, path: tuple[Any, ...] = ()) -> list[Leaf]:
    return [leaf for key, sub in space.spaces.items() for leaf in flatten_space(sub, (*path, key))]


@flatten_space.register(spaces.Tuple)
def _flatten_tuple(space: spaces.Tuple, path: tuple[Any, ...] = ()) -> list[Leaf]:
    return [leaf for i, sub in enumerate(space.spaces) for leaf in flatten_space(sub, (*path, i))]


def get_path(value: Any, path: tuple[Any, ...]) -> Any:
    """Follow ``path`` into a nested dict/tuple value."""
    for key in path:
        value = value[key]
    return value


@functools.singledispatch
def unflatten(space: spaces.Space, leaf_values: dict[tuple, Any], path: tuple[Any, ...] = ()) -> Any:
    """Rebuild the nested value of ``space`` from ``{leaf.path: value}``."""
    return leaf_values[path]


@unflatten.register(spaces.Dict)
def _unflatten_dict(space: spaces.Dict, leaf_values: dict[tuple, Any], path: tuple[Any, ...] = ()) -> Any:
    return {key: unflatten(sub, leaf_values, (*path, key)) for key, sub in space.spaces.items()}


@unflatten.register(spaces.Tuple)
def _unflatten_tuple(space: spaces.Tuple, leaf_values: dict[tuple, Any], path: tuple[Any, ...] = ()) -> Any:
    return tuple(unflatten(sub, leaf_values, (*path, i)) for i, sub in enumerate(space.spaces))


def shard_bounds(n_envs: int, n_workers: int) -> list[tuple[int, int]]:
    """Split ``range(n_envs)`` into ``n_workers`` contiguous shards whose sizes differ by at most one."""
    if not 1 <= n_workers <= n_envs:
        raise ValueError(f"n_workers must be between 1 and the number of envs ({n_envs}), got {n_workers}")
    base, extra = divmod(n_envs, n_workers)
    bounds, start = [], 0
    for k in range(n_workers):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class FieldSpec:
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape)) * self.dtype.itemsize


@dataclass(frozen=True)
class ArenaLayout:
    """Where every buffer of a pool lives in its arena. Picklable; sent to workers once."""

    fields: dict[str, FieldSpec]
    obs_leaves: tuple[Leaf, ...]
    action_leaves: tuple[Leaf, ...]
    nbytes: int

    @classmethod
    def plan(
        cls,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_envs: int,
        n_workers: int,
        final_obs: bool = False,
    ) -> ArenaLayout:
        """Place every buffer. ``final_obs`` adds a row per env for the last observation of
        an episode (same-step auto-reset, flat observations only), so that an episode end
        needs no pickling: ``FINAL_OBS`` holds it and ``FINAL_FLAG[i]`` says it is there."""
        obs_leaves = tuple(flatten_space(observation_space))
        action_leaves = tuple(flatten_space(action_space))
        wanted: list[tuple[str, tuple[int, ...], np.dtype]] = [
            ("ctrl", (n_workers, CTRL_WIDTH), np.dtype(np.int64)),
            ("reward", (n_envs,), np.dtype(np.float64)),
            ("terminated", (n_envs,), np.dtype(np.bool_)),
            ("truncated", (n_envs,), np.dtype(np.bool_)),
        ]
        wanted += [(obs_field(leaf.path), (n_envs, *leaf.shape), leaf.dtype) for leaf in obs_leaves]
        wanted += [(action_field(leaf.path), (n_envs, *leaf.shape), leaf.dtype) for leaf in action_leaves]
        if final_obs and len(obs_leaves) == 1 and obs_leaves[0].path == () and obs_leaves[0].shape:
            wanted += [
                (FINAL_OBS, (n_envs, *obs_leaves[0].shape), obs_leaves[0].dtype),
                (FINAL_FLAG, (n_envs,), np.dtype(np.bool_)),
            ]
        fields, offset = {}, 0
        for name, shape, dtype in wanted:
            spec = FieldSpec(offset, shape, dtype)
            fields[name] = spec
            offset += -(-max(spec.nbytes, 1) // ALIGNMENT) * ALIGNMENT
        return cls(fields, obs_leaves, action_leaves, max(offset, ALIGNMENT))

    def views(self, buffer: Any) -> dict[str, np.ndarray]:
        """Numpy views of every field over ``buffer`` (a memoryview/mmap of at least ``nbytes``)."""
        return {
            name: np.ndarray(spec.shape, dtype=spec.dtype, buffer=buffer, offset=spec.offset)
            for name, spec in self.fields.items()
        }


def obs_field(path: tuple[Any, ...]) -> str:
    return f"obs{path!r}"  # repr keeps keys such as "a/b" or 1 vs "1" apart


def action_field(path: tuple[Any, ...]) -> str:
    return f"action{path!r}"
