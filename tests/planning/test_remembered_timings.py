"""Timings remembered between runs (:mod:`shmvec.planning.remembered_timings`): a later run of the same
script starts no timing process; what changes from run to run and not what the env costs (a seed, a log
folder) is left out of the key; what changes the env (its module, a configuration file, a registration) is in."""

from __future__ import annotations

import functools
import json
import threading

import cloudpickle
import gymnasium as gym
import pytest

from shmvec.options import PoolOptions
from shmvec.planning import plan as autoconfig
from shmvec.planning import remembered_timings
from shmvec.planning.env_timing import EnvTiming
from tests.planning.test_plan_memory import BELOW, layout

# ==== the remembered timing: a later run starts no timing process ===================================


def make_factory(seed: int, folder: str, env_id: str = "CartPole-v1", frame_skip: int = 4):
    """A factory as ``make_vec_env``'s: a closure over a seed drawn per run and a log folder numbered per run."""

    def _init():
        return (env_id, seed, folder, frame_skip)

    return _init


def key_of(env_fn) -> str | None:
    return remembered_timings.factory_key(cloudpickle.dumps(env_fn))


def test_a_factory_is_known_again_across_seeds_and_log_folders(tmp_path):
    (tmp_path / "logs").mkdir()
    first = key_of(make_factory(3_141_592_653, str(tmp_path / "logs" / "run_1")))
    assert first is not None
    assert key_of(make_factory(2_718_281_828, str(tmp_path / "logs" / "run_2"))) == first
    assert key_of(make_factory(3_141_592_653, "logs/run_3")) != first  # relative, but no such folder here
    assert key_of(make_factory(3_141_592_653, str(tmp_path / "logs" / "run_1"), "Acrobot-v1")) != first
    assert key_of(make_factory(3_141_592_653, str(tmp_path / "logs" / "run_1"), "ALE/Pong-v5")) != key_of(
        make_factory(3_141_592_653, str(tmp_path / "logs" / "run_1"), "ALE/Breakout-v5")
    )  # an env id with a slash is not a path
    assert key_of(make_factory(3_141_592_653, str(tmp_path / "logs" / "run_1"), frame_skip=1)) != first
    assert remembered_timings.factory_key(b"not a pickle") is None


def test_an_edited_env_module_is_timed_again(tmp_path, monkeypatch):
    (tmp_path / "edited_env.py").write_text("def make():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_env

    before = key_of(edited_env.make)
    (tmp_path / "edited_env.py").write_text("def make():\n    return 2  # edited\n")
    assert key_of(edited_env.make) != before


def counting_timer(t_env: float, identity: str = "CartPole-like"):
    calls = []

    def time_env(env_fn):
        calls.append(env_fn)
        return EnvTiming(t_env, 1.0, 1.0, identity=identity)

    return time_env, calls


def test_a_remembered_timing_skips_the_timing_and_gives_the_same_plan(two_cores, memory, tmp_path):
    env_fns = [make_factory(123_456_789, str(tmp_path))] * 8
    time_env, calls = counting_timer(BELOW)
    first = autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)
    later = autoconfig.plan_pool(PoolOptions(), [make_factory(987_654_321, str(tmp_path))] * 8, time_env=time_env)
    assert len(calls) == 1 and later == first
    memory.write_text("{}")  # the layouts' file rewritten by a release that knows no timings: they stay
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)
    assert len(calls) == 1
    unknown, unknown_calls = counting_timer(BELOW, identity="")  # an env the timing could not name: not remembered
    env_fns = [make_factory(1, str(tmp_path), "Unnamed-v0")] * 8
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=unknown)
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=unknown)
    assert len(unknown_calls) == 2


@pytest.fixture
def timings(memory):
    """The file the timings go to, beside the layouts' (which a release without timings rewrites)."""
    return memory.with_name("plans.timings.json")


def test_an_old_or_damaged_timing_is_not_used(two_cores, memory, timings, tmp_path, monkeypatch):
    env_fns = [make_factory(123_456_789, str(tmp_path))] * 8
    time_env, calls = counting_timer(BELOW)
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)
    entries = json.loads(timings.read_text())
    (key,) = [key for key, entry in entries.items() if "timing" in entry]
    for damaged in ([-1.0, 1.0, 1.0, 0, False, "x"], [1e-5, 1.0, 2.0, 0, False, "x"], [1e-5, 1.0, 1.0, 0, 1, "x"],
                    [1e-5, 1.0, 1.0, 0, False], "timing", [float("nan")] * 6):  # fmt: skip
        timings.write_text(json.dumps({key: {"timing": damaged, "when": entries[key]["when"]}}))
        autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)
    assert len(calls) == 7  # each damaged entry ignored (and replaced)
    monkeypatch.setattr(
        remembered_timings.time, "time", lambda: entries[key]["when"] + remembered_timings.TIMING_MAX_AGE + 1
    )
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)
    assert len(calls) == 8


def test_a_factory_that_cannot_be_pickled_runs_in_this_process(two_cores):
    lock = threading.Lock()
    env_fn = functools.partial(lambda lock: gym.make("CartPole-v1"), lock)  # a lock does not pickle
    time_env, calls = counting_timer(BELOW)
    plan = autoconfig.plan_pool(PoolOptions(), [env_fn] * 4, time_env=time_env)
    assert layout(plan) == (0, True) and "cannot be pickled" in plan.reason and not calls
    in_workers = autoconfig.plan_pool(PoolOptions(use_main_process=False), [env_fn] * 4, time_env=cloudpickle.dumps)
    assert "failed" in in_workers.reason  # workers asked for: the first worker's start says why


def test_a_remembered_timing_out_of_range_is_not_used(two_cores, memory, timings, tmp_path):
    env_fns = [make_factory(123_456_789, str(tmp_path))] * 8
    time_env, calls = counting_timer(BELOW)
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)
    entries = json.loads(timings.read_text())
    (key,) = [key for key, entry in entries.items() if "timing" in entry]
    timings.write_text(json.dumps({key: {"timing": [1.7e308, 1.0, 1.0, 0, False, "x"], "when": entries[key]["when"]}}))
    autoconfig.plan_pool(PoolOptions(), env_fns, time_env=time_env)  # ValueError from the plan, before the bound
    assert len(calls) == 2


def test_a_config_file_and_a_registration_are_part_of_the_key(tmp_path):
    light, heavy = tmp_path / "light.cfg", tmp_path / "heavy.cfg"
    light.write_text("cost=1")
    heavy.write_text("cost=1000")
    assert key_of(functools.partial(open, str(light))) != key_of(functools.partial(open, str(heavy)))
    before = key_of(functools.partial(open, str(light)))
    light.write_text("cost=2 # edited")
    assert key_of(functools.partial(open, str(light))) != before
    gym.register(
        "ShmvecKeyTest-v0",
        entry_point="gymnasium.envs.classic_control:CartPoleEnv",
        kwargs={"sutton_barto_reward": False},
    )
    try:
        registered = key_of(functools.partial(gym.make, "ShmvecKeyTest-v0"))
        gym.registry["ShmvecKeyTest-v0"].kwargs = {"sutton_barto_reward": True}
        assert key_of(functools.partial(gym.make, "ShmvecKeyTest-v0")) != registered
    finally:
        del gym.registry["ShmvecKeyTest-v0"]
    assert remembered_timings.factory_key(b"x" * (remembered_timings.MAX_KEYED_PICKLE + 1)) is None
