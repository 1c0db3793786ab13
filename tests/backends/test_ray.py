"""backend="ray": shards on (simulated) Ray nodes behave as the local pool, bit for bit.

One 2-node cluster (1 CPU each) serves the whole module: it takes ~5 s to start on a
2-core machine. Every Ray daemon binds 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0,
set before Ray starts). Tests use ``n_workers=1`` (one worker per node) and fork.
"""

from __future__ import annotations

import functools
import itertools
import os
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray starts: its daemons bind 127.0.0.1

import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector.utils import batch_space, iterate

from shmvec import ShmPoolVecEnv, ShmVectorEnv
from shmvec.backends import ray as ray_backend
from shmvec.errors import RemoteTraceback, StepTimeoutError, WorkerDiedError
from tests.envs import ActionProbeEnv, cartpole
from tests.faulty import Boom, env_fns
from tests.helpers import REPO, assert_same, gone, poll_until, shm_of
from tests.ipc.test_action_dtypes import SPACES, batches, probe
from tests.sb3_compare import run_equivalence

ray = pytest.importorskip("ray")
import ray.cloudpickle  # noqa: E402, F811 (the submodule, bound to the same name)
from ray.cluster_utils import Cluster  # noqa: E402
from ray.exceptions import ActorUnavailableError  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

# This module's functions travel to the node actors by value; tests.faulty (its envs and their
# exception class) and tests.envs are imported there from PYTHONPATH, as a user's installed package would be.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 4  # envs: 0..1 on node 0, 2..3 on node 1
RAY = {"backend": "ray", "n_workers": 1, "start_method": "fork"}
SEEN_PIDS: set[int] = set()  # every node actor and worker the module started: none may outlive its test


@pytest.fixture(scope="module")
def cluster():
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPO, os.environ.get("PYTHONPATH")])
    )  # for the nodes: tests.*
    simulated = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        simulated.add_node(num_cpus=1)
        ray.init(address=simulated.address, log_to_driver=False)
        simulated.wait_for_nodes()
        yield simulated
    finally:
        ray.shutdown()
        simulated.shutdown()


@pytest.fixture(autouse=True)
def no_leaks(cluster):
    """Overrides conftest's (Ray's own daemons and idle workers come and go): nothing of ours may stay."""
    yield
    assert poll_until(lambda: all(gone(pid) for pid in SEEN_PIDS), 10.0), "node actors or workers outlived their test"
    left = [name for pid in SEEN_PIDS for name in shm_of(pid)]
    assert not left, f"/dev/shm entries left behind: {left}"


# Ray fails a call to an actor it is re-creating with ActorUnavailableError after ~2 s;
# a rebuild this slow makes the driver meet that error on every restart.
SLOW_REBUILD = 6.0


class SlowOnceMarked:
    """Builds CartPole; the first build once ``marker`` exists (a rebuild after a kill) takes ``SLOW_REBUILD`` s."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __call__(self):
        try:
            os.unlink(self.marker)  # one build claims it: the node's other envs build at once
            time.sleep(SLOW_REBUILD)
        except FileNotFoundError:
            pass
        return gym.make("CartPole-v1")


def kill_node(envs, n, no_restart=False):
    """Kill node ``n``'s actor and wait until its process is gone (ray.kill returns before)."""
    pid = envs._pool.nodes[n].info.pid
    ray.kill(envs._pool.nodes[n].actor, no_restart=no_restart)
    assert poll_until(lambda: gone(pid), 10.0)


def unavailable_once(monkeypatch, ref):
    """Make the driver's ray.get of ``ref`` fail as a call to an actor Ray calls unavailable."""
    real_get = ray.get

    def get(refs, *args, **kwargs):
        if refs is ref:
            raise ActorUnavailableError("The actor is temporarily unavailable: IOError: injected by the test", None)
        return real_get(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "get", get)


