"""Every env in this process (``n_workers=0``): a step is one direct call, as in DummyVecEnv and
SyncVectorEnv: the caller's SIGINT handler stays installed while the envs step (nothing to hold:
no worker is waited on), and ``envs.timings`` still counts every step. Results: the equivalence
suites (their ``K0`` layouts step through this path)."""

from __future__ import annotations

import signal

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.errors import AlreadyPendingError, ResetNeededError
from shmvec.gymnasium_1_1 import AutoresetMode


class HandlerSeen(gym.Env):
    """Records, in each step's info, whether SIGINT's handler was the caller's as the env stepped."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    caller_handler = signal.default_int_handler

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        own = signal.getsignal(signal.SIGINT) is HandlerSeen.caller_handler
        return np.zeros(2, np.float32), 1.0, False, False, {"own_handler": own}


def own_handler(signum, frame):
    raise KeyboardInterrupt


@pytest.mark.parametrize("adapter", [ShmPoolVecEnv, ShmVectorEnv])
def test_an_in_process_step_leaves_the_callers_sigint_handler_alone(adapter, closing):
    before = signal.signal(signal.SIGINT, own_handler)
    HandlerSeen.caller_handler = own_handler
    try:
        envs = closing(adapter([HandlerSeen] * 2, n_workers=0))
        envs.reset()
        for _ in range(3):
            infos = envs.step(np.zeros(2, dtype=np.int64))[-1]
            seen = [info["own_handler"] for info in infos] if adapter is ShmPoolVecEnv else list(infos["own_handler"])
            assert seen == [True, True]
        assert envs.timings.steps == 3
    finally:
        signal.signal(signal.SIGINT, before)


class ActionSeen(gym.Env):
    """Keeps every action it gets, as it got it."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, action_space):
        self.action_space, self.got = action_space, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.got.append(action)
        return np.zeros(1, np.float32), 0.0, False, False, {}


ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(3),
    "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 2]),
    "multi_binary": gym.spaces.MultiBinary(2),
}
FORMS = ["int64", "longlong", "int32", "uint8", "bool", "float64", "float32", ">i8", ">f8", "list", "tuple"]


def batch(space: gym.Space, form: str, n: int):
    """``n`` actions of ``space`` in ``form`` (one value 1, so that a written row is never all zeros);
    None where both refuse that form."""
    values = np.array([space.sample() for _ in range(n)], dtype=np.float64)
    values.flat[0] = 1
    if form in ("list", "tuple"):
        column = (values if space.dtype.kind == "f" else values.astype(np.int64)).tolist()
        return column if form == "list" else tuple(column)
    kind, binary = np.dtype(form).kind, isinstance(space, gym.spaces.MultiBinary)
    if (space.dtype.kind == "f") != (kind == "f") and not binary or kind == "b" and not binary:
        return None
    return values.astype(form)


def received(make_envs, space: gym.Space, actions) -> tuple:
    """(the vector env, the action each env got) after one step with ``actions``."""
    made: list[ActionSeen] = []

    def make():
        made.append(ActionSeen(space))
        return made[-1]

    envs = make_envs([make] * len(actions))
    envs.reset()
    envs.step(actions)
    return envs, [env.got[-1] for env in made]


def kinds(actions: list) -> list:
    """Each action's type and dtype; byte order left out: shmvec hands over the native-order twin."""
    return [(type(a), a.dtype.newbyteorder("=") if hasattr(a, "dtype") else None) for a in actions]


