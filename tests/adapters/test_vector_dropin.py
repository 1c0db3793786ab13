"""ShmVectorEnv as a drop-in for Gymnasium's AsyncVectorEnv, to the letter.

Every behaviour is run on both (same envs, seeds and actions) and compared: the async
pairs give SyncVectorEnv's results bit for bit; every misuse raises the same exception
class (ours subclass theirs) with the same message, only the class name differing;
timeouts, observation modes, close(terminate=True) and closing with a call pending
behave as AsyncVectorEnv's do.
"""

from __future__ import annotations

import functools
import gc
import inspect
import multiprocessing
import re
import subprocess
import sys
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Box, Discrete
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from hypothesis import given
from hypothesis import strategies as st

import shmvec
from shmvec import ShmVectorEnv
from shmvec.adapters import dropin_args
from shmvec.gymnasium_1_1 import AutoresetMode, batch_differing_spaces
from shmvec.options import default_start_method
from tests.adapters import start_probe
from tests.adapters.test_vector import ENV_FACTORIES, run_equivalence
from tests.envs import BoundedBoxEnv, DiscreteObsEnv, MixedDictEnv, make_mixed, make_text_token
from tests.gym_versions import (
    ASSERTS_OBSERVATION_MODES,
    ASSERTS_SEED_LISTS,
    WAITS_ON_WRONG_COUNTS,
    WRITES_CLASS_METADATA,
)
from tests.helpers import assert_same, descendant_pids, shm_entries

pytestmark = pytest.mark.vector_api  # ShmVectorEnv: Gymnasium 1.1 on (tests/conftest.py)

CARTPOLE = ENV_FACTORIES["CartPole"]


def make_shm(fns, closing, n_workers=2, **kwargs):
    return closing(ShmVectorEnv(list(fns), n_workers, start_method="fork", **kwargs))


def make_async(fns, closing, **kwargs):
    return closing(AsyncVectorEnv(list(fns), context="fork", **kwargs))


def raised(call):
    """The exception ``call()`` raises (it must raise one)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the point is to catch what it raises
        return exc
    raise AssertionError("no exception was raised")


def assert_same_error(ours: BaseException, theirs: BaseException, where: str = "") -> None:
    """Our exception is an instance of theirs' class and reads the same, but for the class name."""
    assert isinstance(ours, type(theirs)), f"{where}: {type(ours).__mro__} is not a {type(theirs)}"
    assert str(ours) == str(theirs).replace("AsyncVectorEnv", "ShmVectorEnv"), where
    if isinstance(theirs, (NoAsyncCallError, AlreadyPendingCallError)):
        assert ours.name == theirs.name, where


def finish_pending(env) -> None:
    """Wait for whatever call is pending, as AsyncVectorEnv.close_extras does."""
    if env._state != AsyncState.DEFAULT:
        getattr(env, f"{env._state.value}_wait")()


# ---- the async pairs give SyncVectorEnv's results -------------------------------------


@pytest.mark.parametrize("env_name", list(ENV_FACTORIES))
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_async_pairs_match_sync_vector_env(env_name, mode, closing):
    fn = ENV_FACTORIES[env_name]
    shm = make_shm([fn] * 4, closing, autoreset_mode=mode)
    ref = closing(SyncVectorEnv([fn] * 4, autoreset_mode=mode))
    shm.reset_async(seed=7, options=None)
    assert_same(shm.reset_wait(timeout=np.float64(30)), ref.reset(seed=7), "reset")
    ref.action_space.seed(7)
    ended = 0
    for t in range(60):
        actions = ref.action_space.sample()
        shm.step_async(actions)
        got, want = shm.step_wait(timeout=np.float32(30)), ref.step(actions)
        assert_same(got, want, f"step {t}")
        ended += int((want[2] | want[3]).sum())
        if t % 20 == 0:
            shm.call_async("np_random_seed")
            assert shm.call_wait(timeout=30) == ref.call("np_random_seed")
    assert ended > 0  # autoresets were exercised


# ---- misuse: the same errors, word for word ----------------------------------------------

