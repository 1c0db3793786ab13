"""``shmvec.concat_vec_envs_v1`` with SuperSuit's base classes: ``"gymnasium"`` (its default) against
SuperSuit's own ``concat_vec_envs_v1(..., num_cpus=0, base_class="gymnasium")``, bit for bit, with
the same seeds and actions, on PettingZoo's envs as its tutorials wrap them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("supersuit")  # bound by name only: supersuit's module __getattr__ breaks doctest's scan

from supersuit import black_death_v3, pettingzoo_env_to_vec_env_v1  # noqa: E402
from supersuit import concat_vec_envs_v1 as supersuit_concat_vec_envs_v1  # noqa: E402

import shmvec  # noqa: E402
from shmvec.adapters.agents_concat import ShmAgentConcatVecEnv  # noqa: E402
from tests.agent_envs import AbsentAgentEnv, DyingAgentsEnv, PidAgentsEnv, step_after_killing_copy_one  # noqa: E402
from tests.helpers import assert_same  # noqa: E402


def assert_infos_equal(ours: list[dict], theirs: list[dict], where: str) -> None:
    assert isinstance(ours, list) and len(ours) == len(theirs), where
    for i, (info, their_info) in enumerate(zip(ours, theirs)):
        assert list(info) == list(their_info), f"{where}, slot {i}: {list(info)} != {list(their_info)}"
        for key, value in info.items():
            assert_same(np.asarray(value), np.asarray(their_info[key]), f"{where}, slot {i}: {key}")


def run_both(par_env, n_copies, steps, seed, sample_actions, num_cpus=0, their_seed=None, **options):
    """Step shmvec's and SuperSuit's ``concat_vec_envs_v1(..., base_class="gymnasium")`` with the same
    seeds and actions; compare every return, dtypes included. Returns how many slot episodes ended."""
    theirs = supersuit_concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(par_env), n_copies, num_cpus=0)
    ends = 0
    try:
        with shmvec.concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(par_env), n_copies, num_cpus, **options) as ours:
            assert isinstance(ours, ShmAgentConcatVecEnv)
            assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
            assert ours.num_envs == theirs.num_envs and ours.metadata == theirs.metadata
            obs, infos = ours.reset(seed=seed)
            their_obs, their_infos = theirs.reset(seed=seed if their_seed is None else their_seed)
            assert_same(obs, their_obs, "reset observations")
            assert_infos_equal(infos, their_infos, "reset")
            rng = np.random.default_rng(seed)
            for t in range(steps):
                actions = sample_actions(rng, ours.num_envs)
                if t % 2:
                    ours.step_async(actions)
                    results = ours.step_wait()
                else:
                    results = ours.step(actions)
                their_results = theirs.step(actions)
                names = ("obs", "rewards", "terminations", "truncations")
                for name, value, their_value in zip(names, results, their_results):
                    if num_cpus >= 2 and name in ("terminations", "truncations"):  # SuperSuit's processes: bool
                        value, their_value = value.astype(np.uint8), their_value.astype(np.uint8)
                    assert_same(value, their_value, f"step {t}: {name}")
                assert_infos_equal(results[4], their_results[4], f"step {t}")
                ends += int(sum("terminal_observation" in info for info in results[4]))
    finally:
        theirs.close()
    return ends


def discrete(n):
    return lambda rng, size: rng.integers(0, n, size)


def continuous(rng, size):
    return rng.uniform(-1, 1, (size, 4)).astype(np.float32)


@pytest.mark.parametrize("num_cpus", [0, 1])
def test_equals_supersuit_on_mpe2_simple_spread(num_cpus):
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")
    options = {"start_method": "fork"} if num_cpus else {}
    ends = run_both(simple_spread_v3.parallel_env(N=3, max_cycles=7), 2, 20, 5, discrete(5), num_cpus, **options)
    assert ends == 2 * 2 * 3


def test_equals_supersuit_with_agent_infos_and_reset_infos_merged():
    # infos every third step, reset infos ({"start": 0}) merged into the infos of the step that ended a copy
    assert run_both(DyingAgentsEnv(n_agents=3, max_steps=4), 3, 10, 1, discrete(3)) == 2 * 3 * 3


def test_reset_options_reach_every_copy_as_supersuits():
    theirs = supersuit_concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(DyingAgentsEnv(n_agents=2)), 2)
    with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2), 2, num_cpus=0) as ours:
        _, infos = ours.reset(seed=0, options={"start": 7})
    assert infos == theirs.reset(seed=0, options={"start": 7})[1] == [{"start": 7}] * 4


def test_pursuit_with_another_seed_on_one_side_differs():
    pursuit_v5 = pytest.importorskip("pettingzoo.sisl.pursuit_v5")
    with pytest.raises(AssertionError):
        run_both(
            pursuit_v5.parallel_env(x_size=8, y_size=8, n_evaders=6, max_cycles=40), 2, 20, 7, discrete(5), their_seed=8
        )


def test_equals_supersuit_on_pursuit():
    pursuit_v5 = pytest.importorskip("pettingzoo.sisl.pursuit_v5")
    pytest.importorskip("pygame")
    par_env = pursuit_v5.parallel_env(x_size=8, y_size=8, n_evaders=6, max_cycles=40)
    assert run_both(par_env, 2, 100, 7, discrete(5)) == 2 * 2 * 8


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
@pytest.mark.parametrize("num_cpus", [0, 2])
def test_equals_supersuit_on_knights_archers_zombies_with_black_death(num_cpus):
    """KAZ as PettingZoo's tutorials wrap it (``black_death_v3``): knights die, archers score, copies end."""
    pytest.importorskip("pygame")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    par_env = knights_archers_zombies_v11.parallel_env(
        max_zombies=4, obs_method="vector", spawn_delay=2, max_cycles=140
    )
    options = {"start_method": "fork"} if num_cpus else {}
    ends = run_both(black_death_v3(par_env), 2, 300, 0, discrete(6), num_cpus, **options)
    assert ends >= 2 * 4


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
def test_equals_supersuit_on_multiwalker_with_black_death():
    pytest.importorskip("Box2D")
    pytest.importorskip("pygame")
    from pettingzoo.sisl import multiwalker_v9

    par_env = multiwalker_v9.parallel_env(n_walkers=3, terminate_on_fall=False, remove_on_fall=True, max_cycles=100)
    assert run_both(black_death_v3(par_env), 2, 150, 0, continuous) >= 2 * 3


