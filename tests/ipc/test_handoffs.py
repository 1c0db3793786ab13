"""Every hand-off is read only after taking the post that published it (shmvec.ipc.protocol).

A real machine shows a reordering only by chance, so these tests make it certain: the
worker runs in a thread, over its own copy of the arena, and a post copies the poster's
rows into the taker's copy only when the taker takes it (:class:`Publishing`). The
control row is one array for both sides, so a control word is seen at once: on aarch64 a
reader may see a later store (a command word, a count) before the earlier ones it covers
(inbox slots, action rows, results). A side that reads a row its taken posts have not
published gets the stale copy, and the test sees it.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from shmvec.engine.async_schedule import IN_FLIGHT, AsyncSchedule
from shmvec.engine.link import WorkerLink
from shmvec.engine.shard import Shard
from shmvec.engine.worker import _catch_up, _Sends, _serve
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.ipc import layout as lay
from shmvec.ipc.action_rows import ActionRows
from shmvec.ipc.protocol import SENT_SPAN, SEQ_SPAN, Command, post_word, read_word
from shmvec.processes.caller_threads import CallerThreads

WAIT = 5.0  # seconds; only a broken hand-off makes a test wait this long


class Publishing:
    """A semaphore between two copies of the arena, as weak memory orders them.

    A post snapshots the poster's ``fields``; taking that post copies the snapshot into the
    taker's copy. ``hold()`` keeps the posts made from then on from the taker until
    ``deliver()``: their stores are made, their posts not yet taken.
    """

    def __init__(self, source: dict[str, np.ndarray], target: dict[str, np.ndarray], fields: list[str]):
        self.source, self.target, self.fields = source, target, fields
        self.posted: deque[dict[str, np.ndarray]] = deque()
        self.held: deque[dict[str, np.ndarray]] = deque()
        self.holding = False
        self.idle = False  # the taker waits with nothing to take
        self.cond = threading.Condition()

    def post(self) -> None:
        snapshot = {name: self.source[name].copy() for name in self.fields}
        with self.cond:
            (self.held if self.holding else self.posted).append(snapshot)
            self.cond.notify_all()

    def hold(self) -> None:
        self.holding = True

    def deliver(self, count: int | None = None) -> None:
        """Let the taker take the posts held back (the first ``count`` of them, and hold on)."""
        with self.cond:
            count = len(self.held) if count is None else count
            self.holding = count < len(self.held)
            for _ in range(count):
                self.posted.append(self.held.popleft())
            self.cond.notify_all()

    def wait(self, timeout: float, spin: float | None = None) -> bool:
        with self.cond:
            if not self.posted:
                self.idle = True
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.posted, timeout)
                self.idle = False
            if not self.posted:
                return False
            snapshot = self.posted.popleft()
        for name, rows in snapshot.items():
            self.target[name][...] = rows
        return True

    def drain(self) -> int:
        taken = 0
        while self.posted and self.wait(0.0):
            taken += 1
        return taken

    def wait_idle(self) -> None:
        """Until the taker waits with nothing left to take: it has done all it may."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.idle and not self.posted, WAIT), "the worker never went idle"

    def close(self) -> None:
        pass


class Echo(gym.Env):
    """Logs ``(its index, the action)`` at each step and observes them."""

    observation_space = spaces.Box(0.0, 100.0, (2,), np.float32)
    action_space = spaces.Discrete(10)

    def __init__(self, index: int, log: list):
        self.index, self.log = index, log

    def reset(self, *, seed=None, options=None):
        return np.array([self.index, 0], np.float32), {}

    def step(self, action):
        self.log.append((self.index, int(action)))
        return np.array([self.index, action], np.float32), float(self.index), False, False, {}


@dataclass
class Wire:
    """One worker (a thread running ``worker._serve``) and its link, each over its own copy of the arena."""

    main: dict[str, np.ndarray]  # the main process's copy
    link: WorkerLink
    cmd: Publishing  # main -> worker
    finished: Publishing  # worker -> main
    rows: ActionRows  # the action rows, over the main process's copy
    log: list = field(default_factory=list)  # (env, action) as the worker stepped them

    def put(self, actions: dict[int, int]) -> None:
        """What ``AsyncSchedule.send`` does: write the actions, put the envs in the inbox, post."""
        ids = np.fromiter(actions, np.int64)
        column = np.fromiter(actions.values(), np.int64)
        self.rows.write((), column, column, rows=ids)
        self.link.put(list(actions), self.main[lay.INBOX])


class Signals:
    """The worker's other signals: posts are counted, nothing waits on them."""

    def __init__(self):
        self.posts = 0

    def post(self) -> None:
        self.posts += 1

    def close(self) -> None:
        pass


