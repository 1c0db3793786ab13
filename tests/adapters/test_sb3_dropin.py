"""ShmPoolVecEnv takes what SubprocVecEnv takes, to the letter (issue #8).

Dict and Tuple action spaces (nested too), passed as SB3's DummyVecEnv and SubprocVecEnv
take them, one action per env, give bit for bit what DummyVecEnv gives, on uneven shards
and with ``main_shard``; malformed batches fail with an error that says what is expected
and change nothing; an unknown start method fails with SubprocVecEnv's own ValueError.
These are the cases where SB3's upstream ``tests/test_vec_envs.py`` failed against shmvec.
"""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.vec_env import SubprocVecEnv, VecEnv

from shmvec import ShmPoolVecEnv
from shmvec.adapters import dropin_args
from shmvec.errors import InvalidActionError
from tests.adapters import start_probe
from tests.envs import TupleActionEnv, make_dict_action
from tests.helpers import assert_same
from tests.sb3_compare import check_step, make_pair

N_ENVS = 5
STEPS = 300
ENVS = {"dict_action": make_dict_action, "tuple_action": TupleActionEnv}
# (n_workers, main_shard): 5 envs as shards of 3+2, and of 2+2 in workers plus 1 in the main process
LAYOUTS = [(2, False), (2, True)]


def per_env_actions(space: spaces.Space, n_envs: int, step: int) -> list[Any]:
    """One sampled action per env. On odd steps dicts list their keys in reverse and tuples
    come as lists: DummyVecEnv hands both to the env as they are, so both must work."""
    actions = [space.sample() for _ in range(n_envs)]
    return actions if step % 2 == 0 else [_reshuffled(action) for action in actions]


def _reshuffled(action: Any) -> Any:
    if isinstance(action, dict):
        return {key: _reshuffled(action[key]) for key in reversed(list(action))}
    if isinstance(action, tuple):
        return [_reshuffled(part) for part in action]
    return action


def start_both(shm: VecEnv, dummy: VecEnv, seed: int) -> Any:
    """Seed and reset both, compare; return DummyVecEnv's first observation."""
    assert shm.seed(seed) == dummy.seed(seed)
    dummy.action_space.seed(seed)
    want = dummy.reset()
    assert_same(shm.reset(), want, "reset obs")
    assert_same(shm.reset_infos, dummy.reset_infos, "reset_infos")
    return want


def step_both(shm: VecEnv, dummy: VecEnv, step: int, via_async: bool = False) -> tuple:
    """Step both with the same fresh actions, compare everything; return DummyVecEnv's result and the actions."""
    actions = per_env_actions(dummy.action_space, dummy.num_envs, step)
    if via_async:
        shm.step_async(copy.deepcopy(actions))
        got = shm.step_wait()
    else:
        got = shm.step(copy.deepcopy(actions))
    want = dummy.step(copy.deepcopy(actions))
    check_step(got, want, step)
    assert_same(shm.reset_infos, dummy.reset_infos, f"step {step} reset_infos")
    return want, actions


