"""What envs in workers see of the script's set-up, compared with SubprocVecEnv on the same script.

Each test writes a training script and an env module into a folder and runs the script in
a fresh interpreter, once with SB3's ``SubprocVecEnv`` (forkserver: each worker imports the
script again) and once with shmvec, and compares what the env reports from inside its
worker. The matrix as it stands:

=====================================  ============================  ==========================
set-up at the script's top             SubprocVecEnv (forkserver)    shmvec (forkserver)
=====================================  ============================  ==========================
logging.basicConfig(filename, level)   records in the file           the same (relayed)
warnings.filterwarnings("ignore")      filtered                      the same (carried)
np.random.seed / random.seed           each worker starts seeded:    each worker its own stream,
                                       all draw the same numbers     derived from the seeded state
gym.register of an existing id         the script's spec             the same (pinned)
os.environ set after a first pool      missed (forkserver's env)     seen (carried)
mylib.CONFIG[...] = / a monkeypatch    seen (script re-run)          warned; worker_init= or
                                                                     import_main=True: seen
=====================================  ============================  ==========================
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from shmvec.processes.script_setup import worker_rng_states

pytest.importorskip("stable_baselines3")  # the scripts compare with SB3's SubprocVecEnv

TIMEOUT = 120  # seconds; a hang fails the test

PROBE_MODULE = """\
import logging
import os
import random
import warnings

import gymnasium as gym
import numpy as np

CONFIG = {"difficulty": 1}
log = logging.getLogger("probe")


class ProbeEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        log.info("probe reset in %d", os.getpid())
        log.debug("probe debug record")
        warnings.warn("probe warning", UserWarning)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def report(self):
        return {
            "difficulty": CONFIG["difficulty"],
            "patched": getattr(ProbeEnv, "patched", False),
            "env_var": os.environ.get("PROBE_VAR"),
            "random": random.random(),
            "np_random": float(np.random.random()),
            "max_episode_steps": gym.spec("Probe-v0").max_episode_steps,  # the registry as this process has it
            "pid": os.getpid(),
        }


gym.register("Probe-v0", entry_point="probe_env:ProbeEnv", max_episode_steps=500)
"""

SCRIPT = """\
import json
import logging
import os
import random
import sys
import warnings

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import SubprocVecEnv

import probe_env
import shmvec

logging.basicConfig(filename="train.log", level=logging.INFO, format="%(name)s %(message)s")
warnings.filterwarnings("ignore", message="probe warning")
np.random.seed(0)
random.seed(0)
gym.register("Probe-v0", entry_point="probe_env:ProbeEnv", max_episode_steps=1000)
{setup_lines}

def worker_init():
    probe_env.CONFIG["difficulty"] = 5
    probe_env.ProbeEnv.patched = True

def make_vec(env_fns):
    return {make_vec}

if __name__ == "__main__":
    env_fns = [lambda: gym.make("Probe-v0")] * {num_envs}
    make_vec(env_fns).close()  # a first pool: the forkserver starts with this environment
    os.environ["PROBE_VAR"] = "late"
    envs = make_vec(env_fns)
    envs.reset()
    print(json.dumps({{"reports": envs.env_method("report"), "repr": repr(envs)}}))
    envs.close()
