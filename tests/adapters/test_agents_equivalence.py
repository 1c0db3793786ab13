"""ShmAgentVecEnv against SuperSuit's single-process ConcatVecEnv (``concat_vec_envs_v1(...,
num_cpus=0, base_class="stable_baselines3")``): same seeds and actions, same results, but for
what docs/agents.md lists (``TimeLimit.truncated`` added, reset infos in ``reset_infos``, and
agent death without ``black_death_v3``'s flags)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("supersuit")  # bound by name only: supersuit's module __getattr__ breaks doctest's scan

from supersuit import black_death_v3, concat_vec_envs_v1, pettingzoo_env_to_vec_env_v1  # noqa: E402

from shmvec.adapters.agents_sb3 import ShmAgentVecEnv  # noqa: E402
from tests.agent_envs import DyingAgentsEnv  # noqa: E402
from tests.helpers import assert_same  # noqa: E402


def supersuit_concat(par_env, n):
    return concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(par_env), n, num_cpus=0, base_class="stable_baselines3")


def assert_info_equal(ours: dict, theirs: dict, where: str) -> None:
    ours = dict(ours)
    assert isinstance(ours.pop("TimeLimit.truncated"), bool), where  # SuperSuit adds none
    assert ours.keys() == theirs.keys(), where
    for key, value in ours.items():
        np.testing.assert_array_equal(value, theirs[key], err_msg=f"{where}: {key}")


def run_both(par_env, n_copies, steps, seed, n_actions, their_seed=None, **options):
    """Step both vec envs with the same seeds and random actions; the number of episode ends seen.
    ``their_seed`` (default ``seed``) seeds SuperSuit's side: another one must make the run fail."""
    theirs = supersuit_concat(par_env, n_copies)
    ends = 0
    with ShmAgentVecEnv(par_env, n_copies, **options) as ours:
        ours.seed(seed)
        obs = ours.reset()
        their_obs, their_reset_infos = theirs.venv.reset(seed=seed if their_seed is None else their_seed)
        np.testing.assert_array_equal(obs, their_obs)  # SB3VecEnvWrapper.reset cannot seed: its venv's can
        assert ours.reset_infos == their_reset_infos
        rng = np.random.default_rng(seed)
        for t in range(steps):
            actions = rng.integers(0, n_actions, ours.num_envs)
            obs, rewards, dones, infos = ours.step(actions)
            their_obs, their_rewards, their_dones, their_infos = theirs.step(actions)
            assert_same(obs, their_obs, f"step {t}: observations")
            assert_same(rewards, their_rewards, f"step {t}: rewards")
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


# -- PettingZoo's own envs -------------------------------------------------------------------


def pursuit(**kwargs):
    pursuit_v5 = pytest.importorskip("pettingzoo.sisl.pursuit_v5")
    pytest.importorskip("pygame")
    # 8 pursuers on a small grid, short episodes: several whole-copy ends in a few hundred steps
    return pursuit_v5.parallel_env(x_size=8, y_size=8, n_evaders=6, max_cycles=40, **kwargs)


@pytest.mark.parametrize("n_workers", [0, 1])
def test_equals_supersuit_on_pursuit(n_workers):
    """sisl's pursuit: eight pursuers, none leaves, every episode ends by time limit."""
    options = {"start_method": "fork"} if n_workers else {}
    ends = run_both(pursuit(), 2, 200, seed=7, n_actions=5, n_workers=n_workers, **options)
    assert ends == 5 * 2 * 8


def test_pursuit_with_another_seed_on_one_side_differs():
    with pytest.raises(AssertionError):
        run_both(pursuit(), 2, 20, seed=7, their_seed=8, n_actions=5, n_workers=0)


def black_death_concat(par_env):
    """One copy as PettingZoo's SB3 tutorials wrap an env whose agents die."""
    markov = pettingzoo_env_to_vec_env_v1(black_death_v3(par_env))
    return concat_vec_envs_v1(markov, 1, num_cpus=0, base_class="stable_baselines3")


