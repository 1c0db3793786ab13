"""ShmAgentVecEnv against SuperSuit's single-process ConcatVecEnv (``concat_vec_envs_v1(...,
num_cpus=0, base_class="stable_baselines3")``): same seeds and actions, same results, but for
what docs/agents.md lists (``TimeLimit.truncated`` added, reset infos in ``reset_infos``, and
agent death without ``black_death_v3``'s flags)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("supersuit")  # bound by name only: supersuit's module __getattr__ breaks doctest's scan

from supersuit import concat_vec_envs_v1, pettingzoo_env_to_vec_env_v1  # noqa: E402

from shmvec.adapters.agents_sb3 import ShmAgentVecEnv  # noqa: E402
from tests.agent_envs import DyingAgentsEnv  # noqa: E402


def supersuit_concat(par_env, n):
    return concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(par_env), n, num_cpus=0, base_class="stable_baselines3")


def assert_info_equal(ours: dict, theirs: dict, where: str) -> None:
    ours = dict(ours)
    assert isinstance(ours.pop("TimeLimit.truncated"), bool), where  # SuperSuit adds none
    assert ours.keys() == theirs.keys(), where
    for key, value in ours.items():
        np.testing.assert_array_equal(value, theirs[key], err_msg=f"{where}: {key}")


def run_both(par_env, n_copies, steps, seed, n_actions, **options):
    """Step both vec envs with the same seeds and random actions; the number of episode ends seen."""
    theirs = supersuit_concat(par_env, n_copies)
    ends = 0
    with ShmAgentVecEnv(par_env, n_copies, **options) as ours:
        ours.seed(seed)
        obs = ours.reset()
        their_obs, their_reset_infos = theirs.venv.reset(seed=seed)  # SB3VecEnvWrapper.reset cannot seed
        np.testing.assert_array_equal(obs, their_obs)
        assert ours.reset_infos == their_reset_infos
        rng = np.random.default_rng(seed)
        for t in range(steps):
            actions = rng.integers(0, n_actions, ours.num_envs)
            obs, rewards, dones, infos = ours.step(actions)
            their_obs, their_rewards, their_dones, their_infos = theirs.step(actions)
            np.testing.assert_array_equal(obs, their_obs, err_msg=f"step {t}")
            assert obs.dtype == their_obs.dtype
            np.testing.assert_array_equal(rewards, their_rewards, err_msg=f"step {t}")
            assert rewards.dtype == their_rewards.dtype == np.float32
            np.testing.assert_array_equal(dones, their_dones, err_msg=f"step {t}")
            for i, (info, their_info) in enumerate(zip(infos, their_infos)):
                if dones[i]:  # SuperSuit merges the reset info into the step's; shmvec keeps it in reset_infos
                    info = {**info, **ours.reset_infos[i]}
                    assert info["TimeLimit.truncated"] is True  # these envs end by time limit
                assert_info_equal(info, their_info, f"step {t}, slot {i}")
            ends += int(dones.sum())
    theirs.close()
    return ends


def test_equals_supersuit_on_mpe2_simple_spread():
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    par_env = simple_spread_v3.parallel_env(N=3, max_cycles=7)
    assert run_both(par_env, 2, 20, seed=5, n_actions=5, n_workers=0) == 2 * 2 * 3


def test_equals_supersuit_with_agent_infos_and_reset_infos():
    ends = run_both(DyingAgentsEnv(n_agents=3, max_steps=4), 3, 10, seed=1, n_actions=3, n_workers=0)
    assert ends == 2 * 3 * 3


def test_equals_supersuit_in_two_workers():
    par_env = DyingAgentsEnv(n_agents=2, max_steps=3)
    ends = run_both(par_env, 3, 7, seed=2, n_actions=3, n_workers=2, start_method="fork")
    assert ends == 2 * 3 * 2


def test_unseeded_copies_play_different_episodes_where_supersuits_repeat_one():
    # Copies of one instance share its random state: SuperSuit's copies replay one episode unless
    # reset(seed=...) is reached, which SB3 cannot do through its wrapper. shmvec seeds each copy.
    par_env = DyingAgentsEnv(n_agents=2)
    theirs = supersuit_concat(par_env, 2)
    their_obs = theirs.reset()
    theirs.close()
    np.testing.assert_array_equal(their_obs[:2], their_obs[2:])
    with ShmAgentVecEnv(par_env, 2, n_workers=0) as ours:
        obs = ours.reset()
    assert not np.array_equal(obs[:2], obs[2:])
