"""``shmvec.register``: ``gym.make_vec`` of a ``shmvec/`` twin id is a ShmVectorEnv equal to SyncVectorEnv.

Each comparison drives the twin (built by ``gym.make_vec`` through its vector entry point)
and ``gym.make_vec(original, vectorization_mode="sync")`` with the same seeds and actions
and asserts identical results, bit for bit.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

import shmvec
from shmvec import ShmVectorEnv
from shmvec.adapters.registration import ShmVectorEntryPoint, twin_id
from shmvec.gymnasium_1_1 import AutoresetMode
from tests.adapters.test_vector import run_equivalence

TWIN = "shmvec/CartPole-v1"


@pytest.fixture
def custom_id():
    """A namespaced env id with registered kwargs, removed from the registry afterwards."""
    env_id = "ShmvecTest/HeavyPendulum-v3"
    gym.register(
        env_id,
        entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
        max_episode_steps=40,
        kwargs={"g": 3.0},
    )
    yield env_id
    for name in (env_id, twin_id(env_id)):
        gym.registry.pop(name, None)


def test_register_returns_the_twin_id_and_is_idempotent():
    assert shmvec.register("CartPole-v1") == TWIN
    assert shmvec.register("CartPole-v1") == TWIN
    twin, original = gym.spec(TWIN), gym.spec("CartPole-v1")
    assert twin.vector_entry_point == ShmVectorEntryPoint("CartPole-v1")
    assert (twin.entry_point, twin.max_episode_steps, twin.reward_threshold) == (
        original.entry_point,
        original.max_episode_steps,
        original.reward_threshold,
    )


def test_gym_make_of_the_twin_is_the_original_single_env():
    shmvec.register("CartPole-v1")
    twin, original = gym.make(TWIN), gym.make("CartPole-v1")
    try:
        assert type(twin.unwrapped) is type(original.unwrapped)
        assert twin.spec.max_episode_steps == original.spec.max_episode_steps
        np.testing.assert_array_equal(twin.reset(seed=5)[0], original.reset(seed=5)[0])
    finally:
        twin.close()
        original.close()


@pytest.mark.parametrize("mode", [None, "vector_entry_point"], ids=["default_mode", "explicit_mode"])
def test_make_vec_of_the_twin_matches_sync_vector_env(mode, closing):
    shmvec.register("CartPole-v1")
    shm = closing(gym.make_vec(TWIN, num_envs=8, vectorization_mode=mode, n_workers=2, start_method="fork"))
    ref = closing(gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync"))
    assert isinstance(shm, ShmVectorEnv) and shm.n_workers == 2 and shm.num_envs == 8
    counts = run_equivalence(shm, ref, 200, seed=7)
    assert counts["terminated"] > 0


def test_vector_options_env_kwargs_and_wrappers_pass_through(closing):
    shmvec.register("CartPole-v1")
    shm = closing(
        gym.make_vec(
            TWIN,
            num_envs=5,
            n_workers=2,
            start_method="fork",
            autoreset_mode="SameStep",
            env_wrappers=[gym.wrappers.RecordEpisodeStatistics],
            max_episode_steps=10,
        )
    )
    ref = closing(
        gym.make_vec(
            "CartPole-v1",
            num_envs=5,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            wrappers=[gym.wrappers.RecordEpisodeStatistics],
            max_episode_steps=10,
        )
    )
    assert shm.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert shm.get_attr("spec")[0].max_episode_steps == 10
    counts = run_equivalence(shm, ref, 40, seed=0)
    assert counts["truncated"] > 0  # max_episode_steps reached the envs
    assert counts["info_steps"] > 0  # and so did the wrapper (its "episode" infos)


def test_registered_kwargs_and_namespaced_ids(custom_id, closing):
    twin = shmvec.register(custom_id)
    assert twin == "shmvec/ShmvecTest-HeavyPendulum-v3"
    shm = closing(gym.make_vec(twin, num_envs=3, n_workers=2, start_method="fork"))
    ref = closing(gym.make_vec(custom_id, num_envs=3, vectorization_mode="sync"))
    assert shm.get_attr("g") == ref.get_attr("g") == (3.0, 3.0, 3.0)
    counts = run_equivalence(shm, ref, 45, seed=2)
    assert counts["truncated"] == 3  # the registered max_episode_steps=40

    overridden = closing(gym.make_vec(twin, num_envs=2, n_workers=1, start_method="fork", g=9.0))
    assert overridden.get_attr("g") == (9.0, 9.0)


def test_spec_is_set_as_gym_make_vec_sets_it_and_rebuilds_the_env(closing):
    shmvec.register("CartPole-v1")
    shm = closing(gym.make_vec(TWIN, num_envs=4, n_workers=2, start_method="fork", max_episode_steps=12))
    spec = shm.spec
    assert spec.id == TWIN
    assert spec.kwargs == {
        "n_workers": 2,
        "start_method": "fork",
        "max_episode_steps": 12,
        "num_envs": 4,
        "vectorization_mode": "vector_entry_point",
    }
    given = "n_workers=2, use_main_process=False, why='n_workers=2 given'"
    threads = f"omp_spin={shm._pool.omp_spin!r}, torch_threads={shm._pool.caller.description()!r}"
    assert repr(shm) == f"ShmVectorEnv({TWIN}, num_envs=4, {given}, {threads})"

    rebuilt = closing(gym.make_vec(spec))  # as gym.make_vec's specs do: the spec recreates the env
    ref = closing(gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync", max_episode_steps=12))
    assert isinstance(rebuilt, ShmVectorEnv) and rebuilt.n_workers == 2
    counts = run_equivalence(rebuilt, ref, 60, seed=4)
    assert counts["truncated"] > 0


@pytest.mark.parametrize(
    "mode,cls,vector_kwargs",
    [("sync", SyncVectorEnv, {}), ("async", AsyncVectorEnv, {"context": "fork"})],
    ids=["sync", "async"],
)
def test_sync_and_async_modes_of_the_twin_still_work(mode, cls, vector_kwargs, closing):
    shmvec.register("CartPole-v1")
    envs = closing(gym.make_vec(TWIN, num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs))
    ref = closing(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"))
    assert isinstance(envs, cls)
    run_equivalence(envs, ref, 30, seed=1)


def test_gymnasium_refuses_vector_kwargs_and_wrappers_in_vector_entry_point_mode():
    # Why the twin takes its options as plain keywords (and wrappers as env_wrappers).
    shmvec.register("CartPole-v1")
    with pytest.raises(gym.error.Error, match="vector_kwargs"):
        gym.make_vec(TWIN, num_envs=2, vector_kwargs={"n_workers": 1})
    with pytest.raises(gym.error.Error, match="wrappers"):
        gym.make_vec(TWIN, num_envs=2, wrappers=[gym.wrappers.RecordEpisodeStatistics])


def test_register_errors(custom_id):
    with pytest.raises(gym.error.Error):
        shmvec.register("NoSuchEnv-v0")
    gym.register(twin_id(custom_id), entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
    with pytest.raises(ValueError, match="shmvec did not register it"):
        shmvec.register(custom_id)


MAIN_ENTRY_POINT_SCRIPT = """\
import json
import os
import sys

