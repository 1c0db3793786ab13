"""Small real-dynamics test envs covering the space types shmvec must lay out."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def cartpole():
    """CartPole-v1 as ``gym.make`` builds it: the plain env most tests start from."""
    return gym.make("CartPole-v1")


TAXI = "Taxi-v4" if "Taxi-v4" in gym.registry else "Taxi-v3"  # v4 from Gymnasium 1.3; both give infos every step


class MixedDictEnv(gym.Env):
    """Dict observations of mixed dtypes and shapes, a Box action, random episode lengths.

    Episodes end by termination (a random walk leaves [-1, 1]) and, through the
    TimeLimit wrapper of :func:`make_mixed`, by truncation, so both paths are exercised.
    Infos are non-empty on some steps only.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None):
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-np.inf, np.inf, (3,), np.float32),
                "image": spaces.Box(0, 255, (6, 5, 3), np.uint8),
                "count": spaces.Discrete(1000),
                "flags": spaces.MultiBinary(4),
                "grid": spaces.MultiDiscrete([3, 5]),
                "energy": spaces.Box(-10.0, 10.0, (), np.float64),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.render_mode = render_mode
        self.calls = 0

    def _obs(self):
        return {
            "position": self.pos.astype(np.float32),
            "image": self.np_random.integers(0, 256, (6, 5, 3), dtype=np.uint8),
            "count": int(self.t),
            "flags": self.np_random.integers(0, 2, 4, dtype=np.int8),
            "grid": np.array([self.t % 3, self.t % 5], dtype=np.int64),
            "energy": np.float64(self.pos.sum()),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        scale = 0.1 if not options else options.get("scale", 0.1)
        self.pos = self.np_random.uniform(-scale, scale, 3)
        self.t = 0
        return self._obs(), {"start": self.pos.copy()}

    def step(self, action):
        self.calls += 1
        self.t += 1
        self.pos = self.pos + 0.1 * np.asarray(action, dtype=np.float64) + self.np_random.normal(0, 0.05, 3)
        terminated = bool(np.abs(self.pos).max() > 1.0)
        reward = float(-np.square(self.pos).sum())
        info = {"t": self.t} if self.t % 3 == 0 else {}
        return self._obs(), reward, terminated, False, info

    def render(self):
        return np.full((4, 4, 3), self.t % 256, dtype=np.uint8)

    def double(self, x):
        return 2 * x


def make_mixed(max_episode_steps: int = 25, render_mode=None):
    return gym.wrappers.TimeLimit(MixedDictEnv(render_mode=render_mode), max_episode_steps=max_episode_steps)


class InfoTypesEnv(gym.Env):
    """Infos at every step, as MuJoCo and Atari envs return them, plus the ones that cannot use a
    shared row: every value type that one can carry (Python and numpy scalars, small arrays),
    a second key set now and then, and infos that must be pickled (a nested dict, a string
    and, unless ``mergeable`` (what Gymnasium's vector envs can merge into arrays), an int
    beyond int64 and an array whose shape changed). Episodes end by termination and, through
    :func:`make_info_types`, truncation; reset infos have keys of their own.
    """

    def __init__(self, mergeable: bool = False):
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(3)
        self.variants = 4 if mergeable else 6

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-0.5, 0.5, 2)
        self.t = 0
        return self.x.copy(), {"x_position": np.float64(self.x[0]), "lives": 3}

    def step(self, action):
        self.t += 1
        self.x = self.x + (int(action) - 1) * 0.1 + self.np_random.normal(0, 0.1, 2)
        info = {
            "x_position": np.float64(self.x[0]),
            "reward_ctrl": np.float32(-0.1 * int(action)),
            "reward_survive": 1.0,
            "lives": 3 - self.t // 10,
            "flag": bool(self.x[1] > 0),
            "np_flag": np.bool_(self.x[0] > 0),
            "code": np.uint64(2**63 + self.t),
            "small": np.int8(-self.t % 100),
            "tendon": self.x * np.array([1.0, -1.0]),
            "mask": (self.x > 0).astype(np.int8)[None, :],
        }
        variant = int(self.np_random.integers(0, 3 * self.variants))  # the plain info two times in three
        if variant >= self.variants:
            pass
        elif variant == 0:
            info = {"lives": 3, "frame_number": self.t}  # another key set
        elif variant == 1:
            info = {}
        elif variant == 2:
            info["stats"] = {"t": self.t}  # nested: pickled
        elif variant == 3:
            info["label"] = f"level-{self.t % 3}"  # a string: pickled
        elif variant == 4:
            info["lives"] = 2**70  # beyond int64: pickled
        elif variant == 5:
            info["tendon"] = np.zeros(3)  # another shape under the same keys: a schema of its own
        reward = float(-np.square(self.x).sum())
        return self.x.copy(), reward, bool(np.abs(self.x).max() > 1.0), False, info


