"""Picklable operations the adapters run on envs inside the workers (rare path).

Slotted dataclasses, not frozen ones: nothing changes an op once made, and a frozen one's
``__init__`` (``object.__setattr__`` per field) costs ~0.3 µs more, as much as a third of a
whole ``env_method`` call of DummyVecEnv's with every env in this process (MaskablePPO
makes one a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym


@dataclass(slots=True)
class GetWrapperAttr:
    """``env.get_wrapper_attr(name)`` (SB3 ``get_attr``)."""

    name: str

    def __call__(self, env: gym.Env) -> Any:
        return env.get_wrapper_attr(self.name)


@dataclass(slots=True)
class HasWrapperAttr:
    """Whether ``env.get_wrapper_attr(name)`` succeeds, computed where the value lives."""

    name: str

    def __call__(self, env: gym.Env) -> bool:
        try:
            env.get_wrapper_attr(self.name)
        except AttributeError:
            return False
        return True


@dataclass(slots=True)
class SetAttr:
    """``setattr(env, name, value)`` on the outermost wrapper (SB3 ``set_attr``)."""

    name: str
    value: Any

    def __call__(self, env: gym.Env) -> None:
        setattr(env, self.name, self.value)


@dataclass(slots=True)
class CallMethod:
    """``env.get_wrapper_attr(name)(*args, **kwargs)`` (SB3 ``env_method``)."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self, env: gym.Env) -> Any:
        return env.get_wrapper_attr(self.name)(*self.args, **self.kwargs)


@dataclass(slots=True)
class IsWrapped:
    """Whether ``env`` is wrapped by ``wrapper_class`` anywhere in its wrapper stack.

    The logic of SB3's ``env_util.is_wrapped``, kept here so workers never import SB3
    (and with it torch) just to answer this.
    """

    wrapper_class: type

    def __call__(self, env: gym.Env) -> bool:
        current = env
        while isinstance(current, gym.Wrapper):
            if isinstance(current, self.wrapper_class):
                return True
            current = current.env
        return False


@dataclass(slots=True)
class Render:
    """``env.render()``."""

    def __call__(self, env: gym.Env) -> Any:
        return env.render()


@dataclass(slots=True)
class CallOrGet:
    """``env.get_wrapper_attr(name)``, called with the arguments if callable (Gymnasium ``VectorEnv.call``)."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self, env: gym.Env) -> Any:
        attr = env.get_wrapper_attr(self.name)
        return attr(*self.args, **self.kwargs) if callable(attr) else attr


@dataclass(slots=True)
class SetWrapperAttr:
    """``env.set_wrapper_attr(name, value)`` (Gymnasium ``VectorEnv.set_attr``)."""

    name: str
    value: Any

    def __call__(self, env: gym.Env) -> None:
        env.set_wrapper_attr(self.name, self.value)


@dataclass(slots=True)
class Nothing:
    """Does nothing: its answer proves the worker is serving commands (it has attached the arena)."""

    def __call__(self, env: gym.Env) -> None:
        return None


def patch_legacy_env(env: Any) -> gym.Env:
    """SB3's ``_patch_env`` (old ``gym`` envs -> Gymnasium via shimmy), imported only when needed.

    Importing SB3 in every spawn/forkserver worker would also import torch: seconds of
    start-up and hundreds of MB per worker, for envs that are nearly always Gymnasium's.
    """
    if isinstance(env, gym.Env):
        return env
    from stable_baselines3.common.vec_env.patch_gym import _patch_env

    return _patch_env(env)
