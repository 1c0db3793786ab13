"""The training jobs of ``bench/training.py``: its workloads, and one job as its child process runs it.

Two kinds of workload:

- :class:`Sb3Workload`: an SB3 algorithm's ``learn()``. The child builds the vector env as
  SB3 users do (``[lambda: gym.make(env_id)] * N`` with ``VecMonitor`` on top; Atari as
  ``make_atari_env`` does, then ``VecFrameStack(4)``), the model with SB3's defaults but
  for the workload's hyperparameters, and times ``collect_rollouts`` (rollout), ``train``
  (update) and the whole ``learn()`` call (total). Implementations: ``dummy``
  (DummyVecEnv, the reference), ``subproc`` (SubprocVecEnv) and ``shm``
  (``ShmPoolVecEnv(env_fns)``, its default constructor); on Atari also ``envpool``
  (EnvPool's own C++ Breakout with its preprocessing, behind an SB3 adapter). Two of them run
  algorithms that call the vector env's "rare" methods on their hot path: SAC with
  ``HerReplayBuffer`` on Gymnasium-Robotics' FetchReach (``env_method("compute_reward", ...)``
  for every sampled batch) and sb3-contrib's MaskablePPO (``env_method("action_masks")`` every step).
- :class:`ScriptWorkload`: a CleanRL-style script of ``examples/`` run with ``--json``:
  ``sync`` (``ppo_sync.py --vec sync``: SyncVectorEnv, the reference), ``shm``
  (``ppo_sync.py --vec shm``: ShmVectorEnv's defaults), ``shm-async``
  (``ppo_async.py``, send/recv in batches of half the envs) and ``envpool``
  (``ppo_sync.py --vec envpool``). Another script (``ppo_continuous.py``: CleanRL's
  ``ppo_continuous_action.py`` on MuJoCo) runs ``sync`` and ``shm`` only.

``envpool`` is optional: without it installed those runs are skipped.

Either way the child prints one JSON line: ``rollout``, ``update``, ``total`` (seconds),
``steps`` and ``vec_env`` (the vector env's ``repr`` at the end of the run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
TRAINING = os.path.join(REPO, "bench", "training.py")


def scaled(timesteps: int, scale: float, at_least: int = 1) -> int:
    return max(at_least, round(timesteps * scale))


def impl_missing(impl: str) -> str | None:
    """Why ``impl`` cannot run here, or None."""
    if impl == "envpool" and importlib.util.find_spec("envpool") is None:
        return "envpool is not installed"
    return None


@dataclass(frozen=True)
class Sb3Workload:
    """SB3 ``algo`` with ``policy`` on ``n_envs`` copies of ``env_id`` for ``timesteps`` steps."""

    name: str
    algo: str
    env_id: str
    n_envs: int
    timesteps: int
    hyper: dict[str, Any] = field(default_factory=dict)
    policy: str = "MlpPolicy"
    requires: tuple[str, ...] = ()  # modules it needs
    atari: bool = False
    package: str = "stable_baselines3"  # where ``algo`` lives (sb3_contrib: MaskablePPO)
    maker: str = ""  # a function of this module that builds one env: maker(env_id, **env_kwargs) (default gym.make)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    her: bool = False  # HerReplayBuffer (future goals, 4 per transition)
    reference: ClassVar[str] = "dummy"

    @property
    def impls(self) -> tuple[str, ...]:
        return ("dummy", "subproc", "shm", "envpool") if self.atari else ("dummy", "subproc", "shm")

    def missing(self) -> str | None:
        """Why this workload cannot run here, or None."""
        absent = [module for module in self.requires if importlib.util.find_spec(module) is None]
        return f"{self.name}: needs {', '.join(absent)}, not installed" if absent else None

    def describe(self) -> str:
        hyper = ", ".join(f"{k}={v}" for k, v in self.hyper.items())
        frames = ", AtariWrapper + VecFrameStack(4)" if self.atari else ""
        algo = f"{self.algo} + HerReplayBuffer" if self.her else self.algo
        library = "sb3-contrib" if self.package == "sb3_contrib" else "SB3"
        env = (
            f"{self.env_id}({', '.join(f'{k}={v}' for k, v in self.env_kwargs.items())})"
            if self.env_kwargs
            else self.env_id
        )
        return f"{library} {algo} {self.policy}, {env}{frames}, N={self.n_envs}, {self.timesteps:,} steps" + (
            f", {hyper}" if hyper else ""
        )

    def command(self, impl: str, scale: float, device: str) -> list[str]:
        """The child process's argv: this file's job run by ``bench/training.py``."""
        return [
            sys.executable,
            TRAINING,
            "--child",
            self.name,
            "--impls",
            impl,
            "--scale",
            str(scale),
            "--device",
            device,
        ]


@dataclass(frozen=True)
class ScriptWorkload:
    """``examples/<script>`` on ``n_envs`` copies of ``env_id`` (``ppo_sync.py``'s twin ``ppo_async.py`` for
    ``shm-async``)."""

    name: str
    env_id: str
    n_envs: int
    timesteps: int
    num_steps: int = 128
    script: str = "ppo_sync.py"  # its --vec sync|shm; ppo_sync.py also envpool
    requires: tuple[str, ...] = ()  # modules it needs
    reference: ClassVar[str] = "sync"

    @property
    def impls(self) -> tuple[str, ...]:
        """ppo_sync.py has an async twin and an EnvPool mode; the other scripts have neither."""
        return ("sync", "shm", "shm-async", "envpool") if self.script == "ppo_sync.py" else ("sync", "shm")

    missing = Sb3Workload.missing  # the same check of `requires`

    def describe(self) -> str:
        script = "" if self.script == "ppo_sync.py" else f" examples/{self.script}"
        head = f"CleanRL-style PPO script{script}, {self.env_id}, {self.n_envs} envs, {self.timesteps:,} steps"
        return f"{head}, num-steps {self.num_steps}" + (
            f"; shm-async: {2 * self.n_envs} envs in batches of {self.n_envs} (the same batch per policy call "
            "and steps per rollout; Sample Factory's double buffering)"
            if "shm-async" in self.impls
            else ""
        )

    def command(self, impl: str, scale: float, device: str) -> list[str]:
        """``device`` is not used: the scripts run their policy on the CPU."""
        steps = scaled(self.timesteps, scale, at_least=self.n_envs * self.num_steps)  # one rollout at least
        # shm-async: twice the envs in batches of n_envs, so that the policy sees the sync twin's batch
        # and a rollout has as many steps
        n_envs, num_steps = (
            (2 * self.n_envs, self.num_steps // 2) if impl == "shm-async" else (self.n_envs, self.num_steps)
        )
        common = [
            "--env-id",
            self.env_id,
            "--num-envs",
            str(n_envs),
            "--total-timesteps",
            str(steps),
            "--num-steps",
            str(num_steps),
            "--seed",
            "1",
            "--json",
        ]
        if impl not in self.impls:
            raise ValueError(f"{self.name} has no implementation {impl!r} (choose from {self.impls})")
        if impl == "shm-async":
            return [sys.executable, os.path.join(EXAMPLES, "ppo_async.py"), *common, "--batch-size", str(self.n_envs)]
        return [sys.executable, os.path.join(EXAMPLES, self.script), *common, "--vec", impl]


WORKLOADS: dict[str, Sb3Workload | ScriptWorkload] = {
    w.name: w
    for w in [
        Sb3Workload("ppo-cartpole", "PPO", "CartPole-v1", 16, 30_000, {"n_steps": 128}),
        Sb3Workload("a2c-cartpole", "A2C", "CartPole-v1", 16, 30_000),
        Sb3Workload(
            "ppo-halfcheetah",
            "PPO",
            "HalfCheetah-v5",
            8,
            16_384,
            {"n_steps": 256, "batch_size": 64},
            requires=("mujoco",),
        ),
        Sb3Workload("ppo-humanoid", "PPO", "Humanoid-v5", 8, 8_192, {"n_steps": 256}, requires=("mujoco",)),
        Sb3Workload(
            "ppo-atari",
            "PPO",
            "BreakoutNoFrameskip-v4",
            8,
            4_096,
            {"n_steps": 128, "batch_size": 256, "n_epochs": 4},
            policy="CnnPolicy",
            requires=("ale_py", "cv2"),
            atari=True,
        ),  # cv2 (opencv-python): AtariWrapper's 84x84 resize
        Sb3Workload(
            "sac-mujoco",
            "SAC",
            "HalfCheetah-v5",
            4,
            4_000,
            {"learning_starts": 1000, "train_freq": 1, "gradient_steps": 1},
            requires=("mujoco",),
        ),
        # Algorithms that make a vector env's rare calls on their hot path: HER's env_method("compute_reward",
        # ..., indices=[0]) for every sampled batch (one per gradient step), MaskablePPO's
        # env_method("action_masks") before every step.
        Sb3Workload(
            "her-fetchreach",
            "SAC",
            "FetchReach-v4",
            4,
            8_000,
            {"learning_starts": 400, "buffer_size": 100_000},
            policy="MultiInputPolicy",
            requires=("mujoco", "gymnasium_robotics"),
            maker="make_robotics",
            her=True,
        ),
        Sb3Workload(
            "maskable-ppo",
            "MaskablePPO",
            "InvalidActionEnvDiscrete",
            8,
            40_000,
            {"n_steps": 128},
            requires=("sb3_contrib",),
            package="sb3_contrib",
            maker="make_sb3_contrib",
            env_kwargs={"dim": 80, "n_invalid_actions": 60},  # as in sb3-contrib's own tests of MaskablePPO
        ),
        ScriptWorkload("cleanrl-cartpole", "CartPole-v1", 8, 40_960),
        ScriptWorkload("cleanrl-acrobot", "Acrobot-v1", 8, 40_960),
        # CleanRL's ppo_continuous_action.py: 12 rollouts of 8 x 256 steps, each trained 10 epochs x 32 minibatches
        ScriptWorkload("cleanrl-halfcheetah", "HalfCheetah-v5", 8, 24_576, 256, "ppo_continuous.py", ("mujoco",)),
    ]
}
IMPLS = tuple(dict.fromkeys(i for w in WORKLOADS.values() for i in w.impls))


# -- in the child process ------------------------------------------------------------------


def make_atari(env_id: str):
    """An Atari env as SB3's ``make_atari_env`` builds it: Monitor, then AtariWrapper (84x84 grey, frame skip 4)."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import AtariWrapper
    from stable_baselines3.common.monitor import Monitor

    gym.register_envs(ale_py)  # in every process that builds one: Gymnasium 1.x does not register ALE's envs
    return AtariWrapper(Monitor(gym.make(env_id)))


