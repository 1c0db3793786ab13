"""Agents that leave before their copy ends, without SuperSuit's ``black_death_v3``: a zero
observation, reward 0, ``done`` kept and ``mask`` False until the copy resets; the copy ends when
every agent is terminated or truncated."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from shmvec.adapters.agent_slots import AgentSlotsEnv  # noqa: E402
from shmvec.adapters.agents_sb3 import ShmAgentVecEnv  # noqa: E402
from tests.agent_envs import DyingAgentsEnv  # noqa: E402


def test_a_leaving_agent_is_done_once_then_gets_zeros_until_its_copy_resets():
    # agent_0 leaves after 2 steps, agent_1 after 4, agent_2 is truncated at 6: the copy ends there.
    par_env = DyingAgentsEnv(n_agents=3, lifetimes=(2, 4), max_steps=6, infos=False)
    with ShmAgentVecEnv(par_env, 2, n_workers=0) as env:
        env.seed(0)
        env.reset()
        assert env.mask.all()
        for t in range(1, 8):
            obs, rewards, dones, infos = env.step(np.ones(6, dtype=np.int64))
            for copy in (0, 1):
                slots = [copy * 3 + a for a in range(3)]
                if t < 6:  # the copy goes on
                    gone = [a for a, life in ((0, 2), (1, 4)) if t >= life]
                    for a in range(3):
                        slot = slots[a]
                        if a in gone:
                            assert not env.mask[slot] and not obs[slot].any(), (t, a)
                            assert infos[slot]["TimeLimit.truncated"] is False
                            if t == (2, 4)[a]:  # the step it left: done, its reward and its own last observation
                                assert dones[slot] and 1 <= rewards[slot] < 2
                                assert infos[slot]["terminal_observation"].any()
                            else:  # later: not done again (no 0-reward episode a step), nothing, zeros
                                assert not dones[slot] and rewards[slot] == 0, (t, a)
                                assert "terminal_observation" not in infos[slot]
                        else:
                            assert not dones[slot] and env.mask[slot] and obs[slot].any()
                            assert 1 <= rewards[slot] < 2 and "terminal_observation" not in infos[slot]
                elif t == 6:  # agent_2 truncated: every agent is done, the copy ends and resets
                    assert dones[slots].all() and env.mask[slots].all() and obs[slots].all()
                    assert [infos[s]["TimeLimit.truncated"] for s in slots] == [False, False, True]
                    assert rewards[slots[0]] == rewards[slots[1]] == 0 and 1 <= rewards[slots[2]] < 2
                    final = [infos[s]["terminal_observation"] for s in slots]
                    assert not final[0].any() and not final[1].any()
                    assert final[2].any()
                else:  # a fresh episode
                    assert not dones[slots].any() and env.mask[slots].all()


def test_the_slots_env_rows_flags_and_episode_end():
    env = AgentSlotsEnv(DyingAgentsEnv(n_agents=2, lifetimes=(1, 2), max_steps=9, infos=False))
    obs, info = env.reset(seed=3)
    assert obs["mask"].tolist() == [1, 1] and info == {agent_infos_key(): ({"start": 0}, {"start": 0})}
    obs, reward, terminated, truncated, info = env.step(np.array([2, 2]))
    assert obs["mask"].tolist() == [0, 1] and obs["terminated"].tolist() == [1, 0]
    assert not obs["obs"][0].any() and info["left_agent_obs"][0].any() and not (terminated or truncated)
    obs, reward, terminated, truncated, info = env.step(np.array([2, 2]))
    # every agent terminated: the episode ends (black_death_v3 would wait for terminated *and* truncated)
    assert terminated and not truncated and obs["terminated"].tolist() == [1, 1]
    assert obs["rewards"][0] == 0 and obs["obs"][1].any() and info == {}


def agent_infos_key():
    from shmvec.adapters.agent_slots import AGENT_INFOS

    return AGENT_INFOS


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
def test_kaz_agent_death_against_black_death():
    """Knights Archers Zombies with ``line_death``: where agents die, SuperSuit's black_death_v3 gives
    the same observations and rewards but ``done=False`` for a dead agent (it bootstraps through its
    death); shmvec's slot says ``done`` and ``mask=False``."""
    pytest.importorskip("pygame")
    pytest.importorskip("supersuit")
    from pettingzoo.butterfly import knights_archers_zombies_v11
    from supersuit import black_death_v3, concat_vec_envs_v1, pettingzoo_env_to_vec_env_v1

    par_env = knights_archers_zombies_v11.parallel_env(max_cycles=400, line_death=True)
    markov = pettingzoo_env_to_vec_env_v1(black_death_v3(par_env))
    theirs = concat_vec_envs_v1(markov, 2, base_class="stable_baselines3")
    deaths = 0
    with ShmAgentVecEnv(par_env, 2, n_workers=0) as ours:
        ours.seed(0)
        their_obs, _ = theirs.venv.reset(seed=0)
        np.testing.assert_array_equal(ours.reset(), their_obs)
        rng = np.random.default_rng(0)
        dead = np.zeros(ours.num_envs, bool)
        for t in range(200):
            actions = rng.integers(0, 6, ours.num_envs)
            obs, rewards, dones, infos = ours.step(actions)
            their_obs, their_rewards, their_dones, _ = theirs.step(actions)
            if dones.reshape(2, -1).all(axis=1).any():
                # a copy's last agent died: it ends here; black_death_v3 ends an episode only when its agents
                # are terminated *and* truncated, so SuperSuit steps on with no agent left
                break
            assert not their_dones.any()
            leaving = dones & ~dead
            deaths += int(leaving.sum())
            np.testing.assert_array_equal(obs[~leaving], their_obs[~leaving], err_msg=f"step {t}")
            np.testing.assert_array_equal(rewards, their_rewards, err_msg=f"step {t}")
            for i in np.flatnonzero(leaving):  # the dying agent's last observation: SuperSuit's row, our info
                np.testing.assert_array_equal(infos[i]["terminal_observation"], their_obs[i])
                assert not obs[i].any()
            assert (leaving == (~ours.mask & ~dead)).all()  # done on the step it leaves, not after
            assert not (dones & dead).any()
            dead |= dones
    theirs.close()
    assert deaths >= 1, "no agent died: the test saw nothing"