def make_info_types(max_episode_steps: int = 40, mergeable: bool = False):
    return gym.wrappers.TimeLimit(InfoTypesEnv(mergeable), max_episode_steps=max_episode_steps)


class TupleObsEnv(gym.Env):
    """Tuple observations (Box, Discrete) and a Discrete action."""

    def __init__(self):
        self.observation_space = spaces.Tuple((spaces.Box(-5, 5, (2,), np.float32), spaces.Discrete(7)))
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return (self.x.copy(), 0), {}

    def step(self, action):
        self.x = np.clip(self.x + (int(action) - 1) * 0.3 + self.np_random.normal(0, 0.1, 2), -5, 5).astype(np.float32)
        k = int(self.np_random.integers(0, 7))
        return (self.x.copy(), k), float(self.x[0]), bool(abs(self.x[1]) > 2), False, {}


class ImageObsEnv(gym.Env):
    """(H, W, 3) uint8 image observations (channel-last), a Discrete action, random episode ends.

    For SB3's ``VecTransposeImage`` and ``VecFrameStack``; renders its current frame.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, height: int = 12, width: int = 10, render_mode=None):
        self.observation_space = spaces.Box(0, 255, (height, width, 3), np.uint8)
        self.action_space = spaces.Discrete(3)
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.frame = self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)
        return self.frame.copy(), {}

    def step(self, action):
        shift = int(action) - 1
        noise = self.np_random.integers(0, 8, self.observation_space.shape, dtype=np.uint8)
        self.frame = np.roll(self.frame, shift, axis=1) + noise  # uint8 wraps around
        terminated = bool(self.np_random.random() < 0.05)
        return self.frame.copy(), float(self.frame.mean() / 255.0), terminated, False, {}

    def render(self):
        return self.frame.copy()


def make_image(max_episode_steps: int = 30, render_mode=None):
    return gym.wrappers.TimeLimit(ImageObsEnv(render_mode=render_mode), max_episode_steps=max_episode_steps)


class NestedEnv(gym.Env):
    """Nested Dict/Tuple observations *and* actions, nested and array-valued infos.

    Episodes end by termination (a random walk leaves a box) and by the env's own
    truncation (``max_steps``), so both paths are exercised; infos are sparse.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, max_steps: int = 20, render_mode=None):
        self.observation_space = spaces.Dict(
            {
                "agent": spaces.Dict(
                    {"pos": spaces.Box(-5.0, 5.0, (2,), np.float32), "hp": spaces.Discrete(10, start=1)}
                ),
                "sensors": spaces.Tuple((spaces.Box(-np.inf, np.inf, (3,), np.float64), spaces.MultiBinary((2, 2)))),
                "goal": spaces.Tuple((spaces.Discrete(4), spaces.Dict({"xy": spaces.Box(-100, 100, (2,), np.int32)}))),
            }
        )
        self.action_space = spaces.Dict(
            {
                "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mode": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
            }
        )
        self.max_steps = max_steps
        self.render_mode = render_mode

    def _obs(self):
        return {
            "agent": {"pos": self.pos.astype(np.float32), "hp": int(self.hp)},
            "sensors": (self.np_random.normal(0, 1, 3), self.np_random.integers(0, 2, (2, 2), dtype=np.int8)),
            "goal": (int(self.t % 4), {"xy": np.array([self.t, -self.t], dtype=np.int32)}),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, 2)
        self.hp, self.t = 10, 0
        return self._obs(), {"spawn": self.pos.copy(), "level": {"id": int(self.np_random.integers(0, 5))}}

    def step(self, action):
        mode, bits = action["mode"]
        self.t += 1
        self.pos = np.clip(
            self.pos + 0.3 * np.asarray(action["move"], np.float64) + self.np_random.normal(0, 0.2, 2), -5, 5
        )
        self.hp = max(1, self.hp - int(mode == 2) - int(np.sum(bits)))
        terminated = bool(np.abs(self.pos).max() > 1.5)
        truncated = self.t >= self.max_steps
        reward = float(-np.abs(self.pos).sum()) + 0.1 * int(mode)
        info = {}
        if self.t % 4 == 0:
            info = {"stats": {"dist": float(np.abs(self.pos).sum()), "t": self.t}, "bits": np.asarray(bits).copy()}
        return self._obs(), reward, terminated, truncated, info

    def render(self):
        return np.full((3, 3, 3), self.t % 256, dtype=np.uint8)


