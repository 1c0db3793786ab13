"""Stand-in policies: the compute a training loop runs between two vector steps.

A vector env is fast or slow in the loop the user runs, where a policy's forward pass
(torch, all its threads) sits between steps; ``python -m shmvec.tune --policy`` and the
demo measure with one of these in the loop. Each is a callable taking the batch of
observations the step returned:

- ``"mlp"``: SB3's ``MlpPolicy`` (actor and critic, 64-64 tanh) on the flattened observations;
- ``"cnn"``: SB3's ``CnnPolicy`` (the Nature CNN: 3 conv layers, 512 features) on 84x84 frames;
- ``"none"``: nothing (a bare stepping loop);
- ``"module:callable"``: the user's own, called with the observations.

torch is imported only by ``"mlp"`` and ``"cnn"``, and its thread count is left as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

StandIn = Callable[[Any], Any]
CHOICES = ("none", "mlp", "cnn")


def stand_in_policy(name: str, obs_shape: tuple[int, ...], n_actions: int = 2) -> StandIn | None:
    """The stand-in called ``name`` for observations of ``obs_shape`` (one env's); None for ``"none"``.

    Example:
        >>> policy = stand_in_policy("mlp", (4,))
        >>> policy(np.zeros((8, 4), np.float32)).shape
        torch.Size([8, 2])
    """
    if name == "none":
        return None
    if name not in CHOICES:
        return _user_callable(name)
    import torch
    from torch import nn

    if name == "mlp":
        n_in = int(np.prod(obs_shape))
        actor = nn.Sequential(
            nn.Flatten(), nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_actions)
        )
        critic = nn.Sequential(
            nn.Flatten(), nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
        )
    else:
        channels = _channels(obs_shape)
        actor = nn.Sequential(
            nn.Conv2d(channels, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )
        critic = None

    @torch.no_grad()
    def forward(obs: Any) -> Any:
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        if name == "cnn":
            x = _channels_first(x, obs_shape)
        logits = actor(x)
        if critic is not None:
            critic(x)
        return logits

    return forward


def _channels(obs_shape: tuple[int, ...]) -> int:
    if len(obs_shape) != 3 or sorted(obs_shape)[1:] != [84, 84]:
        raise ValueError(
            f"--policy cnn needs 84x84 frames with channels first or last, got observations of shape {obs_shape}"
        )
    return obs_shape[0] if obs_shape[1:] == (84, 84) else obs_shape[-1]


def _channels_first(x: Any, obs_shape: tuple[int, ...]) -> Any:
    return x if obs_shape[1:] == (84, 84) else x.permute(0, 3, 1, 2)


def _user_callable(spec: str) -> StandIn:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"policy must be one of {CHOICES} or module:callable, got {spec!r}")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load policy {spec!r}: {exc}") from None
