"""The default keeps the layout it chose before on this machine for this env, unless a new timing
predicts another clearly faster (:mod:`shmvec.planning.plan_memory`, :func:`shmvec.planning.plan.choose`'s ``keep``).

8 HalfCheetah-like envs on 2 cores sit where the main process alone and the main process plus a
worker are predicted equally fast (~31 µs a step at the calibration's speed); its timings spread
from ~29 to ~40 µs, and fresh runs took turns between the two layouts.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest

from shmvec.engine import timing_run
from shmvec.options import PoolOptions
from shmvec.planning import plan as autoconfig
from shmvec.planning import plan_memory
from shmvec.planning.env_timing import EnvTiming
from shmvec.planning.plan import choose
from shmvec.processes.script_setup import worker_start

ALONE, WITH_A_WORKER = (0, True), (1, True)
BELOW, ABOVE = 28e-6, 36e-6  # 8 envs, 2 cores: each side of the near-tie, both within the margin
FAR = 1e-3  # ... and far from it: two workers are predicted much faster


def layout(plan) -> tuple[int, bool]:
    return plan.n_workers, plan.main_shard


# ==== choose(keep=...) (pure) ====================================================================


def test_the_near_tie_is_one():
    assert layout(choose(8, 2, BELOW)) == ALONE and layout(choose(8, 2, ABOVE)) == WITH_A_WORKER
    below = autoconfig.predicted_step_time(8, 2, BELOW, *WITH_A_WORKER) / autoconfig.predicted_step_time(
        8, 2, BELOW, *ALONE
    )
    assert 1.0 < below < 1.0 + plan_memory.KEEP_MARGIN  # the layout left costs less than the margin


@pytest.mark.parametrize("t_env, keep", [(BELOW, WITH_A_WORKER), (ABOVE, ALONE)])
def test_a_layout_near_the_best_is_kept(t_env, keep):
    plan = choose(8, 2, t_env, keep=keep)
    assert layout(plan) == keep and "as chosen before on this machine" in plan.reason


def test_a_layout_far_from_the_best_is_left():
    plan = choose(8, 2, FAR, keep=ALONE)
    assert layout(plan) == layout(choose(8, 2, FAR)) != ALONE
    assert "as chosen before" not in plan.reason


def test_a_layout_the_options_rule_out_is_not_kept():
    plan = choose(8, 2, BELOW, main_shard=False, keep=ALONE)  # a main shard is ruled out
    assert not plan.main_shard and "as chosen before" not in plan.reason


# ==== plan_pool with the memory =====================================================================


def planned(t_env: float, identity: str = "HalfCheetah-like") -> autoconfig.Plan:
    timing = EnvTiming(t_env, 1.0, 1.0, identity=identity)
    env_fn = functools.partial(object, t_env, identity)  # its own factory: a remembered timing is its own
    return autoconfig.plan_pool(PoolOptions(), [env_fn] * 8, time_env=lambda env_fn: timing)


def test_fresh_runs_near_the_tie_keep_the_first_runs_layout(two_cores, memory):
    runs = [planned(t) for t in (ABOVE, BELOW, ABOVE, BELOW, BELOW)]
    assert [layout(plan) for plan in runs] == [WITH_A_WORKER] * 5
    assert memory.exists()
    assert ["as chosen before" in plan.reason for plan in runs] == [False, True, False, True, True]


def test_a_real_change_moves_the_layout_and_is_remembered(two_cores, memory):
    assert layout(planned(BELOW)) == ALONE
    moved = planned(FAR)
    assert layout(moved) == layout(choose(8, 2, FAR)) != ALONE
    assert layout(planned(BELOW)) == ALONE  # from the far layout, the best is clearly better again


def test_each_env_has_its_own_memory(two_cores, memory):
    assert layout(planned(ABOVE, "one env")) == WITH_A_WORKER
    assert layout(planned(BELOW, "another")) == ALONE


@pytest.mark.parametrize("value", ["off", "0", ""])
def test_the_memory_can_be_turned_off(two_cores, monkeypatch, tmp_path, value):
    monkeypatch.setenv(plan_memory.CACHE_VAR, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert [layout(planned(t)) for t in (ABOVE, BELOW)] == [WITH_A_WORKER, ALONE]
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_env_is_not_remembered(two_cores, memory):
    assert [layout(planned(t, identity="")) for t in (ABOVE, BELOW)] == [WITH_A_WORKER, ALONE]
    assert not memory.exists()


def test_a_damaged_or_unwritable_memory_is_ignored(two_cores, memory, tmp_path, monkeypatch):
    memory.parent.mkdir()
    memory.write_text("{not json")
    assert layout(planned(ABOVE)) == WITH_A_WORKER and layout(planned(BELOW)) == WITH_A_WORKER  # rewritten whole
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv(plan_memory.CACHE_VAR, str(blocked / "plans.json"))  # its folder cannot be made
    assert layout(planned(BELOW)) == ALONE
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a file", "cache"]
    names = sorted(path.name for path in memory.parent.iterdir())
    assert names == ["plans.json", "plans.json.lock", "plans.timings.json", "plans.timings.json.lock"]  # no temporary


def test_the_timing_process_names_the_env_as_this_process_does():
    options = PoolOptions()
    timer = timing_run.timer(options.start_method, worker_start(options))
    cartpole = functools.partial(gym.make, "CartPole-v1")
    identity = timer(cartpole).identity
    assert identity == plan_memory.env_identity(cartpole())  # the same in every fresh process
    assert identity != plan_memory.env_identity(gym.make("CartPole-v1", max_episode_steps=100))
    assert identity != plan_memory.env_identity(gym.make("Acrobot-v1"))


def test_no_home_folder_means_no_memory(monkeypatch):
    monkeypatch.delenv(plan_memory.CACHE_VAR, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(plan_memory.os.path, "expanduser", lambda path: path)  # as with no HOME and no passwd entry
    assert plan_memory.cache_file() is None
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert str(plan_memory.cache_file()) == "/somewhere/shmvec/plans.json"
