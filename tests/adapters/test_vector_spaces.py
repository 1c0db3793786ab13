"""Spaces with no fixed size (Graph, Sequence, Text, OneOf, custom) against SyncVectorEnv.

Their leaves travel pickled through the workers' pipes while the fixed-size leaves next
to them keep the shared-memory path; the results must still equal SyncVectorEnv's bit
for bit. And a pool whose spaces are all fixed-size must send nothing through its pipes
on a step.
"""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from shmvec import InvalidActionError, ShmVectorEnv, UnsupportedSpaceError
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from tests.adapters.test_vector import run_equivalence
from tests.envs import (
    Token,
    TokenSpace,
    TupleObsEnv,
    make_any_space,
    make_text_token,
    make_tuple_any_space,
)
from tests.helpers import assert_same

pytestmark = pytest.mark.vector_api  # ShmVectorEnv (and Gymnasium 1.x's spaces): Gymnasium 1.1 on (tests/conftest.py)

STEPS = 300
MODES = list(AutoresetMode)
# N=5 on 2 workers: uneven shards (3 + 2); with main_shard, 2 + 2 in workers and 1 in the main process.
SHAPES = [(5, 2, False), (5, 2, True)]

ENV_FACTORIES = {
    "AnySpace": make_any_space,
    "TextToken": make_text_token,
    "TupleAnySpace": make_tuple_any_space,
}


def make_pair(env_fn, closing, mode=AutoresetMode.NEXT_STEP, n_envs=5, n_workers=2, **kwargs):
    shm = closing(ShmVectorEnv([env_fn] * n_envs, n_workers, autoreset_mode=mode, start_method="fork", **kwargs))
    ref = closing(SyncVectorEnv([env_fn] * n_envs, autoreset_mode=mode))
    return shm, ref


# ---- layout ------------------------------------------------------------------------------


def test_layout_marks_leaves_with_no_fixed_size_as_pickled():
    env = make_any_space()
    layout = lay.ArenaLayout.plan(env.observation_space, env.action_space, n_envs=3, n_workers=2)
    # (gymnasium's Dict sorts its keys)
    assert [leaf.path for leaf in layout.obs_leaves] == [("hp",), ("meta", 0), ("pos",)]
    assert [leaf.path for leaf in layout.pickled_obs_leaves] == [
        ("label",),
        ("meta", 1),
        ("net",),
        ("pick",),
        ("token",),
        ("trail",),
    ]
    assert [leaf.path for leaf in layout.action_leaves] == [("move",)]
    assert [leaf.path for leaf in layout.pickled_action_leaves] == [("say",), ("token",)]
    pickled = [*layout.pickled_obs_leaves, *layout.pickled_action_leaves]
    assert all(leaf.pickled and leaf.shape is None for leaf in pickled)
    assert not any(repr(leaf.path) in name for leaf in pickled for name in layout.fields)  # no buffer


def test_layout_of_a_space_with_no_fixed_size_leaf_at_all():
    layout = lay.ArenaLayout.plan(spaces.Text(8), TokenSpace(), n_envs=2, n_workers=1, final_obs=True)
    assert layout.obs_leaves == layout.action_leaves == ()
    assert [leaf.path for leaf in layout.pickled_obs_leaves] == [()]
    assert lay.FINAL_OBS not in layout.fields


def test_a_non_space_is_refused():
    with pytest.raises(UnsupportedSpaceError, match="gymnasium.spaces.Space"):
        lay.flatten_space("Discrete(2)")


# ---- equivalence with SyncVectorEnv ------------------------------------------------------