# ---- spaces with no fixed size (they travel pickled) -----------------------------------


@dataclass(frozen=True)
class Token:
    """An element of :class:`TokenSpace`: a value type defined by the user."""

    name: str
    count: int


class TokenSpace(spaces.Space):
    """A user-defined space (no shape, no dtype): tokens with a name from a vocabulary and a count."""

    def __init__(self, vocabulary=("up", "down", "left", "right", "stop"), max_count: int = 9, seed=None):
        self.vocabulary = tuple(vocabulary)
        self.max_count = max_count
        super().__init__(None, None, seed)

    def sample(self, mask=None, probability=None) -> Token:
        name = self.vocabulary[int(self.np_random.integers(len(self.vocabulary)))]
        return Token(name, int(self.np_random.integers(0, self.max_count + 1)))

    def contains(self, x) -> bool:
        return isinstance(x, Token) and x.name in self.vocabulary and 0 <= x.count <= self.max_count

    def __eq__(self, other) -> bool:
        return isinstance(other, TokenSpace) and (self.vocabulary, self.max_count) == (
            other.vocabulary,
            other.max_count,
        )

    def __repr__(self) -> str:
        return f"TokenSpace({self.vocabulary}, {self.max_count})"


def _graph(rng: np.random.Generator, n_nodes: int, edge_kinds: int | None) -> spaces.GraphInstance:
    nodes = rng.uniform(-1, 1, (n_nodes, 2)).astype(np.float32)
    if edge_kinds is None:
        return spaces.GraphInstance(nodes, None, None)
    n_edges = int(rng.integers(0, 2 * n_nodes))
    edges = rng.integers(0, edge_kinds, n_edges)
    return spaces.GraphInstance(nodes, edges, rng.integers(0, n_nodes, (n_edges, 2)).astype(np.int32))


