"""What ``repr()`` of a pool shows as its layout rebuilds that layout when passed back.

``print(env)`` shows ``n_workers=K, use_main_process=B``: those two keywords, given to the same
constructor, must give the same layout (K worker processes, and whether the main process steps
envs), whether the layout was chosen by the default or given. ``n_workers=1`` alone means no
env in the main process, so a repr that showed only ``n_workers`` of a layout with a main
shard would not rebuild it.
"""

from __future__ import annotations

import ast
import re

import pytest

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.engine import pool as pool_module
from shmvec.planning.env_timing import EnvTiming
from tests.envs import cartpole

LAYOUT = re.compile(r"\bn_workers=(?P<n_workers>\d+), use_main_process=(?P<use_main_process>True|False)\b")
ADAPTERS = [ShmPoolVecEnv, ShmVectorEnv]


def layout_keywords(text: str) -> dict:
    """The layout's keywords as ``repr`` shows them, parsed as Python literals."""
    found = LAYOUT.findall(text)
    assert len(found) == 1, f"one n_workers=..., use_main_process=... expected in {text!r}"
    return {name: ast.literal_eval(value) for name, value in zip(("n_workers", "use_main_process"), found[0])}


def layout(env) -> tuple[int, bool]:
    return env._pool.plan.n_workers, bool(env._pool.plan.main_shard)


def timed_as(monkeypatch, t_env: float, cpu_share: float = 1.0):
    """The default's timing run replaced by a fixed measurement (no process started for it)."""
    measured = EnvTiming(t_env, 1.0, cpu_share)
    monkeypatch.setattr(pool_module, "timer", lambda *args: lambda env_fn: measured)


def assert_rebuilds(adapter, closing, env_fns, **given):
    first = closing(adapter(env_fns, start_method="fork", **given))
    keywords = layout_keywords(repr(first))
    assert (keywords["n_workers"], keywords["use_main_process"]) == layout(first), repr(first)
    again = closing(adapter(env_fns, start_method="fork", **keywords))
    assert layout(again) == layout(first), f"{repr(first)} rebuilt as {repr(again)}"
    assert layout_keywords(repr(again)) == keywords
    return layout(first)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize(
    "given, expected",
    [
        ({"n_workers": 0}, (0, True)),
        ({"n_workers": 1}, (1, False)),  # n_workers=1 alone: no env in the main process
        ({"n_workers": 1, "use_main_process": True}, (1, True)),
        ({"n_workers": 2, "use_main_process": False}, (2, False)),
        ({"n_workers": 3}, (3, False)),
    ],
    ids=["0", "1", "1+main", "2-no-main", "3"],
)
def test_a_given_layouts_repr_rebuilds_it(adapter, closing, given, expected):
    assert assert_rebuilds(adapter, closing, [cartpole] * 6, **given) == expected


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize(
    "num_envs, t_env, expected",
    [
        (64, 8e-6, (1, True)),  # CartPole-like, many: the main process and one worker
        (8, 8e-6, (0, True)),  # ... a few: every env in the main process
        (8, 1e-3, (2, False)),  # heavy: workers only
    ],
    ids=["light-many", "light-few", "heavy"],
)
def test_the_defaults_repr_rebuilds_its_layout(
    adapter, closing, monkeypatch, two_cores, memory, num_envs, t_env, expected
):
    timed_as(monkeypatch, t_env)
    assert assert_rebuilds(adapter, closing, [cartpole] * num_envs) == expected


def test_envs_that_wait_rebuild_their_many_workers(closing, monkeypatch, two_cores, memory):
    timed_as(monkeypatch, 2e-3, cpu_share=0.02)
    n_workers, main = assert_rebuilds(ShmPoolVecEnv, closing, [cartpole] * 8)
    assert n_workers > 2 and not main  # more workers than cores, none in the main process