@pytest.mark.parametrize(
    "space_name, form",
    [(name, form) for name, space in ACTION_SPACES.items() for form in FORMS if batch(space, form, 1) is not None],
)
def test_in_process_envs_get_flat_actions_as_the_references_hand_them_over(space_name, form, closing):
    """Each env gets its part of the caller's flat batch in the type and dtype DummyVecEnv and
    SyncVectorEnv give it, as a copy (the caller may reuse its array); a native numpy batch goes to
    the envs without the action rows' round trip (nothing else reads them: they stay unwritten)."""
    space = ACTION_SPACES[space_name]
    actions = batch(space, form, 3)
    pairs = [
        (lambda fns: ShmPoolVecEnv(fns, n_workers=0), DummyVecEnv),
        (lambda fns: ShmVectorEnv(fns, n_workers=0), SyncVectorEnv),
    ]
    for make_shm, make_reference in pairs:
        reference_envs, expected = received(make_reference, space, actions)
        closing(reference_envs)
        envs, got = received(make_shm, space, actions)
        closing(envs)
        assert kinds(got) == kinds(expected)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))
        if isinstance(actions, np.ndarray):
            given = actions.copy()
            actions[...] = 0  # the caller reuses its array
            assert all(np.array_equal(a, b) for a, b in zip(got, given))
            actions[...] = given
        handed = isinstance(actions, np.ndarray) and actions.dtype.isnative
        assert bool(np.count_nonzero(envs._pool.actions._raw[0])) is not handed


