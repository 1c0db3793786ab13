"""The torch results of ``ShmVectorEnv(device=...)``, checked and turned back into numpy to compare with
``SyncVectorEnv``'s (tests import this module only where torch is installed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

FIXED_SIZE = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def as_numpy(value: Any, space: spaces.Space, device: torch.device) -> Any:
    """``value`` (a batch of ``space``) with each fixed-size leaf, checked to be a tensor on ``device`` in the
    leaf's dtype, as a numpy array; the leaves with no fixed size must be what numpy results hold."""
    if isinstance(space, spaces.Dict):
        assert type(value) is dict and list(value) == list(space.spaces), value
        return {key: as_numpy(value[key], sub, device) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        assert type(value) is tuple and len(value) == len(space.spaces), value
        return tuple(as_numpy(part, sub, device) for part, sub in zip(value, space.spaces))
    if isinstance(space, FIXED_SIZE):
        assert isinstance(value, torch.Tensor), f"{type(value).__name__} for {space}"
        assert value.device == device, (value.device, device)
        assert value.dtype == torch_dtype(space.dtype), (value.dtype, space.dtype)
        return value.cpu().numpy()
    assert not isinstance(value, torch.Tensor), space
    return value


def scalars_as_numpy(rewards: Any, terminated: Any, truncated: Any, device: torch.device) -> tuple:
    for tensor, dtype in ((rewards, torch.float64), (terminated, torch.bool), (truncated, torch.bool)):
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == dtype and tensor.device == device, tensor
    return rewards.cpu().numpy(), terminated.cpu().numpy(), truncated.cpu().numpy()


def to_tensors(actions: Any) -> Any:
    """Numpy actions (nested in dicts and tuples too) as CPU tensors of the same dtype; anything else as is."""
    if isinstance(actions, np.ndarray) and actions.dtype != object:
        return torch.from_numpy(actions.copy())
    if isinstance(actions, dict):
        return {key: to_tensors(value) for key, value in actions.items()}
    if isinstance(actions, tuple):
        return tuple(to_tensors(value) for value in actions)
    return actions


class AsNumpy:
    """A ``ShmVectorEnv(device=...)`` seen through numpy: reset/step/recv check the tensors and return arrays;
    ``step`` and ``send`` pass their actions as tensors (``torch_actions=True``); ``device``: where the
    tensors must be (default: the env's)."""

    def __init__(self, env: Any, torch_actions: bool = True, device: torch.device | None = None):
        self.env, self.torch_actions = env, torch_actions
        self.device = device or env._device.device
        self.returned: list[Any] = []  # every tensor result, to check later that none changed

    def _obs(self, obs: Any) -> Any:
        self.returned.append(obs)
        return as_numpy(obs, self.env.observation_space, self.device)

    def reset(self, **kwargs: Any) -> tuple:
        obs, infos = self.env.reset(**kwargs)
        return self._obs(obs), infos

    def step(self, actions: Any) -> tuple:
        obs, *flags, infos = self.env.step(to_tensors(actions) if self.torch_actions else actions)
        self.returned.append(flags)
        return self._obs(obs), *scalars_as_numpy(*flags, self.device), infos

    def recv(self) -> tuple:
        obs, *flags, infos = self.env.recv()
        self.returned.append(flags)
        space = self.env.single_observation_space
        from gymnasium.vector.utils import batch_space

        batch = as_numpy(obs, batch_space(space, len(infos["env_id"])), self.device)
        return batch, *scalars_as_numpy(*flags, self.device), infos

    def send(self, actions: Any, env_ids: Any = None) -> None:
        self.env.send(to_tensors(actions) if self.torch_actions else actions, env_ids)


def async_batches(env: Any, rounds: int = 60, seed: int = 5, device: torch.device | None = None) -> list[tuple]:
    """``rounds`` batches of ``recv`` after ``async_reset(seed=seed)``, each as numpy (a ``device=`` env's
    tensors checked and copied back), each followed by a ``send`` of random actions (tensors to a
    ``device=`` env). ``device``: where its tensors must be (default: the env's)."""
    view = env if env._device is None else AsNumpy(env, device=device)
    env.async_reset(seed=seed)
    env.single_action_space.seed(seed)
    batches = []
    for _ in range(rounds):
        batch = view.recv()
        batches.append(batch)
        view.send(np.stack([env.single_action_space.sample() for _ in batch[-1]["env_id"]]))
    return batches
