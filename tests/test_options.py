"""Unit tests of shmvec.options: the pool options, their defaults, checks and worker counts.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pickle
import re

import numpy as np
import pytest

from shmvec import ShmVectorEnv
from shmvec.options import DEFAULT_SPIN, PoolOptions, default_start_method
from tests.envs import cartpole
from tests.helpers import assert_same


def test_pool_options_defaults():
    options = PoolOptions()
    assert options == PoolOptions(
        n_workers=None,
        start_method="forkserver",
        timeout=None,
        worker_threads=1,
        max_spin=200e-6,
        use_main_process=None,  # chosen with n_workers=None, False with an explicit n_workers
        on_worker_failure="raise",
        max_restarts=3,
    )
    assert options.max_spin == DEFAULT_SPIN
    assert default_start_method() == "forkserver"  # Linux: forkserver is available


def test_pool_options_normalises_main_shard_to_bool():
    assert PoolOptions(use_main_process=1).main_shard is True
    assert PoolOptions(use_main_process=0).main_shard is False
    assert PoolOptions().main_shard is None


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("timeout", 0, "timeout must be positive seconds or None, got 0"),
        ("timeout", -1.5, "timeout must be positive seconds or None, got -1.5"),
        ("timeout", "1", "timeout must be positive seconds or None, got '1'"),
        ("worker_threads", 0, "worker_threads must be an int >= 1 or None, got 0"),
        ("worker_threads", 2.0, "worker_threads must be an int >= 1 or None, got 2.0"),
        ("worker_threads", True, "worker_threads must be an int >= 1 or None, got True"),
        ("max_spin", -1e-6, "max_spin must be seconds >= 0, got -1e-06"),
        ("max_spin", None, "max_spin must be seconds >= 0, got None"),
        ("on_worker_failure", "ignore", 'on_worker_failure must be "raise" or "restart", got \'ignore\''),
        ("max_restarts", -1, "max_restarts must be an int >= 0, got -1"),
        ("max_restarts", 1.0, "max_restarts must be an int >= 0, got 1.0"),
        ("max_restarts", False, "max_restarts must be an int >= 0, got False"),
        ("start_method", "illegal_method", "cannot find context for 'illegal_method'"),
        ("start_method", "", "cannot find context for ''"),
    ],
)
def test_pool_options_refuse_invalid_values(option, value, message):
    with pytest.raises(ValueError) as excinfo:
        PoolOptions(**{option: value})
    assert str(excinfo.value) == message


@pytest.mark.parametrize(
    "options, num_envs, workers",
    [
        (PoolOptions(), 1, 1),
        (PoolOptions(), 64, min(64, len(os.sched_getaffinity(0)))),
        (PoolOptions(use_main_process=True), 64, min(64, len(os.sched_getaffinity(0))) - 1),
        (PoolOptions(use_main_process=True), 1, 0),  # the main process steps the only env
        (PoolOptions(n_workers=3), 7, 3),
        (PoolOptions(n_workers=7), 7, 7),
        (PoolOptions(n_workers=0, use_main_process=True), 2, 0),
        (PoolOptions(n_workers=0), 2, 0),  # every env in this process: main_shard implied
        (PoolOptions(n_workers=1, use_main_process=True), 2, 1),
    ],
)
def test_workers_for(options, num_envs, workers):
    assert options.workers_for(num_envs) == workers


@pytest.mark.parametrize(
    "options, num_envs, message",
    [
        (PoolOptions(n_workers=3), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 3"),
        (PoolOptions(n_workers=1.0), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 1.0"),
        (PoolOptions(n_workers=True), 2, "n_workers must be an int between 1 and 2 for 2 envs, got True"),
        (
            PoolOptions(n_workers=2, use_main_process=True),
            2,
            "n_workers must be an int between 0 and 1 for 2 envs with use_main_process=True, got 2",
        ),
        (
            PoolOptions(n_workers=-1, use_main_process=True),
            2,
            "n_workers must be an int between 0 and 1 for 2 envs with use_main_process=True, got -1",
        ),
    ],
)
def test_workers_for_refuses_out_of_bounds(options, num_envs, message):
    with pytest.raises(ValueError) as excinfo:
        options.workers_for(num_envs)
    assert str(excinfo.value) == message


def test_from_kwargs_builds_the_options():
    assert PoolOptions.from_kwargs(
        "ShmVectorEnv", n_workers=2, start_method="fork", use_main_process=True
    ) == PoolOptions(n_workers=2, start_method="fork", use_main_process=True)
    assert PoolOptions.from_kwargs("ShmVectorEnv") == PoolOptions()


def test_from_kwargs_refuses_an_unknown_keyword_naming_the_owner_and_the_options():
    with pytest.raises(TypeError) as excinfo:
        PoolOptions.from_kwargs("ShmPoolVecEnv", n_worker=2)
    assert str(excinfo.value) == (
        "ShmPoolVecEnv() got an unexpected keyword argument 'n_worker'; pool options are ['n_workers', "
        "'start_method', 'timeout', 'worker_threads', 'max_spin', 'use_main_process', 'on_worker_failure', "
        "'max_restarts', 'backend', 'n_nodes', 'omp_spin', 'torch_threads', 'timings', 'worker_init', 'import_main', "
        "'daemon']"
    )


def test_worker_init_must_be_callable():
    with pytest.raises(TypeError, match="worker_init must be a callable"):
        PoolOptions(worker_init="mylib.setup")
    assert PoolOptions(worker_init=print).worker_init is print


def test_timings_must_be_a_bool():
    with pytest.raises(TypeError, match="timings must be True or False"):
        PoolOptions(timings="off")


def test_n_workers_0_means_every_env_in_this_process():
    """As ``envs.timings``' advice reads: ``n_workers=0`` alone, the main process stepping every env."""
    zeros = [PoolOptions(n_workers=0), PoolOptions(n_workers=np.int64(0)), PoolOptions(n_workers=0, use_main_process=1)]
    for options in zeros:
        assert options.n_workers == 0 and type(options.n_workers) is int
        assert options.main_shard is True
        assert options.workers_for(3) == 0
        assert pickle.loads(pickle.dumps(options)) == options  # as the Ray backend ships them
        assert dataclasses.replace(options, timeout=5.0).main_shard is True
    ray_options = PoolOptions(n_workers=0, backend="ray")  # each node's actor steps its envs itself
    assert dataclasses.replace(ray_options, backend="local").main_shard is True


