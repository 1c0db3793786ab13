"""Shared fixtures: every test must leave no worker process and no /dev/shm entry behind."""

from __future__ import annotations

import time

import psutil
import pytest
from helpers import descendant_pids, shm_entries


def wait_until_clean(before_shm: set[str], before_pids: set[int], timeout: float = 5.0) -> tuple[set, set]:
    deadline = time.monotonic() + timeout
    while True:
        extra_shm = shm_entries() - before_shm
        extra_pids = descendant_pids() - before_pids
        if (not extra_shm and not extra_pids) or time.monotonic() > deadline:
            return extra_shm, extra_pids
        time.sleep(0.05)


@pytest.fixture
def closing():
    """Register vector envs to be closed at teardown, even when the test fails.

    Usage: ``env = closing(ShmPoolVecEnv(...))``.
    """
    envs = []

    def register(env):
        envs.append(env)
        return env

    yield register
    for env in reversed(envs):
        env.close()


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves worker processes or /dev/shm entries behind."""
    before_shm, before_pids = shm_entries(), descendant_pids()
    yield
    extra_shm, extra_pids = wait_until_clean(before_shm, before_pids)
    for pid in extra_pids:  # do not let one leak cascade into every later test
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    assert not extra_shm, f"{request.node.name} left shared memory behind: {sorted(extra_shm)}"
    assert not extra_pids, f"{request.node.name} left processes behind: {sorted(extra_pids)}"