class AnySpaceEnv(gym.Env):
    """Dict observations mixing Box/Discrete leaves with Text, Graph, Sequence, OneOf and a
    custom space (one also nested in a Tuple); a Dict action of Box, Text and the custom space.

    Episodes end by termination (a random walk leaves a box, or the action says "stop" 9
    times) and, through a TimeLimit wrapper (:func:`make_any_space`), by truncation;
    infos are sparse and carry values of the non-array spaces too.
    """

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "label": spaces.Text(max_length=6, min_length=1),
                "token": TokenSpace(),
                "trail": spaces.Sequence(spaces.Box(-5, 5, (2,), np.float32)),
                "net": spaces.Graph(spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3)),
                "pick": spaces.OneOf((spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32))),
                "meta": spaces.Tuple((spaces.Discrete(4), spaces.Text(max_length=4, min_length=1))),
                "hp": spaces.Discrete(10),
            }
        )
        self.action_space = spaces.Dict(
            {
                "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "say": spaces.Text(max_length=4, min_length=1),
                "token": TokenSpace(),
            }
        )

    def _obs(self, say: str, token: Token):
        rng = self.np_random
        pick = (0, int(rng.integers(3))) if self.t % 2 else (1, rng.uniform(-1, 1, 2).astype(np.float32))
        label = (say + str(self.t))[:6]
        return {
            "pos": self.pos.astype(np.float32),
            "label": label,
            "token": token,
            "trail": tuple(self.trail[-(self.t % 4) :]) if self.t % 4 else (),
            "net": _graph(rng, 1 + self.t % 3, 3),
            "pick": pick,
            "meta": (self.t % 4, label[:4]),
            "hp": int(self.hp),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        scale = 0.1 if not options else options.get("scale", 0.1)
        self.pos = self.np_random.uniform(-scale, scale, 2)
        self.t, self.hp, self.trail = 0, 9, []
        return self._obs("go", Token("up", 0)), {"spawn": self.pos.copy()}

    def step(self, action):
        self.t += 1
        token = action["token"]
        self.pos = self.pos + 0.3 * np.asarray(action["move"], np.float64) + self.np_random.normal(0, 0.2, 2)
        self.trail.append(np.clip(self.pos, -5, 5).astype(np.float32))
        self.hp = max(0, self.hp - int(token.name == "stop"))
        terminated = bool(np.abs(self.pos).max() > 1.5) or self.hp == 0
        reward = float(-np.abs(self.pos).sum()) + 0.1 * token.count + 0.01 * len(action["say"])
        info = {"heard": action["say"], "token": token} if self.t % 3 == 0 else {}
        return self._obs(action["say"], token), reward, terminated, False, info


def make_any_space(max_episode_steps: int = 20):
    return gym.wrappers.TimeLimit(AnySpaceEnv(), max_episode_steps=max_episode_steps)


class TextTokenEnv(gym.Env):
    """No fixed-size leaf at all: a Text observation and a custom-space action."""

    def __init__(self):
        self.observation_space = spaces.Text(max_length=8, min_length=1)
        self.action_space = TokenSpace()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "start", {}

    def step(self, action: Token):
        self.t += 1
        terminated = action.name == "stop" and bool(self.np_random.random() < 0.5)
        info = {"echo": action} if action.count > 6 else {}
        return f"{action.name[:3]}{action.count}{self.t % 100}", float(action.count), terminated, False, info


def make_text_token(max_episode_steps: int = 15):
    return gym.wrappers.TimeLimit(TextTokenEnv(), max_episode_steps=max_episode_steps)


class TupleAnySpaceEnv(gym.Env):
    """Tuple observations (Box, stacked Sequence, edgeless Graph); a Tuple action (Discrete, OneOf)."""

    def __init__(self):
        self.observation_space = spaces.Tuple(
            (
                spaces.Box(-5, 5, (3,), np.float32),
                spaces.Sequence(spaces.Discrete(5), stack=True),
                spaces.Graph(spaces.Box(-1, 1, (2,), np.float32), None),
            )
        )
        self.action_space = spaces.Tuple(
            (spaces.Discrete(3), spaces.OneOf((spaces.Discrete(2), spaces.Box(-1, 1, (1,), np.float32))))
        )

    def _obs(self):
        rng = self.np_random
        return (self.x.copy(), rng.integers(0, 5, int(rng.integers(0, 4))), _graph(rng, 1 + self.t % 2, None))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        direction, (kind, value) = action
        push = float(value) if kind == 0 else float(np.asarray(value)[0])
        self.x = np.clip(self.x + (int(direction) - 1) * 0.3 + push * 0.1, -5, 5).astype(np.float32)
        self.x += self.np_random.normal(0, 0.1, 3).astype(np.float32)
        terminated = bool(abs(self.x[0]) > 2)
        return self._obs(), float(self.x[1]), terminated, False, ({"kind": int(kind)} if self.t % 5 == 0 else {})


def make_tuple_any_space(max_episode_steps: int = 25):
    return gym.wrappers.TimeLimit(TupleAnySpaceEnv(), max_episode_steps=max_episode_steps)


def echo_action(action, space: spaces.Space):
    """The action an env got, in a canonical form: dict keys in the space's order, tuples as tuples.

    Leaf values keep their own type and dtype, so an info carrying the echo shows exactly
    what reached the env, up to dict key order, list-vs-tuple and 0-d array-vs-numpy scalar
    (a shared buffer hands a shape-() leaf over as a scalar, as DummyVecEnv hands the rows
    of an array batch), none of which changes what the env computes.
    """
    if isinstance(space, spaces.Dict):
        return {key: echo_action(action[key], sub) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(echo_action(action[k], sub) for k, sub in enumerate(space.spaces))
    if isinstance(action, np.ndarray):
        return action[()] if action.ndim == 0 else action.copy()
    return action


class DictActionEnv(gym.Env):
    """A Dict action space with a nested Tuple, Box observations, random episode ends.

    Every action leaf moves the state, so a wrong or lost leaf changes the run. Episodes end
    by termination (the walk leaves a box) and, through :func:`make_dict_action`'s TimeLimit,
    by truncation. Every 4th step the info echoes the action the env got.
    """

    def __init__(self):
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = spaces.Dict(
            {
                "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "gear": spaces.Discrete(3, start=-1),
                "aux": spaces.Tuple((spaces.MultiBinary(3), spaces.Box(0.0, 2.0, (), np.float64))),
            }
        )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-0.5, 0.5, 2).astype(np.float32)
        self.speed, self.t = np.float32(0.0), 0
        return self._obs(), {"spawn": self.pos.copy()}

    def _obs(self):
        return np.array([*self.pos, self.speed, self.t], dtype=np.float32)

    def step(self, action):
        bits, boost = action["aux"]
        self.t += 1
        self.speed = np.float32(self.speed + np.float32(0.1) * np.float32(action["gear"]))
        self.pos = (self.pos + action["move"] * self.speed + np.float32(boost) * np.float32(0.05) * bits[:2]).astype(
            np.float32
        )
        self.pos += self.np_random.normal(0, 0.1, 2).astype(np.float32)
        terminated = bool(np.abs(self.pos).max() > 2.0)
        reward = float(-np.abs(self.pos).sum()) + float(bits.sum()) * 0.01
        info = {"action": echo_action(action, self.action_space)} if self.t % 4 == 0 else {}
        return self._obs(), reward, terminated, False, info


def make_dict_action(max_episode_steps: int = 30):
    return gym.wrappers.TimeLimit(DictActionEnv(), max_episode_steps=max_episode_steps)


class TupleActionEnv(gym.Env):
    """A Tuple action space with a nested Dict, flat Dict observations, random episode ends.

    Ends by termination and by its own truncation (``max_steps``); every 3rd step the info
    echoes the action the env got.
    """

    def __init__(self, max_steps: int = 40):
        self.observation_space = spaces.Dict(
            {"pos": spaces.Box(-10.0, 10.0, (3,), np.float64), "step": spaces.Discrete(1000)}
        )
        self.action_space = spaces.Tuple(
            (
                spaces.Discrete(4),
                spaces.Box(-2.0, 2.0, (3,), np.float64),
                spaces.Dict({"mode": spaces.MultiDiscrete([2, 5]), "scale": spaces.Box(0, 255, (1,), np.uint8)}),
            )
        )
        self.max_steps = max_steps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.0, 1.0, 3)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return {"pos": self.pos.copy(), "step": self.t}

    def step(self, action):
        direction, push, extra = action
        self.t += 1
        shift = np.zeros(3)
        shift[int(direction) % 3] = 0.2 if direction < 3 else -0.2
        scale = 1.0 + float(extra["scale"][0]) / 255.0
        noise = self.np_random.normal(0, 0.2, 3)
        self.pos = np.clip(self.pos + shift + 0.1 * scale * push * extra["mode"][0] + noise, -10, 10)
        terminated = bool(np.abs(self.pos).max() > 3.0)
        truncated = self.t >= self.max_steps
        reward = float(np.linalg.norm(self.pos)) + int(extra["mode"][1])
        info = {"action": echo_action(action, self.action_space)} if self.t % 3 == 0 else {}
        return self._obs(), reward, terminated, truncated, info


