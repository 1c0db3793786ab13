"""``ShmVectorEnv(device="cpu")``: the whole tensor API on the CPU, against ``SyncVectorEnv``.

Observations (every fixed-size leaf), rewards and flags come as torch tensors in the
space's dtype, with values equal to ``SyncVectorEnv``'s for the same seeds and actions;
actions may be tensors; returned tensors never change; async batches and infos as with
numpy. The CUDA-only steps are in ``test_cuda_steps.py`` (without a GPU) and
``test_cuda_device.py`` (with one).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

torch = pytest.importorskip("torch")

from shmvec import ShmVectorEnv  # noqa: E402
from shmvec.gymnasium_1_1 import AutoresetMode  # noqa: E402
from tests.adapters.test_vector import ENV_FACTORIES, run_equivalence  # noqa: E402
from tests.envs import make_any_space, make_dict_action, make_image  # noqa: E402
from tests.helpers import assert_same  # noqa: E402
from tests.torch_results import AsNumpy, async_batches, to_tensors  # noqa: E402

pytestmark = pytest.mark.vector_api  # ShmVectorEnv: Gymnasium 1.1 on (tests/conftest.py)

CPU = torch.device("cpu")
DEVICE_ENVS = {
    "CartPole": ENV_FACTORIES["CartPole"],
    "MixedDict": ENV_FACTORIES["MixedDict"],  # Dict: float32, uint8, Discrete, MultiBinary, MultiDiscrete, float64
    "TupleObs": ENV_FACTORIES["TupleObs"],
    "Image": make_image,  # uint8 frames stay uint8
    "DictAction": make_dict_action,  # a dict of action tensors
    "AnySpace": make_any_space,  # leaves with no fixed size stay Python objects beside the tensors
}
MODES = list(AutoresetMode)


def make_pair(fn, closing, n_envs=5, n_workers=2, mode=AutoresetMode.NEXT_STEP, device="cpu", **kwargs):
    shm = closing(
        ShmVectorEnv([fn] * n_envs, n_workers, autoreset_mode=mode, start_method="fork", device=device, **kwargs)
    )
    ref = closing(SyncVectorEnv([fn] * n_envs, autoreset_mode=mode))
    return shm, ref


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize("env_name", list(DEVICE_ENVS))
def test_tensors_match_sync_vector_env(env_name, mode, closing):
    """Same seeds and actions (given as tensors): same values, tensors of the space's dtypes, numpy infos."""
    shm, ref = make_pair(DEVICE_ENVS[env_name], closing, mode=mode)
    counts = run_equivalence(AsNumpy(shm), ref, 150, seed=3)
    assert counts["terminated"] + counts["truncated"] > 0, counts


def test_numpy_actions_and_main_shard_work_too(closing):
    shm, ref = make_pair(ENV_FACTORIES["MixedDict"], closing, n_envs=4, n_workers=1, use_main_process=True)
    counts = run_equivalence(AsNumpy(shm, torch_actions=False), ref, 100, seed=1)
    assert counts["terminated"] + counts["truncated"] > 0, counts


def test_returned_tensors_never_change(closing):
    shm, ref = make_pair(ENV_FACTORIES["MixedDict"], closing)
    seen = AsNumpy(shm)
    run_equivalence(seen, ref, 40, seed=0)
    snapshots = [_clone(value) for value in seen.returned]
    for _ in range(10):
        shm.step(to_tensors(shm.action_space.sample()))
    for kept, snapshot in zip(seen.returned, snapshots):
        assert_same(_as_arrays(kept), _as_arrays(snapshot))
    leaves = [_leaves(value) for value in seen.returned[:3]]
    for a, b in zip(leaves[0], leaves[2]):
        assert not np.shares_memory(a.numpy(), b.numpy())