import gymnasium as gym
import numpy as np

import shmvec


class ScriptEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.full(1, os.getpid() % 2, np.float32), 1.0, False, False, {"pid": os.getpid()}


gym.register("ScriptEnv-v0", entry_point="__main__:ScriptEnv", max_episode_steps=7)

if __name__ == "__main__":
    n_workers = None if sys.argv[1] == "default" else int(sys.argv[1])
    made = [shmvec.make_vec("ScriptEnv-v0", 4, n_workers)]
    made.append(gym.make_vec(shmvec.register("ScriptEnv-v0"), num_envs=4, n_workers=n_workers))
    for envs in made:
        envs.reset(seed=0)
        _, rewards, _, _, infos = envs.step(np.zeros(4, np.int64))
        pids = sorted(set(int(pid) for pid in infos["pid"]))
        print(json.dumps({"rewards": rewards.tolist(), "pids": pids, "main": os.getpid(),
                          "entry_point": envs.spec.entry_point, "max_episode_steps": envs.spec.max_episode_steps}))
        envs.close()
"""


@pytest.mark.parametrize("n_workers", ["default", "2"])
def test_make_vec_of_an_id_the_script_registered_with_a_main_entry_point(n_workers, tmp_path):
    """``"__main__:ScriptEnv"`` names a class of the script, which workers do not run: it is resolved in the
    main process and carried by value, as cloudpickle carries the script's classes."""
    import json
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(MAIN_ENTRY_POINT_SCRIPT)
    result = subprocess.run(
        [sys.executable, "train.py", n_workers], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for line in result.stdout.splitlines():
        found = json.loads(line)
        assert found["rewards"] == [1.0] * 4
        assert found["entry_point"] == "__main__:ScriptEnv" and found["max_episode_steps"] == 7  # the spec as given
        if n_workers == "2":
            assert len(found["pids"]) == 2 and found["main"] not in found["pids"], found  # built in the workers
    assert len(result.stdout.splitlines()) == 2, result.stdout
