"""Scenarios of tests/engine/test_held_calls.py, each run as a script in its own process:
``python -m tests.engine.held_call_scenarios SCENARIO [ARG]``. It prints what it saw as one JSON line.

- ``stuck N_WORKERS [sends]``: the main shard's env sleeps 4 s in its second step (an env stuck
  in a simulator); another process sends SIGINT 0.5 s into it. Reports when the KeyboardInterrupt
  came after the signal, and whether the pool then steps as ``SyncVectorEnv`` does (after a
  seeded reset) or raises an error (its text). ``sends``: the steps are async sends and recvs.
- ``alarms [own]``: a ``SIGALRM`` handler of the script raises every 1-2 ms while it makes pool
  calls for 2 s (a timeout helper, a ``SIGTERM`` handler); then reports SIGINT's handler and
  whether a SIGINT raises ``KeyboardInterrupt``. ``own``: SIGINT's handler is the script's
  (it raises KeyboardInterrupt too), not Python's default.
- ``large-request``: an async reset whose options take 1 MB, while sends whose infos take
  300 kB each are in flight (more than a socket's buffer, each way). Reports what the reset,
  then recv, returned; the test's subprocess timeout is the watchdog of a deadlock.
- ``hung-reader``: the same reset while the worker's other env hangs in its step: what the
  reset raised, and when.

Apart from the test module: an interrupt or a hang ends only this process.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np

from shmvec import ShmVectorEnv
from tests.held_call_envs import LargeInfos, SleepsOnce

SENDER = """
import os, signal, sys, time
pid, delay = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.readline()  # go
time.sleep(delay)
sent = time.monotonic()
os.kill(pid, signal.SIGINT)
print(sent, flush=True)
"""
STUCK_FOR, SIGNAL_AFTER = 4.0, 0.5
N_ENVS = 4


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def stuck(n_workers: int, sends: bool = False) -> dict:
    """A Ctrl-C 0.5 s into a 4 s step of an env of the main shard (its last env); ``sends``: a step
    made of send() and recv() (async batches)."""
    fns = [cartpole] * (N_ENVS - 1) + [functools.partial(SleepsOnce, STUCK_FOR, 2)]
    batch_size = N_ENVS if sends else None
    env = ShmVectorEnv(fns, n_workers, use_main_process=True, start_method="fork", timeout=10.0, batch_size=batch_size)
    ref = gym.vector.SyncVectorEnv([cartpole] * N_ENVS)
    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER, str(os.getpid()), str(SIGNAL_AFTER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    report: dict = {"plan": repr(env)}
    try:
        actions = np.zeros(N_ENVS, dtype=np.int64)
        step = (
            (lambda: env.send(actions, np.arange(N_ENVS)) or env.recv())
            if sends
            else functools.partial(env.step, actions)
        )
        if sends:
            env.async_reset(seed=0)
            env.recv()
        else:
            env.reset(seed=0)
        step()
        sender.stdin.write("go\n")
        sender.stdin.flush()
        started = time.monotonic()
        try:
            step()
            report["interrupted"] = False
        except KeyboardInterrupt:
            report["interrupted"] = True
        raised = time.monotonic()
        sent = float(sender.stdout.readline())
        report["after_signal"] = raised - sent
        report["step_lasted"] = raised - started
        report["after"] = steps_on(env, ref) if not sends else recv_on(env)
    finally:
        sender.wait()
        env.close()
    return report


def steps_on(env: ShmVectorEnv, ref: gym.vector.VectorEnv) -> str:
    """``same`` if a seeded reset and 20 steps match the reference's, else what differed or was raised."""
    try:
        got, want = env.reset(seed=1)[0], ref.reset(seed=1)[0]
        if not np.array_equal(got, want):
            return "reset differs"
        rng = np.random.default_rng(0)
        for _ in range(20):
            actions = rng.integers(0, 2, N_ENVS)
            got, want = env.step(actions), ref.step(actions)
            if not all(np.array_equal(g, w) for g, w in zip(got[:4], want[:4])):
                return "a step differs"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "same"


def recv_on(env: ShmVectorEnv) -> str:
    """What a recv() after the interrupted send() raises (or "received")."""
    try:
        env.recv()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "received"


class Alarm(Exception):
    pass


_ringing_until = 0.0  # time.monotonic() after which an alarm no longer raises


def ring(signum, frame):
    if time.monotonic() < _ringing_until:  # after the storm no alarm raises: none can escape its end
        raise Alarm


def own_sigint(signum, frame):
    raise KeyboardInterrupt


