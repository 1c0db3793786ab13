"""The release gate: its verdicts from the rounds' ratios, and one real row against this very commit."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import types

import gymnasium as gym
import pytest

from bench import gate, gate_jobs
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
def test_the_new_rows_parse_with_their_units_and_sides():
    args = gate.parse_args(["--against", "HEAD", "--rows", "inproc-sb3-1,inproc-gym-8,rl-zoo-ppo,bare-2workers"])
    rows = {r.name: r for r in gate.rows_of(args.names)}
    assert [rows["inproc-sb3-1"].unit, rows["inproc-gym-8"].unit] == ["x Dummy", "x Sync"]
    assert rows["inproc-sb3-1"].higher_is_better and rows["bare-2workers"].higher_is_better
    assert not rows["rl-zoo-ppo"].higher_is_better
    # an in-process child measures its own reference; a third child would only cost time
    assert gate.sides_of(rows["inproc-sb3-1"]) == ["ref", "current"]
    assert gate.sides_of(rows["rl-zoo-ppo"]) == ["reference", "ref", "current"]
    assert set(gate.QUICK["rows"]) >= {"inproc-sb3-1", "inproc-gym-1"}


@pytest.mark.smoke
def test_an_in_process_row_reports_both_ratios_against_the_reference():
    ratios = Row("inproc-gym-1", "x Sync", True, {"ref": [0.70, 0.74], "current": [0.95, 0.97]})
    args = argparse.Namespace(against="HEAD", rounds=2, scale=1.0, noise=0.05)
    line = next(ln for ln in gate.report([ratios], "0" * 40, args).splitlines() if ln.startswith("| inproc-gym-1"))
    assert line.split(" | ")[2:7] == ["-", "0.72", "0.96", "1.33 [1.31-1.36]", "0.72x / 0.96x"]


@pytest.mark.smoke
def test_the_rl_zoo_row_is_skipped_with_a_reason_without_rl_zoo3(monkeypatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rl_zoo3" else found(name, *a))
    assert "rl_zoo3" in gate.missing("rl-zoo-ppo")
    assert gate.missing("inproc-sb3-1") is None


class _OlderPool:
    """What ShmPoolVecEnv/ShmVectorEnv of older trees accept: ``n_workers=0`` only with ``main_shard=True``."""

    def __init__(self, env_fns, n_workers=None, main_shard=None, **kwargs):
        if n_workers == 0 and main_shard is not True:
            raise ValueError(f"n_workers must be an int between 1 and {len(env_fns)}, got 0")
        super().__init__(env_fns, **kwargs)


@pytest.mark.smoke
@pytest.mark.parametrize("pair", ["sb3", "next_step"])
def test_the_in_process_job_builds_as_older_trees_accept(monkeypatch, pair):
    """The REF side imports an older shmvec while bench/ is this checkout's: the job must not pass
    what only newer trees accept; one child's measurement runs through (a stand-in, no processes)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    older = types.SimpleNamespace(
        ShmPoolVecEnv=type("ShmPoolVecEnv", (_OlderPool, DummyVecEnv), {}),
        ShmVectorEnv=type("ShmVectorEnv", (_OlderPool, gym.vector.SyncVectorEnv), {}),
    )
    monkeypatch.setitem(sys.modules, "shmvec", older)
    monkeypatch.setattr(gate_jobs, "IN_PROCESS_BLOCKS", 4)
    monkeypatch.setattr(gate_jobs, "IN_PROCESS_STEPS", 60)
    result = gate_jobs.in_process(pair, 2)
    assert result["value"] > 0 and "µs a step, the reference" in result["vec_env"]


@pytest.mark.smoke
@pytest.mark.parametrize(
    "row, job", [("inproc-sb3-8", ("in_process", "sb3", 8)), ("inproc-gym-4", ("in_process", "next_step", 4))]
)
def test_a_child_runs_the_in_process_job_of_its_row(monkeypatch, capsys, row, job):
    calls = []
    monkeypatch.setattr(gate_jobs, "in_process", lambda *a: calls.append(("in_process", *a)) or {"value": 1.0})
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gate_jobs.child_main(row, "shm", 1.0, gate.REPO) == 0
    assert calls == [job] and '"value": 1.0' in capsys.readouterr().out


