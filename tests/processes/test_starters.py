"""No process shmvec starts is a fork of the caller (unless ``start_method="fork"`` is asked for):
its own forkserver (:mod:`shmvec.processes.starters`) starts them, preloaded with what the env
factories' pickles name.

- What the caller set at run time is not seen by the timing process nor by the workers; under
  ``start_method="fork"`` (asked for) it is.
- What a fork of the caller broke (an outside review): a gzip log referenced only by its logger
  stays readable; C stdio pending in the caller is written once; a lock held by a thread that
  ``threading`` does not count, and GNU OpenMP's pool of a caller that used torch, stall nothing.
- The caller's own forkserver (its preload, its start) is left alone; multiprocessing's functions
  are not replaced.
- The server's preload: the modules a pickle names; one that raises, kills or hangs the server
  at import leaves a server without it; one with an import-time print prints in the server, not
  in every process; a module found on a ``sys.path`` changed after the server started is found.
- Ctrl-C or SIGKILL of the caller while the server starts: a later pool starts; nothing outlives
  the caller.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVectorEnv
from shmvec.processes import starters
from tests.helpers import REPO, poll_until

MARK = "SHMVEC_TEST_CALLER"  # set in the environment of a test's caller script, so of all it starts
SET_AT_RUN_TIME: list[str] = []  # filled by a test: a fork sees it, a started process does not


class SeesTheCaller(gym.Env):
    """Writes its pid and what it sees of :data:`SET_AT_RUN_TIME` to ``path`` when built."""

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


def run_script(tmp_path, source: str, *args: str, timeout: float = 90, **format_args) -> subprocess.CompletedProcess:
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(source.format(repo=REPO, folder=str(tmp_path), **format_args)))
    env = {**os.environ, MARK: str(tmp_path)}  # what the caller starts inherits it: see left_behind
    done = subprocess.run(
        [sys.executable, *args, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert_nothing_left(tmp_path)
    return done


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_only_an_asked_for_fork_sees_the_callers_state(tmp_path, start_method):
    path = tmp_path / "seen"
    SET_AT_RUN_TIME.append("marked")
    try:
        env_fn = functools.partial(SeesTheCaller, str(path))
        with ShmVectorEnv([env_fn] * 3, n_workers=None, start_method=start_method) as envs:  # the timing run
            assert "why='auto: " in repr(envs)
        with ShmVectorEnv([env_fn] * 3, n_workers=2, start_method=start_method):
            pass
    finally:
        SET_AT_RUN_TIME.clear()
    seen = {}
    for line in path.read_text().splitlines():
        pid, marker = line.split()
        seen[int(pid)] = marker
    others = {pid: marker for pid, marker in seen.items() if pid != os.getpid()}
    assert len(others) >= 3, seen  # the timing process and two workers
    assert set(others.values()) == ({"marked"} if start_method == "fork" else {"-"}), seen


GZIP_CALLER = """
    import gzip, logging, sys
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import cartpole

    logger = logging.getLogger("run")
    logger.addHandler(logging.StreamHandler(gzip.open({folder!r} + "/log.gz", "wt")))  # referenced by its logger only
    logger.setLevel(logging.INFO)
    logger.info("before")
    for n_workers in (None, 2):
        with ShmVectorEnv([cartpole] * 2, n_workers=n_workers) as envs:
            logger.info(repr(envs))
    logger.info("after")
    logger.handlers[0].stream.close()  # the gzip trailer, written once, by the caller
"""


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_a_gzip_log_of_the_caller_stays_readable(tmp_path):
    import gzip

    run_script(tmp_path, GZIP_CALLER)
    lines = gzip.open(tmp_path / "log.gz", "rt").read().splitlines()  # BadGzipFile with a trailer written by a copy
    assert lines[0] == "before" and lines[-1] == "after" and len(lines) == 4, lines


STDIO_CALLER = """
    import ctypes, sys
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import FlushesStdio

    ctypes.CDLL(None).printf(b"pending in C stdio\\n")  # stdout is a file: block-buffered, not yet written
    for n_workers in (None, 2):
        with ShmVectorEnv([FlushesStdio] * 2, n_workers=n_workers):
            pass