class EndsEverySecondStep(gym.Env):
    """Ends its episode every second step; its observation array is reused, changed in place."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.obs, self.t = np.zeros(2, np.float32), 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.obs[:] = -1.0
        return self.obs, {}

    def step(self, action):
        self.t += 1
        self.obs[:] = self.t
        return self.obs, 1.0, self.t % 2 == 0, False, {}


@pytest.mark.parametrize("adapter", ["sb3", "gym"])
def test_in_process_episode_ends_come_back_without_their_rows(adapter, closing):
    """SAME_STEP in this process: a final observation comes back as the references give it (a copy
    the env's later steps leave alone) and is never written to its shared row for a flag to find."""
    if adapter == "sb3":
        envs, reference = ShmPoolVecEnv([EndsEverySecondStep] * 2, n_workers=0), DummyVecEnv([EndsEverySecondStep] * 2)
    else:
        mode = gym.vector.AutoresetMode.SAME_STEP
        envs = ShmVectorEnv([EndsEverySecondStep] * 2, n_workers=0, autoreset_mode=mode)
        reference = SyncVectorEnv([EndsEverySecondStep] * 2, autoreset_mode=mode)
    closing(envs), closing(reference)
    envs.reset(), reference.reset()
    finals = []
    for _ in range(4):
        out, expected = envs.step(np.zeros(2, np.int64)), reference.step(np.zeros(2, np.int64))
        infos, expected_infos = out[-1], expected[-1]
        if adapter == "sb3":
            got = [info.get("terminal_observation") for info in infos]
            want = [info.get("terminal_observation") for info in expected_infos]
        else:
            got = list(infos.get("final_obs", [None, None]))
            want = list(expected_infos.get("final_obs", [None, None]))
        assert [None if g is None else g.tolist() for g in got] == [None if w is None else w.tolist() for w in want]
        finals += [g for g in got if g is not None]
    # as the references give them (the env's array as its reset left it), and copies: the envs stepped on since
    assert [f.tolist() for f in finals] == [[-1.0, -1.0]] * 4
    pool = envs._pool
    assert not pool._final_flag.any() and not pool._final_obs.any()


class ResetHandlerSeen(HandlerSeen):
    """Records, in each reset's info too, whether SIGINT's handler was the caller's."""

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {"own_handler": signal.getsignal(signal.SIGINT) is HandlerSeen.caller_handler}


def test_an_in_process_reset_is_one_direct_call(closing):
    """``reset`` with every env in this process (a masked one, as DISABLED mode needs after each
    episode end) leaves the caller's SIGINT handler alone and is counted as a call, as DummyVecEnv's."""
    before = signal.signal(signal.SIGINT, own_handler)
    HandlerSeen.caller_handler = own_handler
    try:
        mode = gym.vector.AutoresetMode.DISABLED
        envs = closing(ShmVectorEnv([ResetHandlerSeen] * 3, n_workers=0, autoreset_mode=mode))
        _, infos = envs.reset(seed=0)
        assert list(infos["own_handler"]) == [True] * 3
        envs.timings.reset()
        _, infos = envs.reset(options={"reset_mask": np.array([False, True, True])})
        assert list(infos["_own_handler"]) == [False, True, True] and all(infos["own_handler"][1:])
        timings = envs.timings
        assert timings.calls > 0 and timings.steps == 0
    finally:
        signal.signal(signal.SIGINT, before)


class EndsOnOne(gym.Env):
    """Action 1 ends the episode (terminated), 0 goes on; the observation counts the steps."""

    observation_space = gym.spaces.Box(0.0, 1e6, (1,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1), {}

    def step(self, action):
        self.t += 1
        return np.full(1, float(self.t)), 1.0, bool(action), False, {}


@settings(max_examples=15, deadline=None)
@given(
    moves=st.lists(
        st.tuples(st.lists(st.integers(0, 1), min_size=3, max_size=3), st.booleans()), min_size=1, max_size=12
    )
)
def test_disabled_mode_in_process_needs_a_reset_exactly_when_syncvectorenv_does(moves):
    """DISABLED, every env here: a step after an episode end that was not reset raises (as SyncVectorEnv's
    assert), results stay the reference's, and the step says whether an episode ended in it (the flag that
    spares the adapter its array work on the steps where none did)."""
    fns = [EndsOnOne] * 3
    shm = ShmVectorEnv(fns, n_workers=0, autoreset_mode=AutoresetMode.DISABLED)
    ref = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    try:
        shm.reset(seed=0), ref.reset(seed=0)
        for actions, reset_ended in moves:
            actions = np.array(actions)
            try:
                expected = ref.step(actions)
            except AssertionError:
                with pytest.raises(ResetNeededError):
                    shm.step(actions)
                expected = None
            if expected is not None:
                got = shm.step(actions)
                for g, e in zip(got[:4], expected[:4]):
                    np.testing.assert_array_equal(g, e)
                ended = expected[2] | expected[3]
                assert shm._pool.episode_ended == bool(ended.any())
                if reset_ended and ended.any():
                    options = {"reset_mask": ended.copy()}
                    np.testing.assert_array_equal(shm.reset(options=options)[0], ref.reset(options=options)[0])
    finally:
        shm.close()
        ref.close()


def test_disabled_mode_in_process_after_an_async_batch_that_ended_needs_a_reset(closing):
    """An episode that ended in a recv (not a step) still needs its reset before the next step."""
    envs = closing(ShmVectorEnv([EndsOnOne] * 2, n_workers=0, autoreset_mode=AutoresetMode.DISABLED))
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))  # no episode ended: the step's shortcut
    envs.send(np.array([1, 0]), env_ids=[0, 1])
    *_, terminated, _, _ = envs.recv()
    assert terminated.tolist() == [True, False]
    with pytest.raises(ResetNeededError, match=r"envs \[0\]"):
        envs.step(np.zeros(2, np.int64))
    envs.reset(options={"reset_mask": np.array([True, False])})
    envs.step(np.zeros(2, np.int64))


