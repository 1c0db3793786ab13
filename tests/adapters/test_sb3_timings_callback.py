"""``TimingsCallback``: ``envs.timings`` in SB3's logger at each rollout's end, through wrappers;
and on PPO CartPole the caller's share dominates (the policy and the updates, not the envs)."""

from __future__ import annotations

import csv
import logging

import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize

from shmvec import ShmPoolVecEnv
from shmvec.tools.sb3_callback import TimingsCallback
from tests.envs import cartpole  # not defined here: workers would import this module, SB3 and torch

SHARES = ["caller_share", "envs_share", "stragglers_share", "library_share", "calls_share"]


def test_each_rollout_logs_its_shares_through_wrappers(tmp_path, capsys):
    # fork: VecMonitor asks the workers env_is_wrapped(Monitor), which imports SB3 and torch in each
    envs = ShmPoolVecEnv([cartpole] * 8, n_workers=2, start_method="fork")
    try:
        wrapped = VecNormalize(VecMonitor(envs))  # the callback finds the ShmPoolVecEnv under both
        model = PPO("MlpPolicy", wrapped, n_steps=64, batch_size=128, n_epochs=2, seed=0, device="cpu")
        model.set_logger(configure(str(tmp_path), ["csv"]))
        callback = TimingsCallback(verbose=1)
        model.learn(3 * 8 * 64, callback=callback)
        after = envs.timings
    finally:
        envs.close()
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and callback.rollouts == 3
    for row in rows:
        shares = [float(row[f"timings/{name}"]) for name in SHARES]
        assert all(0.0 <= share <= 1.0 for share in shares), row
        assert sum(shares) == pytest.approx(1.0, abs=0.05), row
        assert float(row["timings/steps_per_second"]) > 0 and 0 <= float(row["timings/worker_busy_share"]) <= 1
    # Each rollout's own: 64 vector steps (the first since learn's start), then reset.
    assert after.steps == 0
    assert capsys.readouterr().out.count("shmvec timings: 64 steps") == 3


def test_a_vec_env_not_of_shmvec_warns_once_and_records_nothing(tmp_path, caplog):
    model = PPO("MlpPolicy", DummyVecEnv([cartpole] * 2), n_steps=32, batch_size=64, n_epochs=1, device="cpu")
    model.set_logger(configure(str(tmp_path), ["csv"]))
    with caplog.at_level(logging.WARNING, logger="shmvec"):
        model.learn(2 * 2 * 32, callback=TimingsCallback())
    assert [r.getMessage() for r in caplog.records].count(
        "TimingsCallback: the vec env 'DummyVecEnv' is not a shmvec one (ShmPoolVecEnv); it records nothing"
    ) == 1
    with open(tmp_path / "progress.csv") as f:
        assert not any(name.startswith("timings/") for name in csv.DictReader(f).fieldnames)


def test_the_caller_dominates_ppo_on_cartpole():
    """CartPole steps in microseconds; PPO's forward passes and updates take the rest."""
    envs = ShmPoolVecEnv([cartpole] * 8)
    try:
        model = PPO("MlpPolicy", envs, n_steps=128, batch_size=256, n_epochs=2, seed=0, device="cpu")
        envs.timings.reset()
        model.learn(4 * 8 * 128)
        timings = envs.timings
    finally:
        envs.close()
    assert timings.verdicts()[0].startswith("The caller"), str(timings)
    assert timings.share("caller") > 0.5, str(timings)
