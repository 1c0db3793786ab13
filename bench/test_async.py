"""Async batches benchmarks (``bench/async_batches.py``): smoke runs at tiny sizes, no timing asserts.

``python -m pytest bench -q -m smoke --benchmark-disable`` runs them in CI; the real
measurement is ``python bench/report.py --sections async --out docs/bench``.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bench import async_batches as ab
from bench import report
from bench.markdown import replace_section
from bench.measure import SMOKE_TIMING

TINY = {"fast": 1e-5, "slow": 2e-4}


def loop_benchmark(benchmark, loop: ab.BatchLoop) -> None:
    benchmark.group = "async batches"
    benchmark.extra_info.update(loop=loop.name, batch_size=loop.batch_size)
    try:
        benchmark.pedantic(loop.run, args=(4,), rounds=3, iterations=1)
    finally:
        loop.close()


@pytest.mark.smoke
@pytest.mark.parametrize("batch_size", [2, 4])
def test_smoke_stragglers(benchmark, batch_size):
    loop_benchmark(benchmark, ab.BatchLoop(f"batch_size={batch_size}", ab.straggler_env_fns(4, **TINY), batch_size, 2))


@pytest.mark.smoke
@pytest.mark.parametrize("batch_size", [2, 4])
def test_smoke_overlap(benchmark, batch_size):
    fns = ab.straggler_env_fns(4, fast=1e-5, slow=1e-5)
    loop_benchmark(benchmark, ab.BatchLoop(f"batch_size={batch_size}", fns, batch_size, 2, policy_seconds=1e-4))


@pytest.mark.smoke
def test_smoke_comparisons_give_ratios():
    for comparison in (
        ab.stragglers(SMOKE_TIMING, n=4, **TINY),
        ab.overlap(SMOKE_TIMING, n=4, env_cost=1e-5, policy=1e-4),
    ):
        assert comparison.ratio > 0 and comparison.status in ("PASS", "FAIL")
        assert all(len(samples) == 1 for samples in comparison.samples.values())


@pytest.mark.smoke
def test_ideal_ratios():
    assert ab.straggler_ideal(8, 2, 100e-6, 2e-3) == pytest.approx(27 / 8)
    assert ab.overlap_ideal(16, 2, 250e-6, 1e-3) == pytest.approx(1.5)


@pytest.mark.smoke
def test_replace_section_appends_then_replaces_only_itself():
    report_text = "# report\n\n## Grid\n\ngrid rows\n\n_Wall time: 9 s._\n"
    once = replace_section(report_text, ab.HEADING + "\n\nfirst", ab.HEADING)
    assert once.startswith(report_text.rstrip("\n")) and once.endswith(ab.HEADING + "\n\nfirst\n")
    twice = replace_section(once, ab.HEADING + "\n\nsecond", ab.HEADING)
    assert twice == once.replace("first", "second")
    later = replace_section(once + "\n## Later\n\nkept\n", ab.HEADING + "\n\nthird", ab.HEADING)
    assert "third" in later and "first" not in later and later.endswith("## Later\n\nkept\n")


@pytest.mark.smoke
def test_parse_timing():
    out = "global_step=512 episodic_return=20.0 (last 20 episodes)\nTIMING rollout=1.250s update=0.500s total=1.800s\n"
    assert ab.parse_timing(out) == {"rollout": 1.25, "update": 0.5, "total": 1.8}
    with pytest.raises(ValueError, match="no TIMING line"):
        ab.parse_timing("nothing")


@pytest.mark.smoke
def test_smoke_report_async_section_keeps_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "PPO_CONFIGS", [("CartPole-v1", 1, "smoke")])
    (tmp_path / "report.md").write_text("# shmvec benchmark report\n\n## Throughput\n\nkept\n")
    assert (
        report.main(
            [
                "--sections",
                "async",
                "--out",
                str(tmp_path),
                "--repeats",
                "1",
                "--block-time",
                "0.01",
                "--warmup-time",
                "0",
                "--ppo-timesteps",
                "512",
            ]
        )
        == 0
    )
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# shmvec benchmark report\n\n## Throughput\n\nkept\n")
    assert ab.HEADING in text and "ppo rollout" in text and "stragglers" in text
    assert (tmp_path / "results.json").exists()


def load_ppo_async():
    sys.path.insert(0, ab.EXAMPLES)
    try:
        import ppo_async
        import ppo_common
    finally:
        sys.path.remove(ab.EXAMPLES)
    return ppo_async, ppo_common


@pytest.mark.smoke
def test_per_env_gae_equals_time_major_gae():
    """Rows of full batches in env order: GAE per env (async) == GAE along axis 0 of (T, N) arrays (sync)."""
    pytest.importorskip("torch")
    ppo_async, ppo_common = load_ppo_async()
    rng = np.random.default_rng(0)
    T, N = 12, 3
    args = type("Args", (), {"gamma": 0.99, "gae_lambda": 0.95})
    values = rng.normal(size=(T + 1, N)).astype(np.float32)
    rewards = rng.normal(size=(T + 1, N)).astype(np.float32)  # row t: the outcome of the action at t - 1
    terminated = (rng.random((T + 1, N)) < 0.1).astype(np.float32)
    ended = np.maximum(terminated, (rng.random((T + 1, N)) < 0.1).astype(np.float32))
    rows = {
        "env_id": np.tile(np.arange(N), T + 1),
        "values": values.ravel(),
        "rewards": rewards.ravel(),
        "terminated": terminated.ravel(),
        "ended": ended.ravel(),
    }
    advantages, trainable, last_rows = ppo_async.per_env_advantages(rows, N, args)
    want = ppo_common.gae(rewards[1:], values[:-1], values[1:], terminated[1:], ended[1:], args.gamma, args.gae_lambda)
    np.testing.assert_allclose(advantages.reshape(T + 1, N)[:-1], want, rtol=1e-6)
    assert last_rows.tolist() == list(range(T * N, (T + 1) * N))
    np.testing.assert_array_equal(trainable.reshape(T + 1, N)[:-1], ended[:-1] == 0)
    assert not trainable[last_rows].any()
