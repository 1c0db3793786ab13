"""Property-based equivalence: random spaces, envs and pool shapes give the references' results bit for bit.

Hypothesis draws nested observation and action spaces (:mod:`strategies`), an env that
samples from them and ends episodes and fills infos at random (:mod:`spec_env`), and a
pool shape; then compares ``ShmVectorEnv`` with ``SyncVectorEnv``, ``ShmPoolVecEnv``
with ``DummyVecEnv``, and async ``send``/``recv`` batches with each env stepped alone,
including the actions each env received. The profile in ``conftest.py`` sets how many
examples run (``SHMVEC_HYPOTHESIS_PROFILE=long`` for many more).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array
from hypothesis import event, given
from hypothesis import strategies as st
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.gymnasium_1_1 import AutoresetMode
from tests.adapters.test_sb3_dropin import per_env_actions, start_both
from tests.adapters.test_vector import run_equivalence
from tests.helpers import assert_same
from tests.sb3_compare import check_step, sample_actions
from tests.spec_env import EnvDesign, SpecEnv, canonical_action
from tests.strategies import (
    PoolShape,
    designs,
    fixed_action_spaces,
    gym_action_spaces,
    gym_observation_spaces,
    pool_shapes,
    sb3_observation_spaces,
)

STEPS = 30
seeds = st.integers(0, 2**16)


@contextlib.contextmanager
def closing_all() -> Iterator[Callable[[Any], Any]]:
    """Register vector envs to close when the block ends, failing or not (one example's pools)."""
    with contextlib.ExitStack() as stack:

        def register(env: Any) -> Any:
            stack.callback(env.close)
            return env

        yield register


def env_fns(design: EnvDesign, n_envs: int) -> list[Callable[[], SpecEnv]]:
    return [functools.partial(SpecEnv, design)] * n_envs


def gym_pair(design: EnvDesign, shape: PoolShape, closing) -> tuple[ShmVectorEnv, SyncVectorEnv]:
    fns = env_fns(design, shape.n_envs)
    shm = closing(ShmVectorEnv(fns, shape.n_workers, autoreset_mode=shape.autoreset_mode, **shape.kwargs()))
    ref = closing(SyncVectorEnv(fns, copy=shape.copy, autoreset_mode=shape.autoreset_mode))
    return shm, ref


def sb3_pair(design: EnvDesign, shape: PoolShape, closing) -> tuple[ShmPoolVecEnv, DummyVecEnv]:
    fns = env_fns(design, shape.n_envs)
    return closing(ShmPoolVecEnv(fns, shape.n_workers, **shape.kwargs())), closing(DummyVecEnv(fns))


def assert_same_received(got: Sequence[list], want: Sequence[list], space: spaces.Space) -> None:
    """Env ``i`` received ``got[i]``, the reference's env ``i`` received ``want[i]``: same dtypes and values."""
    for i, (got_i, want_i) in enumerate(zip(got, want, strict=True)):
        assert len(got_i) == len(want_i), f"env {i}: {len(got_i)} actions received, the reference {len(want_i)}"
        for t, (g, w) in enumerate(zip(got_i, want_i)):
            assert_same(canonical_action(g, space), canonical_action(w, space), f"env {i}, its action {t}")


def note_ends(count: int) -> None:
    """Tell the statistics (``--hypothesis-show-statistics``) whether the example crossed episode ends."""
    event("episode ends", "some" if count else "none")


# ---- ShmVectorEnv == SyncVectorEnv ------------------------------------------------------------


@pytest.mark.vector_api
@given(design=designs(gym_observation_spaces, gym_action_spaces), shape=pool_shapes(), seed=seeds)
def test_shm_vector_env_matches_sync_vector_env(design, shape, seed):
    with closing_all() as closing:
        shm, ref = gym_pair(design, shape, closing)
        counts = run_equivalence(shm, ref, STEPS, seed)
        assert_same_received(shm.get_attr("received"), ref.get_attr("received"), ref.single_action_space)
    note_ends(counts["terminated"] + counts["truncated"])


# ---- ShmPoolVecEnv == DummyVecEnv -------------------------------------------------------------


def sb3_actions(space: spaces.Space, n_envs: int, step: int) -> Any:
    """Actions as SB3 code gives them: one array for a flat space, a list of per-env
    actions (dicts with keys reordered, tuples as lists on odd steps) for Dict and Tuple."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return per_env_actions(space, n_envs, step)
    return sample_actions(space, n_envs)


def run_sb3(shm: ShmPoolVecEnv, dummy: DummyVecEnv, steps: int, seed: int) -> int:
    """Seed, reset and step both with the same actions, one mid-run reset; compare every
    result and that a returned observation does not change under the next step. Returns
    the number of episode ends."""
    start_both(shm, dummy, seed)
    kept = kept_copy = None
    ends = 0
    for step in range(steps):
        if step == steps // 2:
            assert shm.seed(seed + 1) == dummy.seed(seed + 1)
            kept = shm.reset()
            kept_copy = copy.deepcopy(kept)  # the call before the next step, as below
            assert_same(kept, dummy.reset(), f"step {step} reset obs")
            assert_same(shm.reset_infos, dummy.reset_infos, f"step {step} reset_infos")
        actions = sb3_actions(dummy.action_space, dummy.num_envs, step)
        if step % 3 == 0:
            shm.step_async(copy.deepcopy(actions))
            got = shm.step_wait()
        else:
            got = shm.step(copy.deepcopy(actions))
        want = dummy.step(actions)
        check_step(got, want, step)
        assert_same(shm.reset_infos, dummy.reset_infos, f"step {step} reset_infos")
        if kept is not None:
            assert_same(kept, kept_copy, f"step {step}: the previous step's observation changed")
        kept, kept_copy = got[0], copy.deepcopy(got[0])
        ends += int(want[2].sum())
    return ends


@given(
    design=designs(sb3_observation_spaces, fixed_action_spaces),
    shape=pool_shapes(modes=(AutoresetMode.SAME_STEP,)),
    seed=seeds,
)
def test_shm_pool_vec_env_matches_dummy_vec_env(design, shape, seed):
    with closing_all() as closing:
        shm, dummy = sb3_pair(design, shape, closing)
        note_ends(run_sb3(shm, dummy, STEPS, seed))
        assert_same_received(shm.get_attr("received"), dummy.get_attr("received"), dummy.action_space)


# ---- async batches == each env stepped alone ----------------------------------------------------


class AloneEnvs:
    """One single-env ``SyncVectorEnv`` per env, driven as the async batches drive that env,
    holding the result each env's next ``recv`` row must equal."""

    def __init__(self, fns: list[Callable[[], SpecEnv]], mode: AutoresetMode, seed: int, closing):
        self.envs = [closing(SyncVectorEnv([fn], autoreset_mode=mode)) for fn in fns]
        self.space = self.envs[0].single_action_space
        self.seed = seed
        self.steps = [0] * len(fns)
        self.ends = 0
        self.expected: dict[int, tuple] = {}

    def reset(self, i: int, seed: int | None = None, mask: bool = False) -> None:
        env = self.envs[i]
        obs, infos = env.reset(seed=seed, options={"reset_mask": np.array([True])} if mask else None)
        self.expected[i] = ("reset", obs_row(obs, env.single_observation_space, 0), row_info(infos, 0))

    def next_action(self, i: int) -> Any:
        """Env ``i``'s action for its next step: the same whatever the batches."""
        self.space.seed(self.seed * 7919 + i * 1009 + self.steps[i])
        return self.space.sample()

    def step(self, i: int, action: Any) -> None:
        env = self.envs[i]
        obs, reward, terminated, truncated, infos = env.step(
            concatenate(self.space, [action], create_empty_array(self.space, 1))
        )
        row = obs_row(obs, env.single_observation_space, 0)
        self.expected[i] = ("step", row, reward[0], terminated[0], truncated[0], row_info(infos, 0))
        self.steps[i] += 1
        self.ends += int(terminated[0] or truncated[0])


def obs_row(obs: Any, space: spaces.Space, n: int) -> Any:
    """Row ``n`` of a batch of observations (Gymnasium's ``iterate`` cannot split empty Dicts and Tuples)."""
    if isinstance(space, spaces.Dict):
        return {key: obs_row(obs[key], sub, n) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(obs_row(part, sub, n) for part, sub in zip(obs, space.spaces, strict=True))
    return obs[n]  # an array's row, or one env's value in the tuple of a leaf with no fixed size


def row_info(infos: dict[str, Any], n: int) -> dict[str, Any]:
    """Row ``n``'s own info from a batch's infos (the entries its ``_key`` masks mark), keys sorted:
    the order of a batch's keys depends on which env reported them first."""
    row = {}
    for key, value in infos.items():
        mask = infos.get(f"_{key}")
        if mask is not None and mask[n]:
            row[key] = row_info(value, n) if isinstance(value, dict) else value[n]
    return dict(sorted(row.items()))


def run_async(shm: ShmVectorEnv, alone: AloneEnvs, rounds: int) -> None:
    """Drive ``shm`` with ``rounds`` async batches, then drain it; every row must equal its env's result alone."""
    in_flight = set(range(shm.num_envs))
    shm.async_reset(seed=alone.seed)
    for i in range(shm.num_envs):
        alone.reset(i, seed=alone.seed + i)
    for round_ in itertools.count():
        if not in_flight:
            return
        ids, ended = recv_and_compare(shm, alone)
        in_flight.difference_update(ids.tolist())
        if round_ >= rounds:  # draining: dispatch only what completes the batches still in flight
            keep = -len(in_flight) % shm.batch_size
            ids, ended = ids[:keep], ended[:keep]
        dispatch(shm, alone, ids, ended)
        in_flight.update(ids.tolist())


def recv_and_compare(shm: ShmVectorEnv, alone: AloneEnvs) -> tuple[np.ndarray, np.ndarray]:
    """One ``recv``, each row compared with its env's result alone; the batch's env ids and episode ends."""
    obs, rewards, terminated, truncated, infos = shm.recv(timeout=60)
    ids = infos["env_id"]
    for n, i in enumerate(ids.tolist()):
        want = alone.expected.pop(i)
        row, info = obs_row(obs, shm.single_observation_space, n), row_info(infos, n)
        got = (
            ("reset", row, info) if want[0] == "reset" else ("step", row, rewards[n], terminated[n], truncated[n], info)
        )
        assert_same(got, want, f"env {i} after {alone.steps[i]} steps")
    return ids, terminated | truncated


def dispatch(shm: ShmVectorEnv, alone: AloneEnvs, ids: np.ndarray, ended: np.ndarray) -> None:
    """Send the next actions to envs ``ids`` (in DISABLED mode, reset those whose episode ended), alone too."""
    if shm.autoreset_mode == AutoresetMode.DISABLED and ended.any():
        shm.async_reset(options={"reset_mask": np.isin(np.arange(shm.num_envs), ids[ended])})
        for i in ids[ended].tolist():
            alone.reset(i, mask=True)
        ids = ids[~ended]
    if len(ids):
        actions = [alone.next_action(i) for i in ids.tolist()]
        shm.send(concatenate(alone.space, actions, create_empty_array(alone.space, len(ids))), ids)
        for i, action in zip(ids.tolist(), actions):
            alone.step(i, action)


@given(
    design=designs(gym_observation_spaces, fixed_action_spaces),  # send() takes fixed-size actions only
    shape=pool_shapes(batches=True, start_methods=("fork",)),
    seed=seeds,
)
def test_async_batches_match_each_env_stepped_alone(design, shape, seed):
    fns = env_fns(design, shape.n_envs)
    with closing_all() as closing:
        shm = closing(
            ShmVectorEnv(
                fns, shape.n_workers, autoreset_mode=shape.autoreset_mode, batch_size=shape.batch_size, **shape.kwargs()
            )
        )
        alone = AloneEnvs(fns, shape.autoreset_mode, seed, closing)
        run_async(shm, alone, rounds=STEPS)
        received_alone = [env.get_attr("received")[0] for env in alone.envs]
        assert_same_received(shm.get_attr("received"), received_alone, alone.space)
    note_ends(alone.ends)


# ---- minimal reproducers of what the properties found -----------------------------------------


class TextCounter(gym.Env):
    """A Text observation (it travels pickled): the number of steps since the last reset."""

    observation_space = spaces.Text(8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "0", {}

    def step(self, action):
        self.t += 1
        return str(self.t), 0.0, False, False, {}


@pytest.mark.parametrize("n_workers", [0, 1])
def test_async_main_shard_returns_fresh_pickled_observations(n_workers, closing):
    envs = closing(ShmVectorEnv([TextCounter] * 2, n_workers, use_main_process=True, batch_size=1, start_method="fork"))
    envs.async_reset(seed=0)
    steps, got, want = [0, 0], [], []
    for _ in range(6):
        obs, *_, infos = envs.recv()
        i = int(infos["env_id"][0])
        got.append((i, obs[0]))
        want.append((i, str(steps[i])))
        envs.send(np.zeros(1, dtype=np.int64))
        steps[i] += 1
    assert got == want
