"""The default's timing process is a fork of the caller where that is safe (``timing_run.fork_is_safe``).

- A fork sees what the caller set up at run time (no import, no set-up to carry); spawn does not.
- It is not a fork with another Python thread running, under spawn, with workers on more
  (or unlimited) OpenMP threads, or with torch's CUDA started; generated caller states
  say the same.
- A caller that used torch's OpenMP threads forks a copy whose env raises torch's threads and
  runs torch ops: the copy limits its threads first, keeps torch on one, and does not hang (GNU
  OpenMP's copied pool would); with a ``worker_init`` (which may raise them by any route, e.g.
  threadpoolctl) the timing process is not a fork.
- An asyncio caller's own SIGTERM handler does not run when the copy is told to stop.
- A warning the caller was shown once is not shown again after a pool.
- The caller gets no warning of a fork in a process with threads (Python >= 3.12 gives one).
- The caller's garbage is not finalized in the copy.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import threading
import types

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmvec import ShmVectorEnv
from shmvec.engine import timing_run
from shmvec.options import PoolOptions
from shmvec.processes.script_setup import worker_start
from tests.envs import cartpole
from tests.helpers import REPO

SET_AT_RUN_TIME: list[str] = []  # filled by a test: a fork sees it, a started process does not


class SeesTheCaller(gym.Env):
    """Writes what it sees of :data:`SET_AT_RUN_TIME` and its pid to ``path`` when built."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, path: str):
        with open(path, "a") as file:
            file.write(f"{os.getpid()} {','.join(SET_AT_RUN_TIME) or '-'}\n")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def timing_sees(tmp_path, start_method: str) -> str:
    path = tmp_path / "seen"
    options = PoolOptions(start_method=start_method)
    timing_run.timer(options.start_method, worker_start(options))(functools.partial(SeesTheCaller, str(path)))
    (line,) = path.read_text().splitlines()
    pid, seen = line.split()
    assert int(pid) != os.getpid()  # built in a process of its own all the same
    return seen


@pytest.fixture
def set_at_run_time():
    SET_AT_RUN_TIME.append("marked")
    yield
    SET_AT_RUN_TIME.clear()


def test_the_timing_process_is_a_fork_that_sees_the_callers_state(tmp_path, set_at_run_time):
    assert timing_run.fork_is_safe("forkserver", 1)
    assert timing_sees(tmp_path, "forkserver") == "marked"


def test_under_spawn_the_timing_process_starts_as_a_worker(tmp_path, set_at_run_time):
    assert timing_sees(tmp_path, "spawn") == "-"


def test_with_another_thread_running_the_timing_process_is_not_a_fork(tmp_path, set_at_run_time):
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert not timing_run.fork_is_safe("forkserver", 1)
        assert timing_sees(tmp_path, "forkserver") == "-"
    finally:
        release.set()
        thread.join()


@settings(
    max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # patched in a context per example
@given(
    start_method=st.sampled_from(["fork", "forkserver", "spawn"]),
    worker_threads=st.one_of(st.none(), st.integers(1, 4)),
    threads=st.integers(0, 2),
    torch_state=st.sampled_from(["absent", "cpu", "cuda", "broken"]),
    unsafe=st.sampled_from([None, *timing_run.FORK_UNSAFE_MODULES]),
)
def test_a_fork_only_where_it_is_safe(monkeypatch, start_method, worker_threads, threads, torch_state, unsafe):
    with monkeypatch.context() as patch:
        for name in timing_run.FORK_UNSAFE_MODULES:
            if name == unsafe:
                patch.setitem(sys.modules, name, types.ModuleType(name))
            else:
                patch.delitem(sys.modules, name, raising=False)
        if torch_state != "absent":
            stand_in = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: torch_state == "cuda"))
            if torch_state == "broken":
                stand_in.cuda.is_initialized = lambda: 1 / 0
            patch.setitem(sys.modules, "torch", stand_in)
        else:
            patch.delitem(sys.modules, "torch", raising=False)
        release = threading.Event()
        started = [threading.Thread(target=release.wait) for _ in range(threads)]
        for thread in started:
            thread.start()
        try:
            safe = timing_run.fork_is_safe(start_method, worker_threads)
        finally:
            release.set()
            for thread in started:
                thread.join()
    expected = (
        start_method != "spawn"
        and worker_threads == 1
        and threads == 0
        and torch_state in ("absent", "cpu")
        and not unsafe
    )
    assert safe == expected


