"""Held calls (``shmvec.ipc.interrupts``) at their edges, each scenario in its own process
(``held_call_scenarios.py``: an interrupt, an alarm or a deadlock there cannot touch pytest's):

- a Ctrl-C, sent by another process, while an env of the main shard is stuck in its step
  raises there at once, and the pool then steps on as the reference does (after an async
  send, whose envs' states are then unknown, it says it must be closed);
- another signal handler that raises at any instant (SIGALRM every 1-2 ms) never leaves the
  holding handler installed: SIGINT's handler (Python's default, or the script's) is as
  before, and Ctrl-C raises;
- an async reset with 1 MB of options while sends that reply 300 kB each are in flight
  (more than a socket's buffer, each way) completes; to a worker stuck in an env, it times out.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

SCENARIOS = "tests.engine.held_call_scenarios"


def run_scenario(*args: str, timeout: float = 60.0) -> dict:
    command = [sys.executable, "-m", SCENARIOS, *args]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # the watchdog: a hang
        pytest.fail(f"the scenario {args} hung: {exc.stderr}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n_workers", [0, 1], ids=["main-shard-only", "worker-and-main-shard"])
@pytest.mark.vector_api  # its scenario builds a ShmVectorEnv
def test_a_ctrl_c_stops_an_env_stuck_in_the_main_shard_and_the_pool_steps_on(n_workers):
    report = run_scenario("stuck", str(n_workers))
    assert f"n_workers={n_workers}, use_main_process=True" in report["plan"], report
    assert report["interrupted"], report
    # The step had 3.5 s left when the signal came: it was cut short, not waited out.
    assert report["after_signal"] < 1.5, report
    assert report["after"] == "same", report


@pytest.mark.vector_api  # its scenario builds a ShmVectorEnv
def test_a_ctrl_c_stops_an_env_stuck_in_an_async_send_and_the_pool_says_it_must_be_closed():
    report = run_scenario("stuck", "1", "sends")
    assert report["interrupted"] and report["after_signal"] < 1.5, report
    assert "KeyboardInterrupt stopped the step of env 3 in the main process" in report["after"], report
    assert "close() the env" in report["after"], report


@pytest.mark.parametrize("sigint", [[], ["own"]], ids=["default-sigint-handler", "own-sigint-handler"])
@pytest.mark.vector_api  # its scenario builds a ShmVectorEnv
def test_a_raising_alarm_handler_never_leaves_ctrl_c_held(sigint):
    report = run_scenario("alarms", *sigint)
    assert report["alarms"] >= 50 and report["calls"] >= 100, report  # the alarms hit, and calls went on
    assert report["handler_as_before"], report
    assert report["ctrl_c_raises"], report


@pytest.mark.vector_api  # its scenario builds a ShmVectorEnv
def test_a_large_async_reset_beside_large_sends_completes():
    report = run_scenario("large-request", timeout=90.0)
    assert report["env_ids"] == [0, 1, 2, 3], report
    assert report["payloads"] == [300_000] * 3, report
    assert report["reset_obs"] == report["want_obs"], report


@pytest.mark.vector_api  # its scenario builds a ShmVectorEnv
def test_a_large_request_to_a_worker_that_does_not_read_times_out():
    report = run_scenario("hung-reader")
    assert report["raised"].startswith("StepTimeoutError: envs 0"), report
    assert "close() the env" in report["raised"], report
