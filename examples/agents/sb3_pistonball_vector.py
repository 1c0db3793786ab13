"""PettingZoo's SB3 tutorial for Pistonball, over shmvec.

The tutorial (PettingZoo's ``tutorials/SB3/pistonball/sb3_pistonball_vector.py``) with one line
changed: ``ss.concat_vec_envs_v1`` became ``shmvec.concat_vec_envs_v1``; the env, its SuperSuit
wrappers and PPO's settings are the tutorial's. Its last step, watching two games in
a window, is left out (``--watch`` brings it back); ``--timesteps`` and ``--n-steps`` shorten a
run for the tests.

    python examples/agents/sb3_pistonball_vector.py                  # the tutorial's 40,960 steps
    python examples/agents/sb3_pistonball_vector.py --timesteps 640 --n-steps 8

Needs ``pip install ".[sb3,agents]"`` in shmvec's checkout (see the README's install; the
``[agents]`` extra brings Pistonball's pymunk).
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import supersuit as ss
from pettingzoo.butterfly import pistonball_v6
from stable_baselines3 import PPO
from stable_baselines3.ppo import CnnPolicy

import shmvec


def preprocess(env):
    """Grayscale, 84 x 84, three frames stacked."""
    env = ss.color_reduction_v0(env, mode="B")
    env = ss.resize_v1(env, x_size=84, y_size=84)
    return ss.frame_stack_v1(env, 3)


def train(env_fn, steps: int = 10_000, seed: int | None = 0, n_steps: int = 256, **env_kwargs) -> str:
    """Train one policy for every piston; returns the path of the saved model."""
    env = preprocess(env_fn.parallel_env(**env_kwargs))
    env.reset(seed=seed)
    print(f"Starting training on {env.metadata['name']}.")

    env = ss.pettingzoo_env_to_vec_env_v1(env)
    env = shmvec.concat_vec_envs_v1(env, 4, num_cpus=2, base_class="stable_baselines3")  # the one changed line

    model = PPO(
        CnnPolicy,
        env,
        verbose=3,
        gamma=0.95,
        n_steps=n_steps,
        ent_coef=0.0905168,
        learning_rate=0.00062211,
        vf_coef=0.042202,
        max_grad_norm=0.9,
        gae_lambda=0.99,
        n_epochs=5,
        clip_range=0.3,
        batch_size=256,
    )
    model.learn(total_timesteps=steps)
    path = f"{env.unwrapped.metadata.get('name')}_{time.strftime('%Y%m%d-%H%M%S')}"
    model.save(path)
    print("Model has been saved.")
    print(f"Finished training on {env.unwrapped.metadata['name']}.")
    env.close()
    return path + ".zip"


def evaluate(env_fn, num_games: int = 100, render_mode: str | None = None, **env_kwargs) -> float:
    """The latest saved policy plays every piston (AEC API); returns the mean total reward per piston."""
    env = preprocess(env_fn.env(render_mode=render_mode, **env_kwargs))
    print(f"\nStarting evaluation on {env.metadata['name']} (num_games={num_games}, render_mode={render_mode})")
    policies = glob.glob(f"{env.metadata['name']}*.zip")
    if not policies:
        raise SystemExit("Policy not found.")
    model = PPO.load(max(policies, key=os.path.getctime))

    rewards = {agent: 0.0 for agent in env.possible_agents}
    for i in range(num_games):
        env.reset(seed=i)
        for _agent in env.agent_iter():
            obs, _, termination, truncation, _ = env.last()
            if termination or truncation:
                for a in env.agents:
                    rewards[a] += env.rewards[a]
                break
            env.step(model.predict(obs, deterministic=True)[0])
    env.close()

    avg_reward = sum(rewards.values()) / len(rewards)
    print(f"Avg reward: {avg_reward}")
    return avg_reward


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timesteps", type=int, default=40_960, help="PPO's total_timesteps (the tutorial's)")
    parser.add_argument("--n-steps", type=int, default=256, help="PPO's n_steps, per slot (the tutorial's)")
    parser.add_argument("--eval-games", type=int, default=10)
    parser.add_argument("--watch", type=int, default=0, help="games to watch in a window after (the tutorial: 2)")
    args = parser.parse_args(argv)

    env_fn = pistonball_v6
    env_kwargs = dict(
        n_pistons=20,
        time_penalty=-0.1,
        continuous=True,
        random_drop=True,
        random_rotate=True,
        ball_mass=0.75,
        ball_friction=0.3,
        ball_elasticity=1.5,
        max_cycles=25,
    )
    path = train(env_fn, steps=args.timesteps, seed=0, n_steps=args.n_steps, **env_kwargs)
    if args.eval_games:
        evaluate(env_fn, num_games=args.eval_games, render_mode=None, **env_kwargs)
    if args.watch:
        evaluate(env_fn, num_games=args.watch, render_mode="human", **env_kwargs)
    return path


if __name__ == "__main__":
    main()
