"""``worker_threads`` reaches the BLAS numpy loaded before the worker started.

Under the forkserver (the default) the server preloaded numpy, so OpenBLAS sized its pool
to the machine's cores before a worker could set ``OPENBLAS_NUM_THREADS``: the pool itself
must be resized (threadpoolctl), not only the env vars set.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest
import threadpoolctl

from shmvec import ShmPoolVecEnv

FRESH_BLAS_THREADS = (
    "import numpy, threadpoolctl;"
    "print(max(lib['num_threads'] for lib in threadpoolctl.threadpool_info() if lib['user_api'] == 'blas'))"
)


class BlasProbe(gym.Wrapper):
    """CartPole that tells how many threads each BLAS loaded in its process runs."""

    def blas_threads(self) -> list[int]:
        return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]


def make_probe() -> gym.Env:
    return BlasProbe(gym.make("CartPole-v1"))


def fresh_blas_threads() -> int:
    """The BLAS pool size of a new process that imports numpy (what a worker left alone keeps)."""
    done = subprocess.run([sys.executable, "-c", FRESH_BLAS_THREADS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_worker_threads_resizes_the_blas_pool_loaded_before(start_method, closing):
    env = closing(ShmPoolVecEnv([make_probe], n_workers=1, worker_threads=1, start_method=start_method))
    [threads] = env.env_method("blas_threads")
    assert threads and threads == [1] * len(threads)


def test_worker_threads_none_leaves_the_blas_pool_alone(closing):
    fresh = fresh_blas_threads()
    if fresh == 1:
        pytest.skip("a new process's BLAS runs one thread here: nothing to tell apart")
    env = closing(ShmPoolVecEnv([make_probe], n_workers=1, worker_threads=None, start_method="forkserver"))
    [threads] = env.env_method("blas_threads")
    assert threads and max(threads) == fresh
