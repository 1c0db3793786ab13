"""The OS resources of one pool, and their release: on close(), at GC, at exit.

Before a pool takes any, it removes what pools of processes that no longer exist left
in ``/dev/shm`` (:func:`~shmvec.ipc.leftovers.reclaim`): a process group SIGKILLed as a
whole takes the resource tracker with it, and nothing else would unlink those entries.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from shmvec.engine import ops
from shmvec.ipc import pinning
from shmvec.ipc.arena import OwnedArena
from shmvec.ipc.leftovers import reclaim
from shmvec.ipc.signals import Signal
from shmvec.processes.caller_threads import CallerThreads
from shmvec.processes.script_setup import LogRelay

if TYPE_CHECKING:
    from shmvec.engine.link import WorkerLink

CLOSE_TIMEOUT = 3.0  # seconds close() gives workers to exit before terminating them


class PoolResources:
    """Every OS resource of one pool, so that a finalizer can release them without the pool."""

    def __init__(self):
        reclaim()  # first: leftovers may be what would make this pool's arena not fit
        self.links: list[WorkerLink] = []
        self.arena: OwnedArena | None = None
        self.ready: Signal | None = None  # async batches: posted by every worker per finished env
        self.main_envs: list[gym.Env] = []  # the main shard's envs
        self.graceful = True  # False: workers are stuck, terminate them at once
        self.owner_pid = os.getpid()
        self.caller: CallerThreads | None = None  # what the pool changed of the caller's threads, to undo
        self.pinned: pinning.PinnedMemory | None = None  # the arena, page-locked for CUDA copies
        self.pin_tried = False
        self.log_relay: LogRelay | None = None  # the workers' log records, to this process's handlers

    def page_lock(self, run: Callable[[dict], Any], shards: list[tuple[int, int]], device: int | None) -> bool:
        """Page-lock the arena for CUDA copies (:mod:`shmvec.ipc.pinning`), once; whether it is.

        First ``run`` (the pool's rare call) sends every worker (its ``shards``) an operation
        that does nothing: its answer proves the worker attached the arena, so registration
        comes after every worker mapped it. A failed registration warns once and stays failed.
        """
        if not self.pin_tried:
            self.pin_tried = True
            run({start: ops.Nothing() for start, _ in shards})
            self.pinned = pinning.pin(self.arena.buf, "the shared observation arena", device)
        return self.pinned is not None

    def shutdown(self) -> None:
        """Stop the workers, then release everything. Idempotent; resumes if it was interrupted."""
        if os.getpid() != self.owner_pid:
            return  # a forked child's copy of these handles: the resources are not its own
        if self.graceful:
            for link in self.links:
                link.ask_to_close()
        for link in self.links:
            link.close_pipe()
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for link in self.links:
            link.join_or_kill(max(0.0, deadline - time.monotonic()) if self.graceful else 0.0)
        for link in self.links:
            link.release()
        self.links = []
        if self.log_relay is not None:  # after the workers: their last records are in
            self.log_relay.close()
            self.log_relay = None
        if self.ready is not None:
            self.ready.close()
            self.ready = None
        for env in self.main_envs:
            try:
                env.close()
            except Exception:
                pass  # closing must go on; the env is going away anyway
        self.main_envs = []
        if self.pinned is not None:  # before the arena goes: CUDA must not keep pages it may unmap
            self.pinned.release()
            self.pinned = None
        if self.arena is not None:
            self.arena.close()
        if self.caller is not None:
            self.caller.release()
            self.caller = None


def finalize_unclosed(res: PoolResources) -> None:
    if os.getpid() != res.owner_pid:
        return
    warnings.warn(
        "a shmvec vector env was not closed; call close() or use it as a context manager",
        ResourceWarning,
        stacklevel=2,
    )
    res.shutdown()
