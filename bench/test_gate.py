"""The release gate: its verdicts from the rounds' ratios, and one real row against this very commit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.gate import Row

GATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gate.py")


def row(ref: list[float], current: list[float], higher_is_better: bool = False) -> Row:
    return Row("r", "s", higher_is_better, {"ref": ref, "current": current})


@pytest.mark.smoke
@pytest.mark.parametrize(
    "ref, current, higher, verdict",
    [
        ([10.0, 10.0, 10.0], [12.0, 11.5, 13.0], False, "SLOWER"),  # every round slower, median 0.83
        ([10.0, 10.0, 10.0], [12.0, 9.0, 13.0], False, "ok"),  # one round faster: within the spread
        ([10.0, 10.0, 10.0], [10.2, 10.3, 10.1], False, "ok"),  # slower in every round, but within the noise
        ([100.0, 100.0], [80.0, 85.0], True, "SLOWER"),  # a throughput: lower is worse
        ([100.0, 100.0], [120.0, 85.0], True, "ok"),
    ],
)
def test_verdicts(ref, current, higher, verdict):
    assert row(ref, current, higher).verdict(noise=0.05) == verdict


@pytest.mark.smoke
def test_a_failed_child_fails_the_row():
    failed = row([10.0], [10.0])
    failed.errors.append("current (round 1): exit 1")
    assert failed.verdict(0.05) == "FAILED"


@pytest.mark.smoke
def test_a_row_against_this_commit():
    """The whole path: a worktree of HEAD, children on both sides, the table; this tree is HEAD or
    its working copy, so the row is not SLOWER beyond its spread."""
    done = subprocess.run(
        [sys.executable, GATE, "--against", "HEAD", "--rows", "cpu-per-worker", "--rounds", "1", "--noise", "0.9"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| cpu-per-worker | µs |" in done.stdout
    assert "(4, 4) -> (16, 16)" in done.stdout  # the child's layouts, from both trees
