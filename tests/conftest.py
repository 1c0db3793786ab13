"""Shared fixtures: every test must leave no worker process and no /dev/shm entry behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from hypothesis import HealthCheck, Phase, settings

from tests.helpers import descendant_pids, shm_entries

# The default plan's memory of earlier layouts (engine/plan_memory) would tie a test's default pools to earlier runs.
os.environ.setdefault("SHMVEC_PLAN_CACHE", "off")

# The property tests (test_properties*.py) start pools in every example, so examples are
# slow: "ci" (the default) keeps their share of a run bounded, "long" explores on demand
# (SHMVEC_HYPOTHESIS_PROFILE=long).
settings.register_profile(
    "ci",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # explain reruns for minutes
)
settings.register_profile("long", settings.get_profile("ci"), max_examples=1000)
settings.load_profile(os.environ.get("SHMVEC_HYPOTHESIS_PROFILE", "ci"))


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
