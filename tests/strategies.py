"""Hypothesis strategies for the property tests: random spaces, env designs and pool shapes.

Spaces cover every fixed-size leaf type (Box of every numpy dtype a Box takes, 0-d to
3-d, now and then with a zero-length dimension; Discrete with a start; 1-D and 2-D
MultiBinary and MultiDiscrete) nested in Dict and Tuple (empty ones too), and the leaves
with no fixed size that travel pickled (Text, Sequence, Graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from hypothesis import strategies as st

from shmvec.gymnasium_1_1 import AutoresetMode
from tests.spec_env import EnvDesign, InfoKey

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
BOX_DTYPES = ("float32", *INT_DTYPES, "bool", "float16", "float64")
KEYS = ("a", "b", "c", "pos", "z")
INFO_KINDS = ("int", "float", "bool", "str", "none", "list", "dict", "scalar", "array")
# fork in most examples: a forkserver or spawn pool takes ~1.5 s to start here, a fork one ~30 ms
START_METHODS = ("fork",) * 18 + ("forkserver", "spawn")

dims = st.sampled_from((1, 2, 3, 1, 2, 3, 0))
shapes = st.lists(dims, max_size=3).map(tuple)


@st.composite
def boxes(draw: st.DrawFn) -> spaces.Box:
    """A Box of any dtype and shape, with finite, half-open or infinite bounds for floats."""
    dtype = np.dtype(draw(st.sampled_from(BOX_DTYPES)))
    shape = draw(shapes)
    if dtype.kind == "b":
        return spaces.Box(0, 1, shape, dtype)
    if dtype.kind == "f":
        low, high = draw(st.sampled_from((-2.0, -np.inf, 0.5))), draw(st.sampled_from((3.0, np.inf, 1.0)))
        return spaces.Box(low, high, shape, dtype)
    limits = np.iinfo(dtype)
    if draw(st.booleans()):
        return spaces.Box(limits.min, limits.max, shape, dtype)
    return spaces.Box(max(limits.min, -2), min(limits.max, 5), shape, dtype)


discretes = st.builds(spaces.Discrete, st.integers(1, 5), start=st.integers(-3, 3))
multi_binaries = st.one_of(st.integers(1, 4), st.lists(st.integers(1, 3), min_size=2, max_size=2)).map(
    spaces.MultiBinary
)


@st.composite
def multi_discretes(draw: st.DrawFn) -> spaces.MultiDiscrete:
    """A 1-D or 2-D MultiDiscrete, with or without a start, of a signed integer dtype."""
    shape = draw(st.sampled_from(((3,), (1,), (2, 2), (1, 3))))
    nvec = np.array(draw(st.lists(st.integers(1, 4), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))))
    start = None
    if draw(st.booleans()):
        start = np.array(draw(st.lists(st.integers(-2, 2), min_size=nvec.size, max_size=nvec.size))).reshape(shape)
    dtype = draw(st.sampled_from(("int64", "int32", "int8")))
    return spaces.MultiDiscrete(nvec.reshape(shape), dtype=dtype, start=start)


fixed_leaves = st.one_of(boxes(), discretes, multi_binaries, multi_discretes())

_small_box = st.just(spaces.Box(-1.0, 1.0, (2,), np.float32))
_small_leaves = st.one_of(_small_box, st.builds(spaces.Discrete, st.integers(1, 4)))
pickled_leaves = st.one_of(
    st.builds(spaces.Text, st.integers(1, 5), min_length=st.integers(0, 1)),
    st.builds(spaces.Sequence, _small_leaves, stack=st.booleans()),
    st.builds(spaces.Graph, _small_box, st.one_of(st.none(), _small_leaves)),
)


def nested(
    leaves: st.SearchStrategy[spaces.Space], empty: bool, max_leaves: int = 6
) -> st.SearchStrategy[spaces.Space]:
    """A leaf, or Dict and Tuple spaces nested around such leaves; empty ones too if ``empty``
    (observations only: Gymnasium's ``iterate`` cannot split a batch of empty actions)."""
    least = 0 if empty else 1

    def containers(children: st.SearchStrategy[spaces.Space]) -> st.SearchStrategy[spaces.Space]:
        return st.one_of(
            st.dictionaries(st.sampled_from(KEYS), children, min_size=least, max_size=3).map(spaces.Dict),
            st.lists(children, min_size=least, max_size=3).map(spaces.Tuple),
        )

    return st.recursive(leaves, containers, max_leaves=max_leaves)


def flat(leaves: st.SearchStrategy[spaces.Space]) -> st.SearchStrategy[spaces.Space]:
    """A leaf, or one level of Dict or Tuple around leaves: the observation spaces SB3 takes."""
    return st.one_of(
        leaves,
        st.dictionaries(st.sampled_from(KEYS), leaves, min_size=1, max_size=3).map(spaces.Dict),
        st.lists(leaves, min_size=1, max_size=3).map(spaces.Tuple),
    )


gym_observation_spaces = nested(st.one_of(fixed_leaves, pickled_leaves), empty=True)
gym_action_spaces = nested(st.one_of(fixed_leaves, pickled_leaves), empty=False)
fixed_action_spaces = nested(fixed_leaves, empty=False)
sb3_observation_spaces = flat(fixed_leaves)


@st.composite
def info_keys(draw: st.DrawFn) -> tuple[InfoKey, ...]:
    """Up to four info keys, each with its own kind of value."""
    names = draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=4))
    keys = []
    for name in names:
        kind = draw(st.sampled_from(INFO_KINDS))
        dtype = draw(st.sampled_from((*FLOAT_DTYPES, *INT_DTYPES, "bool")))
        shape = () if kind == "scalar" else draw(shapes)
        keys.append(InfoKey(name, kind, dtype, shape))
    return tuple(keys)