@pytest.mark.smoke
@pytest.mark.parametrize(
    "row, job",
    [
        ("cpu-per-env", ("InfoEnv", (16, 2), (128, 2), 112, "sb3")),
        ("cpu-per-worker", ("WaitingEnv", (4, 4), (16, 16), 12, "sb3")),
        ("cpu-per-env-gym", ("InfoEnv", (16, 2), (128, 2), 112, "gym")),
        ("cpu-per-worker-gym", ("WaitingEnv", (4, 4), (16, 16), 12, "gym")),
    ],
)
def test_a_child_runs_the_cpu_job_of_its_row_on_its_adapter(monkeypatch, capsys, row, job):
    calls = []
    fake = lambda env_cls, *a: calls.append((env_cls.__name__, *a)) or {"value": 1.0}  # noqa: E731
    monkeypatch.setattr(gate_jobs, "cpu_slope", fake)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gate_jobs.child_main(row, "shm", 1.0, gate.REPO) == 0
    assert calls == [job] and '"value": 1.0' in capsys.readouterr().out
    (parsed,) = gate.rows_of([row])
    assert parsed.unit == "µs" and not parsed.higher_is_better and gate.sides_of(parsed) == ["ref", "current"]
    assert row in gate.PROBE_ROWS


@pytest.mark.smoke
@pytest.mark.parametrize("adapter", ["sb3", "gym"])
def test_the_cpu_sampler_steps_either_adapter(monkeypatch, adapter):
    """One short sample of the main thread's CPU per step, through each adapter (two workers)."""
    monkeypatch.setattr(gate_jobs, "CPU_SECONDS", 0.05)
    sample = gate_jobs.main_thread_cpu(gate_jobs.InfoEnv, 2, 2, adapter)
    try:
        assert sample() > 0
    finally:
        sample.close()


