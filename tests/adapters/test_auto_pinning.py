"""Page-locking by default never makes a CUDA context: ``ShmPoolVecEnv(pin_memory=None)`` and ``ShmVectorEnv()``.

With torch imported, neither adapter calls into CUDA unless asked (``device="cuda"``,
``pin_memory=True``). ``ShmPoolVecEnv(copy=False)`` page-locks its arena once, lazily, when
it finds CUDA already started at its construction or one of its first resets and steps (SB3
moves its model to the GPU after building the env); with ``copy=True`` it never looks.
``shmvec.ipc.pinning.cuda_host`` is replaced by a recorder; ``test_cuda_device.py`` checks
the same on a GPU.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shmvec import ShmPoolVecEnv, ShmVectorEnv  # noqa: E402
from shmvec.adapters import sb3  # noqa: E402
from shmvec.ipc import pinning  # noqa: E402
from tests.adapters.test_cuda_steps import CARTPOLE, RecordingHost  # noqa: E402

# Calls of torch.cuda that load the driver or make a context (is_available may load the driver).
CUDA_CALLS = ("is_available", "init", "_lazy_init", "device_count", "current_device", "set_device", "device")
CUDA_CALLS += ("synchronize", "cudart", "mem_get_info")


class Host(RecordingHost):
    """The recorder of CUDA host calls; ``initialized=None``: answers from torch, as the real one."""

    def cuda_initialized(self) -> bool:
        self.looks += 1
        return pinning.CudaHost.cuda_initialized(self) if self.initialized is None else self.initialized


@pytest.fixture
def host(monkeypatch):
    host = Host([], [], initialized=None)
    monkeypatch.setattr(pinning, "cuda_host", host)
    return host


@pytest.fixture
def cuda_calls(monkeypatch):
    """The names of the ``torch.cuda`` calls made in this process, in order."""
    calls: list[str] = []

    def recorder(name, original):
        def call(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return call

    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, recorder(name, getattr(torch.cuda, name)))
    return calls


def _steps(env, n: int) -> None:
    for _ in range(n):
        env.step(np.zeros(env.num_envs, dtype=np.int64))


ADAPTERS = {
    "ShmPoolVecEnv": lambda **kw: ShmPoolVecEnv([CARTPOLE] * 4, 2, start_method="fork", **kw),
    "ShmVectorEnv": lambda **kw: ShmVectorEnv([CARTPOLE] * 4, 2, start_method="fork", **kw),
}


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "zero-copy"])
@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_no_cuda_call_without_device_or_pin_memory(adapter, copy, host, cuda_calls, closing):
    if not copy and adapter == "ShmPoolVecEnv" and torch.cuda.is_initialized():
        pytest.skip("CUDA already started in this process: zero-copy SB3 page-locks then, as it should")
    started = torch.cuda.is_initialized()
    env = closing(ADAPTERS[adapter](copy=copy))
    env.reset()
    _steps(env, 5)
    env.close()
    assert cuda_calls == [] and host.log == []  # nothing registered, no driver loaded, no context
    assert torch.cuda.is_initialized() == started
    looked = adapter == "ShmPoolVecEnv" and not copy
    assert (host.looks > 0) == looked  # only zero-copy SB3 asks (torch's flag, no CUDA call) whether CUDA runs


@pytest.mark.parametrize("starts", [0, 1, 2], ids=["before-construction", "before-reset", "before-step-3"])
def test_zero_copy_sb3_page_locks_once_when_cuda_starts_after_it(starts, host, closing):
    host.initialized = starts == 0
    env = closing(ADAPTERS["ShmPoolVecEnv"](copy=False))
    assert len(host.log) == (starts == 0)
    host.initialized = starts <= 1
    env.reset()
    _steps(env, 2)
    assert [entry[0] for entry in host.log] == (["register"] if starts <= 1 else [])
    host.initialized = True  # the caller's model moved to the GPU
    _steps(env, 1)
    looks = host.looks
    _steps(env, 20)
    env.close()
    assert [entry[0] for entry in host.log] == ["register", "unregister"]  # once, and undone at close
    assert host.looks == looks  # no look after page-locking


def test_zero_copy_sb3_stops_looking_after_its_first_steps(host, monkeypatch, closing):
    monkeypatch.setattr(sb3, "PIN_CHECKS", 10)
    host.initialized = False
    env = closing(ShmPoolVecEnv([CARTPOLE] * 2, 1, start_method="fork", copy=False))
    env.reset()
    _steps(env, 15)
    assert host.looks == 11  # the constructor's, then the first reset's and 9 steps'
    host.initialized = True  # too late: page-locking now would cost every later step a look
    _steps(env, 5)
    env.reset()
    assert host.looks == 11 and host.log == []


def test_asking_whether_cuda_started_never_imports_torch():
    code = "import sys; from shmvec.ipc import pinning; "
    code += "print(pinning.cuda_host.cuda_initialized(), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
