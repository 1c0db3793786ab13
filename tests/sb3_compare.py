"""Helpers for comparing a ``ShmPoolVecEnv`` with SB3's ``DummyVecEnv`` bit for bit.

Used by ``test_sb3_*.py``. Comparisons are ``helpers.assert_same``: bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper

from shmvec import ShmPoolVecEnv
from tests.helpers import assert_same


def make_pair(
    env_fns: Sequence[Callable[[], gym.Env]],
    n_workers: int,
    closing,
    start_method: str = "fork",
    **shm_kwargs,
):
    """A ``(ShmPoolVecEnv, DummyVecEnv)`` over the same env_fns, both closed at teardown."""
    shm = closing(ShmPoolVecEnv(list(env_fns), n_workers=n_workers, start_method=start_method, **shm_kwargs))
    dummy = closing(DummyVecEnv(list(env_fns)))
    return shm, dummy


def sample_actions(space: gym.Space, n_envs: int) -> np.ndarray:
    """One batch of actions as SB3 algorithms produce them (an array of the space's dtype)."""
    return np.stack([np.asarray(space.sample()) for _ in range(n_envs)])


def check_step(shm_out, dummy_out, step: int) -> None:
    """Compare one ``step()`` return value of both vec envs."""
    obs, rewards, dones, infos = shm_out
    want_obs, want_rewards, want_dones, want_infos = dummy_out
    assert_same(obs, want_obs, f"step {step} obs")
    assert rewards.dtype == np.float32, f"step {step}: rewards dtype {rewards.dtype}"
    assert_same(rewards, want_rewards, f"step {step} rewards")
    assert_same(dones, want_dones, f"step {step} dones")
    assert_same(infos, want_infos, f"step {step} infos")


def run_equivalence(
    shm: VecEnv,
    dummy: VecEnv,
    steps: int,
    seed: int = 0,
    reset_options: dict | None = None,
) -> dict[str, int]:
    """Seed, reset and step both vec envs with the same actions; compare everything every step.

    Also checks that a returned observation never changes when the next step runs, and
    half-way through re-seeds and sets options (which must only act at the next reset).
    Returns counts of what happened (so callers can check the run exercised episode ends).
    """
    n = shm.num_envs
    space = dummy.action_space
    space.seed(seed)
    assert shm.seed(seed) == dummy.seed(seed)
    assert_same(shm.reset(), dummy.reset(), "first reset obs")
    assert_same(shm.reset_infos, dummy.reset_infos, "first reset_infos")
    counts = {"done": 0, "truncated": 0, "terminated": 0}
    kept, kept_copy = None, None
    for step in range(steps):
        if step == steps // 2:
            # seed() and set_options() act at the next reset only, then are forgotten.
            shm.seed(seed + 1000)
            dummy.seed(seed + 1000)
            if reset_options is not None:
                shm.set_options(reset_options)
                dummy.set_options(reset_options)
        if step == steps // 2 + 5:
            reset_obs = shm.reset()
            assert_same(reset_obs, dummy.reset(), f"step {step} mid-run reset obs")
            assert_same(shm.reset_infos, dummy.reset_infos, f"step {step} mid-run reset_infos")
            kept, kept_copy = reset_obs, copy.deepcopy(reset_obs)  # the call before the next step
        actions = sample_actions(space, n)
        if step % 3 == 0:
            shm.step_async(actions.copy())
            shm_out = shm.step_wait()
        else:
            shm_out = shm.step(actions.copy())
        dummy_out = dummy.step(actions.copy())
        check_step(shm_out, dummy_out, step)
        assert_same(shm.reset_infos, dummy.reset_infos, f"step {step} reset_infos")
        # SB3 keeps _last_obs: the previous call's obs must be untouched, also with
        # copy=False (double-buffered). (Only for the bare vec env: SB3's own
        # VecFrameStack returns, and later updates, its stacking buffer.)
        if kept is not None and not isinstance(shm, VecEnvWrapper):
            assert_same(
                kept,
                kept_copy,
                f"step {step}: the previous step's returned obs changed",
            )
        kept, kept_copy = shm_out[0], copy.deepcopy(shm_out[0])
        for info, done in zip(dummy_out[3], dummy_out[2]):
            counts["done"] += int(done)
            if done:
                counts["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
    return counts


def infos_without(infos: list[dict], path: tuple[str, ...]) -> list[dict]:
    """Deep copies of ``infos`` with the key at ``path`` (e.g. ``("episode", "t")``) removed."""
    out = copy.deepcopy(infos)
    for info in out:
        node = info
        for key in path[:-1]:
            node = node.get(key, {})
        node.pop(path[-1], None)
    return out