@pytest.mark.parametrize("main_shard", [False, np.False_, 0])
def test_n_workers_0_without_a_main_shard_says_why_it_cannot_be(main_shard):
    with pytest.raises(ValueError) as excinfo:
        PoolOptions(n_workers=0, use_main_process=main_shard)
    assert str(excinfo.value) == (
        "n_workers=0 puts every env in this process: use_main_process=False "
        "leaves nothing to step them; pass n_workers >= 1 for worker processes"
    )


def test_numpy_numbers_are_read_by_their_meaning():
    options = PoolOptions(
        n_workers=np.int64(2),
        worker_threads=np.int32(1),
        max_restarts=np.uint8(0),
        timings=np.True_,
        torch_threads=np.int16(3),
    )
    assert options == PoolOptions(n_workers=2, worker_threads=1, max_restarts=0, timings=True, torch_threads=3)
    assert all(type(value) is int for value in (options.n_workers, options.worker_threads, options.max_restarts))
    assert type(options.timings) is bool and type(options.torch_threads) is int
    assert PoolOptions(use_main_process=np.True_).main_shard is True
    assert PoolOptions(n_nodes=np.int64(2), backend="ray").n_nodes == 2
    with pytest.raises(ValueError, match="n_workers must be an int between 1 and 2 for 2 envs, got np.True_|got True"):
        PoolOptions(n_workers=np.True_).workers_for(2)  # a bool is not a count, numpy's either


def _made_timings():
    """``envs.timings`` of a run where the hand-off cost more than stepping every env here would."""
    from shmvec.clocks.timings import Lane, Timings

    lanes = [Lane(k, range(2 * k, 2 * k + 2), 100, 0.2, 0.2) for k in range(2)]
    return Timings(1.0, 100, 0.25, 0.2, 0.0, 0.35, 0.2, 4, 2, 2, lanes)


