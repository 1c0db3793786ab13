"""The global generators (``random``, ``np.random``) in workers: each worker, each pool and each
life of a worker draws its own numbers, and a script that seeds the same way draws the same ones
again, under every start method.

Worker ``k`` of the process's pool ``p``, restarted ``r`` times, starts each generator from a state
derived from the main process's state of that generator at the pool's creation and from
``(p, k, r)`` (:func:`shmvec.processes.script_setup.worker_rng_states`, docs/process.md).
:class:`tests.global_rng_env.GlobalRngEnv`'s ``draws`` returns the next number of each.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmvec import ShmVectorEnv
from shmvec.processes.script_setup import pools_made, worker_rng_states
from tests.global_rng_env import DyingRngEnv, GlobalRngEnv

START_METHODS = [method for method in ("fork", "forkserver", "spawn") if method in mp.get_all_start_methods()]
N_WORKERS = 2
SCRIPT_TIMEOUT = 120  # seconds; a hang fails the test
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def global_generators():
    """Gives the rest of the session its generators' states back."""
    numpy_state, random_state = np.random.get_state(), random.getstate()
    yield
    np.random.set_state(numpy_state)
    random.setstate(random_state)


def parent_states(seed: int = 0) -> tuple[tuple, tuple]:
    """What ``random.seed(seed)`` and ``np.random.seed(seed)`` leave."""
    return random.Random(seed).getstate(), np.random.RandomState(seed).get_state()


def ruled_draws(parents: tuple[tuple, tuple], pool_index: int, restarts: int = 0, skip: int = 0) -> list[tuple]:
    """Each worker's ``draws()`` by the documented rule, after ``skip`` numbers of each generator."""
    draws = []
    for worker in range(N_WORKERS):
        random_state, numpy_state = worker_rng_states(*parents, worker, pool_index=pool_index, restarts=restarts)
        stdlib, legacy = random.Random(), np.random.RandomState()
        stdlib.setstate(random_state)
        legacy.set_state(numpy_state)
        for _ in range(skip):
            stdlib.random(), legacy.random_sample()
        draws.append((stdlib.random(), float(legacy.random_sample())))
    return draws


def same_state(numpy_a: tuple, numpy_b: tuple) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(numpy_a, numpy_b))


# ==== the rule, as a pure function ==========================================================

# Mostly small values, and each place's neighbours along every coordinate: places that differ
# in one coordinate only are the likeliest to collide (a rule that ignores one would).
parent_seeds = st.integers(0, 2) | st.integers(0, 2**32 - 1)
small_or_any = st.integers(0, 3) | st.integers(0, 2**40)
places = st.tuples(parent_seeds, st.integers(0, 2), small_or_any, small_or_any, small_or_any)


def with_neighbours(place: tuple, other: tuple) -> list[tuple]:
    """``place``, and ``place`` with each of its coordinates taken from ``other``."""
    return [place] + [place[:i] + (other[i],) + place[i + 1 :] for i in range(len(place))]


@given(st.lists(places, min_size=1, max_size=8), places)
def test_worker_states_are_deterministic_distinct_and_leave_every_generator_alone(some, other):
    """(seed, draws before, pool index, worker, restarts) -> the states of both generators."""
    cases = sorted(set(some + with_neighbours(some[0], other)))
    random_before, numpy_before = random.getstate(), np.random.get_state()
    stdlib_states, numpy_states = set(), set()
    for seed, advance, pool_index, worker, restarts in cases:
        parent_random, parent_numpy = random.Random(seed), np.random.RandomState(seed)
        for _ in range(advance):  # other positions of the parents' streams, and a cached gauss
            parent_random.gauss(0.0, 1.0), parent_numpy.standard_normal()
        parents = parent_random.getstate(), parent_numpy.get_state()
        key = parents[1][1].copy()
        states = worker_rng_states(*parents, worker, pool_index=pool_index, restarts=restarts)
        again = worker_rng_states(*parents, worker, pool_index=pool_index, restarts=restarts)
        assert states[0] == again[0] and same_state(states[1], again[1])
        assert parents[0] == parent_random.getstate() and np.array_equal(parents[1][1], key)  # inputs untouched
        stdlib_states.add(states[0])
        numpy_states.add(states[1][1].tobytes())
    assert len(stdlib_states) == len(numpy_states) == len(cases)  # no two places share a stream
    assert random.getstate() == random_before and same_state(np.random.get_state(), numpy_before)


