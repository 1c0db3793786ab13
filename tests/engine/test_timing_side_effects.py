"""The default's timing run leaves nothing a ``SyncVectorEnv`` (``DummyVecEnv``) run would not
(:mod:`shmvec.planning.outside_effects`).

- CleanRL's ``make_env(..., capture_video=True)``: the run's ``videos/`` folder holds the same
  videos as ``SyncVectorEnv``'s run (the timing used to record its random episodes there).
- SB3's ``make_vec_env(monitor_dir=...)`` appending to its monitor files: the same episode rows
  as ``DummyVecEnv``'s.
- ``RecordVideo`` and ``Monitor`` are quietened in the timing process itself, whichever env it times.
- An env that renders to a window is not timed: the default then runs one worker per core and says so.
"""

from __future__ import annotations

import csv
import functools
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.engine import timing_run
from shmvec.options import PoolOptions
from shmvec.planning.outside_effects import NotTimed, quieten
from shmvec.planning.plan import plan_pool, usable_cores
from shmvec.processes.script_setup import worker_start
from tests.recording_envs import FRAMED_CARTPOLE, STUB_MOVIEPY, make_env

NUM_ENVS = 4
STEPS = 60  # a few episodes end


@pytest.fixture
def moviepy(monkeypatch):
    """The MoviePy stand-in on ``sys.path`` (workers and the timing process get it too), unloaded after."""
    monkeypatch.syspath_prepend(STUB_MOVIEPY)
    yield
    for name in [name for name in sys.modules if name == "moviepy" or name.startswith("moviepy.")]:
        del sys.modules[name]


