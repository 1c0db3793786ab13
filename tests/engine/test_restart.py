"""Issue 4, optional recovery: ``on_worker_failure="restart"``.

A worker that dies is re-created from its env_fns; its envs report that step as a
truncation flagged ``shmvec_restarted`` and the run goes on. Every other env must give
exactly what the reference (DummyVecEnv / SyncVectorEnv over envs that never die) gives
for it with the same seeds and actions. ``no_leaks`` (conftest) checks that the dead
workers were reaped and nothing was left in /dev/shm.

Layout of every test: 4 envs in 2 workers; worker 1 holds envs 2 and 3, and env 3
(``faulty.BAD``) kills its process at its 5th step, once (a marker file keeps the
rebuilt env alive).
"""

from __future__ import annotations

import os
import signal
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from shmvec import ResetNeededError, ShmPoolVecEnv, ShmVectorEnv, WorkerDiedError
from shmvec.gymnasium_1_1 import AutoresetMode
from tests.faulty import N_ENVS, N_WORKERS, die_once_fns, env_fns
from tests.helpers import assert_same, env_pids, gone

AT = 5  # env 3 dies inside its 5th step: the step with index AT - 1
LATE = 60  # ... or inside its 60th, after the end of an episode (with these seeds and actions)
STEPS = 150
DEAD, KEPT = [2, 3], [0, 1]  # worker 1's envs, worker 0's
HOW = {"exit": "exit code 3", "sigkill": "signal SIGKILL"}
RESTART = {"on_worker_failure": "restart"}


@pytest.fixture
def marker(tmp_path):
    return str(tmp_path / "died")


def make_actions(steps: int = STEPS) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 2, (steps, N_ENVS))


def sb3_pair(closing, fns, **kwargs):
    env = closing(ShmPoolVecEnv(fns, N_WORKERS, **kwargs))
    ref = closing(DummyVecEnv([lambda: gym.make("CartPole-v1")] * N_ENVS))
    env.seed(0)
    ref.seed(0)
    assert_same(env.reset(), ref.reset())
    return env, ref


def gym_pair(closing, fns, mode=AutoresetMode.NEXT_STEP, **kwargs):
    env = closing(ShmVectorEnv(fns, N_WORKERS, autoreset_mode=mode, **kwargs))
    ref = closing(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N_ENVS, autoreset_mode=mode))
    assert_same(env.reset(seed=0), ref.reset(seed=0))
    return env, ref


def env_info(infos: dict, i: int) -> dict:
    """Env i's info out of Gymnasium's dict of arrays with ``_key`` masks."""
    return {
        key: env_info(value, i) if isinstance(value, dict) else value[i]
        for key, value in infos.items()
        if not key.startswith("_") and infos[f"_{key}"][i]
    }


def is_reset_obs(row: np.ndarray) -> bool:
    """CartPole starts every episode with all four values in [-0.05, 0.05]."""
    return row.shape == (4,) and bool(np.all(np.abs(row) <= 0.05))


def step_sb3(env, ref, action, kept=KEPT):
    """Step both; assert the kept envs match the reference; return ours."""
    obs, rewards, dones, infos = env.step(action)
    r_obs, r_rewards, r_dones, r_infos = ref.step(action)
    assert_same(obs[kept], r_obs[kept])
    assert_same(rewards[kept], r_rewards[kept])
    assert_same(dones[kept], r_dones[kept])
    for i in kept:
        assert_same(infos[i], r_infos[i], f"infos[{i}]")
    return obs, rewards, dones, infos


def step_gym(env, ref, action, kept=KEPT):
    """Step both; assert the kept envs match the reference; return ours."""
    obs, rewards, terms, truncs, infos = out = env.step(action)
    r_obs, r_rewards, r_terms, r_truncs, r_infos = ref.step(action)
    for got, want in [(obs, r_obs), (rewards, r_rewards), (terms, r_terms), (truncs, r_truncs)]:
        assert_same(got[kept], want[kept])
    for i in kept:
        assert_same(env_info(infos, i), env_info(r_infos, i), f"infos of env {i}")
    return out


def restart_warning(worker: int, envs: str, pid: int, how: str) -> str:
    return (
        rf"worker {worker} \(envs {envs}, pid {pid}\) died with {how}[^;]*; "
        r"restarting it \(restart 1 of max_restarts=3\)"
    )


