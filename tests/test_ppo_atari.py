"""ppo_atari.py without training: the shared-trunk CNN's shapes and init, the clipped value loss,
the observations are dqn_atari.py's, training logs whole games (the unclipped score is checked for
every Atari script in test_dqn_atari.py), the greedy evaluation plays whole games, CleanRL's
defaults, --compile computes the same loss, and a non-Atari env id is refused before training."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmark.runs import load_script, run_script

m = load_script("ppo_atari.py")
SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


def test_agent_maps_uint8_stacks_to_actions_log_probs_entropies_and_values():
    torch.manual_seed(0)
    agent = m.Agent(6)
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    action, logprob, entropy, value = agent.get_action_and_value(x)
    assert action.shape == logprob.shape == entropy.shape == value.shape == (5,)
    assert action.dtype == torch.int64 and ((0 <= action) & (action < 6)).all()
    assert value.dtype == logprob.dtype == torch.float32
    assert torch.allclose(value, agent.get_value(x)), (
        "get_value and get_action_and_value share the trunk"
    )
    hidden = agent.network(x.float() / 255)
    assert hidden.shape == (5, 512) and torch.allclose(agent.critic(hidden).squeeze(-1), value)
    dist = torch.distributions.Categorical(logits=agent.actor(hidden))
    assert torch.allclose(dist.log_prob(action), logprob) and torch.allclose(
        dist.entropy(), entropy
    )
    given = torch.tensor([0, 1, 2, 3, 5])
    assert torch.equal(agent.get_action_and_value(x, given)[0], given)
    # CleanRL's ppo_atari network: Nature CNN trunk, heads initialised orthogonally with std 0.01
    # (actor) and 1 (critic)
    convs = [layer for layer in agent.network if isinstance(layer, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    assert (agent.actor.in_features, agent.actor.out_features, agent.critic.out_features) == (
        512,
        6,
        1,
    )
    assert float(torch.linalg.matrix_norm(agent.actor.weight.detach(), 2)) == pytest.approx(
        0.01, rel=1e-3
    )
    assert float(torch.linalg.matrix_norm(agent.critic.weight.detach(), 2)) == pytest.approx(
        1.0, rel=1e-3
    )
    assert (entropy > np.log(6) - 1e-3).all(), "a near-uniform first policy"


def test_value_loss_is_clipped_around_the_rollout_values():
    value, old, returns = (
        torch.tensor([1.0, 0.0, 0.0]),
        torch.tensor([0.0, 0.0, 0.0]),
        torch.tensor([2.0, 0.5, -1.0]),
    )
    logprob = torch.full((3,), np.log(0.5))  # a uniform policy over 2 actions, at the old policy
    common = (
        logprob,
        torch.full((3,), np.log(2.0)),
        value,
        logprob,
        old,
        torch.zeros(3),
        returns,
        0.1,
        0.0,
        1.0,
    )
    _, plain = m.ppo_loss(*common)
    _, clipped = m.ppo_loss(*common, clip_vloss=0.1)
    assert plain["value_loss"] == pytest.approx(0.5 * (1.0 + 0.25 + 1.0) / 3)
    # clipped to old +- 0.1 = 0.1 for the first: (0.1 - 2)^2 = 3.61 > 1; others unchanged (value ==
    # old)
    assert clipped["value_loss"] == pytest.approx(0.5 * (3.61 + 0.25 + 1.0) / 3)


def test_observations_are_those_of_dqn_atari():
    """Same make_env as dqn_atari.py: the same seeds and actions give the same (4, 84, 84) uint8
    stacks."""
    dqn = load_script("dqn_atari.py")
    ours, theirs = m.make_env("ALE/Breakout-v5"), dqn.make_env("ALE/Breakout-v5")
    assert ours.observation_space == theirs.observation_space and ours.observation_space.shape == (
        4,
        84,
        84,
    )
    a, _ = ours.reset(seed=3)
    b, _ = theirs.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(100):
        assert a.dtype == np.uint8 and np.array_equal(a, b)
        action = int(rng.integers(4))
        a, *ra = ours.step(action)
        b, *rb = theirs.step(action)
        assert ra[:3] == rb[:3]
        if ra[1] or ra[2]:
            a, _ = ours.reset()
            b, _ = theirs.reset()
    ours.close()
    theirs.close()


def test_training_logs_whole_games(tmp_path):
    """A short run: every train/episodic_return is a whole game of Breakout (5 lives: well over the
    ~40 steps of a life) and its score is a non-negative whole number; the greedy evaluation is
    logged too."""
    run = tmp_path / "run"
    out = run_script(
        "ppo_atari.py",
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
    from benchmark.runs import read_metrics

    metrics = read_metrics(run)
    _, returns = metrics["train/episodic_return"]
    _, lengths = metrics["train/episodic_length"]
    assert len(returns) >= 2 and (returns >= 0).all() and (returns == np.round(returns)).all()
    assert (lengths >= 100).all(), f"an episode shorter than a game: {lengths}"
    assert len(metrics["eval/episodic_return"][1]) == 1
    for name in ("losses/value_loss", "losses/clipfrac", "charts/learning_rate"):
        assert name in metrics


def test_compiled_loss_is_the_eager_loss(tmp_path):
    """--compile: torch.compile(minibatch_loss) gives the eager loss and gradients (to float
    rounding), and a run with the flag trains (the clip coefficient annealed, so a changing float
    argument does not break it)."""
    torch.manual_seed(0)
    agent, n = m.Agent(4), 64
    batch = (
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 4, (n,)),
        torch.full((n,), -1.3),
        torch.randn(n),
        torch.randn(n),
        torch.randn(n),
        0.1,
        0.01,
        0.5,
        0.1,
    )
    results = []
    for fn in (m.minibatch_loss, torch.compile(m.minibatch_loss)):
        agent.zero_grad()
        loss, stats = fn(agent, *batch)
        loss.backward()
        results.append((loss.detach(), stats, [p.grad.clone() for p in agent.parameters()]))
    (eager, eager_stats, eager_grads), (comp, comp_stats, comp_grads) = results
    assert torch.allclose(eager, comp, rtol=1e-4, atol=1e-6)
    assert all(
        torch.allclose(eager_stats[k], comp_stats[k], rtol=1e-4, atol=1e-6) for k in eager_stats
    )
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(eager_grads, comp_grads))
    out = run_script(
        "ppo_atari.py",
        [
            "--total-timesteps",
            "256",
            "--num-envs",
            "2",
            "--num-steps",
            "32",
            "--anneal-clip",
            "--compile",
            "--eval-episodes",
            "1",
        ],
        tmp_path / "run",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_evaluation_plays_whole_games_reproducibly():
    torch.manual_seed(0)
    agent = m.Agent(4)
    scores = m.evaluate(agent, "ALE/Breakout-v5", 1, seed=7)
    assert scores == m.evaluate(agent, "ALE/Breakout-v5", 1, seed=7) and isinstance(
        scores[0], float
    )


def test_defaults_are_cleanrl_ppo_atari():
    a = m.Args()
    assert (a.env_id, a.total_timesteps, a.num_envs, a.num_steps, a.learning_rate, a.anneal_lr) == (
        "ALE/Breakout-v5",
        10_000_000,
        8,
        128,
        2.5e-4,
        True,
    )
    assert (
        a.gamma,
        a.gae_lambda,
        a.num_minibatches,
        a.update_epochs,
        a.clip_coef,
        a.anneal_clip,
        a.clip_vloss,
    ) == (0.99, 0.95, 4, 4, 0.1, False, True)
    assert (a.ent_coef, a.vf_coef, a.max_grad_norm, a.target_kl) == (0.01, 0.5, 0.5, None)


@pytest.mark.parametrize(
    "env_id, words",
    [("CartPole-v1", ("Atari", "ppo.py")), ("Hopper-v5", ("discrete", "ppo_continuous.py"))],
)
def test_non_atari_env_id_is_refused(env_id, words, tmp_path):
    out = run_script("ppo_atari.py", ["--env-id", env_id], tmp_path / "run", fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert (
        env_id in lines[0] and all(w in lines[0] for w in words) and not (tmp_path / "run").exists()
    )


def test_sb3_baseline_gets_the_same_hyperparameters_and_network():
    """benchmark/sb3_baseline.py's mapping: SB3 PPO with our defaults on SB3's Atari env, a
    CnnPolicy with as many parameters as our Agent (the same Nature CNN trunk shared by two linear
    heads)."""
    from benchmark import sb3_baseline

    algo, same = sb3_baseline.SAME["ppo_atari.py"]
    n_envs, kw = same(m.Args())
    assert (algo, n_envs, kw["atari"], kw["n_steps"], kw["batch_size"], kw["n_epochs"]) == (
        "PPO",
        8,
        True,
        128,
        256,
        4,
    )
    assert (
        kw["learning_rate"],
        kw["clip_range"],
        kw["clip_range_vf"],
        kw["ent_coef"],
        kw["gae_lambda"],
    ) == ({"linear": 2.5e-4}, 0.1, 0.1, 0.01, 0.95)
    model = sb3_baseline.make_model(algo, "ALE/Breakout-v5", 2, kw, seed=0)
    assert model.observation_space.shape == (4, 84, 84) and model.n_envs == 2
    assert sum(p.numel() for p in model.policy.parameters()) == sum(
        p.numel() for p in m.Agent(4).parameters()
    )
    model.env.close()
