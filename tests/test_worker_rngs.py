"""The global generators (``random``, ``np.random``) in workers: each worker draws its own numbers,
and the same ones again when the script seeds the same way, under every start method.

Worker ``k`` starts each generator from a state derived from the main process's state of that
generator at the pool's creation and from ``k`` (:func:`shmvec.engine.script_setup.worker_rng_states`,
docs/process.md). :class:`tests.global_rng_env.GlobalRngEnv`'s ``draws`` returns the next number of each.
"""

from __future__ import annotations

import multiprocessing as mp
import random

import numpy as np
import pytest

from shmvec import ShmVectorEnv
from shmvec.engine import script_setup
from tests.global_rng_env import GlobalRngEnv

START_METHODS = [method for method in ("fork", "forkserver", "spawn") if method in mp.get_all_start_methods()]
N_WORKERS = 4


@pytest.fixture
def global_generators():
    """Gives the rest of the session its generators' states back."""
    numpy_state, random_state = np.random.get_state(), random.getstate()
    yield
    np.random.set_state(numpy_state)
    random.setstate(random_state)


def seeded_draws(start_method: str, closing, seed: int = 0, num_envs: int = N_WORKERS, **options) -> list[tuple]:
    np.random.seed(seed)
    random.seed(seed)
    envs = closing(ShmVectorEnv([GlobalRngEnv] * num_envs, start_method=start_method, **options))
    try:
        return list(envs.call("draws"))
    finally:
        envs.close()


@pytest.mark.parametrize("start_method", START_METHODS)
def test_each_worker_draws_its_own_numbers_and_the_same_again_when_seeded(start_method, global_generators, closing):
    first = seeded_draws(start_method, closing, n_workers=N_WORKERS)
    again = seeded_draws(start_method, closing, n_workers=N_WORKERS)
    other_seed = seeded_draws(start_method, closing, seed=1, n_workers=N_WORKERS)
    assert len({stdlib for stdlib, _ in first}) == N_WORKERS, first  # random: one stream per worker
    assert len({numpy for _, numpy in first}) == N_WORKERS, first  # np.random too
    assert again == first  # the same seeds, the same streams
    assert not set(other_seed) & set(first)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_the_streams_follow_the_documented_rule(start_method, global_generators, closing):
    np.random.seed(0)
    random.seed(0)
    states = [script_setup.worker_rng_states(random.getstate(), np.random.get_state(), k) for k in range(N_WORKERS)]
    expected = []
    for random_state, numpy_state in states:
        random.setstate(random_state)
        np.random.set_state(numpy_state)
        expected.append((random.random(), float(np.random.random())))
    assert seeded_draws(start_method, closing, n_workers=N_WORKERS) == expected


def test_envs_in_the_main_process_keep_drawing_from_its_generators(global_generators, closing):
    draws = seeded_draws("forkserver", closing, num_envs=3, n_workers=2, main_shard=True)  # the last env is here
    np.random.seed(0)
    random.seed(0)
    assert draws[2] == (random.random(), float(np.random.random()))
    assert len(set(draws)) == 3
