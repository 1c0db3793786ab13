"""Async batches (``async_reset``/``send``/``recv``) against SyncVectorEnv, FIFO order, failures and misuse."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

import shmvec.engine.worker
from shmvec import ShmVectorEnv, StepStateError, StepTimeoutError, WorkerDiedError
from shmvec.errors import AlreadyPendingError, NoPendingCallError
from shmvec.gymnasium_1_1 import AutoresetMode
from tests.envs import make_mixed
from tests.faulty import Boom, env_fns
from tests.helpers import assert_same

MODES = list(AutoresetMode)
FACTORIES = {
    "CartPole": lambda: gym.make("CartPole-v1"),
    "Pendulum": lambda: gym.make("Pendulum-v1", max_episode_steps=40),
    "MixedDict": lambda: make_mixed(max_episode_steps=25),
}


def without_env_id(result):
    obs, rewards, terminations, truncations, infos = result
    infos = dict(infos)
    infos.pop("env_id")
    return obs, rewards, terminations, truncations, infos


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize("name", list(FACTORIES))
def test_full_batches_equal_reset_and_step(name, mode, closing):
    """batch_size == num_envs: async_reset + recv is reset(), send + recv is step(), bit for bit,
    also with step() calls between them (each episode end reported once, by the call that ended it)."""
    fn = FACTORIES[name]
    shm = closing(ShmVectorEnv([fn] * 5, 2, autoreset_mode=mode, start_method="fork"))
    ref = closing(SyncVectorEnv([fn] * 5, autoreset_mode=mode))
    shm.async_reset(seed=3)
    got = shm.recv()
    assert got[4]["env_id"].tolist() == list(range(5))
    want_obs, want_infos = ref.reset(seed=3)
    assert_same(got[0], want_obs, "reset obs")
    assert_same(without_env_id(got)[4], want_infos, "reset infos")
    ref.action_space.seed(3)
    ended_total = 0
    for t in range(150):
        actions = ref.action_space.sample()
        if t % 3 == 2:
            got = shm.step(actions)
        else:
            shm.send(actions)
            got = without_env_id(shm.recv())
        want = ref.step(actions)
        assert_same(got, want, f"step {t}")
        ended = want[2] | want[3]
        ended_total += int(ended.sum())
        if mode == AutoresetMode.DISABLED and ended.any():
            assert_same(shm.reset(options={"reset_mask": ended}), ref.reset(options={"reset_mask": ended}), "reset")
    assert ended_total > 0, "the run must cover episode ends"


def assert_rows(infos: dict, rows: int) -> None:
    """Every info array and mask has one row per env of the batch (nested dicts too)."""
    for key, value in infos.items():
        if isinstance(value, dict):
            assert_rows(value, rows)
        else:
            assert len(value) == rows, f"infos[{key!r}] has {len(value)} rows, the batch {rows}"


def policy(env_id: int, n: int, space: gym.Space):
    """A deterministic action for the n-th step of env ``env_id``."""
    space.seed(env_id * 100_003 + n)
    return space.sample()


AUTORESETTING = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


@pytest.mark.parametrize("mode", AUTORESETTING, ids=[m.name for m in AUTORESETTING])
@pytest.mark.parametrize("main_shard", [False, True], ids=["pool", "main_shard"])
@pytest.mark.parametrize("n_envs, n_workers, batch", [(7, 2, 3), (25, 12, 7)], ids=["2-workers", "12-workers"])
def test_small_batches_give_each_env_its_own_trajectory(mode, main_shard, n_envs, n_workers, batch, closing):
    """Whatever the batches, env i sees the same seeds and actions as in SyncVectorEnv, so the same results."""
    steps = 60
    fn = FACTORIES["MixedDict"]
    shm = closing(
        ShmVectorEnv(
            [fn] * n_envs,
            n_workers,
            autoreset_mode=mode,
            batch_size=batch,
            start_method="fork",
            use_main_process=main_shard,
        )
    )
    ref = closing(SyncVectorEnv([fn] * n_envs, autoreset_mode=mode))
    space = ref.single_action_space
    # The reference: every env steps in lockstep with its own action sequence.
    want: dict[int, list] = {i: [] for i in range(n_envs)}
    obs, _ = ref.reset(seed=11)
    for t in range(steps):
        actions = np.stack([policy(i, t, space) for i in range(n_envs)])
        obs, rewards, terms, truncs, infos = ref.step(actions)
        for i in range(n_envs):
            want[i].append((obs["position"][i].copy(), rewards[i], terms[i], truncs[i]))
    got: dict[int, list] = {i: [] for i in range(n_envs)}
    unseen_resets = set(range(n_envs))  # the first result of each env is its reset
    shm.async_reset(seed=11)
    env_ids = shm.recv()[4]["env_id"]
    unseen_resets -= set(env_ids.tolist())
    for _ in range(3 * n_envs * steps // batch):
        if min(len(results) for results in got.values()) >= steps:
            break
        shm.send(np.stack([policy(i, len(got[i]), space) for i in env_ids.tolist()]))
        obs, rewards, terms, truncs, infos = shm.recv()
        env_ids = infos["env_id"]
        assert len(rewards) == batch and len(set(env_ids.tolist())) == batch
        assert_rows(infos, batch)
        for row, i in enumerate(env_ids.tolist()):
            if i in unseen_resets:
                unseen_resets.discard(i)
            else:
                got[i].append((obs["position"][row].copy(), rewards[row], terms[row], truncs[row]))
    assert not unseen_resets
    for i in range(n_envs):
        assert len(got[i]) >= steps, f"env {i} starved: {len(got[i])} results"
        for t in range(steps):
            assert_same(got[i][t], want[i][t], f"env {i} step {t}")


def test_disabled_mode_resets_ended_envs_of_a_batch_while_the_others_run(closing):
    """DISABLED: ended envs are reset with async_reset(reset_mask) and come back through recv."""
    n_envs, batch, steps = 6, 2, 60
    fn = FACTORIES["MixedDict"]
    mode = AutoresetMode.DISABLED
    shm = closing(ShmVectorEnv([fn] * n_envs, 2, autoreset_mode=mode, batch_size=batch, start_method="fork"))
    ref = closing(SyncVectorEnv([fn] * n_envs, autoreset_mode=mode))
    space = ref.single_action_space
    want: dict[int, list] = {i: [] for i in range(n_envs)}
    ref.reset(seed=5)
    for t in range(steps):
        obs, rewards, terms, truncs, _ = ref.step(np.stack([policy(i, t, space) for i in range(n_envs)]))
        for i in range(n_envs):
            want[i].append(("step", obs["position"][i].copy(), rewards[i], terms[i], truncs[i]))
        ended = terms | truncs
        if ended.any():
            obs, _ = ref.reset(options={"reset_mask": ended})
            for i in np.flatnonzero(ended):
                want[i].append(("reset", obs["position"][i].copy()))
    got: dict[int, list] = {i: [] for i in range(n_envs)}
    steps_done = np.zeros(n_envs, int)
    resetting = set(range(n_envs))  # their next result is a reset
    shm.async_reset(seed=5)
    for _ in range(4 * n_envs * steps // batch):
        if steps_done.min() >= steps:
            break
        obs, rewards, terms, truncs, infos = shm.recv()
        ids = infos["env_id"]
        for row, i in enumerate(ids.tolist()):
            if i in resetting:
                resetting.discard(i)
                if steps_done[i]:  # not the first reset: the reference records it too
                    got[i].append(("reset", obs["position"][row].copy()))
            else:
                got[i].append(("step", obs["position"][row].copy(), rewards[row], terms[row], truncs[row]))
                steps_done[i] += 1
        ended = terms | truncs
        if ended.any():
            mask = np.zeros(n_envs, bool)
            mask[ids[ended]] = True
            shm.async_reset(options={"reset_mask": mask})
            resetting.update(ids[ended].tolist())
        go = ~ended
        if go.any():
            shm.send(np.stack([policy(i, int(steps_done[i]), space) for i in ids[go].tolist()]), ids[go])
    assert sum(entry[0] == "reset" for entries in want.values() for entry in entries) > 0
    for i in range(n_envs):
        n = min(len(got[i]), len(want[i]))
        assert n >= steps, f"env {i} starved: {len(got[i])} results"
        assert_same(got[i][:n], want[i][:n], f"env {i}")


class Paced(gym.Env):
    """Steps take ``delay`` seconds; env ``slow_env`` takes 20x longer."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index: int, slow_env: int = 0, delay: float = 0.002):
        self.index, self.delay = index, delay * (20 if index == slow_env else 1)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(self.delay)
        return np.full(1, self.index, np.float32), 1.0, False, False, {}


