"""An env built from a random design, for the property tests: every value it returns comes from its seed.

:class:`SpecEnv` samples its observations from its observation space, ends episodes at
random (terminated, truncated, or both at once), returns infos whose keys vary from step
to step, and folds every action it receives into its reward, so a lost or changed
action shows up in the results. It keeps what it received, for tests that compare that
with what a reference hands its envs.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# Float values a sampled Box never holds, and a byte-exact comparison must still keep.
SPECIAL_FLOATS = (np.nan, -0.0, np.inf, -np.inf)


@dataclass(frozen=True)
class InfoKey:
    """One key an env may put in its infos, with the kind of value it holds there.

    ``kind`` is one of ``int``, ``float``, ``bool``, ``str``, ``none``, ``list``, ``dict``
    (nested, with an int and an array), ``scalar`` (a numpy scalar of ``dtype``) or
    ``array`` (``dtype`` and ``shape``). A key keeps its kind: the references batch a key
    in an array typed by the first env that reported it.
    """

    name: str
    kind: str
    dtype: str = "float64"
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class EnvDesign:
    """What a :class:`SpecEnv` looks like and how often things happen in it."""

    observation_space: spaces.Space
    action_space: spaces.Space
    p_terminated: float = 0.1
    p_truncated: float = 0.1
    p_info: float = 0.5
    p_special: float = 0.1
    info_keys: tuple[InfoKey, ...] = ()


class SpecEnv(gym.Env):
    """An env whose spaces, episode ends and infos follow an :class:`EnvDesign`, driven by its seed."""

    def __init__(self, design: EnvDesign):
        self.design = design
        # Own copies: envs of one process must not share the spaces' random generators.
        self.observation_space = copy.deepcopy(design.observation_space)
        self.action_space = copy.deepcopy(design.action_space)
        self.received: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return self._obs(), self._info()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.received.append(copy.deepcopy(action))
        rng = self.np_random
        reward = float(rng.normal()) + action_digest(action, self.action_space)
        terminated = bool(rng.random() < self.design.p_terminated)
        truncated = bool(rng.random() < self.design.p_truncated)
        return self._obs(), reward, terminated, truncated, self._info()

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        obs = self.observation_space.sample()
        return with_special_floats(obs, self.observation_space, self.np_random, self.design.p_special)

    def _info(self) -> dict[str, Any]:
        rng = self.np_random
        if not self.design.info_keys or rng.random() >= self.design.p_info:
            return {}
        return {key.name: info_value(key, rng) for key in self.design.info_keys if rng.random() < 0.6}


def with_special_floats(obs: Any, space: spaces.Space, rng: np.random.Generator, p: float) -> Any:
    """``obs`` with, in each float Box leaf and with probability ``p``, one element set to NaN, -0.0 or ±inf."""
    if isinstance(space, spaces.Dict):
        return {key: with_special_floats(obs[key], sub, rng, p) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(with_special_floats(part, sub, rng, p) for part, sub in zip(obs, space.spaces))
    if isinstance(space, spaces.Box) and space.dtype.kind == "f" and obs.size and rng.random() < p:
        obs = obs.copy()
        obs.flat[int(rng.integers(obs.size))] = SPECIAL_FLOATS[int(rng.integers(len(SPECIAL_FLOATS)))]
    return obs


def info_value(key: InfoKey, rng: np.random.Generator) -> Any:
    """A random value of ``key``'s kind."""
    kind = key.kind
    if kind == "int":
        return int(rng.integers(-5, 5))
    if kind == "float":
        return float(SPECIAL_FLOATS[int(rng.integers(4))]) if rng.random() < 0.2 else float(rng.normal())
    if kind == "bool":
        return bool(rng.random() < 0.5)
    if kind == "str":
        return "x" * int(rng.integers(0, 4))
    if kind == "none":
        return None
    if kind == "list":
        return [int(rng.integers(0, 9)) for _ in range(int(rng.integers(0, 3)))]
    if kind == "dict":
        return {"n": int(rng.integers(0, 9)), "v": rng.normal(size=2)}
    values = random_array(np.dtype(key.dtype), key.shape, rng)
    return values[()] if kind == "scalar" else values


def random_array(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values of ``dtype`` spread over a small range around 0 (within the dtype's range)."""
    values = rng.normal(0, 50, shape)
    if dtype.kind == "b":
        return values > 0
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        values = np.clip(np.rint(values), max(limits.min, -128), min(limits.max, 255))
    return values.astype(dtype)


def canonical_action(action: Any, space: spaces.Space) -> Any:
    """An action as the env computes with it: dict keys in the space's order, tuples as
    tuples, every fixed-size leaf as a numpy array (so a Python int and an ``int64``
    scalar are one thing, a ``float32`` and a ``float64`` row are not); other leaves as given."""
    if isinstance(space, spaces.Dict):
        return {key: canonical_action(action[key], sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(canonical_action(action[k], sub) for k, sub in enumerate(space.spaces))
    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)):
        return np.array(action)
    return action


def action_digest(action: Any, space: spaces.Space) -> float:
    """A number in [0, 1) that changes with any leaf's dtype or bytes (stable across processes)."""
    crc = 0
    for leaf in _leaves(canonical_action(action, space)):
        data = (leaf.dtype.str.encode() + leaf.tobytes()) if isinstance(leaf, np.ndarray) else repr(leaf).encode()
        crc = zlib.crc32(data, crc)
    return crc / 2**32


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        return [leaf for sub in value.values() for leaf in _leaves(sub)]
    if isinstance(value, tuple):  # a Tuple action, or a GraphInstance, or a Sequence's elements
        return [leaf for sub in value for leaf in _leaves(sub)]
    return [value]
