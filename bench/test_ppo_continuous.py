"""examples/ppo_continuous.py (CleanRL's ppo_continuous_action.py, the training gate's MuJoCo row) at tiny sizes:
it runs over both vector envs, prints the JSON line bench/training.py reads, and takes the same steps over both."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from bench.training_jobs import EXAMPLES, REPO

SCRIPT = os.path.join(EXAMPLES, "ppo_continuous.py")


def run_script(*args: str) -> tuple[list[str], dict]:
    """Run the example with ``args`` and ``--json``: its episodic-return lines and its JSON line."""
    done = subprocess.run(
        [sys.executable, SCRIPT, *args, "--json"], capture_output=True, text=True, timeout=280, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout[-2000:]
    return re.findall(r"episodic_return=\S+", done.stdout), json.loads(lines[0])


@pytest.mark.smoke
def test_shm_workers_and_sync_vector_env_give_the_same_returns():
    """Pendulum's 200-step episodes end within the one rollout (2 envs x 256 steps): the returns depend on the
    envs, their wrappers (running statistics, in a worker for shm) and the policy's draws only."""
    pytest.importorskip("torch")
    common = ("--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "256", "--total-timesteps", "512")
    sync_returns, sync = run_script(*common, "--vec", "sync")
    shm_returns, shm = run_script(*common, "--vec", "shm", "--n-workers", "1")
    assert sync_returns and shm_returns == sync_returns
    assert sync["vec_env"] == "SyncVectorEnv(num_envs=2)" and shm["vec_env"].startswith("ShmVectorEnv(num_envs=2,")
    assert "n_workers=1" in shm["vec_env"]
    for result in (sync, shm):
        assert result["steps"] == 512 and result["rollout"] > 0 and result["update"] > 0
        assert result["rollout"] + result["update"] <= result["total"]


@pytest.mark.smoke
def test_its_defaults_train_on_halfcheetah_with_shmvec_defaults():
    """No --env-id or --vec: HalfCheetah-v5 (float64 observations) over ShmVectorEnv's own choice of layout."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("needs mujoco")
    _, result = run_script("--num-envs", "2", "--num-steps", "64", "--total-timesteps", "128")
    assert result["steps"] == 128 and result["vec_env"].startswith("ShmVectorEnv(num_envs=2,")