"""

SETUP_LINES = """\
probe_env.CONFIG["difficulty"] = 5
probe_env.ProbeEnv.patched = True
"""

SUBPROC = 'SubprocVecEnv(env_fns, start_method="forkserver")'
SHMVEC = "shmvec.ShmPoolVecEnv(env_fns, n_workers={num_envs}{extra})"


def run(tmp_path, make_vec: str, setup_lines: str = SETUP_LINES, num_envs: int = 2) -> tuple[dict, str, str]:
    """Run the script; returns (its JSON line, its stderr, the log file)."""
    (tmp_path / "probe_env.py").write_text(PROBE_MODULE)
    script = SCRIPT.format(setup_lines=setup_lines, make_vec=make_vec.format(num_envs=num_envs), num_envs=num_envs)
    (tmp_path / "train.py").write_text(script)
    result = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"exit code {result.returncode}\n{result.stdout}\n{result.stderr}"
    log = (tmp_path / "train.log").read_text()
    (tmp_path / "train.log").unlink()
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr, log


def seeded_worker_draws(n_workers: int) -> list[tuple[float, float]]:
    """The first ``random.random()`` and ``np.random.random()`` of each worker of the script's second
    pool, after ``random.seed(0)`` and ``np.random.seed(0)`` (docs/process.md: each worker's own stream)."""
    parent_random, parent_numpy = random.Random(0).getstate(), np.random.RandomState(0).get_state()
    draws = []
    for worker in range(n_workers):
        random_state, numpy_state = worker_rng_states(parent_random, parent_numpy, worker, pool_index=1)  # 2nd pool
        stdlib, legacy = random.Random(), np.random.RandomState()
        stdlib.setstate(random_state)
        legacy.set_state(numpy_state)
        draws.append((stdlib.random(), float(legacy.random_sample())))
    return draws


def seen(reports: list[dict], key: str) -> list:
    return [report[key] for report in reports]


@pytest.fixture(scope="module")
def subproc(tmp_path_factory):
    pytest.importorskip("stable_baselines3")
    return run(tmp_path_factory.mktemp("subproc"), SUBPROC)


def test_workers_see_what_subprocvecenv_workers_see(subproc, tmp_path):
    expected, _, expected_log = subproc
    found, stderr, log = run(tmp_path, SHMVEC.replace("{extra}", ""))
    reports, references = found["reports"], expected["reports"]
    assert len({report["pid"] for report in reports}) == 2  # each env in a worker of its own
    assert seen(reports, "max_episode_steps") == seen(references, "max_episode_steps")
    assert len(set(seen(references, "np_random"))) == 1  # SubprocVecEnv's workers: one stream, drawn twice
    assert [(report["random"], report["np_random"]) for report in reports] == seeded_worker_draws(2)
    assert seen(reports, "max_episode_steps") == [1000, 1000]  # the script's registration won
    assert seen(reports, "env_var") == ["late", "late"]  # SubprocVecEnv's forkserver kept its first environment
    assert seen(references, "env_var") == [None, None]
    # the env's log records reach the script's log file at the script's level, its warnings are filtered
    assert log.count("probe reset") == expected_log.count("probe reset") >= 2
    assert "probe debug record" not in log
    assert "probe warning" not in stderr


def test_what_cannot_be_carried_is_warned_about_naming_the_lines(subproc, tmp_path):
    expected, _, _ = subproc
    assert seen(expected["reports"], "difficulty") == [5, 5]  # SubprocVecEnv's workers ran the script
    found, _, log = run(tmp_path, SHMVEC.replace("{extra}", ""))  # the warning goes where the script logs
    assert seen(found["reports"], "difficulty") == [1, 1] and seen(found["reports"], "patched") == [False, False]
    assert log.count("worker processes do not run your main script") == 1  # once, for two pools
    assert 'line 20: probe_env.CONFIG["difficulty"] = 5' in log
    assert "line 21: probe_env.ProbeEnv.patched = True" in log
    assert "line 15" not in log and "line 19" not in log  # basicConfig, gym.register: carried


@pytest.mark.parametrize("extra", [", worker_init=worker_init", ", import_main=True"])
def test_worker_init_and_import_main_carry_the_rest(extra, tmp_path):
    found, _, log = run(tmp_path, SHMVEC.replace("{extra}", extra))
    assert seen(found["reports"], "difficulty") == [5, 5]
    assert seen(found["reports"], "patched") == [True, True]
    assert "do not run your main script" not in log


def test_a_script_of_carried_set_up_only_gets_no_warning(tmp_path):
    found, _, log = run(tmp_path, SHMVEC.replace("{extra}", ""), setup_lines="")
    assert seen(found["reports"], "max_episode_steps") == [1000, 1000]
    assert "do not run your main script" not in log


def test_the_default_plan_does_not_mix_set_ups(tmp_path):
    """Light envs, which the plan would split between the main process and a worker, see one set-up."""
    found, _, _ = run(tmp_path, "shmvec.ShmPoolVecEnv(env_fns)", num_envs=64)
    difficulties = set(seen(found["reports"], "difficulty"))
    assert len(difficulties) == 1, found["repr"]
    assert "n_workers=0" in found["repr"] or "use_main_process=False" in found["repr"], found["repr"]
