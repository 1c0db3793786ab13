"""Issue 4, "never leak": processes, descriptors and /dev/shm entries all go back.

Released on close(), on garbage collection of an unclosed env (with a ResourceWarning),
at interpreter exit and after failures (tests/engine/test_failures.py); and the workers never
make Python's resource tracker complain. ``no_leaks`` (conftest) double-checks each test.
"""

from __future__ import annotations

import gc
import weakref

import psutil
import pytest

from shmvec import ShmPool
from shmvec.options import PoolOptions
from tests.engine.test_failures import ADAPTERS, QUICK, make_vec, read_ready, reset, run_script, step
from tests.faulty import env_fns
from tests.helpers import descendant_pids, gone, poll_until, shm_entries, shm_of


def started(adapter: str, **kwargs):
    """A stepped env, with the processes and /dev/shm entries it added."""
    pids_before, shm_before = descendant_pids(), shm_entries()
    env = make_vec(adapter, env_fns(None), start_method="fork", **kwargs)
    reset(env)
    step(env)
    pids, names = descendant_pids() - pids_before, shm_entries() - shm_before
    assert len(pids) == 2 and len(names) == 8, (pids, names)  # 2 workers; 1 arena + 3 semaphores each + 1 ready
    return env, pids, names


def released(pids: set[int], names: set[str]) -> bool:
    return poll_until(lambda: all(gone(p) for p in pids) and not (shm_entries() & names), QUICK)


@pytest.mark.timeout(60)
def test_gc_of_unclosed_env_warns_and_releases():
    env, pids, names = started("sb3")
    with pytest.warns(ResourceWarning, match="not closed; call close"):
        del env
        gc.collect()
    assert released(pids, names)


@pytest.mark.timeout(60)
def test_gc_of_unclosed_pool_warns_and_releases():
    pids_before, shm_before = descendant_pids(), shm_entries()
    pool = ShmPool(env_fns(None), PoolOptions(n_workers=2, start_method="fork"))
    pids, names = descendant_pids() - pids_before, shm_entries() - shm_before
    assert pids and names
    with pytest.warns(ResourceWarning, match="not closed; call close"):
        del pool
        gc.collect()
    assert released(pids, names)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["raise", "restart"])
def test_an_unclosed_pool_goes_with_its_last_reference(mode):
    """Its rare calls, async schedule and restarter hold it through a weak proxy: no reference
    cycle, so it is finalized at once, with no cycle collection."""
    pids_before, shm_before = descendant_pids(), shm_entries()
    pool = ShmPool(env_fns(None), PoolOptions(n_workers=2, start_method="fork", on_worker_failure=mode))
    pids, names = descendant_pids() - pids_before, shm_entries() - shm_before
    ref = weakref.ref(pool)
    gc.disable()
    try:
        with pytest.warns(ResourceWarning, match="not closed; call close"):
            del pool
        assert ref() is None
    finally:
        gc.enable()
    assert released(pids, names)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_gc_of_unclosed_env_releases(adapter):
    env, pids, names = started(adapter)
    del env
    gc.collect()  # gymnasium's VectorEnv.__del__ closes quietly; SB3 relies on our finalizer
    assert released(pids, names)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_context_manager(adapter):
    pids_before = descendant_pids()
    with make_vec(adapter, env_fns(None), start_method="fork") as env:
        reset(env)
        step(env)
        pids = descendant_pids() - pids_before
    assert env.closed
    assert released(pids, set())
    with pytest.raises(KeyError):  # released on the way out of an exception too
        with make_vec(adapter, env_fns(None), start_method="fork") as env:
            raise KeyError("in the with block")
    assert env.closed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_many_cycles_leave_nothing(adapter):
    me = psutil.Process()

    def cycle():
        with make_vec(adapter, env_fns(None), start_method="fork") as env:
            reset(env)
            step(env)
        del env

    def counts():
        gc.collect()
        return len(descendant_pids()), me.num_fds(), len(shm_entries())

    cycle()  # warm-up: the resource tracker and lazy imports open descriptors once
    before = counts()
    # What a cycle leaks stays leaked, so any leak in one of the 40 shows; one that strikes a cycle
    # in ten still shows 98 times in 100
    for _ in range(40):
        cycle()
    assert poll_until(lambda: counts() == before, QUICK), f"(processes, fds, /dev/shm) {before} -> {counts()}"


EXIT_SCRIPT = """
    import sys, warnings
    import numpy as np
    sys.path.insert(0, ".")  # the cwd: the checkout, for tests.faulty
    from tests.faulty import env_fns

    if __name__ == "__main__":
        start_method, adapter = sys.argv[1:]
        if adapter == "sb3":
            from shmvec import ShmPoolVecEnv as VecEnv
        else:
            from shmvec import ShmVectorEnv as VecEnv
        closed = VecEnv(env_fns(None), n_workers=2, start_method=start_method)
        closed.reset()
        closed.step(np.zeros(4, dtype=np.int64))
        closed.close()
        forgotten = VecEnv(env_fns(None), n_workers=2, start_method=start_method)
        forgotten.reset()
        forgotten.step(np.zeros(4, dtype=np.int64))
        print("READY", *forgotten.env_method("pid") if adapter == "sb3" else forgotten.call("pid"), flush=True)
        # exit without close(): the finalizer releases everything at interpreter exit
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "start_method, adapter",
    [
        ("fork", "sb3"),
        ("fork", "gym"),
        ("forkserver", "gym"),
        ("spawn", "gym"),
    ],
)
def test_interpreter_exit_releases_and_tracker_stays_quiet(tmp_path, start_method, adapter):
    proc = run_script(tmp_path, EXIT_SCRIPT, start_method, adapter)
    try:
        pids = {int(p) for p in read_ready(proc)}
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=QUICK)
    assert proc.returncode == 0, err
    assert "leaked" not in err and "resource_tracker" not in err, err  # workers never register anything
    assert "Traceback" not in err, err
    assert not shm_of(proc.pid), shm_of(proc.pid)  # gone at exit, not later by the tracker
    assert poll_until(lambda: all(gone(p) for p in pids), QUICK)
