"""Smoke tests of the report CLI and the target checks (tiny runs, no timing asserts)."""

from __future__ import annotations

import os

import pytest

from bench import report
from bench.measure import SMOKE_TIMING
from bench.targets import Target, run_targets


@pytest.mark.smoke
def test_smoke_report_writes_markdown_and_plots(tmp_path):
    assert (
        report.main(
            ["--grid", "smoke", "--out", str(tmp_path), "--impls", "dummy,sync,shm_gym", "--sections", "grid,overhead"]
        )
        == 0
    )
    text = (tmp_path / "report.md").read_text()
    assert "## Throughput" in text and "## Per-step overhead" in text
    assert (tmp_path / "throughput_CartPole-v1.png").stat().st_size > 0
    assert (tmp_path / "overhead.png").exists() and (tmp_path / "results.json").exists()


@pytest.mark.smoke
def test_smoke_targets_report_a_ratio_or_a_reason():
    targets = [Target("CartPole-v1", 4, 2, "dummy", 1.0, "smoke"), Target("NoSuchEnv-v0", 2, 1, "dummy", 1.0, "smoke")]
    checks, _ = run_targets(targets, timing=SMOKE_TIMING, impls=["shm_sb3"])
    assert checks[0].status in ("PASS", "FAIL") and checks[0].ratio > 0
    assert checks[1].status == "SKIP" or checks[1].ratio is None


@pytest.mark.smoke
def test_smoke_memory_section(tmp_path):
    assert (
        report.main(["--grid", "smoke", "--out", str(tmp_path), "--impls", "dummy,shm_gym", "--sections", "memory"])
        == 0
    )
    assert "PSS (MiB)" in (tmp_path / "report.md").read_text()
    assert os.path.exists(tmp_path / "results.json")