def paced_fns(n, **kwargs):
    return [lambda i=i: Paced(i, **kwargs) for i in range(n)]


def test_a_straggler_does_not_hold_up_the_others_and_is_not_starved(closing):
    envs = closing(ShmVectorEnv(paced_fns(4, slow_env=0), 2, batch_size=2, start_method="fork"))
    envs.async_reset()
    seen = []
    envs.recv()
    for _ in range(40):
        envs.send(np.zeros(2, np.int64))
        seen += envs.recv()[4]["env_id"].tolist()
    counts = np.bincount(seen, minlength=4)
    assert counts[0] >= 1, f"the slow env was never returned: {counts}"
    # env 1 shares worker 0 with the straggler, so it waits for it; envs 2, 3 (worker 1) must not
    assert counts[2:].min() > 3 * counts[0], f"fast envs waited for the slow one: {counts}"


def test_ready_envs_that_do_not_fit_come_back_first_next_time(closing):
    """FIFO across recvs: an env left over from one recv is at the front of the next."""
    envs = closing(ShmVectorEnv(paced_fns(4, slow_env=-1, delay=0.0), 2, batch_size=3, start_method="fork"))
    envs.async_reset()
    first = envs.recv()[4]["env_id"].tolist()
    (left,) = set(range(4)) - set(first)
    envs.send(np.zeros(3, np.int64))
    second = envs.recv()[4]["env_id"].tolist()
    assert second[0] == left, (first, second)


