"""Target ratios, each measured side by side (round-robin) in one run.

Every shmvec adapter available (``shm_sb3``, ``shm_gym``) is checked against every
baseline of a target; a check passes when ``shmvec / baseline >= min_ratio`` on medians.
"Never meaningfully slower than DummyVecEnv" is read as ``>= 0.9`` (within 10 %).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.impls import BASELINE, SHMVEC, get_impl
from bench.measure import Config, Result, Timing, measure_cell
from bench.workloads import IMAGE_150US, LARGE_OBS, get_workload

NO_SLOWER = 0.9  # "not meaningfully slower": at least 90 % of DummyVecEnv


@dataclass(frozen=True)
class Target:
    """``shmvec(workload, n, k) / baseline(workload, n) >= min_ratio``."""

    workload: str
    n: int
    k: int
    baseline: str
    min_ratio: float
    group: str  # which bullet of the issue
    impls: tuple[str, ...] | None = None  # the shmvec adapters it is about (None: every one given)


TARGETS: list[Target] = [
    Target("CartPole-v1", 64, 2, "sync", 1.8, "CartPole N=64 K=2"),
    Target("CartPole-v1", 64, 2, "dummy", 3.0, "CartPole N=64 K=2"),
    Target("CartPole-v1", 64, 2, "subproc", 20.0, "CartPole N=64 K=2"),
    Target("CartPole-v1", 64, 2, "async", 20.0, "CartPole N=64 K=2"),
    Target(IMAGE_150US, 16, 2, "dummy", 1.8, "84x84x4 uint8, 150 µs, N=16 K=2"),
    Target(IMAGE_150US, 16, 2, "subproc", 1.5, "84x84x4 uint8, 150 µs, N=16 K=2"),
    Target("HumanoidStandup-v5", 8, 2, "dummy", 1.8, "heavy envs N=8 K=2"),
    Target("ALE/Breakout-v5", 8, 2, "dummy", 1.8, "heavy envs N=8 K=2"),
]
DEFAULTS = ("shm_sb3_auto", "shm_gym_auto")  # the default constructors: n_workers=None
AUTO = (*DEFAULTS, "shm_sb3_zero_copy")  # every configuration with the default execution
# The default constructor near the 2-core limit (K is ignored for AUTO: 0 in the tag).
DEFAULT_TARGETS: list[Target] = [
    # SyncVectorEnv in each adapter's mode: SAME_STEP for ShmPoolVecEnv (SB3's), NEXT_STEP for ShmVectorEnv.
    Target("CartPole-v1", 64, 0, "sync_same", 1.8, "default, CartPole N=64", ("shm_sb3_auto",)),
    Target("CartPole-v1", 64, 0, "sync", 1.8, "default, CartPole N=64", ("shm_gym_auto",)),
    Target("CartPole-v1", 64, 0, "dummy", 1.8, "default, CartPole N=64", ("shm_sb3_auto",)),
    Target("CartPole-v1", 64, 2, "sync_same", 1.5, "explicit n_workers=2, CartPole N=64", ("shm_sb3",)),
    Target("CartPole-v1", 64, 2, "sync", 1.5, "explicit n_workers=2, CartPole N=64", ("shm_gym",)),
    Target("CartPole-v1", 8, 0, "dummy", 1.2, "default, CartPole N=8", ("shm_sb3_auto",)),
    *[Target("CartPole-v1", n, 0, "dummy", 0.95, "default, CartPole N=2..4", ("shm_sb3_auto",)) for n in (2, 3, 4)],
    Target(LARGE_OBS, 32, 0, "dummy", 2.0, "zero-copy SB3, 210x160x3 uint8, no env work, N=32", ("shm_sb3_zero_copy",)),
]
LIGHT_ENVS = ("CartPole-v1", "Acrobot-v1")
LIGHT_NS = (2, 4, 16, 64, 256)
LIGHT_KS = (1, 2)


def all_targets() -> list[Target]:
    """:data:`TARGETS` plus the light-env "no slower than DummyVecEnv" checks."""
    light = [
        Target(env, n, k, BASELINE, NO_SLOWER, "light envs, N>=2: no slower than DummyVecEnv")
        for env in LIGHT_ENVS
        for n in LIGHT_NS
        for k in LIGHT_KS
        if k <= n
    ]
    return TARGETS + light + DEFAULT_TARGETS


@dataclass
class Check:
    """One measured target ratio."""

    target: Target
    impl: str  # the shmvec adapter checked
    ratio: float | None = None
    shm_fps: float | None = None
    base_fps: float | None = None
    note: str = ""

    @property
    def status(self) -> str:
        if self.ratio is None:
            return "SKIP"
        return "PASS" if self.ratio >= self.target.min_ratio else "FAIL"

    def line(self) -> str:
        t = self.target
        head = f"{self.status:4}  {t.group}: {self.impl} K={t.k} vs {t.baseline} on {t.workload} N={t.n}"
        if self.ratio is None:
            return f"{head}: {self.note}"
        return (
            f"{head}: {self.ratio:.2f}x (need >= {t.min_ratio}x; {self.shm_fps:,.0f} vs {self.base_fps:,.0f} steps/s)"
        )


def plan_targets(targets: Sequence[Target], impls: Sequence[str] = SHMVEC) -> tuple[list[list[Config]], list[Check]]:
    """Group the configs the targets need into cells (one per env and N), and the checks."""
    cells: dict[tuple[str, int], list[Config]] = {}
    checks = []
    shm = [name for name in impls if get_impl(name).missing() is None]
    for t in targets:
        why = get_workload(t.workload).missing() or get_impl(t.baseline).missing()
        for name in [name for name in shm or list(impls) if t.impls is None or name in t.impls]:
            check = Check(t, name)
            checks.append(check)
            if why or not shm:
                check.note = why or get_impl(name).missing() or "no shmvec adapter available"
                continue
            cell = cells.setdefault((t.workload, t.n), [])
            for config in (_shm_config(t, name), Config(t.workload, t.baseline, t.n)):
                if config not in cell:
                    cell.append(config)
    return list(cells.values()), checks


def _shm_config(t: Target, impl: str) -> Config:
    return Config(t.workload, impl, t.n, t.k if get_impl(impl).uses_k else None)


TARGET_TIMING = Timing(repeats=5, block_time=0.5)


def run_targets(
    targets: Sequence[Target] | None = None,
    timing: Timing = TARGET_TIMING,
    impls: Sequence[str] = SHMVEC,
    on_sample: Callable[[Config], None] | None = None,
    cells_and_checks: tuple[list[list[Config]], list[Check]] | None = None,
) -> tuple[list[Check], list[Result]]:
    """Measure every target; return the checks (with ratios) and the raw results."""
    cells, checks = cells_and_checks or plan_targets(all_targets() if targets is None else targets, impls)
    results: dict[Config, Result] = {}
    for cell in cells:
        for r in measure_cell(cell, timing, on_sample):
            results[r.config] = r
    for check in checks:
        if check.note:
            continue
        t = check.target
        shm = results.get(_shm_config(t, check.impl))
        base = results.get(Config(t.workload, t.baseline, t.n))
        if shm is None or base is None or not shm.samples or not base.samples:
            check.note = (shm and shm.error) or (base and base.error) or "not measured"
            continue
        check.shm_fps, check.base_fps = shm.median, base.median
        check.ratio = shm.median / base.median
    return checks, list(results.values())