def actions(t: int) -> np.ndarray:
    return np.array([(t // 3 + i) % 2 for i in range(NUM_ENVS)])


def folder_after(vector_env, folder, steps: int = STEPS) -> dict[str, str]:
    """Reset, ``steps`` steps, close: then ``folder``'s files and their contents."""
    try:
        vector_env.reset(seed=0)
        for t in range(steps):
            vector_env.step(actions(t))
    finally:
        vector_env.close()
    return {path.name: path.read_text() for path in sorted(folder.iterdir())}


@pytest.mark.parametrize("steps", [8, STEPS])  # env 0's first episode only (its video); a few (episodes 0, 1)
def test_cleanrls_videos_folder_holds_what_sync_vector_envs_does(tmp_path, monkeypatch, moviepy, steps):
    """The timing's random episodes used to land there too: those the run did not record again remained."""
    env_fns = [make_env(FRAMED_CARTPOLE, i, True, "run") for i in range(NUM_ENVS)]
    (tmp_path / "sync").mkdir()
    (tmp_path / "shm").mkdir()
    monkeypatch.chdir(tmp_path / "sync")  # CleanRL writes to videos/{run_name} in the working directory
    want = folder_after(SyncVectorEnv(env_fns), tmp_path / "sync" / "videos" / "run", steps)
    monkeypatch.chdir(tmp_path / "shm")
    envs = ShmVectorEnv(env_fns)  # the default: timed first
    plan = repr(envs)
    got = folder_after(envs, tmp_path / "shm" / "videos" / "run", steps)
    assert want, "the reference run recorded nothing: the test would prove nothing"
    assert "why='auto: " in plan
    assert got == want, plan


def test_sb3_monitor_files_hold_what_dummy_vec_envs_do(tmp_path):
    env_util = pytest.importorskip("stable_baselines3.common.env_util")
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")

    def rows(vec_env_cls, folder) -> dict[str, list]:
        venv = env_util.make_vec_env(
            "CartPole-v1",
            n_envs=NUM_ENVS,
            seed=0,
            monitor_dir=str(folder),
            vec_env_cls=vec_env_cls,
            monitor_kwargs={"override_existing": False},  # appends to what is there
        )
        folder_after(_Sb3AsGym(venv), folder)
        files = {}
        for path in sorted(folder.iterdir()):
            with open(path) as file:
                files[path.name] = [row[:2] for row in csv.reader(file)]  # reward, length (not the wall time)
        return files

    want = rows(vec_env.DummyVecEnv, tmp_path / "dummy")
    got = rows(ShmPoolVecEnv, tmp_path / "shm")
    assert any(want.values()), "no episode ended: the test would prove nothing"
    assert got == want


class _Sb3AsGym:
    """A VecEnv driven as :func:`folder_after` drives a Gymnasium vector env."""

    def __init__(self, venv):
        self.venv = venv

    def reset(self, seed=None):
        return self.venv.reset()

    def step(self, actions):
        return self.venv.step(actions)

    def close(self):
        self.venv.close()


def timed_in_process(env_fn):
    options = PoolOptions()
    return timing_run.timer(options.start_method, worker_start(options))(env_fn)


def recording(folder) -> gym.Env:
    env = gym.make(FRAMED_CARTPOLE, render_mode="rgb_array")
    return gym.wrappers.RecordEpisodeStatistics(gym.wrappers.RecordVideo(env, str(folder)))


def test_the_timing_process_records_no_video(tmp_path, moviepy):
    timing = timed_in_process(functools.partial(recording, tmp_path / "videos"))
    assert timing.t_env > 0
    assert list((tmp_path / "videos").iterdir()) == []  # made by RecordVideo's constructor, as SyncVectorEnv's


def test_quieten_stops_recording_and_monitoring(tmp_path, moviepy):
    monitor = pytest.importorskip("stable_baselines3.common.monitor")
    env = monitor.Monitor(recording(tmp_path / "videos"), str(tmp_path / "log"), override_existing=False)
    env.action_space.seed(0)
    assert quieten(env) is None
    env.reset(seed=0)
    for _ in range(100):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    env.close()
    assert list((tmp_path / "videos").iterdir()) == []
    assert (tmp_path / "log.monitor.csv").read_text() == ""


@pytest.mark.parametrize(
    "env_fn",
    [
        functools.partial(gym.make, "CartPole-v1", render_mode="human"),
        lambda: gym.wrappers.HumanRendering(gym.make(FRAMED_CARTPOLE, render_mode="rgb_array")),
    ],
    ids=["render_mode", "HumanRendering"],
)
def test_an_env_that_renders_to_a_window_is_not_timed(env_fn):
    assert "renders to a window" in quieten(env_fn())
    with pytest.raises(NotTimed, match="renders to a window"):
        timed_in_process(env_fn)
    plan = plan_pool(PoolOptions(), [env_fn] * NUM_ENVS, time_env=timed_in_process)
    assert plan.reason.startswith("auto, not timed, as it renders to a window"), plan
    assert (plan.n_workers, plan.main_shard) == (min(NUM_ENVS, usable_cores()), False)


def test_print_says_the_env_was_not_timed(closing):
    envs = closing(ShmVectorEnv([functools.partial(gym.make, "CartPole-v1", render_mode="human")] * 2))
    assert "not timed, as it renders to a window" in repr(envs)


def test_quieten_looks_up_no_attribute_through_the_wrappers(recwarn):
    """Only each layer's own attributes: Gymnasium 0.29's wrappers forward a missing one with a
    deprecation warning, which the user would see for every env the timing run builds."""
    env = gym.make("CartPole-v1")  # TimeLimit, OrderEnforcing, PassiveEnvChecker
    assert quieten(env) is None
    assert [str(w.message) for w in recwarn] == []


def test_quieten_stops_any_wrapper_with_recordvideos_triggers(moviepy):
    """Gymnasium 0.29's RecordVideoV0 is not RecordVideo's subclass: a wrapper with its own
    episode and step triggers is stopped by them."""

    class OwnRecorder(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.episode_trigger, self.step_trigger = (lambda episode: True), None

    env = OwnRecorder(gym.make("CartPole-v1"))
    assert quieten(env) is None
    assert env.episode_trigger(0) is False and env.step_trigger(0) is False