def test_copy_false_gives_views_of_the_shared_rows_on_cpu(closing):
    shm, ref = make_pair(ENV_FACTORIES["CartPole"], closing, copy=False)
    obs0, _ = shm.reset(seed=0)
    ref.reset(seed=0)
    actions = np.array([0, 1, 0, 1, 1])
    obs1, rewards, *_ = shm.step(torch.from_numpy(actions))
    want, want_rewards, *_ = ref.step(actions)
    assert np.shares_memory(obs0.numpy(), obs1.numpy())  # one shared buffer, overwritten by the step
    assert_same(obs0.numpy(), want)
    assert_same(rewards.numpy(), want_rewards)
    assert not np.shares_memory(rewards.numpy(), shm._pool.rewards)  # rewards and flags are always copies


def test_async_batches_give_tensors_equal_to_numpy_batches(closing):
    """One worker steps its envs in inbox order, so both runs see the same batches (env ids and rows)."""
    fn = ENV_FACTORIES["MixedDict"]
    runs = [  # async_batches checks every tensor (uint8 frames stay uint8) on its way back to numpy
        async_batches(closing(ShmVectorEnv([fn] * 6, 1, batch_size=4, start_method="fork", device=device)))
        for device in (None, "cpu")
    ]
    ended = sum(int((b[2] | b[3]).sum()) for b in runs[0])
    assert ended > 0
    for t, (got, want) in enumerate(zip(runs[1], runs[0])):
        assert_same(got, want, f"batch {t}")


def test_reset_with_a_mask_and_disabled_autoreset(closing):
    shm, ref = make_pair(ENV_FACTORIES["CartPole"], closing, mode=AutoresetMode.DISABLED)
    counts = run_equivalence(AsNumpy(shm), ref, 200, seed=7)
    assert counts["masked_resets"] > 0, counts


def test_infos_stay_numpy(closing):
    shm, ref = make_pair(ENV_FACTORIES["CartPole"], closing, mode=AutoresetMode.SAME_STEP)
    shm.reset(seed=0)
    for _ in range(60):
        *_, infos = shm.step(torch.ones(5, dtype=torch.int64))
        if "final_obs" in infos:
            break
    assert isinstance(infos["final_obs"], np.ndarray) and isinstance(infos["_final_obs"], np.ndarray)


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_is_accepted_as_a_string_or_a_torch_device(device, closing):
    env = closing(ShmVectorEnv([ENV_FACTORIES["CartPole"]] * 2, 1, device=device))
    obs, _ = env.reset(seed=0)
    assert obs.device == CPU


@pytest.mark.parametrize("device", ["gpu:7", 3.5, object()])
def test_a_bad_device_fails_before_any_worker_starts(device):
    with pytest.raises(ValueError, match="device must be a torch device"):
        ShmVectorEnv([ENV_FACTORIES["CartPole"]] * 2, 1, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_says_so_before_any_worker_starts():
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        ShmVectorEnv([ENV_FACTORIES["CartPole"]] * 2, 1, device="cuda")


def test_without_device_shmvec_never_imports_torch(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import gymnasium as gym
        import shmvec

        if __name__ == "__main__":
            with shmvec.ShmVectorEnv([lambda: gym.make("CartPole-v1")] * 2, n_workers=1) as envs:
                envs.reset(seed=0)
                envs.step(envs.action_space.sample())
            assert "torch" not in sys.modules, "shmvec imported torch"
        """
    )
    (tmp_path / "script.py").write_text(script)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _leaves(value):
    if isinstance(value, dict):
        return [leaf for part in value.values() for leaf in _leaves(part)]
    if isinstance(value, (tuple, list)):
        return [leaf for part in value for leaf in _leaves(part)]
    return [value] if isinstance(value, torch.Tensor) else []


def _clone(value):
    if isinstance(value, dict):
        return {key: _clone(part) for key, part in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(part) for part in value)
    return value.clone() if isinstance(value, torch.Tensor) else value


def _as_arrays(value):
    if isinstance(value, dict):
        return {key: _as_arrays(part) for key, part in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_as_arrays(part) for part in value)
    return value.numpy() if isinstance(value, torch.Tensor) else value
