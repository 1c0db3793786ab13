"""Pools of more than FANOUT workers post steps through a tree of workers and take the answers
in one pass: results stay those of the references, and failures stay clear and quick."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import types

import numpy as np
import posix_ipc
import pytest
from gymnasium.vector import SyncVectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv, WorkerDiedError
from shmvec.engine.link import AWAIT_DONE, AWAIT_PAYLOAD, IDLE
from shmvec.engine.step_tree import FANOUT, StepTree, children_of
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import Command, post_word
from tests.envs import EndsAt, cartpole, make_any_space
from tests.faulty import Boom, FaultyEnv
from tests.helpers import assert_same, gone

K = FANOUT + 4  # roots 0..FANOUT-1; worker 0 posts the rest


class _Posts:
    """A stand-in semaphore: counts its posts; ``take(0)`` takes one or raises BusyError."""

    def __init__(self, name: str):
        self.name, self.count, self.posted = name, 0, 0

    def post(self) -> None:
        self.count += 1
        self.posted += 1

    def take(self, timeout: float) -> None:
        if not self.count:
            raise posix_ipc.BusyError("busy")
        self.count -= 1


@settings(max_examples=30, deadline=None)
@given(
    seqs_sents=st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 2**20)), min_size=FANOUT + 1, max_size=40),
    next_wait=st.integers(0, 2),
    answered=st.data(),
)
def test_the_tree_writes_each_workers_step_word_and_takes_the_answers_there(seqs_sents, next_wait, answered):
    """Every worker's word is post_word(its next seq, its sent, STEP), written before any post; only
    the roots are posted; the answers already posted are taken, the others (and the replies) stay owed."""
    n = len(seqs_sents)
    links = [
        types.SimpleNamespace(index=k, seq=seq, sent=sent, owes=IDLE, cmd=_Posts(f"c{k}"), done=_Posts(f"d{k}"))
        for k, (seq, sent) in enumerate(seqs_sents)
    ]
    ctrl = np.zeros((n, lay.CTRL_WIDTH), np.int64)
    tree = StepTree(links, ctrl)
    tree.post(next_wait)
    assert ctrl[:, lay.CTRL_POST].tolist() == [post_word(seq + 1, sent, Command.STEP) for seq, sent in seqs_sents]
    assert (ctrl[:, lay.CTRL_NEXT_WAIT] == next_wait).all()
    assert [link.seq for link in links] == [seq + 1 for seq, _ in seqs_sents]
    assert [link.cmd.posted for link in links] == [1] * FANOUT + [0] * (n - FANOUT)
    assert all(link.owes == AWAIT_DONE for link in links)
    done = answered.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    replying = answered.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    for link, posted, replies in zip(links, done, replying):
        if posted:
            link.done.post()
            ctrl[link.index, lay.CTRL_STATUS] = int(replies)  # not OK: a reply follows on the pipe
    owing = tree.take_answers()
    expected = [k for k in range(n - 1) if done[k] and replying[k]] + [k for k in range(n - 1) if not done[k]]
    assert [link.index for link in owing] == expected
    for k in range(n - 1):
        assert links[k].owes == (AWAIT_DONE if not done[k] else AWAIT_PAYLOAD if replying[k] else IDLE)
        assert links[k].done.count == 0


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
