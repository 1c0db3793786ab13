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
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ShmPoolVecEnv, ShmVectorEnv


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
