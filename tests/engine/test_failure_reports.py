"""Unit tests of shmvec.engine.failures: how exits and remote errors are described and rebuilt.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test
(``test_failures.py``).
"""

from __future__ import annotations

import pytest

from shmvec.engine.failures import describe_exit, ranges, remote_error
from shmvec.errors import EnvError, RemoteTraceback
from shmvec.ipc.protocol import ErrorReport
from tests.held_call_envs import Unprintable


@pytest.mark.parametrize(
    "exitcode, words",
    [
        (0, "exit code 0"),
        (3, "exit code 3"),
        (-9, "signal SIGKILL (killed from outside, e.g. by the out-of-memory killer)"),
        (-11, "signal SIGSEGV (a crash in native code)"),
        (-7, "signal SIGBUS (a crash in native code, or shared memory ran out)"),
        (-15, "signal SIGTERM"),
        (-200, "signal 200"),
    ],
)
def test_describe_exit(exitcode, words):
    assert describe_exit(exitcode) == words


@pytest.mark.parametrize(
    "indices, text",
    [
        ([], ""),
        ([4], "4"),
        ([0, 1], "0..1"),
        ([0, 1, 2, 5], "0..2, 5"),
        ([1, 3, 5], "1, 3, 5"),
        ([2, 3, 7, 8, 9, 11], "2..3, 7..9, 11"),
    ],
)
def test_ranges(indices, text):
    assert ranges(indices) == text


class Unpicklable(Exception):
    """Its __init__ takes two arguments but ``args`` keeps one: unpickling it fails."""

    def __init__(self, what, extra):
        super().__init__(what)
        self.extra = extra


def captured(exc: BaseException, worker: int, env_index: int | None) -> ErrorReport:
    try:
        raise exc
    except BaseException as raised:
        return ErrorReport.capture(worker, env_index, raised)


def test_remote_error_is_the_original_exception_with_where_and_traceback():
    exc = remote_error(captured(KeyError("lost"), worker=1, env_index=3))
    assert type(exc) is KeyError and exc.args == ("lost",)
    assert exc.__notes__ == ["shmvec: raised in env 3 (worker 1); the remote traceback is shown above"]
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "KeyError: 'lost'" in exc.__cause__.tb and "in captured" in exc.__cause__.tb
    assert (exc.env_index, exc.worker_index) == (3, 1)


def test_remote_error_of_a_worker_names_the_worker_only():
    exc = remote_error(captured(RuntimeError("boom"), worker=2, env_index=None))
    assert exc.__notes__ == ["shmvec: raised in worker 2; the remote traceback is shown above"]
    assert (exc.env_index, exc.worker_index) == (None, 2)


def test_remote_error_of_an_unpicklable_exception_is_an_env_error():
    report = captured(Unpicklable("odd", 1), worker=0, env_index=1)
    assert report.exception is None
    exc = remote_error(report)
    assert type(exc) is EnvError
    assert str(exc) == f"{Unpicklable.__module__}.Unpicklable: odd"
    assert "Unpicklable: odd" in exc.__cause__.tb
    assert (exc.env_index, exc.worker_index) == (1, 0)


def test_an_exception_whose_str_raises_is_reported_with_a_placeholder():
    report = captured(Unprintable("the env failed"), worker=0, env_index=2)
    assert report.message == "<str() of the Unprintable raised RuntimeError>"
    assert "Unprintable" in report.traceback
    exc = remote_error(report)
    assert type(exc) is Unprintable and exc.args == ("the env failed",)  # the env's own, as any other
    assert (exc.env_index, exc.worker_index) == (2, 0)