ACTIONS = np.zeros(3, dtype=np.int64)


def _step_async(env):
    env.step_async(ACTIONS)


MISUSES = {
    "step_wait, nothing pending": [lambda e: e.step_wait()],
    "reset_wait, nothing pending": [lambda e: e.reset_wait()],
    "call_wait, nothing pending": [lambda e: e.call_wait()],
    "step_async twice": [_step_async, _step_async],
    "step during a step": [_step_async, lambda e: e.step(ACTIONS)],
    "reset_async during a step": [_step_async, lambda e: e.reset_async()],
    "reset during a step": [_step_async, lambda e: e.reset(seed=0)],
    "call_async during a step": [_step_async, lambda e: e.call_async("gravity")],
    "render during a step": [_step_async, lambda e: e.render()],
    "call_wait during a step": [_step_async, lambda e: e.call_wait()],
    "reset_wait during a step": [_step_async, lambda e: e.reset_wait()],
    "bad seeds during a step": [_step_async, lambda e: e.reset_async(seed=[1, 2])],
    "bad set_attr values during a step": [_step_async, lambda e: e.set_attr("gravity", [1.0])],
    "step_async during a reset": [lambda e: e.reset_async(seed=1), _step_async],
    "step_wait during a reset": [lambda e: e.reset_async(seed=1), lambda e: e.step_wait()],
    "get_attr during a reset": [lambda e: e.reset_async(seed=1), lambda e: e.get_attr("gravity")],
    "set_attr during a call": [lambda e: e.call_async("gravity"), lambda e: e.set_attr("gravity", 1.0)],
    "reset_async during a call": [lambda e: e.call_async("gravity"), lambda e: e.reset_async()],
    "step_async during a call": [lambda e: e.call_async("gravity"), _step_async],
    "call_async twice": [lambda e: e.call_async("gravity"), lambda e: e.call_async("gravity")],
}


def test_misuse_raises_what_async_vector_env_raises(closing):
    shm = make_shm([CARTPOLE] * 3, closing)
    ref = make_async([CARTPOLE] * 3, closing)
    for env in (shm, ref):
        env.reset(seed=0)
    for name, calls in MISUSES.items():
        errors = []
        for env in (shm, ref):
            for call in calls[:-1]:
                call(env)
            errors.append(raised(lambda calls=calls, env=env: calls[-1](env)))
            finish_pending(env)
        ours, theirs = errors
        if ASSERTS_SEED_LISTS and type(theirs) is AssertionError and "seeds are passed as a list" in str(theirs):
            theirs = ValueError(*theirs.args)  # Gymnasium 1.4's class, with the message of both
        assert_same_error(ours, theirs, where=name)
    assert_same(shm.step(ACTIONS)[:4], ref.step(ACTIONS)[:4], "still in step after all that")