def make_robotics(env_id: str):
    """A Gymnasium-Robotics env (FetchReach): its module registers its envs when imported, in every process."""
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return gym.make(env_id)


def make_sb3_contrib(env_id: str, **kwargs):
    """One of sb3-contrib's test envs (``InvalidActionEnvDiscrete``: MaskablePPO asks for its
    ``action_masks()`` every step), built with ``kwargs``."""
    from sb3_contrib.common import envs

    return getattr(envs, env_id)(**kwargs)


def build_vec_env(workload: Sb3Workload, impl: str):
    """``impl``'s vector env over the workload's envs, wrapped as SB3 users wrap it."""
    import functools

    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack, VecMonitor

    import shmvec

    if workload.atari:
        env_fns = [functools.partial(make_atari, workload.env_id)] * workload.n_envs
    elif workload.maker:
        env_fns = [
            functools.partial(globals()[workload.maker], workload.env_id, **workload.env_kwargs)
        ] * workload.n_envs
    else:
        env_id = workload.env_id
        env_fns = [lambda: gym.make(env_id)] * workload.n_envs
    if impl == "envpool":
        return VecMonitor(envpool_atari(workload))
    if impl == "dummy":
        venv = DummyVecEnv(env_fns)
    elif impl == "subproc":
        venv = SubprocVecEnv(env_fns, start_method="fork")  # the start method changes start-up, not the steps
    elif impl.partition(":")[0] == "shm":
        venv = shmvec.ShmPoolVecEnv(env_fns, **shm_kwargs(impl))
    else:
        raise ValueError(f"{workload.name} has no implementation {impl!r} (choose from {workload.impls})")
    return VecFrameStack(venv, n_stack=4) if workload.atari else VecMonitor(venv)


