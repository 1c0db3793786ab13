"""ShmAgentVectorEnv against PettingZoo's envs stepped directly here, copy by copy, flattened to
slots (slot ``c * A + a``) with Gymnasium's three autoreset modes applied per copy: same seeds and
actions, bit-identical observations, rewards, flags, masks and infos."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import VectorEnv

pytest.importorskip("pettingzoo")

from shmvec import ShmAgentVectorEnv  # noqa: E402
from shmvec.adapters.agent_slots import slots_env_fns  # noqa: E402
from shmvec.errors import InvalidActionError, ResetNeededError, SpaceMismatchError  # noqa: E402
from shmvec.gymnasium_1_1 import AutoresetMode
from tests.agent_envs import (  # noqa: E402
    AbsentAgentEnv,
    DyingAgentsEnv,
    MixedSpacesEnv,
    PidAgentsEnv,
    step_after_killing_copy_one,
)
from tests.helpers import kill_and_wait  # noqa: E402

pytestmark = pytest.mark.vector_api  # ShmAgentVectorEnv: Gymnasium 1.1 on (tests/conftest.py)


class RowInfos:
    """Gymnasium's own ``_add_info`` over ``num_envs`` rows."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs):
        self.num_envs = num_envs


class Reference:
    """``n_copies`` PettingZoo envs stepped in this process; each slot as its agent, each copy's
    episode ending when none of its agents is left undone, and then reset as ``mode`` says."""

    def __init__(self, make, n_copies, mode):
        self.envs = [make() for _ in range(n_copies)]
        self.agents = list(self.envs[0].possible_agents)
        space = self.envs[0].observation_space(self.agents[0])
        self.obs_shape, self.obs_dtype = space.shape, space.dtype
        self.mode, self.A = mode, len(self.agents)
        self.pending_reset = [False] * n_copies
        self.done = [None] * n_copies  # per copy: (terminated, truncated) of its agents, kept once set

    def _rows(self, observations):
        rows = np.zeros((self.A, *self.obs_shape), self.obs_dtype)
        for i, agent in enumerate(self.agents):
            if agent in observations:
                rows[i] = observations[agent]
        return rows

    def _live(self, c):
        return np.array([agent in self.envs[c].agents for agent in self.agents])

    def reset_copy(self, c, seed):
        observations, infos = self.envs[c].reset(seed=seed)
        self.done[c] = (np.zeros(self.A, bool), np.zeros(self.A, bool))
        self.pending_reset[c] = False
        slot_infos = [dict(infos.get(agent) or {}) for agent in self.agents]
        zeros = np.zeros(self.A, bool)
        return self._rows(observations), np.zeros(self.A), zeros, zeros, self._live(c), slot_infos

    def step_copy(self, c, actions):
        if self.pending_reset[c]:  # NEXT_STEP: this step resets the copy, its actions ignored
            return self.reset_copy(c, None)
        env = self.envs[c]
        was = self._live(c) & ~(self.done[c][0] | self.done[c][1])
        act = {agent: actions[i] for i, agent in enumerate(self.agents) if agent in env.agents}
        observations, rewards, terms, truncs, infos = env.step(act)
        terminated, truncated = self.done[c][0].copy(), self.done[c][1].copy()
        reward_row = np.zeros(self.A)
        for i, agent in enumerate(self.agents):
            reward_row[i] = rewards.get(agent, 0.0)  # float64: the env's reward exactly, as SyncVectorEnv's
            terminated[i] |= bool(terms.get(agent, False))
            truncated[i] |= bool(truncs.get(agent, False))
        live = self._live(c)
        terminated |= was & ~live & ~truncated  # left without a flag: terminated
        mask = live & ~(terminated | truncated)
        self.done[c] = (terminated, truncated)
        rows = self._rows(observations)
        slot_infos = [dict(infos.get(agent) or {}) for agent in self.agents]
        if mask.any():  # the copy goes on: agents that left get zeros, their last row in final_obs
            for i in np.flatnonzero(was & ~mask):
                slot_infos[i] = {"final_obs": rows[i].copy(), "final_info": dict(slot_infos[i]), **slot_infos[i]}
            rows[~mask] = 0
            return rows, reward_row, terminated, truncated, mask, slot_infos
        if self.mode == AutoresetMode.SAME_STEP:
            reset_rows, _, _, _, mask, reset_infos = self.reset_copy(c, None)
            slot_infos = [{"final_obs": rows[i], "final_info": slot_infos[i], **reset_infos[i]} for i in range(self.A)]
            return reset_rows, reward_row, terminated, truncated, mask, slot_infos
        self.pending_reset[c] = self.mode == AutoresetMode.NEXT_STEP
        return rows, reward_row, terminated, truncated, mask, slot_infos

    def batch(self, results, copies=None, n_copies=None):
        """Copy results as slot rows and Gymnasium infos (with ``mask``); with ``copies`` (the copies of
        ``results``), infos over the slots of ``n_copies``, as a masked reset gives them."""
        obs, rewards, terminated, truncated, mask, slot_infos = (list(x) for x in zip(*results))
        copies = range(len(results)) if copies is None else copies
        n = (n_copies or len(results)) * self.A
        infos, add = {}, RowInfos(n)._add_info
        for c, copy_infos in zip(copies, slot_infos):
            for a, info in enumerate(copy_infos):
                if info:
                    infos = add(infos, info, c * self.A + a)
        infos["mask"], infos["_mask"] = np.concatenate(mask), np.ones(len(results) * self.A, bool)
        flat = (np.concatenate(obs), np.concatenate(rewards), np.concatenate(terminated), np.concatenate(truncated))
        return (*flat, infos)

    def reset(self, seed, copies, n_copies):
        results = [self.reset_copy(c, seed + c if seed is not None else None) for c in copies]
        obs, *_, infos = self.batch(results, copies, n_copies)
        return obs, infos

    def step(self, actions, copies):
        return self.batch([self.step_copy(c, actions[k * self.A : (k + 1) * self.A]) for k, c in enumerate(copies)])


