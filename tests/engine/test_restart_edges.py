"""Restart mode where a death cannot be restarted, or is found in an unusual place.

A wait that finds a worker dead returns a restart claim (``engine.restart.Restart``) to its
caller, which acts on it. Start-up and a restart's own handshake cannot restart: they raise
WorkerDiedError. An async ``recv`` that finds the death while reading an env's record
restarts the worker like any other death. (While the claim was an exception, RestartNeeded,
each of these let it escape to the caller.)

Layout as in test_restart.py: 4 envs in 2 workers, worker 1 holds envs 2 and 3.
"""

from __future__ import annotations

import functools
import os
import time

import gymnasium as gym
import numpy as np
import pytest

import shmvec.engine.worker
from shmvec import ShmVectorEnv, WorkerDiedError
from tests.faulty import N_ENVS, N_WORKERS, DieOnce, die_once_fns
from tests.helpers import assert_same

PARENT = os.getpid()
RESTART = {"on_worker_failure": "restart", "start_method": "fork"}
ZEROS = np.zeros(N_ENVS, np.int64)


class DiesWhenBuilt(gym.Wrapper):
    """CartPole whose construction in a worker process kills it: always, or once ``marker`` exists
    (so that only its rebuilt instance dies)."""

    def __init__(self, marker: str | None = None):
        if os.getpid() != PARENT and (marker is None or os.path.exists(marker)):
            os._exit(4)
        super().__init__(gym.make("CartPole-v1"))


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


@pytest.mark.timeout(60)
def test_a_death_during_start_up_raises_as_without_restarts():
    fns = [cartpole] * 2 + [DiesWhenBuilt] * 2
    with pytest.raises(WorkerDiedError, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code 4; close"):
        ShmVectorEnv(fns, N_WORKERS, **RESTART)


@pytest.mark.timeout(60)
def test_a_worker_dying_in_its_restart_breaks_the_pool(closing, tmp_path):
    """Env 3 dies at its 3rd step; the worker rebuilt for it dies building env 2."""
    marker = str(tmp_path / "died")
    fns = [cartpole] * 2 + [functools.partial(DiesWhenBuilt, marker), functools.partial(DieOnce, "exit", 3, marker)]
    env = closing(ShmVectorEnv(fns, N_WORKERS, **RESTART))
    env.reset(seed=0)
    for _ in range(2):
        env.step(ZEROS)
    with pytest.warns(RuntimeWarning, match="restarting it"):
        with pytest.raises(WorkerDiedError, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code 4; close"):
            env.step(ZEROS)
    with pytest.raises(WorkerDiedError, match=r"unusable: restarting worker 1 \(envs 2..3\) failed"):
        env.step(ZEROS)


class DiesBeforeSending:
    """A worker's pipe for its async sends' records: it dies, once, between publishing an env
    (its post on ``finished``) and sending that env's record, half a second later."""

    def __init__(self, conn, marker: str):
        self.conn, self.marker = conn, marker

    def send_bytes(self, blob: bytes) -> None:
        if not os.path.exists(self.marker):
            open(self.marker, "x").close()
            time.sleep(0.5)  # the main process takes the post meanwhile, and waits for the record
            os._exit(3)
        self.conn.send_bytes(blob)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("found", ["reading the record", "before the recv"])
def test_async_recv_restarts_a_worker_that_died_before_sending_a_record(closing, tmp_path, monkeypatch, found):
    """``reading the record``: the recv takes env 2's post, then waits on the pipe for its record
    until the death shows. ``before the recv``: the recv finds the death first, and takes that
    post while restarting the worker."""
    marker = str(tmp_path / "died")
    init = shmvec.engine.worker._Sends.__init__

    def dying_in_worker_1(self, *args):
        init(self, *args)
        if self.worker == 1:
            self.conn = DiesBeforeSending(self.conn, marker)

    monkeypatch.setattr(shmvec.engine.worker._Sends, "__init__", dying_in_worker_1)  # forked workers inherit it
    env = closing(ShmVectorEnv(die_once_fns(None, marker, infos=True), N_WORKERS, batch_size=N_ENVS, **RESTART))
    env.async_reset(seed=0)
    env.recv(timeout=10)
    env.send(ZEROS)
    if found == "before the recv":
        env._pool.links[1].process.join(10)
    with pytest.warns(RuntimeWarning, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code 3; restarting it"):
        *_, truncs, infos = env.recv(timeout=10)
    restarted = np.array([False, False, True, True])
    assert_same(infos["_shmvec_restarted"], restarted)
    assert_same(truncs, restarted)
    for _ in range(3):  # and on, with no more restarts
        env.send(ZEROS)
        *_, truncs, infos = env.recv(timeout=10)
        assert "shmvec_restarted" not in infos
    assert env._pool.restarter.count == 1 and not env._pool.restarter.claimed  # one claim, one restart
