"""``python -m shmvec.tune``: a short run measures every implementation and recommends what
``n_workers=None`` chooses (no timing asserts: only that it runs and agrees with autoconfig)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shmvec.planning import plan as autoconfig
from shmvec.tools import tune
from shmvec.tools.stand_in import stand_in_policy

pytestmark = pytest.mark.vector_api  # the tuner, which measures ShmVectorEnv: Gymnasium 1.1 on (tests/conftest.py)


def test_tuner_smoke_json(capsys):
    assert tune.main(["CartPole-v1", "--num-envs", "2", "--seconds", "0.01", "--repeats", "1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    names = [row["name"] for row in found["rows"]]
    assert {"DummyVecEnv", "SubprocVecEnv", "SyncVectorEnv", "AsyncVectorEnv"} <= set(names)
    assert "shmvec n_workers=0, use_main_process=True" in names and "shmvec n_workers=1" in names
    assert all(row["steps_per_s"] and row["error"] is None for row in found["rows"]), found["rows"]
    rec = found["recommended"]
    plan = autoconfig.choose(
        2, found["cores"], found["t_env_us"] * 1e-6, scale=found["machine_scale"]
    )  # n_workers=None's choice
    assert (rec["n_workers"], rec["use_main_process"]) == (plan.n_workers, plan.main_shard)


def test_tuner_table_and_module_callable(capsys):
    assert (
        tune.main(
            ["gymnasium.envs.classic_control:CartPoleEnv", "--num-envs", "1", "--seconds", "0.01", "--repeats", "1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "recommended: ShmPoolVecEnv(env_fns)" in out and "DummyVecEnv" in out


CALLS = []


def count_calls(obs):
    """A user's policy for ``--policy tests.tools.test_tune:count_calls``-style loading."""
    CALLS.append(obs.shape)


def test_the_policy_runs_between_steps_and_the_recommendation_is_still_the_default(capsys):
    CALLS.clear()
    args = ["CartPole-v1", "--num-envs", "3", "--seconds", "0.01", "--repeats", "1", "--json"]
    assert tune.main([*args, "--policy", "tests.tools.test_tune:count_calls"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["policy"] == "tests.tools.test_tune:count_calls" and CALLS and set(CALLS) == {(3, 4)}
    plan = autoconfig.choose(3, found["cores"], found["t_env_us"] * 1e-6, scale=found["machine_scale"])
    recommended = found["recommended"]
    assert (recommended["n_workers"], recommended["use_main_process"]) == (plan.n_workers, plan.main_shard)
    assert recommended["main_shard"] == recommended["use_main_process"]  # the former name, for scripts that read it
    assert all(row["predicted_steps_per_s"] is None for row in found["rows"])  # the model leaves a policy's time out
    assert tune.main([*args, "--policy", "none"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["policy"] == "none" and any(row["predicted_steps_per_s"] for row in bare["rows"])


def test_a_policy_that_does_not_fit_is_refused_before_measuring(capsys):
    pytest.importorskip("torch")  # the CNN stand-in is a torch module
    with pytest.raises(SystemExit):
        tune.main(["CartPole-v1", "--policy", "cnn"])
    assert "84x84 frames" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune.main(["CartPole-v1", "--policy", "nosuchmodule:fn"])


def test_stand_in_policies_take_a_batch():
    torch = pytest.importorskip("torch")
    cnn = stand_in_policy("cnn", (84, 84, 4), n_actions=4)
    assert cnn(np.zeros((2, 84, 84, 4), np.uint8)).shape == torch.Size([2, 4])
    assert stand_in_policy("cnn", (4, 84, 84))(np.zeros((1, 4, 84, 84), np.uint8)).shape == torch.Size([1, 2])
    assert stand_in_policy("none", (4,)) is None


def test_the_tuner_measures_worker_counts_beyond_the_cores_for_envs_that_wait(capsys):
    args = ["shmvec.tools.waiting_env:WaitingEnv", "--num-envs", "8", "--seconds", "0.02", "--repeats", "1"]
    assert tune.main([*args, "--policy", "none", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["cpu_share"] < autoconfig.WAITING_SHARE
    names = [row["name"] for row in found["rows"]]
    assert "shmvec n_workers=8" in names, names  # one worker per env: every env waits at once
    assert found["recommended"]["n_workers"] > found["cores"]
    assert all(row["error"] is None for row in found["rows"]), found["rows"]


def test_no_process_of_shmvecs_rows_is_a_fork_of_the_tuner(tmp_path):
    """Every shmvec layout the tuner builds starts its processes as shmvec's default does: an env
    built in one of them does not see what this process set at run time. (The references' rows
    fork, as they were measured before: the module doc says why.)"""
    import functools
    import os

    from tests.processes.test_starters import SET_AT_RUN_TIME, SeesTheCaller

    path = tmp_path / "seen"
    env_fn = functools.partial(SeesTheCaller, str(path))
    rows = tune.plan_rows(env_fn, num_envs=2, cores=2, t_env=1e-4)
    shmvec_rows = [row for row in rows if row.plan is not None]
    assert any(row.plan[0] >= 1 for row in shmvec_rows)  # a layout with workers
    SET_AT_RUN_TIME.append("marked")
    try:
        for row in shmvec_rows:
            row.build().close()
    finally:
        SET_AT_RUN_TIME.clear()
    seen = [line.split() for line in path.read_text().splitlines()]
    others = {marker for pid, marker in seen if int(pid) != os.getpid()}
    assert others == {"-"}, seen
