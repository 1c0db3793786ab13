"""How both sides wait around a rare call: a worker after it waits as after the step before it, and
the main process spins for the replies where every process it waits on has a core."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shmvec.engine import ops
from shmvec.engine.rare_calls import Requests
from shmvec.engine.shard import Shard
from shmvec.engine.worker import _Sends, _serve
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.protocol import Command, NextWait, Reset, RunOps, post_word
from shmvec.ipc.signals import MAX_SPIN
from shmvec.ipc.wire import to_worker

WAIT = 5.0  # seconds; only a broken worker loop makes a test wait this long


class Counter(gym.Env):
    observation_space = spaces.Box(0.0, 1e6, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(1, self.t, np.float32), 0.0, False, False, {}


class Recording:
    """A signal that records how long each wait on it was told to spin."""

    def __init__(self):
        self.sem, self.spins = threading.Semaphore(0), []

    def wait(self, timeout: float, spin: float | None = None) -> bool:
        self.spins.append(spin)
        return self.sem.acquire(timeout=timeout)

    def post(self) -> None:
        self.sem.release()

    def close(self) -> None:
        pass


def test_a_worker_waits_after_a_rare_call_as_after_the_step_before_it():
    """MaskablePPO: step, action_masks, the policy's forward pass, step. The step said "spin for the
    next command" (a caller that comes back soon); the call that follows must not reset that to the
    adaptive wait, whose spin (max_spin) would run out during the forward pass."""
    layout = lay.ArenaLayout.plan(Counter.observation_space, Counter.action_space, 2, 1)
    views = layout.views(bytearray(layout.nbytes))
    shard = Shard([Counter(), Counter()], 0, views, layout, AutoresetMode.NEXT_STEP, Counter.action_space)
    shard.handle(Reset({0: {}, 1: {}}))
    ours, theirs = mp.Pipe()
    cmd, done = Recording(), Recording()
    sends = _Sends(0, theirs, Recording(), Recording(), shard, views)
    worker = threading.Thread(target=_serve, args=(0, theirs, cmd, done, shard, views, sends), daemon=True)
    row, seq = views["ctrl"][0], 0

    def post(command: int, next_wait: NextWait = NextWait.OWN) -> None:
        nonlocal seq
        seq += 1
        row[lay.CTRL_NEXT_WAIT] = next_wait
        row[lay.CTRL_POST] = post_word(seq, 0, command)
        cmd.post()
        assert done.sem.acquire(timeout=WAIT), "the worker did not answer"

    worker.start()
    try:
        ActionRows(layout, views).write((), np.zeros(2, np.int64), np.zeros(2, np.int64))
        post(Command.STEP, NextWait.SPIN)
        ours.send_bytes(to_worker(RunOps({0: ops.CallMethod("reset")})))
        post(Command.MESSAGE)
        assert pickle.loads(ours.recv_bytes())[0][0].tolist() == [0.0]
        post(Command.STEP, NextWait.BLOCK)
        ours.send_bytes(to_worker(RunOps({1: ops.GetWrapperAttr("t")})))
        post(Command.MESSAGE)
        assert pickle.loads(ours.recv_bytes()) == {1: 2}
    finally:
        row[lay.CTRL_POST] = post_word(seq + 1, 0, Command.CLOSE)
        cmd.post()
        worker.join(WAIT)
        ours.close()
        theirs.close()
    assert not worker.is_alive()
    # Waits for: the first step (adaptive), the call, the step, the call, CLOSE.
    assert cmd.spins[:5] == [None, MAX_SPIN, MAX_SPIN, 0.0, 0.0]


def requests_of(n_links: int, main_spin: float, max_spin: float = 200e-6, cores: int = 4) -> Requests:
    links = [SimpleNamespace(done=SimpleNamespace(max_spin=main_spin)) for _ in range(n_links)]
    pool = SimpleNamespace(options=SimpleNamespace(max_spin=max_spin))
    requests = Requests(pool, links, lambda i: 0, n_links, None, None)
    requests.cores = cores
    return requests


def test_replies_are_waited_for_as_long_as_a_step():
    assert requests_of(2, main_spin=300e-6).reply_spin(2, beside_sends=False) == 300e-6
    assert requests_of(2, main_spin=300e-6).reply_spin(1, beside_sends=True) == 300e-6


def test_where_the_plan_blocks_a_reply_is_still_spun_for_while_the_workers_asked_have_cores():
    """More workers than cores: the plan blocks. A call to fewer workers than cores (HER asks env 0's
    alone) leaves the others idle, so it spins for max_spin; not beside async sends, nor with max_spin=0."""
    requests = requests_of(8, main_spin=0.0, cores=4)
    assert requests.reply_spin(1, beside_sends=False) == 200e-6
    assert requests.reply_spin(3, beside_sends=False) == 200e-6
    assert requests.reply_spin(4, beside_sends=False) == 0.0
    assert requests.reply_spin(1, beside_sends=True) == 0.0
    assert requests_of(8, main_spin=0.0, max_spin=0.0).reply_spin(1, beside_sends=False) == 0.0
