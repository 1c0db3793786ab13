"""ShmAgentVecEnv's SB3 API: seeds per copy, calls by slot (each run once per copy), render,
close, the errors that name their fix, and PPO learning on it."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from shmvec.adapters.agents_concat import concat_vec_envs_v1  # noqa: E402
from shmvec.adapters.agents_sb3 import ShmAgentVecEnv  # noqa: E402
from shmvec.errors import InvalidActionError, SpaceMismatchError, UnsupportedSpaceError  # noqa: E402
from tests.agent_envs import DictObsEnv, DyingAgentsEnv, MixedSpacesEnv, PidAgentsEnv  # noqa: E402
from tests.helpers import gone  # noqa: E402


def test_seed_gives_each_copy_its_own_seed_and_each_slot_its_copys(closing):
    env = closing(ShmAgentVecEnv(DyingAgentsEnv(n_agents=2), 3, n_workers=0))
    assert env.seed(10) == [10, 10, 11, 11, 12, 12]
    obs = env.reset()
    again = DyingAgentsEnv(n_agents=2)
    for copy in range(3):  # copy c is reset with seed 10 + c
        expected, _ = again.reset(seed=10 + copy)
        np.testing.assert_array_equal(obs[2 * copy : 2 * copy + 2], np.stack(list(expected.values())))
    assert env.reset_infos == [{"start": 0}] * 6


def test_options_go_to_each_copys_reset(closing):
    env = closing(ShmAgentVecEnv(DyingAgentsEnv(n_agents=2), 2, n_workers=0))
    env.set_options([{"start": 1}, {"start": 9}, {"start": 2}, {"start": 9}])
    env.reset()
    assert env.reset_infos == [{"start": 1}] * 2 + [{"start": 2}] * 2


def test_a_restarted_copy_ends_the_episode_of_each_of_its_slots(closing):
    """A worker killed mid-episode: each slot of its copy gets what ShmPoolVecEnv gives a restarted
    env (done, truncated, no terminal_observation: it died with the worker), and stepping goes on."""
    env = closing(ShmAgentVecEnv(PidAgentsEnv(n_agents=2, max_steps=50), 2, n_workers=2, on_worker_failure="restart"))
    actions = np.zeros(env.num_envs, np.int64)
    env.seed(0)
    env.reset()
    env.step(actions)
    pids = env.env_method("pid")
    assert pids[2] != pids[0]
    os.kill(pids[2], signal.SIGKILL)  # copy 1's worker
    deadline = time.monotonic() + 10
    while not gone(pids[2]) and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.warns(RuntimeWarning, match="restarting"):
        _, rewards, dones, infos = env.step(actions)
    assert dones.tolist() == [False, False, True, True]
    assert rewards[2:].tolist() == [0, 0]
    for info in infos[2:]:
        assert info["shmvec_restarted"] is True and info["TimeLimit.truncated"] is True
        assert "terminal_observation" not in info
    assert env.reset_infos[2:] == [{"start": 0}] * 2  # the restarted copy's reset infos, per slot
    assert env.mask.all()
    _, _, dones, infos = env.step(actions)
    assert not dones.any() and not any(info.get("shmvec_restarted") for info in infos)


def test_the_first_unseeded_reset_leaves_the_callers_global_rng_alone(closing):
    state = np.random.get_state()
    try:
        np.random.seed(0)
        expected = np.random.random()
        np.random.seed(0)
        env = closing(ShmAgentVecEnv(DyingAgentsEnv(n_agents=2), 2, n_workers=0))
        env.reset()
        assert np.random.random() == expected
    finally:
        np.random.set_state(state)


def test_calls_by_slot_run_once_per_copy(closing):
    env = closing(ShmAgentVecEnv(DyingAgentsEnv(n_agents=3), 2, n_workers=2, start_method="fork"))
    assert env.n_workers == 2
    env.reset()
    assert env.get_attr("episodes") == [1] * 6  # the ParallelEnv's attribute, through its slots env
    env.env_method("reset", indices=[0, 1, 2, 4])  # copy 0 named three times: reset once
    assert env.get_attr("episodes") == [2] * 6
    env.step(np.zeros(6, dtype=np.int64))
    assert env.env_method("count", 5, indices=[5, -6]) == [5, 5]
    env.set_attr("max_steps", 99, indices=[3])
    assert env.get_attr("max_steps") == [6, 6, 6, 99, 99, 99]
    assert env.get_attr("possible_agents", [1]) == [("agent_0", "agent_1", "agent_2")]
    assert env.env_is_wrapped(object, [0, 5]) == [False, False]
    assert env.has_attr("count") and not env.has_attr("no_such_attribute")
    with pytest.raises(IndexError):
        env.get_attr("episodes", [6])


def test_render_shows_each_copy_once_and_close_twice():
    env = ShmAgentVecEnv(DyingAgentsEnv(n_agents=2, render_mode="rgb_array"), 3, n_workers=0)
    try:
        env.reset()
        env.step(np.zeros(6, dtype=np.int64))
        assert env.render_mode == "rgb_array"
        assert len(env.get_images()) == 6
        image = env.render()
        assert image.ndim == 3 and image.shape[0] * image.shape[1] < 6 * 16  # tiled over 3 copies, not 6 slots
        assert (image == 1).any()
    finally:
        env.close()
    env.close()
    assert env.closed


def test_wrong_action_count_is_refused(closing):
    env = closing(ShmAgentVecEnv(DyingAgentsEnv(n_agents=2), 2, n_workers=0))
    env.reset()
    with pytest.raises(InvalidActionError, match="2 copies x 2 agents = 4"):
        env.step(np.zeros(2, dtype=np.int64))
    env.step(np.zeros(4, dtype=np.int64))  # still usable


def test_agents_with_different_spaces_get_an_error_naming_the_padding_wrapper():
    with pytest.raises(SpaceMismatchError, match="pad_observations_v0"):
        ShmAgentVecEnv(MixedSpacesEnv(), 2, n_workers=0)
    with pytest.raises(UnsupportedSpaceError, match="flatten_v0"):
        ShmAgentVecEnv(DictObsEnv(), 2, n_workers=0)
    with pytest.raises(ValueError, match="positive int"):
        ShmAgentVecEnv(DyingAgentsEnv(), 0, n_workers=0)


def test_a_factory_whose_agents_differ_fails_in_its_worker_with_that_error():
    with pytest.raises(SpaceMismatchError, match="pad_observations_v0"):
        ShmAgentVecEnv(MixedSpacesEnv, 2, n_workers=1, start_method="forkserver")


def test_supersuits_call_shape_builds_it():
    supersuit = pytest.importorskip("supersuit")
    markov = supersuit.pettingzoo_env_to_vec_env_v1(DyingAgentsEnv(n_agents=2))
    with concat_vec_envs_v1(markov, 3, num_cpus=0, base_class="stable_baselines3") as env:
        assert isinstance(env, ShmAgentVecEnv) and env.num_envs == 6 and env.n_workers == 0
        assert env.reset().shape == (6, 4)
    with pytest.raises(ValueError, match="stable_baselines3"):
        concat_vec_envs_v1(markov, 3, base_class="stable_baselines")


def test_rewards_are_supersuits_float32_of_the_rewards_the_env_gave():
    env = DyingAgentsEnv(n_agents=2, max_steps=50)
    mirror = DyingAgentsEnv(n_agents=2, max_steps=50)
    with ShmAgentVecEnv(env, 1, n_workers=0) as ours:
        ours.seed(3)
        ours.reset()
        mirror.reset(seed=3)
        for t in range(5):
            _, rewards, _, _ = ours.step(np.array([t % 3, 1]))
            theirs = mirror.step({"agent_0": t % 3, "agent_1": 1})[1]
            assert rewards.dtype == np.float32
            assert rewards.tolist() == [np.float32(theirs["agent_0"]), np.float32(theirs["agent_1"])]


def test_a_factory_builds_each_copy(closing):
    env = closing(ShmAgentVecEnv(functools.partial(DyingAgentsEnv, n_agents=2, obs_size=3), 2, n_workers=0))
    assert env.observation_space.shape == (3,) and env.action_space.n == 3
    assert env.reset().shape == (4, 3)


def test_ppo_learns_on_simple_spread(closing):
    pytest.importorskip("stable_baselines3")
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor

    env = closing(ShmAgentVecEnv(simple_spread_v3.parallel_env(N=3, max_cycles=25), 2, n_workers=0))
    model = PPO("MlpPolicy", VecMonitor(env), n_steps=64, batch_size=96, n_epochs=1, seed=0)
    model.learn(512)
    assert model.num_timesteps >= 512
    # two rollouts of 64 steps per slot: five episodes of 25 steps per agent slot, ended by same-step resets
    assert len(model.ep_info_buffer) == 5 * 6 and {e["l"] for e in model.ep_info_buffer} == {25}


def test_set_attr_sets_an_attribute_neither_env_has_on_the_slot_env(closing):
    env = closing(ShmAgentVecEnv(DyingAgentsEnv(n_agents=2), 2, n_workers=0))
    env.set_attr("brand_new", 3)
    env.set_attr("max_steps", 9)  # the ParallelEnv's own
    assert env.get_attr("brand_new") == [3] * 4 and env.get_attr("max_steps") == [9] * 4
