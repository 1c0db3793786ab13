"""pytest configuration of the benchmark suite (``python -m pytest bench``).

Markers: ``smoke`` (seconds; what CI runs with ``--benchmark-disable``), ``quick``
(a small grid), ``full`` (the whole grid; long). Configurations whose library or env
is not installed are skipped with the reason.
"""

from __future__ import annotations

import pytest

from bench.impls import get_impl
from bench.measure import Config, Session, actions_for, preload_forkserver
from bench.workloads import get_workload


def pytest_configure(config):
    for name, doc in [
        ("smoke", "fast check that every implementation and the report still work"),
        ("quick", "a small benchmark grid"),
        ("full", "the whole benchmark grid (long)"),
    ]:
        config.addinivalue_line("markers", f"{name}: {doc}")
    preload_forkserver()


@pytest.fixture
def open_session():
    """``open_session(config)`` -> a live :class:`~bench.measure.Session`, closed at teardown.

    Skips the test when the implementation or the env is not available here.
    """
    sessions = []

    def open_(config: Config) -> Session:
        why = get_impl(config.impl).missing() or get_workload(config.workload).missing()
        if why:
            pytest.skip(why)
        session = Session(config, actions_for(get_workload(config.workload), config.n))
        sessions.append(session)
        return session

    yield open_
    for session in sessions:
        session.close()
