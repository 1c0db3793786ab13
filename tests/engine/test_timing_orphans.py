"""The default's timing process ends with the caller's need of it (:mod:`shmvec.engine.timing_run`).

- The main process SIGKILLed while the timing process builds or steps its env (an env that
  takes 20 s, as a simulator starting up): the timing process is gone within ~3 s, under
  fork and forkserver, and an env it had built was closed.
- On the plan's timeout the env is closed before the process is killed.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from shmvec.engine import timing_run
from shmvec.engine.link import mp_context
from shmvec.engine.script_setup import worker_start
from shmvec.options import PoolOptions
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
@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
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
            timing_run.time_in_process(mp_context(options.start_method), worker_start(options), env_fn, timeout=1.0)
        pids = builds(tmp_path / "built")
        assert len(pids) == 1 and gone(pids[0])
        assert builds(tmp_path / "closed") == pids  # closed in the grace period, not killed in its step
    finally:
        kill_if_alive(builds(tmp_path / "built"))
