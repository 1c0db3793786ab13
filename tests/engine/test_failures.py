"""Issue 4, "never hang": every failure ends in a clear error within seconds.

Each scenario runs against both adapters under fork; the core ones also under
forkserver and spawn. ``no_leaks`` (conftest) then checks that no process and no
/dev/shm entry was left behind, and every test checks that ``close()`` is quick and
idempotent after the failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from shmvec import (
    ClosedEnvError,
    InvalidActionError,
    RemoteTraceback,
    SharedMemoryCapacityError,
    ShmPoolVecEnv,
    ShmVectorEnv,
    StepStateError,
    StepTimeoutError,
    WorkerDiedError,
)
from tests.faulty import N_ENVS, N_WORKERS, Boom, FaultyEnv, env_fns
from tests.helpers import REPO, gone, poll_until, pool_pids, shm_of

ADAPTERS = ["sb3", "gym"]
ALL_METHODS = ["fork", "forkserver", "spawn"]
# The core scenarios: both adapters under fork; under forkserver and spawn the Gymnasium
# one, to keep the suite short (the engine under both adapters is the same).
CORE = [
    ("fork", "sb3"),
    ("fork", "gym"),
    ("forkserver", "gym"),
    ("spawn", "gym"),
]
# A pool that fails to start once its workers built their envs, where the start method is not the
# point: under fork close() waits its 3 s for them (a forked worker holds the main process's end of
# its pipe, so it never sees EOF).
FAILS_AT_START = "forkserver"
QUICK = 5.0  # seconds: generous bound for "at once" / "within about a second" on a loaded 2-core box


# -- one vocabulary over both adapters ----------------------------------------------


def make_vec(adapter: str, fns, n_workers: int = N_WORKERS, **kwargs):
    cls = ShmPoolVecEnv if adapter == "sb3" else ShmVectorEnv
    return cls(fns, n_workers, **kwargs)


def reset(env):
    return env.reset() if isinstance(env, ShmPoolVecEnv) else env.reset(seed=0)


def actions(env) -> np.ndarray:
    return np.zeros(env.num_envs, dtype=np.int64)


def step(env):
    return env.step(actions(env))


def env_method(env, name: str) -> list:
    return list(env.env_method(name) if isinstance(env, ShmPoolVecEnv) else env.call(name))


def assert_closes_quickly(env) -> None:
    start = time.monotonic()
    env.close()
    env.close()  # idempotent
    assert time.monotonic() - start < QUICK, "close() after the failure took too long"


@pytest.fixture
def vec(closing):
    """``vec(adapter, fns, **kwargs)``: a vector env closed at teardown whatever happens."""
    return lambda adapter, fns, **kwargs: closing(make_vec(adapter, fns, **kwargs))


# -- an env raises ----------------------------------------------------------------------


def assert_remote(excinfo, where: str, text: str) -> None:
    exc = excinfo.value
    assert type(exc) is Boom  # the original type, so `except ValueError` keeps working
    assert str(exc) == text
    assert any(f"raised in {where}" in note for note in exc.__notes__), exc.__notes__
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert f"Boom: {text}" in str(exc.__cause__)  # the worker's traceback, down to the env's frame
    assert "tests/faulty.py" in str(exc.__cause__)  # the env's own frame


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method, adapter", CORE)
def test_env_raises_in_step(vec, adapter, start_method):
    env = vec(adapter, env_fns("step"), start_method=start_method)
    reset(env)
    step(env)
    with pytest.raises(Boom) as excinfo:
        step(env)
    assert_remote(excinfo, "env 3 (worker 1)", "step failed on purpose")
    assert excinfo.value.env_index == 3 and excinfo.value.worker_index == 1
    step(env)  # an env error leaves the pool usable: the worker keeps serving
    assert_closes_quickly(env)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(
    "fail, call, text",
    [
        ("reset", reset, "reset failed on purpose"),
        ("render", lambda env: env.render(), "render failed on purpose"),
        (None, lambda env: env_method(env, "boom"), "env_method failed on purpose"),
    ],
    ids=["reset", "render", "env_method"],
)
def test_env_raises_in_rare_call(vec, adapter, fail, call, text):
    env = vec(adapter, env_fns(fail), start_method="fork")
    if fail != "reset":
        reset(env)
    with pytest.raises(Boom) as excinfo:
        call(env)
    # env_method runs on every env; env 0 is the first to raise.
    where = "env 3 (worker 1)" if fail else "env 0 (worker 0)"
    assert_remote(excinfo, where, text)
    assert len(env_method(env, "pid")) == N_ENVS  # still usable
    assert_closes_quickly(env)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method, adapter", CORE + [("spawn", "sb3")])
def test_env_fn_raises_at_construction(adapter, start_method):
    start = time.monotonic()
    with pytest.raises(Boom) as excinfo:
        make_vec(adapter, env_fns("init"), start_method=start_method)
    assert time.monotonic() - start < 30  # spawn imports torch per worker on a busy box
    assert_remote(excinfo, "env 3 (worker 1)", "env construction failed on purpose")


@pytest.mark.parametrize("n_workers", [0, 1], ids=["all-in-process", "main-shard"])
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_env_fn_raising_in_the_main_process_raises_its_own_exception(adapter, n_workers):
    with pytest.raises(Boom) as excinfo:  # the original type, so `except ValueError` keeps working
        make_vec(adapter, env_fns("init", n=4), n_workers, use_main_process=True, start_method="fork")
    assert str(excinfo.value) == "env construction failed on purpose"
    assert any("raised in env 3 (main process shard)" in note for note in excinfo.value.__notes__)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_unpicklable_exception_becomes_env_error(vec, adapter):
    from shmvec import EnvError

    class LocalError(Exception):  # not importable by name: cannot be sent back as itself
        pass

    def make():
        env = FaultyEnv()
        env.boom = lambda: (_ for _ in ()).throw(LocalError("local failure"))
        return env

    env = vec(adapter, [make] * 2, n_workers=1, start_method="fork")
    with pytest.raises(EnvError, match="LocalError: local failure") as excinfo:
        env_method(env, "boom")
    assert isinstance(excinfo.value.__cause__, RemoteTraceback)
    assert any("raised in env 0 (worker 0)" in note for note in excinfo.value.__notes__)
    assert_closes_quickly(env)


# -- a worker dies ----------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize(
    "fail, how",
    [("exit", "exit code 3"), ("segv", "signal SIGSEGV")],
    ids=["os._exit", "sigsegv"],
)
def test_worker_dies_inside_step(vec, adapter, fail, how):
    env = vec(adapter, env_fns(fail), start_method="fork")
    reset(env)
    pid = pool_pids(env)[1]
    step(env)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as excinfo:
        step(env)
    assert time.monotonic() - start < QUICK
    assert f"worker 1 (envs 2..3, pid {pid}) died with {how}" in str(excinfo.value)
    with pytest.raises(WorkerDiedError, match="unusable: worker 1"):  # and stays broken, at once
        step(env)
    assert_closes_quickly(env)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method, adapter", CORE)
def test_worker_sigkilled_while_stepping(vec, adapter, start_method):
    env = vec(adapter, env_fns("slow", at=1), start_method=start_method)
    reset(env)
    pid = pool_pids(env)[1]
    env.step_async(actions(env))
    time.sleep(0.1)  # worker 1 is inside its 0.5 s step
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as excinfo:
        env.step_wait()
    assert time.monotonic() - start < QUICK
    assert f"worker 1 (envs 2..3, pid {pid}) died with signal SIGKILL" in str(excinfo.value)
    assert_closes_quickly(env)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("call", ["step", "reset", "env_method"])
def test_worker_sigkilled_while_idle(vec, adapter, call):
    env = vec(adapter, env_fns(None), start_method="fork")
    reset(env)
    pid = pool_pids(env)[0]
    os.kill(pid, signal.SIGKILL)
    assert poll_until(lambda: gone(pid), QUICK)  # a zombie: never reap it here, the pool must see it
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as excinfo:
        {"step": step, "reset": reset, "env_method": lambda e: env_method(e, "pid")}[call](env)
    assert time.monotonic() - start < QUICK
    assert f"worker 0 (envs 0..1, pid {pid}) died with signal SIGKILL" in str(excinfo.value)
    assert_closes_quickly(env)


# -- an env hangs -----------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method, adapter", CORE)
def test_hanging_step_times_out(vec, adapter, start_method):
    env = vec(adapter, env_fns("hang"), start_method=start_method, timeout=1.0)
    reset(env)
    step(env)
    start = time.monotonic()
    with pytest.raises(StepTimeoutError) as excinfo:
        step(env)
    assert time.monotonic() - start < 1.0 + QUICK
    assert "envs 2..3 did not answer within timeout=1.0s" in str(excinfo.value)  # not envs 0..1
    assert isinstance(excinfo.value, TimeoutError)
    with pytest.raises(WorkerDiedError, match="unusable: envs 2..3 did not answer"):
        step(env)
    assert_closes_quickly(env)  # the stuck worker is terminated


@pytest.mark.timeout(60)
def test_hanging_env_fn_times_out(monkeypatch):
    import shmvec.engine.pool

    monkeypatch.setattr(shmvec.engine.pool, "START_TIMEOUT", 1.0)  # start-up otherwise gets 30 s
    start = time.monotonic()
    with pytest.raises(StepTimeoutError, match=r"envs 2\.\.3 were not built within 1\.0s \(an env_fn hangs\?\)"):
        make_vec("sb3", env_fns("init_hang", bad=2), start_method="fork", timeout=1.0)
    assert time.monotonic() - start < 1.0 + QUICK


# -- results that cannot be pickled ---------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_unpicklable_get_attr_result(vec, adapter):
    env = vec(adapter, env_fns(None), start_method="fork")
    reset(env)
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object") as excinfo:
        env.get_attr("lock")
    notes = "\n".join(excinfo.value.__notes__)
    assert "env 0 returned a value that cannot be pickled" in notes
    assert "raised in env 0 (worker 0)" in notes
    assert env.get_attr("t") is not None and len(env.get_attr("t")) == N_ENVS  # still usable
    step(env)
    assert_closes_quickly(env)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_unpicklable_step_info(vec, adapter):
    env = vec(adapter, env_fns("bad_info"), start_method="fork")
    reset(env)
    step(env)
    with pytest.raises(TypeError, match="cannot pickle") as excinfo:
        step(env)
    notes = "\n".join(excinfo.value.__notes__)
    assert "env 3 returned an info dict that cannot be pickled" in notes
    assert "raised in env 3 (worker 1)" in notes
    assert_closes_quickly(env)


# -- misuse -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_misuse_fails_at_once(vec, adapter):
    env = vec(adapter, env_fns(None), start_method="fork")
    reset(env)
    start = time.monotonic()
    with pytest.raises(StepStateError, match="no pending step|without any prior call"):  # SB3 | Gymnasium adapter
        env.step_wait()
    with pytest.raises(InvalidActionError, match=r"shape|actions"):
        env.step(np.zeros(N_ENVS + 1, dtype=np.int64))
    env.step_async(actions(env))
    with pytest.raises(StepStateError, match="already pending|while waiting for a pending call"):
        env.step_async(actions(env))
    env.step_wait()
    step(env)  # none of the above broke it
    env.close()
    with pytest.raises(ClosedEnvError, match="close"):
        step(env)
    with pytest.raises(ClosedEnvError, match="close"):
        reset(env)
    assert time.monotonic() - start < QUICK
    assert_closes_quickly(env)


# -- /dev/shm too small -------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_dev_shm_too_small(monkeypatch, adapter):
    import shmvec.ipc.arena

    monkeypatch.setattr(shmvec.ipc.arena, "free_bytes", lambda: 100)
    with pytest.raises(
        SharedMemoryCapacityError, match=r"needs [\d,]+ bytes of shared memory in /dev/shm, but only 100 bytes are free"
    ) as excinfo:
        make_vec(adapter, env_fns(None), start_method=FAILS_AT_START)
    assert isinstance(excinfo.value, MemoryError)
    assert "--shm-size" in str(excinfo.value)


@pytest.mark.timeout(60)
def test_dev_shm_fills_up_while_reserving(monkeypatch):
    import errno

    import shmvec.ipc.arena

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shmvec.ipc.arena.os, "posix_fallocate", no_space)
    with pytest.raises(SharedMemoryCapacityError, match=r"needs [\d,]+ bytes .* the allocation failed"):
        make_vec("sb3", env_fns(None), start_method=FAILS_AT_START)


# -- signals: a handled signal while waiting, Ctrl-C, and a SIGKILLed main process ------


@pytest.mark.timeout(60)
def test_handled_signal_while_waiting_does_not_break_the_step(vec):
    env = vec("sb3", env_fns("slow", at=1), start_method="fork", max_spin=0.0)
    reset(env)
    handled = []
    previous = signal.signal(signal.SIGUSR1, lambda *args: handled.append(1))  # e.g. a SIGCHLD/SIGWINCH handler
    stop = threading.Event()

    def pester():  # to the main thread itself, the one blocked in sem_timedwait, until the step is over
        while not stop.wait(0.05):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    thread = threading.Thread(target=pester)
    thread.start()
    try:
        for _ in range(3):
            step(env)  # an interrupted wait must be retried, not surface as SignalError
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGUSR1, previous)
    assert handled


def run_script(tmp_path, body: str, *args: str, **popen) -> subprocess.Popen:
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        **popen,
    )


def read_ready(proc: subprocess.Popen) -> list[str]:
    """Wait for the script's READY line (bounded by the test's timeout) and return its fields."""
    line = proc.stdout.readline()
    assert line.startswith("READY"), (
        f"script failed to start: {line!r}\n{proc.stderr.read() if proc.poll() is not None else ''}"
    )
    return line.split()[1:]


STEPPING_SCRIPT = """
    import signal, sys, time
    import numpy as np
    import gymnasium as gym


    class SlowEnv(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            time.sleep(0.02)  # the main process spends its time blocked in the wait
            while "stuck" in sys.argv:  # stuck in Python code: only a watchdog thread can notice
                pass
            return np.zeros(2, np.float32), 1.0, False, False, {}


    if __name__ == "__main__":
        # as run from a terminal: a background job (`cmd &` in a script) inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        start_method, adapter, state = sys.argv[1:]
        if adapter == "sb3":
            from shmvec import ShmPoolVecEnv as VecEnv
        else:
            from shmvec import ShmVectorEnv as VecEnv
        env = VecEnv([SlowEnv] * 4, n_workers=2, start_method=start_method)
        env.reset()
        pids = [link.process.pid for link in env._pool.links]
        print("READY", *pids, flush=True)
        try:
            while True:
                env.step(np.zeros(4, dtype=np.int64))
                if state == "idle":
                    time.sleep(3600)
        finally:
            start = time.monotonic()
            env.close()
            env.close()
            print(f"CLOSED {time.monotonic() - start:.2f}", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "start_method, adapter, state",
    [
        ("fork", "sb3", "stepping"),
        ("fork", "sb3", "idle"),
        ("forkserver", "gym", "stepping"),
        ("spawn", "gym", "stepping"),
        ("fork", "sb3", "stuck"),
        ("forkserver", "gym", "stuck"),
        ("spawn", "gym", "stuck"),
    ],
)
def test_main_process_sigkilled(tmp_path, start_method, adapter, state):
    """Workers notice and exit by themselves; the resource tracker then unlinks everything."""
    proc = run_script(tmp_path, STEPPING_SCRIPT, start_method, adapter, state)
    try:
        pids = [int(p) for p in read_ready(proc)]
        assert shm_of(proc.pid), "the script should own segments and semaphores while it runs"
        time.sleep(0.1)  # mid-step: a step takes 20 ms
        proc.kill()
        proc.wait(QUICK)
        start = time.monotonic()
        assert poll_until(lambda: all(gone(p) for p in pids), QUICK), "workers outlived the main process"
        assert poll_until(lambda: not shm_of(proc.pid), QUICK), f"left in /dev/shm: {shm_of(proc.pid)}"
        print(f"workers gone and /dev/shm clean {time.monotonic() - start:.1f}s after the SIGKILL")
    finally:
        proc.kill()
        proc.communicate(timeout=QUICK)
        for pid in pids if "pids" in locals() else ():  # a failed test must not leave orphans spinning
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "start_method, adapter, target",
    [
        ("fork", "sb3", "process"),
        ("fork", "sb3", "group"),
        ("forkserver", "gym", "group"),
        ("spawn", "gym", "group"),
    ],
)
def test_ctrl_c(tmp_path, start_method, adapter, target):
    """SIGINT to the main process (or to the whole group, as a terminal's Ctrl-C does)."""
    proc = run_script(tmp_path, STEPPING_SCRIPT, start_method, adapter, "stepping", start_new_session=True)
    try:
        pids = [int(p) for p in read_ready(proc)]
        time.sleep(0.5)
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=QUICK)
    assert proc.returncode in (-signal.SIGINT, 1), err
    assert err.count("Traceback (most recent call last)") == 1, err  # ours only: none from the workers
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert "shmvec-worker" not in err and "leaked" not in err, err
    closed = [line for line in out.splitlines() if line.startswith("CLOSED")]
    assert closed and float(closed[0].split()[1]) < QUICK, out
    assert all(gone(p) for p in pids)
    assert not shm_of(proc.pid)


def test_a_forkserver_workers_exit_stays_visible_after_a_join():
    """A join reads the exit code from the forkserver's sentinel; the link's exit watch must not rely on it."""
    import multiprocessing as mp

    from shmvec.engine.link import ExitWatch

    process = mp.get_context("forkserver").Process(target=time.sleep, args=(0.3,))
    process.start()
    watch = ExitWatch.of(process.pid)
    try:
        assert watch is not None, "pidfds are missing on this machine"
        assert not watch.exited()
        process.join(10)
        assert process.exitcode == 0
        assert watch.exited() and watch.exited()  # and it stays so
    finally:
        process.join(10)
        if watch is not None:
            watch.close()


def test_a_worker_that_cannot_be_started_raises_its_own_error(monkeypatch):
    """fork() failing (EAGAIN: too many processes) is the error the caller sees, not the clean-up's."""
    import errno
    import multiprocessing.context

    def refuse(self):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "_Popen", staticmethod(lambda process: refuse(process)))
    with pytest.raises(BlockingIOError):
        ShmVectorEnv([FaultyEnv] * 2, n_workers=1, start_method="fork")