"""


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_output_pending_in_c_stdio_is_written_once(tmp_path):
    with open(tmp_path / "out", "w") as out:
        script = tmp_path / "caller.py"
        script.write_text(textwrap.dedent(STDIO_CALLER.format(repo=REPO)))
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, stdout=out, stderr=subprocess.PIPE, timeout=60
        )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_text().count("pending in C stdio") == 1


LOCK_CALLER = """
    import _thread, sys, time
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from shmvec.engine import timing_run
    from tests import envs

    timing_run.TIMING_TIMEOUT = 20.0
    _thread.start_new_thread(lambda: envs.BUILD_LOCK.acquire() and time.sleep(60), ())  # threading does not count it
    time.sleep(0.2)
    start = time.perf_counter()
    with ShmVectorEnv([envs.TakesBuildLock] * 2, use_main_process=False) as venv:  # the lock is held here
        print(repr(venv), round(time.perf_counter() - start, 1))
"""


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_a_lock_held_by_an_uncounted_thread_of_the_caller_stalls_nothing(tmp_path):
    done = run_script(tmp_path, LOCK_CALLER)
    assert "why='auto: " in done.stdout, done.stdout  # not "timing env 1 failed" after a 20 s stall


TORCH_CALLER = """
    import functools, sys
    sys.path.insert(0, {repo!r})
    import threadpoolctl, torch
    from shmvec import ShmVectorEnv
    from shmvec.engine import timing_run
    from tests.envs import TorchEnv

    timing_run.TIMING_TIMEOUT = 20.0  # a hung process fails the timing (the plan then says so) well within the test

    def torch_ops():
        x = torch.randn(512, 512)
        for _ in range(5):
            (x @ x).relu().sum()

    def raise_threads():  # by threadpoolctl, a route nothing intercepts
        threadpoolctl.threadpool_limits(2)
        torch_ops()

    torch.set_num_threads(2)
    torch_ops()  # GNU OpenMP's pool now exists in the caller
    with ShmVectorEnv([functools.partial(TorchEnv, threads=2)] * 2) as envs:
        print(repr(envs))
    with ShmVectorEnv([TorchEnv] * 2, worker_init=raise_threads) as envs:
        print(repr(envs))
"""


@pytest.mark.timeout(150)
@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_a_caller_that_used_openmp_threads_stalls_no_process(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("threadpoolctl")
    done = run_script(tmp_path, TORCH_CALLER, timeout=130)
    timed = [line for line in done.stdout.splitlines() if "why='auto: " in line]
    assert len(timed) == 2, done.stdout  # both timed, neither "timing env 1 failed"


OWN_FORKSERVER_CALLER = """
    import multiprocessing, sys
    from multiprocessing import forkserver, spawn
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import cartpole

    if __name__ == "__main__":
        before = spawn.get_preparation_data
        multiprocessing.set_forkserver_preload(["json"])
        for start_method in ("forkserver", "spawn"):
            with ShmVectorEnv([cartpole] * 2, n_workers=2, start_method=start_method):
                pass
        with ShmVectorEnv([cartpole] * 2):
            pass
        assert forkserver._forkserver._preload_modules == ["json"], forkserver._forkserver._preload_modules
        assert forkserver._forkserver._forkserver_pid is None  # never started by shmvec
        assert spawn.get_preparation_data is before
        ctx = multiprocessing.get_context("forkserver")
        process = ctx.Process(target=print, args=("the caller's own forkserver works",))
        process.start()
        process.join()
        assert process.exitcode == 0
