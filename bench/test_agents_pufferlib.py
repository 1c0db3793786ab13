"""PufferLib's PettingZoo emulation + ``Multiprocessing`` as SB3 slots (``bench/agents_pufferlib.py``): smoke runs.

Skipped where pufferlib does not import (it is not one of shmvec's extras: see the module).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from bench import agents

pytest.importorskip("pufferlib.vector")
pytest.importorskip("stable_baselines3")
psutil = pytest.importorskip("psutil")

from bench import agents_pufferlib  # noqa: E402 (after the skips)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def _shm() -> set[str]:
    """multiprocessing's /dev/shm entries (heap arenas, SharedMemory, semaphores); others' runs make their own."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {name for name in names if name.startswith(("pym-", "psm_", "sem.mp-"))}


@pytest.mark.smoke
@pytest.mark.parametrize("env_name", list(agents.ENVS))
def test_steps_and_learns_then_leaves_no_process_or_shm(env_name):
    import supersuit as ss
    import torch
    from stable_baselines3 import PPO

    why = agents.missing(env_name) or agents_pufferlib.available()
    if why:
        pytest.skip(why)
    spec = agents.ENVS[env_name]
    before_children, before_shm = _children(), _shm()
    venv = agents_pufferlib.build(env_name, spec.copies, num_workers=2)
    try:
        assert len(_children() - before_children) == 2  # num_workers processes, nothing else
        reference = ss.pettingzoo_env_to_vec_env_v1(spec.make())  # SuperSuit's slots' spaces
        assert venv.observation_space == reference.observation_space
        assert venv.action_space == reference.action_space
        assert venv.num_envs == spec.copies * len(reference.par_env.possible_agents)
        assert repr(venv).startswith(f"PufferAgentVecEnv(num_envs={venv.num_envs}, copies={spec.copies},")

        obs = venv.reset()
        assert obs.shape == (venv.num_envs, *venv.observation_space.shape)
        venv.action_space.seed(0)
        for _ in range(50):
            actions = np.stack([venv.action_space.sample() for _ in range(venv.num_envs)])
            obs, rewards, dones, infos = venv.step(actions)
            assert obs.shape == (venv.num_envs, *venv.observation_space.shape)
            assert obs.dtype == venv.observation_space.dtype and rewards.shape == dones.shape == (venv.num_envs,)
            assert dones.dtype == bool and len(infos) == venv.num_envs and np.isfinite(rewards).all()
        before_step = obs.copy()
        venv.step(actions)
        assert np.array_equal(obs, before_step)  # a copy: the next step does not overwrite it

        torch.manual_seed(0)
        model = PPO("MlpPolicy", venv, n_steps=16, batch_size=64, device="cpu")
        model.learn(2 * 16 * venv.num_envs)
        assert model.num_timesteps == 2 * 16 * venv.num_envs
    finally:
        venv.close()
    assert _children() == before_children
    assert _shm() == before_shm


@pytest.mark.smoke
def test_an_episode_end_is_reported_then_reset_on_the_next_step():
    why = agents.missing("simple_spread") or agents_pufferlib.available()
    if why:
        pytest.skip(why)
    venv = agents_pufferlib.build("simple_spread", 2, num_workers=2)  # max_cycles=25
    try:
        venv.reset()
        actions = np.zeros(venv.num_envs, dtype=np.int64)
        steps = [venv.step(actions) for _ in range(27)]
        dones = [done for _, _, done, _ in steps]
        assert not any(done.any() for done in dones[:24]) and dones[24].all()  # the 25th step ends both copies
        _, rewards, _, infos = steps[25]  # the 26th: PufferLib's reset (actions ignored), reward 0, not done
        assert not dones[25].any() and not rewards.any() and not dones[26].any()
        assert all(info == {} for _, _, _, step_infos in steps for info in step_infos)  # no terminal_observation
    finally:
        venv.close()
