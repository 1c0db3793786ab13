"""Third-party algorithms whose hot path calls ``env_method``, on their real third-party envs, learn
through ``ShmPoolVecEnv`` exactly as through ``DummyVecEnv``: SAC with SB3's ``HerReplayBuffer``
on Gymnasium-Robotics' FetchReach (``compute_reward`` for every sampled batch) and sb3-contrib's
MaskablePPO on its own ``InvalidActionEnvDiscrete`` (``action_masks`` every step).

The suite's own envs for these calls, in every layout: ``test_sb3_hot_calls.py``. Skipped where
gymnasium-robotics (and MuJoCo) or sb3-contrib are not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv
from tests.goal_envs import make_fetch, make_invalid_action_env
from tests.helpers import assert_same

# k2 forks: its workers inherit the third-party modules (sb3-contrib, so SB3 and torch; MuJoCo) instead of
# importing them each; the start method is not what these tests are about
LAYOUTS = {"default": {}, "k2": {"n_workers": 2, "start_method": "fork"}}


def learn(algo, env_fns, venv_cls, closing, timesteps: int, **hyper):
    """``algo`` trained ``timesteps`` steps over ``venv_cls(env_fns)``, seed 0, torch on one thread
    (identical reductions run to run), the vector env closed at teardown; and its ``repr``."""
    venv = closing(venv_cls(env_fns))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        model = algo(seed=0, device="cpu", env=venv, **hyper)
        model.learn(timesteps)
    finally:
        torch.set_num_threads(threads)
    return model, repr(venv)


def shm_with(layout: str):
    return lambda env_fns: ShmPoolVecEnv(env_fns, **LAYOUTS[layout])


def buffer_arrays(buffer) -> dict[str, np.ndarray]:
    """Every array a replay or rollout buffer holds (dicts of arrays by key), by attribute name."""
    arrays = {}
    for name, value in sorted(vars(buffer).items()):
        if isinstance(value, np.ndarray):
            arrays[name] = value
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            arrays.update({f"{name}[{key}]": array for key, array in value.items()})
    return arrays


def assert_same_training(got, want, where: str) -> None:
    """The same steps taken, buffer contents and trained parameters, bit for bit."""
    assert got.num_timesteps == want.num_timesteps
    buffer = "replay_buffer" if hasattr(want, "replay_buffer") else "rollout_buffer"
    got_arrays, want_arrays = buffer_arrays(getattr(got, buffer)), buffer_arrays(getattr(want, buffer))
    assert list(got_arrays) == list(want_arrays) and want_arrays
    for name, array in want_arrays.items():
        assert_same(got_arrays[name], array, f"{where}: {buffer}.{name}")
    got_params, want_params = got.policy.state_dict(), want.policy.state_dict()
    assert list(got_params) == list(want_params)
    for key, tensor in want_params.items():
        assert torch.equal(got_params[key], tensor), f"{where}: parameter {key} differs from the DummyVecEnv run"


@pytest.fixture(scope="module")
def fetch_reach():
    pytest.importorskip("mujoco")
    pytest.importorskip("gymnasium_robotics")
    return [make_fetch] * 4


def test_fetch_reach_compute_reward_matches_the_env(fetch_reach, closing):
    """HER's call as it makes it: a batch of goals and infos, answered by env 0's own compute_reward."""
    shm = closing(ShmPoolVecEnv(fetch_reach, n_workers=2))
    shm.seed(0)
    obs = shm.reset()
    env = make_fetch()
    try:
        rng = np.random.default_rng(0)
        desired = obs["desired_goal"][[0] * 64]
        achieved = desired + rng.normal(0, 0.03, (64, 3))  # FetchReach: reached within 0.05
        infos = np.array([{} for _ in range(64)])
        got = shm.env_method("compute_reward", achieved, desired, infos, indices=[0])
        assert_same(got, [env.unwrapped.compute_reward(achieved, desired, infos)])
        assert 0 < -got[0].sum() < 64, "some goals reached and some not"
    finally:
        env.close()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sac_her_on_fetch_reach_learns_as_on_dummy(fetch_reach, layout, closing):
    from stable_baselines3 import SAC, HerReplayBuffer

    def train(venv_cls):
        return learn(
            SAC,
            fetch_reach,
            venv_cls,
            closing,
            400,
            policy="MultiInputPolicy",
            learning_starts=200,  # one whole episode (50 steps) in each of the 4 envs: HER samples from there
            buffer_size=1_000,
            batch_size=64,
            policy_kwargs={"net_arch": [32, 32]},
            replay_buffer_class=HerReplayBuffer,
            replay_buffer_kwargs={"n_sampled_goal": 4, "goal_selection_strategy": "future"},
        )

    want, _ = train(DummyVecEnv)
    got, described = train(shm_with(layout))
    assert layout == "default" or "n_workers=2, use_main_process=False" in described, described
    assert_same_training(got, want, f"{layout}: {described}")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_maskable_ppo_on_invalid_action_env_learns_as_on_dummy(layout, closing):
    sb3_contrib = pytest.importorskip("sb3_contrib")
    env_fns = [make_invalid_action_env] * 8

    def train(venv_cls):
        return learn(
            sb3_contrib.MaskablePPO,
            env_fns,
            venv_cls,
            closing,
            512,
            policy="MlpPolicy",
            n_steps=32,
            batch_size=64,
            n_epochs=2,
            policy_kwargs={"net_arch": [16]},
        )

    want, _ = train(DummyVecEnv)
    got, described = train(shm_with(layout))
    assert layout == "default" or "n_workers=2, use_main_process=False" in described, described
    assert_same_training(got, want, f"{layout}: {described}")
    masks = want.rollout_buffer.action_masks
    assert 0 < masks.mean() < 1, "the rollouts held masked actions"