def test_vec_monitor_counts_no_episode_a_step_for_an_agent_gone():
    """An agent gone is not done again each step: VecMonitor records its episode up to its departure
    and one for its wait at the copy's end, not a 0-reward episode every step."""
    from stable_baselines3.common.vec_env import VecMonitor

    par_env = DyingAgentsEnv(n_agents=3, lifetimes=(2, 4), max_steps=6, infos=False)
    env = VecMonitor(ShmAgentVecEnv(par_env, 1, n_workers=0))
    try:
        env.seed(0)
        env.reset()
        episodes = []
        for _ in range(6):
            _, _, dones, infos = env.step(np.ones(3, dtype=np.int64))
            episodes += [(slot, info["episode"]["l"]) for slot, info in enumerate(infos) if "episode" in info]
        # agent_0 left at 2, agent_1 at 4, all at 6: 9 episodes when a gone agent was done each step
        assert sorted(episodes) == [(0, 2), (0, 4), (1, 2), (1, 4), (2, 6)]
    finally:
        env.close()


def test_an_observation_of_another_shape_is_an_error_naming_the_agent():
    class ScalarObs(DyingAgentsEnv):
        def reset(self, seed=None, options=None):
            observations, infos = super().reset(seed=seed, options=options)
            return {**observations, "agent_1": np.float32(0.5)}, infos

    with pytest.raises(ValueError, match=r"reset\(\) returned an observation of shape \(\) for agent 'agent_1'"):
        AgentSlotsEnv(ScalarObs(n_agents=2, lifetimes=(1, 2), max_steps=9, infos=False)).reset(seed=0)
