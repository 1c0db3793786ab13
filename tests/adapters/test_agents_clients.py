"""Real clients of the agent slots: PettingZoo's SB3 tutorials (KAZ with vector observations,
Pistonball) with ``shmvec.concat_vec_envs_v1`` in place of SuperSuit's, and a CleanRL-style PPO
loop on MPE2's ``simple_spread_v3`` (examples/agents/), each run to the end at a tiny size; the
PPO loop also beats a random policy after a short training."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("supersuit")
pytest.importorskip("stable_baselines3")
torch = pytest.importorskip("torch")

import shmvec  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def load_example(name: str):
    """The example script ``examples/agents/<name>.py`` as a module (its ``main`` takes its command line)."""
    spec = importlib.util.spec_from_file_location(f"agents_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tutorial_env(monkeypatch, tmp_path, closing):
    """Run a tutorial in ``tmp_path`` (it saves its model in the working directory); every vector env it
    builds through ``shmvec.concat_vec_envs_v1`` is closed at teardown even if the run fails midway
    (the tutorials close theirs only at the end); yields those envs."""
    monkeypatch.chdir(tmp_path)
    built = []
    real = shmvec.concat_vec_envs_v1

    def concat_vec_envs_v1(*args, **kwargs):
        built.append(closing(real(*args, **kwargs)))
        return built[-1]

    monkeypatch.setattr(shmvec, "concat_vec_envs_v1", concat_vec_envs_v1)
    return built


def test_the_kaz_tutorial_trains_over_shmvec_saves_and_evaluates(tutorial_env, tmp_path, capsys):
    from stable_baselines3 import PPO

    kaz = load_example("sb3_kaz_vector")
    saved = kaz.main(["--timesteps", "256", "--n-steps", "8", "--eval-games", "1"])
    (env,) = tutorial_env
    assert isinstance(env, shmvec.ShmAgentVecEnv) and env.closed
    assert (env.num_copies, env.num_agents, env.n_workers) == (8, 4, 1)  # the tutorial's 8 copies, num_cpus=1
    model = PPO.load(tmp_path / saved)
    assert model.num_timesteps == 256 and model.observation_space.shape == (21, 5)  # KAZ's vector observation
    assert "Avg reward per agent, per game" in capsys.readouterr().out  # the evaluation ran to its end


@pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")
def test_the_pistonball_tutorial_trains_over_shmvec_and_saves(tutorial_env, tmp_path):
    pytest.importorskip("pymunk")
    from stable_baselines3 import PPO

    pistonball = load_example("sb3_pistonball_vector")
    saved = pistonball.main(["--timesteps", "80", "--n-steps", "1", "--eval-games", "0"])
    (env,) = tutorial_env
    assert env.closed and (env.num_copies, env.num_agents, env.n_workers) == (4, 20, 2)
    model = PPO.load(tmp_path / saved)
    assert model.num_timesteps == 80
    assert model.observation_space.shape == (3, 84, 84)  # grayscale 84 x 84, 3 frames, transposed for the CNN


def test_the_cleanrl_loop_runs_and_saves_its_policy(tmp_path):
    spread = load_example("cleanrl_simple_spread")
    saved = tmp_path / "policy.pt"
    args = ["--timesteps", "384", "--num-copies", "2", "--num-workers", "1", "--num-steps", "32"]
    result = spread.main([*args, "--eval-episodes", "2", "--save", str(saved)])
    # 2 copies x 3 agents = 6 slots; 2 rollouts of 32 steps: each slot ends its 25-step episode twice
    assert len(result["train_returns"]) == 12 and all(r < 0 for r in result["train_returns"])
    policy = spread.Agent(18, 5)
    policy.load_state_dict(torch.load(saved))
    obs = torch.zeros(1, 18)
    assert torch.equal(policy.actor(obs), result["agent"].actor(obs))
    assert np.isfinite([result["trained"], result["random"]]).all()


def test_the_cleanrl_loop_bootstraps_only_from_a_final_observation():
    """A restarted copy's slots are done and truncated without a terminal_observation: no bootstrap."""
    spread = load_example("cleanrl_simple_spread")
    next_obs, final = np.zeros((4, 2), np.float32), np.ones(2, np.float32)
    infos = [
        {},
        {"terminal_observation": final, "TimeLimit.truncated": True},
        {"terminal_observation": final},
        {"shmvec_restarted": True, "TimeLimit.truncated": True},
    ]
    after, truncated = spread.values_from(next_obs, np.array([False, True, True, True]), infos)
    assert after.tolist() == [[0, 0], [1, 1], [1, 1], [0, 0]]
    assert truncated.tolist() == [False, True, False, False]


def test_the_cleanrl_loop_learns_to_beat_a_random_policy(tmp_path):
    """40,000 agent steps (~12 s here): greedy returns -22 to -23 per agent over seeds 1-3, a random
    policy's -27.4 and doing nothing's -24.1, over the same 32 seeded episodes."""
    spread = load_example("cleanrl_simple_spread")
    result = spread.main(["--timesteps", "40000", "--seed", "1", "--save", ""])
    assert result["trained"] > result["random"] + 2.0, result


def test_pettingzoos_cleanrl_tutorial_trains_the_same_agent_over_shmvec_as_over_supersuit(monkeypatch, tmp_path):
    """PettingZoo's CleanRL tutorial (``base_class="gymnasium"``, cooperative pong): one update over
    shmvec's ``concat_vec_envs_v1`` and over SuperSuit's, both seeded as the tutorial seeds; the same
    observations, rewards and flags give the same trained weights, bit for bit."""
    pytest.importorskip("pygame")
    import supersuit

    tutorial = load_example("cleanrl_advanced_pong")
    args = ["--num-steps", "8", "--num-envs", "4", "--total-timesteps", "32", "--cuda", "false"]
    args += ["--runs-dir", str(tmp_path)]
    built = []
    real = shmvec.concat_vec_envs_v1

    def recorded(concat):
        def concat_vec_envs_v1(*a, **k):
            built.append(concat(*a, **k))
            return built[-1]

        return concat_vec_envs_v1

    try:
        monkeypatch.setattr(shmvec, "concat_vec_envs_v1", recorded(real))
        ours = tutorial.main(args)
        monkeypatch.setattr(shmvec, "concat_vec_envs_v1", recorded(supersuit.concat_vec_envs_v1))
        theirs = tutorial.main(args)
    finally:
        for envs in built:
            envs.close()
    assert isinstance(built[0], shmvec.ShmAgentConcatVecEnv) and built[0].num_envs == 4 and built[0].closed
    assert type(built[1]).__name__ == "ConcatVecEnv"
    for (name, ours_param), theirs_param in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert torch.equal(ours_param, theirs_param), name
    initial = tutorial.Agent(built[0]).state_dict()  # not the same network: the update changed the weights
    assert not torch.equal(initial["actor.weight"], ours.state_dict()["actor.weight"])