def test_misuse_says_what_to_do(closing):
    envs = closing(ShmVectorEnv(paced_fns(4, delay=0.0), 2, batch_size=2, start_method="fork"))
    with pytest.raises(NoPendingCallError, match="send\\(\\) actions"):
        envs.recv()
    with pytest.raises(NoPendingCallError, match="recv\\(\\) first"):
        envs.send(np.zeros(2, np.int64))
    with pytest.raises(StepStateError, match="use async_reset\\(\\), send\\(\\) and recv\\(\\)"):
        envs.step(np.zeros(4, np.int64))
    with pytest.raises(StepStateError, match="use async_reset"):
        envs.reset()
    envs.async_reset()
    ids = envs.recv()[4]["env_id"]
    envs.send(np.zeros(2, np.int64))
    with pytest.raises(AlreadyPendingError, match="have a send pending"):
        envs.send(np.zeros(2, np.int64), ids)
    held = envs.recv()[4]["env_id"]
    with pytest.raises(ValueError, match="must not repeat an env"):
        envs.send(np.zeros(2, np.int64), [held[0], held[0]])
    envs.send(np.zeros(2, np.int64), held)  # the refused sends changed nothing
    assert sorted(envs.recv()[4]["env_id"].tolist() + envs.recv()[4]["env_id"].tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="one action per env"):
        envs.send(np.zeros(3, np.int64), [0, 1])


def test_batch_size_is_checked(closing):
    with pytest.raises(ValueError, match="batch_size"):
        ShmVectorEnv(paced_fns(2), 1, batch_size=3, start_method="fork")


def test_env_error_names_the_env_and_the_pool_goes_on(closing):
    envs = closing(ShmVectorEnv(env_fns("step", at=1), 2, batch_size=2, start_method="fork"))
    envs.async_reset()
    deadline = time.monotonic() + 10  # raised by the first recv that finds its report
    with pytest.raises(Boom) as excinfo:
        while time.monotonic() < deadline:
            envs.recv()
            envs.send(np.zeros(2, np.int64))
    assert excinfo.value.env_index == 3
    assert "raised in env 3" in str(excinfo.value.__notes__)
    for _ in range(5):  # the other envs go on; env 3 is the caller's again, with no result
        assert 3 not in envs.recv()[4]["env_id"]
        envs.send(np.zeros(2, np.int64))


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])  # forkserver: its death is watched through a pidfd
def test_dead_worker_raises(closing, start_method):
    envs = closing(ShmVectorEnv(env_fns("exit", at=1), 2, batch_size=2, start_method=start_method))
    envs.async_reset()
    deadline = time.monotonic() + 10  # found at the first recv after its exit is visible
    with pytest.raises(WorkerDiedError, match="worker 1 \\(envs 2..3"):
        while time.monotonic() < deadline:
            envs.recv()
            envs.send(np.zeros(2, np.int64))