@pytest.mark.parametrize("name", ["reset", "step", "close", "_setattr", "_check_spaces"])
def test_call_refuses_what_async_vector_env_refuses(name, closing):
    shm = make_shm([CARTPOLE] * 2, closing)
    ref = make_async([CARTPOLE] * 2, closing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AsyncVectorEnv logs its worker's traceback as it shuts that worker down
        assert_same_error(raised(lambda: shm.call(name)), raised(lambda: ref.call(name)), where=name)
    assert shm.call("gravity") == (9.8, 9.8)  # ours is still usable
    ref.close(terminate=True)  # theirs lost its workers


def test_misuse_errors_are_both_gymnasium_and_shmvec_errors(closing):
    shm = make_shm([CARTPOLE] * 3, closing)
    shm.reset(seed=0)
    with pytest.raises(shmvec.NoPendingCallError):
        shm.step_wait()
    with pytest.raises(shmvec.StepStateError):
        shm.call_wait()
    shm.step_async(ACTIONS)
    with pytest.raises(shmvec.AlreadyPendingError):
        shm.call_async("gravity")
    with pytest.raises(AlreadyPendingCallError):
        shm.reset_async()
    shm.step_wait()
    shm.close()
    with pytest.raises(shmvec.ClosedEnvError):
        shm.step(ACTIONS)
    with pytest.raises(ClosedEnvironmentError):
        shm.step(ACTIONS)


CLOSED_CALLS = {
    "reset": lambda e: e.reset(),
    "reset_async": lambda e: e.reset_async(),
    "reset_wait": lambda e: e.reset_wait(),
    "step": lambda e: e.step(ACTIONS),
    "step_async": lambda e: e.step_async(ACTIONS),
    "step_wait": lambda e: e.step_wait(),
    "call": lambda e: e.call("gravity"),
    "call_async": lambda e: e.call_async("gravity"),
    "call_wait": lambda e: e.call_wait(),
    "get_attr": lambda e: e.get_attr("gravity"),
    "set_attr": lambda e: e.set_attr("gravity", 1.0),
    "render": lambda e: e.render(),
    "np_random_seed": lambda e: e.np_random_seed,
}


def test_calls_after_close_raise_what_async_vector_env_raises(closing):
    shm = make_shm([CARTPOLE] * 3, closing)
    ref = make_async([CARTPOLE] * 3, closing)
    for env in (shm, ref):
        env.reset(seed=0)
        assert not env.closed
        env.close()
        env.close()  # twice is fine
        assert env.closed
    for name, call in CLOSED_CALLS.items():
        assert_same_error(raised(lambda call=call: call(shm)), raised(lambda call=call: call(ref)), where=name)


# ---- actions that are not a batch ---------------------------------------------------------

SINGLE_ACTIONS = [
    ("CartPole", 1),
    ("CartPole", np.int64(1)),
    ("CartPole", np.array(1)),
    ("Pendulum", 0.5),
    ("Pendulum", np.float32(0.5)),
    ("Nested", 1),
]


@pytest.mark.parametrize("env_name, action", SINGLE_ACTIONS, ids=[f"{n}-{a!r}" for n, a in SINGLE_ACTIONS])
def test_a_single_action_is_a_type_error_as_in_async_vector_env(env_name, action, closing):
    fn = ENV_FACTORIES[env_name]
    shm = make_shm([fn] * 2, closing)
    ref = make_async([fn] * 2, closing)
    for env in (shm, ref):
        env.reset(seed=0)
        with pytest.raises(TypeError):
            env.step(action)
    with pytest.raises(shmvec.UnbatchedActionError, match="expected a batch of 2 actions"):
        shm.step_async(action)
    ref.action_space.seed(0)
    actions = ref.action_space.sample()
    assert_same(shm.step(actions)[:4], ref.step(actions)[:4], "nothing was started by the rejected calls")


WRONG_COUNTS = {
    "CartPole": [0],
    "Pendulum": np.zeros((3, 1), dtype=np.float32),
    "Nested": {
        "move": np.zeros((1, 2), dtype=np.float32),
        "mode": (np.zeros(2, dtype=np.int64), np.zeros((2, 2), dtype=np.int8)),
    },
}


@pytest.mark.parametrize("env_name", list(WRONG_COUNTS))
def test_a_wrong_count_of_actions_is_a_value_error_as_in_async_vector_env(env_name, closing):
    fn = ENV_FACTORIES[env_name]
    shm = make_shm([fn] * 2, closing)
    ref = make_async([fn] * 2, closing)
    for env in (shm,) if WAITS_ON_WRONG_COUNTS else (shm, ref):
        env.reset(seed=0)
        with pytest.raises(ValueError):
            env.step(WRONG_COUNTS[env_name])
    with pytest.raises(shmvec.InvalidActionError):
        shm.step(WRONG_COUNTS[env_name])
    shm.step(shm.action_space.sample())  # ours is still usable (theirs sent some actions already)
    ref.close(terminate=True)


# ---- timeouts -------------------------------------------------------------------------------

SLOW = 3.0  # seconds a slow call takes; every test kills the workers long before


class SlowEnv(gym.Env):
    """Slow on request: step with action 1, reset with options={"slow": True}, slow_call()."""

    observation_space = Box(-1, 1, (1,), np.float32)
    action_space = Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and options.get("slow"):
            time.sleep(SLOW)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        if action == 1:
            time.sleep(SLOW)
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def slow_call(self):
        time.sleep(SLOW)
        return 1


TIMEOUTS = {
    "step": (lambda e: e.step_async(np.array([0, 1])), lambda e: e.step_wait(timeout=np.float64(0.2))),
    "reset": (lambda e: e.reset_async(options={"slow": True}), lambda e: e.reset_wait(timeout=np.float32(0.25))),
    "call": (lambda e: e.call_async("slow_call"), lambda e: e.call_wait(timeout=np.int64(0))),
}


@pytest.mark.parametrize("kind", list(TIMEOUTS))
def test_a_wait_that_times_out_raises_multiprocessing_timeout_error(kind, closing):
    start, wait = TIMEOUTS[kind]
    shm = make_shm([SlowEnv] * 2, closing)
    ref = make_async([SlowEnv] * 2, closing)
    errors = []
    for env in (shm, ref):
        env.reset(seed=0)
        start(env)
        with pytest.raises(multiprocessing.TimeoutError) as info:
            wait(env)
        errors.append(info.value)
        assert env._state == AsyncState.DEFAULT  # nothing pending any more, as in AsyncVectorEnv
        env.close(terminate=True)
    ours, theirs = errors
    assert str(ours).startswith(str(theirs).rstrip(".") + ": envs ")  # theirs, then which envs hang
    assert isinstance(ours, (shmvec.StepTimeoutError, TimeoutError))


def test_a_bad_timeout_leaves_the_call_pending(closing):
    shm = make_shm([SlowEnv] * 2, closing)
    ref = make_async([SlowEnv] * 2, closing)
    for env in (shm, ref):
        env.reset(seed=0)
        env.step_async(np.zeros(2, dtype=np.int64))
        with pytest.raises(TypeError):
            env.step_wait(timeout="soon")
    assert_same(shm.step_wait(timeout=30)[:4], ref.step_wait(timeout=30)[:4])


# ---- observation_mode ------------------------------------------------------------------------


BOUNDED = [functools.partial(BoundedBoxEnv, high=float(i)) for i in (1, 2, 3)]
CUSTOM_MODE = (Box(0, np.repeat(np.arange(1, 4), 5).reshape((3, 5)).astype(np.float32), (3, 5)), Box(0, 1, (5,)))


def async_init_error(env_fns, **kwargs) -> BaseException:
    """What AsyncVectorEnv's constructor raises; its half-built env is collected, which terminates its workers."""
    error = raised(lambda: AsyncVectorEnv(env_fns, context="fork", **kwargs))
    error.__traceback__ = None  # the frames that hold the half-built env
    gc.collect()
    return error


@pytest.mark.parametrize("mode", ["different", CUSTOM_MODE], ids=["different", "custom"])
def test_observation_mode_different_and_custom_match_async_and_sync(mode, closing):
    shm = make_shm(BOUNDED, closing, observation_mode=mode)
    theirs = make_async(BOUNDED, closing, observation_mode=mode)
    ref = closing(SyncVectorEnv(BOUNDED, observation_mode=mode))
    spaces = [fn().observation_space for fn in BOUNDED]
    assert shm.observation_space == theirs.observation_space == batch_differing_spaces(spaces)
    assert shm.single_observation_space == theirs.single_observation_space == spaces[0]
    assert shm.observation_mode is mode
    counts = run_equivalence(shm, ref, 40, seed=3)
    assert counts["terminated"] > 0


def test_invalid_observation_modes_raise_what_async_vector_env_raises():
    for mode in ["invalid", (Box(0, 1, (2,)), "not a space"), [Box(0, 1, (3, 2)), Box(0, 1, (2,))]]:
        ours = raised(lambda mode=mode: ShmVectorEnv(BOUNDED, 2, start_method="fork", observation_mode=mode))
        theirs = raised(lambda mode=mode: AsyncVectorEnv(BOUNDED, context="fork", observation_mode=mode))
        if ASSERTS_OBSERVATION_MODES and type(theirs) is AssertionError:
            assert isinstance(ours, TypeError) and "Expected both elements of observation_mode" in str(ours)
        else:
            assert_same_error(ours, theirs, where=repr(mode))


# Not fork for a pool whose start fails once its workers built their envs: a forked worker holds the
# main process's end of its pipe, never sees EOF, and close() waits its 3 s for it.
FAILS_AT_START = "forkserver"

MISMATCHES = {
    "same mode, different bounds": (BOUNDED, "same"),
    "custom mode, different shapes": (
        [functools.partial(BoundedBoxEnv, shape=(i,)) for i in (5, 2, 3)],
        (Box(0, 4, (3, 5)), Box(0, 4, (5,))),
    ),
    "different action spaces": ([BoundedBoxEnv, functools.partial(BoundedBoxEnv, n_actions=3)], "same"),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_space_mismatches_raise_what_async_vector_env_raises(case):
    env_fns, mode = MISMATCHES[case]
    ours = raised(lambda: ShmVectorEnv(env_fns, 2, start_method=FAILS_AT_START, observation_mode=mode))
    assert_same_error(ours, async_init_error(env_fns, observation_mode=mode), where=case)
    assert isinstance(ours, shmvec.SpaceMismatchError)
    assert "env 1 has" in str(ours.__cause__)  # which env, in the pool's own words


DIFFERENT_FAILURES = {
    "other shapes": [functools.partial(BoundedBoxEnv, shape=(i,)) for i in (1, 2, 3)],
    "other dtypes": [BoundedBoxEnv, functools.partial(BoundedBoxEnv, dtype=np.float64)],
    "other space types": [BoundedBoxEnv, BoundedBoxEnv, DiscreteObsEnv],
}


@pytest.mark.parametrize("case", list(DIFFERENT_FAILURES))
def test_observation_mode_different_fails_as_async_vector_env(case):
    # AsyncVectorEnv fails in batch_differing_spaces, before it starts any worker
    env_fns = DIFFERENT_FAILURES[case]
    theirs = raised(lambda: AsyncVectorEnv(env_fns, context="fork", observation_mode="different"))
    ours = raised(lambda: ShmVectorEnv(env_fns, 2, start_method=FAILS_AT_START, observation_mode="different"))
    assert_same_error(ours, theirs, where=case)


# ---- close -------------------------------------------------------------------------------------


def _close_warnings(env, **kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env.close(**kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


PENDING = {
    "step": lambda e: e.step_async(np.zeros(2, dtype=np.int64)),
    "reset": lambda e: e.reset_async(seed=5),
    "call": lambda e: e.call_async("np_random_seed"),
}


@pytest.mark.parametrize("kind", list(PENDING))
def test_closing_with_a_call_pending_warns_and_waits_for_it(kind, closing):
    shm = make_shm([SlowEnv] * 2, closing)
    ref = make_async([SlowEnv] * 2, closing)
    caught = []
    for env in (shm, ref):
        env.reset(seed=0)
        PENDING[kind](env)
        caught.append(_close_warnings(env))
        assert env.closed
    assert caught[0] == caught[1] and len(caught[0]) == 1
    assert f"Calling `close` while waiting for a pending call to `{kind}` to complete." in caught[0][0]


def test_close_terminate_kills_a_stuck_step_at_once(closing):
    before_pids, before_shm = descendant_pids(), shm_entries()
    shm = make_shm([SlowEnv] * 2, closing)
    ref = make_async([SlowEnv] * 2, closing)
    caught = []
    for env in (shm, ref):
        env.reset(seed=0)
        env.step_async(np.array([1, 1]))  # both envs sleep
        caught.append(_close_warnings(env, terminate=True))
    assert caught[0] == caught[1] and "pending call to `step`" in caught[0][0]
    assert descendant_pids() - before_pids == set()  # nothing left, right when close() returns
    assert shm_entries() - before_shm == set()


def test_close_terminate_without_a_pending_call(closing):
    shm = make_shm([CARTPOLE] * 2, closing)
    shm.reset(seed=0)
    assert _close_warnings(shm, terminate=True) == []
    assert shm.closed
    with pytest.raises(ClosedEnvironmentError):
        shm.reset()


# ---- the rest of the surface -------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=[m.name for m in AutoresetMode])
@pytest.mark.parametrize("n_workers, main_shard", [(2, False), (0, True)], ids=["workers", "main-shard-only"])
def test_metadata_never_touches_the_env_class(mode, n_workers, main_shard, closing):
    before = dict(MixedDictEnv.metadata)
    fns = [lambda: make_mixed(render_mode="rgb_array")] * 2
    shm = make_shm(fns, closing, n_workers=n_workers, use_main_process=main_shard, autoreset_mode=mode)
    assert MixedDictEnv.metadata == before
    ref = make_async(fns, closing, autoreset_mode=mode.value)
    assert shm.metadata == ref.metadata and shm.metadata["autoreset_mode"] is mode
    if not WRITES_CLASS_METADATA:
        assert MixedDictEnv.metadata == before and "autoreset_mode" not in MixedDictEnv.metadata


def test_surface_matches_async_vector_env(closing):
    fns = [lambda: make_mixed(render_mode="rgb_array")] * 3
    shm = closing(ShmVectorEnv(env_fns=fns, n_workers=2, start_method="fork"))  # env_fns by keyword
    ref = closing(AsyncVectorEnv(env_fns=fns, context="fork"))
    assert shm.env_fns is fns and ref.env_fns is fns
    # Gymnasium's repr, plus how the envs run (shmvec chooses that itself by default)
    assert repr(ref) == "AsyncVectorEnv(num_envs=3)"
    given = "n_workers=2, use_main_process=False, why='n_workers=2 given'"
    threads = f"omp_spin={shm._pool.omp_spin!r}, torch_threads={shm._pool.caller.description()!r}"
    assert repr(shm) == f"ShmVectorEnv(num_envs=3, {given}, {threads})"
    assert str(shm) == repr(shm) and str(ref) == repr(ref)
    assert shm.observation_mode == ref.observation_mode == "same"
    assert shm.render_mode == ref.render_mode == "rgb_array"
    assert not shm.closed and not ref.closed
    assert_same(shm.reset(seed=4), ref.reset(seed=4), "reset")
    assert shm.np_random_seed == ref.np_random_seed == (4, 5, 6)
    actions = np.full((3, 3), 0.5, dtype=np.float32)
    for t in range(5):
        assert_same(shm.step(actions), ref.step(actions), f"step {t}")
    frames = shm.render()
    assert type(frames) is tuple and len(frames) == 3
    assert_same(frames, ref.render(), "render")
    for env in (shm, ref):
        env.set_attr("calls", [7, 8, 9])
    assert shm.get_attr("calls") == ref.get_attr("calls") == (7, 8, 9)
    assert shm.call("double", 4) == ref.call("double", 4) == (8, 8, 8)


# ---- AsyncVectorEnv's constructor arguments ------------------------------------------

SCRIPT = """
import gymnasium as gym
import numpy as np
{import_line}


def make():
    return gym.make("CartPole-v1")


if __name__ == "__main__":
    # AsyncVectorEnv(env_fns, shared_memory, copy, context, daemon), by position and by keyword
    for envs in (
        {cls}([make] * 3, False, True, "spawn", True),
        {cls}([make] * 3, shared_memory=False, context="forkserver", daemon=True),
    ):
        obs, _ = envs.reset(seed=1)
        total = float(obs.sum())
        for _ in range(40):
            obs, rewards, terminations, truncations, _ = envs.step(np.array([0, 1, 1]))
            total += float(obs.sum() + rewards.sum() + terminations.sum() + truncations.sum())
        envs.close()
        print(repr(total))
"""


def test_a_script_passing_async_vector_env_arguments_runs_unchanged(tmp_path):
    """``shared_memory``, ``context`` and ``daemon``, by keyword and in AsyncVectorEnv's positional
    order: a script that passes them runs with only the class name changed, and prints the same."""
    outputs = []
    for import_line, cls in [
        ("from gymnasium.vector import AsyncVectorEnv", "AsyncVectorEnv"),
        ("from shmvec import ShmVectorEnv", "ShmVectorEnv"),
    ]:
        script = tmp_path / f"{cls}.py"
        script.write_text(SCRIPT.format(import_line=import_line, cls=cls))
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{cls}:\n{done.stderr}"
        outputs.append(done.stdout.split())
    assert len(outputs[0]) == 2 and outputs[1] == outputs[0]


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_context_is_the_start_method(context, monkeypatch, closing):
    """What an env sees of the parent's state under each ``context`` is what it sees under AsyncVectorEnv's."""
    monkeypatch.setattr(start_probe, "STATE", "set by the test")
    fns = [start_probe.ProbeEnv] * 2
    ref = closing(AsyncVectorEnv(fns, context=context))
    shm = closing(ShmVectorEnv(fns, n_workers=2, context=context))
    want = ("set by the test" if context == "fork" else "imported",) * 2
    assert ref.get_attr("state") == want and shm.get_attr("state") == want
    assert shm._pool.options.start_method == context


def test_shared_memory_false_changes_nothing(closing):
    """Custom spaces need ``shared_memory=False`` in AsyncVectorEnv; shmvec takes any space either way."""
    fns = [functools.partial(make_text_token, max_episode_steps=7)] * 3
    for shared_memory in (False, True):
        shm = closing(ShmVectorEnv(fns, n_workers=2, start_method="fork", shared_memory=shared_memory))
        ref = closing(SyncVectorEnv(fns))
        counts = run_equivalence(shm, ref, steps=30, seed=5)
        assert counts["terminated"] + counts["truncated"] > 0


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_daemon_gives_workers_as_async_vector_envs(closing, start_method):
    fns = [start_probe.ProbeEnv] * 2
    for daemon in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            shm = closing(ShmVectorEnv(fns, n_workers=2, start_method=start_method, daemon=daemon))
        ref = closing(AsyncVectorEnv(fns, context=start_method, daemon=daemon))
        assert shm.get_attr("daemonic") == ref.get_attr("daemonic") == (daemon, daemon)


WRONG_ARGUMENTS = {
    "context and start_method": ((), {"context": "spawn", "start_method": "fork"}, "got context='spawn' and start_m"),
    "a worker": ((), {"worker": lambda *args: None}, "runs its own workers: worker= must be None"),
    "copy twice": ((False, True), {"copy": False}, "got multiple values for argument 'copy'"),
    "shared_memory twice": ((False,), {"shared_memory": False}, "got multiple values for argument 'shared_memory'"),
    "copy twice, at its default value": ((True, False), {"copy": True}, "got multiple values for argument 'copy'"),
    "worker twice": ((True, True, None, True, None), {"worker": None}, "got multiple values for argument 'worker'"),
    "positional after n_workers": ((2, True), {}, "takes env_fns and n_workers positionally"),
    "max_concurrency": ((False, True, None, True, None, "same", "NextStep", 2), {}, "max_concurrency= must be None"),
    "max_concurrency by keyword": ((), {"max_concurrency": 2}, "max_concurrency= must be None"),
    "too many": ((False, True, None, True, None, "same", "NextStep", None, 1), {}, "up to max_concurrency, no more"),
}


@pytest.mark.parametrize("case", list(WRONG_ARGUMENTS))
def test_arguments_that_cannot_be_honoured_raise_type_error(case):
    args, kwargs, message = WRONG_ARGUMENTS[case]
    with pytest.raises(TypeError, match=re.escape(message)):
        ShmVectorEnv([start_probe.ProbeEnv] * 2, *args, **kwargs)


def test_context_none_is_shmvecs_default_start_method(closing):
    shm = closing(ShmVectorEnv([start_probe.ProbeEnv] * 2, n_workers=1, context=None))
    assert shm._pool.options.start_method == default_start_method()


# ---- how the arguments bind: as AsyncVectorEnv's signature binds them ----------------------

ASYNC_PARAMETERS = [name for name in inspect.signature(AsyncVectorEnv).parameters if name != "env_fns"]
BOOLS = [True, False, np.True_, np.False_]
ASYNC_VALUES = {
    "shared_memory": st.sampled_from(BOOLS),  # a bool: second, it is shared_memory, not n_workers
    "copy": st.sampled_from(BOOLS),
    "context": st.sampled_from([None, "fork", "spawn"]),
    "daemon": st.sampled_from(BOOLS),
    "worker": st.just(None),
    "observation_mode": st.sampled_from(["same", "different", (Box(0, 1, (2, 3)), Box(0, 1, (3,)))]),
    "autoreset_mode": st.sampled_from([*AutoresetMode, "NextStep", "SameStep"]),
    "max_concurrency": st.just(None),
}


@st.composite
def async_vector_env_calls(draw):
    """AsyncVectorEnv's arguments after env_fns: the first ``k`` by position, some of the rest by
    keyword, and sometimes one of the positional ones by keyword too (a TypeError there)."""
    values = {name: draw(ASYNC_VALUES[name]) for name in ASYNC_PARAMETERS}
    k = draw(st.integers(0, len(ASYNC_PARAMETERS)))
    positional = tuple(values[name] for name in ASYNC_PARAMETERS[:k])
    keywords = {name: values[name] for name in ASYNC_PARAMETERS[k:] if draw(st.booleans())}
    if k and draw(st.booleans()):
        twice = draw(st.sampled_from(ASYNC_PARAMETERS[:k]))
        keywords[twice] = draw(ASYNC_VALUES[twice])  # the same value or another: twice either way
    return positional, keywords


def shmvec_binds(positional: tuple, keywords: dict):
    """What ShmVectorEnv(fns, *positional, **keywords) binds, as its __init__ passes the arguments on (no pool)."""
    bound = inspect.signature(ShmVectorEnv).bind(BOUNDED, *positional, **keywords)
    bound.apply_defaults()
    args = bound.arguments
    own = {name: args[name] for name in dropin_args.ASYNC_KEYWORDS}
    return dropin_args.bind_async_vector_env(
        "ShmVectorEnv", args["n_workers"], args["async_args"], own, args["pool_options"]
    )


@given(async_vector_env_calls())
def test_every_split_of_async_vector_env_arguments_binds_as_there(call):
    positional, keywords = call
    try:
        theirs = inspect.signature(AsyncVectorEnv).bind(BOUNDED, *positional, **keywords)
    except TypeError as exc:
        with pytest.raises(TypeError, match=r"^ShmVectorEnv\(\) got " + re.escape(str(exc)) + "$"):
            shmvec_binds(positional, keywords)
        return
    theirs.apply_defaults()
    n_workers, ours, pool_options = shmvec_binds(positional, keywords)
    assert n_workers is None and pool_options == {}
    for name in ASYNC_PARAMETERS:
        want, got = theirs.arguments[name], ours[name]
        assert type(got) is type(want) and (got is want or got == want), f"{name}: {got!r}, not {want!r}"


def test_the_second_argument_is_n_workers_unless_it_is_a_bool():
    """``np.True_`` second is shared_memory, as ``True`` is; ``np.int64(2)`` is n_workers, as ``2`` is."""
    for second in (True, np.True_, np.False_):
        n_workers, args, _ = shmvec_binds((second,), {})
        assert n_workers is None and args["shared_memory"] is second
    for second in (2, np.int64(2), 0, None):
        n_workers, args, _ = shmvec_binds((second,), {})
        assert n_workers is second and args["shared_memory"] is True


def test_an_argument_given_twice_raises_before_anything_starts():
    with pytest.raises(TypeError, match=r"^ShmVectorEnv\(\) got multiple values for argument 'copy'$"):
        ShmVectorEnv(BOUNDED, True, False, copy=True)
    with pytest.raises(TypeError, match="multiple values for argument 'copy'"):
        AsyncVectorEnv(BOUNDED, True, False, copy=True)
