"""Turning what went wrong in a worker or env into the exception the user sees."""

from __future__ import annotations

import signal

from typing import Any, NoReturn

from shmvec.errors import AlreadyPendingError, ClosedEnvError, MainModuleError, RemoteTraceback, WorkerDiedError
from shmvec.ipc.protocol import ErrorReport
from shmvec.engine.shard import EnvFailed

CLOSE_HINT = "; close() the env and create a new one"


def remote_error(report: ErrorReport) -> BaseException:
    """The worker's exception, re-raisable here, with where it happened and its traceback."""
    where = f"worker {report.worker}"
    if report.env_index is not None:
        where = f"env {report.env_index} ({where})"
    exc = report.rebuild()
    exc.add_note(f"shmvec: raised in {where}; the remote traceback is shown above")
    exc.__cause__ = RemoteTraceback(report.traceback)
    exc.env_index = report.env_index  # type: ignore[attr-defined]
    exc.worker_index = report.worker  # type: ignore[attr-defined]
    return exc


def main_shard_error(failure: EnvFailed) -> BaseException:
    """An env of the main shard raised: its own exception, saying where."""
    exc = failure.__cause__
    exc.add_note(f"shmvec: raised in env {failure.env_index} (main process shard)")
    exc.env_index = failure.env_index  # type: ignore[attr-defined]
    exc.worker_index = None  # type: ignore[attr-defined]
    return exc


def describe_exit(exitcode: int) -> str:
    """A process exit code in words: 'exit code 3', 'signal SIGKILL (killed from outside, ...)'."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
    return f"signal {name}" + SIGNAL_HINTS.get(name, "")


SIGNAL_HINTS = {
    "SIGKILL": " (killed from outside, e.g. by the out-of-memory killer)",
    "SIGSEGV": " (a crash in native code)",
    "SIGBUS": " (a crash in native code, or shared memory ran out)",
}


def ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0..2, 5': short, for error messages about many envs."""
    parts, start = [], None
    for n, i in enumerate(indices):
        if start is None:
            start = i
        if n + 1 == len(indices) or indices[n + 1] != i + 1:
            parts.append(str(i) if i == start else f"{start}..{i}")
            start = None
    return ", ".join(parts)


# Exit code of a worker that found itself re-importing the user's main script and creating
# a pool there (validation.check_not_bootstrapping): the script lacks a __main__ guard.
UNGUARDED_MAIN_EXIT = 86


def unguarded_main_error(exitcode: int | None, start_method: str) -> MainModuleError | None:
    """The error for a worker that died re-importing an unguarded main script, else None."""
    if exitcode != UNGUARDED_MAIN_EXIT:
        return None
    return MainModuleError(
        f"the worker processes could not start: with start_method={start_method!r} every worker re-imports "
        "your main script, and that script creates a shmvec vector env when imported. Put the code that "
        'creates and uses it under `if __name__ == "__main__":` (see the README quickstart), or pass '
        'start_method="fork".'
    )


class Breakable:
    """The closed/broken/pending state every pool (local, Ray) shares: "broken" is one transition."""

    closed = False
    _broken: str | None = None  # why the pool is unusable
    pending: str | None = None  # "step" or "request": what the next wait collects
    batches: Any  # the pool's async schedule (``busy``: sends in flight or results not received)

    def _break(self, reason: str, error: BaseException | type[BaseException] = WorkerDiedError) -> NoReturn:
        """Remember why the pool is unusable, and raise ``error`` (a class gets the reason and the hint to close)."""
        self._broken = reason
        if isinstance(error, type):
            error = error(reason + CLOSE_HINT)
        error.__suppress_context__ = True  # e.g. the broken pipe that revealed the death says nothing more
        raise error

    def ensure_can_step(self, beside_sends: bool = False) -> None:
        """Raise at once if a step cannot start now (closed, broken, or a call pending).
        ``beside_sends``: async sends in flight do not stop it (an async reset of other envs)."""
        self.check_usable()
        if self.pending == "step":
            raise AlreadyPendingError("step_async() called while a step is already pending; call step_wait() first", "step")
        if self.pending == "request":
            raise AlreadyPendingError("a call is pending; wait for it before stepping", "request")
        if self.batches.busy and not beside_sends:
            raise AlreadyPendingError("envs have sends in flight or results not received: recv() them first", "send")

    def check_usable(self) -> None:
        if self.closed:
            raise ClosedEnvError("this vector env is closed; create a new one")
        if self._broken is not None:
            raise WorkerDiedError(f"the pool is unusable: {self._broken}{CLOSE_HINT}")
