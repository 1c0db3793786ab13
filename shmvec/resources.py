"""The OS resources of one pool, and their release: on close(), at GC, at exit."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec import layout as lay
from shmvec.protocol import Command
from shmvec.shm import OwnedArena
from shmvec.sync import Signal

CLOSE_TIMEOUT = 3.0  # seconds close() gives workers to exit before terminating them


class PoolResources:
    """Every OS resource of one pool, so that a finalizer can release them without the pool."""

    def __init__(self):
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.cmd: list[Signal] = []
        self.done: list[Signal] = []
        self.arena: OwnedArena | None = None
        self.main_envs: list[gym.Env] = []  # the main shard's envs
        self.ctrl: np.ndarray | None = None
        self.graceful = True
        self.owner_pid = os.getpid()

    def shutdown(self) -> None:
        """Stop the workers, then release everything. Idempotent; resumes if it was interrupted."""
        if os.getpid() != self.owner_pid:
            return  # a forked child's copy of these handles: the resources are not its own
        graceful = self.graceful and self.ctrl is not None
        if graceful:
            for k, process in enumerate(self.processes):
                if process is not None and process.exitcode is None:
                    self.done[k].drain()  # a step the user never waited for
                    self.ctrl[k, lay.CTRL_COMMAND] = Command.CLOSE
                    self.cmd[k].post()
        for conn in self.conns:
            if conn is not None:  # None: start-up failed before this worker's pipe existed
                conn.close()  # a worker blocked on its pipe gets EOF instead of waiting for us
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for k, process in enumerate(self.processes):
            if process is None:
                continue
            if process.exitcode is None and graceful:
                process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:  # stuck (hung env) or never attached: stop it
                process.terminate()
                process.join(1.0)
            if process.exitcode is None:
                process.kill()
                process.join()
            process.close()
            self.processes[k] = None
        self.processes = []
        self.conns = []
        for sig in self.cmd + self.done:
            sig.close()
        self.cmd, self.done = [], []
        self.ctrl = None
        for env in self.main_envs:
            try:
                env.close()
            except Exception:
                pass  # closing must go on; the env is going away anyway
        self.main_envs = []
        if self.arena is not None:
            self.arena.close()


def finalize_unclosed(res: PoolResources) -> None:
    if os.getpid() != res.owner_pid:
        return
    warnings.warn(
        "a shmvec vector env was not closed; call close() or use it as a context manager",
        ResourceWarning,
        stacklevel=2,
    )
    res.shutdown()