def test_the_timings_advice_followed_to_the_letter_works(closing):
    """Each verdict of ``envs.timings`` that names ``n_workers=...`` builds a pool with exactly the
    keywords it names, and that pool gives DummyVecEnv's results."""
    DummyVecEnv = pytest.importorskip("stable_baselines3.common.vec_env").DummyVecEnv  # the [sb3] extra
    from shmvec import ShmPoolVecEnv
    from tests.envs import cartpole

    advised = [line for line in str(_made_timings()).splitlines() if "n_workers=" in line]
    assert len(advised) == 2, advised  # the hand-off's verdict and the other calls'
    for line in advised:
        kwargs = {
            name: ast.literal_eval(value) for name, value in re.findall(r"\b(n_workers|use_main_process)=(\w+)", line)
        }
        assert kwargs == {"n_workers": 0}, line
        shm = closing(ShmPoolVecEnv([cartpole] * 4, **kwargs))
        dummy = closing(DummyVecEnv([cartpole] * 4))
        assert (shm.n_workers, shm._pool.main_shard) == (0, True)
        shm.seed(3), dummy.seed(3)
        assert_same(shm.reset(), dummy.reset(), "reset")
        for t in range(30):
            actions = np.array([t % 2, 1, 0, (t // 3) % 2])
            assert_same(shm.step(actions), dummy.step(actions), f"step {t}")


def test_n_workers_0_through_every_gymnasium_entry(closing):
    """ShmVectorEnv's second argument, make_vec's and a ``shmvec/`` twin's keyword: every env in this process."""
    from gymnasium.vector import SyncVectorEnv

    from shmvec import ShmVectorEnv, make_vec
    from shmvec.adapters.registration import ShmVectorEntryPoint
    from tests.envs import cartpole

    made = [
        ShmVectorEnv([cartpole] * 3, 0),
        ShmVectorEnv([cartpole] * 3, n_workers=np.int64(0)),
        make_vec("CartPole-v1", 3, 0),
        ShmVectorEntryPoint("CartPole-v1")(3, n_workers=0),
    ]
    for envs in made:
        closing(envs)
        assert (envs.n_workers, envs._pool.main_shard) == (0, True), repr(envs)
        ref = closing(SyncVectorEnv([cartpole] * 3))
        assert_same(envs.reset(seed=1), ref.reset(seed=1), "reset")
        for t in range(10):
            actions = np.array([t % 2, 0, 1])
            assert_same(envs.step(actions), ref.step(actions), f"step {t}")


def test_the_former_name_main_shard_still_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="main_shard is now called use_main_process"):
        options = PoolOptions.from_kwargs("ShmVectorEnv", n_workers=1, main_shard=True)
    assert options == PoolOptions(n_workers=1, use_main_process=True) and options.main_shard is True
    with pytest.raises(TypeError, match="pass use_main_process only"):
        PoolOptions.from_kwargs("ShmVectorEnv", main_shard=True, use_main_process=False)


def test_an_adapter_given_main_shard_says_use_main_process(closing):
    with pytest.warns(DeprecationWarning, match="main_shard is now called use_main_process") as warned:
        envs = closing(ShmVectorEnv([cartpole] * 2, n_workers=1, main_shard=True))
    assert "use_main_process=True" in repr(envs) and "main_shard" not in repr(envs)
    assert warned[0].filename == __file__  # the user's line, whichever entry point


def test_gym_make_vec_takes_main_shard_too(closing):
    import gymnasium as gym

    import shmvec

    twin = shmvec.register("CartPole-v1")
    with pytest.warns(DeprecationWarning, match="main_shard is now called use_main_process") as warned:
        envs = closing(gym.make_vec(twin, num_envs=2, n_workers=1, main_shard=True))
    assert "use_main_process=True" in repr(envs)
    assert warned[0].filename == __file__


def test_options_pickled_under_the_former_name_load():
    pickled = pickle.dumps(PoolOptions(n_workers=1, use_main_process=True), protocol=0)
    assert b"use_main_process" in pickled
    old = pickle.loads(pickled.replace(b"use_main_process", b"main_shard"))
    assert old == PoolOptions(n_workers=1, use_main_process=True)
