"""The pool options: declared, documented and checked once, shared by the engine and both adapters."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import numbers
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

# Upper bound (seconds) of the adaptive spins (engine.plan._with_waits allows longer ones
# while every busy process has a core). Long enough to cover a light shard's step, so a
# hand-off costs a spin (microseconds) rather than a wake-up from a blocked wait; short
# next to a wake-up's cost when it misses. More processes than cores do not make it
# costly: waits that outgrow it turn the spin off (ipc.signals).
DEFAULT_SPIN = 200e-6


@dataclass(frozen=True)
class PoolOptions:
    """How a pool runs its envs. Every adapter accepts these as keyword arguments.

    Args:
        n_workers: worker processes. ``None`` (default): chosen at start-up from the
            usable cores and the env's step cost, timed on one extra env built from
            ``env_fns[-1]`` in a throwaway process of its own, never in the main process
            (:mod:`shmvec.engine.timing_run`; the plan: :mod:`shmvec.planning.plan`): all envs
            in-process, the main process plus workers, or workers only; envs that mostly
            wait (their step is little CPU) get more workers than cores. The choice is
            logged (logger ``"shmvec"``) and shown by ``repr()``. An int gives exactly
            that many worker processes; ``0``, none: every env steps in this process
            (``use_main_process`` is implied). Envs are split into contiguous shards whose
            sizes differ by at most one. Isolation (one env per process, none in the
            main process, for native libraries that allow one instance per process) is
            guaranteed only by ``n_workers=num_envs`` with ``use_main_process`` unset.
        start_method: ``"fork"``, ``"forkserver"`` or ``"spawn"``; default forkserver where
            available (as SB3). Under forkserver and spawn a worker does not import the main
            script (:mod:`~shmvec.processes.lean_start`) unless ``import_main=True``; what the
            script set up that can be carried without it (logging, warnings filters,
            environment variables, the ``random``/``np.random`` states, Gymnasium's registry)
            is applied in each worker (:mod:`~shmvec.processes.script_setup`). Under fork a
            worker inherits a copy of the process.
        worker_init: a picklable callable run with no arguments in every worker process,
            after the script's set-up is applied and before the worker builds its envs: for
            what a worker cannot take from the script without running it (a monkeypatch,
            a library's import-time setting, torch's default dtype). Not run in the main
            process (envs there see the script itself). With ``n_workers=None`` and
            ``use_main_process`` unset, a pool that has it (or ``import_main``) may mix envs in
            the main process and in workers; one without it does so only where the script
            has nothing workers would miss (:mod:`~shmvec.processes.script_check`).
        import_main: workers import the main script (as ``__mp_main__``, skipping its
            ``if __name__ == "__main__":`` block) before building their envs, as
            ``SubprocVecEnv``'s do under forkserver and spawn: everything at the script's top
            runs again in every worker (with torch imported there, ~150 MB and ~0.6 s each).
            Needs a script file (not ``python -c`` or a notebook); no effect under fork.
        daemon: workers (and the timing process) are daemonic processes (default), as
            ``SubprocVecEnv``'s; ``False``, as ``AsyncVectorEnv(daemon=False)``, lets an env
            start ``multiprocessing`` children of its own (a daemonic process may not). Either
            way a worker exits when this process dies, even by SIGKILL, and ``close()`` ends it.
        timeout: seconds to wait for any answer from the workers before raising
            :class:`~shmvec.errors.StepTimeoutError`; ``None`` waits as long as they live.
            Building the envs at start-up gets at least 30 s.
        worker_threads: torch/OpenMP/BLAS threads per worker (default 1); ``None`` leaves
            them alone.
        max_spin: seconds a waiter may spin before blocking (spinning turns off while most
            waits outgrow it); while every busy process has a core, waits the pool can
            predict may spin longer (up to 2 ms, see :mod:`shmvec.planning.plan`). ``0``
            always blocks.
        use_main_process: the main process steps some envs itself (the last ones) while the
            workers step theirs. Fastest for light envs, as no wake-up sits on the critical
            path, but those envs share the main process: a crash there is not isolated.
            ``None`` (default): chosen with ``n_workers=None``, implied by ``n_workers=0``
            (``False`` with it is a ``ValueError``), ``False`` with ``n_workers`` >= 1.
            (Its former name ``main_shard`` still works, with a ``DeprecationWarning``.)
        on_worker_failure: ``"raise"`` (default): a worker process that dies (exit, signal)
            raises :class:`~shmvec.errors.WorkerDiedError` and the pool is unusable.
            ``"restart"``: during a step, the worker is re-created from its envs' env_fns
            and its envs are reset (seed ``None``); that step reports each of them as
            truncated with reward 0 and the info flag ``"shmvec_restarted"`` (the adapters
            document the details). Each restart warns (``RuntimeWarning``). Deaths during
            other calls (reset, get_attr, ...) still raise.
        max_restarts: restarts allowed over the pool's life with ``"restart"``; one more
            death raises ``WorkerDiedError`` saying the budget is used up.
        backend: ``"local"`` (default): the workers run on this machine. ``"ray"``: the
            envs are split into contiguous shards, one per Ray node; on each node one Ray
            actor runs a local pool of ``n_workers`` processes (and reserves ``n_workers``
            CPUs, 1 if unset or 0: with ``n_workers=0`` the actor steps its envs itself).
            Needs Ray (shmvec's ``[ray]`` extra) and a Ray cluster (``ray.init(...)``
            first, else shmvec connects with ``address="auto"``). A
            node actor that dies raises ``WorkerDiedError`` naming the node, or in
            ``"restart"`` mode is re-created by Ray (its envs report a truncation).
        n_nodes: ``backend="ray"`` only: how many nodes (one actor on each, on distinct
            nodes); ``None`` uses every alive node with enough CPUs.
        omp_spin: how long the main process's idle OpenMP threads (torch's intra-op
            threads) spin after each op while the caller steps the pool. ``"auto"``
            (default): short (microseconds instead of GNU OpenMP's milliseconds) when the
            pool has worker processes and torch runs more than one thread, so that a
            policy's threads do not hold the cores the workers step on; they keep their
            number, and the default spin is back once the caller pauses stepping (its
            update) and at ``close()`` (see :mod:`shmvec.processes.omp_spin`).
            ``"short"``: whenever GNU OpenMP is loaded. ``"unchanged"``: never. Local
            backend only.
        timings: ``True`` (default): each lane (a worker, the main shard) writes when its
            steps ran into shared rows (~1 µs per lane step; each env timed on one step in
            16) and the main thread's public calls are clocked (~0.5 µs a call), for
            ``envs.timings``. ``False``: neither, and ``envs.timings`` raises; for those who
            want the last microsecond of a bare stepping loop.
        torch_threads: torch's intra-op thread count in the thread that steps the pool.
            ``"auto"`` (default): when the pool has worker processes and the caller's
            compute between steps is light (a median under ~1 ms over 16 steps: an MLP
            policy's forward pass), torch runs on the cores the workers leave (at least
            1, never more than before), so that the policy's idle threads do not take
            the workers' cores; back to torch's own count once that compute turns heavy
            (over ~2 ms: a CNN's forward pass, a gradient step between steps), and at
            ``close()``. The update between rollouts runs on the reduced count as well
            (see :mod:`shmvec.processes.caller_threads`). An int: that many threads from the
            first step to ``close()``. ``"unchanged"``: never. Local backend only.
    """

    n_workers: int | None = None
    start_method: str | None = None
    timeout: float | None = None
    worker_threads: int | None = 1
    max_spin: float = DEFAULT_SPIN
    use_main_process: bool | None = None
    on_worker_failure: Literal["raise", "restart"] = "raise"
    max_restarts: int = 3
    backend: Literal["local", "ray"] = "local"
    n_nodes: int | None = None
    omp_spin: Literal["auto", "short", "unchanged"] = "auto"
    torch_threads: Literal["auto", "unchanged"] | int = "auto"
    timings: bool = True
    worker_init: Callable[[], Any] | None = None
    import_main: bool = False
    daemon: bool = True

    def __post_init__(self) -> None:
        for name in ("n_workers", "worker_threads", "max_restarts", "n_nodes", "torch_threads"):
            object.__setattr__(self, name, _as_int(getattr(self, name)))  # np.int64(2) means 2
        if isinstance(self.timings, np.bool_):
            object.__setattr__(self, "timings", bool(self.timings))
        if self.n_workers == 0:  # every env in this process: the main process steps them
            if self.use_main_process is not None and not self.use_main_process:
                raise ValueError(
                    "n_workers=0 puts every env in this process: "
                    "use_main_process=False leaves nothing to step them; pass n_workers >= 1 for worker processes"
                )
            object.__setattr__(self, "use_main_process", True)
        if self.start_method is None:  # only None means "the default": "" is a typo, as for mp.get_context
            object.__setattr__(self, "start_method", default_start_method())
        mp.get_context(self.start_method)  # ValueError: cannot find context for 'illegal_method'
        if self.timeout is not None and not (isinstance(self.timeout, numbers.Real) and self.timeout > 0):
            raise ValueError(f"timeout must be positive seconds or None, got {self.timeout!r}")
        if self.worker_threads is not None and not _is_int(self.worker_threads, lowest=1):
            raise ValueError(f"worker_threads must be an int >= 1 or None, got {self.worker_threads!r}")
        if not isinstance(self.max_spin, numbers.Real) or self.max_spin < 0:
            raise ValueError(f"max_spin must be seconds >= 0, got {self.max_spin!r}")
        if self.on_worker_failure not in ("raise", "restart"):
            raise ValueError(f'on_worker_failure must be "raise" or "restart", got {self.on_worker_failure!r}')
        if not _is_int(self.max_restarts, lowest=0):
            raise ValueError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        if self.use_main_process is not None:
            object.__setattr__(self, "use_main_process", bool(self.use_main_process))
        if self.backend not in ("local", "ray"):
            raise ValueError(f'backend must be "local" or "ray", got {self.backend!r}')
        if self.n_nodes is not None and not _is_int(self.n_nodes, lowest=1):
            raise ValueError(f"n_nodes must be an int >= 1 or None, got {self.n_nodes!r}")
        if self.omp_spin not in ("auto", "short", "unchanged"):
            raise ValueError(f'omp_spin must be "auto", "short" or "unchanged", got {self.omp_spin!r}')
        if self.torch_threads not in ("auto", "unchanged") and not _is_int(self.torch_threads, lowest=1):
            raise ValueError(f'torch_threads must be "auto", "unchanged" or an int >= 1, got {self.torch_threads!r}')
        if self.worker_init is not None and not callable(self.worker_init):
            raise TypeError(f"worker_init must be a callable taking no arguments, got {self.worker_init!r}")
        object.__setattr__(self, "import_main", bool(self.import_main))
        object.__setattr__(self, "daemon", bool(self.daemon))
        if not isinstance(self.timings, bool):
            raise TypeError(f"timings must be True or False, got {self.timings!r}")
        if self.backend == "local" and self.n_nodes is not None:
            raise ValueError(f'n_nodes={self.n_nodes!r} places envs on Ray nodes: pass backend="ray" too')

    @classmethod
    def from_kwargs(cls, owner: str, **kwargs: Any) -> PoolOptions:
        """Build from an adapter's keyword arguments; an unknown one is a TypeError naming ``owner``."""
        names = [field.name for field in dataclasses.fields(cls)]
        if "main_shard" in kwargs:
            if "use_main_process" in kwargs:
                raise TypeError(f"{owner}() got main_shard and use_main_process: pass use_main_process only")
            warnings.warn(
                "main_shard is now called use_main_process: the old name still works",
                DeprecationWarning,
                stacklevel=_callers_level(),
            )
            kwargs["use_main_process"] = kwargs.pop("main_shard")
        for key in kwargs:
            if key not in names:
                raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}; pool options are {names}")
        return cls(**kwargs)

    @property
    def main_shard(self) -> bool | None:
        """``use_main_process``, by the engine's name for the envs the main process steps (its main shard)."""
        return self.use_main_process

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Options pickled before ``main_shard`` was renamed load too."""
        if "main_shard" in state:
            state = {("use_main_process" if key == "main_shard" else key): value for key, value in state.items()}
        self.__dict__.update({"daemon": True, **state})  # pickled before daemon existed: as they ran

    def workers_for(self, num_envs: int) -> int:
        """The number of worker processes for ``num_envs`` envs (checked); ``n_workers=None``
        gives one per usable core here (the pool times the envs and chooses instead)."""
        n_workers = self.n_workers
        if n_workers is None:
            n_workers = min(num_envs, len(os.sched_getaffinity(0))) - bool(self.main_shard)
        lowest, highest = (0, num_envs - 1) if self.main_shard else (1, num_envs)
        if not _is_int(n_workers, lowest) or n_workers > highest:
            raise ValueError(
                f"n_workers must be an int between {lowest} and {highest} for {num_envs} envs"
                f"{' with use_main_process=True' if self.main_shard else ''}, got {n_workers!r}"
            )
        return n_workers


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside shmvec and Gymnasium (``gym.make_vec``): the
    user's line, whichever entry point led here."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in ("shmvec", "gymnasium"):
        frame, level = frame.f_back, level + 1
    return level


def default_start_method() -> str:
    """forkserver where available, else spawn (the choice SB3's SubprocVecEnv makes)."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _as_int(value: Any) -> Any:
    """A numpy integer as Python's ``int`` (bools, Python's and numpy's, stay as they are: refused)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return value


def _is_int(value: Any, lowest: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lowest


def options_doc() -> str:
    """The ``Args`` entries of :class:`PoolOptions`, for the adapters' docstrings."""
    doc = PoolOptions.__doc__ or ""
    return doc[doc.index("Args:") + len("Args:") :].rstrip()
