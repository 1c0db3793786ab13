"""Smoke tests of bench/scaling.py (tiny runs, no timing asserts): every section runs and reports."""

from __future__ import annotations

import argparse

import pytest


@pytest.mark.smoke
def test_every_section_runs_and_makes_its_report_and_plot(tmp_path):
    from bench import scaling

    results = {
        "waiting": scaling.waiting_section([2], [1], wait=1e-4, seconds=0.02, rounds=1),
        "cpu": scaling.cpu_section(["CartPole-v1"], [2], seconds=0.02, rounds=1),
        "projection": {
            "per_worker_us": 5.0,
            "workers": {"K=4": {"main_cpu_us": 20.0}, "K=64": {"main_cpu_us": 320.0}},
            "per_env_us": {"ShmPoolVecEnv, no infos": 0.8, "ShmVectorEnv, 11-key infos": 10.0},
        },
    }
    rows = results["waiting"]["2"]
    assert {"DummyVecEnv", "SubprocVecEnv", "shmvec default", "shmvec n_workers=1"} == set(rows)
    assert all(0 < row["of_limit"] and row["steps_per_s"] > 0 for row in rows.values())
    assert rows["shmvec n_workers=1"]["workers_uss_mb"] > 0 and rows["DummyVecEnv"]["workers_uss_mb"] == 0
    assert results["cpu"]["CartPole-v1 x2"]["DummyVecEnv"]["vs_dummy"] == 1.0
    args = argparse.Namespace(wait_ms=0.1)
    text = scaling.markdown(results, args)
    assert text.startswith(scaling.HEADING) and "| 2 | shmvec default |" in text and "128 cores" in text
    scaling.plot(results, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 1000


@pytest.mark.smoke
def test_the_projection_takes_the_best_lane_count():
    from bench.scaling import projected_speedup

    # no serial work: the envs spread over every core; much of it: fewer lanes do better than all
    assert projected_speedup(1e-4, 16, 1024, 0.0, 0.0) == pytest.approx(16.0)
    busy = projected_speedup(7e-6, 128, 1024, 1e-6, 50e-6)
    assert busy == max(projected_speedup(7e-6, c, 1024, 1e-6, 50e-6) for c in (1, 8, 32, 128))
