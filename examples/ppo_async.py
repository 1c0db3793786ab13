"""PPO on CartPole with async batches: the policy runs on one batch of envs while the workers step the others.

The twin of ppo_sync.py (same hyperparameters and update), collecting EnvPool-style with
``send``/``recv``: ``python examples/ppo_async.py --num-envs 16 --batch-size 8``. Compare
it with ``python examples/ppo_sync.py --num-envs 8``: the policy then sees batches of the
same size, and while it runs on one half of the envs the workers step the other half
(Sample Factory's double buffering).

Batches mix envs in the order they finish, so every row is stored with its env id, and
the trajectory of env ``i`` is the rows with ``env_id == i`` in order (as CleanRL's EnvPool
PPO does). A row's reward and done flags are the outcome of that env's *previous* action.
The last row of each env has no outcome yet: it is trained on in the next rollout.
Prints the mean episodic return as it learns and, at the end, a line
``TIMING rollout=...s update=...s total=...s`` (``--json``: one JSON line instead).
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

FIELDS = ("env_id", "obs", "actions", "logprobs", "values", "rewards", "terminated", "ended")


def per_env_advantages(rows: dict[str, np.ndarray], num_envs: int, args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GAE along each env's own trajectory. Returns (advantages, trainable row mask, index of each env's last row)."""
    advantages = np.zeros_like(rows["values"])
    trainable = np.zeros(len(advantages), dtype=bool)
    last_rows = []
    for i in range(num_envs):
        idx = np.flatnonzero(rows["env_id"] == i)  # env i's rows, oldest first
        if not len(idx):  # not received yet (a straggler in the first rollout)
            continue
        now, nxt = idx[:-1], idx[1:]  # a transition: a row and the env's next row (its outcome)
        advantages[now] = gae(
            rows["rewards"][nxt],
            rows["values"][now],
            rows["values"][nxt],
            rows["terminated"][nxt],
            rows["ended"][nxt],
            args.gamma,
            args.gae_lambda,
        )
        trainable[now] = ~rows["ended"][now].astype(bool)  # a final observation's action only resets the env
        last_rows.append(idx[-1])
    return advantages, trainable, np.array(last_rows)


def main() -> None:
    args = parse_args(async_batches=True)
    seed_everything(args.seed)
    envs = make_vector_env(args, batch_size=args.batch_size)
    agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    episodes, timer = Episodes(args.num_envs), PhaseTimer()

    envs.async_reset(seed=args.seed)
    obs, rewards, terminations, truncations, infos = envs.recv()
    carried = None  # the last row of each env from the previous rollout
    for iteration in range(args.num_iterations):
        anneal(optimizer, iteration, args)
        store = {k: [] if carried is None else [carried[k]] for k in FIELDS}
        with timer.phase("rollout"):
            for _ in range(args.rollout_size // args.batch_size):
                env_ids, ended = infos["env_id"], terminations | truncations
                actions, logprobs, values = agent.act(obs)
                envs.send(actions)  # the workers step these envs while the policy runs on the next batch
                for key, value in zip(FIELDS, (env_ids, obs, actions, logprobs, values, rewards, terminations, ended)):
                    store[key].append(value)
                episodes.add(env_ids, rewards, ended)
                obs, rewards, terminations, truncations, infos = envs.recv()
        with timer.phase("update"):
            rows = {k: np.concatenate(v) for k, v in store.items()}
            for key in ("rewards", "terminated", "ended"):
                rows[key] = rows[key].astype(np.float32)
            rows["advantages"], trainable, last_rows = per_env_advantages(rows, args.num_envs, args)
            carried = {k: rows[k][last_rows] for k in FIELDS}
            ppo_update(agent, optimizer, {k: rows[k][trainable] for k in TRAINED}, args)
        if iteration % 10 == 9 or iteration == args.num_iterations - 1:
            episodes.report((iteration + 1) * args.rollout_size)
    finish(timer, args, envs)


if __name__ == "__main__":
    main()