def designs(observation_spaces: st.SearchStrategy, action_spaces: st.SearchStrategy) -> st.SearchStrategy[EnvDesign]:
    """Env designs over the given spaces, with random episode-end rates, infos and special floats."""
    rates = st.sampled_from((0.05, 0.15, 0.3))
    return st.builds(
        EnvDesign,
        observation_spaces,
        action_spaces,
        p_terminated=rates,
        p_truncated=rates,
        p_info=st.sampled_from((0.0, 0.3, 0.8)),
        p_special=st.sampled_from((0.0, 0.2)),
        info_keys=info_keys(),
    )


@dataclass(frozen=True)
class PoolShape:
    """How a pool under test runs its envs."""

    n_envs: int
    n_workers: int
    use_main_process: bool
    copy: bool
    start_method: str
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    batch_size: int | None = None
    spin: bool = True  # False: every wait blocks at once (max_spin=0), another path through the hand-offs

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``ShmVectorEnv``/``ShmPoolVecEnv`` (all but the batch size and mode)."""
        spin = {} if self.spin else {"max_spin": 0}
        return {"copy": self.copy, "start_method": self.start_method, "use_main_process": self.use_main_process, **spin}


@st.composite
def pool_shapes(
    draw: st.DrawFn,
    max_envs: int = 6,
    modes: tuple[AutoresetMode, ...] = tuple(AutoresetMode),
    batches: bool = False,
    start_methods: tuple[str, ...] = START_METHODS,
) -> PoolShape:
    """N envs in K workers (at most 3), the main process stepping a shard or not; with
    ``batches``, N >= 2 and an async batch size below N."""
    n_envs = draw(st.integers(2 if batches else 1, max_envs))
    main_shard = draw(st.booleans())
    n_workers = draw(st.integers(0 if main_shard else 1, min(3, n_envs - 1 if main_shard else n_envs)))
    return PoolShape(
        n_envs=n_envs,
        n_workers=n_workers,
        use_main_process=main_shard,
        copy=draw(st.booleans()),
        start_method=draw(st.sampled_from(start_methods)),
        autoreset_mode=draw(st.sampled_from(modes)),
        batch_size=draw(st.integers(1, n_envs - 1)) if batches else None,
        spin=draw(st.booleans()),
    )


# How a caller may give one leaf's actions: numpy dtypes shmvec takes (a cast that keeps the
# kind, any integer dtype for an integer space, 0/1 of any kind for MultiBinary), or Python
# lists ("list") where their dtype is one.
_FLOAT_FORMS = ("float64", "float16", "int64", "int32", "uint8", "float32", "list")
_INT_FORMS = ("int32", "int16", "uint8", "int8", "int64", "uint16", "uint64", "list")
_BINARY_FORMS = ("bool", "int64", "float32", "float64", "uint8", "int8", "list")


def leaf_forms(space: spaces.Space) -> list[str]:
    """The forms of :data:`_FLOAT_FORMS` and co. that fit ``space``, its own dtype last."""
    if isinstance(space, spaces.MultiBinary):
        return list(_BINARY_FORMS)
    kind = space.dtype.kind
    candidates = ("list", "bool") if kind == "b" else _FLOAT_FORMS if kind == "f" else _INT_FORMS
    python_dtype = {"b": "bool", "f": "float64"}.get(kind, "int64")  # what np.asarray makes of a list
    if not np.prod(space.shape):  # np.asarray makes float64 of an empty list
        candidates = tuple(f for f in candidates if f != "list")
    forms = [f for f in candidates if _takes(space.dtype, np.dtype(python_dtype if f == "list" else f))]
    return sorted(forms, key=lambda f: f == str(space.dtype))  # so that the simplest example casts


def _takes(space_dtype: np.dtype, given: np.dtype) -> bool:
    both_integers = given.kind in "biu" and space_dtype.kind in "iu"
    return both_integers or np.can_cast(given, space_dtype, "same_kind")


@st.composite
def action_forms(draw: st.DrawFn, space: spaces.Space) -> Any:
    """A form per leaf of ``space``, nested as the space is."""
    if isinstance(space, spaces.Dict):
        return {key: draw(action_forms(sub)) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(draw(action_forms(sub)) for sub in space.spaces)
    return draw(st.sampled_from(leaf_forms(space)))
