"""The default configuration gives the references' results bit for bit, even for envs that draw
from the legacy global generators (``np.random``, ``random``) in ``reset`` and ``step``.

Such envs share one generator per process, so their results equal the references' only if
the pool builds and steps them in the caller's process, in env order, and nothing else
draws from those generators first: the default plan times ``env_fns[-1]`` in a throwaway
process (:mod:`shmvec.engine.timing_run`), where it used to build, reset and step one in
the caller's process (and so moved both generators before the first reset). A few light
envs stay in the main process on any machine, so ``ShmPoolVecEnv(env_fns)`` equals
``DummyVecEnv(env_fns)`` and ``ShmVectorEnv(env_fns)`` equals ``SyncVectorEnv(env_fns)``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from tests.global_rng_env import GlobalRngEnv

NUM_ENVS = 8
STEPS = 50
ENV_FNS = [GlobalRngEnv] * NUM_ENVS


@pytest.fixture(autouse=True)
def global_generators():
    """Seeds both global generators for the test and gives the rest of the session its states back."""
    numpy_state, random_state = np.random.get_state(), random.getstate()
    yield
    np.random.set_state(numpy_state)
    random.setstate(random_state)


def seeded() -> None:
    np.random.seed(0)
    random.seed(0)


def actions(t: int) -> np.ndarray:
    return (np.arange(NUM_ENVS) + t) % 2


def sb3_run(venv) -> list[tuple]:
    """Reset, then :data:`STEPS` steps: (obs, rewards, dones, terminal observations) of each."""
    runs = [(venv.reset(), None, None, None)]
    for t in range(STEPS):
        obs, rewards, dones, infos = venv.step(actions(t))
        finals = [info["terminal_observation"] for info, done in zip(infos, dones) if done]
        runs.append((obs, rewards, dones, np.array(finals)))
    return runs


def gymnasium_run(envs) -> list[tuple]:
    """Reset, then :data:`STEPS` steps: (obs, rewards, terminated, truncated) of each."""
    runs = [(envs.reset()[0], None, None, None)]
    for t in range(STEPS):
        obs, rewards, terminated, truncated, _ = envs.step(actions(t))
        runs.append((obs, rewards, terminated, truncated))
    return runs


def assert_same_runs(got: list[tuple], want: list[tuple], plan: str) -> None:
    assert len(got) == len(want) == STEPS + 1
    for t, (got_step, want_step) in enumerate(zip(got, want)):
        for name, got_field, want_field in zip(("obs", "rewards", "ends", "finals"), got_step, want_step):
            np.testing.assert_array_equal(got_field, want_field, err_msg=f"{name} at step {t - 1} of {plan}")


def test_the_default_pool_vec_env_equals_dummy_vec_env_bit_for_bit():
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    seeded()
    reference = vec_env.DummyVecEnv(ENV_FNS)
    try:
        want = sb3_run(reference)
    finally:
        reference.close()
    seeded()
    with ShmPoolVecEnv(ENV_FNS) as venv:
        plan = repr(venv)
        got = sb3_run(venv)
    assert sum(len(finals) for *_, finals in want[1:]) > 0  # episodes ended (and reset) along the way
    assert "n_workers=0, use_main_process=True" in plan, plan
    assert_same_runs(got, want, plan)


def test_the_default_vector_env_equals_sync_vector_env_bit_for_bit():
    seeded()
    reference = SyncVectorEnv(ENV_FNS)
    try:
        want = gymnasium_run(reference)
    finally:
        reference.close()
    seeded()
    with ShmVectorEnv(ENV_FNS) as envs:
        plan = repr(envs)
        got = gymnasium_run(envs)
    assert sum(terminated.sum() + truncated.sum() for _, _, terminated, truncated in want[1:]) > 0
    assert "n_workers=0, use_main_process=True" in plan, plan
    assert_same_runs(got, want, plan)
