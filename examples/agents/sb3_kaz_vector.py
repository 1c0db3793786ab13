"""PettingZoo's SB3 tutorial for Knights-Archers-Zombies (vector observations), over shmvec.

The tutorial (PettingZoo's ``tutorials/SB3/kaz/sb3_kaz_vector.py``) with one line changed:
``ss.concat_vec_envs_v1`` became ``shmvec.concat_vec_envs_v1``; the env, its SuperSuit wrappers
and PPO's settings are the tutorial's. Its last step, watching two games in a window, is left out
(``--watch`` brings it back); ``--timesteps`` and ``--n-steps`` shorten a run for the tests.

    python examples/agents/sb3_kaz_vector.py                  # the tutorial's 81,920 steps
    python examples/agents/sb3_kaz_vector.py --timesteps 2048 --n-steps 32

Needs ``pip install ".[sb3,agents]"`` in shmvec's checkout (see the README's install).
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import supersuit as ss
from pettingzoo.butterfly import knights_archers_zombies_v11
from stable_baselines3 import PPO
from stable_baselines3.ppo import CnnPolicy, MlpPolicy

import shmvec


def train(env_fn, steps: int = 10_000, seed: int | None = 0, n_steps: int = 2048, **env_kwargs) -> str:
    """Train one policy for every agent; returns the path of the saved model."""
    env = env_fn.parallel_env(**env_kwargs)
    # The tutorial keeps the agent count constant with black death; shmvec would handle agents that leave without it.
    env = ss.black_death_v3(env)
    visual_observation = not env.unwrapped.vector_state
    if visual_observation:  # grayscale, 84 x 84, three frames
        env = ss.color_reduction_v0(env, mode="B")
        env = ss.resize_v1(env, x_size=84, y_size=84)
        env = ss.frame_stack_v1(env, 3)
    env.reset(seed=seed)
    print(f"Starting training on {env.metadata['name']}.")

    env = ss.pettingzoo_env_to_vec_env_v1(env)
    env = shmvec.concat_vec_envs_v1(env, 8, num_cpus=1, base_class="stable_baselines3")  # the one changed line

    model = PPO(CnnPolicy if visual_observation else MlpPolicy, env, verbose=3, batch_size=256, n_steps=n_steps)
    model.learn(total_timesteps=steps)
    path = f"{env.unwrapped.metadata.get('name')}_{time.strftime('%Y%m%d-%H%M%S')}"
    model.save(path)
    print("Model has been saved.")
    print(f"Finished training on {env.unwrapped.metadata['name']}.")
    env.close()
    return path + ".zip"


def evaluate(env_fn, num_games: int = 100, render_mode: str | None = None, **env_kwargs) -> float:
    """The latest saved policy plays every agent but the first, which acts at random (AEC API);
    returns the mean total reward per agent."""
    env = env_fn.env(render_mode=render_mode, **env_kwargs)
    if not env.unwrapped.vector_state:
        env = ss.color_reduction_v0(env, mode="B")
        env = ss.resize_v1(env, x_size=84, y_size=84)
        env = ss.frame_stack_v1(env, 3)
    print(f"\nStarting evaluation on {env.metadata['name']} (num_games={num_games}, render_mode={render_mode})")
    policies = glob.glob(f"{env.metadata['name']}*.zip")
    if not policies:
        raise SystemExit("Policy not found.")
    model = PPO.load(max(policies, key=os.path.getctime))

    rewards = {agent: 0.0 for agent in env.possible_agents}
    for i in range(num_games):
        env.reset(seed=i)
        env.action_space(env.possible_agents[0]).seed(i)
        for agent in env.agent_iter():
            obs, _, termination, truncation, _ = env.last()
            for a in env.agents:
                rewards[a] += env.rewards[a]
            if termination or truncation:
                break
            if agent == env.possible_agents[0]:
                act = env.action_space(agent).sample()
            else:
                act = model.predict(obs, deterministic=True)[0]
            env.step(act)
    env.close()

    avg_reward = sum(rewards.values()) / len(rewards)
    print(f"Avg reward: {avg_reward}")
    print("Avg reward per agent, per game: ", {agent: r / num_games for agent, r in rewards.items()})
    print("Full rewards: ", rewards)
    return avg_reward


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timesteps", type=int, default=81_920, help="PPO's total_timesteps (the tutorial's)")
    parser.add_argument("--n-steps", type=int, default=2048, help="PPO's n_steps, per slot (SB3's default)")
    parser.add_argument("--eval-games", type=int, default=10)
    parser.add_argument("--watch", type=int, default=0, help="games to watch in a window after (the tutorial: 2)")
    args = parser.parse_args(argv)

    env_fn = knights_archers_zombies_v11
    env_kwargs = dict(max_cycles=100, max_zombies=4, obs_method="vector")  # "image": visual observations
    path = train(env_fn, steps=args.timesteps, seed=0, n_steps=args.n_steps, **env_kwargs)
    if args.eval_games:
        evaluate(env_fn, num_games=args.eval_games, render_mode=None, **env_kwargs)
    if args.watch:
        evaluate(env_fn, num_games=args.watch, render_mode="human", **env_kwargs)
    return path


if __name__ == "__main__":
    main()
