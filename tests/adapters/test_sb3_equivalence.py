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
from gymnasium import spaces

from tests.envs import TAXI, TupleObsEnv, cartpole, make_image, make_info_types, make_mixed
from tests.helpers import assert_same
from tests.sb3_compare import make_pair, run_equivalence, sample_actions

STEPS = 300


def pendulum():
    return gym.make("Pendulum-v1", max_episode_steps=60)  # float32 Box actions, truncations


def taxi():
    return gym.make(TAXI, max_episode_steps=30)  # infos at every step: a float and an int8 array


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
    "info_types": (make_info_types, None, ("terminated", "truncated")),  # infos in shared rows or pickled
    "taxi": (taxi, None, ("truncated",)),
}
SHAPES = [(1, 1), (4, 1), (5, 2), (7, 3), (8, 8), (16, 2)]


def _check_run(name: str, n_envs: int, n_workers: int, closing, steps: int = STEPS, **shm_kwargs):
    make, options, expected_ends = ENVS[name]
    shm, dummy = make_pair([make] * n_envs, n_workers, closing, **shm_kwargs)
    assert shm.n_workers == n_workers
    counts = run_equivalence(shm, dummy, steps, seed=n_envs * 100 + n_workers, reset_options=options)
    for kind in expected_ends:  # the run must have exercised the auto-reset paths it claims to
        assert counts[kind] > 0, f"{name}: no {kind} episode end in {steps} steps: {counts}"


@pytest.mark.parametrize("n_envs,n_workers", SHAPES, ids=[f"N{n}K{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", ["cartpole", "pendulum", "mixed", "tuple", "acrobot", "info_types", "taxi"])
def test_equivalent_to_dummy(name, n_envs, n_workers, closing):
    _check_run(name, n_envs, n_workers, closing)


@pytest.mark.parametrize("n_workers", [1, 2, 3, 4, 5])
def test_every_worker_count_mixed_dict_obs(n_workers, closing):
    _check_run("mixed", 5, n_workers, closing)


MAIN_CASES = [
    (name, n, k)
    for n, k in [(1, 0), (3, 0), (5, 1), (7, 2), (16, 1)]
    for name in ["cartpole", "pendulum", "mixed", "tuple", "acrobot", "info_types"]
    if n not in (3, 7) or name in ("cartpole", "mixed", "info_types")  # the rest is covered by the other shapes
]


@pytest.mark.parametrize(
    "name,n_envs,n_workers",
    MAIN_CASES,
    ids=[f"{c}-N{n}K{k}+main" for c, n, k in MAIN_CASES],
)
def test_equivalent_with_main_shard(name, n_envs, n_workers, closing):
    """``use_main_process=True``: the main process steps the last shard itself, with the same results."""
    _check_run(name, n_envs, n_workers, closing, use_main_process=True)


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
    assert_same(
        starts[2],
        first_starts[2],
        "same seed, no options: same start as the first reset",
    )
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
    """int32 actions for a Discrete (int64) space reach the envs as int32, as DummyVecEnv passes them."""
    shm, dummy = make_pair([cartpole] * 4, 3, closing)
    for venv in (shm, dummy):
        venv.seed(3)
        venv.reset()
    space = dummy.action_space
    space.seed(3)
    for step in range(40):
        actions = sample_actions(space, 4)
        got = shm.step(actions.astype(np.int32))
        want = dummy.step(actions.astype(np.int32))
        assert_same(got[0], want[0], f"step {step} obs")
        assert_same(got[3], want[3], f"step {step} infos")


def frozen_lake():
    return gym.make("FrozenLake-v1", map_name="4x4", is_slippery=True, max_episode_steps=6)


def test_discrete_observations_frozen_lake(closing):
    """A flat Discrete observation space: int64 obs of shape (N,), terminations and truncations."""
    shm, dummy = make_pair([frozen_lake] * 6, 4, closing)
    assert shm.reset().dtype == np.int64
    counts = run_equivalence(shm, dummy, 300, seed=9)
    assert counts["terminated"] > 0 and counts["truncated"] > 0, counts


class MultiActionEnv(gym.Env):
    """MultiDiscrete or MultiBinary actions (integer arrays) and float64 Box observations."""

    def __init__(self, binary: bool = False):
        self.action_space = spaces.MultiBinary(3) if binary else spaces.MultiDiscrete([2, 3, 4])
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.normal(size=3)
        return self.x.copy(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.x = self.x + np.asarray(action, dtype=np.float64) - 1.0 + self.np_random.normal(size=3)
        return (
            self.x.copy(),
            float(np.sum(action)),
            bool(np.abs(self.x).max() > 5),
            False,
            {},
        )


@pytest.mark.parametrize("binary", [False, True], ids=["MultiDiscrete", "MultiBinary"])
def test_multi_discrete_and_multi_binary_actions(binary, closing):
    shm, dummy = make_pair([lambda: MultiActionEnv(binary)] * 5, 2, closing)
    assert shm.reset().dtype == np.float64
    assert run_equivalence(shm, dummy, 200, seed=10)["terminated"] > 0


class InPlaceObsEnv(gym.Env):
    """Returns its own state array, updated in place (some envs do), as the observation.

    DummyVecEnv returns deep copies of the infos; whatever a vec env returned must not
    change afterwards, terminal observations included.
    """

    observation_space = spaces.Box(-1000, 1000, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self):
        self.state = np.zeros(2, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state[:] = self.np_random.integers(0, 5, 2)
        self.t = 0
        return self.state, {"start": self.state.copy()}

    def step(self, action):
        self.t += 1
        self.state += int(action) + 1
        return self.state, 1.0, self.t % 4 == 0, False, {"t": self.t}


def test_envs_returning_live_buffers(closing):
    shm, dummy = make_pair([InPlaceObsEnv] * 3, 2, closing)
    assert run_equivalence(shm, dummy, 60, seed=11)["terminated"] > 0


def test_envs_returning_live_buffers_main_shard(closing):
    shm, dummy = make_pair([InPlaceObsEnv] * 3, 1, closing, use_main_process=True)
    run_equivalence(shm, dummy, 60, seed=11)
