"""A short CleanRL-style PPO loop on ShmVectorEnv (with Gymnasium's vector wrappers).

The same loop runs on SyncVectorEnv with the same seeds; since the envs return the same
data bit for bit and torch is deterministic on CPU, training must end with identical
weights and identical episode statistics.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from shmvec import ShmVectorEnv

torch = pytest.importorskip("torch")
nn = torch.nn

NUM_ENVS, NUM_STEPS, ITERATIONS = 8, 64, 6  # 3072 env steps
UPDATE_EPOCHS, MINIBATCHES = 3, 4
GAMMA, GAE_LAMBDA, CLIP, ENT_COEF, VF_COEF = 0.99, 0.95, 0.2, 0.01, 0.5


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, 1))
        self.actor = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, n_actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        dist = torch.distributions.Categorical(logits=self.actor(x))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def ppo(envs: gym.vector.VectorEnv, seed: int = 1) -> dict:
    """CleanRL's ppo.py loop, shortened; returns what the test checks."""
    torch.manual_seed(seed)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    obs_dim = envs.single_observation_space.shape[0]
    agent = Agent(obs_dim, envs.single_action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-3, eps=1e-5)

    obs_buf = torch.zeros((NUM_STEPS, NUM_ENVS, obs_dim))
    actions_buf = torch.zeros((NUM_STEPS, NUM_ENVS), dtype=torch.long)
    logprobs, rewards, dones, values = (torch.zeros((NUM_STEPS, NUM_ENVS)) for _ in range(4))

    next_obs, _ = envs.reset(seed=seed)
    next_obs, next_done = torch.as_tensor(next_obs), torch.zeros(NUM_ENVS)
    running = np.zeros(NUM_ENVS)  # our own episode returns, to check the wrapper's
    ours, recorded, losses = [], [], []
    for _ in range(ITERATIONS):
        for step in range(NUM_STEPS):
            obs_buf[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions_buf[step], logprobs[step] = value.flatten(), action, logprob
            obs, reward, terminations, truncations, infos = envs.step(action.numpy())
            assert obs.shape == (NUM_ENVS, obs_dim) and obs.dtype == np.float32
            assert reward.shape == (NUM_ENVS,) and reward.dtype == np.float64
            assert terminations.dtype == truncations.dtype == np.bool_
            done = terminations | truncations
            running += reward
            ours.extend(running[done].tolist())
            running[done] = 0.0
            if "episode" in infos:
                np.testing.assert_array_equal(infos["_episode"], done)  # stats exactly when episodes end
                recorded.extend(infos["episode"]["r"][infos["_episode"]].tolist())
            else:
                assert not done.any()
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
            next_obs, next_done = torch.as_tensor(obs), torch.as_tensor(done, dtype=torch.float32)

        with torch.no_grad():  # GAE
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages, lastgaelam = torch.zeros_like(rewards), 0
            for t in reversed(range(NUM_STEPS)):
                nonterminal = 1.0 - (next_done if t == NUM_STEPS - 1 else dones[t + 1])
                nextvalues = next_value if t == NUM_STEPS - 1 else values[t + 1]
                delta = rewards[t] + GAMMA * nextvalues * nonterminal - values[t]
                advantages[t] = lastgaelam = delta + GAMMA * GAE_LAMBDA * nonterminal * lastgaelam
            returns = advantages + values

        b_obs, b_actions = obs_buf.reshape(-1, obs_dim), actions_buf.reshape(-1)
        b_logprobs, b_adv, b_returns = logprobs.reshape(-1), advantages.reshape(-1), returns.reshape(-1)
        batch = NUM_ENVS * NUM_STEPS
        order = np.arange(batch)
        rng = np.random.default_rng(seed)
        for _ in range(UPDATE_EPOCHS):
            rng.shuffle(order)
            for start in range(0, batch, batch // MINIBATCHES):
                mb = order[start : start + batch // MINIBATCHES]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ENT_COEF * entropy.mean() + VF_COEF * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
                losses.append(loss.item())
    return {
        "ours": ours,
        "recorded": recorded,
        "losses": losses,
        "weights": [p.detach().clone() for p in agent.parameters()],
        "return_queue": list(envs.return_queue),
    }


def test_cleanrl_ppo_loop_matches_sync(closing):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic and polite on a shared 2-core machine
    try:
        fn = lambda: gym.make("CartPole-v1")
        shm = closing(ShmVectorEnv([fn] * NUM_ENVS, n_workers=2, start_method="fork"))
        ref = closing(gym.vector.SyncVectorEnv([fn] * NUM_ENVS))
        got, want = ppo(shm), ppo(ref)
    finally:
        torch.set_num_threads(threads)
    assert len(got["recorded"]) > 50  # ~3000 steps of CartPole: many episodes
    assert got["recorded"] == got["ours"]  # the wrapper's returns are the rewards we saw
    assert all(np.isfinite(got["losses"]))
    assert got["recorded"] == want["recorded"]
    assert got["return_queue"] == want["return_queue"]
    assert got["losses"] == want["losses"]
    for a, b in zip(got["weights"], want["weights"]):
        assert torch.equal(a, b)
