"""ShmPoolVecEnv returns exactly what DummyVecEnv returns, bit for bit.

Same seeds, same actions: observations (dtype, shape, values), float32 rewards, dones,
infos entry by entry (``terminal_observation``, ``TimeLimit.truncated``) and
``reset_infos`` after every step, for several (N, K) including uneven shards, every
n_workers from 1 to N for a small N, and every start method.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from envs import TupleObsEnv, make_image, make_mixed
from sb3_compare import assert_same, make_pair, run_equivalence, sample_actions

STEPS = 300


def cartpole():
    return gym.make("CartPole-v1")


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=60)  # float32 Box actions, truncations


def acrobot():
    return gym.make("Acrobot-v1", max_episode_steps=40)  # time-limit truncations


# name -> (env factory, reset options honoured by the env, which episode ends must occur in STEPS)
ENVS = {
    "cartpole": (cartpole, {"low": -0.2, "high": 0.2}, ("terminated",)),
    "pendulum": (pendulum, {"x_init": 0.5, "y_init": 0.5}, ("truncated",)),
    "mixed": (make_mixed, {"scale": 0.9}, ("terminated", "truncated")),
    "tuple": (TupleObsEnv, None, ("terminated",)),
    "acrobot": (acrobot, {"low": -0.2, "high": 0.2}, ("truncated",)),
    "image": (make_image, None, ("terminated", "truncated")),
}
SHAPES = [(1, 1), (4, 1), (5, 2), (7, 3), (8, 8), (16, 2)]


def _check_run(name: str, n_envs: int, n_workers: int, closing, steps: int = STEPS, start_method: str = "fork"):
    make, options, expected_ends = ENVS[name]
    shm, dummy = make_pair([make] * n_envs, n_workers, closing, start_method=start_method)
    assert shm.n_workers == n_workers
    counts = run_equivalence(shm, dummy, steps, seed=n_envs * 100 + n_workers, reset_options=options)
    for kind in expected_ends:  # the run must have exercised the auto-reset paths it claims to
        assert counts[kind] > 0, f"{name}: no {kind} episode end in {steps} steps: {counts}"


@pytest.mark.parametrize("n_envs,n_workers", SHAPES, ids=[f"N{n}K{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", ["cartpole", "pendulum", "mixed", "tuple", "acrobot"])
def test_equivalent_to_dummy(name, n_envs, n_workers, closing):
    _check_run(name, n_envs, n_workers, closing)


@pytest.mark.parametrize("n_workers", [1, 2, 3, 4, 5])
def test_every_worker_count_mixed_dict_obs(n_workers, closing):
    _check_run("mixed", 5, n_workers, closing)


def test_equivalent_image_obs(closing):
    _check_run("image", 6, 4, closing)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_start_methods_with_lambdas_and_closures(start_method, closing):
    limit = 20  # captured by the closures below, shipped by value (cloudpickle)

    def closure_env():
        return make_mixed(max_episode_steps=limit)

    env_fns = [closure_env, lambda: make_mixed(max_episode_steps=limit), closure_env]
    shm, dummy = make_pair(env_fns, 2, closing, start_method=start_method)
    counts = run_equivalence(shm, dummy, 80, seed=7, reset_options={"scale": 0.5})
    assert counts["truncated"] > 0, counts
    assert shm.get_attr("_max_episode_steps") == [limit] * 3


def test_seed_and_options_act_at_next_reset_only(closing):
    n = 4
    shm, dummy = make_pair([make_mixed] * n, 2, closing)
    for venv in (shm, dummy):
        venv.seed(5)
    first = shm.reset()
    assert_same(first, dummy.reset(), "seeded reset")
    assert_same(shm.reset_infos, dummy.reset_infos, "seeded reset_infos")
    first_starts = [info["start"].copy() for info in shm.reset_infos]

    # Set between steps: nothing changes until reset() ...
    actions = np.zeros((n, 3), dtype=np.float32)
    for venv in (shm, dummy):
        venv.seed(5)
        venv.set_options([{"scale": 0.0}, {"scale": 5.0}, {}, {"scale": 5.0}])
    out = shm.step(actions)
    assert_same(out[0], dummy.step(actions)[0], "step after seed/set_options")

    # ... then the same seeds replay the first reset's random draws, under the new options.
    obs = shm.reset()
    assert_same(obs, dummy.reset(), "reset with seeds and options")
    assert_same(shm.reset_infos, dummy.reset_infos, "reset_infos with options")
    starts = [info["start"] for info in shm.reset_infos]
    assert np.all(starts[0] == 0.0)  # scale 0 -> uniform(-0, 0)
    assert np.abs(starts[1]).max() > 0.1  # scale 5 took effect
    assert_same(starts[2], first_starts[2], "same seed, no options: same start as the first reset")
    assert_same(obs["image"], first["image"], "same seeds replay the same images")

    # Seeds and options are used once: the next reset is unseeded and uses default options.
    obs = shm.reset()
    dummy.reset()
    assert all(np.abs(info["start"]).max() <= 0.1 for info in shm.reset_infos)
    assert not np.array_equal(obs["image"], first["image"])


def test_seed_none_draws_distinct_seeds(closing):
    shm, _ = make_pair([cartpole] * 3, 2, closing)
    seeds = shm.seed()
    assert len(seeds) == 3 and seeds[1] == seeds[0] + 1 and seeds[2] == seeds[0] + 2
    obs = shm.reset()
    assert len({tuple(row) for row in obs.tolist()}) == 3


def test_list_actions_accepted_like_dummy(closing):
    """SB3 users sometimes pass Python lists; DummyVecEnv indexes them, so must we accept them."""
    shm, dummy = make_pair([cartpole] * 3, 2, closing)
    for venv in (shm, dummy):
        venv.seed(1)
        venv.reset()
    for step in range(30):
        actions = [step % 2, 1, 0]
        got, want = shm.step(actions), dummy.step(actions)
        assert_same(got[0], want[0], f"step {step} obs")
        assert_same(got[2], want[2], f"step {step} dones")


def test_python_int_and_numpy_scalar_action_arrays(closing):
    """int32 actions for a Discrete (int64) space are converted, results unchanged."""
    shm, dummy = make_pair([cartpole] * 4, 3, closing)
    for venv in (shm, dummy):
        venv.seed(3)
        venv.reset()
    space = dummy.action_space
    space.seed(3)
    for step in range(40):
        actions = sample_actions(space, 4)
        got = shm.step(actions.astype(np.int32))
        want = dummy.step(actions)
        assert_same(got[0], want[0], f"step {step} obs")
        assert_same(got[3], want[3], f"step {step} infos")
