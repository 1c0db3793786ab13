"""Pure layout: spaces -> shared-memory buffer specs, and shard slices.

Nothing here touches IPC. A space is flattened into *leaves*. A fixed-size leaf
(Box, Discrete, MultiDiscrete, MultiBinary) gets one numpy buffer shaped
``[N, *leaf_shape]``; any other space (Graph, Sequence, Text, OneOf, a user-defined
Space subclass) is a *pickled* leaf: it has no buffer and its values travel pickled
through the worker's pipe. :class:`ArenaLayout` places every buffer of one pool
(fixed-size observation and action leaves, rewards, flags, control block) at a
cache-line aligned offset inside a single byte arena.

Example:
    >>> from gymnasium import spaces
    >>> # spaces.Dict sorts its keys; the leaves come in that order
    >>> [(leaf.path, leaf.shape, leaf.pickled) for leaf in flatten_space(spaces.Dict(
    ...     {"pos": spaces.Box(0, 1, (3,)), "id": spaces.Discrete(4), "name": spaces.Text(8)}))]
    [(('id',), (), False), (('name',), None, True), (('pos',), (3,), False)]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from shmvec.errors import UnsupportedSpaceError
from shmvec.ipc.info_rows import INFO_CODE, INFO_ROW_BYTES, INFO_ROWS, INFO_SCHEMAS, SCHEMA_BLOCK_BYTES
from shmvec.ipc.timing_rows import timing_fields

ALIGNMENT = 64  # bytes; one cache line, so neighbouring fields never share one

# Columns of the per-worker control block (one int64 row of 8 = 64 bytes per worker).
# The main process posts a command as ONE word (one store, read whole: a worker reading
# two cells could pair a new seq with an old command), see protocol.post_word.
CTRL_POST = 0  # written by the main process: protocol.post_word(seq, sent, command)
CTRL_STATUS = 1  # written by the worker: a protocol.Status
# Async sends: how many envs the worker has put in its outbox, and the main process has taken from
# it. A hint of which outboxes have news, read plainly; the envs are taken through posts.
CTRL_PUBLISHED, CTRL_TAKEN = 2, 3
CTRL_OBS_BUFFER = 4  # double-buffered observations: which buffer the posted command writes
CTRL_NEXT_WAIT = 5  # written by the main process with each STEP: a protocol.NextWait
CTRL_WIDTH = 8

# Async batches: per-env fields. Worker k uses rows [s_k, e_k) of INBOX and OUTBOX as
# rings of env ids (it never has more than e_k - s_k envs in flight).
INBOX, OUTBOX = "inbox", "outbox"
READY_NS = "ready_ns"  # when the env's result was written (CLOCK_MONOTONIC, ns): FIFO across workers
ENV_STATUS = "env_status"  # a protocol.Status per env: whether its info or error follows on the pipe

# Actions: a row per env and leaf wide enough for any real dtype a caller may give (numpy's
# long double the widest), and the code of the dtype each row holds, plus one per leaf for
# all rows at once (shmvec.ipc.action_rows).
ACTION_ITEMSIZE = max(8, np.dtype(np.longdouble).itemsize)
ACTION_CODE = "action_code"

FINAL_OBS = "final_obs"  # optional fields, see ArenaLayout.plan
FINAL_FLAG = "final_flag"


@dataclass(frozen=True)
class Leaf:
    """One component of a (possibly nested) space: array-valued, or pickled (``shape is None``)."""

    path: tuple[Any, ...]  # keys from the root space to this leaf; () for a flat space
    shape: tuple[int, ...] | None  # shape for one env; None: no fixed size, travels pickled
    dtype: np.dtype | None

    @property
    def pickled(self) -> bool:
        """Whether this leaf's values travel pickled through the pipe instead of shared memory."""
        return self.shape is None


@functools.singledispatch
def flatten_space(space: Any, path: tuple[Any, ...] = ()) -> list[Leaf]:
    """Return the leaves of ``space`` in a fixed order (Dict key order, Tuple index order)."""
    raise UnsupportedSpaceError(
        f"expected a gymnasium.spaces.Space, got a {type(space).__name__} ({space!r}) at {path or 'the root'}; "
        "envs must declare their observation_space and action_space as gymnasium spaces"
    )


@flatten_space.register(spaces.Space)
def _flatten_pickled_space(space: spaces.Space, path: tuple[Any, ...] = ()) -> list[Leaf]:
    # Graph, Sequence, Text, OneOf, user-defined spaces: no fixed size to lay out.
    return [Leaf(path, None, None)]


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