@pytest.mark.parametrize("n_envs,n_workers,main_shard", SHAPES, ids=["N5K2", "N5K2-main"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize("env_name", list(ENV_FACTORIES))
def test_matches_sync_vector_env(env_name, mode, n_envs, n_workers, main_shard, closing):
    shm, ref = make_pair(ENV_FACTORIES[env_name], closing, mode, n_envs, n_workers, use_main_process=main_shard)
    assert shm.observation_space == ref.observation_space
    assert shm.action_space == ref.action_space
    counts = run_equivalence(shm, ref, STEPS, seed=7 + main_shard)
    # the run must have exercised what it claims to compare
    assert counts["terminated"] > 0 and counts["truncated"] > 0 and counts["info_steps"] > 0, counts
    if mode == AutoresetMode.DISABLED:
        assert counts["masked_resets"] > 0, counts


@pytest.mark.parametrize("copy", [True, False])
def test_copy_flag_matches_sync_vector_env(copy, closing):
    """copy=False returns the same values; copy=True never hands out an object the pool keeps."""
    shm = closing(ShmVectorEnv([make_any_space] * 3, 2, copy=copy, start_method="fork"))
    ref = closing(SyncVectorEnv([make_any_space] * 3, copy=copy))
    first, _ = shm.reset(seed=3)
    assert_same(first, ref.reset(seed=3)[0])
    mask = np.array([True, False, False])
    again, _ = shm.reset(seed=4, options={"reset_mask": mask})
    assert_same(again, ref.reset(seed=4, options={"reset_mask": mask})[0])
    if copy:  # env 1 was not reset: equal values, but new objects
        assert again["net"][1].nodes is not first["net"][1].nodes


# ---- actions -----------------------------------------------------------------------------


def test_pickled_actions_are_checked_and_a_refused_step_changes_nothing(closing):
    shm, ref = make_pair(make_any_space, closing)
    assert_same(shm.reset(seed=1), ref.reset(seed=1))
    ref.action_space.seed(1)
    actions = ref.action_space.sample()
    with pytest.raises(InvalidActionError, match=r"actions at \('say',\) as a sequence of 5 actions"):
        shm.step({**actions, "say": actions["say"][:4]})
    with pytest.raises(InvalidActionError, match=r"\('token',\)"):  # a single action, not one per env
        shm.step({**actions, "token": Token("up", 1)})
    with pytest.raises(InvalidActionError, match="cannot be pickled"):
        shm.step({**actions, "token": (threading.Lock(),) * 5})
    assert_same(shm.step(actions), ref.step(actions))


# ---- the hot path of fixed-size spaces -----------------------------------------------------


class PipeCounter:
    """Counts the messages that cross the main side of each worker's pipe."""

    def __init__(self, monkeypatch, conns):
        self.count = 0
        for conn in conns:
            for name in ("send_bytes", "recv_bytes"):
                monkeypatch.setattr(conn, name, self._counting(getattr(conn, name)))

    def _counting(self, method):
        def counted(*args, **kwargs):
            self.count += 1
            return method(*args, **kwargs)

        return counted


@pytest.mark.parametrize(
    "env_fn,mode",
    [
        (lambda: gym.make("CartPole-v1", max_episode_steps=30), AutoresetMode.NEXT_STEP),
        (lambda: gym.make("CartPole-v1", max_episode_steps=30), AutoresetMode.SAME_STEP),
        (lambda: gym.wrappers.TimeLimit(TupleObsEnv(), max_episode_steps=30), AutoresetMode.NEXT_STEP),
    ],
    ids=["CartPole-NEXT_STEP", "CartPole-SAME_STEP", "TupleObs-NEXT_STEP"],
)
def test_fixed_size_spaces_send_nothing_through_the_pipes_on_a_step(env_fn, mode, monkeypatch, closing):
    shm = closing(ShmVectorEnv([env_fn] * 5, 2, autoreset_mode=mode, start_method="fork"))
    shm.reset(seed=0)
    pipes = PipeCounter(monkeypatch, [link.conn for link in shm._pool.links])
    shm.action_space.seed(0)
    ended = 0
    for _ in range(200):
        _, _, terminated, truncated, _ = shm.step(shm.action_space.sample())
        ended += int((terminated | truncated).sum())
    assert ended > 0  # episode ends happened, and still nothing crossed a pipe
    assert pipes.count == 0


def test_pickled_leaves_do_cross_the_pipes(monkeypatch, closing):
    """The counter above can fail: a space with pickled leaves uses the pipes every step."""
    shm = closing(ShmVectorEnv([make_any_space] * 5, 2, start_method="fork"))
    shm.reset(seed=0)
    pipes = PipeCounter(monkeypatch, [link.conn for link in shm._pool.links])
    shm.step(shm.action_space.sample())
    assert pipes.count == 4  # per worker: its pickled actions out, its pickled observations back


# ---- the SB3 adapter refuses them clearly ---------------------------------------------------


@pytest.mark.parametrize("env_fn", [make_text_token, make_tuple_any_space], ids=["Text-Token", "TupleAny"])
def test_sb3_adapter_refuses_spaces_with_no_fixed_size(env_fn):
    from shmvec import ShmPoolVecEnv

    with pytest.raises(UnsupportedSpaceError, match="ShmPoolVecEnv takes only fixed-size"):
        ShmPoolVecEnv([env_fn] * 2, n_workers=1, start_method="fork")
