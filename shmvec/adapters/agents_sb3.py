"""``ShmAgentVecEnv``: the agents of N PettingZoo ``ParallelEnv`` copies as one SB3 ``VecEnv``.

A drop-in for SuperSuit's ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), n, num_cpus,
base_class="stable_baselines3")`` (:func:`~shmvec.adapters.agents_concat.concat_vec_envs_v1`).
Slot ``c * A + a`` is agent ``a`` (of ``possible_agents``) of copy ``c``. Each copy is one
:class:`~shmvec.adapters.agent_slots.AgentSlotsEnv`
of a :class:`~shmvec.adapters.sb3.ShmPoolVecEnv`, so the engine steps the copies in its workers
and every agent's observation, reward, flags and mask travel in shared memory; this class
only reshapes copy rows into slot rows and turns per-copy episode ends into per-slot infos.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from shmvec.adapters.agent_slots import AGENT_INFOS, LEFT_AGENT_OBS, slots_env_fns, slots_repr
from shmvec.adapters.sb3 import ShmPoolVecEnv
from shmvec.errors import InvalidActionError

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'ShmAgentVecEnv needs stable-baselines3: pip install ".[sb3,agents]" in shmvec\'s checkout, or use '
        'concat_vec_envs_v1(..., base_class="gymnasium") / ShmAgentVectorEnv'
    ) from exc


class ShmAgentVecEnv(VecEnv):
    """Every agent of ``num_copies`` copies of a PettingZoo ``ParallelEnv`` as an SB3 ``VecEnv`` slot.

    Example (not a doctest: MPE2 is not one of shmvec's dependencies)::

        from mpe2 import simple_spread_v3
        from shmvec import ShmAgentVecEnv

        with ShmAgentVecEnv(simple_spread_v3.parallel_env(N=3), 4, n_workers=0) as env:
            obs = env.reset()  # (12, 18): 4 copies x 3 agents, 18 numbers each
            obs, rewards, dones, infos = env.step(np.zeros(12, dtype=np.int64))

    Args:
        env: a ``ParallelEnv`` (each copy is a copy of it, as SuperSuit copies it), SuperSuit's
            ``pettingzoo_env_to_vec_env_v1(env)``, or a function that returns a ``ParallelEnv``.
            Its agents must share one observation and one action space (Box, Discrete,
            MultiDiscrete or MultiBinary): pad them with SuperSuit's ``pad_observations_v0``
            and ``pad_action_space_v0`` first.
        num_copies: how many copies of the env (``num_envs`` is ``num_copies * len(possible_agents)``).
        n_workers, **pool_options: as :class:`~shmvec.adapters.sb3.ShmPoolVecEnv`'s, over the copies.

    A copy's episode ends when each of its agents is terminated or truncated; its slots then
    return ``done=True``, ``terminal_observation`` and ``TimeLimit.truncated`` (truncated and not
    terminated) in their infos, and the reset observation (same-step reset, as ``DummyVecEnv``).
    An agent that leaves earlier (agent death) returns its own ``done``, ``terminal_observation``
    and reward; then, until its copy resets, its slot returns a zero observation, reward 0,
    ``done=False`` and ``mask`` False (:attr:`mask`: which slots act), and ``done=True`` again
    when its copy ends. Its actions are ignored meanwhile. A copy restarted after its worker
    died (``on_worker_failure="restart"``): each of its slots returns the reset observation,
    reward 0, ``done=True`` and ShmPoolVecEnv's info for a restarted env,
    ``{"shmvec_restarted": True, "TimeLimit.truncated": True}``, without ``terminal_observation``.
    """

    def __init__(self, env: Any, num_copies: int, n_workers: int | None = None, **pool_options: Any):
        env_fns, self._copied = slots_env_fns(env, num_copies)
        self._slots = ShmPoolVecEnv(env_fns, n_workers, **pool_options)
        try:
            self.possible_agents, observation_space, action_space = self._slots.get_attr("agent_layout", [0])[0]
        except BaseException:
            self._slots.close()
            raise
        self.num_copies = int(num_copies)
        self.num_agents = len(self.possible_agents)
        self.n_workers = self._slots.n_workers
        self._zero_obs = np.zeros(observation_space.shape, observation_space.dtype)
        self._seeded = False
        self.num_envs = self.num_copies * self.num_agents  # get_attr needs it within VecEnv.__init__
        super().__init__(self.num_envs, observation_space, action_space)
        self.metadata = self._slots.metadata
        self.mask = np.ones(self.num_envs, bool)

    # -- stepping ------------------------------------------------------------------

    def step_async(self, actions: np.ndarray | Sequence[Any]) -> None:
        """Check and start a step: ``actions`` holds one action per slot, ``(num_envs, *action_shape)``."""
        actions = np.asarray(actions)
        if actions.ndim == 0 or actions.shape[0] != self.num_envs:
            raise InvalidActionError(
                f"expected one action per agent slot ({self.num_copies} copies x {self.num_agents} agents = "
                f"{self.num_envs}), got an array of shape {actions.shape}"
            )
        self._slots.step_async(actions.reshape(self.num_copies, self.num_agents, *actions.shape[1:]))

    def step_wait(self) -> VecEnvStepReturn:
        rows, _, copy_dones, copy_infos = self._slots.step_wait()
        obs, rewards, terminated, truncated, mask = self._slot_rows(rows)
        ended = np.flatnonzero(copy_dones).tolist()
        for c in ended:  # the rows hold the reset; the step's own rewards and flags came with its final obs
            final = copy_infos[c].get("terminal_observation")
            if final is None:  # restarted after its worker died: the step's values died with it (reward 0)
                continue
            part = slice(c * self.num_agents, (c + 1) * self.num_agents)
            rewards[part] = final["rewards"]
            terminated[part] = final["terminated"]
            truncated[part] = final["truncated"]
        # A slot is done on the step its agent leaves and when its copy ends; in between (its agent gone)
        # it is not: a done on each of those steps would count a 0-reward episode a step (VecMonitor)
        # and, after a truncation, bootstrap from a zero observation each step.
        dones = (terminated | truncated) & self.mask
        ended_slots = np.repeat(copy_dones, self.num_agents)
        infos = [{"TimeLimit.truncated": t} for t in (truncated & ~terminated & dones).tolist()]
        dones |= ended_slots
        for c, copy_info in enumerate(copy_infos):
            if len(copy_info) > 1 or c in ended:  # more than the copy's own TimeLimit.truncated
                self._copy_infos(c, copy_info, c in ended, infos)
        for i in np.flatnonzero(dones & ~ended_slots).tolist():
            infos[i].setdefault("terminal_observation", self._zero_obs.copy())  # left earlier: its obs was zeros
        self.mask = mask
        return obs, rewards, dones, infos

    def _slot_rows(self, rows: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """Copy rows ``(N, A, ...)`` as slot rows ``(N * A, ...)`` (views of the copies ShmPoolVecEnv returned)."""
        n = self.num_envs
        return (
            rows["obs"].reshape(n, *self._zero_obs.shape),
            rows["rewards"].reshape(n).astype(np.float32),  # SuperSuit's rewards: float32
            rows["terminated"].reshape(n).astype(bool),
            rows["truncated"].reshape(n).astype(bool),
            rows["mask"].reshape(n).astype(bool),
        )

    def _copy_infos(self, c: int, copy_info: dict[str, Any], ended: bool, infos: list[dict[str, Any]]) -> None:
        """Fill the slot infos of copy ``c`` from its info: its agents' infos, the last observation
        of agents that left, and, if its episode ended, its final observation and reset infos."""
        first = c * self.num_agents
        agent_infos = copy_info.get(AGENT_INFOS)
        if agent_infos is not None:
            for a, agent_info in enumerate(agent_infos):
                infos[first + a] = {**agent_info, **infos[first + a]}
        for a, last_obs in copy_info.get(LEFT_AGENT_OBS, {}).items():
            infos[first + a]["terminal_observation"] = last_obs
        if ended:
            final = copy_info.get("terminal_observation")
            reset_agent_infos = self._slots.reset_infos[c].get(AGENT_INFOS) or ({},) * self.num_agents
            for a in range(self.num_agents):
                if final is None:  # restarted: each slot gets ShmPoolVecEnv's info for it, no terminal_observation
                    infos[first + a] = dict(copy_info)
                else:
                    infos[first + a]["terminal_observation"] = final["obs"][a]
                self.reset_infos[first + a] = dict(reset_agent_infos[a])

    def reset(self) -> VecEnvObs:
        if self._copied and not self._seeded:
            # Copies of one instance share its random state: unseeded, every copy would play the same episodes.
            self.seed(secrets.randbits(32))  # not the caller's np.random: DummyVecEnv leaves it alone
        rows = self._slots.reset()
        infos = self._slots.reset_infos
        self.reset_infos = [
            dict(agent_info) for info in infos for agent_info in (info.get(AGENT_INFOS) or ({},) * self.num_agents)
        ]
        obs, _, _, _, self.mask = self._slot_rows(rows)
        return obs

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seed copy ``c`` with ``seed + c`` at the next reset (each slot reports its copy's seed)."""
        self._seeded = True
        seeds = self._slots.seed(seed)
        return [s for s in seeds for _ in range(self.num_agents)]

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        """Options for each copy's next reset: one dict for all, or one per slot (a copy takes its first slot's)."""
        if isinstance(options, list):
            options = [options[c * self.num_agents] for c in range(self.num_copies)]
        self._slots.set_options(options)

    # -- rare calls, by slot: each runs once on the copy that holds the slot -------------

    def _copies_of(self, indices: VecEnvIndices) -> tuple[list[int], list[int]]:
        """The copy of each slot of ``indices``, and those copies once each, in order."""
        copies = []
        for i in self._get_indices(indices):
            i = int(i)
            if not -self.num_envs <= i < self.num_envs:
                raise IndexError(f"slot index {i} out of range for {self.num_envs} agent slots")
            copies.append((i % self.num_envs) // self.num_agents)
        return copies, list(dict.fromkeys(copies))

    def _by_slot(self, results: list[Any], copies: list[int], distinct: list[int]) -> list[Any]:
        by_copy = dict(zip(distinct, results))
        return [by_copy[c] for c in copies]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The attribute of each slot's copy: its ``AgentSlotsEnv``'s, else its ``ParallelEnv``'s."""
        copies, distinct = self._copies_of(indices)
        return self._by_slot(self._slots.get_attr(attr_name, distinct), copies, distinct)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set the attribute once on each copy of the slots (on its ``ParallelEnv`` where that has it)."""
        _, distinct = self._copies_of(indices)
        self._slots.env_method("set_wrapper_attr", attr_name, value, indices=distinct)

    def has_attr(self, attr_name: str) -> bool:
        return self._slots.has_attr(attr_name)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """Call the method once on each copy of the slots; each slot gets its copy's result."""
        copies, distinct = self._copies_of(indices)
        results = self._slots.env_method(method_name, *method_args, indices=distinct, **method_kwargs)
        return self._by_slot(results, copies, distinct)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        copies, distinct = self._copies_of(indices)
        return self._by_slot(self._slots.env_is_wrapped(wrapper_class, distinct), copies, distinct)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """One image per slot: its copy's (each copy renders once)."""
        images = self._slots.get_images()
        return [image for image in images for _ in range(self.num_agents)]

    def render(self, mode: str | None = None) -> np.ndarray | None:
        """SB3's render over the copies (each once, tiled), not over the slots."""
        return self._slots.render(mode)

    @property
    def timings(self) -> Any:
        """Where the time went, over the copies (see :class:`~shmvec.adapters.sb3.ShmPoolVecEnv`)."""
        return self._slots.timings

    def close(self) -> None:
        """Close the copies, stop the workers and release the shared memory. Safe to call twice."""
        self._slots.close()

    @property
    def closed(self) -> bool:
        return self._slots.closed

    def __repr__(self) -> str:
        return slots_repr(self, self._slots)

    def __enter__(self) -> ShmAgentVecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