TORCH_CALLER = """
    import functools, sys, time
    sys.path.insert(0, {repo!r})
    import threadpoolctl, torch
    from shmvec import ShmVectorEnv
    from shmvec.engine import timing_run
    from tests.envs import TorchEnv

    timing_run.TIMING_TIMEOUT = 20.0  # a hung copy fails the timing (the plan then says so) well within the test's time

    def torch_ops():
        x = torch.randn(512, 512)
        for _ in range(5):
            (x @ x).relu().sum()

    def raise_threads():  # as a worker_init may: by threadpoolctl, which the copy cannot keep at one thread
        threadpoolctl.threadpool_limits(2)
        torch_ops()

    torch.set_num_threads(2)
    torch_ops()  # GNU OpenMP's pool now exists in the caller
    assert timing_run.fork_is_safe("forkserver", 1)
    with ShmVectorEnv([functools.partial(TorchEnv, threads=2)] * 2) as envs:  # a fork: its env raises torch's threads
        print(repr(envs))
    with ShmVectorEnv([TorchEnv] * 2, worker_init=raise_threads) as envs:  # not a fork: a worker_init runs first
        print(repr(envs))
"""


@pytest.mark.timeout(120)
def test_a_caller_that_used_openmp_threads_gets_a_timing_process_that_does_not_hang(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(TORCH_CALLER.format(repo=REPO)))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    timed = [line for line in done.stdout.splitlines() if "why='auto: " in line]
    assert len(timed) == 2, done.stdout  # both timed, neither "timing env 1 failed"


THREADED_CALLER = """
    import _thread, sys, time
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import cartpole

    _thread.start_new_thread(time.sleep, (30,))  # an OS thread threading does not count: Python >= 3.12 warns of it
    with ShmVectorEnv([cartpole] * 2) as envs:
        print(repr(envs))
"""


def test_the_fork_gives_the_caller_no_warning_of_threads(tmp_path):
    """Python >= 3.12 warns of a fork with other OS threads (BLAS's, OpenMP's): fork_is_safe dealt with them."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(THREADED_CALLER.format(repo=REPO)))
    args = [sys.executable, "-W", "always::DeprecationWarning", str(script)]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "why='auto: " in done.stdout, done.stdout
    assert "multi-threaded" not in done.stderr, done.stderr


class Finalized:
    """In a reference cycle, so only the garbage collector finalizes it; writes the pid that did."""

    def __init__(self, path: str):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as file:
            file.write(f"{os.getpid()}\n")


def test_the_callers_garbage_is_not_finalized_in_the_copy(tmp_path):
    path = tmp_path / "finalized"
    for _ in range(200):  # young garbage: the copy's allocations would set off a collection
        Finalized(str(path))
    with ShmVectorEnv([cartpole] * 2) as envs:
        assert "why='auto: " in repr(envs)
    finalized_by = {int(pid) for pid in path.read_text().split()} if path.exists() else set()
    assert finalized_by <= {os.getpid()}, f"finalized in the timing process too: {finalized_by}"


ASYNCIO_CALLER = """
    import asyncio, functools, signal, sys
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from shmvec.engine import timing_run
    from tests.recording_envs import SlowEnv

    timing_run.TIMING_TIMEOUT = 1.0  # the env takes 3 s to build: the copy is told to stop (SIGTERM)
    timing_run.CLOSE_GRACE = 1.0

    async def main():
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: print("the caller's SIGTERM handler ran", flush=True))
        envs = ShmVectorEnv([functools.partial(SlowEnv, {folder!r}, 3.0, 0.0)] * 2)
        envs.close()
        await asyncio.sleep(0.5)  # the loop reads its wake-up fd
        print("done", flush=True)

    asyncio.run(main())
"""


def test_a_signal_sent_to_the_copy_does_not_reach_an_asyncio_callers_handler(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(ASYNCIO_CALLER.format(repo=REPO, folder=str(tmp_path))))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout and "SIGTERM handler ran" not in done.stdout, done.stdout


WARNED_CALLER = """
    import sys, warnings
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import cartpole

    def deprecated():
        warnings.warn("shown once per location", UserWarning)

    for _ in range(3):
        deprecated()
        with ShmVectorEnv([cartpole] * 2) as envs:
            assert "why='auto: " in repr(envs), repr(envs)
    deprecated()
"""


def test_a_warning_shown_once_is_not_shown_again_after_a_pool(tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(WARNED_CALLER.format(repo=REPO)))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("UserWarning: shown once per location") == 1, done.stderr
