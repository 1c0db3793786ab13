"""``plot_timeline``: a PNG of the last vector steps, a row for the main thread and one per lane;
and the tuner prints ``envs.timings`` of the configuration it recommends."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from shmvec import ShmVectorEnv
from shmvec.tools import tune
from shmvec.tools.timeline import BUSY, CALLER, CPU, MAIN_THREAD, STEP_CALL, WAITING, plot_timeline, timeline
from tests.global_rng_env import WaitingEnv


def stepped(envs, steps: int) -> None:
    envs.reset(seed=0)
    for _ in range(steps):
        envs.step(np.zeros(envs.num_envs, dtype=np.int64))


def test_the_spans_of_two_workers_and_the_main_shard():
    envs = ShmVectorEnv([functools.partial(WaitingEnv, 1e-3)] * 6, n_workers=2, use_main_process=True)
    try:
        stepped(envs, 40)
        data = timeline(envs, steps=30)
    finally:
        envs.close()
    assert data.labels == [MAIN_THREAD, "worker 0 (envs 0-1)", "worker 1 (envs 2-3)", "main process (envs 4-5)"]
    assert data.steps == 30
    main = data.spans[0]
    assert [kind for _, _, kind in main].count(STEP_CALL) == 30 and [k for _, _, k in main].count(CALLER) == 29
    assert any(kind == WAITING for _, _, kind in main)
    calls = [(start, end) for start, end, kind in main if kind == STEP_CALL]
    assert calls[0][0] == 0.0 and all(a[1] <= b[0] for a, b in zip(calls, calls[1:]))  # in order, apart
    for lane in data.spans[1:]:
        busy = [(start, end) for start, end, kind in lane if kind == BUSY]
        assert len(busy) in (29, 30, 31)  # the lanes' steps within the steps shown
        assert all(end - start >= 1.5 for start, end in busy)  # two envs that sleep 1 ms each
        assert all(0 <= start and end <= calls[-1][1] for start, end in busy)
        assert all(kind in (BUSY, CPU) for _, _, kind in lane)


def test_plot_writes_a_png_through_a_wrapper(tmp_path):
    pytest.importorskip("matplotlib")
    from stable_baselines3.common.vec_env import VecNormalize

    from shmvec import ShmPoolVecEnv

    envs = ShmPoolVecEnv([functools.partial(WaitingEnv, 0.2e-3)] * 4, n_workers=2)
    try:
        wrapped = VecNormalize(envs)
        wrapped.reset()
        for _ in range(20):
            wrapped.step(np.zeros(4, dtype=np.int64))
        data = plot_timeline(wrapped, tmp_path / "timeline.png", steps=10)
        envs.timings.reset()
        with pytest.raises(ValueError, match="no vector steps"):
            timeline(wrapped)
    finally:
        envs.close()
    png = (tmp_path / "timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert data.labels == [MAIN_THREAD, "worker 0 (envs 0-1)", "worker 1 (envs 2-3)"] and data.steps == 10
    assert data.title == data.timings.verdicts()[0]


def test_a_vector_env_not_of_shmvec_is_refused():
    from gymnasium.vector import SyncVectorEnv

    envs = SyncVectorEnv([functools.partial(WaitingEnv, 0.0)])
    try:
        with pytest.raises(TypeError, match="shmvec vector env"):
            timeline(envs)
    finally:
        envs.close()


@pytest.mark.vector_api
def test_the_tuner_prints_where_the_time_went(capsys):
    args = ["CartPole-v1", "--num-envs", "2", "--seconds", "0.05", "--repeats", "1", "--policy", "none"]
    assert tune.main(args) == 0
    out = capsys.readouterr().out
    assert "where the time went in the recommended configuration" in out
    for label in ("caller (policy, updates, logging)", "envs", "shmvec's own work (main process)"):
        assert label in out.split("envs.timings")[1]
    assert tune.main([*args, "--json"]) == 0
    import json

    shares = json.loads(capsys.readouterr().out)["recommended"]["timings"]
    assert sum(shares[f"{part}_share"] for part in ("caller", "envs", "stragglers", "library", "calls")) == (
        pytest.approx(1.0, abs=0.05)
    )
