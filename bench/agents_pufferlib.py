"""PufferLib's PettingZoo emulation and ``Multiprocessing`` vectorization as an SB3 ``VecEnv``.

A third vector env for ``bench/agents.py``, next to SuperSuit's and shmvec's: ``copies`` copies
of ``bench.agents.ENVS[env_name].make()`` (KAZ and multiwalker already ``black_death_v3``-wrapped),
each wrapped in ``pufferlib.emulation.PettingZooPufferEnv`` and stepped by
``pufferlib.vector.make(..., backend=pufferlib.vector.Multiprocessing)``::

    from bench.agents_pufferlib import build

    venv = build("simple_spread", copies=8, num_workers=2)  # num_envs = 8 copies x 3 agents

PufferLib is not one of shmvec's extras. Installed as ``pip install pufferlib-core`` (3.0.23, the
emulation and vector modules without PufferLib's C envs) in a venv with ``shmvec[sb3,agents]``;
it pins ``torch==2.9.0`` (a CUDA build), so torch 2.13.0+cpu was reinstalled over it (``pip
check`` reports the pin; emulation and vectorization do not use torch, though ``import pufferlib``
imports it). Its CUDA extension ``pufferlib._C`` then does not load (``libcudart.so.12``) and is
not used here.

Slot ``c * A + a`` is agent ``a`` (of ``possible_agents``) of copy ``c``, as SuperSuit's. The
observation and action spaces are one agent's, as PufferLib's emulation leaves them: a Box or a
Discrete space passes through unchanged (all four envs here), so they equal SuperSuit's.

PufferLib's settings: ``num_workers`` worker processes (each steps ``copies / num_workers``
copies in a ``Serial`` loop; ``copies`` must divide by it), ``batch_size = copies`` (PufferLib's
own default when none is given: every step covers every env, the synchronous path SB3 needs;
``make``'s ``"auto"`` would halve it into an async env pool) and ``zero_copy=True`` (its default;
with the full batch it changes nothing). Workers are started with ``multiprocessing.Process``
in the default context (fork on Linux), share ``RawArray`` buffers (anonymous memory: nothing
is left in ``/dev/shm``) and busy-wait on a semaphore array for 0.5 s after each command, then
poll every 10 ms; the main process busy-waits in ``recv``. One more copy of the env, the
"driver env", lives in the main process (for spaces only; never stepped).

How this differs from SuperSuit's and shmvec's SB3 contract (PufferLib's behaviour, kept):

- **Reset takes a step.** PufferLib auto-resets a copy on the step *after* its episode ended:
  the step that ends it returns the final observation with ``done=True``; the next step ignores
  that copy's actions and returns its reset observation, reward 0, ``done=False``. SuperSuit and
  shmvec reset within the ending step and return the reset observation with ``done=True``. So
  SB3 gets one extra transition per episode (from the final observation, reward 0), and bare
  stepping counts that reset as a vector step.
- **No** ``terminal_observation`` **and no** ``TimeLimit.truncated`` in infos, so SB3 never
  bootstraps a truncated episode. (SB3's PPO needs both; SuperSuit gives the first but not the
  second, so it does not bootstrap either; shmvec gives both.) ``dones`` is
  ``terminals | truncations``.
- **Infos are empty dicts.** PufferLib's ``recv`` returns a list of the non-empty PettingZoo
  info dicts of the copies (sent through a pipe whenever any agent's info dict has a key), not
  aligned to slots; the last such list is kept as :attr:`PufferAgentVecEnv.puffer_infos`.
- **Copies.** Observations, rewards and dones are copied out of PufferLib's shared buffers
  (``recv`` returns views that the next step overwrites; SB3 keeps a step's arrays across the
  next one). Rewards are float32 (PufferLib's buffer), as SuperSuit's SB3 slots.
- **Seeding.** PufferLib's reset needs an integer seed (worker ``i`` gets ``seed + i``, its
  ``j``-th copy ``seed + i + j``, so copies of neighbouring workers share seeds): ``reset()``
  uses the one given to ``seed()`` or else the one given to :func:`build` (0). Auto-resets
  within an episode stream are unseeded.
- **Reset after stepping.** pufferlib-core 3.0.23's ``Multiprocessing.async_reset`` hangs when called
  after a step whose workers sent infos (every step of these envs: PettingZoo's info dict has
  one key per agent): it reads those infos from the pipe again. ``reset()`` first marks those
  already-read semaphores done, so a reset after stepping (``PPO.learn`` resets the env) works.
- **Closing.** PufferLib's ``close()`` closes the driver env and terminates (SIGTERM) the
  workers without joining them or closing the workers' envs; this class then joins them and
  closes the pipes. The workers are not daemons, so an unclosed vecenv blocks interpreter
  exit (multiprocessing joins its children, which never return): :func:`build` registers
  ``close`` with ``atexit``. Workers do not watch their parent: if it is killed they keep
  polling until killed themselves.
- ``get_attr`` answers ``render_mode`` (None) only, as SB3's ``VecEnv.__init__`` asks;
  ``set_attr``/``env_method`` raise ``NotImplementedError``; ``env_is_wrapped`` is all False.
  ``PPO.learn`` needs nothing more.
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ImportError:  # available() says why
    VecEnv = object  # type: ignore[assignment,misc]
    VecEnvIndices = VecEnvObs = VecEnvStepReturn = Any  # type: ignore[misc]


def available() -> str | None:
    """None when PufferLib's emulation and vectorization and SB3 import here, else why not."""
    for module in ("pufferlib.emulation", "pufferlib.vector", "stable_baselines3"):
        try:
            __import__(module)
        except Exception as exc:  # an extension that fails to load raises more than ImportError
            return f"pufferlib: {module} does not import ({type(exc).__name__}: {exc})"
    return None


