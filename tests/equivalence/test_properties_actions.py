"""Property: actions given in other dtypes than the space's reach each env as the references hand them over.

``SyncVectorEnv`` and ``DummyVecEnv`` pass each env its part of the caller's actions as
given: a ``float64`` row on a ``float32`` Box stays ``float64``, a Python list stays a
list. Each env here records what it received (:class:`spec_env.SpecEnv`); the test
compares that, leaf by leaf as the env computes with it (dtype and bytes, see
:func:`spec_env.canonical_action`), and then every result, bit for bit.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st

from shmvec.gymnasium_1_1 import AutoresetMode
from tests.adapters.test_sb3_dropin import start_both
from tests.equivalence.test_properties import STEPS, assert_same_received, closing_all, gym_pair, sb3_pair, seeds
from tests.helpers import assert_same
from tests.sb3_compare import check_step
from tests.spec_env import EnvDesign, random_array
from tests.strategies import PoolShape, action_forms, designs, fixed_action_spaces, pool_shapes

SMALL_OBSERVATION = spaces.Box(-1.0, 1.0, (2,), np.float32)


def leaf_column(space: spaces.Space, form: str, rng: np.random.Generator, n_envs: int) -> Any:
    """``n_envs`` actions of one leaf, in ``form``: a numpy dtype's name, or ``"list"`` for Python values."""
    shape = (n_envs, *space.shape)
    if isinstance(space, spaces.MultiBinary) or space.dtype.kind == "b":
        values = rng.integers(0, 2, shape)
        python = values.astype(bool) if space.dtype.kind == "b" else values
    elif space.dtype.kind == "f":
        values = python = rng.normal(0, 2, shape)  # float64: most values are no float32
    else:
        values = python = random_array(np.dtype(space.dtype), shape, rng).astype(np.int64)
    return python.tolist() if form == "list" else values.astype(form)


def gym_actions(space: spaces.Space, forms: Any, rng: np.random.Generator, n_envs: int) -> Any:
    """A batch as ``SyncVectorEnv`` takes it: nested as the space, a column per leaf."""
    if isinstance(space, spaces.Dict):
        return {key: gym_actions(sub, forms[key], rng, n_envs) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(gym_actions(sub, form, rng, n_envs) for sub, form in zip(space.spaces, forms))
    return leaf_column(space, forms, rng, n_envs)


def sb3_actions(space: spaces.Space, forms: Any, rng: np.random.Generator, n_envs: int) -> Any:
    """A batch as ``DummyVecEnv`` takes it: one column for a flat space, else a list of per-env actions."""
    columns = gym_actions(space, forms, rng, n_envs)
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        return columns
    return [_one_env(columns, space, i) for i in range(n_envs)]


def _one_env(columns: Any, space: spaces.Space, i: int) -> Any:
    if isinstance(space, spaces.Dict):
        return {key: _one_env(columns[key], sub, i) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_one_env(column, sub, i) for column, sub in zip(columns, space.spaces))
    return columns[i]


def run_gym(design, shape, forms, seed: int) -> None:
    with closing_all() as closing:
        shm, ref = gym_pair(design, shape, closing)
        assert_same(shm.reset(seed=seed), ref.reset(seed=seed), "reset")
        results = []
        for t in range(STEPS):
            actions = gym_actions(design.action_space, forms, np.random.default_rng([seed, t]), shape.n_envs)
            results.append(copy.deepcopy((shm.step(copy.deepcopy(actions)), ref.step(actions))))  # copy=False: views
        assert_same_received(shm.get_attr("received"), ref.get_attr("received"), design.action_space)
        for t, (got, want) in enumerate(results):
            assert_same(got, want, f"step {t}")


def run_sb3(design, shape, forms, seed: int) -> None:
    with closing_all() as closing:
        shm, dummy = sb3_pair(design, shape, closing)
        start_both(shm, dummy, seed)
        results = []
        for t in range(STEPS):
            actions = sb3_actions(design.action_space, forms, np.random.default_rng([seed, t]), shape.n_envs)
            results.append(copy.deepcopy((shm.step(copy.deepcopy(actions)), dummy.step(actions))))  # copy=False: views
        assert_same_received(shm.get_attr("received"), dummy.get_attr("received"), design.action_space)
        for t, (got, want) in enumerate(results):
            check_step(got, want, t)


@st.composite
def spaces_and_forms(draw: st.DrawFn) -> tuple[Any, Any]:
    design = draw(designs(st.just(SMALL_OBSERVATION), fixed_action_spaces))
    return design, draw(action_forms(design.action_space))


@pytest.mark.parametrize("adapter", ["gym", "sb3"])
@given(
    design_forms=spaces_and_forms(),
    shape=pool_shapes(max_envs=4, modes=(AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP), start_methods=("fork",)),
    seed=seeds,
)
def test_actions_in_other_dtypes_reach_the_envs_as_given(adapter, design_forms, shape, seed):
    design, forms = design_forms
    (run_gym if adapter == "gym" else run_sb3)(design, shape, forms, seed)


@pytest.mark.parametrize("adapter", ["gym", "sb3"])
def test_python_ints_on_an_unsigned_box_reach_the_envs(adapter):
    """The references hand a uint8 Box env the Python ints it was given, even out of its range."""
    design = EnvDesign(SMALL_OBSERVATION, spaces.Box(0, 255, (2,), np.uint8))
    shape = PoolShape(n_envs=2, n_workers=1, use_main_process=False, copy=True, start_method="fork")
    actions = [[1, 2], [3, 300]]
    with closing_all() as closing:
        if adapter == "gym":
            shm, ref = gym_pair(design, shape, closing)
            shm.reset(seed=0)
            ref.reset(seed=0)
            assert_same(shm.step(actions), ref.step(actions))
        else:
            shm, ref = sb3_pair(design, shape, closing)
            start_both(shm, ref, 0)
            check_step(shm.step(actions), ref.step(actions), 0)
        received = shm.get_attr("received")
        assert_same_received(received, ref.get_attr("received"), design.action_space)
        assert received[1][-1] == [3, 300]
