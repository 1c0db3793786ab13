"""The default's timing process ends with the caller's need of it (:mod:`shmvec.engine.timing_run`).

- The main process SIGKILLed while the timing process builds or steps its env (an env that
  takes 20 s, as a simulator starting up): the timing process is gone within ~3 s, under
  fork and forkserver, and an env it had built was closed.
- On the plan's timeout the env is closed before the process is killed.
- Nothing the timed env started outlives the timing run: simulators its constructor launched (a
  child, a grandchild, a double-forked daemon in a session of its own, one that ignores SIGTERM)
  are gone soon after the plan's timeout, after the main process is SIGKILLed (fork and
  forkserver), and, but for the daemon, after the timing process itself is SIGKILLed. Generated
  scenarios stop the timing run (Ctrl-C) while it builds, resets, steps or closes (a ``close()``
  that swallows the stop: the timing process is killed) or let it end with a ``close()`` that
  left them running: nothing survives, and a pool then builds and steps.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shmvec import ShmVectorEnv
from shmvec.engine import timing_run
from shmvec.options import PoolOptions
from shmvec.processes.script_setup import worker_start
from tests.global_rng_env import builds
from tests.helpers import REPO, gone, poll_until
from tests.recording_envs import SlowEnv

SLOW = 20.0  # seconds the env takes to build or to step: far longer than any bound below
STARTED = 30.0  # generous bound for a script to start and its timing process to build its env, on a loaded box
ORPHAN_BOUND = 3.0  # the timing process is gone this soon after the main process dies (it checks every 0.25 s)

SCRIPT = """
    import functools, sys
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.recording_envs import SlowEnv

    start_method, folder, build, step = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    ShmVectorEnv([functools.partial(SlowEnv, folder, build, step)] * 2, start_method=start_method)
