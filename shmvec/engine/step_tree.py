"""A step of many workers: posted through a tree, its answers taken in one pass (:class:`StepTree`).

Posting a worker that sleeps on its ``cmd`` semaphore is a futex wake-up, a system call of
~2-3 µs. Posted one by one by the main process, K workers cost it K of them on every step,
and the last worker starts K of them late. With more than :data:`FANOUT` workers the main
process posts only the first :data:`FANOUT` (the roots); a worker that takes a STEP posts its
own children's ``cmd`` first, then steps its envs: the main process's cost per step no
longer grows with K, and the wake-ups run in parallel on the workers' cores (the last
worker starts after about log_FANOUT(K) wake-ups instead of K).

Ordering (aarch64 too): the main process writes every worker's control word before it
posts a root; a worker posts its children only after taking its own post. Each
``sem_post``/``sem_wait`` pair is a release/acquire pair, so a child that takes its post
sees every store the main process made before posting the root.

Answers: each worker still posts its own ``done``; :meth:`StepTree.take_answers` takes those
already there in one tight pass (no wait, no per-worker status read: one numpy read of every
status after it) and leaves the late ones to the pool's generic wait.

Ctrl-C: the words, the seqs and the posts of :meth:`StepTree.post`, and the takes and counts of
:meth:`StepTree.take_answers`, must agree. Both run inside the pool's step calls, which hold
SIGINT until they end or reach a wait's slice (:mod:`shmvec.ipc.interrupts`): no
KeyboardInterrupt falls between them, whatever thread the kernel delivers SIGINT to.

Only steps go through the tree. Every other command (rare calls, async sends, CLOSE) is
posted by the main process to the worker itself, and a worker acts on a CLOSE word at once
(:func:`shmvec.engine.worker._catch_up`), so closing never waits on a parent that will not
forward. Pools that restart dead workers post every worker themselves: a parent that dies
before forwarding would leave its children waiting.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import posix_ipc

from shmvec.engine.link import AWAIT_DONE, AWAIT_PAYLOAD, IDLE, WorkerLink
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import SENT_SHIFT, SENT_SPAN, SEQ_SHIFT, SEQ_SPAN, Command

FANOUT = 8  # posts per process and step: the main process's roots, and each worker's children

_STEP = int(Command.STEP)


def children_of(n_workers: int, fanout: int = FANOUT) -> list[list[int]]:
    """For each worker, the workers it posts a step to (none while the main process posts all).

    Workers ``0..fanout-1`` are the roots; worker ``k >= fanout`` is a child of
    ``k // fanout - 1``, so every parent comes before its children and has at most ``fanout``.
    """
    children: list[list[int]] = [[] for _ in range(n_workers)]
    if n_workers > fanout:
        for k in range(fanout, n_workers):
            children[k // fanout - 1].append(k)
    return children


class StepTree:
    """The main process's side: writes every worker's STEP word, posts the roots, takes the answers."""

    def __init__(self, links: list[WorkerLink], ctrl, fanout: int = FANOUT):
        self.links = links
        self.ctrl = ctrl  # the control block: one row per worker
        self.root_posts = [link.cmd.post for link in links[:fanout]]
        self.statuses = ctrl[:, lay.CTRL_STATUS]
        self.done_takes = [(link, link.done.take) for link in links[:-1]]
        # what each worker is told at attach: the cmd signals it posts
        self.children_names = [tuple(links[c].cmd.name for c in kids) for kids in children_of(len(links), fanout)]

    @classmethod
    def of(cls, links: list[WorkerLink], ctrl, restarts: bool) -> StepTree | None:
        """The tree of a pool's workers, or None where the main process posts every worker: up to
        FANOUT workers, and with restarts (a parent dying before it forwards would strand its children)."""
        return cls(links, ctrl) if len(links) > FANOUT and not restarts else None

    def post(self, next_wait: int) -> None:
        """Start a step on every worker (their action rows are written).

        The words, the seqs and the posts must agree: a seq that no post matches would leave a
        worker waiting for it. The caller holds Ctrl-C meanwhile (:mod:`shmvec.ipc.interrupts`).
        """
        ctrl, words = self.ctrl, []
        ctrl[:, lay.CTRL_NEXT_WAIT] = next_wait  # before the post: the worker reads it after the step
        for link in self.links:  # one pass per worker: its seq, what it owes, its word
            link.seq = seq = link.seq + 1
            link.owes = AWAIT_DONE
            words.append((seq % SEQ_SPAN) << SEQ_SHIFT | (link.sent % SENT_SPAN) << SENT_SHIFT | _STEP)  # post_word
        ctrl[:, lay.CTRL_POST] = words  # one store for every worker's word, before any post
        for post in self.root_posts:
            post()

    def collect(self, collect: Callable[..., list], timeout: float | None, deadline: float | None) -> list:
        """The replies of the step, by worker (by the pool's ``collect``, to one ``deadline``): the
        last-posted worker's first; by then most others are done, and their answers are taken in one
        pass. Replies stay in worker order, so records stay in env order (infos' key order depends on it)."""
        replies: list = [[]] * len(self.links)
        (replies[-1],) = collect(self.links[-1:], timeout, deadline=deadline)
        owing = self.take_answers()
        for link, reply in zip(owing, collect(owing, timeout, deadline=deadline)):
            replies[link.index] = reply
        return replies

    def take_answers(self) -> list[WorkerLink]:
        """Take the ``done`` of every worker but the last already posted for the step; return
        the links that still owe something (a reply or error on the pipe, or their ``done``) for
        the pool's wait. Called once the last-posted worker answered, when most others have too.

        A taken post publishes its worker's status and rows (acquire), so the statuses are
        read after the pass. The caller holds Ctrl-C, so that no taken post is left uncounted.
        """
        links, late = self.links[:-1], []
        for link, take in self.done_takes:
            try:
                take(0)
            except posix_ipc.BusyError:
                late.append(link)
            else:
                link.owes = IDLE
        owing = [links[k] for k in np.flatnonzero(self.statuses[:-1]).tolist() if links[k].owes == IDLE]
        for link in owing:
            link.owes = AWAIT_PAYLOAD
        return owing + late
