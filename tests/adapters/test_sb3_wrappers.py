"""SB3's VecEnv wrappers over ShmPoolVecEnv give exactly what they give over DummyVecEnv."""

from __future__ import annotations

import gymnasium as gym
import pytest
from stable_baselines3.common.vec_env import (
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

from tests.envs import cartpole, make_image, make_mixed
from tests.helpers import assert_same
from tests.sb3_compare import (
    check_step,
    infos_without,
    make_pair,
    run_equivalence,
    sample_actions,
)


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=50)


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero_copy"])
def test_vec_normalize(closing, copy):
    for make, n, k in ((cartpole, 5, 2), (pendulum, 4, 3)):
        shm, dummy = make_pair([make] * n, k, closing, copy=copy)
        shm_w, dummy_w = VecNormalize(shm, gamma=0.9), VecNormalize(dummy, gamma=0.9)
        counts = run_equivalence(shm_w, dummy_w, 250, seed=3)
        assert counts["done"] > 0
        assert_same(shm_w.obs_rms.mean, dummy_w.obs_rms.mean, "obs_rms.mean")
        assert_same(shm_w.obs_rms.var, dummy_w.obs_rms.var, "obs_rms.var")
        assert_same(shm_w.ret_rms.var, dummy_w.ret_rms.var, "ret_rms.var")
        assert_same(shm_w.get_original_obs(), dummy_w.get_original_obs(), "original obs")
        assert_same(
            shm_w.get_original_reward(),
            dummy_w.get_original_reward(),
            "original reward",
        )


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero_copy"])
def test_vec_frame_stack(closing, copy):
    for make, n, k, stack in ((cartpole, 5, 2, 4), (make_image, 3, 2, 2)):
        shm, dummy = make_pair([make] * n, k, closing, copy=copy)
        shm_w, dummy_w = (
            VecFrameStack(shm, n_stack=stack),
            VecFrameStack(dummy, n_stack=stack),
        )
        assert shm_w.observation_space == dummy_w.observation_space
        counts = run_equivalence(shm_w, dummy_w, 200, seed=5)
        assert counts["done"] > 0


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero_copy"])
def test_vec_transpose_image(closing, copy):
    shm, dummy = make_pair([make_image] * 5, 2, closing, copy=copy)
    shm_w, dummy_w = VecTransposeImage(shm), VecTransposeImage(dummy)
    assert shm_w.observation_space.shape == (3, 12, 10)
    counts = run_equivalence(shm_w, dummy_w, 200, seed=6)
    assert counts["terminated"] > 0 and counts["truncated"] > 0
    # Stacked, then transposed: the layering SB3's own algorithms build for image envs.
    shm2, dummy2 = make_pair([make_image] * 3, 3, closing, copy=copy)
    shm_w2 = VecTransposeImage(VecFrameStack(shm2, n_stack=3))
    dummy_w2 = VecTransposeImage(VecFrameStack(dummy2, n_stack=3))
    assert shm_w2.observation_space.shape == (9, 12, 10)
    assert run_equivalence(shm_w2, dummy_w2, 120, seed=7)["done"] > 0


def test_vec_monitor_episode_infos(closing):
    shm, dummy = make_pair([make_mixed] * 5, 2, closing)
    shm_w = VecMonitor(shm)
    dummy_w = VecMonitor(dummy)
    space = dummy.action_space
    space.seed(8)
    for venv in (shm_w, dummy_w):
        venv.seed(8)
    assert_same(shm_w.reset(), dummy_w.reset())
    episodes = 0
    for step in range(200):
        actions = sample_actions(space, 5)
        got, want = shm_w.step(actions), dummy_w.step(actions)
        for info in got[3]:
            if "episode" in info:
                episodes += 1
                assert isinstance(info["episode"]["t"], float)
        # "t" in the episode info is wall-clock time since the monitor started: the only difference.
        got = (*got[:3], infos_without(got[3], ("episode", "t")))
        want = (*want[:3], infos_without(want[3], ("episode", "t")))
        check_step(got, want, step)
    assert episodes > 0
    assert shm_w.episode_count == dummy_w.episode_count == episodes
    assert_same(shm_w.episode_returns, dummy_w.episode_returns, "running returns")
    assert_same(shm_w.episode_lengths, dummy_w.episode_lengths, "running lengths")
