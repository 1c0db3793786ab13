"""Smoke tests of the machine probes (tiny runs, no timing asserts)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.smoke
def test_the_pause_probe_times_every_pause_in_both_modes_beside_the_tight_loop():
    from bench.probes.pause_probe import probe, table

    results = probe([0.0002, 0.001], samples=3, rounds=2)
    assert set(results) == {(0.0, "busy"), (0.0002, "sleep"), (0.0002, "busy"), (0.001, "sleep"), (0.001, "busy")}
    assert all(seconds > 0.0 for seconds in results.values())
    lines = table(results).splitlines()
    assert len(lines) == 4  # the tight loop, the header, one line per pause
    assert lines[2].startswith("  0.2 ms") and lines[3].startswith("  1.0 ms")


@pytest.mark.smoke
def test_the_per_cpu_probe_times_each_cpu_with_all_busy_then_alone():
    from bench.probes.scaling_probe import SAMPLE_SECONDS, per_cpu

    cpus = sorted(os.sched_getaffinity(0))[:2]
    rows = per_cpu(cpus, seconds=SAMPLE_SECONDS * 1.5)
    labels = [f"cpu {cpu} (all busy)" for cpu in cpus] if len(cpus) > 1 else []
    assert list(rows) == labels + [f"cpu {cpu} (alone)" for cpu in cpus]
    assert all(len(figures) == 2 and min(figures) > 0.0 for figures in rows.values())
