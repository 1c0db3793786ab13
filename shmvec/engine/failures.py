"""Turning what went wrong in a worker or env into the exception the user sees."""

from __future__ import annotations

import signal

from shmvec.engine.shard import EnvFailed
from shmvec.errors import RemoteTraceback
from shmvec.ipc.protocol import ErrorReport


def remote_error(report: ErrorReport) -> BaseException:
    """The worker's exception, re-raisable here, with where it happened and its traceback."""
    where = f"worker {report.worker}"
    if report.env_index is not None:
        where = f"env {report.env_index} ({where})"
    exc = rebuilt(report, where)
    exc.worker_index = report.worker  # type: ignore[attr-defined]
    return exc


def rebuilt(report: ErrorReport, where: str) -> BaseException:
    """The exception of ``report`` (a worker's or a node's), noting ``where`` it was raised, its traceback as cause."""
    exc = report.rebuild()
    exc.add_note(f"shmvec: raised in {where}; the remote traceback is shown above")
    exc.__cause__ = RemoteTraceback(report.traceback)
    exc.env_index = report.env_index  # type: ignore[attr-defined]
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


def not_answered(envs: list[int], within: str, why: str = "an env step hangs?") -> str:
    """The message of a timeout: which ``envs`` did not answer ``within`` (e.g. 'timeout=5s'), and the likely cause."""
    return f"envs {ranges(envs)} did not answer within {within} ({why})"