def assert_same(ours, theirs, where):
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), f"{where}: {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, np.ndarray) and theirs.dtype == object:
        assert ours.dtype == object and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{where}[{i}]")
    elif theirs is None:
        assert ours is None, where
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=where, strict=True)


def assert_results_equal(ours, theirs, where):
    names = ("obs", "rewards", "terminations", "truncations", "infos") if len(ours) == 5 else ("obs", "infos")
    for name, a, b in zip(names, ours, theirs):
        assert_same(a, b, f"{where} {name}")


def simple_spread():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3, max_cycles=9)


class RandomLifetimes(DyingAgentsEnv):
    """Agents leave after a random number of steps each episode, so copies end out of step."""

    def reset(self, seed=None, options=None):
        observations, infos = super().reset(seed=seed, options=options)
        self.lifetimes = dict(zip(self.possible_agents[:-1], self.rng.integers(1, 7, self.num_agents - 1).tolist()))
        self.max_steps = int(self.rng.integers(3, 8))
        return observations, infos


def dying_agents():
    return RandomLifetimes(n_agents=3, max_steps=7)


ENVS = {"simple_spread": (simple_spread, 5), "dying_agents": (dying_agents, 3)}


def run_both(make, n_actions, mode, n_workers, steps, n_copies=2, seed=3):
    """Step both with the same seeds and random actions; the number of copy episodes that ended."""
    reference = Reference(make, n_copies, mode)
    everyone = list(range(n_copies))
    ends = 0
    with ShmAgentVectorEnv(make(), n_copies, n_workers=n_workers, autoreset_mode=mode) as ours:
        assert_results_equal(ours.reset(seed=seed), reference.reset(seed, everyone, n_copies), "reset")
        rng = np.random.default_rng(seed)
        for t in range(steps):
            actions = rng.integers(0, n_actions, ours.num_envs)
            theirs = reference.step(actions, everyone)
            results = ours.step(actions)
            assert_results_equal(results, theirs, f"step {t}")
            ended = ~results[-1]["mask"].reshape(n_copies, -1).any(axis=1)  # no agent left to act
            if mode == AutoresetMode.SAME_STEP:
                ended = (results[2] | results[3]).reshape(n_copies, -1).all(axis=1)
            ends += int(ended.sum())
            if mode == AutoresetMode.DISABLED and ended.any():
                with pytest.raises(ResetNeededError, match=r"episodes of copies \[.*\] \(slots \["):
                    ours.step(actions)
                # terminations | truncations: a copy resets only where all its slots are set, i.e. it ended
                reset_mask = results[2] | results[3]
                copies = np.flatnonzero(ended).tolist()
                their_obs, their_infos = reference.reset(None, copies, n_copies)
                obs, infos = ours.reset(options={"reset_mask": reset_mask})
                slots = np.concatenate([np.arange(c * reference.A, (c + 1) * reference.A) for c in copies])
                np.testing.assert_array_equal(obs[slots], their_obs, strict=True)
                np.testing.assert_array_equal(infos.pop("mask")[slots], their_infos.pop("mask"), strict=True)
                infos.pop("_mask"), their_infos.pop("_mask")
                assert_same(infos, their_infos, f"reset infos after step {t}")
    return ends


