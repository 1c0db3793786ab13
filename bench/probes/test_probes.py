"""Smoke tests of the machine probes (tiny runs, no timing asserts)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.smoke
def test_the_per_cpu_probe_times_each_cpu_with_all_busy_then_alone():
    from bench.probes.scaling_probe import SAMPLE_SECONDS, per_cpu

    cpus = sorted(os.sched_getaffinity(0))[:2]
    rows = per_cpu(cpus, seconds=SAMPLE_SECONDS * 1.5)
    labels = [f"cpu {cpu} (all busy)" for cpu in cpus] if len(cpus) > 1 else []
    assert list(rows) == labels + [f"cpu {cpu} (alone)" for cpu in cpus]
    assert all(len(figures) == 2 and min(figures) > 0.0 for figures in rows.values())