def test_flags_are_bool_where_supersuit_runs_processes():
    # SuperSuit's ConcatVecEnv (num_cpus 0 or 1) returns uint8 flags; its processes (num_cpus >= 2), bool
    # (num_cpus beyond the copies counts as the copies: one copy is SuperSuit's in-process ConcatVecEnv)
    for copies, num_cpus, dtype in ((2, 0, np.uint8), (2, 1, np.uint8), (2, 2, np.bool_), (1, 2, np.uint8)):
        options = {"start_method": "fork"} if num_cpus else {}
        with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2), copies, num_cpus, **options) as ours:
            ours.reset(seed=0)
            _, rewards, terminations, truncations, _ = ours.step(np.zeros(2 * copies, np.int64))
        assert terminations.dtype == truncations.dtype == dtype and rewards.dtype == np.float32, num_cpus


def test_the_default_base_class_is_gymnasiums_and_the_others_are_what_supersuit_returns():
    markov = pettingzoo_env_to_vec_env_v1(DyingAgentsEnv(n_agents=2))
    with shmvec.concat_vec_envs_v1(markov, 3, num_cpus=0) as ours:
        assert isinstance(ours, ShmAgentConcatVecEnv) and ours.num_envs == 6 and ours.n_workers == 0
        assert ours.single_observation_space == ours.observation_space  # CleanRL's tutorial sets these itself
        assert ours.env_is_wrapped(object) == [False] * 6
    with pytest.raises(ValueError, match="stable_baselines3"):
        shmvec.concat_vec_envs_v1(markov, 3, base_class="stable_baselines")
    with pytest.raises(ValueError, match="gymnasium"):
        shmvec.concat_vec_envs_v1(markov, 3, base_class="sb3")
    with pytest.raises(TypeError, match="num_cpus"):
        shmvec.concat_vec_envs_v1(markov, 3, num_cpus=1.5)
    with pytest.raises(TypeError, match="same step"):
        shmvec.concat_vec_envs_v1(markov, 3, num_cpus=0, autoreset_mode="NextStep")


def test_renders_the_first_copy_and_calls_reach_each_copy():
    with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2, render_mode="rgb_array"), 2, num_cpus=0) as ours:
        ours.reset(seed=0)
        ours.step(np.zeros(4, np.int64))
        assert ours.render().shape == (4, 4, 3) and ours.render()[0, 0, 0] == 1
        assert ours.call("count", 2) == (2, 2, 2, 2) and ours.get_attr("max_steps") == (6,) * 4


