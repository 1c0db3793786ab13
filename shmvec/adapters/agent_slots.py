"""A PettingZoo ``ParallelEnv`` as one Gymnasium env whose rows are its agents' slots.

Agent ``a`` (its index in ``possible_agents``, SuperSuit's order) is row ``a`` of every leaf,
so the engine carries a whole multi-agent step in shared memory, as it carries any env's.
The observation is a Dict of fixed-size leaves:

- ``obs`` ``(A, *agent_shape)``: each agent's observation; zeros where the agent is absent
  (not in the env, or done while its copy goes on);
- ``rewards`` ``(A,)`` float64 (any reward a Python float holds, exactly): 0 for an absent agent;
- ``terminated``, ``truncated`` ``(A,)``: an agent's flags, kept set once it is done, until
  its copy resets;
- ``mask`` ``(A,)``: the agent is in the env and not done (it acts next step).

The action is the agents' actions batched, ``(A, *agent_action_shape)``; agents absent get
none. The copy's episode ends (Gymnasium's ``terminated``: every agent terminated; else
``truncated``) when no agent is left that is not done: the engine then resets it. Nothing
is pickled per step: the info is empty unless an agent returned a non-empty info
(:data:`AGENT_INFOS`: one dict per agent) or left while its copy goes on
(:data:`LEFT_AGENT_OBS`: its last observation, by agent index, as its row is zeroed).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from shmvec.errors import SpaceMismatchError, UnsupportedSpaceError

AGENT_INFOS = "agent_infos"  # info key: a tuple of A dicts, present when any agent's info is not empty
LEFT_AGENT_OBS = "left_agent_obs"  # info key: {agent index: last observation} of agents that left this step
_AGENT_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


class AgentSpacesMismatchError(SpaceMismatchError):
    """The agents of one env do not share a space: the message names SuperSuit's padding wrapper
    (an adapter passes it on, not a vector env's advice about spaces that differ between envs)."""


def agent_spaces(par_env: Any) -> tuple[gym.Space, gym.Space]:
    """The observation and action space every agent shares; a clear error naming the fix if they
    differ or are not one array each."""
    agents = list(par_env.possible_agents)
    if not agents:
        raise ValueError(f"{type(par_env).__name__} has no possible_agents: nothing to vectorize")
    observation_space, action_space = par_env.observation_space(agents[0]), par_env.action_space(agents[0])
    for what, space, fix in (
        ("observation", observation_space, "pad_observations_v0"),
        ("action", action_space, "pad_action_space_v0"),
    ):
        getter = getattr(par_env, f"{what}_space")
        for agent in agents[1:]:
            if getter(agent) != space:
                raise AgentSpacesMismatchError(
                    f"agents share one slot layout, so they must share their {what} space: {agents[0]!r} has "
                    f"{space}, {agent!r} has {getter(agent)}; wrap the env with supersuit.{fix}(env) first"
                )
        if not isinstance(space, _AGENT_SPACES):
            raise UnsupportedSpaceError(
                f"agent slots take Box, Discrete, MultiDiscrete or MultiBinary {what} spaces, got {space}; "
                "flatten it first (e.g. supersuit.flatten_v0 for a Dict observation)"
            )
    return observation_space, action_space


class AgentSlotsEnv(gym.Env):
    """One copy of a PettingZoo ``ParallelEnv``: its agents as the rows of fixed-size leaves.

    ``copied``: ``par_env`` is a copy of an instance (unpickled), so its random state is the
    instance's; an unseeded first reset then draws a fresh seed, or every copy rebuilt from
    that instance (a restart) would play the same episodes.
    """

    def __init__(self, par_env: Any, *, copied: bool = False):
        self.par_env = par_env
        self._draw_first_seed = copied
        self.possible_agents = tuple(par_env.possible_agents)
        self.agent_observation_space, self.agent_action_space = agent_spaces(par_env)
        n = len(self.possible_agents)
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        self.observation_space = spaces.Dict(
            {
                "obs": batch_space(self.agent_observation_space, n),
                "rewards": spaces.Box(-np.inf, np.inf, (n,), np.float64),
                "terminated": spaces.MultiBinary(n),
                "truncated": spaces.MultiBinary(n),
                "mask": spaces.MultiBinary(n),
            }
        )
        self.action_space = batch_space(self.agent_action_space, n)
        self._action_dtype = self.action_space.dtype
        self._obs_shape = (n, *self.agent_observation_space.shape)
        self._obs_dtype = self.agent_observation_space.dtype
        self.metadata = getattr(par_env, "metadata", {})
        self.render_mode = getattr(par_env, "render_mode", None)
        self._terminated = np.zeros(n, np.int8)
        self._truncated = np.zeros(n, np.int8)
        self._set_mask(np.zeros(n, bool))

    @property
    def num_agents(self) -> int:
        return len(self.possible_agents)

    @property
    def agent_layout(self) -> tuple[tuple, gym.Space, gym.Space]:
        """``(possible_agents, an agent's observation space, its action space)``: what an adapter needs."""
        return self.possible_agents, self.agent_observation_space, self.agent_action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        if seed is None and self._draw_first_seed:
            seed = secrets.randbits(32)
        self._draw_first_seed = False
        super().reset(seed=seed)
        observations, infos = self.par_env.reset(seed=seed, options=options)
        n = self.num_agents
        self._terminated, self._truncated = np.zeros(n, np.int8), np.zeros(n, np.int8)
        live = set(self.par_env.agents)
        self._set_mask(np.fromiter((agent in live for agent in self.possible_agents), bool, n))
        rows = self._rows(observations, "reset")
        return self._observation(rows, np.zeros(n, np.float64)), self._agent_infos(infos)

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        action = np.asarray(action, self._action_dtype)  # as SuperSuit's concatenation casts it
        index, par_env = self._index, self.par_env
        observations, rewards, terms, truncs, infos = par_env.step({a: action[index[a]] for a in par_env.agents})
        n = len(self.possible_agents)
        reward_row = np.zeros(n, np.float64)
        for agent, value in rewards.items():
            reward_row[index[agent]] = value
        live_agents = par_env.agents
        if self._all_act and len(live_agents) == n and not any(terms.values()) and not any(truncs.values()):
            # every agent acted and acts on (most steps): flags and mask stay as they are
            rows = self._rows(observations, "step")
            return self._observation(rows, reward_row), float(reward_row.sum()), False, False, self._agent_infos(infos)
        terminated, truncated = self._terminated.copy(), self._truncated.copy()  # an agent once done stays done
        for agent, flag in terms.items():
            if flag:
                terminated[index[agent]] = 1
        for agent, flag in truncs.items():
            if flag:
                truncated[index[agent]] = 1
        live = set(live_agents)
        was_live = self._mask
        left_unflagged = [i for i, a in enumerate(self.possible_agents) if was_live[i] and a not in live]
        for i in left_unflagged:  # an agent that left without a flag has left for good: terminated
            if not (terminated[i] or truncated[i]):
                terminated[i] = 1
        mask = np.fromiter((agent in live for agent in self.possible_agents), bool, n) & ~(
            terminated.astype(bool) | truncated.astype(bool)
        )
        rows = self._rows(observations, "step")
        info = self._agent_infos(infos)
        ended = not mask.any()
        if not ended:  # agents that left while their copy goes on: last observation in the info, row zeroed
            left = np.flatnonzero(was_live & ~mask)
            if len(left):
                info[LEFT_AGENT_OBS] = {int(i): rows[i].copy() for i in left}
            rows[~mask] = 0
        self._terminated, self._truncated = terminated, truncated
        self._set_mask(mask)
        all_terminated = ended and bool(terminated.all())
        return (
            self._observation(rows, reward_row),
            float(reward_row.sum()),
            all_terminated,
            ended and not all_terminated,
            info,
        )

    def _set_mask(self, mask: np.ndarray) -> None:
        self._mask, self._mask_row, self._all_act = mask, mask.astype(np.int8), bool(mask.all())

    def _rows(self, observations: dict[Any, Any], call: str) -> np.ndarray:
        """The agents' observations as rows, fresh each call (the engine may keep it: a final observation);
        one of another shape is an error, as SuperSuit's stacking raises, not broadcast into its row."""
        rows = np.zeros(self._obs_shape, self._obs_dtype)
        index = self._index
        for agent, value in observations.items():
            value = np.asarray(value)
            if value.shape != rows.shape[1:]:
                raise ValueError(
                    f"{call}() returned an observation of shape {value.shape} for agent {agent!r}; "
                    f"its observation space has shape {rows.shape[1:]}"
                )
            rows[index[agent]] = value
        return rows

    def _observation(self, rows: np.ndarray, rewards: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "obs": rows,
            "rewards": rewards,
            "terminated": self._terminated,
            "truncated": self._truncated,
            "mask": self._mask_row,
        }

    def _agent_infos(self, infos: dict[Any, dict]) -> dict[str, Any]:
        """``{}`` when every agent's info is empty (nothing to pickle), else :data:`AGENT_INFOS`. Keys
        of ``infos`` that are no agent's are left out, as SuperSuit leaves them."""
        if not any(infos.get(agent) for agent in self.possible_agents):
            return {}
        return {AGENT_INFOS: tuple(dict(infos.get(agent) or {}) for agent in self.possible_agents)}

    def render(self) -> Any:
        return self.par_env.render()

    def close(self) -> None:
        self.par_env.close()

    # SB3's get_attr/env_method/set_attr reach the PettingZoo env for what this env lacks.
    def get_wrapper_attr(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            return getattr(self.par_env, name)

    def has_wrapper_attr(self, name: str) -> bool:
        return hasattr(self, name) or hasattr(self.par_env, name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        if not hasattr(self, name) and hasattr(self.par_env, name):
            setattr(self.par_env, name, value)
            return True
        if force or hasattr(self, name):  # Gymnasium 1.1's Env.set_wrapper_attr (0.29's Env has none, 1.0's no force)
            setattr(self, name, value)
            return True
        return False


@dataclass(frozen=True)
class SlotsEnvFactory:
    """Builds one :class:`AgentSlotsEnv`: over a copy of a pickled env (as SuperSuit copies an
    instance), or over what ``make`` returns."""

    pickled_env: bytes | None = None
    make: Callable[[], Any] | None = None

    def __call__(self) -> AgentSlotsEnv:
        if self.pickled_env is not None:
            return AgentSlotsEnv(cloudpickle.loads(self.pickled_env), copied=True)
        return AgentSlotsEnv(self.make())  # a fresh env, as a single-agent env's restart builds one


def slots_env_fns(source: Any, num_copies: int) -> tuple[list[SlotsEnvFactory], bool]:
    """``num_copies`` env fns over ``source`` (a ``ParallelEnv``, SuperSuit's ``MarkovVectorEnv``
    of one, or a function that returns a ``ParallelEnv``), and whether they copy one instance."""
    if not isinstance(num_copies, (int, np.integer)) or isinstance(num_copies, bool) or num_copies < 1:
        raise ValueError(f"the number of env copies must be a positive int, got {num_copies!r}")
    par_env = getattr(source, "par_env", source)  # SuperSuit's pettingzoo_env_to_vec_env_v1(env)
    if hasattr(par_env, "possible_agents"):
        agent_spaces(par_env)  # in this process, before any worker starts
        return [SlotsEnvFactory(pickled_env=cloudpickle.dumps(par_env))] * int(num_copies), True
    if callable(source):
        return [SlotsEnvFactory(make=source)] * int(num_copies), False
    raise TypeError(
        f"expected a PettingZoo ParallelEnv, SuperSuit's pettingzoo_env_to_vec_env_v1(env) or a function that "
        f"returns a ParallelEnv, got {type(source).__name__}"
    )


def slots_repr(owner: Any, copies: Any) -> str:
    """``Name(num_envs=N, copies=C, agents=A, <how the copies run>)``: ``owner``, an agent adapter
    over the vector env ``copies`` (whose repr after its ``num_envs=`` says how they run)."""
    how = repr(copies).split(", ", 1)[1]
    sizes = f"num_envs={owner.num_envs}, copies={owner.num_copies}, agents={owner.num_agents}"
    return f"{type(owner).__name__}({sizes}, {how}"
