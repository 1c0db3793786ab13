"""Helpers shared by the test files: one strict comparison, process / /dev/shm probes, SIGINT's handler.

Fixtures live in ``conftest.py``; this plain module holds what test files import by name.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil

SHM_DIR = "/dev/shm"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: the cwd of scripts the tests run


# -- comparison ---------------------------------------------------------------------------


def assert_same(got: Any, want: Any, where: str = "value") -> None:
    """Fail unless ``got`` is ``want`` bit for bit.

    Same types (a dict subclass or a named tuple must keep its class), same dict keys in
    the same order, same lengths, same numpy dtypes and shapes, same bytes (so ``-0.0`` is
    not ``0.0``); NaN equals NaN wherever both hold one. Object arrays compare element by
    element under these rules.

    Example:
        >>> assert_same({"a": np.array([np.nan, 1.0])}, {"a": np.array([np.nan, 1.0])})
        >>> assert_same({"a": 1, "b": 2}, {"b": 2, "a": 1})
        Traceback (most recent call last):
        AssertionError: value: keys ['a', 'b'] != ['b', 'a']
    """
    assert type(got) is type(want), f"{where}: type {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, (np.ndarray, np.generic)):
        _assert_same_array(np.asarray(got), np.asarray(want), where)
    elif isinstance(want, float):
        same = math.isnan(got) and math.isnan(want) or struct.pack("<d", got) == struct.pack("<d", want)
        assert same, f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _assert_same_array(got: np.ndarray, want: np.ndarray, where: str) -> None:
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (
        f"{where}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    )
    if want.dtype == object:
        for i, (g, w) in enumerate(zip(got.ravel(), want.ravel())):
            assert_same(g, w, f"{where}.flat[{i}]")
        return
    if want.dtype.kind in "fc":  # NaN payloads may differ: compare where NaNs are, and the rest's bytes
        nan = np.isnan(want)
        same = np.array_equal(np.isnan(got), nan) and got[~nan].tobytes() == want[~nan].tobytes()
    else:
        same = got.tobytes() == want.tobytes()
    assert same, f"{where}: values differ\n got {got!r}\nwant {want!r}"


# -- processes ----------------------------------------------------------------------------


def pool_pids(env: Any) -> list[int]:
    """Pids of a ``ShmPoolVecEnv``'s or ``ShmVectorEnv``'s worker processes, in worker order."""
    return [link.process.pid for link in env._pool.links]


def env_pids(env: Any) -> list[int]:
    """Per env, the pid its own ``pid()`` method reports (``tests/faulty.py`` envs), in env order."""
    return list(env.env_method("pid") if hasattr(env, "env_method") else env.call("pid"))  # SB3's API, or Gymnasium's


def descendant_pids() -> set[int]:
    """This process's descendants, except multiprocessing's long-lived helpers.

    The forkserver and the resource tracker live for the whole session; the workers a
    forkserver forks carry the same command line, so they are told apart by their parent.
    """
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            parent_cmdline = " ".join(child.parent().cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, AttributeError):
            continue
        if "resource_tracker" in cmdline:
            continue
        if "forkserver" in cmdline and "forkserver" not in parent_cmdline:
            continue  # the server itself, not one of its workers
        pids.add(child.pid)
    return pids


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts: its parent has yet to reap it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_and_wait(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL ``pid`` (a worker) and wait until it is gone, so the next call meets a dead worker."""
    os.kill(pid, signal.SIGKILL)
    poll_until(lambda: gone(pid), timeout)


def poll_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` every 50 ms; whether it came true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- /dev/shm -----------------------------------------------------------------------------


def shm_of(pid: int) -> list[str]:
    """The segments and semaphores in /dev/shm that process ``pid`` created (names embed it)."""
    prefix = f"shmvec_{pid}_"
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [n for n in names if n.startswith(prefix) or n.startswith("sem." + prefix)]


def shm_entries() -> set[str]:
    """This process's segments and semaphores in /dev/shm (semaphores show up as sem.<name>).

    Only this process's: other test runs or benchmarks on the same machine must not make
    our tests fail.
    """
    return set(shm_of(os.getpid()))


# -- SIGINT -------------------------------------------------------------------------------


@contextlib.contextmanager
def default_sigint_handler() -> Iterator[None]:
    """Python's own SIGINT handler (Ctrl-C raises ``KeyboardInterrupt``) inside the block; the one found, after.

    Python installs it at start-up only over the kernel's default: a process started with SIGINT
    ignored (a background job of a script, ``nohup``, many job runners) keeps it ignored, and so
    would every test that sends a Ctrl-C. A program the block starts (exec resets a handled
    signal) gets Python's handler too; still, a script a test runs that relies on it installs it
    itself, as it may be run by hand. The tests' fixture: ``default_sigint`` (conftest.py).
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
