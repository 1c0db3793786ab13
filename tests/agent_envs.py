"""Small PettingZoo parallel envs for the agent-slot tests (a module of its own, so that workers
unpickling them import PettingZoo, not the test modules and SB3)."""

from __future__ import annotations

import os

import numpy as np
from gymnasium import spaces

try:
    from pettingzoo import ParallelEnv
except ImportError:  # without the [agents] extra the tests that use these skip; doctest collection still imports this
    ParallelEnv = object


class DyingAgentsEnv(ParallelEnv):
    """``n_agents`` agents with seeded random observations; agent ``i`` leaves (terminated) after
    ``lifetimes[i]`` steps, the others are truncated at ``max_steps``. Rewards depend on the actions;
    infos are non-empty every third step (``{"t": t}``), or never (``infos=False``)."""

    metadata = {"name": "dying_agents_v0", "render_modes": ["rgb_array"], "is_parallelizable": True}

    def __init__(self, n_agents=3, lifetimes=(), max_steps=6, infos=True, render_mode=None, obs_size=4):
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.lifetimes = dict(zip(self.possible_agents, lifetimes))
        self.max_steps = max_steps
        self.with_infos = infos
        self.render_mode = render_mode
        self.obs_size = obs_size
        self.rng = np.random.default_rng()
        self.episodes = 0  # reset calls: env_method and get_attr tests read it

    def observation_space(self, agent):
        return spaces.Box(-10.0, 10.0, (self.obs_size,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self):
        return {a: self.rng.uniform(-1, 1, self.obs_size).astype(np.float32) for a in self.agents}

    def _infos(self):
        return {a: ({"t": self.t} if self.with_infos and self.t % 3 == 0 else {}) for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.episodes += 1
        return self._obs(), {a: {"start": (options or {}).get("start", 0)} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.t += 1
        rewards = {a: float(actions[a]) + self.rng.uniform() for a in self.agents}
        terms = {a: self.lifetimes.get(a, np.inf) <= self.t for a in self.agents}
        truncs = {a: not terms[a] and self.t >= self.max_steps for a in self.agents}
        obs, infos = self._obs(), self._infos()
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def render(self):
        return np.full((4, 4, 3), self.t, np.uint8)

    def count(self, k=1):
        return self.t * k


class MixedSpacesEnv(DyingAgentsEnv):
    """Agent 1 sees one more number than the others: not a slot layout without padding."""

    def observation_space(self, agent):
        return spaces.Box(-10.0, 10.0, (self.obs_size + (agent == "agent_1"),), np.float32)


class DictObsEnv(DyingAgentsEnv):
    def observation_space(self, agent):
        return spaces.Dict({"x": spaces.Box(-1.0, 1.0, (2,), np.float32)})


class AbsentAgentEnv(DyingAgentsEnv):
    """The last of ``possible_agents`` is never in an episode: ``agents`` leaves it out at reset."""

    def reset(self, seed=None, options=None):
        observations, infos = super().reset(seed=seed, options=options)
        self.agents = self.agents[:-1]
        return {a: observations[a] for a in self.agents}, {a: infos[a] for a in self.agents}


class PidAgentsEnv(DyingAgentsEnv):
    """``pid()``: the process the copy runs in (restart tests kill it)."""

    def pid(self):
        return os.getpid()


def step_after_killing_copy_one(envs, actions):
    """Step ``envs`` (two copies of :class:`PidAgentsEnv` with two agents, one worker each, restarts
    on) after SIGKILL of copy 1's worker: the step's results, the restart's warning checked."""
    import pytest

    from tests.helpers import kill_and_wait

    envs.reset(seed=0)
    envs.step(actions)
    pid = envs.call("pid")[2]  # copy 1's worker
    assert pid != envs.call("pid")[0]
    kill_and_wait(pid)
    with pytest.warns(RuntimeWarning, match="restarting"):
        return envs.step(actions)
