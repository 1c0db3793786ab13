"""``ShmPoolVecEnv(copy=False)``: observations returned in place, from double-buffered rows.

The rule under test (the docstring's): an observation returned by ``step()`` or
``reset()`` keeps its values through the next step and is overwritten by the one after.
Learning with it is checked bit for bit in ``test_sb3_learn.py``.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

from tests.envs import ImageObsEnv, TupleObsEnv, make_mixed
from tests.helpers import assert_same
from tests.sb3_compare import make_pair, sample_actions

ENVS = {
    "cartpole": lambda: gym.make("CartPole-v1"),
    "mixed_dict": make_mixed,
    "tuple": TupleObsEnv,
    "image": ImageObsEnv,
}
LAYOUTS = {  # how the envs run: the main shard writes the buffers too
    "workers": {"n_workers": 2},
    "main_shard": {"n_workers": 1, "use_main_process": True},
    "in_process": {"n_workers": 0, "use_main_process": True},
}


def leaves(obs) -> list[np.ndarray]:
    if isinstance(obs, dict):
        return list(obs.values())
    return list(obs) if isinstance(obs, tuple) else [obs]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(ENVS))
def test_zero_copy_equals_dummy_and_each_obs_lives_through_the_next_step(name, layout, closing):
    n_envs = 5
    shm, dummy = make_pair([ENVS[name]] * n_envs, closing=closing, copy=False, **LAYOUTS[layout])
    shm.seed(3)
    dummy.seed(3)
    dummy.action_space.seed(3)
    returned = [shm.reset()]  # every observation returned, and its values when it was returned
    saved = [copy.deepcopy(returned[0])]
    assert_same(returned[0], dummy.reset(), "reset")
    ends = 0
    for t in range(120):
        actions = sample_actions(dummy.action_space, n_envs)
        out = shm.step(actions)
        want = dummy.step(actions)
        assert_same(out, want, f"step {t}")
        ends += int(want[2].sum())
        returned.append(out[0])
        saved.append(copy.deepcopy(out[0]))
        assert_same(returned[-2], saved[-2], f"step {t} changed the observation of the call before it")
        if len(returned) >= 3:
            for older, newer in zip(leaves(returned[-3]), leaves(out[0])):
                assert np.shares_memory(older, newer), "zero-copy: the call after next reuses the rows"
            for prev, newer in zip(leaves(returned[-2]), leaves(out[0])):
                assert not np.shares_memory(prev, newer), "consecutive calls use different buffers"
    assert ends > 0, "the run must cover episode ends (terminal_observation from the shared rows)"


def test_reset_also_turns_the_buffer_and_copy_true_never_shares(closing):
    zero, _ = make_pair([ENVS["cartpole"]] * 3, 2, closing, copy=False)
    copying, _ = make_pair([ENVS["cartpole"]] * 3, 2, closing)
    for env in (zero, copying):
        env.seed(0)
    first, again = zero.reset(), zero.reset()
    assert not np.shares_memory(first, again), "a full reset writes the other buffer"
    kept = again.copy()
    zero.step(np.zeros(3, dtype=np.int64))
    assert_same(again, kept, "the reset observation lives through the next step")
    obs = [copying.reset()] + [copying.step(np.zeros(3, dtype=np.int64))[0] for _ in range(3)]
    assert not any(np.shares_memory(a, b) for a in obs for b in obs if a is not b)