"""


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_the_callers_own_forkserver_and_multiprocessing_are_left_alone(tmp_path):
    done = run_script(tmp_path, OWN_FORKSERVER_CALLER)
    assert "the caller's own forkserver works" in done.stdout


def test_the_server_preloads_the_modules_a_pickle_names():
    cloudpickle = pytest.importorskip("cloudpickle")
    env_util = pytest.importorskip("stable_baselines3.common.env_util")

    class Collect(list):
        def __init__(self, env_fns, **kwargs):
            super().__init__(env_fns)

        def seed(self, seed):
            pass

    (factory,) = env_util.make_vec_env("CartPole-v1", 1, vec_env_cls=Collect)
    named = starters.modules_named_by(cloudpickle.dumps(factory))
    assert "stable_baselines3.common.monitor" in named and "gymnasium" in named, named
    assert "__main__" not in starters.modules_named_by(cloudpickle.dumps(SeesTheCaller))
    assert starters.modules_named_by(b"not a pickle") == []


def test_a_pickle_held_inside_a_pickle_names_its_modules_too():
    # agent slots carry their env pickled: unpickled in the worker, it imports the env's modules
    import pickle
    import threading

    inner = pickle.dumps(threading.Event)
    assert "threading" in starters.modules_named_by(pickle.dumps({"env": inner}))
    assert "threading" not in starters.modules_named_by(pickle.dumps({"env": b"\x80 not a pickle"}))
    # one that carries data is not read (too slow to parse at each worker's start)
    large = pickle.dumps((threading.Event, b"x" * starters.MAX_INNER_PICKLE))
    assert "threading" not in starters.modules_named_by(pickle.dumps({"env": large}))


PRELOAD_CALLER = """
    import sys, time
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {folder!r})
    from shmvec import ShmVectorEnv
    from shmvec.processes import starters
    import odd_module

    starters.SERVER_START_TIMEOUT = 3.0
    start = time.perf_counter()
    with ShmVectorEnv([odd_module.make] * 3, n_workers=None) as envs:  # the timing run, then the plan's layout
        print(repr(envs))
    with ShmVectorEnv([odd_module.make] * 3, n_workers=3, worker_threads=2, timeout=20) as envs:
        envs.reset(seed=0)
    print("preload", starters._server.preload, round(time.perf_counter() - start, 1))
"""

ODD_MODULES = {
    "starts-a-thread": "import threading\nLOCK = threading.Lock()\nif sys.argv == ['-c']:\n"
    "    threading.Thread(target=lambda: LOCK.acquire() and time.sleep(600), daemon=True).start(); time.sleep(0.2)",
    "runs-openmp": "import torch\ntorch.set_num_threads(2); (torch.ones(512, 512) @ torch.ones(512, 512)).sum()",
    "raises": "if sys.argv == ['-c']: raise RuntimeError('not in a server')",
    "exits": "if sys.argv == ['-c']: os._exit(3)",
    "hangs": "if sys.argv == ['-c']: time.sleep(600)",
    "prints": "print('imported odd_module', flush=True)",
}


@pytest.mark.parametrize("kind", sorted(ODD_MODULES))
@pytest.mark.vector_api  # its scenario builds a ShmVectorEnv
def test_a_preloaded_module_that_fails_or_hangs_or_prints_leaves_a_working_pool(tmp_path, kind):
    if kind == "runs-openmp":
        pytest.importorskip("torch")
    source = f"import os, sys, time\n{ODD_MODULES[kind]}\n"
    source += "from tests.envs import cartpole\n\ndef make():\n"
    source += "    with LOCK:\n        pass\n" if kind == "starts-a-thread" else ""
    source += "    if 'torch' in sys.modules:\n        (torch.ones(512, 512) @ torch.ones(512, 512)).sum()\n"
    source += "    return cartpole()\n"
    (tmp_path / "odd_module.py").write_text(source)
    done = run_script(tmp_path, PRELOAD_CALLER, timeout=60)
    assert "why='auto: " in done.stdout, done.stdout
    if kind == "prints":  # the caller's import and the server's: not one per process
        assert done.stdout.count("imported odd_module") == 2, done.stdout
        assert "'odd_module'" in done.stdout.splitlines()[-1]
    if kind in ("exits", "hangs"):  # replaced by a server without it (one that left threads starts over itself)
        assert "'odd_module'" not in done.stdout.splitlines()[-1], done.stdout


LATE_PATH_CALLER = """
    import os, sys
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import cartpole

    with ShmVectorEnv([cartpole] * 2, n_workers=2):  # the server starts with the sys.path of now
        pass
    late = os.path.join({folder!r}, "late")
    os.makedirs(late)
    with open(os.path.join(late, "late_env.py"), "w") as f:
        f.write("from tests.envs import cartpole\\ndef make():\\n    return cartpole()\\n")
    sys.path.insert(0, late)
    import late_env
    with ShmVectorEnv([late_env.make] * 2, n_workers=2) as envs:
        envs.reset(seed=0)
        print("late env stepped")
