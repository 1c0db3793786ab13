"""``ShmAgentVectorEnv``: the agents of N PettingZoo ``ParallelEnv`` copies as one Gymnasium ``VectorEnv``.

Slot ``c * A + a`` is agent ``a`` (of ``possible_agents``) of copy ``c``. Each copy is one
:class:`~shmvec.adapters.agent_slots.AgentSlotsEnv` of a :class:`~shmvec.adapters.vector.ShmVectorEnv`,
which steps the copies in the engine's workers and autoresets them in the requested mode, so
every agent's observation, reward, flags and mask travel in shared memory; this class only
reshapes copy rows into slot rows and copy infos into slot infos (Gymnasium's dicts of arrays).
"""

from __future__ import annotations

import numbers
import secrets
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from shmvec.adapters import gym_resets
from shmvec.adapters.agent_slots import AGENT_INFOS, LEFT_AGENT_OBS, AgentSpacesMismatchError, slots_env_fns, slots_repr
from shmvec.adapters.vector import ShmVectorEnv
from shmvec.errors import InvalidActionError, ResetNeededError, SpaceMismatchError
from shmvec.gymnasium_1_1 import AutoresetMode, require_vector_api

__all__ = ["ShmAgentVectorEnv"]

_SLOT_KEYS = (AGENT_INFOS, LEFT_AGENT_OBS, "final_obs", "final_info")  # copy info keys turned into slot keys


