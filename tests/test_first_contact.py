"""A new user's first script: no ``if __name__ == "__main__":`` guard.

Under forkserver (the default) and spawn, every worker starts by importing the main
script; without the guard that import would build the vector env again inside the
worker. The user must get one clear error saying what to do, not a hang and not a
traceback per worker. Under fork the same script just works.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

TIMEOUT = 60  # seconds; a hang fails the test

UNGUARDED_SCRIPT = """\
import gymnasium as gym
import numpy as np

import shmvec

envs = shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, n_workers=2{start_method})
envs.reset(seed=0)
envs.step(np.zeros(4, dtype=np.int64))
envs.close()
print("stepped")
"""


def run_unguarded(start_method: str | None, tmp_path) -> subprocess.CompletedProcess:
    option = "" if start_method is None else f", start_method={start_method!r}"
    script = tmp_path / "first_script.py"
    script.write_text(UNGUARDED_SCRIPT.format(start_method=option))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("start_method", [None, "forkserver", "spawn"], ids=["default", "forkserver", "spawn"])
def test_a_script_without_the_main_guard_gets_one_clear_error(start_method, tmp_path):
    result = run_unguarded(start_method, tmp_path)
    report = f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode != 0, report
    assert "stepped" not in result.stdout, report
    assert 'if __name__ == "__main__":' in result.stderr, report
    assert 'start_method="fork"' in result.stderr, report
    assert result.stderr.count("Traceback") == 1, report  # the main process's only: no worker tracebacks
    assert "MainModuleError" in result.stderr, report


def test_a_script_without_the_main_guard_works_under_fork(tmp_path):
    result = run_unguarded("fork", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stepped" in result.stdout
    assert "Traceback" not in result.stderr, result.stderr


def run_from_stdin(start_method: str | None, tmp_path) -> subprocess.CompletedProcess:
    option = "" if start_method is None else f", start_method={start_method!r}"
    script = UNGUARDED_SCRIPT.format(start_method=option)
    return subprocess.run(
        [sys.executable, "-"], input=script, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )


@pytest.mark.parametrize("start_method", [None, "spawn"], ids=["default", "spawn"])
def test_a_script_piped_through_stdin_gets_one_clear_error(start_method, tmp_path):
    """``python - < script.py``: the workers cannot re-import ``<stdin>``; say so before starting them."""
    result = run_from_stdin(start_method, tmp_path)
    report = f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    assert result.returncode != 0, report
    assert "MainModuleError" in result.stderr and "'<stdin>'" in result.stderr, report
    assert "Save it to a file" in result.stderr and 'start_method="fork"' in result.stderr, report
    assert result.stderr.count("Traceback") == 1, report  # no worker was started


def test_a_script_piped_through_stdin_works_under_fork(tmp_path):
    result = run_from_stdin("fork", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stepped" in result.stdout