def run_against_black_death(par_env, n_copies, steps, seed, sample_actions, their_seed=None, **options):
    """Step ShmAgentVecEnv (no wrapper) and SuperSuit's tutorial stack (``black_death_v3``) with the
    same seeds and actions, one SuperSuit vec env per copy, seeded ``seed + c`` as a ConcatVecEnv
    would seed copy ``c``: one per copy, because black_death_v3 ends each episode one step late.

    Compared bit for bit: each step's rewards, for every slot; the observations of agents that act
    on, and of agents gone (zeros on both sides); a leaving agent's last observation (our
    ``terminal_observation``, their row); at a copy's end each slot's ``terminal_observation``
    against their row, then our reset observation against what their extra step returns.
    Where SuperSuit differs by design, shmvec's documented behaviour is asserted instead: a leaving
    agent's slot says ``done`` (theirs ``False``) with a zero observation and ``mask`` False until
    its copy ends, and a copy ends on the step its last agent leaves, where black_death_v3 asks one
    more step (on no agent) before it says ``done``.
    Returns counts of what happened, so that a caller can check the run saw deaths and ends."""
    their_seed = seed if their_seed is None else their_seed
    theirs = [black_death_concat(par_env) for _ in range(n_copies)]
    seen = {"deaths": 0, "ends": 0, "truncated_ends": 0, "rewarded_steps": 0}  # truncated: by the time limit
    try:
        with ShmAgentVecEnv(par_env, n_copies, **options) as ours:
            n_agents = ours.num_envs // n_copies
            ours.seed(seed)
            their_obs = [their.venv.reset(seed=their_seed + c)[0] for c, their in enumerate(theirs)]
            assert_same(ours.reset(), np.concatenate(their_obs), "reset observations")
            assert ours.mask.all()
            rng = np.random.default_rng(seed)
            for t in range(steps):
                acting = ours.mask.copy()
                actions = sample_actions(rng, ours.num_envs)
                obs, rewards, dones, infos = ours.step(actions)
                for c, their in enumerate(theirs):
                    at = f"step {t}, copy {c}"
                    rows = slice(c * n_agents, (c + 1) * n_agents)
                    their_obs, their_rewards, their_dones, their_infos = their.step(actions[rows])
                    assert_same(rewards[rows], their_rewards, f"{at}: rewards")
                    assert not their_dones.any(), at  # black_death_v3: never done on the step agents leave
                    seen["rewarded_steps"] += bool(their_rewards.any())
                    leaving = dones[rows] & acting[rows]
                    for i in range(n_agents):  # beyond SuperSuit's: truncation flags, no other info
                        info = dict(infos[c * n_agents + i])
                        truncated = info.pop("TimeLimit.truncated")
                        assert isinstance(truncated, bool) and (truncated <= leaving[i]), (at, i)
                        if dones[rows][i]:
                            assert_same(info.pop("terminal_observation"), their_obs[i], f"{at}, agent {i}: last obs")
                        assert info == their_infos[i] == {}, (at, i)
                    if dones[rows].all():  # every agent gone: the copy ended and reset
                        seen["ends"] += 1
                        seen["truncated_ends"] += any(
                            infos[c * n_agents + i]["TimeLimit.truncated"] for i in range(n_agents)
                        )
                        assert ours.mask[rows].all(), at
                        their_obs, their_rewards, their_dones, their_reset_infos = their.step(actions[rows])
                        assert their_dones.all() and not their_rewards.any(), f"{at}: black_death_v3's extra step"
                        assert_same(obs[rows], their_obs, f"{at}: reset observations")
                        for i, info in enumerate(their_reset_infos):
                            assert info.keys() - {"terminal_observation"} == ours.reset_infos[c * n_agents + i].keys()
                        continue
                    seen["deaths"] += int(leaving.sum())
                    assert not dones[rows][~acting[rows]].any(), f"{at}: an agent gone is done once"
                    assert_same(ours.mask[rows], acting[rows] & ~leaving, f"{at}: mask")
                    assert not obs[rows][leaving].any(), f"{at}: a leaving agent's observation"
                    assert_same(obs[rows][~leaving], their_obs[~leaving], f"{at}: observations")
    finally:
        for their in theirs:
            their.close()
    return seen


def kaz(**kwargs):
    pytest.importorskip("pygame")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    # bench/agents.py's KAZ (vector observations, 4 zombies), zombies spawning every other frame so
    # that knights die, archers kill and zombies get through within a few hundred steps
    return knights_archers_zombies_v11.parallel_env(max_zombies=4, obs_method="vector", spawn_delay=2, **kwargs)


def discrete(n):
    return lambda rng, size: rng.integers(0, n, size)


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
@pytest.mark.parametrize("n_workers", [0, 1])
def test_equals_supersuit_black_death_on_knights_archers_zombies(n_workers):
    """KAZ as PettingZoo's tutorial runs it through SuperSuit (``black_death_v3``), against the bare
    env in shmvec: what both give agrees bit for bit, where they differ by design (a dead agent's
    ``done`` and ``mask``, a copy's end one step sooner) shmvec does what docs/agents.md says
    (``run_against_black_death`` lists both)."""
    options = {"start_method": "fork"} if n_workers else {}
    env = kaz(max_cycles=140)
    seen = run_against_black_death(env, 2, 400, seed=0, sample_actions=discrete(6), n_workers=n_workers, **options)
    # knights die, copies end both when a zombie gets through and by the time limit, archers score
    assert seen["deaths"] >= 2 and seen["ends"] > seen["truncated_ends"] >= 1 and seen["rewarded_steps"] >= 1, seen


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
def test_knights_archers_zombies_with_another_seed_on_one_side_differs():
    with pytest.raises(AssertionError):
        run_against_black_death(kaz(), 2, 50, seed=0, their_seed=1, sample_actions=discrete(6), n_workers=0)


def multiwalker(**kwargs):
    pytest.importorskip("Box2D")
    pytest.importorskip("pygame")
    from pettingzoo.sisl import multiwalker_v9

    # a fallen walker leaves and the others walk on (not the default end of every walker's episode)
    return multiwalker_v9.parallel_env(n_walkers=3, terminate_on_fall=False, remove_on_fall=True, **kwargs)


def continuous(rng, size):
    return rng.uniform(-1, 1, (size, 4)).astype(np.float32)


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
def test_equals_supersuit_black_death_on_multiwalker():
    # multiwalker ends its episodes by termination, its time limit too: no truncated end to see
    seen = run_against_black_death(multiwalker(max_cycles=100), 2, 200, seed=0, sample_actions=continuous, n_workers=0)
    assert seen["deaths"] >= 2 and seen["ends"] >= 2 and seen["rewarded_steps"] >= 1, seen