# -- a worker dies inside a step ------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "how, at, copy", [("exit", AT, True), ("sigkill", AT, True), ("exit", LATE, True), ("exit", AT + 1, False)]
)
def test_sb3_restart_truncates_dead_envs_and_keeps_the_others(closing, marker, how, at, copy):
    """``copy=False``: the new worker writes its reset observations into the step's buffer
    (at AT + 1 that is buffer 1, the one a worker starting afresh would not pick by itself)."""
    env, ref = sb3_pair(closing, die_once_fns(how, marker, at=at), start_method="fork", copy=copy, **RESTART)
    old = env_pids(env)
    actions = make_actions()
    ended = False
    for t in range(at - 1):
        ended |= bool(step_sb3(env, ref, actions[t])[2][3])
    assert ended == (at == LATE)  # LATE: env 3 ended an episode before dying
    with pytest.warns(RuntimeWarning, match=restart_warning(1, "2..3", old[3], HOW[how])):
        obs, rewards, dones, infos = step_sb3(env, ref, actions[at - 1])
    for i in DEAD:
        assert dones[i] and rewards[i] == 0.0
        assert infos[i] == {"shmvec_restarted": True, "TimeLimit.truncated": True}  # no terminal_observation
        assert is_reset_obs(obs[i])
        assert env.reset_infos[i] == {}  # CartPole's reset info
    new = env_pids(env)
    assert new[:2] == old[:2] and new[2] == new[3] != old[3]
    assert gone(old[3]) and env.get_attr("resets", DEAD) == [1, 1]
    for t in range(at, STEPS):  # and on, the kept envs still exactly as the reference
        obs, rewards, dones, infos = step_sb3(env, ref, actions[t])
        assert not any("shmvec_restarted" in info for info in infos)
    assert env._pool.restarter.count == 1


@pytest.mark.timeout(60)
def test_infos_in_shared_rows_come_from_the_restarted_worker_after_a_restart(closing, marker):
    """The new worker's schema codes mean other key sets than the dead one's: the main process
    must learn them anew (here its first schema has the key "rebuilt", the old one's "t")."""
    fns = die_once_fns("exit", marker, at=AT, infos=True)
    env = closing(ShmPoolVecEnv(fns, N_WORKERS, start_method="fork", **RESTART))
    env.reset()
    for t in range(1, AT):
        infos = env.step(np.zeros(N_ENVS, np.int64))[3]
        assert_same([info["t"] for info in infos], [np.float64(t)] * N_ENVS)
    assert np.count_nonzero(env._pool.info_reader.codes) == N_ENVS  # they come through the rows
    with pytest.warns(RuntimeWarning, match="restarting it"):
        env.step(np.zeros(N_ENVS, np.int64))
    for t in range(1, 4):  # (an env whose episode ends has its info, and more, through the pipe)
        _, _, dones, infos = env.step(np.full(N_ENVS, t % 2))
        assert_same([info.get("t") for info in infos], [np.float64(AT + t)] * len(KEPT) + [None] * len(DEAD))
        assert_same([info.get("rebuilt") for info in infos], [None] * len(KEPT) + [np.float64(t)] * len(DEAD))
    assert np.count_nonzero(env._pool.info_reader.codes[DEAD]) == np.count_nonzero(~dones[DEAD])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "mode, how, at",
    [(mode, how, AT) for mode in [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP] for how in HOW]
    + [(AutoresetMode.SAME_STEP, "exit", LATE)],
)
@pytest.mark.vector_api
def test_gym_restart_truncates_dead_envs_and_keeps_the_others(closing, marker, mode, how, at):
    env, ref = gym_pair(closing, die_once_fns(how, marker, at=at), mode, start_method="fork", **RESTART)
    old = env_pids(env)
    actions = make_actions()
    ended = False
    for t in range(at - 1):
        out = step_gym(env, ref, actions[t])
        ended |= bool(out[2][3] or out[3][3])
    assert ended == (at == LATE)
    with pytest.warns(RuntimeWarning, match=restart_warning(1, "2..3", old[3], HOW[how])):
        obs, rewards, terms, truncs, infos = step_gym(env, ref, actions[at - 1])
    assert_same(infos["shmvec_restarted"][DEAD], np.array([True, True]))
    assert_same(infos["_shmvec_restarted"], np.array([False, False, True, True]))
    assert "_final_obs" not in infos or not infos["_final_obs"][DEAD].any()  # the last obs is lost
    assert_same(rewards[DEAD], np.zeros(2))
    assert_same(terms[DEAD], np.array([False, False]))
    assert_same(truncs[DEAD], np.array([True, True]))
    assert all(is_reset_obs(obs[i]) for i in DEAD)
    assert env.call("resets")[2:] == (1, 1)

    # The next step: NEXT_STEP treats it as the autoreset step after a truncation (reset
    # again, actions ignored, reward 0); SAME_STEP steps the fresh episode.
    obs, rewards, terms, truncs, infos = step_gym(env, ref, actions[at])
    assert "shmvec_restarted" not in infos
    assert not terms[DEAD].any() and not truncs[DEAD].any()
    if mode == AutoresetMode.NEXT_STEP:
        assert env.call("resets")[2:] == (2, 2)
        assert_same(rewards[DEAD], np.zeros(2))
        assert all(is_reset_obs(obs[i]) for i in DEAD)
    else:
        assert env.call("resets")[2:] == (1, 1)
        assert_same(rewards[DEAD], np.ones(2))
    for t in range(at + 1, STEPS):
        obs, rewards, terms, truncs, infos = step_gym(env, ref, actions[t])
        assert "shmvec_restarted" not in infos
    assert env_pids(env)[:2] == old[:2] and gone(old[3])


