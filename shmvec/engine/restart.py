"""Restart mode (``on_worker_failure="restart"``): re-create a worker that died during a step.

The new process gets the dead one's link (rows, signals) and runs the start-up handshake
again; its Attach says ``restart=True``, so it resets its envs (seed ``None``) and replies
their reset infos. The step then reports those envs as truncated with reward 0 and a
``restarted`` record, while the other workers' results of the step stand.
"""

from __future__ import annotations

import pickle
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from gymnasium.vector import AutoresetMode

from shmvec.engine.failures import describe_exit, remote_error
from shmvec.engine.link import IDLE, WorkerLink, mp_context
from shmvec.errors import SpaceMismatchError
from shmvec.ipc import layout as lay
from shmvec.ipc.protocol import ErrorReport, StepInfo

if TYPE_CHECKING:
    from shmvec.engine.pool import ShmPool


class Restarter:
    """Restarts the pool's dead workers within ``max_restarts``."""

    def __init__(self, pool: ShmPool, env_fns: list, env_wrapper: Any):
        self.pool = weakref.proxy(pool)  # no reference cycle: an unclosed pool is still collected at once
        self.max_restarts = pool.options.max_restarts
        self.count = 0  # workers re-created so far
        self.claimed = 0  # deaths found and not restarted yet
        self._spawn_args = (env_fns, env_wrapper)

    def claim(self, link: WorkerLink) -> str:
        """``link``'s worker died: raise :class:`RestartNeeded` while the budget lasts, else say why not."""
        if self.count + self.claimed < self.max_restarts:
            self.claimed += 1
            raise RestartNeeded(link)
        return f"; no restart left (max_restarts={self.max_restarts} used up)"

    def restart_in_step(self, link: WorkerLink) -> list[StepInfo]:
        """Restart ``link``'s worker; report its envs' step as a truncation. Returns their records."""
        pool = self.pool
        reset_infos = self.restart(link)
        start, stop = link.start, link.stop
        pool.rewards[start:stop] = 0.0
        pool.terminated[start:stop] = False
        pool.truncated[start:stop] = True
        if pool._final_flag is not None:  # no final obs: it died with the worker
            pool._final_flag[start:stop] = False
        # The reset info belongs with the observation only when that obs starts the next
        # episode (SAME_STEP); in NEXT_STEP the next step resets again and brings its own.
        same_step = pool.autoreset_mode == AutoresetMode.SAME_STEP
        return [StepInfo(i, reset_infos[i] if same_step else {}, restarted=True) for i in range(start, stop)]

    def restart(self, link: WorkerLink) -> dict[int, dict[str, Any]]:
        """Replace dead ``link``'s process by a new one on the same rows and signals; return its reset infos."""
        pool = self.pool
        old = link.process
        # Warn first: should warnings be errors, the pool stays as it was and the death
        # is found again at the next step.
        warnings.warn(
            f"shmvec: worker {link.index} ({link.envs}, pid {old.pid}) died with {describe_exit(old.exitcode)}; "
            f"restarting it (restart {self.count + 1} of max_restarts={self.max_restarts})",
            RuntimeWarning,
            stacklevel=5,  # the adapter's step_wait
        )
        self.count += 1
        self.claimed = max(0, self.claimed - 1)
        old.join()  # reaped already (exitcode is set): returns at once
        old.close()
        link.process = None
        link.conn.close()
        # Posts the dead worker never took (our commands) or that we never took (its done,
        # any finished send left), and the counts that went with them: the new one starts at 0.
        link.cmd.drain()
        link.done.drain()
        link.finished.drain()
        link.seq = link.sent = link.taken = 0
        link.send_replies.clear()
        link.ctrl[:] = 0
        pool.info_reader.forget(link.index, link.start, link.stop)  # the new one learns its info schemas anew
        link.ctrl[lay.CTRL_OBS_BUFFER] = pool.obs_buffer  # its reset observations belong to the step in progress
        opts = pool.options
        try:
            link.spawn(mp_context(opts.start_method), *self._spawn_args, pool.plan.worker_spin, opts.worker_threads)
            hello = pool.message_from(link, pool.start_limit)
            if isinstance(hello, ErrorReport):  # an env_fn raised
                raise remote_error(hello)
            expected = (pool.single_observation_space, pool.single_action_space)
            for i, (obs_space, action_space) in enumerate(hello.spaces, link.start):
                if not pool.obs_space_match(expected[0], obs_space) or action_space != expected[1]:
                    raise SpaceMismatchError(
                        f"env {i}, rebuilt after its worker died, has spaces {(obs_space, action_space)}; "
                        f"the pool's are {expected}"
                    )
            link.conn.send_bytes(pickle.dumps(pool.attach_message(restart=True)))
            reply = pool.message_from(link, pool.start_limit)
            if isinstance(reply, ErrorReport):  # an env's reset raised
                raise remote_error(reply)
        except BaseException as exc:
            pool._break(f"restarting worker {link.index} ({link.envs}) failed", exc)
        link.owes = IDLE
        return pool.pickled.keep_reset_obs(reply)


class RestartNeeded(Exception):
    """Raised inside the pool when a worker died and a restart is left for it (never escapes a step)."""

    def __init__(self, link: WorkerLink):
        super().__init__(link.index)
        self.link = link
        self.death = link.death()