def alarms(own: bool = False) -> dict:
    """Pool calls while a raising SIGALRM handler fires every 1-2 ms; how SIGINT is left."""
    if own:
        signal.signal(signal.SIGINT, own_sigint)
    before = signal.getsignal(signal.SIGINT)
    counts = {"alarms": 0, "calls": 0, "pools": 0, "errors": 0}
    pool: list[ShmVectorEnv] = []
    global _ringing_until
    signal.signal(signal.SIGALRM, ring)
    end = _ringing_until = time.monotonic() + 2.0
    resuming(lambda: calls(pool, counts, end), counts)  # returns after end: the alarms raise no more
    quiet(counts)
    left = signal.getsignal(signal.SIGINT)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        raises = False
    except KeyboardInterrupt:
        raises = True
    for env in pool:
        env.close()
    return {**counts, "handler_as_before": left is before, "handler": repr(left), "ctrl_c_raises": raises}


def calls(pool: list[ShmVectorEnv], counts: dict, end: float) -> None:
    """Resets and steps until ``end``, counting the alarms that hit them; a fresh pool when one left it unusable."""
    while time.monotonic() < end:
        if not pool:  # made without alarms (its start-up takes longer than their interval)
            quiet(counts)
            pool.append(ShmVectorEnv([cartpole] * N_ENVS, n_workers=0, use_main_process=True, timeout=5.0))
            counts["pools"] += 1
            signal.setitimer(signal.ITIMER_REAL, 1e-3, 1.5e-3)
        try:
            pool[-1].reset(seed=counts["calls"])
            for _ in range(20):
                pool[-1].step(np.zeros(N_ENVS, dtype=np.int64))
                counts["calls"] += 1
        except Alarm:
            counts["alarms"] += 1
        except Exception:  # an alarm in the pool's own lines may leave it unusable (AlreadyPendingError, ...)
            counts["errors"] += 1
            quiet(counts)
            broken = pool.pop()
            try:
                broken.close()
            except Exception:  # the pending step's error, raised once closed: an env an alarm left half-updated
                pass


def quiet(counts: dict) -> None:
    """No more alarms (the last ones may still come)."""
    for _ in range(3):
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        except Alarm:
            counts["alarms"] += 1


def resuming(call, counts: dict, depth: int = 3) -> None:
    """``call()`` to its end, called again after each alarm that hit this script's own lines (see
    ctrl_c_storm.between_signals): an escape needs ``depth`` alarms within microseconds."""
    if depth == 0:
        return call()
    while True:
        try:
            return resuming(call, counts, depth - 1)
        except Alarm:
            counts["alarms"] += 1


def large_request() -> dict:
    """An async reset of 1 MB of options while 3 sends of 300 kB infos are in flight, in one worker."""
    fns = [LargeInfos] * N_ENVS
    env = ShmVectorEnv(fns, n_workers=1, start_method="fork", batch_size=N_ENVS, timeout=20.0)
    try:
        env.async_reset(seed=0)
        env.recv()
        busy = np.arange(N_ENVS - 1)
        env.send(np.zeros(len(busy), dtype=np.int64), busy)
        mask = np.zeros(N_ENVS, dtype=bool)
        mask[-1] = True
        env.async_reset(seed=7, options={"reset_mask": mask, "large": "x" * 1_000_000})
        obs, rewards, terminations, truncations, infos = env.recv()
        return {
            "env_ids": infos["env_id"].tolist(),
            "payloads": [len(p) for p in infos["payload"][: N_ENVS - 1]] if "payload" in infos else [],
            "reset_obs": obs[-1].tolist(),
            "want_obs": LargeInfos().reset(seed=7 + N_ENVS - 1)[0].tolist(),
        }
    finally:
        env.close()


def hung_reader() -> dict:
    """An async reset of 1 MB of options to a worker whose other env hangs in a send: the pool's timeout."""
    fns = [functools.partial(SleepsOnce, 600.0, 1), cartpole]
    env = ShmVectorEnv(fns, n_workers=1, start_method="fork", batch_size=2, timeout=2.0)
    try:
        env.async_reset(seed=0)
        env.recv()
        env.send(np.zeros(1, dtype=np.int64), [0])
        started = time.monotonic()
        try:
            env.async_reset(seed=7, options={"reset_mask": np.array([False, True]), "large": "x" * 1_000_000})
            raised = "nothing"
        except Exception as exc:
            raised = f"{type(exc).__name__}: {exc}"
        return {"raised": raised, "after": time.monotonic() - started}
    finally:
        env.close(terminate=True)


if __name__ == "__main__":
    # Python's own SIGINT handler, however this script was started: a background job inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    scenario = sys.argv[1]
    if scenario == "stuck":
        result = stuck(int(sys.argv[2]), sys.argv[3:] == ["sends"])
    elif scenario == "alarms":
        result = alarms(sys.argv[2:] == ["own"])
    elif scenario == "hung-reader":
        result = hung_reader()
    else:
        result = large_request()
    print(json.dumps(result))