@pytest.mark.timeout(60)
def test_gym_disabled_mode_restarted_envs_need_a_reset(closing, marker):
    env = closing(
        ShmVectorEnv(
            die_once_fns("exit", marker, at=AT), N_WORKERS, autoreset_mode="Disabled", start_method="fork", **RESTART
        )
    )
    env.reset(seed=0)
    zeros = np.zeros(N_ENVS, dtype=np.int64)
    for _ in range(AT - 1):
        env.step(zeros)
    with pytest.warns(RuntimeWarning, match="restarting it"):
        *_, truncs, infos = env.step(zeros)
    assert_same(truncs, np.array([False, False, True, True]))
    assert_same(infos["_shmvec_restarted"], np.array([False, False, True, True]))
    with pytest.raises(ResetNeededError, match=r"envs \[2, 3\]"):
        env.step(zeros)
    env.reset(options={"reset_mask": truncs})
    for _ in range(5):
        env.step(zeros)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
@pytest.mark.vector_api
def test_restart_under_forkserver_and_spawn(closing, marker, start_method):
    env, ref = gym_pair(closing, die_once_fns("sigkill", marker, at=AT), start_method=start_method, **RESTART)
    old = env_pids(env)
    actions = make_actions(AT + 20)
    for t in range(AT - 1):
        step_gym(env, ref, actions[t])
    with pytest.warns(RuntimeWarning, match=restart_warning(1, "2..3", old[3], HOW["sigkill"])):
        *_, truncs, infos = step_gym(env, ref, actions[AT - 1])
    assert_same(truncs, np.array([False, False, True, True]))
    assert_same(infos["_shmvec_restarted"], np.array([False, False, True, True]))
    for t in range(AT, AT + 20):
        step_gym(env, ref, actions[t])
    assert env_pids(env)[2] != old[3]


