"""Pools of more than FANOUT workers post steps through a tree of workers and take the answers
in one pass: results stay those of the references, and failures stay clear and quick."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv, WorkerDiedError
from shmvec.engine.step_tree import FANOUT, children_of
from tests.envs import EndsAt, cartpole, make_any_space
from tests.faulty import Boom, FaultyEnv
from tests.helpers import assert_same, gone

K = FANOUT + 4  # roots 0..FANOUT-1; worker 0 posts the rest


@pytest.mark.parametrize("n_workers", [1, FANOUT, FANOUT + 1, 2 * FANOUT, 80, 300])
def test_every_worker_but_the_roots_has_one_earlier_parent(n_workers):
    children = children_of(n_workers)
    parents = {child: parent for parent, kids in enumerate(children) for child in kids}
    if n_workers <= FANOUT:
        assert parents == {}  # the main process posts them all
        return
    assert sorted(parents) == list(range(FANOUT, n_workers))  # every non-root exactly once
    assert all(parent < child for child, parent in parents.items())
    assert max(len(kids) for kids in children) == min(FANOUT, n_workers - FANOUT)
    depth = {k: 0 for k in range(FANOUT)}
    for child in sorted(parents):
        depth[child] = depth[parents[child]] + 1
    assert max(depth.values()) <= 1 + np.log(n_workers) / np.log(FANOUT)


def test_a_tree_pool_equals_dummyvecenv_on_cartpole(closing):
    shm = closing(ShmPoolVecEnv([cartpole] * (2 * K), n_workers=K, max_spin=0.0))
    assert shm._pool._step_tree is not None
    ref = DummyVecEnv([cartpole] * (2 * K))
    shm.seed(3), ref.seed(3)
    assert_same(shm.reset(), ref.reset())
    rng = np.random.default_rng(0)
    for _ in range(60):  # episode ends (terminal_observation) included
        actions = rng.integers(0, 2, 2 * K)
        assert_same(shm.step(actions), ref.step(actions))


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_tree_pool_with_pickled_leaves_equals_syncvectorenv(closing, mode):
    shm = closing(ShmVectorEnv([make_any_space] * K, K, autoreset_mode=mode))
    assert shm._pool._step_tree is not None
    ref = SyncVectorEnv([make_any_space] * K, autoreset_mode=mode)
    assert_same(shm.reset(seed=5), ref.reset(seed=5))
    shm.action_space.seed(1)
    for _ in range(30):
        actions = shm.action_space.sample()
        assert_same(shm.step(actions), ref.step(actions))


def test_restart_mode_posts_every_worker_itself(closing):
    env = closing(ShmPoolVecEnv([cartpole] * K, n_workers=K, on_worker_failure="restart"))
    assert env._pool._step_tree is None


def waiting(fail: str | None = None, bad: int = -1) -> list:
    return [functools.partial(FaultyEnv, fail if i == bad else None, wait=1e-3) for i in range(K)]


@pytest.mark.timeout(60)
def test_an_env_raising_in_a_child_and_in_the_last_worker(closing):
    for bad in (FANOUT, K - 1):  # a child of worker 0; the worker the main process waits for first
        env = closing(ShmPoolVecEnv(waiting("step", bad), n_workers=K))
        env.reset()
        env.step(np.zeros(K, np.int64))
        with pytest.raises(Boom):
            env.step(np.zeros(K, np.int64))
        obs, *_ = env.step(np.zeros(K, np.int64))  # still usable, every env stepped
        assert obs.shape == (K, 2)
        env.close()


@pytest.mark.timeout(60)
def test_a_parent_that_died_before_forwarding_fails_the_step_quickly(closing):
    env = closing(ShmVectorEnv(waiting(), K))
    env.reset(seed=0)
    env.step(np.zeros(K, np.int64))
    parent = env._pool.links[0].process.pid  # its children, FANOUT.., are never posted
    os.kill(parent, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker 0 \(envs 0\.\.0, pid {parent}\) died with signal SIGKILL"):
        env.step(np.zeros(K, np.int64))
    assert time.monotonic() - start < 5


@pytest.mark.timeout(60)
def test_close_with_a_step_a_parent_never_forwarded_is_quick(closing):
    """A CLOSE reaches the children while their parent's forward is still due: they exit at once
    (before, they waited for the post until close() terminated them)."""
    env = closing(ShmPoolVecEnv(waiting(), n_workers=K, max_spin=0.0))
    env.reset()
    pool = env._pool
    children = [link.process.pid for link in pool.links[FANOUT:]]
    parent = pool.links[0].process.pid
    os.kill(parent, signal.SIGSTOP)  # it takes STEP and CLOSE together later: it acts on CLOSE only
    threading.Timer(0.3, os.kill, (parent, signal.SIGCONT)).start()
    env.step_async(np.zeros(K, np.int64))
    start = time.monotonic()
    env.close()
    assert time.monotonic() - start < 2.0  # close() terminates workers still there after 3 s
    assert all(gone(pid) for pid in children)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_episode_ends_in_the_last_worker_and_others_keep_syncvectorenvs_info_order(closing, mode):
    """Records come back in env order whichever worker answered first (the last-posted is waited for first)."""
    fns = [functools.partial(EndsAt, 3 if i in (0, K - 1) else 5) for i in range(K)]
    shm = closing(ShmVectorEnv(fns, K, autoreset_mode=mode, max_spin=0.0))
    assert shm._pool._step_tree is not None
    ref = SyncVectorEnv(fns, autoreset_mode=mode)
    assert_same(shm.reset(seed=0), ref.reset(seed=0))
    for _ in range(8):
        actions = np.zeros(K, np.int64)
        assert_same(shm.step(actions), ref.step(actions))
