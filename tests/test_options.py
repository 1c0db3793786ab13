"""Unit tests of shmvec.options: the pool options, their defaults, checks and worker counts.

Fast and without worker processes: every expected value and message is spelled out, so a
change of behaviour fails here before it surfaces in an end-to-end test.
"""

from __future__ import annotations

import os

import pytest

from shmvec.options import DEFAULT_SPIN, PoolOptions, default_start_method


def test_pool_options_defaults():
    options = PoolOptions()
    assert options == PoolOptions(
        n_workers=None,
        start_method="forkserver",
        timeout=None,
        worker_threads=1,
        max_spin=200e-6,
        main_shard=None,  # chosen with n_workers=None, False with an explicit n_workers
        on_worker_failure="raise",
        max_restarts=3,
    )
    assert options.max_spin == DEFAULT_SPIN
    assert default_start_method() == "forkserver"  # Linux: forkserver is available


def test_pool_options_normalises_main_shard_to_bool():
    assert PoolOptions(main_shard=1).main_shard is True
    assert PoolOptions(main_shard=0).main_shard is False
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
        (PoolOptions(main_shard=True), 64, min(64, len(os.sched_getaffinity(0))) - 1),
        (PoolOptions(main_shard=True), 1, 0),  # the main process steps the only env
        (PoolOptions(n_workers=3), 7, 3),
        (PoolOptions(n_workers=7), 7, 7),
        (PoolOptions(n_workers=0, main_shard=True), 2, 0),
        (PoolOptions(n_workers=1, main_shard=True), 2, 1),
    ],
)
def test_workers_for(options, num_envs, workers):
    assert options.workers_for(num_envs) == workers


@pytest.mark.parametrize(
    "options, num_envs, message",
    [
        (PoolOptions(n_workers=3), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 3"),
        (PoolOptions(n_workers=0), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 0"),
        (PoolOptions(n_workers=1.0), 2, "n_workers must be an int between 1 and 2 for 2 envs, got 1.0"),
        (PoolOptions(n_workers=True), 2, "n_workers must be an int between 1 and 2 for 2 envs, got True"),
        (
            PoolOptions(n_workers=2, main_shard=True),
            2,
            "n_workers must be an int between 0 and 1 for 2 envs with main_shard=True, got 2",
        ),
        (
            PoolOptions(n_workers=-1, main_shard=True),
            2,
            "n_workers must be an int between 0 and 1 for 2 envs with main_shard=True, got -1",
        ),
    ],
)
def test_workers_for_refuses_out_of_bounds(options, num_envs, message):
    with pytest.raises(ValueError) as excinfo:
        options.workers_for(num_envs)
    assert str(excinfo.value) == message


def test_from_kwargs_builds_the_options():
    assert PoolOptions.from_kwargs("ShmVectorEnv", n_workers=2, start_method="fork", main_shard=True) == PoolOptions(
        n_workers=2, start_method="fork", main_shard=True
    )
    assert PoolOptions.from_kwargs("ShmVectorEnv") == PoolOptions()


def test_from_kwargs_refuses_an_unknown_keyword_naming_the_owner_and_the_options():
    with pytest.raises(TypeError) as excinfo:
        PoolOptions.from_kwargs("ShmPoolVecEnv", n_worker=2)
    assert str(excinfo.value) == (
        "ShmPoolVecEnv() got an unexpected keyword argument 'n_worker'; pool options are ['n_workers', "
        "'start_method', 'timeout', 'worker_threads', 'max_spin', 'main_shard', 'on_worker_failure', "
        "'max_restarts', 'backend', 'n_nodes', 'omp_spin', 'torch_threads', 'timings', 'worker_init', 'import_main']"
    )


def test_worker_init_must_be_callable():
    with pytest.raises(TypeError, match="worker_init must be a callable"):
        PoolOptions(worker_init="mylib.setup")
    assert PoolOptions(worker_init=print).worker_init is print


def test_timings_must_be_a_bool():
    with pytest.raises(TypeError, match="timings must be True or False"):
        PoolOptions(timings="off")