# ==== in pools ==============================================================================


def test_pools_made_one_after_the_other_draw_their_own_streams(global_generators, closing):
    """Train envs, then eval envs, the script seeding the same way before each: worker ``k`` of
    each draws its own numbers, and building a pool moves none of the caller's generators."""
    first_index, pools = pools_made(), []
    for _ in range(2):
        random.seed(0)
        np.random.seed(0)
        envs = closing(ShmVectorEnv([GlobalRngEnv] * N_WORKERS, n_workers=N_WORKERS))
        assert random.getstate() == random.Random(0).getstate()
        assert same_state(np.random.get_state(), np.random.RandomState(0).get_state())
        pools.append(list(envs.call("draws")))
        envs.close()
    assert pools == [ruled_draws(parent_states(), first_index + p) for p in range(2)]
    assert not set(pools[0]) & set(pools[1]), pools


def test_a_restarted_worker_draws_a_new_stream(global_generators, closing):
    random.seed(0)
    np.random.seed(0)
    pool_index = pools_made()
    envs = closing(ShmVectorEnv([DyingRngEnv] * N_WORKERS, n_workers=N_WORKERS, on_worker_failure="restart"))
    envs.reset()  # one number of each generator
    first_life = list(envs.call("draws"))
    with pytest.warns(RuntimeWarning, match="restarting it"):
        envs.step(np.array([1, 0]))  # worker 0 dies; its new process resets its env: one number
    second_life = list(envs.call("draws"))
    envs.close()
    assert first_life == ruled_draws(parent_states(), pool_index, skip=1)
    assert second_life[0] == ruled_draws(parent_states(), pool_index, restarts=1, skip=1)[0]
    assert second_life[0] != first_life[0]  # an env that crashed on a draw does not draw it again


def test_a_default_plan_takes_one_pool_index_as_an_explicit_one(global_generators, closing):
    """The timing run takes no index: pools after a default one draw what they draw after an
    explicit one, wherever the plan puts the envs."""
    before = pools_made()
    envs = closing(ShmVectorEnv([GlobalRngEnv] * 4))  # n_workers=None: the env is timed first
    plan = repr(envs)
    envs.close()
    assert "why='auto: " in plan
    assert pools_made() == before + 1, plan


def test_envs_in_the_main_process_keep_drawing_from_its_generators(global_generators, closing):
    np.random.seed(0)
    random.seed(0)
    envs = closing(ShmVectorEnv([GlobalRngEnv] * 3, n_workers=2, use_main_process=True))  # the last env is here
    draws = list(envs.call("draws"))
    envs.close()
    np.random.seed(0)
    random.seed(0)
    assert draws[2] == (random.random(), float(np.random.random()))
    assert len(set(draws)) == 3


# ==== the same script in fresh processes ====================================================

SCRIPT = """\
import json
import random
import sys

import numpy as np

from shmvec import ShmVectorEnv
from tests.global_rng_env import GlobalRngEnv

if __name__ == "__main__":
    random.seed(0)
    np.random.seed(0)
    pools = []
    for _ in range(2):  # train envs, then eval envs
        envs = ShmVectorEnv([GlobalRngEnv] * {n_workers}, n_workers={n_workers}, start_method=sys.argv[1])
        try:
            pools.append(envs.call("draws"))
        finally:
            envs.close()
    print(json.dumps(pools))
"""


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_the_same_script_draws_the_same_streams_under_every_start_method(tmp_path):
    """One run per start method, all at once: each draws what the rule gives its first two pools,
    which does not depend on the run."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(n_workers=N_WORKERS))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    runs = {
        method: subprocess.Popen(
            [sys.executable, str(script), method], cwd=tmp_path, env=environ, stdout=subprocess.PIPE, text=True
        )
        for method in START_METHODS
    }
    found = {}
    try:
        for method, run in runs.items():
            out, _ = run.communicate(timeout=SCRIPT_TIMEOUT)
            assert run.returncode == 0, f"{method}: exit code {run.returncode}\n{out}"
            found[method] = [[tuple(draws) for draws in pool] for pool in json.loads(out.splitlines()[-1])]
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    expected = [ruled_draws(parent_states(), pool_index) for pool_index in range(2)]
    assert expected[0] != expected[1]
    assert found == {method: expected for method in START_METHODS}
