"""shmvec/gymnasium_1_1.py: Gymnasium 1.1's names where they exist, and the Gymnasium side's
refusal, naming the version it needs, where they do not (Gymnasium 0.29.1 and 1.0, which SB3 takes)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import shmvec
from shmvec.gymnasium_1_1 import HAS_VECTOR_API, VECTOR_API, AutoresetMode
from tests.envs import cartpole

OLD = pytest.mark.skipif(HAS_VECTOR_API, reason=f"Gymnasium {gym.__version__} has the 1.1 VectorEnv API")


def test_the_autoreset_modes_are_gymnasiums_where_it_has_them():
    assert HAS_VECTOR_API is hasattr(gym.vector, "AutoresetMode")
    if HAS_VECTOR_API:
        assert AutoresetMode is gym.vector.AutoresetMode
    assert [(mode.name, mode.value) for mode in AutoresetMode] == [
        ("NEXT_STEP", "NextStep"),
        ("SAME_STEP", "SameStep"),
        ("DISABLED", "Disabled"),
    ]


@OLD
@pytest.mark.parametrize(
    "name, build",
    [
        ("ShmVectorEnv", lambda: shmvec.ShmVectorEnv([cartpole] * 2, n_workers=1)),
        ("ShmAgentVectorEnv", lambda: shmvec.ShmAgentVectorEnv(None, 2)),
        ("shmvec.make_vec", lambda: shmvec.make_vec("CartPole-v1", 2)),
        ("shmvec.register", lambda: shmvec.register("CartPole-v1")),
    ],
)
def test_the_gymnasium_side_refuses_an_older_gymnasium_naming_the_version(name, build):
    with pytest.raises(shmvec.GymnasiumVersionError, match=f"^{name} needs Gymnasium {VECTOR_API} or later") as exc:
        build()
    assert isinstance(exc.value, ImportError) and f"this is Gymnasium {gym.__version__}" in str(exc.value)


@OLD
def test_the_sb3_side_runs_on_an_older_gymnasium():
    pytest.importorskip("stable_baselines3")
    with shmvec.ShmPoolVecEnv([cartpole] * 2, n_workers=1) as envs:
        assert envs.reset().shape == (2, 4)


@OLD
def test_the_tuner_on_an_older_gymnasium_exits_with_the_message_not_a_traceback():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "shmvec.tune", "CartPole-v1", "--num-envs", "2"], capture_output=True, text=True
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: python -m shmvec.tune needs Gymnasium {VECTOR_API} or later"), done.stderr
