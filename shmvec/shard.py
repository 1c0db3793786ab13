"""A shard: a contiguous run of envs stepped in place against the shared arena.

The same class serves inside worker processes and, with ``main_shard=True``, inside
the main process, so both execute exactly the same stepping and auto-reset logic.
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from shmvec import layout as lay
from shmvec.protocol import Hello, Reset, RunOps, StepInfo


class Shard:
    """The envs ``[start, start + len(envs))``, wired to their rows of the shared buffers."""

    def __init__(
        self,
        envs: list[gym.Env],
        start: int,
        arena_views: dict[str, np.ndarray],
        layout: lay.ArenaLayout,
        autoreset_mode: AutoresetMode,
        action_space: gym.Space,
    ):
        self.envs = envs
        self.start = start
        self.stop = start + len(envs)
        self.reward = arena_views["reward"]
        self.terminated = arena_views["terminated"]
        self.truncated = arena_views["truncated"]
        self.autoreset = [False] * len(envs)  # NEXT_STEP: env j resets on its next step
        self.mode = autoreset_mode
        self._same_step = autoreset_mode == AutoresetMode.SAME_STEP
        self._next_step = autoreset_mode == AutoresetMode.NEXT_STEP
        self._action_space = action_space
        self._obs_leaves = [(arena_views[lay.obs_field(leaf.path)], leaf.path) for leaf in layout.obs_leaves]
        self._action_leaves = [(arena_views[lay.action_field(leaf.path)], leaf.path) for leaf in layout.action_leaves]
        self._flat_obs = self._obs_leaves[0][0] if self._obs_leaves[0][1] == () else None
        self._final_obs = arena_views.get(lay.FINAL_OBS)  # present: episode ends travel in shm
        self._final_flag = arena_views.get(lay.FINAL_FLAG)

    # -- buffers -------------------------------------------------------------------

    def write_obs(self, i: int, obs: Any) -> None:
        if self._flat_obs is not None:
            self._flat_obs[i] = obs
        else:
            for view, path in self._obs_leaves:
                view[i] = lay.get_path(obs, path)

    def read_actions(self) -> list[Any]:
        """This shard's actions, copied out of shared memory (an env may keep them)."""
        s, e = self.start, self.stop
        if len(self._action_leaves) == 1 and self._action_leaves[0][1] == ():
            return list(self._action_leaves[0][0][s:e].copy())
        columns = {path: view[s:e].copy() for view, path in self._action_leaves}
        return [lay.unflatten(self._action_space, {p: col[j] for p, col in columns.items()}) for j in range(e - s)]

    # -- commands ------------------------------------------------------------------

    def step(self, actions: list[Any]) -> list[StepInfo]:
        """Step every env of the shard in place; return the infos worth sending."""
        infos: list[StepInfo] = []
        reward, terminated, truncated = self.reward, self.terminated, self.truncated
        write_obs, start, autoreset = self.write_obs, self.start, self.autoreset
        same_step, next_step = self._same_step, self._next_step
        final_view, final_flag = self._final_obs, self._final_flag
        i = start
        try:
            for j, env in enumerate(self.envs):
                i = start + j
                if next_step and autoreset[j]:
                    obs, info = env.reset()
                    rew, term, trunc = 0.0, False, False
                else:
                    obs, rew, term, trunc, info = env.step(actions[j])
                reward[i] = rew
                terminated[i] = term
                truncated[i] = trunc
                if term or trunc:
                    if same_step:
                        final_obs, final_info = obs, info
                        obs, info = env.reset()
                        if final_view is not None and _fits(final_obs, final_view) and not final_info and not info:
                            final_view[i] = final_obs  # the common case: nothing to pickle
                            final_flag[i] = True
                        else:
                            if final_flag is not None:
                                final_flag[i] = False
                            infos.append(StepInfo(i, info, final_obs, final_info))
                    else:
                        autoreset[j] = next_step
                        if info:
                            infos.append(StepInfo(i, info))
                else:
                    autoreset[j] = False
                    if info:
                        infos.append(StepInfo(i, info))
                write_obs(i, obs)
        except Exception as exc:  # zero-cost until raised (3.11)
            raise EnvFailed(i) from exc
        return infos

    def reset(self, request: Reset) -> dict[int, dict[str, Any]]:
        infos = {}
        i = None
        try:
            for i, kwargs in request.kwargs.items():
                j = i - self.start
                obs, infos[i] = self.envs[j].reset(**kwargs)
                self.write_obs(i, obs)
                self.autoreset[j] = False
                self.terminated[i] = self.truncated[i] = False
        except Exception as exc:
            raise EnvFailed(i) from exc
        return infos

    def handle(self, request: Reset | RunOps) -> dict[int, Any]:
        """Serve a rare request: a reset or operations on envs."""
        return self.reset(request) if isinstance(request, Reset) else self.run_ops(request)

    def run_ops(self, request: RunOps) -> dict[int, Any]:
        results = {}
        i = None
        try:
            for i, op in request.ops.items():
                results[i] = op(self.envs[i - self.start])
        except Exception as exc:
            raise EnvFailed(i) from exc
        return results


def _fits(obs: Any, view: np.ndarray) -> bool:
    """Whether ``obs`` survives a trip through a row of ``view`` exactly (type, dtype, shape)."""
    return type(obs) is np.ndarray and obs.dtype == view.dtype and obs.shape == view.shape[1:]


class EnvFailed(Exception):
    """Raised by :class:`Shard` when env ``env_index`` raised; the env's exception is ``__cause__``."""

    def __init__(self, env_index: int | None):
        super().__init__(env_index)
        self.env_index = env_index


def build_envs(env_fns, env_wrapper, first_env: int, where: str) -> list[gym.Env]:
    """Call each env_fn (then ``env_wrapper``); an error names the env index and ``where``."""
    envs: list[gym.Env] = []
    for i, env_fn in enumerate(env_fns, start=first_env):
        try:
            env = env_fn()
            envs.append(env_wrapper(env) if env_wrapper is not None else env)
        except Exception as exc:
            for built in envs:
                _close_quietly(built)
            raise EnvFailed(i) from exc
    seen: dict[int, int] = {}
    for j, env in enumerate(envs):
        other = seen.setdefault(id(env.unwrapped), j)
        if other != j:
            for built in envs:
                _close_quietly(built)
            raise ValueError(
                f"env_fns[{first_env + other}] and env_fns[{first_env + j}] returned the same env instance "
                f"(in {where}). Each env_fn must create a new env (e.g. `lambda: gym.make(...)`), not return "
                "a shared one."
            )
    return envs


def describe_envs(worker: int, envs: list[gym.Env]) -> Hello:
    """What the main process needs to know about a shard's envs."""
    first = envs[0]
    return Hello(
        worker,
        [(env.observation_space, env.action_space) for env in envs],
        first.metadata,
        first.render_mode,
        _picklable_or_none(first.spec),
    )


def _picklable_or_none(obj: Any) -> Any:
    try:
        pickle.dumps(obj)
        return obj
    except Exception:
        return None


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:
        pass
