"""A Ctrl-C storm, run as a script by tests/engine/test_interrupts.py:
``python ctrl_c_storm.py N_WORKERS MODE HELPER [HANDLER [SECONDS]]``.

Another process sends SIGINT every 0.1-1 ms to this one, which steps 12 CartPoles (``MODE``:
``sync`` steps or ``async`` send/recv of every env of a ShmVectorEnv; ``main``: sync steps with
a shard in the main process too; ``engine``: the ShmPool under it, driven directly; ``sb3``: a
ShmPoolVecEnv, compared with SB3's ``DummyVecEnv``)
with ``N_WORKERS`` workers, with an idle helper thread (``HELPER`` 1) or without, for ``SECONDS``
(4 by default). SIGINT's handler (``HANDLER``) is Python's ``default``, or one of the script's own:
``flag`` (the first Ctrl-C sets a flag, every later one raises KeyboardInterrupt) or ``pair``
(two handlers that replace each other: one returns, the other raises an exception of the
script's, not a KeyboardInterrupt). After each interrupt it steps on, comparing every step that
returned with the reference; then, the storm over, checks the handler it left (the one the
script's handlers last installed) and makes 50 quiet steps. It prints what it counted as one JSON line. A script apart
from the test module: it imports neither pytest nor (but in ``sb3`` mode) SB3, and an
interrupt that escapes its own loop ends only it.

An interrupted step may or may not have run, so after each interrupt both are reset with a
new seed. A reset takes ~1 ms, longer than the storm leaves between two signals on average:
after 3 resets in a row were interrupted, the sender pauses for the next one (it still gets
the signal it had sent already).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import gymnasium as gym
import numpy as np

from shmvec import ShmVectorEnv
from shmvec.engine.pool import ShmPool
from shmvec.gymnasium_1_1 import AutoresetMode
from shmvec.options import PoolOptions

N_ENVS = 12
STORM_SECONDS = 4.0  # >= 2,000 interrupts per configuration on the 2-core VM
TRIES_IN_THE_STORM = 3  # interrupted resets in a row before the sender pauses for one
SENDER = """
import os, random, select, signal, sys, time
pid, stop_at, rng, paused = int(sys.argv[1]), float(sys.argv[2]), random.Random(0), False
while time.monotonic() < stop_at:
    if select.select([0], [], [], rng.uniform(1e-4, 1e-3))[0]:
        told = os.read(0, 64)
        if not told:
            break
        paused = told.endswith(b"p")
    elif not paused:
        os.kill(pid, signal.SIGINT)
