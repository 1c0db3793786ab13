"""Throughput of every implementation, as pytest-benchmark tests.

One test per (env, N, implementation, K); a benchmark *group* per env and N, so
pytest-benchmark's table puts the implementations side by side. The timed function is
a block of ``step()`` calls with pre-generated actions after a warm-up; the throughput
(env steps/s) is in each benchmark's ``extra_info``.

pytest-benchmark runs tests one after the other; for the fairer round-robin comparison
and the speed-up tables use ``python bench/report.py``.
"""

from __future__ import annotations

import pytest

from bench.impls import CORES, IMPLS, get_impl
from bench.measure import Config, Timing
from bench.workloads import IMAGE_150US, ZERO_COST, get_workload

TIMING = Timing(warmup_time=0.2, block_time=0.1)
ROUNDS = 5
MAX_OBS_BYTES = 256 * 2**20


def configs(envs, ns, ks=range(1, CORES + 1), impls=IMPLS, max_procs=64):
    """Every (env, N, impl, K) of a grid, as pytest params with readable ids."""
    out = []
    for env in envs:
        for n in ns:
            for name in impls:
                impl = get_impl(name)
                if impl.procs_per_env and n > max_procs:
                    continue
                for k in [k for k in ks if k <= n] if impl.uses_k else [None]:
                    c = Config(env, name, n, k)
                    out.append(pytest.param(c, id=f"{env}-N{n}-{c.tag.replace(' ', '')}"))
    return out


def run(benchmark, session) -> None:
    c = session.config
    benchmark.group = f"{c.workload} N={c.n}"
    benchmark.extra_info.update(env=c.workload, impl=c.impl, n=c.n, k=c.k)
    steps = session.warmup(TIMING) if benchmark.enabled else 1
    benchmark.pedantic(session.run, args=(steps,), rounds=ROUNDS, iterations=1)
    if benchmark.enabled:
        benchmark.extra_info["steps_per_s"] = round(steps * c.n / benchmark.stats.stats.median)


@pytest.mark.smoke
@pytest.mark.parametrize(
    "config",
    configs(["CartPole-v1"], [4], ks=[2])
    + configs([IMAGE_150US], [2], ks=[2])
    + configs(["HumanoidStandup-v5", "ALE/Breakout-v5"], [2], ks=[2], impls=["shm_sb3", "shm_gym", "dummy"]),
)
def test_smoke(benchmark, open_session, config):
    run(benchmark, open_session(config))


@pytest.mark.quick
@pytest.mark.parametrize("config", configs(["CartPole-v1"], [8, 64]) + configs([IMAGE_150US, ZERO_COST], [16]))
def test_quick(benchmark, open_session, config):
    run(benchmark, open_session(config))


@pytest.mark.full
@pytest.mark.parametrize(
    "config",
    configs(
        [
            "CartPole-v1",
            "Acrobot-v1",
            "HumanoidStandup-v5",
            "ALE/Breakout-v5",
            ZERO_COST,
            "synth:100us:4",
            "synth:1ms:4",
            IMAGE_150US,
            "synth:100us:1024x1024x4:uint8",
        ],
        [1, 2, 8, 32, 64, 256],
    ),
)
def test_full(benchmark, open_session, config):
    if get_workload(config.workload).obs_bytes * config.n > MAX_OBS_BYTES:
        pytest.skip(f"more than {MAX_OBS_BYTES >> 20} MiB of observations per step")
    run(benchmark, open_session(config))