@pytest.mark.parametrize("n_workers", [0, 1])
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
@pytest.mark.parametrize("env", sorted(ENVS))
def test_equals_the_envs_stepped_directly(env, mode, n_workers):
    make, n_actions = ENVS[env]
    ends = run_both(make, n_actions, mode, n_workers, steps=200)
    assert ends >= 2 * 20  # every copy ran through many episodes (and, here, agent deaths)


def test_spaces_and_slot_order():
    with ShmAgentVectorEnv(simple_spread(), 4, n_workers=0) as envs:
        assert envs.num_envs == 12 and envs.num_copies == 4 and envs.num_agents == 3
        assert envs.single_observation_space.shape == (18,) and envs.observation_space.shape == (12, 18)
        assert envs.single_action_space.n == 5 and envs.action_space.shape == (12,)
        assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (12, 18) and not np.array_equal(obs[:3], obs[3:6])  # copies seeded 0, 1, ...
        with pytest.raises(InvalidActionError, match=r"4 copies x 3 agents = 12"):
            envs.step(np.zeros(4, np.int64))


def test_agents_with_different_spaces_are_a_clear_error():
    with pytest.raises(SpaceMismatchError, match="pad_observations_v0"):
        ShmAgentVectorEnv(MixedSpacesEnv(n_agents=2), 2, n_workers=1)


@pytest.mark.parametrize(("observation_mode", "n_workers"), [("same", 0), ("different", 0), ("different", 1)])
def test_a_factory_whose_agents_differ_gets_the_padding_advice_not_observation_modes(observation_mode, n_workers):
    """Found where the factory runs, the agents' mismatch is not the envs' that observation_mode is for."""
    with pytest.raises(SpaceMismatchError, match="pad_observations_v0"):
        ShmAgentVectorEnv(MixedSpacesEnv, 2, n_workers=n_workers, observation_mode=observation_mode)


def test_calls_by_slot_and_close_twice():
    envs = ShmAgentVectorEnv(DyingAgentsEnv(n_agents=2, max_steps=5), 3, n_workers=1)
    try:
        envs.reset(seed=0)
        envs.step(np.ones(6, np.int64))
        assert envs.call("count", 2) == (2,) * 6  # once per copy, its result in each of its slots
        assert envs.get_attr("episodes") == (1,) * 6
        envs.set_attr("max_steps", [1, 1, 2, 2, 9, 9])  # one per slot: each copy takes its first slot's
        assert envs.get_attr("max_steps") == (1, 1, 2, 2, 9, 9)
        assert len(envs.render()) == 3  # once per copy
        with pytest.raises(ValueError, match="slots of a copy share its seed"):
            envs.reset(seed=[0, 1, 2, 3, 4, 5])
        assert envs.reset(seed=[7, 7, 8, 8, 9, 9])[0].shape == (6, 4)
        with pytest.raises(ValueError, match="names no whole copy"):  # a copy resets when all its slots are set
            envs.reset(options={"reset_mask": np.array([True, False, False, True, False, False])})
    finally:
        envs.close()
        envs.close()
    assert envs.closed