class Logged(gym.Env):
    """Logs every call of its method, in order; one whose ``ident`` is "bad" fails it (an env's own error)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.log, self.ident = [], None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def record(self, x, *, key="k"):
        if self.ident == "bad":
            raise ValueError(f"{x} failed")
        self.log.append((x, key))
        return (self.ident, x, key, len(self.log))

    def sigint_handler(self):
        return signal.getsignal(signal.SIGINT)


RARE_INDICES = [None, 0, 4, -1, -5, [1, 4], [-1, 0, 2], [2, 2, 0, 2], range(1, 3), (3, 1), np.array([4, 2])]
RARE_INDICES += [[np.int64(3), np.int32(0)], np.arange(5)[::-2], [], True]
# (indices, whether DummyVecEnv raises the same type): "a" is shmvec's ValueError (int("a")), its TypeError
BAD_INDICES = [(5, True), (-6, True), ([0, 5], True), (np.int64(1), True), (1.0, True), ("a", False)]


def logged_trio(closing) -> tuple:
    """(shmvec with every env here, shmvec with a worker, DummyVecEnv), each over 5 fresh ``Logged``
    envs told apart by ``ident``."""
    trio = (
        closing(ShmPoolVecEnv([Logged] * 5, n_workers=0)),
        closing(ShmPoolVecEnv([Logged] * 5, n_workers=1, start_method="fork")),
        closing(DummyVecEnv([Logged] * 5)),
    )
    for venv in trio:
        for i in range(5):
            venv.set_attr("ident", f"env{i}", indices=i)
    return trio


@pytest.mark.parametrize("indices", RARE_INDICES, ids=repr)
def test_in_process_rare_calls_answer_as_dummyvecenv(indices, closing):
    """``env_method``, ``get_attr``, ``set_attr``, ``env_is_wrapped``, ``has_attr`` with every env here: the
    results, their order and each env's calls (an index listed twice runs twice) of DummyVecEnv and of a
    pool with a worker, for every form of ``indices``."""
    answers = []
    for venv in logged_trio(closing):
        answers.append(
            (
                venv.env_method("record", 7, indices=indices),
                venv.env_method("record", "x", key=np.int16(3), indices=indices),
                venv.get_attr("ident", indices),
                venv.env_is_wrapped(gym.Wrapper, indices),
                venv.set_attr("ident", "new", indices),
                venv.get_attr("ident"),
                venv.get_attr("log"),
                venv.has_attr("log"),
            )
        )
    assert answers[0] == answers[2]
    assert answers[1] == answers[2]


def test_in_process_rare_call_errors_as_before(closing):
    """Bad indices raise what the general path raises (DummyVecEnv's types but for a string), and an env
    that fails raises its own exception, noted with its env, once the envs before it ran, and none after."""
    here, worker, dummy = logged_trio(closing)
    for bad, alike in BAD_INDICES:
        errors = []
        for venv in (here, worker, dummy):
            with pytest.raises(Exception) as caught:
                venv.get_attr("ident", bad)
            errors.append(caught.value)
        assert (type(errors[0]), str(errors[0])) == (type(errors[1]), str(errors[1])), bad
        assert (type(errors[0]) is type(errors[2])) is alike, bad
    for venv in (here, dummy):
        venv.set_attr("ident", "bad", indices=1)
    with pytest.raises(ValueError, match="y failed") as caught:
        here.env_method("record", "y", indices=[0, 1, 3])
    assert caught.value.env_index == 1 and caught.value.worker_index is None
    assert "env 1 (main process shard)" in "".join(caught.value.__notes__)
    with pytest.raises(ValueError, match="y failed"):
        dummy.env_method("record", "y", indices=[0, 1, 3])
    assert here.get_attr("log") == dummy.get_attr("log") == [[("y", "k")], [], [], [], []]
    assert here.get_attr("ident", [0]) == ["env0"]  # still usable


def test_an_in_process_rare_call_is_one_direct_call(closing):
    """With every env here, a rare call makes no request (no SIGINT swap, no pending state) and counts as a
    call in ``envs.timings``; with a step pending it takes the general path and raises what that raises."""
    before = signal.signal(signal.SIGINT, own_handler)
    try:
        envs = closing(ShmPoolVecEnv([Logged] * 3, n_workers=0))
        envs.reset()
        requests, envs._pool.requests = envs._pool.requests, None  # a request would fail here
        envs.timings.reset()
        assert envs.env_method("sigint_handler") == [own_handler] * 3
        assert envs.get_attr("ident", [2, 0]) == [None, None]
        timings = envs.timings
        assert timings.calls > 0 and timings.steps == 0
        envs._pool.requests = requests
        envs.step_async(np.zeros(3, dtype=np.int64))
        with pytest.raises(AlreadyPendingError):
            envs.get_attr("ident")
        envs.step_wait()
    finally:
        signal.signal(signal.SIGINT, before)