"""


def kill_if_alive(pids) -> None:
    for pid in pids:  # a failed test must not leave a 20 s sleeper behind
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stage", ["building", "stepping"])
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])  # the timing process: forked, started
def test_the_timing_process_ends_soon_after_the_main_process_is_killed(tmp_path, start_method, stage):
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(SCRIPT.format(repo=REPO)))
    build, step = (SLOW, 0.0) if stage == "building" else (0.0, SLOW)
    args = [sys.executable, str(script), start_method, str(tmp_path), str(build), str(step)]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        started = poll_until(lambda: bool(builds(tmp_path / "built")) or proc.poll() is not None, STARTED)
        pids = builds(tmp_path / "built")
        assert started and pids, (
            f"the timing process built no env: {proc.poll()} {proc.stderr.read() if proc.poll() else ''}"
        )
        poll_until(lambda: False, 0.5)  # now in the env's 20 s: its constructor, or its first step
        proc.kill()
        proc.wait()
        assert poll_until(lambda: gone(pids[0]), ORPHAN_BOUND), "the timing process outlived the main process"
        if stage == "stepping":  # the env existed: it was closed on the way out
            assert builds(tmp_path / "closed") == pids
    finally:
        proc.kill()
        kill_if_alive(pids)  # before reading the script's output: a live timing process holds its pipes
        proc.communicate()


def test_on_its_timeout_the_timing_process_closes_the_env_before_it_is_killed(tmp_path):
    options = PoolOptions()
    env_fn = functools.partial(SlowEnv, str(tmp_path), 0.0, SLOW)
    try:
        with pytest.raises(timing_run.TimingFailed, match="not timed within 1 s"):
            timing_run.time_in_process(options.start_method, worker_start(options), env_fn, timeout=1.0)
        pids = builds(tmp_path / "built")
        assert len(pids) == 1 and gone(pids[0])
        assert builds(tmp_path / "closed") == pids  # closed in the grace period, not killed in its step
    finally:
        kill_if_alive(builds(tmp_path / "built"))


# ==== what the timed env started ends with the timing run ==================================

SIMULATORS = {  # what an env's constructor may launch: a shell script, and its pids to watch
    "child": "exec sleep 60",
    "grandchild": "sleep 60 >/dev/null & echo $!; wait",
    "daemon": "sleep 60 </dev/null >/dev/null 2>&1 & echo $!",  # in a new session; its shell exits at once
    "ignores_term": "trap '' TERM; exec sleep 60",
}
GONE_BOUND = 5.0  # seconds for all of them to be gone once the timing run has ended (they get ~1 s after SIGTERM)
STAGES = ["building", "resetting", "stepping", "closing"]  # where SimulatorEnv blocks, in the first env built


def launch(kind: str) -> list[int]:
    shell = subprocess.Popen(
        ["sh", "-c", SIMULATORS[kind]], stdout=subprocess.PIPE, text=True, start_new_session=kind == "daemon"
    )
    with shell.stdout:
        echoed = shell.stdout.readline().split() if "echo" in SIMULATORS[kind] else []
    return [shell.pid, *map(int, echoed)]


class SimulatorEnv(gym.Env):
    """The first one built in ``folder`` (the timing process's: it builds before the workers) launches
    ``kinds`` of simulator (:data:`SIMULATORS`), writes their pids to ``started``, and blocks at
    ``stage`` (``blocked`` says it does): in a 60 s sleep, or in a ``close()`` that swallows every
    interruption. Its ``close()`` leaves them running. The others are plain envs."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, folder: str, kinds: tuple[str, ...], stage: str | None):
        self.folder = Path(folder)
        try:
            (self.folder / "first").touch(exist_ok=False)
        except FileExistsError:
            self.stage = None
            return
        self.stage = stage
        (self.folder / "timing_pid").write_text(str(os.getpid()))
        pids = [pid for kind in kinds for pid in launch(kind)]
        (self.folder / "started").write_text(" ".join(map(str, pids)))
        self._block_at("building")

    def _block_at(self, stage: str) -> None:
        if self.stage == stage:
            (self.folder / "blocked").touch()
            if stage != "closing":
                time.sleep(60)
                return
            while True:  # a close() stuck where no signal reaches it
                try:
                    time.sleep(60)
                except BaseException:
                    pass

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._block_at("resetting")
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self._block_at("stepping")
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def close(self):
        self._block_at("closing")


def started(folder) -> list[int]:
    path = Path(folder) / "started"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def kill_leftovers(folder) -> None:
    """A failed test must not leave 60 s sleepers (nor the timing process) behind."""
    for pid in started(folder) + builds(Path(folder) / "timing_pid"):
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def assert_all_gone(folder) -> None:
    pids = started(folder)
    assert pids, "the timed env launched nothing: the test would prove nothing"
    assert poll_until(lambda: all(map(gone, pids)), GONE_BOUND), [
        (pid, psutil.Process(pid).ppid()) for pid in pids if not gone(pid)
    ]


def env_fns(folder, kinds, stage, num_envs: int = 2):
    return [functools.partial(SimulatorEnv, str(folder), tuple(kinds), stage)] * num_envs


def steps_right(envs) -> None:
    obs, _ = envs.reset(seed=0)
    obs, rewards, *_ = envs.step(np.zeros(envs.num_envs, np.int64))
    assert obs.shape == (envs.num_envs, 1) and rewards.tolist() == [0.0] * envs.num_envs


def on(path: Path, action: Callable[[], None]) -> threading.Thread:
    """``action`` in a thread as soon as ``path`` exists (given up after :data:`STARTED` seconds)."""

    def wait_then_act() -> None:
        if poll_until(path.exists, STARTED):
            action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def test_what_the_timed_env_started_ends_on_the_plans_timeout(tmp_path, monkeypatch, closing):
    monkeypatch.setattr(timing_run, "TIMING_TIMEOUT", 1.5)
    try:
        envs = closing(ShmVectorEnv(env_fns(tmp_path, SIMULATORS, "building"), start_method="fork"))
        assert "not timed within 1.5 s" in repr(envs)
        assert_all_gone(tmp_path)
        steps_right(envs)
    finally:
        kill_leftovers(tmp_path)


SCRIPT_WITH_SIMULATORS = """
    import functools, sys
    sys.path.insert(0, {repo!r})
    from shmvec import ShmVectorEnv
    from tests.engine.test_timing_orphans import SIMULATORS, env_fns

    ShmVectorEnv(env_fns(sys.argv[2], SIMULATORS, "building"), start_method=sys.argv[1])
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])  # the timing process: forked, started
def test_what_the_timed_env_started_ends_soon_after_the_main_process_is_killed(tmp_path, start_method):
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(SCRIPT_WITH_SIMULATORS.format(repo=REPO)))
    args = [sys.executable, str(script), start_method, str(tmp_path)]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        blocked = poll_until(lambda: (tmp_path / "blocked").exists() or proc.poll() is not None, STARTED)
        assert blocked and proc.poll() is None, f"the timed env did not block: {proc.poll()}"
        proc.kill()
        proc.wait()
        assert_all_gone(tmp_path)
    finally:
        proc.kill()
        kill_leftovers(tmp_path)
        proc.communicate()


def test_what_the_timed_env_started_in_its_group_ends_when_the_timing_process_is_killed(tmp_path, closing):
    """SIGKILLed from outside (the out-of-memory killer), the timing process ends nothing itself:
    the main process kills what is left of its group. A daemon in a session of its own escapes."""
    kinds = ["child", "grandchild", "ignores_term"]
    kill = on(tmp_path / "blocked", lambda: os.kill(int((tmp_path / "timing_pid").read_text()), signal.SIGKILL))
    try:
        envs = closing(ShmVectorEnv(env_fns(tmp_path, kinds, "building"), start_method="fork"))
        kill.join()
        assert "the timing process died" in repr(envs)
        assert_all_gone(tmp_path)
        steps_right(envs)
    finally:
        kill_leftovers(tmp_path)


@pytest.mark.usefixtures("default_sigint")  # the Ctrl-C raises KeyboardInterrupt, however pytest was started
@pytest.mark.parametrize("stage", [*STAGES, "after close"])  # each, every run; what it started, generated
@settings(max_examples=2, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(SIMULATORS)), min_size=1, max_size=4, unique=True))
@example(kinds=sorted(SIMULATORS))
def test_nothing_the_timed_env_started_survives_the_timing_run(monkeypatch, stage, kinds):
    """Ctrl-C while the first env blocks at ``stage`` (``"after close"``: it does not block, its
    ``close()`` leaves the simulators running); then a pool of the same env builds and steps."""
    monkeypatch.setattr(timing_run, "TIMING_TIMEOUT", STARTED)  # a safety net: Ctrl-C stops it first
    monkeypatch.setattr(timing_run, "CLOSE_GRACE", 0.3)  # for the close() that swallows SIGTERM
    monkeypatch.setattr(timing_run, "DESCENDANT_GRACE", 0.3)  # inherited by the forked timing process
    main_thread = threading.main_thread().ident
    with tempfile.TemporaryDirectory() as folder:
        fns = env_fns(folder, kinds, None if stage == "after close" else stage)
        try:
            if stage == "after close":
                with ShmVectorEnv(fns, start_method="fork") as envs:
                    assert "why='auto: " in repr(envs)  # timed to the end
                    assert_all_gone(folder)
                    steps_right(envs)
                return
            ctrl_c = on(Path(folder) / "blocked", lambda: signal.pthread_kill(main_thread, signal.SIGINT))
            with pytest.raises(KeyboardInterrupt):
                ShmVectorEnv(fns, start_method="fork")
            ctrl_c.join()
            assert_all_gone(folder)
            with ShmVectorEnv(fns, start_method="fork") as envs:
                steps_right(envs)
        finally:
            kill_leftovers(folder)
