"""Smoke tests of the training benchmark (tiny runs, no timing asserts)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import training


@pytest.mark.smoke
def test_plan_rotates_the_impls_and_always_runs_the_reference():
    args = training.parse_args(
        ["--workloads", "ppo-cartpole,cleanrl-cartpole", "--impls", "subproc,shm", "--repeats", "3"]
    )
    runs, skipped = training.plan(args)
    order = [(r.repeat, r.workload, r.impl) for r in runs]
    assert order[:3] == [(0, "ppo-cartpole", "dummy"), (0, "ppo-cartpole", "subproc"), (0, "ppo-cartpole", "shm")]
    assert order[3:5] == [(0, "cleanrl-cartpole", "sync"), (0, "cleanrl-cartpole", "shm")]
    assert [impl for rep, w, impl in order if rep == 1 and w == "ppo-cartpole"] == ["subproc", "shm", "dummy"]
    assert [impl for rep, w, impl in order if rep == 2 and w == "ppo-cartpole"] == ["shm", "dummy", "subproc"]
    assert [impl for rep, w, impl in order if rep == 1 and w == "cleanrl-cartpole"] == ["shm", "sync"]
    assert not any("envpool" in why for why in skipped)  # not asked for


@pytest.mark.smoke
def test_unknown_names_are_refused():
    with pytest.raises(SystemExit):
        training.parse_args(["--workloads", "ppo-nosuchenv"])
    with pytest.raises(SystemExit):
        training.parse_args(["--impls", "shm,fast"])


@pytest.mark.smoke
def test_smoke_training_writes_results_markdown_and_plot(tmp_path):
    """One tiny A2C job per implementation, each in its own process, end to end."""
    assert (
        training.main(
            [
                "--workloads",
                "a2c-cartpole",
                "--impls",
                "dummy,shm",
                "--scale",
                "0.005",
                "--repeats",
                "1",
                "--out",
                str(tmp_path / "training"),
                "--report",
                str(tmp_path / "report.md"),
            ]
        )
        == 0
    )
    out = tmp_path / "training"
    results = json.loads((out / "results.json").read_text())
    rows = {row["impl"]: row for row in results["summary"]}
    assert set(rows) == {"dummy", "shm"}
    for row in rows.values():
        assert row["steps"] >= 150 and row["runs"] == 1
        assert all(row["seconds"][k] > 0 for k in ("rollout", "update", "total", "process"))
        assert row["seconds"]["rollout"] + row["seconds"]["update"] <= row["seconds"]["total"]
        assert row["ratios"]["total"] > 0
    assert rows["dummy"]["ratios"]["total"] == 1.0
    assert rows["shm"]["vec_envs"][0].startswith("ShmPoolVecEnv(") and rows["dummy"]["vec_envs"] == ["DummyVecEnv"]
    text = (out / "training.md").read_text()
    assert text.startswith(training.HEADING) and "| a2c-cartpole | shm |" in text and "nproc" in text
    assert (out / "training.png").stat().st_size > 0
    assert "](training.png)" in (out / "training.md").read_text()  # each names the plot from its own folder
    assert "](training/training.png)" in (tmp_path / "report.md").read_text()


@pytest.mark.smoke
@pytest.mark.parametrize("name", ["her-fetchreach", "maskable-ppo"])
def test_the_workloads_with_rare_calls_build_the_algorithm_that_makes_them(name):
    """SAC with HerReplayBuffer over FetchReach's dict observations; MaskablePPO over an env with action_masks()."""
    from bench.training_jobs import WORKLOADS, build_vec_env, make_model

    workload = WORKLOADS[name]
    if why := workload.missing():
        pytest.skip(why)
    venv = build_vec_env(workload, "dummy")
    try:
        model = make_model(workload, venv, device="cpu")
        if workload.her:
            assert type(model.replay_buffer).__name__ == "HerReplayBuffer" and "HerReplayBuffer" in workload.describe()
            assert set(venv.observation_space.spaces) == {"observation", "achieved_goal", "desired_goal"}
            goal = np.zeros(3)
            assert venv.env_method("compute_reward", goal, goal, {}, indices=[0]) == [0.0]
        else:
            assert type(model).__name__ == "MaskablePPO" and "n_invalid_actions=60" in workload.describe()
            venv.reset()
            masks = venv.env_method("action_masks")
            assert len(masks) == workload.n_envs and [sum(m) for m in masks] == [20] * workload.n_envs
    finally:
        venv.close()


@pytest.mark.smoke
def test_the_continuous_script_workload_runs_its_script_over_sync_and_shm_only():
    """cleanrl-halfcheetah: examples/ppo_continuous.py (CleanRL's ppo_continuous_action), no async twin or EnvPool."""
    from bench.training_jobs import WORKLOADS

    workload = WORKLOADS["cleanrl-halfcheetah"]
    assert workload.impls == ("sync", "shm") and WORKLOADS["cleanrl-cartpole"].impls[2:] == ("shm-async", "envpool")
    argv = workload.command("shm", 1.0, "cpu")
    assert argv[1].endswith("examples/ppo_continuous.py") and argv[argv.index("--vec") + 1] == "shm"
    assert argv[argv.index("--env-id") + 1] == "HalfCheetah-v5" and argv[argv.index("--num-steps") + 1] == "256"
    assert WORKLOADS["cleanrl-cartpole"].command("sync", 1.0, "cpu")[1].endswith("examples/ppo_sync.py")
    with pytest.raises(ValueError, match="shm-async"):
        workload.command("shm-async", 1.0, "cpu")
    args = training.parse_args(
        ["--workloads", "cleanrl-halfcheetah", "--impls", "shm,shm-async,envpool", "--repeats", "1"]
    )
    runs, skipped = training.plan(args)
    if workload.missing():
        assert skipped == [workload.missing()] and not runs
    else:
        assert [(r.workload, r.impl) for r in runs] == [("cleanrl-halfcheetah", "sync"), ("cleanrl-halfcheetah", "shm")]