def test_unseeded_copies_of_one_instance_play_different_episodes():
    with ShmAgentVectorEnv(DyingAgentsEnv(n_agents=2), 2, n_workers=0) as envs:
        obs, _ = envs.reset()
    assert not np.array_equal(obs[:2], obs[2:])


class SeedsSeen(DyingAgentsEnv):
    """Records the seed of each reset."""

    def reset(self, seed=None, options=None):
        self.seeds_seen = [*getattr(self, "seeds_seen", []), seed]
        return super().reset(seed=seed, options=options)


def test_only_a_copy_of_an_instance_draws_a_seed_for_its_first_unseeded_reset():
    """A copy rebuilt from the instance's pickle (a restart) has its random state: unseeded, it
    would replay its first life; a factory's env is fresh, so it gets seed=None as given."""
    [copy_fn], _ = slots_env_fns(SeedsSeen(n_agents=2), 1)
    [factory_fn], _ = slots_env_fns(lambda: SeedsSeen(n_agents=2), 1)
    lives = [copy_fn(), copy_fn()]
    first, second = (life.reset()[0]["obs"] for life in lives)
    assert not np.array_equal(first, second)
    made = factory_fn()
    made.reset()
    for env in (lives[0], made):
        env.reset()
        env.reset(seed=7)
    assert lives[0].par_env.seeds_seen[0] is not None and lives[0].par_env.seeds_seen[1:] == [None, 7]
    assert made.par_env.seeds_seen == [None, None, 7]


def test_restarted_copies_play_their_own_episodes(closing):
    """Restarted copies of one instance (rebuilt from its pickle, reset unseeded) differ from each
    other and from the copy's previous life."""
    envs = closing(
        ShmAgentVectorEnv(PidAgentsEnv(n_agents=2, max_steps=50), 2, n_workers=2, on_worker_failure="restart")
    )
    actions = np.zeros(envs.num_envs, np.int64)
    envs.reset(seed=0)
    envs.step(actions)
    pids = envs.call("pid")
    kill_and_wait(pids[0])
    kill_and_wait(pids[2])
    with pytest.warns(RuntimeWarning, match="restarting"):
        obs, _, _, truncations, _ = envs.step(actions)  # both copies restarted: their reset observations
    assert truncations.all()
    assert not np.array_equal(obs[:2], obs[2:])
    kill_and_wait(envs.call("pid")[2])
    with pytest.warns(RuntimeWarning, match="restarting"):
        again, _, _, truncations, _ = envs.step(actions)  # copy 1's third life
    assert truncations.tolist() == [False, False, True, True]
    assert not np.array_equal(again[2:], obs[2:])


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED], ids=lambda m: m.name)
def test_async_batches_of_copies_equal_the_reference(mode):
    """batch_size=1: each recv returns one copy's slots, whichever finished first; each equals the
    reference's step of that copy."""
    n_copies, A, rounds = 3, 3, 60
    reference = Reference(dying_agents, n_copies, mode)
    rng = np.random.default_rng(0)
    with ShmAgentVectorEnv(dying_agents(), n_copies, n_workers=2, autoreset_mode=mode, batch_size=1) as envs:
        envs.async_reset(seed=4)
        expected = {c: reference.batch([reference.reset_copy(c, 4 + c)]) for c in range(n_copies)}
        for t in range(rounds):
            results = envs.recv()
            slots = results[-1].pop("env_id")
            copy = int(slots[0]) // A
            np.testing.assert_array_equal(slots, np.arange(copy * A, (copy + 1) * A))
            assert_results_equal(results, expected.pop(copy), f"round {t}, copy {copy}")
            if mode == AutoresetMode.DISABLED and not results[-1]["mask"].any():  # the copy ended
                with pytest.raises(ResetNeededError):
                    envs.send(np.ones(A, np.int64))
                envs.async_reset(options={"reset_mask": np.repeat(np.arange(n_copies) == copy, A)})
                expected[copy] = reference.batch([reference.reset_copy(copy, None)])
                continue
            actions = rng.integers(0, 3, A)
            envs.send(actions, slots)
            expected[copy] = reference.batch([reference.step_copy(copy, actions)])
        for _ in range(len(expected)):  # drain what is still in flight before closing
            envs.recv()


