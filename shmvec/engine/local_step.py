"""A local pool's step results, and its step when every env is in this process (no worker).

:meth:`LocalStep.step_records` turns what a step's shards sent into the records
:meth:`~shmvec.engine.pool.ShmPool.step_wait` returns (infos copied, infos of shared rows,
episode ends that travelled in rows), for both paths below.

With workers, a step is two held calls (``step_async``, ``step_wait``: Ctrl-C waits until the
posts and counts agree, :mod:`shmvec.ipc.interrupts`). With every env in this process there
is nothing to post, count or wait for: :meth:`LocalStep.step_here` is the whole step as one
direct call, as ``DummyVecEnv`` makes it: no pending state between two calls, no SIGINT
swap (a Ctrl-C raises where it lands, as it would there; the next call starts from the same
state whatever line it stopped), and the main shard's envs stepped straight from their rows.
:meth:`LocalStep.reset_here` and :meth:`LocalStep.run_here` are a reset and a rare call
(``env_method``, ``get_attr``...) made the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import numpy as np

from shmvec.engine.failures import main_shard_error
from shmvec.engine.shard import EnvFailed, Shard, copied_record, merged_records, with_plain_finals, with_shm_finals
from shmvec.ipc.protocol import Reset, StepInfo

_count_nonzero = np.count_nonzero


class LocalStep:
    """Part of :class:`~shmvec.engine.pool.ShmPool`: the end of every step, and the in-process step."""

    main: Shard | None
    links: list
    clock: Any
    caller: Any
    pickled: Any
    info_reader: Any
    info_columns: bool
    terminated: np.ndarray
    truncated: np.ndarray
    _final_obs: np.ndarray | None
    _final_flag: np.ndarray | None
    _obs_buffers: list
    episode_ended = True  # after step_here: whether an env's episode ended in it (True: it may have)

    @property
    def all_here(self) -> bool:
        """Every env is in this process (no worker): :meth:`step_here` may step them."""
        return not self.links and self.main is not None

    def idle_here(self) -> bool:
        """Whether :meth:`step_here` may run now: open, usable, nothing pending, no async batch in
        flight (else the held path raises what the reference raises)."""
        return self.pending is None and not self.closed and self._broken is None and not self.batches.busy

    def step_here(self, pickled_actions: dict[tuple, Any] | None = None, actions: list | None = None) -> list[StepInfo]:
        """``step_async`` and ``step_wait`` of a pool with every env in this process, as one call
        (the caller checked :meth:`idle_here`); the same records. ``actions``: each env's action as it
        gets it, handed over (:func:`~shmvec.ipc.action_rows.handed_over`); None: the caller wrote
        them to the rows."""
        self.pickled.action_blobs(pickled_actions)  # checks them; the main shard's part is main_actions
        if len(self._obs_buffers) > 1:
            self._next_obs_buffer()
        self.caller.step()
        main, failure = self.main, None
        if main.finals_here is None:  # from now on, episode ends come back without their rows
            main.finals_here = []
        main.episode_ended = self.episode_ended = False
        if actions is None:
            actions = main.read_actions(self.pickled.main_actions)
        timer = main.timer  # its clock reads are the envs' time (None: timings=False, nothing counts)
        try:
            main_infos = main.step(actions)
        except EnvFailed as exc:
            main_infos, failure = [], exc
        if timer is not None:
            self.clock.stepped(timer.took_ns(failure is not None) * 1e-9)
        if failure is not None:
            raise main_shard_error(failure)  # outside the except: the env's own exception, as step_wait raises it
        self.episode_ended = main.episode_ended  # False: every env's flags are False (the adapters' shortcut)
        finals, main.wrote_final = main.wrote_final, False  # no final row written: no flag to look for
        # only the main shard writes info rows here: it knows whether this step wrote any
        records = self.step_records(main_infos, [], rows_infos=main.wrote_infos, finals=finals)
        self.caller.returned()
        return records

    def reset_here(self, kwargs: dict[int, dict[str, Any]]) -> dict[int, Any]:
        """A reset request (``{env: reset kwargs}``) with every env in this process, as one direct call
        (the caller checked :meth:`idle_here`): the main shard resets them; ``{env: info}``, as
        ``call_async`` and ``call_wait`` of a :class:`~shmvec.ipc.protocol.Reset` return."""
        try:
            results = self.main.handle(Reset(kwargs))
        except EnvFailed as exc:
            failure = exc
        else:
            return self.pickled.keep_reset_obs(results)
        raise main_shard_error(failure)  # outside the except: the env's own exception, as call_wait raises it

    def run_here(self, op: Callable[[Any], Any], targets: Iterable[int]) -> list[Any]:
        """``op(env_i)`` for each env index ``i`` of ``targets``, in order, with every env in this process, as
        one direct call (the caller checked :meth:`idle_here`): the main shard runs them as it runs a
        :class:`~shmvec.ipc.protocol.RunOps` request, in the order given (an env named twice runs twice, as
        ``DummyVecEnv`` runs it); the first to raise raises its own exception, as ``run`` raises it."""
        try:
            return self.main.run_ops(zip(targets, repeat(op)))
        except EnvFailed as exc:
            failure = exc
        raise main_shard_error(failure)  # outside the except: the env's own exception, as run raises it

    def step_records(
        self, main_infos: list[StepInfo], replies: list[list[StepInfo]], rows_infos: bool = True, finals: bool = True
    ) -> list[StepInfo]:
        """A step's records in env order: the workers' ``replies``, then the main shard's infos (copied,
        as workers' infos arrive), the infos of shared rows (or :attr:`info_groups`) and the episode ends
        that travelled in rows. ``rows_infos``/``finals`` False: no info row / final row can have been
        written (a flag a failed step left is masked anyway: an env that ends rewrites its own)."""
        main_infos = [copied_record(r) for r in main_infos] if main_infos else []
        records = [r for reply in replies for r in reply] + main_infos if any(replies) else main_infos
        records = self.pickled.keep_obs(records)
        self.info_groups = []
        if rows_infos and _count_nonzero(self.info_reader.codes):  # infos in shared rows (workers, or the main shard)
            if self.info_columns:
                self.info_groups = self.info_reader.groups()
            else:
                records = merged_records(records, [StepInfo(i, info) for i, info in self.info_reader.infos()])
        kept = self.main.finals_here if self.main is not None else None
        if kept:  # the main shard's, when the in-process step has stepped it
            records, self.main.finals_here = with_plain_finals(records, kept), []
        flags = self._final_flag
        if finals and flags is not None and _count_nonzero(flags):  # one count (~0.3 µs) while no episode ends
            ended = (flags & (self.terminated | self.truncated)).nonzero()[0]  # not one a failed step left behind
            records = with_shm_finals(records, self._final_obs, ended)
            flags[ended] = False  # taken
        return records
