"""SuperSuit's ``concat_vec_envs_v1`` over shmvec, and its default base class, ``"gymnasium"``.

``concat_vec_envs_v1(vec_env, num_vec_envs, num_cpus, base_class)`` returns what SuperSuit's
returns for each base class, stepped by shmvec: ``"gymnasium"`` (SuperSuit's default) a
:class:`ShmAgentConcatVecEnv`, with the conventions of SuperSuit's ``ConcatVecEnv``;
``"stable_baselines3"`` an SB3 ``VecEnv`` (:class:`~shmvec.adapters.agents_sb3.ShmAgentVecEnv`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmvec.adapters.agent_slots import AGENT_INFOS, LEFT_AGENT_OBS
from shmvec.adapters.agents_gym import ShmAgentVectorEnv, flag_whole_copies, info_row
from shmvec.gymnasium_1_1 import AutoresetMode, require_vector_api

__all__ = ["ShmAgentConcatVecEnv", "concat_vec_envs_v1"]

BASE_CLASSES = ("gymnasium", "stable_baselines3")


def concat_vec_envs_v1(
    vec_env: Any, num_vec_envs: int, num_cpus: int | None = None, base_class: str = "gymnasium", **options: Any
) -> Any:
    """SuperSuit's ``concat_vec_envs_v1`` over shmvec, with SuperSuit's base classes and default.

    ``vec_env`` is ``pettingzoo_env_to_vec_env_v1(env)`` (or the ``ParallelEnv`` itself);
    ``num_vec_envs`` copies of it. ``num_cpus``: worker processes (0: every copy in this
    process). SuperSuit's default is 0; here it is ``None``: shmvec chooses, as
    ``n_workers=None`` does elsewhere. ``base_class``: ``"gymnasium"`` (the default, as
    SuperSuit's) returns a :class:`ShmAgentConcatVecEnv`; ``"stable_baselines3"`` an SB3
    ``VecEnv`` (:class:`~shmvec.adapters.agents_sb3.ShmAgentVecEnv`, needs the ``[sb3]`` extra).
    ``options``: the pool options (:class:`~shmvec.adapters.vector.ShmVectorEnv`'s).
    """
    if base_class == "stable_baselines":
        raise ValueError(
            "base_class='stable_baselines' is Stable-Baselines 2 (TensorFlow 1), which runs on no Python shmvec "
            "supports: use base_class='stable_baselines3' (SB3) or 'gymnasium'"
        )
    if base_class not in BASE_CLASSES:
        raise ValueError(f"base_class must be one of {BASE_CLASSES} (SuperSuit's), got {base_class!r}")
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, np.integer))):
        raise TypeError(f"num_cpus must be an int (worker processes; 0: in this process) or None, got {num_cpus!r}")
    if num_cpus is not None and num_cpus < 0:
        raise ValueError(f"num_cpus must be 0 or more worker processes, got {num_cpus}")
    n_workers = None if num_cpus is None else min(int(num_cpus), int(num_vec_envs))
    if base_class == "gymnasium":
        require_vector_api('concat_vec_envs_v1(..., base_class="gymnasium") (base_class="stable_baselines3" works)')
    if base_class == "stable_baselines3":
        from shmvec.adapters.agents_sb3 import ShmAgentVecEnv

        return ShmAgentVecEnv(vec_env, num_vec_envs, n_workers, **options)
    # SuperSuit's flags are uint8 from its in-process ConcatVecEnv (num_cpus, at most the copies, 0 or 1),
    # bool from its processes.
    flags_dtype = np.uint8 if n_workers is None or n_workers <= 1 else np.bool_
    return ShmAgentConcatVecEnv(vec_env, num_vec_envs, n_workers, flags_dtype=flags_dtype, **options)


class ShmAgentConcatVecEnv(ShmAgentVectorEnv):
    """Every agent of ``num_copies`` copies of a PettingZoo ``ParallelEnv`` as a slot of a Gymnasium
    ``VectorEnv`` with SuperSuit's ``ConcatVecEnv`` conventions (``concat_vec_envs_v1(...,
    base_class="gymnasium")``): slot ``c * A + a`` is agent ``a`` of copy ``c``.

    - ``observation_space``/``action_space`` are one agent's (as SuperSuit's; so are
      ``single_observation_space``/``single_action_space``);
    - ``reset(seed=s)`` resets copy ``c`` with seed ``s + c`` and returns ``(obs, infos)``,
      ``infos`` a list of one dict per slot;
    - ``step(actions)`` returns ``(obs, rewards, terminations, truncations, infos)``: rewards
      float32, flags uint8 (bool where ``num_cpus`` is 2 or more, as SuperSuit's processes
      return), infos a list of one dict per slot. A copy whose agents are all done resets on the
      same step: its slots return the reset observations, ``terminal_observation`` in their
      infos, with the reset infos merged in.

    Where it differs from SuperSuit's: unseeded, each copy gets its own random seed at the first
    reset (copies of one instance would share its random state); an agent that leaves while its
    copy goes on (SuperSuit raises without ``black_death_v3``) gets a zero observation and
    reward 0 from then on, ``terminal_observation`` in its info on the step it leaves, its flag
    kept set, and ``mask`` (a bool per slot: the agent acts next step) says which slots act;
    when a copy ends, a slot whose agent was absent from its episode is flagged too (terminated
    if the copy's flagged agents all terminated, else truncated). A copy restarted after its
    worker died (``on_worker_failure="restart"``): its slots return its reset observations,
    reward 0, truncated, and ``shmvec_restarted`` in their infos, without ``terminal_observation``.
    """

    def __init__(
        self, env: Any, num_copies: int, n_workers: int | None = None, *, flags_dtype: Any = np.uint8, **options: Any
    ):
        for name in ("autoreset_mode", "batch_size"):
            if name in options:
                raise TypeError(f"{name} is not an option here: SuperSuit's vector env resets on the same step")
        super().__init__(env, num_copies, n_workers, autoreset_mode=AutoresetMode.SAME_STEP, **options)
        self.observation_space, self.action_space = self.single_observation_space, self.single_action_space
        # the env's own, as SuperSuit's (a vector env's metadata adds its autoreset mode)
        self.metadata = {k: v for k, v in self.metadata.items() if k != "autoreset_mode"}
        self._flags_dtype = np.dtype(flags_dtype)
        self.mask = np.ones(self.num_envs, bool)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, list[dict]]:
        """Reset every copy (copy ``c`` with ``seed + c``); ``(obs, one info per slot)``."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"seed must be None or an int (copy c is reset with seed + c), got {seed!r}")
        if options is not None and "reset_mask" in options:
            raise ValueError(
                "options['reset_mask'] is Gymnasium's partial reset; SuperSuit's vector env resets every copy "
                "with the options as given: for partial resets use ShmAgentVectorEnv(autoreset_mode='Disabled')"
            )
        copy_seeds, _, _ = self._reset_args(seed, None)
        rows, copy_infos = self._copies.reset(seed=copy_seeds, options=options)
        self.mask = rows["mask"].reshape(self.num_envs).astype(bool)
        infos = [{} for _ in range(self.num_envs)]
        for c in _rows_with_infos(copy_infos, len(rows["rewards"])):
            self._add_agent_infos(infos, c, info_row(copy_infos, c).get(AGENT_INFOS))
        return rows["obs"].reshape(self.num_envs, *self.observation_space.shape), infos

    def step_async(self, actions: Any) -> None:
        """Start a step: one action per slot, ``(num_envs, *action_shape)``."""
        self._copies.step_async(self._copy_actions(actions, self.num_copies))

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        return self._slot_step(self._copies.step_wait())

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """Step every slot's agent (agents absent or done ignore theirs); results per slot."""
        return self._slot_step(self._copies.step(self._copy_actions(actions, self.num_copies)))

    def _slot_step(self, results: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        rows, _, copy_terminations, copy_truncations, copy_infos = results
        n, A = self.num_envs, self.num_agents
        obs = rows["obs"].reshape(n, *self.observation_space.shape)
        rewards = rows["rewards"].reshape(n).astype(np.float32)
        terminations = rows["terminated"].reshape(n).astype(bool)
        truncations = rows["truncated"].reshape(n).astype(bool)
        acted, self.mask = self.mask, rows["mask"].reshape(n).astype(bool)
        infos = [{} for _ in range(n)]
        for c in _rows_with_infos(copy_infos, self.num_copies):
            copy_info = info_row(copy_infos, c)
            part = slice(c * A, (c + 1) * A)
            final = copy_info.get("final_obs")
            if final is None:  # the copy goes on (or was restarted: its rows hold the fresh reset)
                self._add_agent_infos(infos, c, copy_info.get(AGENT_INFOS))
                for a, last_obs in copy_info.get(LEFT_AGENT_OBS, {}).items():
                    infos[c * A + a]["terminal_observation"] = last_obs
            else:  # ended and reset: the rows hold the reset; the step's own values came with its final obs
                rewards[part] = final["rewards"]
                terminations[part] = final["terminated"]
                truncations[part] = final["truncated"]
                self._add_agent_infos(infos, c, copy_info["final_info"].get(AGENT_INFOS))
                for a in np.flatnonzero(acted[part]).tolist():  # the agents that stepped (SuperSuit: those observed)
                    infos[c * A + a]["terminal_observation"] = final["obs"][a]
                self._add_agent_infos(infos, c, copy_info.get(AGENT_INFOS))  # the reset infos, merged in
            for key, value in copy_info.items():  # what the engine adds for a copy (shmvec_restarted): each slot
                if key not in ("final_obs", "final_info", AGENT_INFOS, LEFT_AGENT_OBS):
                    for info in infos[part]:
                        info[key] = value
        # a copy that ended flags every slot: agents absent from its episode, a copy restarted after its worker died
        flag_whole_copies(terminations, truncations, copy_terminations, copy_truncations, A)
        flags = self._flags_dtype
        return obs, rewards, terminations.astype(flags, copy=False), truncations.astype(flags, copy=False), infos

    def _add_agent_infos(self, infos: list[dict], copy: int, agent_infos: Any) -> None:
        for a, agent_info in enumerate(agent_infos or ()):
            infos[copy * self.num_agents + a].update(agent_info)

    def render(self) -> Any:
        """The first copy's ``render()``, as SuperSuit's."""
        return self._copies.call_one(0, "render")

    def env_is_wrapped(self, wrapper_class: type) -> list[bool]:
        """``False`` for each slot, as SuperSuit's (a PettingZoo env is not a Gymnasium wrapper's)."""
        return [False] * self.num_envs

    def send(self, actions: Any, env_ids: Any = None) -> None:
        raise NotImplementedError(_NO_BATCHES)

    def recv(self, timeout: float | None = None) -> Any:
        raise NotImplementedError(_NO_BATCHES)

    def async_reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        raise NotImplementedError(_NO_BATCHES)


_NO_BATCHES = "SuperSuit's vector env has no async batches: ShmAgentVectorEnv(..., batch_size=k) has them"


def _rows_with_infos(copy_infos: dict[str, Any], n_rows: int) -> list[int]:
    """The copy rows whose info holds anything (Gymnasium's ``_key`` masks), in order."""
    rows = np.zeros(n_rows, bool)
    for key, value in copy_infos.items():
        if key.startswith("_") and isinstance(value, np.ndarray):
            rows |= value
    return np.flatnonzero(rows).tolist()