MODES = pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)


@MODES
def test_a_restarted_copy_ends_the_episode_of_each_of_its_slots(closing, mode):
    """A worker killed mid-episode: its copy's slots report truncated (the copy's own flag), so a
    learner does not bootstrap across the restart and DISABLED's reset recipe resets the copy."""
    envs = closing(
        ShmAgentVectorEnv(
            PidAgentsEnv(n_agents=2, max_steps=50), 2, n_workers=2, autoreset_mode=mode, on_worker_failure="restart"
        )
    )
    actions = np.zeros(envs.num_envs, np.int64)
    _, rewards, terminations, truncations, infos = step_after_killing_copy_one(envs, actions)
    assert infos["_shmvec_restarted"].tolist() == [False, False, True, True]
    assert truncations.tolist() == [False, False, True, True] and not terminations.any()
    if mode is AutoresetMode.DISABLED:
        with pytest.raises(ResetNeededError, match=r"copies \[1\]"):
            envs.step(actions)
        _, infos = envs.reset(options={"reset_mask": terminations | truncations})
        assert infos["mask"].all()
    _, _, terminations, truncations, _ = envs.step(actions)
    assert not (terminations | truncations).any()


@MODES
@pytest.mark.parametrize(("lifetimes", "flag"), [((2, 2), "terminated"), ((), "truncated")])
def test_an_agent_absent_from_the_episode_gets_its_copys_flag_when_the_copy_ends(mode, lifetimes, flag):
    """The last agent is never in the episode: when the others all end, its slot is flagged too
    (terminated when they all terminated, else truncated), so terminations | truncations covers
    whole copies and DISABLED's reset recipe resets them."""
    env = AbsentAgentEnv(n_agents=3, lifetimes=lifetimes, max_steps=2)
    with ShmAgentVectorEnv(env, 2, n_workers=0, autoreset_mode=mode) as envs:
        actions = np.zeros(envs.num_envs, np.int64)
        _, infos = envs.reset(seed=0)
        assert infos["mask"].tolist() == [True, True, False] * 2
        _, _, terminations, truncations, _ = envs.step(actions)
        assert not (terminations | truncations).any()  # mid-episode an absent agent has no flag
        _, _, terminations, truncations, infos = envs.step(actions)  # every agent in it ends: the copies end
        flagged, other = (terminations, truncations) if flag == "terminated" else (truncations, terminations)
        assert flagged.all() and not other.any()
        if mode is AutoresetMode.DISABLED:
            _, infos = envs.reset(options={"reset_mask": terminations | truncations})
            assert infos["mask"].tolist() == [True, True, False] * 2
        _, _, terminations, truncations, _ = envs.step(actions)
        assert not (terminations | truncations).any()


def test_the_first_unseeded_reset_leaves_the_callers_global_rng_alone():
    state = np.random.get_state()
    try:
        np.random.seed(0)
        expected = np.random.random()
        np.random.seed(0)
        with ShmAgentVectorEnv(DyingAgentsEnv(n_agents=2), 2, n_workers=0) as envs:
            envs.reset()
        assert np.random.random() == expected
    finally:
        np.random.set_state(state)


def test_bad_slot_ids_seeds_and_action_shapes_are_clear_errors():
    with ShmAgentVectorEnv(DyingAgentsEnv(n_agents=3), 4, n_workers=0) as envs:
        envs.reset(seed=0)
        for env_ids in ([12, 13, 14], [-3, -2, -1]):
            with pytest.raises(IndexError, match=r"slots .*num_envs=12"):
                envs.send(np.zeros(3, np.int64), env_ids=env_ids)
        with pytest.raises(TypeError, match=r"seed must be None, an int or one seed per agent slot .*got bool True"):
            envs.reset(seed=True)
        with pytest.raises(InvalidActionError, match=r"shape \(12,\), one per agent slot .*got shape \(12, 1\)"):
            envs.step(np.zeros((12, 1), np.int64))
        envs.step(np.zeros(12, np.int64))  # nothing above changed the envs
