"""``python -m shmvec.tune``: a short run measures every implementation and recommends what
``n_workers=None`` chooses (no timing asserts: only that it runs and agrees with autoconfig)."""

from __future__ import annotations

import json

from shmvec import autoconfig, tune


def test_tuner_smoke_json(capsys):
    assert tune.main(["CartPole-v1", "--num-envs", "2", "--seconds", "0.01", "--repeats", "1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    names = [row["name"] for row in found["rows"]]
    assert {"DummyVecEnv", "SubprocVecEnv", "SyncVectorEnv", "AsyncVectorEnv"} <= set(names)
    assert "shmvec n_workers=0, main_shard=True" in names and "shmvec n_workers=1" in names
    assert all(row["steps_per_s"] and row["error"] is None for row in found["rows"]), found["rows"]
    rec = found["recommended"]
    plan = autoconfig.choose(2, found["cores"], found["t_env_us"] * 1e-6, scale=found["machine_scale"])  # n_workers=None's choice
    assert (rec["n_workers"], rec["main_shard"]) == (plan.n_workers, plan.main_shard)


def test_tuner_table_and_module_callable(capsys):
    assert tune.main(["gymnasium.envs.classic_control:CartPoleEnv", "--num-envs", "1", "--seconds", "0.01", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "recommended: ShmPoolVecEnv(env_fns)" in out and "DummyVecEnv" in out