class _SlotRows:
    """Gymnasium's own ``_add_info``, over ``num_envs`` rows: all slots, or those of an async batch."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int):
        self.num_envs = num_envs


class ShmAgentVectorEnv(VectorEnv):
    """Every agent of ``num_copies`` copies of a PettingZoo ``ParallelEnv`` as a Gymnasium ``VectorEnv`` slot.

    Example (not a doctest: MPE2 is not one of shmvec's dependencies)::

        from mpe2 import simple_spread_v3
        from shmvec import ShmAgentVectorEnv

        with ShmAgentVectorEnv(simple_spread_v3.parallel_env(N=3), 4, n_workers=0) as envs:
            obs, infos = envs.reset(seed=0)  # (12, 18): 4 copies x 3 agents; infos["mask"]: who acts
            obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())

    Args:
        env: a ``ParallelEnv`` (each copy is a copy of it, as SuperSuit copies it), SuperSuit's
            ``pettingzoo_env_to_vec_env_v1(env)``, or a function that returns a ``ParallelEnv``.
            Its agents must share one observation and one action space (Box, Discrete,
            MultiDiscrete or MultiBinary): pad them with SuperSuit's ``pad_observations_v0``
            and ``pad_action_space_v0`` first.
        num_copies: how many copies of the env (``num_envs`` is ``num_copies * len(possible_agents)``).
        n_workers: worker processes over the copies (0: every copy in this process).
        autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED``, applied per copy.
        batch_size: copies per :meth:`recv` in async batches (default: all), so a batch has
            ``batch_size * A`` slot rows.
        **options: :class:`~shmvec.adapters.vector.ShmVectorEnv`'s other keywords (``copy``, the
            pool options), over the copies.

    Episodes. A copy's episode ends when each of its agents is terminated or truncated; the
    autoreset mode then works on the copy as Gymnasium's on one env, and each of its slots
    returns its own agent's reward and flags. ``NEXT_STEP``: the step that ends it returns
    the final observations, the next one the reset (reward 0, flags False; actions ignored).
    ``SAME_STEP``: the reset observations, with ``infos["final_obs"]``/``infos["final_info"]``
    per slot. ``DISABLED``: the final observations; reset the copy with
    ``reset(options={"reset_mask": terminations | truncations})``: a copy resets when all its
    slots are in the mask. When a copy's episode ends, each of its slots without a flag of its
    own (an agent absent from the episode, every slot of a copy restarted after its worker
    died) is flagged too: terminated if the copy's flagged agents all terminated, else
    truncated, so ``terminations | truncations`` always covers whole copies.

    Agents that leave while their copy goes on (agent death): on the step an agent leaves, its
    slot returns its reward and flag, a zero observation and its last observation in
    ``infos["final_obs"]`` (its info in ``infos["final_info"]``), in every mode; then, until
    its copy resets, a zero observation, reward 0 and its flag still set (its actions ignored).

    ``infos["mask"]`` (every step and reset, a bool per slot): the slot's agent acts next step.

    ``call``, ``get_attr`` and ``set_attr`` work by slot: each runs once on each copy, and
    each slot gets its copy's result (an attribute the ``AgentSlotsEnv`` lacks is its
    ``ParallelEnv``'s). ``render()`` returns one image per copy.
    """

    def __init__(
        self,
        env: Any,
        num_copies: int,
        n_workers: int | None = None,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        batch_size: int | None = None,
        **options: Any,
    ):
        require_vector_api(type(self).__name__)
        if options.get("device") is not None:
            raise ValueError("ShmAgentVectorEnv returns numpy arrays: device is not supported")
        env_fns, self._copied = slots_env_fns(env, num_copies)
        options.update(autoreset_mode=autoreset_mode, batch_size=batch_size)
        try:
            self._copies = ShmVectorEnv(env_fns, n_workers, **options)
        except SpaceMismatchError as exc:  # a factory's agents differ: the fix is padding, not observation_mode
            if isinstance(exc.__cause__, AgentSpacesMismatchError):
                raise exc.__cause__ from exc.__cause__.__cause__
            raise
        try:
            self.possible_agents, self.single_observation_space, self.single_action_space = self._copies.get_attr(
                "agent_layout"
            )[0]
        except BaseException:
            self._copies.close()
            raise
        self.num_copies = int(num_copies)
        self.num_agents = len(self.possible_agents)
        self.num_envs = self.num_copies * self.num_agents
        self.n_workers = self._copies.n_workers
        self.batch_size = self._copies.batch_size
        self.autoreset_mode = self._copies.autoreset_mode
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(self._copies.metadata)
        self.render_mode = self._copies.render_mode
        self._seeded = False
        self._needs_reset = np.zeros(self.num_copies, bool)  # DISABLED mode: copies that ended, not reset since
        self._last_copies: np.ndarray | None = None  # the copies of the last recv

    # -- reset ---------------------------------------------------------------------

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the copies (all, or those every slot of which is in ``options["reset_mask"]``).

        ``seed``: ``None``, an int ``s`` (copy ``c`` gets ``s + c``) or one seed per slot (the
        slots of a copy must agree). Unseeded copies of one env instance would share its
        random state, so the first reset of such copies draws a random ``s``.
        """
        copy_seeds, copy_options, reset_copies = self._reset_args(seed, options)
        rows, copy_infos = self._copies.reset(seed=copy_seeds, options=copy_options)
        self._needs_reset[reset_copies] = False
        obs, _, _, _, infos = self._slot_results(rows, copy_infos)
        return obs, infos

    def async_reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        """Start resetting the copies, as :meth:`reset` does; :meth:`recv` returns them (async batches)."""
        copy_seeds, copy_options, reset_copies = self._reset_args(seed, options)
        self._copies.async_reset(seed=copy_seeds, options=copy_options)
        self._needs_reset[reset_copies] = False

    def _reset_args(self, seed: Any, options: dict[str, Any] | None) -> tuple[list, dict | None, np.ndarray]:
        """The copies' seeds and options for a reset, and which copies it resets."""
        A = self.num_agents
        if isinstance(seed, bool) or not isinstance(seed, (type(None), numbers.Integral, list, tuple, np.ndarray)):
            raise TypeError(
                f"seed must be None, an int or one seed per agent slot (num_envs={self.num_envs}), "
                f"got {type(seed).__name__} {seed!r}"
            )
        if seed is None and self._copied and not self._seeded:
            seed = secrets.randbits(32)  # not the caller's np.random: SyncVectorEnv leaves it alone
        if seed is not None:
            self._seeded = True
        if seed is None or isinstance(seed, (int, np.integer)):
            copy_seeds = gym_resets.seeds(seed, self.num_copies)
        else:
            slot_seeds = np.asarray(gym_resets.seeds(seed, self.num_envs), object).reshape(self.num_copies, A)
            if any(len(set(row.tolist())) > 1 for row in slot_seeds):
                raise ValueError(f"the slots of a copy share its seed: got {slot_seeds.tolist()} (copies x agents)")
            copy_seeds = slot_seeds[:, 0].tolist()
        reset_copies = np.ones(self.num_copies, bool)
        if options is not None and "reset_mask" in options:
            options = dict(options)
            slot_mask = gym_resets.checked_mask(options.pop("reset_mask"), self.num_envs)
            reset_copies = slot_mask.reshape(self.num_copies, A).all(axis=1)
            if not reset_copies.any():
                raise ValueError(
                    "options['reset_mask'] resets a copy only where every slot of it is True; "
                    f"it names no whole copy ({self.num_copies} copies x {A} agents): {slot_mask.tolist()}"
                )
            options["reset_mask"] = reset_copies
        return copy_seeds, options, np.flatnonzero(reset_copies)

    # -- stepping ------------------------------------------------------------------

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every slot's agent (agents absent or done ignore theirs); results per slot."""
        copy_actions = self._copy_actions(actions, self.num_copies)
        self._check_needs_reset(np.arange(self.num_copies))
        rows, _, terminations, truncations, copy_infos = self._copies.step(copy_actions)
        if self.autoreset_mode is AutoresetMode.DISABLED:
            self._needs_reset = terminations | truncations
        return self._slot_results(rows, copy_infos, terminations, truncations)

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Step the slots ``env_ids`` (whole copies, in order; default: those of the last :meth:`recv`)."""
        if env_ids is None:
            copies = self._last_copies
            if copies is None:
                self._copies.send(actions)  # raises ShmVectorEnv's error: recv first
        else:
            copies = self._copies_of_slots(env_ids)
        copy_actions = self._copy_actions(actions, len(copies))
        self._check_needs_reset(copies)
        self._copies.send(copy_actions, copies)

    def recv(self, timeout: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """The slots of the first ``batch_size`` copies to finish; ``infos["env_id"]``: each row's slot."""
        rows, _, terminations, truncations, copy_infos = self._copies.recv(timeout)
        copies = copy_infos["env_id"]
        self._last_copies = copies
        if self.autoreset_mode is AutoresetMode.DISABLED:
            self._needs_reset[copies] = terminations | truncations
        results = self._slot_results(rows, copy_infos, terminations, truncations)
        results[-1]["env_id"] = (copies[:, None] * self.num_agents + np.arange(self.num_agents)).reshape(-1)
        return results

    def _copy_actions(self, actions: Any, n_copies: int) -> np.ndarray:
        """One action per slot, ``(n_copies * A, *action_shape)``, as the copies' ``(n_copies, A, ...)``."""
        actions = np.asarray(actions)
        expected = (n_copies * self.num_agents, *self.single_action_space.shape)
        if actions.shape != expected:
            raise InvalidActionError(
                f"expected actions of shape {expected}, one per agent slot ({n_copies} copies x "
                f"{self.num_agents} agents = {expected[0]}, action space {self.single_action_space}), "
                f"got shape {actions.shape}"
            )
        return actions.reshape(n_copies, self.num_agents, *actions.shape[1:])

    def _copies_of_slots(self, env_ids: Any) -> np.ndarray:
        ids = np.asarray(env_ids, np.int64).reshape(-1)
        A = self.num_agents
        outside = ids[(ids < 0) | (ids >= self.num_envs)]
        if len(outside):
            raise IndexError(
                f"env_ids are agent slots in [0, {self.num_envs}) (num_envs={self.num_envs}: {self.num_copies} "
                f"copies x {A} agents), got slots {outside.tolist()}"
            )
        copies = ids[::A] // A
        if len(ids) % A or not np.array_equal(ids, (copies[:, None] * A + np.arange(A)).reshape(-1)):
            raise InvalidActionError(f"env_ids must list whole copies' slots ({A} agents each) in order, got {ids}")
        return copies

    def _check_needs_reset(self, copies: np.ndarray) -> None:
        ended = copies[self._needs_reset[copies]]
        if len(ended):
            slots = (ended[:, None] * self.num_agents + np.arange(self.num_agents)).reshape(-1)
            raise ResetNeededError(
                f"autoreset_mode is DISABLED and the episodes of copies {ended.tolist()} (slots {slots.tolist()}) "
                "ended: reset them first with reset(options={'reset_mask': mask})"
            )

    # -- copy rows and infos as slots -----------------------------------------------

    def _slot_results(
        self,
        rows: dict[str, np.ndarray],
        copy_infos: dict[str, Any],
        copy_terminations: np.ndarray | None = None,
        copy_truncations: np.ndarray | None = None,
    ) -> tuple:
        """``(obs, rewards, terminations, truncations, infos)`` of the slots of copy rows ``(P, A, ...)``,
        and of the copies' own flags (a step's; none at a reset)."""
        A = self.num_agents
        n = rows["rewards"].size
        obs = rows["obs"].reshape(n, *self.single_observation_space.shape)
        rewards = rows["rewards"].reshape(n).astype(np.float64)
        terminations = rows["terminated"].reshape(n).astype(bool)
        truncations = rows["truncated"].reshape(n).astype(bool)
        slot_infos = {}  # copy row -> one info per agent, for the rows that have any
        for p in range(len(rows["rewards"])) if copy_infos else ():
            copy_info = info_row(copy_infos, p)
            if not copy_info:
                continue
            final = copy_info.get("final_obs")
            if final is not None:  # SAME_STEP: the rows hold the reset; the step's own values came with its end
                part = slice(p * A, (p + 1) * A)
                rewards[part] = final["rewards"]
                terminations[part] = final["terminated"].astype(bool)
                truncations[part] = final["truncated"].astype(bool)
            slot_infos[p] = agent_infos(copy_info, A)
        if copy_terminations is not None:
            flag_whole_copies(terminations, truncations, copy_terminations, copy_truncations, A)
        infos: dict[str, Any] = {}
        add_info = _SlotRows(n)._add_info
        for p in sorted(slot_infos):
            for a, info in enumerate(slot_infos[p]):
                if info:
                    infos = add_info(infos, info, p * A + a)
        infos["mask"] = rows["mask"].reshape(n).astype(bool)
        infos["_mask"] = np.ones(n, bool)
        return obs, rewards, terminations, truncations, infos

    # -- rare calls, by slot: each runs once on each copy ------------------------------

    def _by_slot(self, per_copy: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(result for result in per_copy for _ in range(self.num_agents))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` once on each copy (its ``AgentSlotsEnv``, else its ``ParallelEnv``); each slot gets
        its copy's result (an attribute that is not callable is returned)."""
        return self._by_slot(self._copies.call(name, *args, **kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute of each slot's copy."""
        return self._by_slot(self._copies.get_attr(name))

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set the attribute once on each copy: one value for all, or one per slot (a copy takes its first slot's)."""
        if isinstance(values, (list, tuple)):
            if len(values) != self.num_envs:
                raise ValueError(f"expected one value per agent slot ({self.num_envs}), got {len(values)}")
            values = list(values[:: self.num_agents])
        self._copies.set_attr(name, values)

    def render(self) -> tuple[Any, ...]:
        """Each copy's ``render()``, once per copy (not per slot)."""
        return self._copies.render()

    @property
    def timings(self) -> Any:
        """Where the time went, over the copies (see :class:`~shmvec.adapters.vector.ShmVectorEnv`)."""
        return self._copies.timings

    def close_extras(self, **kwargs: Any) -> None:
        """Close the copies, stop the workers and release the shared memory (``close()`` calls it once)."""
        copies = getattr(self, "_copies", None)
        if copies is not None:
            copies.close(**kwargs)

    def __repr__(self) -> str:
        return slots_repr(self, self._copies)

    def __enter__(self) -> ShmAgentVectorEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        pass  # an unclosed env is left to the copies' pool finalizer, which releases everything and warns


def flag_whole_copies(
    terminations: np.ndarray,
    truncations: np.ndarray,
    copy_terminations: np.ndarray,
    copy_truncations: np.ndarray,
    num_agents: int,
) -> None:
    """Flag, in place, each slot of an ended copy that has no flag of its own: an agent absent from
    the episode, or every slot of a copy restarted (its rows are the fresh reset's, its flag the
    copy's truncation). Terminated if the copy's flagged slots all terminated, else truncated; so
    ``terminations | truncations`` covers whole copies, as DISABLED's reset recipe needs."""
    ended = np.flatnonzero(np.asarray(copy_terminations) | np.asarray(copy_truncations))
    if not len(ended):
        return
    slot_terminations = terminations.reshape(-1, num_agents)  # views: the writes land in the slot arrays
    slot_truncations = truncations.reshape(-1, num_agents)
    for c in ended.tolist():
        terminated, truncated = slot_terminations[c], slot_truncations[c]
        unflagged = ~(terminated | truncated)
        if not unflagged.any():
            continue
        if copy_terminations[c] or (terminated.any() and not truncated.any()):
            terminated |= unflagged
        else:
            truncated |= unflagged


def info_row(infos: dict[Any, Any], row: int) -> dict[Any, Any]:
    """Row ``row`` of Gymnasium's dict of arrays with ``_key`` masks, as the plain dict it was built from."""
    return {
        key: info_row(value, row) if isinstance(value, dict) else value[row]
        for key, value in infos.items()
        if f"_{key}" in infos and infos[f"_{key}"][row]
    }


def agent_infos(copy_info: dict[str, Any], num_agents: int) -> list[dict[str, Any]]:
    """A copy's info (an :class:`~shmvec.adapters.agent_slots.AgentSlotsEnv`'s, with Gymnasium's
    ``final_obs``/``final_info`` if it ended in SAME_STEP mode) as one info per agent slot."""
    own = copy_info.get(AGENT_INFOS) or ({},) * num_agents
    slots = [{} for _ in range(num_agents)]
    final = copy_info.get("final_obs")
    if final is not None:  # ended and reset: each slot's final observation and info, then its reset info
        final_infos = copy_info["final_info"].get(AGENT_INFOS) or ({},) * num_agents
        for a, info in enumerate(slots):
            info.update(final_obs=final["obs"][a], final_info=dict(final_infos[a]))
    for a, last_obs in copy_info.get(LEFT_AGENT_OBS, {}).items():  # left while the copy goes on: row zeroed
        slots[a].update(final_obs=last_obs, final_info=dict(own[a]))
    for a, info in enumerate(slots):
        info.update(own[a])
    for key, value in copy_info.items():  # anything the engine adds for a copy (shmvec_restarted): each slot
        if key not in _SLOT_KEYS:
            for info in slots:
                info[key] = value
    return slots