@pytest.mark.smoke
def test_a_row_against_this_commit():
    """The whole path: a worktree of HEAD, children on both sides, the table. The verdict is left
    out (--noise 1: never SLOWER): one round of a µs-sized row against itself can read 0.2 against 6
    µs on a loaded machine; the gate's verdicts have tests of their own."""
    done = subprocess.run(
        [sys.executable, GATE, "--against", "HEAD", "--rows", "cpu-per-worker", "--rounds", "1", "--noise", "1.0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| cpu-per-worker | µs |" in done.stdout
    assert "(4, 4) -> (16, 16)" in done.stdout  # the child's layouts, from both trees


@pytest.mark.smoke
def test_a_row_that_the_reference_tree_lacks_is_new_not_failed():
    new = Row("agents-ppo", "s", values={"reference": [3.0], "current": [2.5]}, absent={"ref": "no such thing"})
    assert new.verdict(0.05) == "new"
    broken = Row("agents-ppo", "s", values={"reference": [3.0]}, absent={"ref": "no such thing"})
    assert broken.verdict(0.05) == "FAILED"  # the current tree measured nothing: not new, failed


@pytest.mark.smoke
def test_the_agents_job_says_a_tree_without_agent_slots_lacks_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "shmvec", types.SimpleNamespace())  # an older shmvec
    assert "concat_vec_envs_v1" in gate_jobs.agents_learn("shm", 1.0)["absent"]
    rows = {r.name: r for r in gate.rows_of(gate.parse_args(["--against", "HEAD", "--rows", "agents-ppo"]).names)}
    assert rows["agents-ppo"].unit == "s" and gate.sides_of(rows["agents-ppo"]) == ["reference", "ref", "current"]


@pytest.mark.smoke
def test_the_agents_row_runs_one_short_learn(monkeypatch):
    pytest.importorskip("mpe2")
    pytest.importorskip("supersuit")
    monkeypatch.setattr(gate_jobs, "AGENTS_ROLLOUTS", 1)
    result = gate_jobs.agents_learn("shm", 1.0)
    assert result["total"] > 0 and "ShmAgentVecEnv" in result["vec_env"]


@pytest.mark.smoke
def test_a_new_row_reports_current_against_its_reference():
    new = Row("agents-ppo", "s", values={"reference": [6.0, 6.0], "current": [3.0, 3.0]}, absent={"ref": "none"})
    args = argparse.Namespace(against="HEAD", rounds=2, scale=1.0, noise=0.05)
    line = next(ln for ln in gate.report([new], "0" * 40, args).splitlines() if ln.startswith("| agents-ppo"))
    assert line.split(" | ")[2:8] == ["6.00", "-", "3.00", "-", "- / 2.00x", "new |"]


@pytest.mark.smoke
def test_the_rl_zoo_startup_and_acrobot_rows_parse_with_their_units_and_sides():
    names = "rl-zoo-ppo,rl-zoo-ppo-20k,startup-cold,startup-warm,cleanrl-acrobot"
    rows = {r.name: r for r in gate.rows_of(gate.parse_args(["--against", "HEAD", "--rows", names]).names)}
    assert list(rows) == names.split(",") and all(r.unit == "s" and not r.higher_is_better for r in rows.values())
    assert gate.sides_of(rows["startup-cold"]) == gate.sides_of(rows["startup-warm"]) == ["ref", "current"]
    assert (
        gate.sides_of(rows["rl-zoo-ppo-20k"])
        == gate.sides_of(rows["cleanrl-acrobot"])
        == ["reference", "ref", "current"]
    )
    assert "cleanrl-acrobot" in gate.TRAINING_ROWS and {"startup-cold", "rl-zoo-ppo-20k"} <= set(gate.PROBE_ROWS)
    argv, _ = gate.command("cleanrl-acrobot", "reference", gate.REPO, 1.0, sys.executable)
    assert argv[argv.index("--env-id") + 1] == "Acrobot-v1" and argv[argv.index("--vec") + 1] == "sync"


@pytest.mark.smoke
@pytest.mark.parametrize(
    "row, job",
    [
        ("rl-zoo-ppo", ("rl_zoo", "shm", 0.5)),
        ("rl-zoo-ppo-20k", ("rl_zoo", "shm", 0.5, 20_000)),
        ("startup-cold", ("startup", 1)),
        ("startup-warm", ("startup", 2)),
    ],
)
def test_a_child_runs_the_rl_zoo_or_startup_job_of_its_row(monkeypatch, capsys, row, job):
    calls = []
    for name in ("rl_zoo", "startup"):
        monkeypatch.setattr(gate_jobs, name, lambda *a, name=name: calls.append((name, *a)) or {"value": 1.0})
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gate_jobs.child_main(row, "shm", 0.5, gate.REPO) == 0
    assert calls == [job] and '"value": 1.0' in capsys.readouterr().out


@pytest.mark.smoke
@pytest.mark.parametrize(
    "impl, scale, timesteps, n",
    [
        ("shm", 1.0, None, None),  # RL Zoo's own n_timesteps: no -n, as users run it
        ("reference", 0.5, None, "50000"),
        ("shm", 1.0, 20_000, "20000"),
        ("shm", 1e-4, None, "256"),  # one rollout (8 envs x 32 steps) at least
    ],
)
def test_the_rl_zoo_job_runs_train_py_with_rl_zoos_own_steps(monkeypatch, impl, scale, timesteps, n):
    pytest.importorskip("rl_zoo3")
    import rl_zoo3.exp_manager
    import rl_zoo3.train

    assert gate_jobs.rl_zoo_timesteps() == 100_000  # hyperparams/ppo.yml's CartPole-v1
    argvs = []
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(rl_zoo3.exp_manager, "SubprocVecEnv", rl_zoo3.exp_manager.SubprocVecEnv)  # restored after
    monkeypatch.setattr(rl_zoo3.train, "train", lambda: argvs.append(list(sys.argv)))
    result = gate_jobs.rl_zoo(impl, scale, timesteps)
    (argv,) = argvs
    assert argv[argv.index("--vec-env") + 1] == ("dummy" if impl == "reference" else "subproc")
    assert (argv[argv.index("-n") + 1] if "-n" in argv else None) == n
    assert result["steps"] == int(n or 100_000) and result["total"] >= 0
    assert "--eval-freq" not in argv  # RL Zoo's default evaluation (every 25,000 steps) stays


@pytest.mark.smoke
def test_the_startup_job_builds_on_a_fresh_plan_memory_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv(gate_jobs.PLAN_CACHE_VAR, "off")
    seen = []
    build = gate_jobs.startup_build

    def recorded():
        seen.append(os.environ[gate_jobs.PLAN_CACHE_VAR])
        assert not os.path.exists(seen[0]) or len(seen) > 1  # the first pool finds no memory
        return build()

    monkeypatch.setattr(gate_jobs, "startup_build", recorded)
    result = gate_jobs.startup(2)
    assert len(seen) == 2 and seen[0] == seen[1] != "off" and os.environ[gate_jobs.PLAN_CACHE_VAR] == "off"
    assert result["value"] > 0 and result["vec_env"].startswith("ShmPoolVecEnv(num_envs=8")
    assert result["vec_env"].count("build ") == 2
