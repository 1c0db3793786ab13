"""Shared fixtures: every test must leave no worker process and no /dev/shm entry behind."""

from __future__ import annotations

import inspect
import os
import time

import gymnasium as gym
import psutil
import pytest
from hypothesis import HealthCheck, Phase, settings

from shmvec.gymnasium_1_1 import HAS_VECTOR_API, VECTOR_API
from tests.helpers import default_sigint_handler, descendant_pids, shm_entries

# The default plan's memory of earlier layouts (engine/plan_memory) would tie a test's default pools to earlier runs.
os.environ.setdefault("SHMVEC_PLAN_CACHE", "off")

# The property tests (test_properties*.py) start pools in every example, so examples are
# slow: "ci" (the default) keeps their share of a run bounded, "long" explores on demand
# (SHMVEC_HYPOTHESIS_PROFILE=long).
settings.register_profile(
    "ci",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # explain reruns for minutes
)
settings.register_profile("long", settings.get_profile("ci"), max_examples=1000)
# CI's repeats of the suite (the floors, the other Pythons) look for what a version changes, not
# for new inputs: fewer examples.
settings.register_profile("repeat", settings.get_profile("ci"), max_examples=10)
settings.load_profile(os.environ.get("SHMVEC_HYPOTHESIS_PROFILE", "ci"))


# Long stress, storm and whole-run tests, marked `once`: the first suite of CI runs them; its
# repeats under the floors and the other Pythons leave them out (-m "not once"), as a loaded
# runner's hour cannot hold them four times and a version changes the APIs they sit on little.
ONCE = (
    "tests/engine/test_resources.py::test_many_cycles_leave_nothing",
    "tests/engine/test_step_tree.py::test_a_tree_pool_equals_dummyvecenv_on_cartpole",
    "tests/engine/test_step_tree.py::test_episode_ends_in_the_last_worker",
    "tests/engine/test_step_tree.py::test_restart_mode_posts_every_worker_itself",
    "tests/engine/test_waiting_lanes.py::test_the_default_",
    "tests/clocks/test_timings.py::test_a_straggler_is_measured_and_named",
    "tests/clocks/test_timings.py::test_waiting_envs_in_workers",
    "tests/engine/test_interrupts.py::test_a_ctrl_c_storm",
    "tests/engine/test_failures.py::test_main_process_sigkilled",
    "tests/engine/test_timing_orphans.py",
    "tests/adapters/test_sb3_timings_callback.py::test_the_caller_dominates_ppo_on_cartpole",
    "tests/adapters/test_sb3_timings_callback.py::test_each_rollout_logs_its_shares_through_wrappers",
    "tests/test_readme.py::test_docs_example_runs_as_a_script",
    "tests/test_readme.py::test_the_demo_runs_and_says_what_the_default_chose",
    "tests/test_readme.py::test_readme_example_runs_as_a_script",
    "tests/adapters/test_agents_clients.py::test_the_pistonball_tutorial_trains_over_shmvec_and_saves",
    "tests/adapters/test_agents_clients.py::test_the_cleanrl_loop_learns_to_beat_a_random_policy",
)


# The Gymnasium side of shmvec (ShmVectorEnv and what builds one) needs Gymnasium 1.1's VectorEnv API
# and refuses older releases (shmvec/gymnasium_1_1.py); SB3's side runs on them. There, a test is
# skipped, saying why, where it is marked `vector_api`, or its parameters name the Gymnasium side, or
# (unless its parameters name SB3's side: one case of a test over both) its code names the Gymnasium
# side or Gymnasium's vector envs to compare with (their 1.1 API). Nothing else is: a test of SB3's
# side that reaches the Gymnasium side fails.
VECTOR_API_NAMES = (
    "ShmVectorEnv",
    "ShmAgentVectorEnv",
    "make_vec",
    "shmvec.register",
    "SyncVectorEnv",
    "AsyncVectorEnv",
    "VectorEnv)",  # isinstance(envs, VectorEnv)
)
VECTOR_API_PARAMS = (*VECTOR_API_NAMES, "'gym'")  # an adapter parameter's value
SB3_SIDE_PARAMS = ("ShmPoolVecEnv", "ShmAgentVecEnv", "DummyVecEnv", "'sb3'")


def needs_vector_api(item) -> bool:
    if item.nodeid.startswith("tests/test_gymnasium_1_1.py"):  # the refusal itself is tested there
        return False
    if item.get_closest_marker("vector_api") is not None:
        return True
    params = str(item.callspec.params) if hasattr(item, "callspec") else ""
    if any(name in params for name in VECTOR_API_PARAMS):
        return True
    if any(name in params for name in SB3_SIDE_PARAMS):
        return False
    if hasattr(item, "dtest"):  # a docstring example
        source = "".join(example.source for example in item.dtest.examples)
    else:
        try:
            source = inspect.getsource(item.function)
        except (AttributeError, OSError, TypeError):
            source = ""
    return any(name in source for name in VECTOR_API_NAMES)


def pytest_collection_modifyitems(items):
    skip = pytest.mark.skip(reason=f"needs Gymnasium {VECTOR_API} or later (this is {gym.__version__})")
    for item in items:
        if item.nodeid.startswith(ONCE):
            item.add_marker(pytest.mark.once)
        if not HAS_VECTOR_API and needs_vector_api(item):
            item.add_marker(skip)


def wait_until_clean(before_shm: set[str], before_pids: set[int], timeout: float = 5.0) -> tuple[set, set]:
    deadline = time.monotonic() + timeout
    while True:
        extra_shm = shm_entries() - before_shm
        extra_pids = descendant_pids() - before_pids
        if (not extra_shm and not extra_pids) or time.monotonic() > deadline:
            return extra_shm, extra_pids
        time.sleep(0.05)


@pytest.fixture
def closing():
    """Register vector envs to be closed at teardown, even when the test fails.

    Usage: ``env = closing(ShmPoolVecEnv(...))``.
    """
    envs = []

    def register(env):
        envs.append(env)
        return env

    yield register
    for env in reversed(envs):
        env.close()


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test's duration, however pytest was started
    (SIGINT ignored, as a background job): for the tests of Ctrl-C (``helpers.default_sigint_handler``).

    Usage: ``@pytest.mark.usefixtures("default_sigint")``, or a module's ``pytestmark``.
    """
    with default_sigint_handler():
        yield


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves worker processes or /dev/shm entries behind."""
    before_shm, before_pids = shm_entries(), descendant_pids()
    yield
    extra_shm, extra_pids = wait_until_clean(before_shm, before_pids)
    for pid in extra_pids:  # do not let one leak cascade into every later test
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    assert not extra_shm, f"{request.node.name} left shared memory behind: {sorted(extra_shm)}"
    assert not extra_pids, f"{request.node.name} left processes behind: {sorted(extra_pids)}"