def shm_kwargs(impl: str) -> dict[str, Any]:
    """``shm`` -> {} (the default); ``shm:n_workers=4,main_shard=True`` -> ShmPoolVecEnv's keyword arguments."""
    kwargs: dict[str, Any] = {}
    for item in filter(None, impl.partition(":")[2].split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = {"True": True, "False": False}.get(value, int(value) if value.isdigit() else value)
    return kwargs


def envpool_atari(workload: Sb3Workload):
    """EnvPool's Breakout as an SB3 VecEnv: its own 84x84 grey, frame skip 4 and 4-frame stack,
    with AtariWrapper's life loss and reward clipping, reset in the step that ends an episode."""
    import envpool
    import numpy as np
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class EnvPoolVecEnv(VecEnvWrapper):
        def reset(self):
            return self.venv.reset()[0]

        def seed(self, seed=None):
            return [None] * self.num_envs  # EnvPool takes its seed when it is made

        def step_async(self, actions):
            self.actions = actions

        def step_wait(self):
            obs, rewards, terminated, truncated, _ = self.venv.step(self.actions)
            dones = terminated | truncated
            infos = [{} for _ in range(self.num_envs)]
            if dones.any():
                obs = np.array(obs)  # SB3 expects the reset observation in place of the final one
                for i in np.flatnonzero(dones):
                    infos[i] = {
                        "terminal_observation": obs[i].copy(),
                        "TimeLimit.truncated": bool(truncated[i] and not terminated[i]),
                    }
                    obs[i] = self.venv.reset(np.array([i]))[0][0]
            return obs, rewards.astype(np.float32), dones, infos

    return EnvPoolVecEnv(
        envpool.make_gymnasium("Breakout-v5", num_envs=workload.n_envs, seed=0, episodic_life=True, reward_clip=True)
    )


def describe(venv: Any) -> str:
    """``repr(venv)``, or its class's name where that is object's ``<... at 0x...>``."""
    text = repr(venv)
    return type(venv).__name__ if text.startswith("<") else text


def make_model(workload: Sb3Workload, venv: Any, **kwargs: Any) -> Any:
    """The workload's algorithm over ``venv``, seed 0: SB3's defaults but for its hyperparameters."""
    hyper = dict(workload.hyper)
    if workload.her:
        from stable_baselines3 import HerReplayBuffer

        hyper["replay_buffer_class"] = HerReplayBuffer
        hyper["replay_buffer_kwargs"] = {"n_sampled_goal": 4, "goal_selection_strategy": "future"}
    algo = getattr(importlib.import_module(workload.package), workload.algo)
    return algo(workload.policy, venv, seed=0, verbose=0, **hyper, **kwargs)


def run_sb3(workload: Sb3Workload, impl: str, scale: float, device: str) -> dict[str, Any]:
    """Train once; the phases' seconds, the steps taken and the vector env's ``repr``."""
    import torch

    from shmvec.tools.demo import timed_learn

    start = time.perf_counter()
    venv = build_vec_env(workload, impl)
    try:
        model = make_model(workload, venv, device=device)
        setup = time.perf_counter() - start
        seconds = timed_learn(model, scaled(workload.timesteps, scale))
        described = describe(venv.unwrapped)  # before close: the configuration that ran the steps
    finally:
        venv.close()
    return {
        **seconds,
        "setup": setup,
        "steps": model.num_timesteps,
        "vec_env": described,
        "torch_threads": torch.get_num_threads(),
        "device": str(model.device),
    }


def child_main(name: str, impl: str, scale: float, device: str) -> int:
    print(json.dumps(run_sb3(WORKLOADS[name], impl, scale, device)), flush=True)
    return 0
