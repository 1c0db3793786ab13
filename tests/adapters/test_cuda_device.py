"""``device="cuda"`` on a real GPU (skipped where torch sees none): values, page-locking and kept tensors.

The same checks as ``test_vector_device.py`` with real streams, events and page-locked
memory; ``test_cuda_steps.py`` checks the CUDA steps' logic everywhere.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from shmvec import ShmPoolVecEnv, ShmVectorEnv  # noqa: E402
from shmvec.gymnasium_1_1 import AutoresetMode  # noqa: E402
from tests.adapters.test_vector import ENV_FACTORIES, run_equivalence  # noqa: E402
from tests.adapters.test_vector_device import make_pair  # noqa: E402
from tests.helpers import assert_same  # noqa: E402
from tests.torch_results import AsNumpy, async_batches  # noqa: E402

MIXED = ENV_FACTORIES["MixedDict"]


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_cuda_tensors_match_sync_vector_env(mode, closing):
    shm, ref = make_pair(MIXED, closing, mode=mode, device="cuda")
    assert shm._device.pinned and shm._device.device == torch.device("cuda", torch.cuda.current_device())
    counts = run_equivalence(AsNumpy(shm), ref, 150, seed=3)
    assert counts["terminated"] + counts["truncated"] > 0


def test_the_arena_is_page_locked_until_close():
    env = ShmVectorEnv([MIXED] * 4, 2, device="cuda", start_method="fork")
    try:
        view = env._pool.obs_leaves[("image",)]
        assert torch.from_numpy(view).is_pinned()
        env.reset(seed=0)
    finally:
        env.close()
    assert not torch.from_numpy(view).is_pinned()


def test_cuda_tensors_are_the_callers_and_actions_may_be_cuda_tensors(closing):
    env = closing(ShmVectorEnv([MIXED] * 4, 2, device="cuda", start_method="fork"))
    obs, _ = env.reset(seed=0)
    kept = [obs]
    for _ in range(20):
        actions = torch.as_tensor(env.action_space.sample(), device="cuda")
        obs, rewards, terminated, truncated, _ = env.step(actions)
        kept.append((obs, rewards, terminated, truncated))
    snapshots = [_to_cpu(value) for value in kept]
    for _ in range(20):
        env.step(torch.as_tensor(env.action_space.sample(), device="cuda"))
    torch.cuda.synchronize()
    for value, snapshot in zip(kept, snapshots):
        assert_same(_to_cpu(value), snapshot)


def test_a_hand_off_leaves_the_callers_device_and_stream_as_they_were(closing):
    """The side stream is made current for the copies only; the caller's kernels on its own stream see the data."""
    env = closing(ShmVectorEnv([MIXED] * 4, 2, device="cuda", start_method="fork"))
    ref = closing(ShmVectorEnv([MIXED] * 4, 2, start_method="fork"))
    env.reset(seed=0)
    ref.reset(seed=0)
    mine = torch.cuda.Stream()
    with torch.cuda.stream(mine):
        before = (torch.cuda.current_device(), torch.cuda.current_stream())
        actions = env.action_space.sample()
        obs, rewards, *_ = env.step(actions)
        assert (torch.cuda.current_device(), torch.cuda.current_stream()) == before
        doubled = rewards * 2  # queued on my stream: after the copy
    mine.synchronize()
    want_obs, want_rewards, *_ = ref.step(actions)
    assert_same(doubled.cpu().numpy(), want_rewards * 2)
    assert_same(_to_cpu(obs), want_obs)


def test_async_batches_on_cuda_match_numpy_batches(closing):
    """One worker: the same batches in both runs, contiguous ones and gathered ones."""
    runs = [
        async_batches(closing(ShmVectorEnv([MIXED] * 6, 1, batch_size=4, start_method="fork", device=device)))
        for device in (None, "cuda")
    ]
    for t, (got, want) in enumerate(zip(runs[1], runs[0])):
        assert_same(got, want, f"batch {t}")


def test_sb3_page_locks_the_arena_once_cuda_started(closing):
    torch.cuda.init()  # as a model moved to the GPU does; pin_memory=None never starts CUDA itself
    env = closing(ShmPoolVecEnv([ENV_FACTORIES["CartPole"]] * 4, 2, copy=False))
    obs = env.reset()
    assert torch.from_numpy(obs).is_pinned()  # SB3's obs_as_tensor copies it with one DMA
    off = closing(ShmPoolVecEnv([ENV_FACTORIES["CartPole"]] * 4, 2, copy=False, pin_memory=False))
    assert not torch.from_numpy(off.reset()).is_pinned()


def test_no_cuda_context_until_the_caller_makes_one_then_zero_copy_sb3_page_locks(tmp_path):
    """In a new process (this one may have started CUDA already): default envs make no CUDA
    context; once the caller's model is on the GPU, zero-copy SB3 page-locks its arena."""
    script = textwrap.dedent(
        """
        import numpy as np
        import torch
        import gymnasium as gym
        from shmvec import ShmPoolVecEnv, ShmVectorEnv

        def make():
            return gym.make("CartPole-v1")

        if __name__ == "__main__":
            with ShmVectorEnv([make] * 2, 1) as envs:
                envs.reset(seed=0)
                envs.step(envs.action_space.sample())
            with ShmPoolVecEnv([make] * 4, 2) as env:
                env.reset()
                env.step(np.zeros(4, dtype=np.int64))
            with ShmPoolVecEnv([make] * 4, 2, copy=False) as env:
                env.reset()
                env.step(np.zeros(4, dtype=np.int64))
                assert not torch.cuda.is_initialized(), "the envs made a CUDA context"
                torch.nn.Linear(4, 2).to("cuda")  # as SB3 builds its model, after the env
                obs = env.reset()  # learn() resets first
                assert torch.from_numpy(obs).is_pinned(), "not page-locked once CUDA started"
        """
    )
    (tmp_path / "script.py").write_text(script)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _to_cpu(value):
    if isinstance(value, dict):
        return {key: _to_cpu(part) for key, part in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(part) for part in value)
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else value