def test_an_agent_that_leaves_gets_its_last_observation_and_a_zero_row_then():
    """Without black_death_v3 SuperSuit raises; shmvec's slot keeps its agent's flag, a zero row and ``mask``."""
    with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2, lifetimes=(2,), max_steps=4), 1, num_cpus=0) as ours:
        ours.reset(seed=0)
        assert ours.mask.tolist() == [True, True]
        ours.step(np.zeros(2, np.int64))
        obs, rewards, terminations, _, infos = ours.step(np.zeros(2, np.int64))
        assert terminations.tolist() == [1, 0] and "terminal_observation" in infos[0] and not obs[0].any()
        assert ours.mask.tolist() == [False, True]
        obs, rewards, terminations, _, infos = ours.step(np.zeros(2, np.int64))
        assert rewards[0] == 0 and terminations[0] == 1 and infos[0] == {} and not obs[0].any()
        obs, rewards, terminations, truncations, infos = ours.step(np.zeros(2, np.int64))  # the copy ends
        assert truncations.tolist() == [0, 1] and "terminal_observation" not in infos[0]
        assert "terminal_observation" in infos[1] and infos[1]["start"] == 0 and ours.mask.all()


def test_a_restarted_copy_ends_the_episode_of_each_of_its_slots(closing):
    """A worker killed mid-episode: its copy's slots return the reset, reward 0, truncated and
    ``shmvec_restarted``, so a loop does not bootstrap across the restart."""
    envs = closing(shmvec.concat_vec_envs_v1(PidAgentsEnv(n_agents=2, max_steps=50), 2, 2, on_worker_failure="restart"))
    actions = np.zeros(envs.num_envs, np.int64)
    _, rewards, terminations, truncations, infos = step_after_killing_copy_one(envs, actions)
    assert truncations.tolist() == [False, False, True, True] and not terminations.any()
    assert [info.get("shmvec_restarted", False) for info in infos] == [False, False, True, True]
    assert rewards[2:].tolist() == [0, 0] and not any("terminal_observation" in info for info in infos)
    _, _, terminations, truncations, _ = envs.step(actions)
    assert not (terminations | truncations).any()


@pytest.mark.parametrize(("lifetimes", "flag"), [((2, 2), 0), ((), 1)])
def test_an_agent_absent_from_the_episode_gets_its_copys_flag_when_the_copy_ends(lifetimes, flag):
    with shmvec.concat_vec_envs_v1(AbsentAgentEnv(n_agents=3, lifetimes=lifetimes, max_steps=2), 1, 0) as envs:
        envs.reset(seed=0)
        assert envs.mask.tolist() == [True, True, False]
        envs.step(np.zeros(3, np.int64))
        _, _, terminations, truncations, infos = envs.step(np.zeros(3, np.int64))
        assert (terminations, truncations)[flag].tolist() == [1, 1, 1] and not (terminations, truncations)[
            1 - flag
        ].any()
        assert "terminal_observation" not in infos[2]  # it was never observed


def test_a_reset_mask_is_refused_where_supersuit_would_reset_every_copy():
    with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2), 2, 0) as envs:
        with pytest.raises(ValueError, match="partial reset"):
            envs.reset(seed=0, options={"reset_mask": np.ones(4, bool)})


def test_infos_keys_that_are_no_agents_are_left_out_as_supersuit_leaves_them():
    class CommonInfoEnv(DyingAgentsEnv):
        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            return obs, rewards, terms, truncs, {**{a: {} for a in infos}, "common": np.ones(3)}

    assert run_both(CommonInfoEnv(n_agents=2, max_steps=3, infos=False), 2, 7, 0, discrete(3)) == 2 * 2 * 2


def test_async_batches_are_refused_with_where_to_find_them():
    with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2), 2, 0) as envs:
        for call in (lambda: envs.send(np.zeros(4, np.int64)), envs.recv, envs.async_reset):
            with pytest.raises(NotImplementedError, match="batch_size"):
                call()
        envs.reset(seed=0)  # still usable


def test_actions_of_another_shape_are_a_clear_error():
    with shmvec.concat_vec_envs_v1(DyingAgentsEnv(n_agents=2), 2, 0) as envs:
        envs.reset(seed=0)
        with pytest.raises(shmvec.InvalidActionError, match=r"shape \(4,\), one per agent slot .* got shape \(3,\)"):
            envs.step(np.zeros(3, np.int64))
        envs.step([0, 1, 2, 0])  # a list, as SuperSuit takes it