def count_ends(counts: dict[str, int], dones: np.ndarray, infos: list[dict]) -> None:
    for done, info in zip(dones, infos):
        if done:
            counts["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
        if "action" in info:
            counts["echoed"] += 1


@pytest.mark.parametrize("n_workers,main_shard", LAYOUTS, ids=["K2", "K2-main_shard"])
@pytest.mark.parametrize("name", list(ENVS))
def test_structured_actions_equal_dummy(name, n_workers, main_shard, closing):
    shm, dummy = make_pair([ENVS[name]] * N_ENVS, n_workers, closing, use_main_process=main_shard)
    start_both(shm, dummy, seed=7)
    counts = {"terminated": 0, "truncated": 0, "echoed": 0}
    for step in range(STEPS):
        (_, _, dones, infos), _ = step_both(shm, dummy, step, via_async=step % 3 == 0)
        count_ends(counts, dones, infos)
    # The run must have crossed both kinds of episode end, and the envs must have echoed
    # the actions they got (compared inside the infos) many times.
    assert counts["terminated"] > 0 and counts["truncated"] > 0, counts
    assert counts["echoed"] > 100, counts


def test_subprocvecenv_gives_the_same(closing):
    """The reference SubprocVecEnv, on the same actions, agrees with both (up to its own
    float64 rewards and tuple infos, which the comparison normalizes)."""
    env_fns = [make_dict_action] * N_ENVS
    shm, dummy = make_pair(env_fns, 2, closing)
    subproc = closing(SubprocVecEnv(env_fns, start_method="fork"))
    first_obs = start_both(shm, dummy, seed=3)
    subproc.seed(3)
    assert_same(subproc.reset(), first_obs, "subproc reset obs")
    for step in range(150):
        (want_obs, want_rewards, want_dones, want_infos), actions = step_both(shm, dummy, step)
        obs, rewards, dones, infos = subproc.step(copy.deepcopy(actions))
        assert_same(obs, want_obs, f"subproc step {step} obs")
        assert_same(rewards.astype(np.float32), want_rewards, f"subproc step {step} rewards")
        assert_same(dones, want_dones, f"subproc step {step} dones")
        assert_same(list(infos), want_infos, f"subproc step {step} infos")


# Ways to spoil a good batch of DictActionEnv actions (each returns the bad batch), and
# what the error must say.
def _drop_last(actions):
    return actions[:-1]


def _as_columns(actions):  # the batched form of gymnasium's vector envs; DummyVecEnv cannot index it
    return {key: np.stack([np.asarray(action[key]) for action in actions]) for key in ("gear", "move")}


def _missing_key(actions):
    del actions[2]["gear"]
    return actions


def _unknown_key(actions):
    actions[4]["brake"] = 1
    return actions


def _short_tuple(actions):
    actions[1]["aux"] = actions[1]["aux"][:1]
    return actions


def _not_a_dict(actions):
    actions[0] = [1, 2]
    return actions


def _ragged_leaf(actions):
    actions[3]["move"] = np.zeros(3, np.float32)
    return actions


def _float_for_discrete(actions):
    actions[2]["gear"] = 0.5
    return actions


BAD_BATCHES = {
    "four_actions": (_drop_last, r"^expected 5 actions \(one per env, each an element of Dict\("),
    "columns": (_as_columns, r"^expected a list of 5 actions, one per env, .* got a dict with keys \['gear', 'move'\]"),
    "missing_key": (
        _missing_key,
        r"^actions\[2\] misses key\(s\) \['gear'\]; expected exactly the keys \['aux', 'gear', 'move'\]",
    ),
    "unknown_key": (_unknown_key, r"^actions\[4\] has unknown key\(s\) \['brake'\]; expected exactly the keys"),
    "short_tuple": (_short_tuple, r"^actions\[1\]\['aux'\] has 1 elements, expected 2 \(Tuple\("),
    "not_a_dict": (_not_a_dict, r"^actions\[0\] is a list, expected a dict with keys \['aux', 'gear', 'move'\]"),
    "ragged_leaf": (_ragged_leaf, r"^expected actions at \('move',\) of shape \(5, 2\) .* do not form one array"),
    "float_for_discrete": (_float_for_discrete, r"^actions at \('gear',\) of dtype float64 are not of the kind"),
}


@pytest.mark.parametrize("spoil,message", BAD_BATCHES.values(), ids=list(BAD_BATCHES))
def test_malformed_batch_says_what_is_expected_and_changes_nothing(spoil, message, closing):
    shm, dummy = make_pair([make_dict_action] * N_ENVS, 2, closing)
    start_both(shm, dummy, seed=11)
    for step in range(3):
        step_both(shm, dummy, step)
    bad = spoil(per_env_actions(shm.action_space, N_ENVS, step=0))
    with pytest.raises(InvalidActionError, match=message):
        shm.step(bad)
    for step in range(3, 40):  # no step started, no action written: still in lockstep
        step_both(shm, dummy, step)


def test_tuple_action_of_the_wrong_kind(closing):
    shm = closing(ShmPoolVecEnv([TupleActionEnv] * 3, n_workers=2, start_method="fork"))
    shm.reset()
    actions = [shm.action_space.sample() for _ in range(3)]
    actions[1] = {"direction": 1}
    with pytest.raises(InvalidActionError, match=r"^actions\[1\] is a dict, expected a tuple of 3 actions \(Tuple\("):
        shm.step(actions)


def test_unknown_start_method_raises_what_subprocvecenv_raises():
    with pytest.raises(ValueError) as want:
        SubprocVecEnv([make_dict_action], start_method="illegal_method")
    with pytest.raises(ValueError) as got:
        ShmPoolVecEnv([make_dict_action], start_method="illegal_method")
    assert str(want.value) == "cannot find context for 'illegal_method'"
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_start_method_second_as_subprocvecenv_takes_it(start_method, monkeypatch, closing):
    """``SubprocVecEnv(env_fns, "spawn")`` -> ``ShmPoolVecEnv(env_fns, "spawn")``: what an env sees of
    the parent's state under each start method is what it sees under SubprocVecEnv."""
    monkeypatch.setattr(start_probe, "STATE", "set by the test")
    fns = [start_probe.ProbeEnv] * 2
    ref = closing(SubprocVecEnv(fns, start_method))
    shm = closing(ShmPoolVecEnv(fns, start_method, use_main_process=False))  # every env in a worker
    want = ["set by the test" if start_method == "fork" else "imported"] * 2
    assert ref.get_attr("state") == want and shm.get_attr("state") == want
    assert shm._pool.options.start_method == start_method


def test_a_string_second_is_a_start_method_and_one_given_twice_is_a_type_error():
    for second, keyword in [("spawn", "fork"), ("spawn", "spawn"), ("spawn", None)]:
        with pytest.raises(TypeError, match="multiple values for argument 'start_method'"):
            SubprocVecEnv([make_dict_action], second, start_method=keyword)
        with pytest.raises(TypeError, match=r"^ShmPoolVecEnv\(\) got multiple values for argument 'start_method' \("):
            ShmPoolVecEnv([make_dict_action], second, start_method=keyword)
    with pytest.raises(ValueError) as want:
        SubprocVecEnv([make_dict_action], "illegal_method")
    with pytest.raises(ValueError) as got:
        ShmPoolVecEnv([make_dict_action], "illegal_method")
    assert str(got.value) == str(want.value)


# How SubprocVecEnv(env_fns, ...) takes its start_method: not at all, by position, by keyword, or both.
# None second and a start_method keyword is left out: None there is ShmPoolVecEnv's own n_workers.
SUBPROC_CALLS = [((), {})]
SUBPROC_CALLS += [((method,), {}) for method in (None, "fork", "forkserver", "spawn", np.str_("spawn"))]
SUBPROC_CALLS += [((), {"start_method": method}) for method in (None, "fork", "spawn")]
SUBPROC_CALLS += [(("spawn",), {"start_method": method}) for method in (None, "fork", "spawn")]


@pytest.mark.parametrize("args, kwargs", SUBPROC_CALLS)
def test_every_call_subprocvecenv_takes_binds_its_start_method_as_there(args, kwargs):
    """Pure: ShmPoolVecEnv's signature and its reading of the second argument bind what
    ``inspect.signature(SubprocVecEnv).bind`` binds, or raise its TypeError."""
    fns = [make_dict_action]
    try:
        theirs = inspect.signature(SubprocVecEnv).bind(fns, *args, **kwargs)
    except TypeError as exc:
        bound = inspect.signature(ShmPoolVecEnv).bind(fns, *args, **kwargs).arguments
        with pytest.raises(TypeError, match=re.escape(str(exc))):
            dropin_args.subproc_vec_env("ShmPoolVecEnv", bound["n_workers"], bound["start_method"])
        return
    theirs.apply_defaults()
    ours = inspect.signature(ShmPoolVecEnv).bind(fns, *args, **kwargs)
    ours.apply_defaults()
    n_workers, start_method = dropin_args.subproc_vec_env(
        "ShmPoolVecEnv", ours.arguments["n_workers"], ours.arguments["start_method"]
    )
    assert n_workers is None
    assert start_method is theirs.arguments["start_method"]