def describe_action(action) -> str:
    """Exactly what an env got, as a string (strings survive the batching of infos): container
    types, dict key order, numpy scalar or array, dtype, shape, Python number types, bits."""
    if isinstance(action, dict):
        return "{" + ", ".join(f"{key!r}: {describe_action(value)}" for key, value in action.items()) + "}"
    if isinstance(action, (list, tuple)):
        return f"{type(action).__name__}[" + ", ".join(describe_action(value) for value in action) + "]"
    if isinstance(action, (np.ndarray, np.generic)):
        values = np.asarray(action)
        if values.dtype == np.longdouble:  # 10 bytes of value in 16: the padding is not the value
            bits = ",".join(np.format_float_positional(x, unique=True) for x in values.ravel())
        else:
            bits = values.tobytes().hex()
        return f"{type(action).__name__}<{values.dtype.str}{values.shape}>:{bits}"
    if isinstance(action, float):
        return f"float:{action.hex()}"
    return f"{type(action).__name__}:{action!r}"


class ActionProbeEnv(gym.Env):
    """Any action space; every step's info says exactly what action it got (:func:`describe_action`).

    Its observation counts its steps; its episodes never end.
    """

    def __init__(self, action_space: spaces.Space):
        self.observation_space = spaces.Box(0, np.inf, (), np.float64)
        self.action_space = action_space
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.float64(self.t), {}

    def step(self, action):
        self.t += 1
        return np.float64(self.t), 0.0, False, False, {"got": describe_action(action)}


