"""Rare-call round trips (``bench/rare_calls.py``): a smoke run at a tiny size, no timing asserts."""

from __future__ import annotations

import pytest

from bench import rare_calls


@pytest.mark.smoke
def test_smoke_rare_calls_table():
    names = ["dummy", "subproc", "shm k=1", "shm k=2", "shm default"]
    result = rare_calls.measure(2, names, calls=3, rounds=2, start_method="fork", warmup=0.0)
    assert list(result["medians"]) == names
    assert all(value > 0 for row in result["medians"].values() for value in row.values())
    assert "n_workers=2" in result["reprs"]["shm k=2"]
    text = rare_calls.table(result["medians"], "title")
    assert text.count("\n| ") == len(names) + 1 and "her (µs)" in text


@pytest.mark.smoke
def test_every_vector_env_answers_the_calls_alike():
    """The three calls give DummyVecEnv's results in every layout (what the timings are of)."""
    builders = rare_calls.vector_envs(2, ["dummy", "shm k=1", "shm k=2"], start_method="fork")
    envs = {name: build() for name, build in builders.items()}
    try:
        answers = {}
        for name, env in envs.items():
            env.seed(0)
            env.reset()
            answers[name] = [call(env) for call in rare_calls.the_calls(batch=8).values()]
        want = answers.pop("dummy")
        for name, got in answers.items():
            assert got[0][0].tolist() == want[0][0].tolist(), name
            assert [m.tolist() for m in got[1]] == [m.tolist() for m in want[1]], name
            assert got[2] == want[2], name
    finally:
        for env in envs.values():
            env.close()


@pytest.mark.smoke
def test_smoke_in_process_pairs():
    pytest.importorskip("sb3_contrib")
    rows = rare_calls.in_process(2, blocks=2, calls=3)
    assert [row["call"] for row in rows] == ["masks", "spec", "set"]
    assert all(row["n"] == 2 and row["shm_us"] > 0 and row["ref_us"] > 0 and row["ratio"] > 0 for row in rows)
    assert all(row["ratio_q1"] <= row["ratio"] <= row["ratio_q3"] for row in rows)