"""


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_a_module_on_a_sys_path_changed_after_the_server_started_is_found(tmp_path):
    assert "late env stepped" in run_script(tmp_path, LATE_PATH_CALLER).stdout


@contextlib.contextmanager
def running_caller(tmp_path, source: str, **format_args) -> Iterator[subprocess.Popen]:
    """A caller script of ``tmp_path`` running ``source``, marked (see :func:`left_behind`), with
    Python's own SIGINT handler whoever runs the tests; once the block is done, nothing it started
    may be left, and it is killed whatever happened."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(source.format(repo=REPO, folder=str(tmp_path), **format_args)))
    caller = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env={**os.environ, MARK: str(tmp_path)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        yield caller
        assert_nothing_left(tmp_path)
    finally:
        caller.kill()
        caller.communicate()


def assert_nothing_left(tmp_path) -> None:
    assert poll_until(lambda: not left_behind(tmp_path), 10), left_behind(tmp_path)


def left_behind(tmp_path) -> str:
    """The command lines of the processes that a caller script of ``tmp_path`` started and that still run."""
    marker, found = f"{MARK}={tmp_path}\0", []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                if marker.encode() not in environ.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                found.append(cmdline.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(found)


SLOW_START_CALLER = """
    import os, signal, sys, threading
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {folder!r})
    from shmvec import ShmVectorEnv
    import slow_module

    print("pid", os.getpid(), flush=True)
    if {interrupt}:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()  # while the server imports slow_module
        try:
            ShmVectorEnv([slow_module.make] * 2, n_workers=2)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        with ShmVectorEnv([slow_module.make] * 2, n_workers=2) as envs:
            envs.reset(seed=0)
            print("a later pool started", flush=True)
    else:
        ShmVectorEnv([slow_module.make] * 2, n_workers=2)
"""


@pytest.mark.parametrize("interrupt", [True, False], ids=["ctrl-c", "sigkill"])
@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_ctrl_c_or_sigkill_of_the_caller_while_the_server_starts(tmp_path, interrupt):
    (tmp_path / "slow_module.py").write_text(
        "import sys, time\nif sys.argv == ['-c']: time.sleep(3)\nfrom tests.envs import cartpole\n\n"
        "def make():\n    return cartpole()\n"
    )
    with running_caller(tmp_path, SLOW_START_CALLER, interrupt=interrupt) as caller:
        if interrupt:
            out, err = caller.communicate(timeout=60)
            assert caller.returncode == 0, out + err
            assert "interrupted" in out and "a later pool started" in out, out + err
        else:
            assert caller.stdout.readline().startswith("pid")
            time.sleep(1.0)  # the server is importing slow_module
            caller.kill()
            caller.wait()


DAEMON_CALLER = """
    import os, sys, time, weakref
    if {finalize_first}:  # weakref's exit handler registered before multiprocessing's
        class Anything: pass
        kept = Anything()
        weakref.finalize(kept, print)
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.envs import StartsAChild

    envs = ShmVectorEnv([StartsAChild] * 2, n_workers=2, daemon=False)
    envs.reset(seed=0)
    print("daemonic", flush=True)  # the envs started their children: not daemonic
    if {forget}:
        sys.exit(0)  # close() forgotten: the interpreter's exit ends the workers, without a hang
    time.sleep(600)  # SIGKILLed here
"""


@pytest.mark.parametrize(
    "forget, finalize_first",
    [(True, False), (True, True), (False, False)],
    ids=["close-forgotten", "finalize-first", "sigkill"],
)
@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_non_daemonic_workers_start_children_and_never_outlive_the_caller(tmp_path, forget, finalize_first):
    """Nothing the workers' envs started outlives the caller either (an env child that does not watch its parent)."""
    with running_caller(tmp_path, DAEMON_CALLER, forget=forget, finalize_first=finalize_first) as caller:
        line = caller.stdout.readline()
        assert line.startswith("daemonic"), line + caller.stderr.read()
        if forget:
            assert caller.wait(timeout=30) == 0, caller.stderr.read()
        else:
            caller.kill()
            caller.wait()
