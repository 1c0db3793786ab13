"""The rare calls that algorithms make every step (HER's ``compute_reward``, MaskablePPO's
``action_masks``) give exactly DummyVecEnv's results, in every layout, and touch only the
workers of the envs they name."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tests.goal_envs import GoalReach, MaskedWalk, her_call_args
from tests.helpers import assert_same
from tests.sb3_compare import make_pair

LAYOUTS = {"main_shard": (0, {"use_main_process": True}), "k1": (1, {}), "k2": (2, {}), "k4": (4, {})}


def goal_pair(closing, layout: str, **kwargs):
    n_workers, extra = LAYOUTS[layout]
    shm, dummy = make_pair([GoalReach] * 4, n_workers, closing, **extra, **kwargs)
    assert shm._pool.n_workers == n_workers
    return shm, dummy


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_her_compute_reward_matches_dummy(layout, closing):
    shm, dummy = goal_pair(closing, layout)
    rng = np.random.default_rng(0)
    for venv in (shm, dummy):
        venv.seed(3)
        venv.reset()
    for step in range(5):
        actions = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
        assert_same(shm.step(actions)[:3], dummy.step(actions)[:3], f"step {step}")
        args = her_call_args(rng)
        for indices in ([0], [3], None):  # HER asks env 0; each env answers with its own threshold
            got = shm.env_method("compute_reward", *args, indices=indices)
            want = dummy.env_method("compute_reward", *args, indices=indices)
            assert_same(got, want, f"step {step}, indices {indices}")
    assert len({float(r.sum()) for r in got}) > 1, "the envs' thresholds should tell them apart"
    assert shm.env_method("count_calls") == dummy.env_method("count_calls")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_action_masks_match_dummy(layout, closing):
    n_workers, extra = LAYOUTS[layout]
    shm, dummy = make_pair([MaskedWalk] * 4, n_workers, closing, **extra)
    for venv in (shm, dummy):
        venv.seed(5)
        venv.reset()
    rng = np.random.default_rng(1)
    for step in range(30):
        masks = shm.env_method("action_masks")
        assert_same(masks, dummy.env_method("action_masks"), f"step {step} masks")
        actions = np.array([rng.choice(np.flatnonzero(mask)) for mask in masks])
        assert_same(shm.step(actions), dummy.step(actions), f"step {step}")
    assert_same(shm.get_attr("position"), dummy.get_attr("position"))


def test_a_call_on_one_env_reaches_only_its_worker(closing):
    shm, dummy = goal_pair(closing, "k4")
    shm.reset()
    pool = shm._pool
    for i in range(4):
        seqs = [link.seq for link in pool.links]
        shm.env_method("compute_reward", *her_call_args(np.random.default_rng(i)), indices=[i])
        shm.get_attr("threshold", indices=[i])
        shm.set_attr("max_steps", 30, indices=[i])
        assert [link.seq - seq for link, seq in zip(pool.links, seqs)] == [3 if k == i else 0 for k in range(4)]
    assert shm.env_method("count_calls") == [1, 1, 1, 1]


def test_the_main_process_spins_for_a_reply_as_for_a_step(closing):
    """A reply comes soon: its wait spins for the plan's main_spin, whatever the steps' waits learned."""
    shm, _ = goal_pair(closing, "k1")
    shm.reset()
    done = shm._pool.links[0].done
    spins = []
    wait = done.wait
    done.wait = lambda timeout, spin=None: spins.append(spin) or wait(timeout, spin)
    shm.env_method("compute_reward", *her_call_args(np.random.default_rng(0)), indices=[0])
    assert spins and spins[0] == done.max_spin > 0.0


class Goal:
    """A goal object whose class the workers cannot import by name (it claims to be the main script's)."""

    def __init__(self, xyz):
        self.xyz = np.asarray(xyz, np.float64)

    def __eq__(self, other):
        return type(other).__name__ == "Goal" and np.array_equal(self.xyz, other.xyz)


def test_an_argument_of_the_main_scripts_class_reaches_the_workers(closing, monkeypatch):
    """pickle would name ``__main__.Goal``, which a worker started without the script cannot find:
    such an argument goes by cloudpickle, by value."""
    monkeypatch.setattr(Goal, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "Goal", Goal, raising=False)
    shm, _ = goal_pair(closing, "k2", start_method="forkserver")
    shm.reset()
    goal = Goal([0.1, 0.2, 0.3])
    shm.set_attr("goal_object", goal, indices=[3])
    assert shm.get_attr("goal_object", indices=[3]) == [goal]


def test_a_request_larger_than_the_sockets_buffer(closing):
    """Written after its post (the worker reads while the main process writes): still answered."""
    shm, dummy = goal_pair(closing, "k2")
    for venv in (shm, dummy):
        venv.seed(1)
        venv.reset()
    args = her_call_args(np.random.default_rng(2), batch=20_000)
    assert args[0].nbytes > shm._pool.links[1]._write_first
    got = shm.env_method("compute_reward", *args, indices=[2])
    assert_same(got, dummy.env_method("compute_reward", *args, indices=[2]))


def test_maskable_ppo_learns_as_on_dummy(closing):
    sb3_contrib = pytest.importorskip("sb3_contrib")
    shm, dummy = make_pair([MaskedWalk] * 4, 2, closing)
    threads = torch.get_num_threads()
    models = []
    try:
        for venv in (shm, dummy):
            torch.set_num_threads(1)  # identical reductions on both runs
            model = sb3_contrib.MaskablePPO(
                "MlpPolicy",
                venv,
                n_steps=32,
                batch_size=64,
                n_epochs=2,
                seed=0,
                device="cpu",
                policy_kwargs={"net_arch": [16]},
            )
            models.append(model.learn(256))
    finally:
        torch.set_num_threads(threads)
    got, want = (model.policy.state_dict() for model in models)
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), f"parameter {key} differs from the DummyVecEnv run"