class SleepEnv(gym.Env):
    """Sleeps ``action`` seconds in ``step`` (``time.sleep`` takes Python and numpy float64, not float32)."""

    def __init__(self):
        self.observation_space = spaces.Box(0, 1, (), np.float32)
        self.action_space = spaces.Box(0.0, 1.0, (), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.float32(0), {}

    def step(self, action):
        time.sleep(action)
        return np.float32(0), 0.0, False, False, {}


class EndsAt(gym.Env):
    """Returns an info each step and ends its episode at step ``end``."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, end: int):
        self.end = end

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2), {"start": float(self.end)}

    def step(self, action):
        self.t += 1
        return np.full(2, self.t / 10), 1.0, self.t == self.end, False, {"t": self.t}


class WaitingRandomEnv(gym.Env):
    """Waits in a syscall each step, draws from its own generator and returns an info a row can hold."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float64)
    action_space = gym.spaces.Discrete(3)
    wait = 1e-3  # seconds each step sleeps

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3), {"start": float(self.np_random.uniform())}

    def step(self, action):
        time.sleep(self.wait)
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 3) + action
        info = {"t": self.t, "noise": np.float32(self.np_random.normal())}
        return obs, float(obs.sum()), bool(obs[0] > 2.5), self.t >= 9, info


class ClockedEnv(gym.Env):
    """Computes (``wait=False``) or sleeps ``seconds`` per step; at close, appends its steps' own
    wall times to ``path`` as a line ``index t0 t1 ...`` (tests/clocks/test_timings.py's truth)."""

    def __init__(self, seconds: float, path: str, index: int, wait: bool):
        self.seconds, self.path, self.index, self.wait, self.took = seconds, path, index, wait, []
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        start = time.perf_counter()
        if self.wait:
            time.sleep(self.seconds)
        else:
            while time.perf_counter() - start < self.seconds:
                pass
        self.took.append(time.perf_counter() - start)
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def close(self):
        with open(self.path, "a") as out:
            out.write(" ".join([str(self.index), *map(repr, self.took)]) + "\n")


class BoxObsEnv(gym.Env):
    """A trivial env whose observation size is a constructor argument."""

    def __init__(self, size=4, n_actions=2):
        self.observation_space = spaces.Box(-1, 1, (size,), np.float32)
        self.action_space = spaces.Discrete(n_actions)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, False, {}


class BoundedBoxEnv(gym.Env):
    """Box observations in [0, high] of a given shape, random episode ends."""

    def __init__(self, high=1.0, shape=(5,), n_actions=2, dtype=np.float32):
        self.observation_space = spaces.Box(0, high, shape, dtype)
        self.action_space = spaces.Discrete(n_actions)

    def _obs(self):
        space = self.observation_space
        return self.np_random.uniform(space.low, space.high).astype(space.dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), float(action), bool(self.np_random.random() < 0.1), False, {}


class DiscreteObsEnv(BoundedBoxEnv):
    """Discrete observations, the same action space as BoundedBoxEnv's."""

    observation_space = spaces.Discrete(5)

    def __init__(self):
        self.action_space = spaces.Discrete(2)

    def _obs(self):
        return int(self.np_random.integers(5))


class TorchEnv(gym.Env):
    """Each step runs a torch op large enough for a parallel region (torch is imported when built)."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, threads: int | None = None):
        import torch

        if threads is not None:  # as an env that sets torch's threads for itself
            torch.set_num_threads(threads)
        self.x = torch.ones(256, 256)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        value = float((self.x @ self.x).relu().sum())
        return np.full(2, value, np.float32), 0.0, False, False, {}


class FlushesStdio(gym.Env):
    """Flushes C stdio when built, as a native library that prints may (what a fork of the caller would write twice)."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self):
        import ctypes

        ctypes.CDLL(None).fflush(None)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


BUILD_LOCK = threading.Lock()  # a library's module lock, which a thread of the caller may hold


class TakesBuildLock(FlushesStdio):
    """Takes :data:`BUILD_LOCK` when built (a fork of a caller whose thread held it would wait for ever)."""

    def __init__(self):
        with BUILD_LOCK:
            pass


class StartsAChild(FlushesStdio):
    """Starts a ``multiprocessing`` child when built (a renderer, a simulator launcher), which a
    daemonic process may not; ``close()`` ends it, and nothing else does."""

    def __init__(self):
        import multiprocessing

        self.child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
        self.child.start()

    def close(self):
        if self.child.is_alive():
            self.child.terminate()
            self.child.join()