# -- a worker dies while idle -----------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ["sb3", "gym"])
def test_worker_dying_while_idle_is_restarted_at_the_next_step(closing, marker, adapter):
    pair, step = (sb3_pair, step_sb3) if adapter == "sb3" else (gym_pair, step_gym)
    env, ref = pair(closing, die_once_fns(None, marker), start_method="fork", **RESTART)
    actions = make_actions(30)
    step(env, ref, actions[0], kept=list(range(N_ENVS)))
    old = env_pids(env)
    os.kill(old[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not gone(old[0]) and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.warns(RuntimeWarning, match=restart_warning(0, "0..1", old[0], HOW["sigkill"])):
        out = step(env, ref, actions[1], kept=DEAD)  # now worker 1's envs are the kept ones
    if adapter == "sb3":
        assert [info.get("shmvec_restarted", False) for info in out[3]] == [True, True, False, False]
        assert list(out[2]) == [True, True, False, False]
    else:
        assert_same(out[4]["_shmvec_restarted"], np.array([True, True, False, False]))
        assert_same(out[3], np.array([True, True, False, False]))
    for t in range(2, 30):
        step(env, ref, actions[t], kept=DEAD)
    assert env_pids(env)[0] != old[0]


def test_async_sends_after_a_restart_in_a_step_step_exactly_the_envs_sent(closing, marker):
    """A worker re-created in a synchronous step counts its inbox from 0, and so does the link.

    The main process's inbox count used to outlive such a restart: the new worker then
    stepped the old slots too (envs 2 and 3 stepped three times by one send).
    """
    env = closing(
        ShmVectorEnv(die_once_fns("exit", marker), N_WORKERS, batch_size=N_ENVS, start_method="fork", **RESTART)
    )
    actions = np.zeros(N_ENVS, np.int64)
    env.async_reset(seed=0)
    env.recv(timeout=5)
    for _ in range(2):  # the inbox counts move on
        env.send(actions)
        env.recv(timeout=5)
    for _ in range(2):
        env.step(actions)
    with pytest.warns(RuntimeWarning, match="restarting it"):
        env.step(actions)  # env 3's 5th step: it dies
    env.step(actions)  # NEXT_STEP: the rebuilt envs reset
    assert env.call("t") == (6, 6, 0, 0)
    for n in range(1, 4):
        env.send(actions)
        env.recv(timeout=5)
        assert env.call("t") == (6 + n, 6 + n, n, n)


# -- the bound, the default, the rest ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ["sb3", "gym"])
def test_max_restarts_bounds_the_restarts(closing, adapter):
    cls = ShmPoolVecEnv if adapter == "sb3" else ShmVectorEnv
    # env 3 os._exits at its 2nd step, and so does each rebuilt env 3.
    env = closing(cls(env_fns("exit", at=2), N_WORKERS, start_method="fork", max_restarts=2, **RESTART))
    env.reset()
    zeros = np.zeros(N_ENVS, dtype=np.int64)
    restarts = 0
    with pytest.raises(WorkerDiedError) as excinfo:
        for _ in range(20):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                env.step(zeros)
            restarts += sum("restarting it" in str(w.message) for w in caught)
    assert restarts == 2
    message = str(excinfo.value)
    assert "worker 1 (envs 2..3, pid" in message and "died with exit code 3" in message
    assert "no restart left (max_restarts=2 used up)" in message
    with pytest.raises(WorkerDiedError, match="unusable: worker 1"):  # and stays broken
        env.step(zeros)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("adapter", ["sb3", "gym"])
def test_default_still_raises(closing, marker, adapter):
    pair, step = (sb3_pair, step_sb3) if adapter == "sb3" else (gym_pair, step_gym)
    env, ref = pair(closing, die_once_fns("exit", marker, at=2), start_method="fork")
    actions = make_actions(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no restart warning
        step(env, ref, actions[0])
        with pytest.raises(WorkerDiedError, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code 3; close"):
            step(env, ref, actions[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exited", [False, True], ids=["dying", "exited"])
def test_death_during_a_rare_call_raises_even_in_restart_mode(closing, marker, exited):
    """``exited``: the worker is gone before the call, whose request then meets a broken pipe."""
    env = closing(ShmVectorEnv(die_once_fns(None, marker), N_WORKERS, start_method="fork", **RESTART))
    env.reset(seed=0)
    pid = env_pids(env)[0]
    os.kill(pid, signal.SIGKILL)
    if exited:
        env._pool.links[0].process.join(5)
    with pytest.raises(WorkerDiedError, match=rf"worker 0 \(envs 0..1, pid {pid}\) died with signal SIGKILL"):
        env.call("pid")


@pytest.mark.timeout(60)
def test_bad_options_are_rejected():
    fns = die_once_fns(None, "")
    with pytest.raises(ValueError, match="on_worker_failure"):
        ShmVectorEnv(fns, N_WORKERS, on_worker_failure="retry")
    with pytest.raises(ValueError, match="max_restarts"):
        ShmPoolVecEnv(fns, N_WORKERS, max_restarts=-1)
