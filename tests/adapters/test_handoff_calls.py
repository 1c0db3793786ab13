"""The calls one hand-off of ``ShmVectorEnv(device="cuda")`` makes, counted on the CPU stand-ins of CUDA's calls.

The host side of a hand-off is Python and CUDA API calls, each a few microseconds: their
number is its cost, so it is pinned here. A whole step (observations, rewards and flags):
one copy of one span of the arena, one event (recorded again, not made), five stream calls
(the caller's stream looked up, the side stream made current and back, the caller's wait,
the device buffer marked as used there), one synchronization (before the workers rewrite the
rows), no pinned staging; one tensor for the device buffer, one view per returned array and
one per dtype other than uint8. An async batch: the same, with one pinned staging buffer
when its rows are scattered (and no synchronization when it reads no shared row).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gymnasium.vector.utils import batch_space

torch = pytest.importorskip("torch")

from shmvec import ShmVectorEnv  # noqa: E402
from shmvec.adapters import cuda_copies  # noqa: E402
from shmvec.ipc import pinning  # noqa: E402
from shmvec.tools.cuda_stand_ins import CATEGORIES, StandInCalls, TensorCount  # noqa: E402
from tests.adapters.test_vector import ENV_FACTORIES  # noqa: E402
from tests.envs import ImageObsEnv  # noqa: E402

FRAMES = functools.partial(ImageObsEnv, 84, 84)  # 84x84x3 uint8 frames, random episode ends
STEPS = 30


class Host(pinning.CudaHost):
    """Page-locking that succeeds and does nothing."""

    def register(self, address: int, nbytes: int, device: int | None) -> int:
        return 0

    def unregister(self, address: int, device: int | None) -> int:
        return 0


@pytest.fixture
def stand_ins(monkeypatch):
    monkeypatch.setattr(cuda_copies, "cuda_calls", StandInCalls)
    monkeypatch.setattr(pinning, "cuda_host", Host())


def counted(env, call) -> dict[str, int]:
    """The calls ``call()`` makes through the env's CUDA stand-ins, and the tensors torch makes meanwhile."""
    counts = env._device._cuda.counts
    counts.clear()
    with TensorCount(torch) as tensors:
        call()
    return {**{kind: counts[kind] for kind in CATEGORIES}, "tensors": tensors.made}


def views_made(env) -> int:
    """One view per returned array (observation leaves, rewards, two flags), one more per dtype but uint8."""
    arrays = [*env._pool.obs_leaves.values(), env._pool.rewards, env._pool.terminated, env._pool.truncated]
    dtypes = {torch.from_numpy(array[:0]).dtype for array in arrays} - {torch.uint8}
    return len(arrays) + len(dtypes)


@pytest.mark.parametrize("env_name", ["Atari-like frames", "MixedDict"])
def test_a_whole_step_makes_one_copy_one_event_five_stream_calls(env_name, stand_ins, closing):
    fn, n_envs = (FRAMES, 16) if env_name == "Atari-like frames" else (ENV_FACTORIES["MixedDict"], 8)
    env = closing(ShmVectorEnv([fn] * n_envs, 2, device="cuda", start_method="fork"))
    env.reset(seed=0)
    env.step(env.action_space.sample())  # the first hand-off after the reset makes its event
    for _ in range(STEPS):
        actions = env.action_space.sample()
        got = counted(env, functools.partial(env.step, actions))
        want = {"copies": 1, "staging": 0, "events": 1, "new events": 0, "stream ops": 5, "synchronizations": 1}
        assert got == {**want, "tensors": 1 + views_made(env)}


def test_a_reset_makes_the_same_calls(stand_ins, closing):
    env = closing(ShmVectorEnv([FRAMES] * 8, 2, device="cuda", start_method="fork"))
    env.reset(seed=0)
    got = counted(env, lambda: env.reset(seed=1))
    want = {"copies": 1, "staging": 0, "events": 1, "new events": 0, "stream ops": 5, "synchronizations": 1}
    assert got == {**want, "tensors": 1 + len(env._pool.obs_leaves)}  # observations only: uint8


@pytest.mark.parametrize("fn", [FRAMES, ENV_FACTORIES["MixedDict"]], ids=["frames", "MixedDict"])
def test_an_async_batch_makes_one_copy_and_one_event(fn, stand_ins, closing):
    """1 worker: batches of 4 of 6 envs in env order, runs of rows (read in place) and wrapped around (gathered
    into pinned memory); 2 workers: batches mostly mix the workers' envs."""
    kinds = set()
    for n_workers in (1, 2):
        env = closing(ShmVectorEnv([fn] * 6, n_workers, batch_size=4, start_method="fork", device="cuda"))
        kinds |= batches_counted(env)
    assert kinds == {True, False}


def batches_counted(env) -> set[bool]:
    """Checks the calls of each recv and send; which kinds of batches went by (gathered or not)."""
    env.async_reset(seed=0)
    kinds = set()
    for _ in range(60):
        batch: list = []
        got = counted(env, functools.partial(_append_recv, env, batch))
        ids = batch[0][-1]["env_id"]
        gathered = bool((np.diff(ids) != 1).any())
        kinds.add(gathered)
        assert {kind: got[kind] for kind in ("copies", "events", "stream ops")} == {
            "copies": 1,
            "events": 1,
            "stream ops": 5,
        }
        assert got["staging"] == gathered and got["synchronizations"] == 0
        new_plan = 1  # a run of rows seen for the first time: the slice of the arena it copies
        assert got["tensors"] <= 1 + views_made(env) + (1 if gathered else new_plan)
        actions = batch_space(env.single_action_space, len(ids)).sample()
        sent = counted(env, functools.partial(env.send, actions, ids))
        assert sent["synchronizations"] <= 1 and sent["copies"] == sent["stream ops"] == sent["tensors"] == 0
    return kinds


def _append_recv(env, batches: list) -> None:
    batches.append(env.recv())


def test_arrays_anywhere_are_copied_in_one_copy_with_their_values():
    """Views of a buffer that ends short of a whole item (the span cannot be widened to one), and arrays that own
    their memory (gathered into pinned memory): one copy each time, and the values of the rows asked for."""
    calls = StandInCalls(torch)
    calls.start(None)
    copies = cuda_copies.CudaCopies(torch, calls, 5)
    memory = bytearray(109)
    shared = [
        np.ndarray((5, 3), np.float32, memory, 0),
        np.ndarray((5,), np.float64, memory, 64),
        np.ndarray((5,), np.bool_, memory, 104),
    ]
    owned = [np.arange(15, dtype=np.int16).reshape(5, 3), np.arange(5, dtype=np.float64)]
    rng = np.random.default_rng(0)
    shared[0][:] = rng.random((5, 3))
    shared[1][:] = rng.random(5)
    shared[2][:] = rng.random(5) < 0.5
    for arrays in (shared, owned):
        for env_ids in (None, np.array([1, 2, 3]), np.array([4]), np.array([0, 2, 4])):
            calls.counts.clear()
            got = copies.copy(arrays, env_ids)
            assert calls.counts["copies"] == 1
            for tensor, array in zip(got, arrays):
                want = array if env_ids is None else array[env_ids]
                assert tensor.dtype == torch.from_numpy(want).dtype
                np.testing.assert_array_equal(tensor.numpy(), want)
            copies.fences.before_write(env_ids)
