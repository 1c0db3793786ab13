"""The script's set-up reaches workers however the script is run: piped (``python -``), as
``python -c``, or as a file without the ``if __name__ == "__main__":`` guard.

Workers do not run the script (:mod:`shmvec.processes.lean_start`); what it set up at its top
is carried to them (:mod:`shmvec.processes.script_setup`). Each test runs a script in a fresh
interpreter that seeds ``np.random``, sets an environment variable and configures logging
to its stdout, then asks each env (in a worker of its own) what it sees: the variable, the
first ``np.random.random()`` of its worker's stream (derived from the seeded state and the
worker's index), and its INFO record from ``reset`` on the script's stdout (relayed from the
worker). ``import_main=True`` needs a script file, and says so from ``python -c``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from shmvec.processes.script_setup import worker_rng_states

TIMEOUT = 90  # seconds; a hang fails the test

PROBE_MODULE = """\
import logging
import os

import gymnasium as gym
import numpy as np

log = logging.getLogger("probe")


class ProbeEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        log.info("reset in %d", os.getpid())
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def report(self):
        return {"env_var": os.environ.get("PROBE"), "np_random": float(np.random.random()), "pid": os.getpid()}
"""

SCRIPT = """\
import json
import logging
import os
import sys

import numpy as np

np.random.seed(0)
os.environ["PROBE"] = "x"
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s|%(message)s")

import probe_setup_env
import shmvec

envs = shmvec.{adapter}([probe_setup_env.ProbeEnv] * 2, n_workers=2)
envs.reset()
reports = list(envs.{method}("report"))
envs.close()
print("REPORTS " + json.dumps({{"reports": reports, "main": os.getpid()}}))
"""

# how the script is run -> (adapter, its method that calls an env method on every env)
WAYS = {
    "piped": ("ShmVectorEnv", "call"),
    "dash-c": ("ShmPoolVecEnv", "env_method"),
    "unguarded-file": ("ShmVectorEnv", "call"),
}

IMPORT_MAIN_SCRIPT = """\
import gymnasium as gym

import shmvec

try:
    shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=2, import_main=True)
except ValueError as exc:
    print("ValueError: " + str(exc))
else:
    print("no error")
"""


def run(text: str, way: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``text`` in a fresh interpreter in ``tmp_path``, ``way`` being "piped", "dash-c" or "unguarded-file"."""
    script_input = None
    if way == "piped":
        args, script_input = [sys.executable, "-"], text
    elif way == "dash-c":
        args = [sys.executable, "-c", text]
    else:
        (tmp_path / "train.py").write_text(text)
        args = [sys.executable, "train.py"]
    result = subprocess.run(args, input=script_input, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_the_scripts_set_up_reaches_every_worker(way, tmp_path):
    (tmp_path / "probe_setup_env.py").write_text(PROBE_MODULE)
    adapter, method = WAYS[way]
    if adapter == "ShmPoolVecEnv":
        pytest.importorskip("stable_baselines3")
    result = run(SCRIPT.format(adapter=adapter, method=method), way, tmp_path)
    lines = result.stdout.splitlines()
    found = json.loads(next(line for line in lines if line.startswith("REPORTS "))[len("REPORTS ") :])
    reports = found["reports"]
    parent = np.random.RandomState(0).get_state()  # what np.random.seed(0) leaves
    assert len(reports) == 2
    assert len({report["pid"] for report in reports} | {found["main"]}) == 3, found  # two workers, not the script
    for worker, report in enumerate(reports):  # env k in worker k
        first = np.random.RandomState()
        first.set_state(worker_rng_states(random.getstate(), parent, worker)[1])
        assert report["env_var"] == "x", found
        assert report["np_random"] == float(first.random_sample()), found
        assert f"probe|reset in {report['pid']}" in lines, result.stdout  # relayed to the script's handler


@pytest.mark.vector_api  # its script builds a ShmVectorEnv
def test_import_main_from_dash_c_says_the_main_module_has_no_file(tmp_path):
    result = run(IMPORT_MAIN_SCRIPT, "dash-c", tmp_path)
    assert "ValueError: import_main=True: the main module has no file" in result.stdout, result.stdout
