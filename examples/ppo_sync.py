"""PPO on CartPole with synchronous steps: every env steps, then the policy runs on all of them.

The twin of ppo_async.py (same hyperparameters and update): ``python examples/ppo_sync.py``
over shmvec's ShmVectorEnv (its default options), or ``--vec sync`` over Gymnasium's
SyncVectorEnv, the same loop either way. Prints the mean episodic return as it learns and,
at the end, a line ``TIMING rollout=...s update=...s total=...s`` (``--json``: one JSON
line with those seconds, the steps and the vector env's ``repr``).
"""

from __future__ import annotations

import numpy as np
import torch
from ppo_common import (
    TRAINED,
    Agent,
    Episodes,
    PhaseTimer,
    anneal,
    finish,
    gae,
    make_vector_env,
    parse_args,
    ppo_update,
    seed_everything,
)


def main() -> None:
    args = parse_args(async_batches=False)
    seed_everything(args.seed)
    envs = make_vector_env(args)  # autoreset NEXT_STEP
    agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    T, N = args.num_steps, args.num_envs
    episodes, timer = Episodes(N), PhaseTimer()
    all_envs = np.arange(N)

    obs, _ = envs.reset(seed=args.seed)
    was_final = np.zeros(N, dtype=bool)  # obs[i] ended an episode: its action only resets env i
    for iteration in range(args.num_iterations):
        anneal(optimizer, iteration, args)
        store = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "ended", "valid")}
        with timer.phase("rollout"):
            for _ in range(T):
                actions, logprobs, values = agent.act(obs)
                next_obs, rewards, terminations, truncations, _ = envs.step(actions)
                ended = terminations | truncations
                for key, value in zip(
                    store, (obs, actions, logprobs, values, rewards, terminations, ended, ~was_final)
                ):
                    store[key].append(value)
                episodes.add(all_envs, rewards, ended)
                obs, was_final = next_obs, ended
        with timer.phase("update"):
            data = {k: np.stack(v) for k, v in store.items()}  # (T, N, ...)
            next_values = np.concatenate([data["values"][1:], agent.act(obs)[2][None]])
            f32 = {k: data[k].astype(np.float32) for k in ("rewards", "terminated", "ended")}
            data["advantages"] = gae(
                f32["rewards"],
                data["values"],
                next_values,
                f32["terminated"],
                f32["ended"],
                args.gamma,
                args.gae_lambda,
            )
            valid = data.pop("valid")
            ppo_update(agent, optimizer, {k: data[k][valid] for k in TRAINED}, args)
        if iteration % 10 == 9 or iteration == args.num_iterations - 1:
            episodes.report((iteration + 1) * args.rollout_size)
    finish(timer, args, envs)


if __name__ == "__main__":
    main()