"""


class Interrupted(Exception):
    """What the ``pair`` handler raises: not a KeyboardInterrupt (an ``except Exception`` catches it)."""


INTERRUPTS = (KeyboardInterrupt, Interrupted)
handlers = {"flagged": False, "installed": signal.default_int_handler}  # the script's view of SIGINT


def flag_then_raise(signum, frame):
    """The first Ctrl-C sets a flag (``asyncio.run`` cancels its task), every later one raises."""
    if not handlers["flagged"]:
        handlers["flagged"] = True
        return
    raise KeyboardInterrupt


def returns(signum, frame):
    """``pair``: this Ctrl-C is only noted; the next one goes to :func:`raises` (installed from here)."""
    replace_with(raises)


def raises(signum, frame):
    """``pair``: this Ctrl-C raises Interrupted; the next one goes to :func:`returns` again."""
    replace_with(returns)
    raise Interrupted


def replace_with(handler) -> None:
    # noted first: a Ctrl-C right after the swap runs ``handler``, which notes its own successor
    handlers["installed"] = handler
    signal.signal(signal.SIGINT, handler)


HANDLERS = {"default": signal.default_int_handler, "flag": flag_then_raise, "pair": returns}


def cartpole():
    return gym.make("CartPole-v1")


def same_step(got, want) -> bool:
    return all(same(g, w) for g, w in zip(got[:4], want[:4])) and got[4].keys() == want[4].keys()


def same(got, want) -> bool:
    """``np.array_equal``, without its ``except Exception: return False``: an exception of a SIGINT
    handler (``pair``'s) raised there must end the step as an interrupt, not count as a mismatch."""
    got, want = np.asarray(got), np.asarray(want)
    return got.shape == want.shape and bool((got == want).all())


class Storm:
    """One process stepping ``env`` (``mode``: ``sync``/``async``, a ShmVectorEnv; ``engine``, a ShmPool)
    and a reference through a storm of SIGINTs; what it counted."""

    def __init__(self, env: ShmVectorEnv | ShmPool, mode: str, sender: subprocess.Popen | None):
        self.env, self.mode, self.sender = env, mode, sender
        if mode == "sb3":
            from stable_baselines3.common.vec_env import DummyVecEnv

            self.ref = DummyVecEnv([cartpole] * N_ENVS)
        else:
            self.ref = gym.vector.SyncVectorEnv([cartpole] * N_ENVS)
        self.rng = np.random.default_rng(0)
        self.seed, self.synced, self.tries, self.paused = 0, False, 0, False
        self.counts = {"interrupts": 0, "steps": 0, "resyncs": 0, "quiet_resyncs": 0, "mismatches": 0}
        self.errors: list[str] = []

    def pause(self, paused: bool) -> None:
        if self.sender is not None:
            try:
                os.write(self.sender.stdin.fileno(), b"p" if paused else b"g")
            except BrokenPipeError:  # the storm is over: the sender stopped itself
                pass
        self.paused = paused

    def step(self) -> None:
        """One step compared with the reference, after a reset of both if an interrupt may have parted them.

        ``synced`` is cleared before anything that an interrupt could leave half done, and set
        only once both agree again: whatever instant an interrupt hits, the next call resyncs.
        """
        if not self.synced:
            self.tries += 1
            if self.tries > TRIES_IN_THE_STORM and not self.paused:
                self.pause(True)
            self.seed += 1
            got, want = self.reset(self.seed), shielded(lambda: self.reset_ref(self.seed))
            self.counts["mismatches"] += not same(got, want)
            self.synced = True
            self.counts["quiet_resyncs" if self.paused else "resyncs"] += 1
            self.tries = 0
        if self.paused:
            self.pause(False)
        actions = self.rng.integers(0, 2, N_ENVS)
        self.synced = False
        got = self.step_env(actions)
        want = shielded(lambda: self.ref.step(actions))
        if self.mode == "sb3":  # obs, rewards, dones, infos
            agree = all(same(g, w) for g, w in zip(got[:3], want[:3]))
        else:
            agree = same_step(got, want)
        self.counts["mismatches"] += not agree
        self.synced = True
        self.counts["steps"] += 1

    def reset_ref(self, seed: int) -> np.ndarray:
        if self.mode == "sb3":
            self.ref.seed(seed)
            return self.ref.reset()
        return self.ref.reset(seed=seed)[0]

    def reset(self, seed: int) -> np.ndarray:
        env = self.env
        if self.mode == "sb3":
            env.seed(seed)
            return env.reset()
        if self.mode == "engine":
            if env.pending == "step":  # interrupted between step_async and step_wait: the caller's to collect
                env.step_wait()
            env.reset({i: {"seed": seed + i} for i in range(N_ENVS)})
            return env.obs_leaves[()].copy()
        if self.mode == "async" and env._pool.batches.busy:  # an interrupted recv: its envs are still to come
            env.recv()
        return env.reset(seed=seed)[0]

    def step_env(self, actions: np.ndarray) -> tuple:
        env = self.env
        if self.mode == "engine":
            env.actions.write((), actions, actions)
            env.step_async()
            env.step_wait()
            flags = env.terminated.copy(), env.truncated.copy()
            return env.obs_leaves[()].copy(), env.rewards.astype(np.float64), *flags, {}
        if self.mode == "async":
            env.send(actions, np.arange(N_ENVS))
            got = env.recv()
            got[4].pop("env_id")
            return got
        return env.step(actions)

    def run(self, end: float) -> None:
        """Step until ``end`` (``time.monotonic()``), counting the interrupts that hit a step."""
        while time.monotonic() < end:
            try:
                self.step()
            except INTERRUPTS:
                self.counts["interrupts"] += 1
            except Exception as exc:  # a wrong state: AlreadyPendingError, StepTimeoutError (a hang)...
                where = traceback.extract_tb(exc.__traceback__)[-1]
                self.errors.append(f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")
                return


def between_signals(call, counts: dict | None = None, depth: int = 3):
    """``call()`` to its end, called again after each KeyboardInterrupt that hit this script's own
    lines rather than a pool's (counted in ``counts``). Each level of nesting resumes after one:
    an escape needs ``depth`` signals within microseconds of each other (they come >= 0.1 ms apart)."""
    if depth == 0:
        return call()
    while True:
        try:
            return between_signals(call, counts, depth - 1)
        except INTERRUPTS:
            if counts is not None:
                counts["interrupts"] += 1


def shielded(call):
    """``call()`` with SIGINT blocked: the storm tests the pool, not the reference, which an
    interrupt can leave half done (Gymnasium's env checker then unpacks None); a signal that
    came meanwhile raises once it is unblocked, and the step is synced again."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        return call()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def reap(process: subprocess.Popen) -> None:
    """Wait for ``process`` to end, by ``os.waitpid`` itself: ``Popen.wait`` takes a lock that a
    KeyboardInterrupt right after its acquire leaves taken, and every later wait then hangs."""
    try:
        os.waitpid(process.pid, 0)
    except ChildProcessError:  # reaped by a call that an interrupt cut short after it returned
        pass
    process.returncode = 0  # reaped: Popen must not wait for it again


def ignore_sigint() -> None:
    """SIGINT ignored from now on (the storm is over, its last signals may still come)."""
    for _ in range(3):  # a signal pending raises before the swap; the next comes >= 0.1 ms later
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return
        except INTERRUPTS:
            pass


def storm(n_workers: int, mode: str, helper: bool, handler: str = "default", seconds: float = STORM_SECONDS) -> dict:
    """Step through a storm; return what was counted and how the process was left."""
    stop, masks = threading.Event(), {}
    replace_with(HANDLERS[handler])
    if helper:  # idle, as torch's OpenMP threads or a Jupyter kernel's are; it reports its signal mask at the end

        def idle() -> None:
            stop.wait()
            masks["helper"] = signal.pthread_sigmask(signal.SIG_BLOCK, [])

        thread = threading.Thread(target=idle, daemon=True)
        thread.start()
    if mode == "engine":  # the pool itself, as an adapter of its own (SB3's) uses it
        options = PoolOptions(n_workers=n_workers, start_method="fork", timeout=5.0)
        env = ShmPool([cartpole] * N_ENVS, options, autoreset_mode=AutoresetMode.NEXT_STEP)
    elif mode == "sb3":
        from shmvec import ShmPoolVecEnv

        env = ShmPoolVecEnv([cartpole] * N_ENVS, n_workers, start_method="fork", timeout=5.0)
    else:  # "main": the main process steps a shard too, where a Ctrl-C raises in the envs' own code
        main_shard = True if mode == "main" else None
        env = ShmVectorEnv(
            [cartpole] * N_ENVS, n_workers, start_method="fork", timeout=5.0, use_main_process=main_shard
        )
    stop_at = time.monotonic() + seconds  # the sender stops itself: the storm's end is quiet
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(os.getpid()), repr(stop_at)], stdin=subprocess.PIPE)
    run = Storm(env, mode, sender)
    try:
        # one call: a Ctrl-C at the entry of a second one, outside its try, would escape
        between_signals(lambda: (run.run(stop_at), reap(sender)), run.counts)  # reaped: its last signals are in
        masks["main"] = between_signals(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, []))
        handler_left = between_signals(lambda: repr(signal.getsignal(signal.SIGINT)))
        handler_as_installed = between_signals(lambda: signal.getsignal(signal.SIGINT) is handlers["installed"])
    finally:
        ignore_sigint()
        sender.stdin.close()
        sender.wait()
    time.sleep(0.01)  # its last signals, ignored
    signal.signal(signal.SIGINT, handlers["installed"])  # the quiet steps are held calls as well
    stop.set()
    if helper:
        thread.join()
    if not run.errors:  # quiet again: the pool must step on exactly as the reference, within its timeout
        run.sender, run.synced = None, False
        for _ in range(50):
            run.step()
    env.close()
    blocked = {name: signal.SIGINT in mask for name, mask in masks.items()}
    left = {"handler_left": handler_left, "handler_as_installed": handler_as_installed}
    return {**run.counts, "errors": run.errors, "sigint_blocked": blocked, **left}


if __name__ == "__main__":
    n_workers, mode, helper = int(sys.argv[1]), sys.argv[2], bool(int(sys.argv[3]))
    handler, seconds = (sys.argv[4:] + ["default"])[0], float((sys.argv[5:] + [STORM_SECONDS])[0])
    print(json.dumps(storm(n_workers, mode, helper, handler, seconds)))