def track(env):
    """Remember the env's actor and worker pids, for no_leaks."""
    for node in env._pool.nodes:
        SEEN_PIDS.update([node.info.pid, *node.info.worker_pids])
    return env


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero_copy"])
def test_sb3_adapter_equals_dummy_vec_env(closing, copy):
    """``copy=False``: the driver's observation rows are double-buffered, as the local pool's."""
    shm = closing(track(ShmPoolVecEnv([cartpole] * N, copy=copy, **RAY)))
    dummy = closing(DummyVecEnv([cartpole] * N))
    assert [node.info.node_id for node in shm._pool.nodes] != [shm._pool.nodes[0].info.node_id] * 2, "one node"
    counts = run_equivalence(shm, dummy, steps=100, seed=3)
    assert counts["done"] > 0
    if not copy:
        first = shm.step(np.zeros(N, dtype=np.int64))[0]
        kept = first.copy()
        second = shm.step(np.zeros(N, dtype=np.int64))[0]
        assert_same(first, kept, "an observation lives through the next step")
        assert not np.shares_memory(first, second) and np.shares_memory(first, shm.step(np.zeros(N, dtype=np.int64))[0])


def test_gymnasium_adapter_equals_sync_vector_env(closing):
    shm = closing(track(ShmVectorEnv([cartpole] * N, autoreset_mode="SameStep", **RAY)))
    ref = closing(gym.vector.SyncVectorEnv([cartpole] * N, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    assert_same(shm.reset(seed=7), ref.reset(seed=7), "reset")
    ref.action_space.seed(7)
    ends = 0
    for step in range(100):
        actions = ref.action_space.sample()
        got, want = shm.step(actions), ref.step(actions)
        assert_same(got, want, f"step {step}")
        ends += int(want[2].sum() + want[3].sum())
    assert ends > 0


def test_device_tensors_from_the_driver_rows(closing):
    torch = pytest.importorskip("torch")
    from tests.torch_results import AsNumpy

    shm = closing(track(ShmVectorEnv([cartpole] * N, device="cpu", **RAY)))
    assert shm._pool.page_lock() is False  # the driver's rows are plain arrays: nothing to page-lock
    ref = closing(gym.vector.SyncVectorEnv([cartpole] * N))
    seen = AsNumpy(shm, device=torch.device("cpu"))
    assert_same(seen.reset(seed=3), ref.reset(seed=3), "reset")
    ref.action_space.seed(3)
    for step in range(60):
        actions = ref.action_space.sample()
        assert_same(seen.step(actions), ref.step(actions), f"step {step}")


def test_actions_reach_the_envs_as_the_caller_gave_them(closing):
    """The driver ships each node its action rows with the dtype each caller gave: float64,
    float16, Python lists, a different type per env, in a step and in send/recv batches."""
    space = SPACES["box"]
    shm = closing(track(ShmVectorEnv([probe(space)] * N, **RAY)))
    ref = closing(gym.vector.SyncVectorEnv([probe(space)] * N))
    assert_same(shm.reset(seed=0), ref.reset(seed=0), "reset")
    for k, actions in enumerate(batches(space, np.random.default_rng(1))):
        assert_same(shm.step(actions), ref.step(actions), f"batch {k}")
    shm.close()  # its CPUs: one per node
    envs = closing(track(ShmVectorEnv([probe(space)] * N, batch_size=2, **RAY)))
    alone = [ActionProbeEnv(space) for _ in range(N)]
    envs.async_reset(seed=0)
    want: dict[int, str] = {}  # per env, what its action in flight must reach it as
    checked = 0

    def check(infos: dict) -> None:
        nonlocal checked
        for row, i in enumerate(infos["env_id"].tolist()):
            if i in want:  # else: its reset's result
                assert infos["got"][row] == want.pop(i), f"env {i}"
                checked += 1

    sends = batches(space, np.random.default_rng(2), n=2) * 2
    for actions in sends:
        infos = envs.recv()[4]
        check(infos)
        for i, action in zip(infos["env_id"].tolist(), iterate(batch_space(space, 2), actions)):
            want[i] = alone[i].step(action)[4]["got"]
        envs.send(actions)
    for _ in range(N // 2):  # every env has one result outstanding (which ones: the nodes' timing)
        check(envs.recv()[4])
    assert not want and checked == 2 * len(sends)


def test_rare_calls(closing):
    shm = closing(track(ShmPoolVecEnv(env_fns(None), **RAY)))
    dummy = closing(DummyVecEnv(env_fns(None)))
    for env in (shm, dummy):
        assert env.seed(5) == [5, 6, 7, 8]
        env.reset()
        env.set_attr("at", 7, indices=[1, 2])
    assert shm.get_attr("at") == dummy.get_attr("at") == [2, 7, 7, 2]
    assert_same(shm.env_method("step", 1, indices=[0, 3]), dummy.env_method("step", 1, indices=[0, 3]))
    assert_same(shm.get_images(), dummy.get_images())
    assert shm.env_is_wrapped(gym.Wrapper) == dummy.env_is_wrapped(gym.Wrapper)
    assert len(set(shm.env_method("pid"))) == 2, "one worker per node"


def test_async_send_recv_matches_each_env_alone(closing):
    envs = closing(track(ShmVectorEnv([cartpole] * N, batch_size=2, **RAY)))
    refs = [gym.vector.SyncVectorEnv([cartpole]) for _ in range(N)]
    envs.async_reset(seed=11)
    want_obs = {i: refs[i].reset(seed=11 + i)[0][0] for i in range(N)}
    rng = np.random.default_rng(0)
    nodes_seen = set()
    deadline = time.monotonic() + 60
    # First come, first served: on a busy machine one node may answer many times before the other once.
    for t in itertools.count():
        if t >= 60 and (len(nodes_seen) == 2 or time.monotonic() > deadline):
            break
        obs, rewards, terminated, truncated, infos = envs.recv()
        ids = infos["env_id"]
        nodes_seen.add(tuple(sorted(i // 2 for i in ids)))
        for row, i in enumerate(ids):
            assert_same(obs[row], want_obs[i], f"env {i} obs")
        actions = rng.integers(0, 2, size=len(ids))
        for i, action in zip(ids, actions):
            o, r, te, tr, _ = refs[i].step(np.array([action]))
            want_obs[i] = o[0]
        envs.send(actions)
    for ref in refs:
        ref.close()
    assert nodes_seen == {(0, 0), (1, 1)}, "a batch is one node's envs (they come back as its actor answers)"


def test_env_error_names_the_global_env_and_keeps_the_remote_traceback(closing):
    envs = closing(track(ShmVectorEnv(env_fns("step"), **RAY)))
    envs.reset(seed=0)
    envs.step(np.zeros(N, dtype=np.int64))
    with pytest.raises(Boom) as caught:
        envs.step(np.zeros(N, dtype=np.int64))
    assert caught.value.env_index == 3
    assert "env 3 on node 1" in "\n".join(caught.value.__notes__)
    assert isinstance(caught.value.__cause__, RemoteTraceback) and "step failed on purpose" in str(
        caught.value.__cause__
    )
    envs.step(np.zeros(N, dtype=np.int64))  # an env error does not break the pool


def test_timeout(closing):
    envs = closing(track(ShmVectorEnv(env_fns("hang"), timeout=1.0, **RAY)))
    envs.reset(seed=0)
    envs.step(np.zeros(N, dtype=np.int64))
    with pytest.raises(StepTimeoutError, match=r"envs 2\.\.3 did not answer"):
        envs.step(np.zeros(N, dtype=np.int64))


def test_killed_node_actor_raises_naming_node_and_envs(closing):
    envs = closing(track(ShmVectorEnv([cartpole] * N, **RAY)))
    envs.reset(seed=0)
    envs.step(np.zeros(N, dtype=np.int64))
    old_pid = envs._pool.nodes[1].info.pid
    ray.kill(envs._pool.nodes[1].actor)
    assert poll_until(lambda: gone(old_pid), 10.0)  # ray.kill returns before the actor is dead
    with pytest.raises(WorkerDiedError, match=r"node 1 \(127\.0\.0\.1.*envs 2\.\.3"):
        envs.step(np.zeros(N, dtype=np.int64))
    with pytest.raises(WorkerDiedError, match="unusable"):
        envs.step(np.zeros(N, dtype=np.int64))


def test_restart_mode_reports_a_truncation(closing):
    envs = closing(track(ShmPoolVecEnv([cartpole] * N, on_worker_failure="restart", **RAY)))
    envs.reset()
    envs.step(np.zeros(N, dtype=np.int64))
    old_pid = envs._pool.nodes[0].info.pid
    ray.kill(envs._pool.nodes[0].actor, no_restart=False)
    assert poll_until(lambda: gone(old_pid), 10.0)  # ray.kill returns before the actor is dead
    with pytest.warns(RuntimeWarning, match="node 0.*Ray restarts it"):
        obs, rewards, dones, infos = envs.step(np.zeros(N, dtype=np.int64))
    assert dones.tolist() == [True, True, False, False] and rewards[:2].tolist() == [0.0, 0.0]
    assert infos[0] == {"shmvec_restarted": True, "TimeLimit.truncated": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            envs.step(np.zeros(N, dtype=np.int64))  # the restarted node steps on
    track(envs)


def test_restart_mode_with_sends_in_flight(closing):
    """A node actor dies while its envs are in flight: they come back truncated, the others go on."""
    envs = closing(track(ShmVectorEnv([cartpole] * N, batch_size=2, on_worker_failure="restart", **RAY)))
    envs.async_reset(seed=0)
    restarted = []
    old_pid = envs._pool.nodes[0].info.pid
    deadline = time.monotonic() + 60  # Ray takes seconds to re-create an actor
    with pytest.warns(RuntimeWarning, match="node 0.*Ray restarts it"):
        for t in itertools.count():
            if restarted or time.monotonic() > deadline:
                break
            obs, rewards, terms, truncs, infos = envs.recv()
            if "shmvec_restarted" in infos:
                mask = infos["_shmvec_restarted"]
                assert truncs[mask].all() and (rewards[mask] == 0).all()
                restarted += infos["env_id"][mask].tolist()
            if t == 3:
                ray.kill(envs._pool.nodes[0].actor, no_restart=False)
                assert poll_until(lambda: gone(old_pid), 10.0)
            envs.send(np.zeros(2, dtype=np.int64))
    assert set(restarted) <= {0, 1} and restarted, restarted
    track(envs)


def test_restart_waits_while_ray_rebuilds_the_actor(closing, tmp_path):
    """Calls to an actor Ray is re-creating fail as "unavailable": the driver waits for the new one."""
    marker = tmp_path / "rebuilding"
    envs = closing(track(ShmPoolVecEnv([SlowOnceMarked(marker)] * N, on_worker_failure="restart", **RAY)))
    envs.reset()
    envs.step(np.zeros(N, dtype=np.int64))
    old_pid = envs._pool.nodes[0].info.pid
    marker.touch()
    kill_node(envs, 0)
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match="node 0.*Ray restarts it"):
        _, rewards, dones, infos = envs.step(np.zeros(N, dtype=np.int64))
    assert time.monotonic() - started >= SLOW_REBUILD, "the step came back before the new actor was built"
    assert dones.tolist() == [True, True, False, False] and rewards[:2].tolist() == [0.0, 0.0]
    assert infos[0] == {"shmvec_restarted": True, "TimeLimit.truncated": True}
    assert envs._pool.nodes[0].info.pid != old_pid
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            envs.step(np.zeros(N, dtype=np.int64))  # the restarted node steps on
    track(envs)


def test_restart_waits_for_a_slow_rebuild_with_sends_in_flight(closing, tmp_path):
    """Node 0's envs are sent to an actor Ray is re-creating: they come back truncated once it is rebuilt."""
    marker = tmp_path / "rebuilding"
    envs = closing(track(ShmVectorEnv([SlowOnceMarked(marker)] * N, batch_size=2, on_worker_failure="restart", **RAY)))
    envs.async_reset(seed=0)
    restarted, killed = [], False
    deadline = time.monotonic() + 60
    with pytest.warns(RuntimeWarning, match="node 0.*Ray restarts it"):
        while not restarted and time.monotonic() < deadline:
            _, rewards, _, truncs, infos = envs.recv()
            if "shmvec_restarted" in infos:
                mask = infos["_shmvec_restarted"]
                assert truncs[mask].all() and (rewards[mask] == 0).all()
                restarted += infos["env_id"][mask].tolist()
            if not killed and set(infos["env_id"].tolist()) == {0, 1}:
                marker.touch()
                kill_node(envs, 0)  # node 0's envs are held: the send below reaches the restarting actor
                killed = True
            envs.send(np.zeros(2, dtype=np.int64))
    assert sorted(restarted) == [0, 1], restarted
    track(envs)


def test_a_rebuild_past_the_restart_limit_raises(closing, tmp_path, monkeypatch):
    """Ray still re-creating the actor when the restart limit passes: WorkerDiedError, not a wait without end."""
    marker = tmp_path / "rebuilding"
    envs = closing(track(ShmPoolVecEnv([SlowOnceMarked(marker)] * N, on_worker_failure="restart", **RAY)))
    envs.reset()
    monkeypatch.setattr(ray_backend, "START_TIMEOUT", 1.0)
    monkeypatch.setattr(ray_backend, "NODE_GRACE", 1.0)
    assert envs._pool.restart_limit() == 2.0
    marker.touch()
    kill_node(envs, 0)
    with (
        pytest.warns(RuntimeWarning, match="node 0.*Ray restarts it"),
        pytest.raises(WorkerDiedError, match=r"node 0 .*Ray (could|did) not restart it within 2\.0s"),
    ):
        envs.step(np.zeros(N, dtype=np.int64))
    # Let the rebuild end, so that close() can close the new actor's pool (killed mid-build, it would leave it).
    actor = envs._pool.nodes[0].actor
    info = None
    for _ in range(int(SLOW_REBUILD * 5)):
        try:
            info = ray.get(actor.describe.remote(), timeout=10)
            break
        except ActorUnavailableError:
            time.sleep(0.2)
    assert info is not None, "Ray never finished re-creating the actor"
    SEEN_PIDS.update([info.pid, *info.worker_pids])


def test_a_dead_actor_still_raises_at_once_in_restart_mode(closing):
    """An actor Ray will not restart (killed for good) is dead: no waiting for a rebuild."""
    envs = closing(track(ShmPoolVecEnv([cartpole] * N, on_worker_failure="restart", **RAY)))
    envs.reset()
    envs.step(np.zeros(N, dtype=np.int64))
    kill_node(envs, 1, no_restart=True)
    started = time.monotonic()
    with (
        pytest.warns(RuntimeWarning, match="node 1.*Ray restarts it"),
        pytest.raises(WorkerDiedError, match=r"node 1 .*died.*Ray could not restart it"),
    ):
        envs.step(np.zeros(N, dtype=np.int64))
    assert time.monotonic() - started < 10.0, "the driver waited for a restart of a dead actor"


def test_unavailable_actor_in_raise_mode_raises_at_once(closing, monkeypatch):
    """Without restarts an unavailable actor's step is lost: WorkerDiedError saying so, no waiting."""
    envs = closing(track(ShmPoolVecEnv([cartpole] * N, **RAY)))
    envs.reset()
    envs.step_async(np.zeros(N, dtype=np.int64))
    unavailable_once(monkeypatch, envs._pool._step_refs[0])
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"the Ray actor of node 0 .* is unavailable \(.*injected by the test"):
        envs.step_wait()
    assert time.monotonic() - started < 10.0
    with pytest.raises(WorkerDiedError, match="unusable"):
        envs.step(np.zeros(N, dtype=np.int64))


def test_unavailable_actor_that_stayed_alive_is_reset_in_restart_mode(closing, monkeypatch):
    """A call lost to a passing "unavailable" on an actor Ray did not re-create: its envs restart, its pool stays."""
    envs = closing(track(ShmPoolVecEnv([cartpole] * N, on_worker_failure="restart", **RAY)))
    envs.reset()
    pid = envs._pool.nodes[0].info.pid
    envs.step_async(np.zeros(N, dtype=np.int64))
    unavailable_once(monkeypatch, envs._pool._step_refs[0])
    with pytest.warns(RuntimeWarning, match="node 0.*Ray restarts it"):
        _, _, dones, infos = envs.step_wait()
    assert dones.tolist()[:2] == [True, True] and infos[0]["shmvec_restarted"]
    assert envs._pool.nodes[0].info.pid == pid
    assert shm_of(pid), "the live actor's shared memory was swept as a dead one's"
    envs.step(np.zeros(N, dtype=np.int64))


def test_close_leaves_nothing_on_any_node():
    envs = track(ShmVectorEnv([cartpole] * N, **RAY))
    envs.reset(seed=0)
    pids = [pid for node in envs._pool.nodes for pid in (node.info.pid, *node.info.worker_pids)]
    envs.close()
    assert poll_until(lambda: all(gone(pid) for pid in pids), 10.0)
    assert not [name for pid in pids for name in shm_of(pid)]


def test_options_are_checked(closing):
    with pytest.raises(ValueError, match='backend="ray"'):
        ShmVectorEnv([cartpole] * N, n_nodes=2)
    with pytest.raises(ValueError, match="n_nodes=3 needs 3 alive Ray nodes.*has 2"):
        ShmVectorEnv([cartpole] * N, n_nodes=3, **RAY)


def test_a_script_that_never_closes_exits_cleanly(cluster, tmp_path):
    script = textwrap.dedent(f"""
        import gymnasium as gym, numpy as np, ray
        from shmvec import ShmVectorEnv
        ray.init(address={cluster.address!r}, log_to_driver=False)
        envs = ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 4, backend="ray", n_workers=1, start_method="fork")
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        print(*(pid for node in envs._pool.nodes for pid in (node.info.pid, *node.info.worker_pids)))
    """)
    (tmp_path / "script.py").write_text(script)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    SEEN_PIDS.update(int(pid) for pid in done.stdout.split())


def test_timings_give_the_slowest_nodes_steps_and_the_network(cluster):
    """Envs that sleep 3 ms: the envs' part is the slowest node's own step (it says how long), what the
    driver waited beyond it is the network's; the parts add up to the wall time."""
    from tests.global_rng_env import WaitingEnv

    envs = track(ShmPoolVecEnv([functools.partial(WaitingEnv, 3e-3)] * N, **RAY))
    try:
        envs.reset()
        actions = np.zeros(N, dtype=np.int64)
        envs.step(actions)
        envs.timings.reset()
        for _ in range(40):
            envs.step(actions)
        timings = envs.timings
    finally:
        envs.close()
    assert timings.remote and timings.steps == 40 and "network_share" in timings.scalars()
    assert timings.envs >= 40 * 3e-3 * 0.9 and timings.network > 0, str(timings)
    total = sum(timings.share(part) for part in timings.parts)
    assert abs(total - 1.0) < 0.05, str(timings)
    assert "network (Ray)" in str(timings)