def test_dead_worker_restarts(closing, tmp_path):
    from tests.faulty import die_once_fns

    envs = closing(
        ShmVectorEnv(
            die_once_fns("exit", str(tmp_path / "died")),
            2,
            batch_size=4,
            start_method="fork",
            on_worker_failure="restart",
        )
    )
    envs.async_reset(seed=0)
    envs.recv()
    restarted = []
    with pytest.warns(RuntimeWarning, match="restarting it"):
        for _ in range(12):
            envs.send(np.zeros(4, np.int64))
            obs, rewards, terms, truncs, infos = envs.recv()
            if "shmvec_restarted" in infos:
                restarted += infos["env_id"][infos["_shmvec_restarted"]].tolist()
                assert truncs[infos["_shmvec_restarted"]].all()
    assert restarted, "the restart must be reported"


def test_timeout_raises(closing):
    envs = closing(ShmVectorEnv(env_fns("hang", at=1), 2, batch_size=4, start_method="fork"))
    envs.async_reset()
    envs.recv()
    envs.send(np.zeros(4, np.int64))
    with pytest.raises(StepTimeoutError, match="envs .*3 did not answer within timeout=0.5s"):
        envs.recv(timeout=0.5)


def test_close_with_sends_in_flight_is_prompt(closing):
    envs = ShmVectorEnv(paced_fns(4, delay=0.3), 2, batch_size=2, start_method="fork")
    envs.async_reset()
    envs.recv()
    envs.send(np.zeros(2, np.int64))
    start = time.monotonic()
    envs.close()
    assert time.monotonic() - start < 5


def test_a_request_posted_while_a_worker_finishes_its_sends_runs_once(closing, monkeypatch):
    """Regression: a worker must not pair a new command with the seq of the wake-up it is serving.

    The worker used to read the seq, run its sends, then read the command: a reset posted
    while it was still in its sends (once all of them were published) was run under the
    SEND's seq and again under its own, and the second time the worker waited forever on
    the pipe for a request that never came. Being descheduled at that point is rare; the
    sleep (inherited through fork) makes it certain.
    """
    run_sends = shmvec.engine.worker._Sends.run

    def descheduled_after_sends(self, sent):
        published = self.published
        run_sends(self, sent)
        if self.published > published:  # after publishing: the main process goes on meanwhile
            time.sleep(0.05)

    monkeypatch.setattr(shmvec.engine.worker._Sends, "run", descheduled_after_sends)
    envs = closing(ShmVectorEnv([FACTORIES["CartPole"]] * 2, 1, start_method="fork"))
    envs.reset(seed=0)
    for _ in range(3):
        envs.send(np.zeros(2, dtype=np.int64), np.arange(2))
        envs.recv(timeout=5)
        envs.reset()  # posted while the worker sleeps after its sends


class InfoAfterDelay(gym.Wrapper):
    """CartPole whose steps take ``delay`` seconds and return a non-empty info (sent on the pipe)."""

    def __init__(self, delay: float):
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "slow": True}


def test_an_async_reset_reply_is_not_mistaken_for_a_send_result_before_it(closing):
    """Regression: a send's info reaching the pipe ahead of an async reset's reply is kept for recv.

    Env 1's step (in flight, with an info) finishes before the worker runs the reset of
    env 0, so its info is on the pipe first; the reset's wait used to take it as its reply.
    """
    fns = [lambda: InfoAfterDelay(0.0), lambda: InfoAfterDelay(0.05)]
    envs = closing(ShmVectorEnv(fns, 1, batch_size=1, autoreset_mode=AutoresetMode.DISABLED, start_method="fork"))
    envs.async_reset(seed=0)
    assert [envs.recv()[4]["env_id"][0] for _ in range(2)] == [0, 1]
    envs.send(np.zeros(1, dtype=np.int64), np.array([1]))
    envs.async_reset(options={"reset_mask": np.array([True, False])})
    results = {}
    for _ in range(2):
        obs, rewards, terminations, truncations, infos = envs.recv(timeout=5)
        results[int(infos["env_id"][0])] = (rewards[0], dict(infos))
    assert results[0][0] == 0.0 and "slow" not in results[0][1], "env 0: its reset"
    assert results[1][0] == 1.0 and results[1][1]["slow"].tolist() == [True], "env 1: its step, with its info"


def test_the_automatic_plan_runs_async_batches_in_workers_and_says_why(closing):
    envs = closing(ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, batch_size=2, start_method="fork"))
    assert envs.n_workers >= 1 and "use_main_process=False" in repr(envs)
    assert "async batches of 2: the workers step one while the caller works on another" in repr(envs)
    synchronous = closing(ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, start_method="fork"))
    assert "predicted" in repr(synchronous) and "async" not in repr(synchronous)
