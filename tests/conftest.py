"""Shared fixtures: every test must leave no worker process and no /dev/shm entry behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest

SHM_DIR = "/dev/shm"


def shm_entries() -> set[str]:
    """Our segments and semaphores in /dev/shm (semaphores show up as sem.<name>).

    Only this process's (names embed the owner's pid): other test runs or benchmarks on
    the same machine must not make our tests fail.
    """
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return set()
    ours = f"shmvec_{os.getpid()}_"
    return {n for n in names if n.startswith(ours) or n.startswith("sem." + ours)}


def worker_pids() -> set[int]:
    """Descendant processes except multiprocessing's long-lived helpers.

    The forkserver and the resource tracker live for the whole session; the workers a
    forkserver forks carry the same command line, so they are told apart by their parent.
    """
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            parent_cmdline = " ".join(child.parent().cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, AttributeError):
            continue
        if "resource_tracker" in cmdline:
            continue
        if "forkserver" in cmdline and "forkserver" not in parent_cmdline:
            continue  # the server itself, not one of its workers
        pids.add(child.pid)
    return pids


def wait_until_clean(before_shm: set[str], before_pids: set[int], timeout: float = 5.0) -> tuple[set, set]:
    deadline = time.monotonic() + timeout
    while True:
        extra_shm = shm_entries() - before_shm
        extra_pids = worker_pids() - before_pids
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
    before_shm, before_pids = shm_entries(), worker_pids()
    yield
    extra_shm, extra_pids = wait_until_clean(before_shm, before_pids)
    for pid in extra_pids:  # do not let one leak cascade into every later test
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    assert not extra_shm, f"{request.node.name} left shared memory behind: {sorted(extra_shm)}"
    assert not extra_pids, f"{request.node.name} left processes behind: {sorted(extra_pids)}"
