"""gail.py: its reward and discriminator loss against brute force, the demonstrations it reads, runs
on CartPole-v1 and Pendulum-v1 from one expert episode made by benchmark/datasets.py (metrics, a
saved model that evaluates again to the same returns), and bad input (one line, nothing written)."""

import math

import numpy as np
import pytest
import torch

from benchmark import datasets
from benchmark.runs import ALGOS, load_script, read_metrics, run_script

CARTPOLE_EXPERT = ALGOS.parent / "benchmark" / "policies" / "dqn-CartPole-v1-100k" / "model.pt"
PENDULUM_EXPERT = (
    ALGOS.parent / "benchmark" / "policies" / "sac_continuous-Pendulum-v1-12k" / "model.pt"
)
# 4 updates of 4 envs x 32 steps (Pendulum-v1: 2 envs x 128 steps, so that its 200-step episodes
# end), 2 evaluation episodes
TINY = {
    "CartPole-v1": ["--total-timesteps", "512", "--num-envs", "4", "--num-steps", "32"],
    "Pendulum-v1": ["--total-timesteps", "1024", "--num-envs", "2", "--num-steps", "128"],
}
SMALL = [
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--eval-episodes",
    "2",
]


@pytest.fixture(scope="module")
def gail():
    return load_script("gail.py")


@pytest.fixture(scope="module")
def experts(tmp_path_factory):
    """One expert episode of each env (--steps 1: a whole episode), as benchmark/datasets.py
    writes it; the expert's return given as a number (no 100 scoring episodes)."""
    root = tmp_path_factory.mktemp("datasets")
    return {
        "CartPole-v1": datasets.make_dataset(
            "expert", policy=CARTPOLE_EXPERT, expert="500", steps=1, root=root
        ),
        "Pendulum-v1": datasets.make_dataset(
            "expert", policy=PENDULUM_EXPERT, expert="-150", steps=1, root=root
        ),
    }


def test_the_reward_is_minus_log_one_minus_d_and_grows_as_a_pair_looks_expert(gail):
    logits = torch.tensor([-30.0, -5.0, -1.0, 0.0, 0.5, 2.0, 8.0], dtype=torch.float64)
    rewards = gail.gail_reward(logits)
    for x, r in zip(logits.tolist(), rewards.tolist()):
        d = 1 / (1 + math.exp(-x))  # D(s, a): the probability that the pair is the expert's
        assert r == pytest.approx(-math.log(1 - d), rel=1e-9, abs=1e-12)
    assert (rewards > 0).all() and (rewards.diff() > 0).all()
    assert gail.gail_reward(torch.tensor([100.0])).item() == pytest.approx(100.0)  # no overflow


def test_the_discriminator_loss_is_the_binary_cross_entropy_of_both_kinds_of_pair(gail):
    expert = torch.tensor([2.0, -0.5, 0.1], dtype=torch.float64)
    policy = torch.tensor([-3.0, 1.5, 0.0], dtype=torch.float64)
    sigmoid = [1 / (1 + math.exp(-x)) for x in expert.tolist() + policy.tolist()]
    terms = [-math.log(p) for p in sigmoid[:3]] + [-math.log(1 - p) for p in sigmoid[3:]]
    assert gail.discriminator_loss(expert, policy).item() == pytest.approx(sum(terms) / 6)
    # lower when expert pairs score high and the policy's low
    assert gail.discriminator_loss(expert.abs(), -policy.abs()) < gail.discriminator_loss(
        -expert.abs(), policy.abs()
    )


def test_the_discriminator_learns_to_tell_the_pairs_apart(gail):
    torch.manual_seed(0)
    expert_obs = torch.randn(256, 3)
    expert_actions = (expert_obs[:, 0] > 0).long()  # the expert's rule
    obs = torch.randn(256, 3)
    actions = 1 - (obs[:, 0] > 0).long()  # the policy does the opposite
    disc = gail.Discriminator(3, 2, False, np.zeros(3), np.ones(3))
    optimizer = torch.optim.Adam(disc.parameters(), lr=3e-3)
    stats = gail.train_discriminator(
        disc, optimizer, obs, actions, expert_obs, expert_actions, 100, 64
    )
    assert stats["charts/discriminator_expert_accuracy"] > 0.9
    assert stats["charts/discriminator_policy_accuracy"] > 0.9
    with torch.no_grad():  # more reward for the expert's pairs
        assert (
            gail.gail_reward(disc(expert_obs, expert_actions)).mean()
            > 5 * gail.gail_reward(disc(obs, actions)).mean()
        )


def test_box_actions_are_clipped_to_the_bounds_and_scaled_for_the_discriminator(gail):
    disc = gail.Discriminator(1, 1, True, np.zeros(1), np.ones(1), -2.0, 2.0)
    seen = []
    disc.network.register_forward_hook(lambda module, inputs, out: seen.append(inputs[0]))
    disc(torch.zeros(4, 1), torch.tensor([[-5.0], [-2.0], [1.0], [3.0]]))
    assert seen[0][:, 1].tolist() == [-1.0, -1.0, 0.5, 1.0]


