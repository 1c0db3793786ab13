"""Fixtures of the plan's tests."""

from __future__ import annotations

import pytest

from shmvec.planning import plan as autoconfig
from shmvec.planning import plan_memory
from shmvec.planning.machine import Cpus


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(autoconfig, "usable_cpus", lambda: Cpus(2, 2, "2 CPUs"))


@pytest.fixture
def memory(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "plans.json"
    monkeypatch.setenv(plan_memory.CACHE_VAR, str(path))
    return path
