"""ppo_atari_envpool.py: envpool's behaviour that the script relies on (the reset step after an
episode end, game over apart from a lost life), whole games logged, a reproducible evaluation, and
the one-line errors."""

import numpy as np
import pytest
import torch

from benchmark.runs import load_script, read_metrics, run_script

m = load_script("ppo_atari_envpool.py")


def test_envpool_resets_on_the_step_after_an_episode_ends():
    """The step after terminated/truncated is envpool's reset: reward 0, no step of the game counted
    (elapsed_step unchanged), no life lost, whatever the action (so the script keeps it out of the
    update); info["terminated"] marks the game's end (the last life) apart from the episode ends of
    lost lives."""
    envs = m.make_env("ALE/Breakout-v5", 2, seed=0)
    envs.reset()
    rng, ended, lives_lost, games = np.random.default_rng(0), np.zeros(2, bool), 0, 0
    before = None
    for _ in range(1500):
        _, reward, terminated, truncated, info = envs.step(rng.integers(0, 4, 2))
        for i in np.flatnonzero(ended):  # this step was a reset step for env i
            assert reward[i] == 0 and not terminated[i] and info["elapsed_step"][i] == before[i]
            lives_lost += 1
        game_over = info["terminated"].astype(bool)
        assert (terminated[game_over]).all() and (info["lives"][game_over] == 0).all()
        games += game_over.sum()
        before = np.where(game_over, 0, info["elapsed_step"])  # a new game starts its count at 0
        ended = terminated | truncated
    assert games >= 2 and lives_lost >= 10
    envs.close()


def test_training_logs_whole_games_and_evaluation_is_reproducible(tmp_path):
    run = tmp_path / "run"
    out = run_script(
        "ppo_atari_envpool.py",
        [
            "--total-timesteps",
            "1024",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--eval-episodes",
            "1",
        ],
        run,
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    _, returns = read_metrics(run)["train/episodic_return"]
    _, lengths = read_metrics(run)["train/episodic_length"]
    assert len(returns) >= 2 and (returns >= 0).all() and (returns == np.round(returns)).all()
    assert (lengths >= 100).all(), f"an episode shorter than a game of 5 lives: {lengths}"
    torch.manual_seed(0)
    agent = m.Agent(4)
    assert m.evaluate(agent, "ALE/Breakout-v5", 2, seed=5) == m.evaluate(
        agent, "ALE/Breakout-v5", 2, seed=5
    )


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--capture-video"], ("--capture-video", "ppo_atari.py")),
        (["--env-id", "CartPole-v1"], ("Atari", "CartPole-v1")),
    ],
)
def test_bad_input_is_one_line(flags, words, tmp_path):
    out = run_script("ppo_atari_envpool.py", flags, tmp_path / "run", fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert all(w in lines[0] for w in words) and not (tmp_path / "run").exists()


def test_envpool_ids_and_sticky_actions():
    assert (
        m.envpool_id("ALE/Breakout-v5") == m.envpool_id("BreakoutNoFrameskip-v4") == "Breakout-v5"
    )
    assert m.make_env("ALE/Pong-v5", 1, 0).spec.config.repeat_action_probability == 0.25
    assert m.make_env("PongNoFrameskip-v4", 1, 0).spec.config.repeat_action_probability == 0.0
