"""PettingZoo slots benchmark (``bench/agents.py``): a smoke run at a tiny size, no timing asserts."""

from __future__ import annotations

import pytest

from bench import agents


@pytest.mark.smoke
def test_each_vector_env_steps_and_learns_on_simple_spread():
    why = agents.missing("simple_spread")
    if why:
        pytest.skip(why)
    runs = {}
    for impl in agents.IMPLS:
        result = agents.measure("simple_spread", impl, steps=3, warmup=1, n_steps=4, rollouts=1, copies=2)
        assert result["slots"] == 6 and result["steps_per_s"] > 0 and result["job_s"] > result["learn_s"] > 0, impl
        runs[("simple_spread", impl)] = [result]
    summary = agents.summarize(runs)
    reprs = {impl: row["vec_env"] for impl, row in summary["simple_spread"].items()}
    assert reprs["supersuit k=0"].startswith("ConcatVecEnv(") and reprs["supersuit k=2"].startswith("ProcConcatVec(")
    assert reprs["shmvec"].startswith("ShmAgentVecEnv(num_envs=6, copies=2, agents=3")
    text = agents.table(summary)
    assert text.count("\n") == 2 and text.splitlines()[2].startswith("| simple_spread | 6 |")


@pytest.mark.smoke
def test_the_table_gives_shmvecs_ratio_to_the_faster_supersuit():
    row = lambda fps, secs, job: {"steps_per_s": fps, "learn_s": secs, "job_s": job, "slots": 24, "vec_env": ""}
    summary = {
        "kaz": {"supersuit k=0": row(100, 4.0, 5.0), "supersuit k=2": row(200, 5.0, 9.0), "shmvec": row(300, 2.0, 4.0)}
    }
    cells = agents.table(summary).splitlines()[2].split(" | ")
    assert cells[5:10] == ["1.50x", "4.00", "5.00", "2.00", "2.00x"] and cells[10:] == [
        "5.00",
        "9.00",
        "4.00",
        "1.25x |",
    ]


@pytest.mark.smoke
def test_rounds_rotate_the_order_and_unknown_envs_are_refused():
    assert [agents.rotated(agents.IMPLS, r)[0] for r in range(3)] == list(agents.IMPLS)
    args = agents.parse_args(["--quick", "--envs", "kaz,pursuit"])
    assert (args.rounds, args.steps, args.envs) == (1, 100, ["kaz", "pursuit"])
    assert agents.parse_args(["--quick", "--rounds", "3"]).rounds == 3 and agents.parse_args([]).rounds == 3
    assert agents.parse_args([]).modes == ["defaults", "equal"] and agents.parse_args(["--modes", "equal"]).modes == [
        "equal"
    ]
    with pytest.raises(SystemExit):
        agents.parse_args(["--modes", "fast"])
    with pytest.raises(SystemExit):
        agents.parse_args(["--envs", "simple_tag"])