def require_fixed_size(space: spaces.Space, what: str, who: str) -> None:
    """Raise :class:`UnsupportedSpaceError` if ``space`` has a leaf with no fixed size.

    For adapters whose library takes only array spaces (``who`` names the adapter,
    ``what`` the space, e.g. "observation").
    """
    for leaf in flatten_space(space):
        if leaf.pickled:
            where = f" at {leaf.path}" if leaf.path else ""
            raise UnsupportedSpaceError(
                f"{who} takes only fixed-size {what} spaces (Box, Discrete, MultiDiscrete, MultiBinary, "
                f"and Dict/Tuple of those), got {get_path(space, leaf.path)}{where} in {space}; "
                "use shmvec.ShmVectorEnv for Graph, Sequence, Text, OneOf and custom spaces"
            )


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
    obs_leaves: tuple[Leaf, ...]  # fixed-size leaves only: each has a buffer
    action_leaves: tuple[Leaf, ...]
    nbytes: int
    pickled_obs_leaves: tuple[Leaf, ...] = ()  # no buffer: they travel through the pipe
    pickled_action_leaves: tuple[Leaf, ...] = ()
    obs_buffers: int = 1  # 2: the observation leaves have two buffers, written in turn

    @classmethod
    def plan(
        cls,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_envs: int,
        n_workers: int,
        final_obs: bool = False,
        obs_buffers: int = 1,
        timings: bool = True,
    ) -> ArenaLayout:
        """Place every buffer. ``final_obs`` adds a row per env for the last observation of
        an episode (same-step auto-reset, flat observations only), so that an episode end
        needs no pickling: ``FINAL_OBS`` holds it and ``FINAL_FLAG[i]`` says it is there (the
        main process clears the flag once it took the row).
        ``obs_buffers=2`` gives every observation leaf a second buffer, so that a step can
        write one while the caller still reads the other (see :meth:`obs_views`). An action
        leaf gets byte rows that :class:`~shmvec.ipc.action_rows.ActionRows` sees in the dtype
        each caller gave. Pickled leaves get no buffer. ``timings=False`` leaves out the
        lanes' timing rows (:mod:`~shmvec.ipc.timing_rows`)."""
        obs_leaves, pickled_obs_leaves = _split_pickled(flatten_space(observation_space))
        action_leaves, pickled_action_leaves = _split_pickled(flatten_space(action_space))
        wanted: list[tuple[str, tuple[int, ...], np.dtype]] = [
            ("ctrl", (n_workers, CTRL_WIDTH), np.dtype(np.int64)),
            ("reward", (n_envs,), np.dtype(np.float64)),
            ("terminated", (n_envs,), np.dtype(np.bool_)),
            ("truncated", (n_envs,), np.dtype(np.bool_)),
            (INBOX, (n_envs,), np.dtype(np.int64)),
            (OUTBOX, (n_envs,), np.dtype(np.int64)),
            (READY_NS, (n_envs,), np.dtype(np.int64)),
            (ENV_STATUS, (n_envs,), np.dtype(np.int8)),
            (INFO_ROWS, (n_envs, INFO_ROW_BYTES), np.dtype(np.uint8)),  # see shmvec.ipc.info_rows
            (INFO_CODE, (n_envs,), np.dtype(np.uint8)),
            (INFO_SCHEMAS, (n_workers + 1, SCHEMA_BLOCK_BYTES), np.dtype(np.uint8)),  # the last: a main shard's
            *(timing_fields(n_envs, n_workers) if timings else ()),  # when each lane's steps ran: see ipc.timing_rows
        ]
        wanted += [
            (obs_field(leaf.path, b), (n_envs, *leaf.shape), leaf.dtype)
            for b in range(obs_buffers)
            for leaf in obs_leaves
        ]
        wanted += [
            (action_field(leaf.path), (n_envs, math.prod(leaf.shape) * ACTION_ITEMSIZE), np.dtype(np.uint8))
            for leaf in action_leaves
        ]
        wanted.append((ACTION_CODE, (len(action_leaves), n_envs + 1), np.dtype(np.int8)))
        if final_obs and len(obs_leaves) == 1 and obs_leaves[0].path == () and obs_leaves[0].shape:
            wanted += [
                (FINAL_OBS, (n_envs, *obs_leaves[0].shape), obs_leaves[0].dtype),
                (FINAL_FLAG, (n_envs,), np.dtype(np.bool_)),
            ]
        # placed first, side by side: what a step hands over, so that a GPU copies it in one span
        handed = [obs_field(leaf.path) for leaf in obs_leaves] + ["reward", "terminated", "truncated"]
        offsets, offset = {}, 0
        for name, shape, dtype in sorted(wanted, key=lambda want: want[0] not in handed):
            offsets[name] = offset
            offset += -(-max(FieldSpec(0, shape, dtype).nbytes, 1) // ALIGNMENT) * ALIGNMENT
        fields = {name: FieldSpec(offsets[name], shape, dtype) for name, shape, dtype in wanted}
        return cls(
            fields,
            obs_leaves,
            action_leaves,
            max(offset, ALIGNMENT),
            pickled_obs_leaves,
            pickled_action_leaves,
            obs_buffers,
        )

    def views(self, buffer: Any) -> dict[str, np.ndarray]:
        """Numpy views of every field over ``buffer`` (a memoryview/mmap of at least ``nbytes``)."""
        return {
            name: np.ndarray(spec.shape, dtype=spec.dtype, buffer=buffer, offset=spec.offset)
            for name, spec in self.fields.items()
        }

    def obs_views(self, views: dict[str, np.ndarray], buffer: int = 0) -> dict[tuple[Any, ...], np.ndarray]:
        """``{leaf path: view}`` of the fixed-size observation leaves in buffer ``buffer`` of ``views``."""
        return {leaf.path: views[obs_field(leaf.path, buffer)] for leaf in self.obs_leaves}


def _split_pickled(leaves: list[Leaf]) -> tuple[tuple[Leaf, ...], tuple[Leaf, ...]]:
    """(fixed-size leaves, pickled leaves), each in flattening order."""
    return tuple(leaf for leaf in leaves if not leaf.pickled), tuple(leaf for leaf in leaves if leaf.pickled)


def obs_field(path: tuple[Any, ...], buffer: int = 0) -> str:
    # repr keeps keys such as "a/b" or 1 vs "1" apart
    return f"obs{path!r}" if buffer == 0 else f"obs{path!r}@{buffer}"


def action_field(path: tuple[Any, ...]) -> str:
    return f"action{path!r}"