@contextmanager
def wired(n_envs: int) -> Iterator[tuple[Wire, Callable]]:
    """A :class:`Wire` over ``n_envs`` envs, and ``start()``, which starts its worker thread."""
    obs_space, action_space = Echo.observation_space, Echo.action_space
    layout = lay.ArenaLayout.plan(obs_space, action_space, n_envs, 1)
    main, theirs = layout.views(bytearray(layout.nbytes)), layout.views(bytearray(layout.nbytes))
    theirs["ctrl"] = main["ctrl"]  # seen at once by both sides
    results = [lay.OUTBOX, lay.ENV_STATUS, lay.READY_NS, "reward", "terminated", "truncated", lay.obs_field(())]
    cmd = Publishing(main, theirs, [lay.INBOX, lay.action_field(()), lay.ACTION_CODE])
    finished = Publishing(theirs, main, results)
    link = WorkerLink(0, 0, n_envs, 0.0)
    for signal in (link.cmd, link.done, link.finished):
        signal.close()
    link.cmd, link.done, link.finished, link.ctrl = cmd, Signals(), finished, main["ctrl"][0]
    wire = Wire(main, link, cmd, finished, ActionRows(layout, main))
    shard = Shard([Echo(i, wire.log) for i in range(n_envs)], 0, theirs, layout, AutoresetMode.NEXT_STEP, action_space)
    ours, worker_end = mp.Pipe()
    sends = _Sends(0, worker_end, Signals(), finished, shard, theirs)
    thread = threading.Thread(target=_serve, args=(0, worker_end, cmd, link.done, shard, theirs, sends), daemon=True)
    try:
        yield wire, thread.start
    finally:
        if thread.is_alive():
            cmd.deliver()
            link.post(Command.CLOSE)
            thread.join(WAIT)
        ours.close()
        worker_end.close()
        assert not thread.is_alive(), "the worker did not run CLOSE"


def test_a_worker_steps_only_envs_whose_send_it_has_taken():
    """Two sends; the second's word (seq 2, 2 ids sent) is seen before its post is taken.

    Acting on it then, the worker would read inbox slot 1 and env 1's action row before
    they are published: here their stale copies, env 0 and its action, so env 0 would be
    stepped twice. A count re-read from a cell (``CTRL_SENT``) did exactly that.
    """
    with wired(n_envs=2) as (wire, start):
        wire.put({0: 3})
        wire.cmd.hold()
        wire.put({1: 4})  # stored: the word says 2 ids; posted: not taken yet
        start()
        wire.cmd.wait_idle()
        assert wire.log in ([], [(0, 3)]), "stepped an env whose send was not published to it"
        wire.cmd.deliver()
        wire.cmd.wait_idle()
        assert wire.log == [(0, 3), (1, 4)]


def test_a_worker_steps_each_send_once_however_its_posts_come():
    """Sends taken one by one, or several at once (their words overwritten): each env once, in order."""
    with wired(n_envs=4) as (wire, start):
        start()
        wire.put({0: 1})
        wire.cmd.wait_idle()
        wire.cmd.hold()
        for i in (1, 2):
            wire.put({i: i + 1})
        wire.cmd.deliver()
        wire.put({3: 4})
        wire.cmd.wait_idle()
        assert wire.log == [(0, 1), (1, 2), (2, 3), (3, 4)]


class Pool:
    """What :class:`AsyncSchedule` needs of a pool to scan an outbox."""

    def message_from(self, link, timeout=None, send_reply=False):
        raise AssertionError("no env of these tests sends a record")


def schedule_of(wire: Wire, n_envs: int) -> AsyncSchedule:
    """An :class:`AsyncSchedule` over ``wire``'s worker alone, enough to scan its outbox."""
    return AsyncSchedule(
        Pool(),
        requests=None,
        links=[wire.link],
        shards=[(0, n_envs)],
        shard_of=lambda i: 0,
        views=wire.main,
        ready=None,
        main=None,
        pickled=None,
        caller=CallerThreads(None, False, None, "unchanged"),
        restarter=None,
    )


def test_the_main_process_takes_only_results_whose_post_it_has_taken():
    """Env 1's results and outbox slot are written, their post not yet taken: recv must not take env 1.

    Read from a count cell (``CTRL_READY``), env 1 was taken with its stale outbox slot (env 0
    again) and stale rows.
    """
    with wired(n_envs=2) as (wire, start):
        schedule = schedule_of(wire, 2)
        schedule.state[:] = IN_FLIGHT
        start()
        wire.finished.hold()
        wire.put({0: 3, 1: 4})
        wire.cmd.wait_idle()
        assert wire.log == [(0, 3), (1, 4)]
        assert len(wire.finished.held) == 2  # both results written, neither post taken
        wire.finished.deliver(1)  # env 0's post comes through
        schedule._scan()
        assert list(schedule.fifo) == [0]
        assert wire.main[lay.obs_field(())][0].tolist() == [0, 3]
        wire.finished.deliver()
        schedule._scan()
        assert list(schedule.fifo) == [0, 1]
        assert wire.main[lay.obs_field(())].tolist() == [[0, 3], [1, 4]]
        assert wire.main["reward"].tolist() == [0.0, 1.0]


def test_post_word_fields_wrap_and_read_back():
    assert read_word(post_word(7, 5, Command.SEND)) == (7, 5, Command.SEND)
    assert read_word(post_word(SEQ_SPAN + 2, SENT_SPAN + 3, Command.STEP)) == (2, 3, Command.STEP)
    assert post_word(SEQ_SPAN - 1, SENT_SPAN - 1, 15) < 2**63  # fits an int64 cell


@pytest.mark.parametrize("posts", [5, SEQ_SPAN - 1])
def test_catch_up_takes_posts_until_the_word_is_the_last_ones(posts):
    """The word read is two posts ahead of those taken (across the wrap of seq, too)."""
    row = np.zeros(lay.CTRL_WIDTH, np.int64)
    ahead = (posts + 2) % SEQ_SPAN
    row[lay.CTRL_POST] = post_word(ahead, 9, Command.SEND)
    cmd = Publishing({}, {}, [])
    for _ in range(2):
        cmd.post()
    word, taken = _catch_up(cmd, row, posts)
    assert (word, taken) == (row[lay.CTRL_POST], ahead)
    assert not cmd.posted