def test_the_greedy_action_is_the_most_probable_or_the_mean(gail):
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    discrete = gail.Agent(3, 4, False)
    assert torch.equal(
        discrete.get_action_and_value(x, greedy=True)[0], discrete.actor(x).argmax(-1)
    )
    continuous = gail.Agent(3, 2, True)
    action, logprob, _, _ = continuous.get_action_and_value(x, greedy=True)
    assert torch.equal(action, continuous.actor(x)) and logprob.shape == (5,)


def test_the_reward_scale_is_the_running_std_of_the_discounted_return(gail):
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    dones = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    rms = gail.RunningMeanStd(shape=())
    running = np.zeros(2)
    scaled = gail.normalize_rewards(rewards, dones, running, rms, 0.5)
    # discounted returns so far, 0.5 per step; env 1's restarts after its episode ends at step 0
    returns = [[1.0, 2.0], [3.5, 4.0], [6.75, 8.0]]
    seen = []
    for t in range(3):
        seen += returns[t]
        std = np.std(seen)  # the running statistics' prior (1e-4 of a count) aside
        assert scaled[t].tolist() == pytest.approx((rewards[t] / std).tolist(), rel=1e-3)
    assert running.tolist() == returns[-1]


def test_demo_episodes_takes_the_first_episodes_only(gail, tmp_path):
    path = datasets.make_dataset("random", "CartPole-v1", expert="500", steps=60, root=tmp_path)
    dataset = gail.open_dataset(str(path))
    lengths = [len(ep.rewards) for ep in dataset.iterate_episodes()]
    assert len(lengths) > 2
    first = gail.demonstrations(dataset, 2)
    assert len(first["obs"]) == sum(lengths[:2]) and first["actions"].dtype == np.int64
    assert len(gail.demonstrations(dataset, None)["obs"]) == sum(lengths)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_run_from_one_expert_episode_saves_a_model_that_evaluates_the_same(
    env_id, experts, gail, tmp_path
):
    """The run dir holds the run (the env's return logged as train/episodic_return, the
    discriminator's loss, accuracies and mean reward), and model.pt, rebuilt alone, plays the
    final evaluation's returns again."""
    run_dir = tmp_path / "run"
    flags = ["--env-id", env_id, "--dataset", str(experts[env_id]), *TINY[env_id], *SMALL]
    out = run_script("gail.py", flags + ["--save-model", "--seed", "7"], run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_metrics(run_dir)
    for name in (
        "train/episodic_return",
        "eval/episodic_return",
        "eval/normalized_score",
        "losses/discriminator_loss",
        "losses/policy_loss",
        "charts/discriminator_expert_accuracy",
        "charts/gail_reward",
    ):
        assert name in metrics, name
    assert len(metrics["charts/gail_reward"][1]) == 4 and min(metrics["charts/gail_reward"][1]) > 0
    assert (run_dir / "checkpoint.pt").is_file() and (run_dir / "config.json").is_file()
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    assert saved["continuous"] == (env_id == "Pendulum-v1")
    agent = gail.Agent(saved["obs_dim"], saved["action_dim"], saved["continuous"])
    agent.load_state_dict(saved["agent"])
    obs_rms = gail.RunningMeanStd(shape=(saved["obs_dim"],))
    obs_rms.load_state_dict(saved["obs_rms"])
    if saved["continuous"]:  # the policy's observation statistics were kept
        assert obs_rms.count > 1024
    returns = gail.evaluate(agent, obs_rms, env_id, 2, 7 + 100_000)
    assert returns == saved["eval_returns"] and len(returns) == 2


def test_bad_input_is_one_line_and_writes_nothing(experts, tmp_path):
    cartpole = str(experts["CartPole-v1"])
    cases = [
        (["--dataset", str(experts["Pendulum-v1"])], "give the env the demonstrations"),
        (["--dataset", cartpole, "--env-id", "Acrobot-v1"], "give the env the demonstrations"),
        (["--dataset", cartpole, "--demo-episodes", "2"], "--demo-episodes 2 is more than the 1"),
        (["--dataset", cartpole, "--demo-episodes", "0"], "--demo-episodes 0 is out of range"),
        (["--dataset", cartpole, "--env-id", "CartPol-v1"], "did you mean 'CartPole-v1'"),
        (["--dataset", cartpole, "--num-minibatches", "3"], "--num-minibatches 3 does not divide"),
        (["--dataset", cartpole, "--disc-learning-rate", "0"], "--disc-learning-rate 0.0"),
        (["--dataset", str(tmp_path / "nowhere")], "no dataset"),
        (["--env-id", "ALE/Breakout-v5"], "not an env of gail.py"),
    ]
    for flags, expected in cases:
        out = run_script("gail.py", flags, tmp_path / "run", fork=True)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
        assert expected in lines[0], lines[0]
        assert not (tmp_path / "run").exists()