def _puffer_env(env_name: str, buf: dict | None = None, seed: int | None = 0):
    """PufferLib's env creator: one copy of ``env_name`` in PufferLib's PettingZoo emulation.

    Module-level (with ``env_name`` in ``env_args``) so it also pickles where workers spawn.
    """
    import pufferlib.emulation

    from bench.agents import ENVS

    return pufferlib.emulation.PettingZooPufferEnv(env_creator=ENVS[env_name].make, buf=buf, seed=seed)


class PufferAgentVecEnv(VecEnv):
    """The agents of a PufferLib ``Multiprocessing`` vecenv of PettingZoo envs as SB3 slots (see the module)."""

    def __init__(self, vecenv: Any, copies: int, seed: int = 0):
        self.vecenv = vecenv
        self.copies = int(copies)
        self.agents_per_copy = vecenv.driver_env.num_agents
        self.num_workers = vecenv.num_workers
        self.puffer_infos: list = []
        self._seed = int(seed)
        self._actions: np.ndarray | None = None
        self._closed = False
        super().__init__(vecenv.num_agents, vecenv.single_observation_space, vecenv.single_action_space)
        assert self.num_envs == vecenv.agents_per_batch == self.copies * self.agents_per_copy

    def __repr__(self) -> str:
        return (
            f"PufferAgentVecEnv(num_envs={self.num_envs}, copies={self.copies}, agents={self.agents_per_copy}, "
            f"backend=pufferlib.vector.Multiprocessing, num_workers={self.num_workers}, "
            f"batch_size={self.copies})"
        )

    def reset(self) -> VecEnvObs:
        seed = self._seeds[0] if self._seeds[0] is not None else self._seed
        # PufferLib's reset after a step hangs: its flush reads the pipe of every worker whose
        # semaphore still says INFO, but recv() has already read those infos. Between steps the
        # workers are idle, so marking them MAIN (done, no infos) is what the flush should see.
        import pufferlib.vector

        semaphores = self.vecenv.buf["semaphores"]
        semaphores[semaphores == pufferlib.vector.INFO] = pufferlib.vector.MAIN
        obs, infos = self.vecenv.reset(seed=int(seed))
        self._reset_seeds()
        self._reset_options()
        self.puffer_infos = infos
        self.reset_infos = [{} for _ in range(self.num_envs)]
        return np.array(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        actions, self._actions = self._actions, None
        obs, rewards, terminals, truncations, infos = self.vecenv.step(actions)
        self.puffer_infos = infos
        dones = terminals | truncations
        return np.array(obs), np.array(rewards), dones, [{} for _ in range(self.num_envs)]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self.vecenv.close()
        finally:
            for process in self.vecenv.processes:
                process.join(timeout=10)
                if process.is_alive():
                    process.kill()
                    process.join()
            for pipe in (*self.vecenv.send_pipes, *self.vecenv.recv_pipes):
                pipe.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        if attr_name == "render_mode":
            return [None for _ in self._indices(indices)]
        raise AttributeError(f"PufferAgentVecEnv.get_attr answers render_mode only, not {attr_name!r}")

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise NotImplementedError("PufferLib's Multiprocessing vecenv has no set_attr")

    def env_method(self, method_name: str, *args: Any, indices: VecEnvIndices = None, **kwargs: Any) -> list[Any]:
        raise NotImplementedError("PufferLib's Multiprocessing vecenv has no env_method")

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._indices(indices)]

    def _indices(self, indices: VecEnvIndices) -> Sequence[int]:
        if indices is None:
            return range(self.num_envs)
        if isinstance(indices, int):
            return [indices]
        return list(indices)


def build(env_name: str, copies: int, num_workers: int, seed: int = 0) -> PufferAgentVecEnv:
    """An SB3 ``VecEnv`` over PufferLib's ``Multiprocessing`` vecenv of ``copies`` copies of ``env_name``.

    ``num_envs`` is ``copies`` x the env's agents; ``copies`` must divide by ``num_workers``.
    """
    import pufferlib.vector

    vecenv = pufferlib.vector.make(
        _puffer_env,
        env_args=[env_name],
        backend=pufferlib.vector.Multiprocessing,
        num_envs=copies,
        num_workers=num_workers,
        batch_size=copies,
        seed=seed,
    )
    try:
        venv = PufferAgentVecEnv(vecenv, copies, seed)
    except BaseException:
        vecenv.close()
        for process in vecenv.processes:
            process.join()
        raise
    atexit.register(venv.close)  # after multiprocessing's own exit hook: runs before it joins the workers
    return venv
