"""The maths of each script as small functions, checked against cases computed by hand."""

import numpy as np
import pytest
import torch

from benchmark.runs import load_script

ppo, dqn = load_script("ppo.py"), load_script("dqn.py")


def test_gae_by_hand():
    # one env, 3 steps, the episode ends at step 1; gamma 0.9, lambda 0.8, V = 0.5 everywhere,
    # V(next obs) = 2
    rewards, values, dones = (
        torch.tensor([[1.0], [1.0], [1.0]]),
        torch.full((3, 1), 0.5),
        torch.tensor([[0.0], [1.0], [0.0]]),
    )
    adv, ret = ppo.compute_gae(
        rewards, values, dones, torch.tensor([2.0]), gamma=0.9, gae_lambda=0.8
    )
    # t=2: 1 + 0.9*2 - 0.5 = 2.3; t=1 (ends): 1 - 0.5 = 0.5; t=0: 1 + 0.9*0.5 - 0.5 + 0.9*0.8*0.5 =
    # 1.31
    assert torch.allclose(adv[:, 0], torch.tensor([1.31, 0.5, 2.3]))
    assert torch.allclose(ret, adv + values)


def test_gae_with_lambda_one_is_the_discounted_return():
    rewards, values = torch.rand(5, 2), torch.rand(5, 2)
    dones, next_value, gamma = torch.zeros(5, 2), torch.rand(2), 0.97
    _, ret = ppo.compute_gae(rewards, values, dones, next_value, gamma, gae_lambda=1.0)
    expected, g = torch.zeros(5, 2), next_value
    for t in reversed(range(5)):
        g = rewards[t] + gamma * g
        expected[t] = g
    assert torch.allclose(ret, expected, atol=1e-6)


def ppo_loss_at(
    module,
    agent,
    obs,
    actions,
    old_logprobs,
    advantages,
    returns,
    clip_coef,
    ent_coef,
    vf_coef,
    old_values=None,
):
    """module.ppo_loss on the agent's forward pass (value clipped by clip_coef around old_values
    where given)."""
    _, logprob, entropy, value = agent.get_action_and_value(obs, actions)
    return module.ppo_loss(
        logprob,
        entropy,
        value,
        old_logprobs,
        old_values,
        advantages,
        returns,
        clip_coef,
        ent_coef,
        vf_coef,
        clip_vloss=None if old_values is None else clip_coef,
    )


def test_ppo_loss_at_the_old_policy_and_clipping():
    torch.manual_seed(0)
    agent, obs = ppo.Agent(4, 3), torch.randn(64, 4)
    with torch.no_grad():
        actions, logprobs, _, values = agent.get_action_and_value(obs)
    adv, ret = torch.randn(64), torch.randn(64)
    loss, stats = ppo_loss_at(
        ppo, agent, obs, actions, logprobs, adv, ret, clip_coef=0.2, ent_coef=0.0, vf_coef=0.5
    )
    # ratio = 1: the surrogate is -mean(advantage), nothing is clipped, the KL estimate is 0
    assert stats["policy_loss"] == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert stats["clipfrac"] == 0 and abs(stats["approx_kl"]) < 1e-6
    assert loss.item() == pytest.approx(
        -adv.mean().item() + 0.5 * 0.5 * ((values - ret) ** 2).mean().item(), abs=1e-5
    )
    # old log-probs 1 lower: ratio e > 1 + clip; positive advantages are clipped at 1.2, negative
    # ones are not
    _, stats = ppo_loss_at(
        ppo, agent, obs, actions, logprobs - 1, torch.ones(64), ret, 0.2, 0.0, 0.5
    )
    assert stats["policy_loss"] == pytest.approx(-1.2, abs=1e-5) and stats["clipfrac"] == 1
    _, stats = ppo_loss_at(
        ppo, agent, obs, actions, logprobs - 1, -torch.ones(64), ret, 0.2, 0.0, 0.5
    )
    assert stats["policy_loss"] == pytest.approx(np.e, abs=1e-5)


def test_policy_log_probs_are_the_actors_softmax():
    torch.manual_seed(1)
    agent, obs = ppo.Agent(4, 3), torch.randn(10, 4)
    actions, logprob, entropy, value = agent.get_action_and_value(obs)
    logp_all = torch.log_softmax(agent.actor(obs), dim=-1)
    assert torch.allclose(logprob, logp_all.gather(1, actions[:, None]).squeeze(1))
    assert torch.allclose(entropy, -(logp_all.exp() * logp_all).sum(-1))
    assert torch.allclose(value, agent.critic(obs).squeeze(-1))


def test_td_target_by_hand():
    q_next = torch.tensor([[1.0, 3.0], [5.0, 2.0]])
    target = dqn.td_target(q_next, torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0]), gamma=0.5)
    # a terminated transition has no future
    assert torch.allclose(target, torch.tensor([1.0 + 0.5 * 3.0, 1.0]))


def test_epsilon_schedule():
    assert dqn.linear_schedule(1.0, 0.05, 100, 0) == 1.0
    assert dqn.linear_schedule(1.0, 0.05, 100, 50) == pytest.approx(0.525)
    assert dqn.linear_schedule(1.0, 0.05, 100, 100) == pytest.approx(0.05)
    assert dqn.linear_schedule(1.0, 0.05, 100, 10_000) == 0.05


def test_replay_buffer_wraps_around_and_round_trips():
    rb = dqn.ReplayBuffer(3, 2, np.random.default_rng(0))
    for i in range(5):  # two envs per add: rows i*2, i*2+1
        obs = np.array([[2 * i, 0], [2 * i + 1, 0]], dtype=np.float32)
        rb.add(obs, obs + 1, np.array([0, 1]), np.array([1.0, 2.0]), np.array([0.0, 1.0]))
    # the last three rows
    assert rb.full and rb.pos == 1 and sorted(rb.obs[:, 0].tolist()) == [7.0, 8.0, 9.0]
    b_obs, b_next_obs, b_actions, b_rewards, b_terminated = rb.sample(50, "cpu")
    assert set(b_obs[:, 0].tolist()) <= {7.0, 8.0, 9.0} and torch.equal(b_next_obs, b_obs + 1)
    assert b_actions.dtype == torch.int64 and torch.equal(b_rewards, b_actions.float() + 1)
    other = dqn.ReplayBuffer(3, 2, np.random.default_rng(0))
    other.load_state_dict(rb.state_dict())
    assert other.pos == rb.pos and np.array_equal(other.next_obs, rb.next_obs)


ppo_continuous = load_script("ppo_continuous.py")


def test_gaussian_policy_log_prob_and_clipped_value_loss():
    torch.manual_seed(0)
    agent, obs = ppo_continuous.Agent(3, 2), torch.randn(16, 3)
    with torch.no_grad():
        agent.actor_logstd.fill_(-0.5)
        actions, logprobs, entropy, values = agent.get_action_and_value(obs)
        mean, std = agent.actor_mean(obs), torch.tensor(-0.5).exp()
    # log N(a; mean, std) summed over the two action dimensions, by hand
    by_hand = (
        -((actions - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * np.log(2 * np.pi)
    ).sum(-1)
    assert torch.allclose(logprobs, by_hand, atol=1e-5)
    assert torch.allclose(
        entropy, torch.full((16,), 2 * (0.5 + 0.5 * np.log(2 * np.pi) - 0.5)), atol=1e-5
    )
    # value clipping (ppo2): with old values far from the returns, the clipped error is the larger
    # one and counts
    returns, old_values = values + 10.0, values - 5.0
    _, clipped = ppo_loss_at(
        ppo_continuous,
        agent,
        obs,
        actions,
        logprobs,
        torch.zeros(16),
        returns,
        0.2,
        0.0,
        0.5,
        old_values,
    )
    _, plain = ppo_loss_at(
        ppo_continuous, agent, obs, actions, logprobs, torch.zeros(16), returns, 0.2, 0.0, 0.5
    )
    assert plain["value_loss"] == pytest.approx(0.5 * 100.0, rel=1e-5)
    assert clipped["value_loss"] == pytest.approx(0.5 * (10.0 + 5.0 - 0.2) ** 2, rel=1e-5)


def test_frozen_observation_statistics_do_not_move():
    import gymnasium as gym
    from gymnasium.wrappers.utils import RunningMeanStd

    stats = RunningMeanStd(shape=(3,))
    stats.mean[:], stats.var[:] = [1.0, 2.0, 3.0], [4.0, 4.0, 4.0]
    env = ppo_continuous.normalize_observation(gym.make("Pendulum-v1"), stats, update=False)
    obs, _ = env.reset(seed=0)
    raw = env.unwrapped._get_obs()
    assert np.allclose(
        obs, np.clip((raw - [1.0, 2.0, 3.0]) / np.sqrt(4.0 + 1e-8), -10, 10), atol=1e-6
    )
    env.step(env.action_space.sample())
    assert np.allclose(stats.mean, [1.0, 2.0, 3.0]) and np.allclose(stats.var, 4.0), (
        "evaluation must not update them"
    )


sac, td3, ddpg = (
    load_script("sac_continuous.py"),
    load_script("td3_continuous.py"),
    load_script("ddpg_continuous.py"),
)


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


def test_off_policy_targets_by_hand():
    # two transitions: the second terminated (no bootstrap); gamma 0.9, reward 0.5
    assert torch.allclose(
        td3.td3_target(t(1.0, 5.0), t(2.0, 3.0), t(0.5, 0.5), t(0.0, 1.0), 0.9), t(0.5 + 0.9, 0.5)
    )
    assert torch.allclose(ddpg.ddpg_target(t(2.0, 3.0), t(1.0, 1.0), t(0.0, 1.0), 0.5), t(2.0, 1.0))
    # SAC: min(Q1', Q2') - alpha * log pi = 1 - 0.2 * (-1) = 1.2
    assert torch.allclose(
        sac.sac_target(t(1.0, 5.0), t(2.0, 3.0), t(-1.0, 0.0), t(0.5, 0.5), t(0.0, 1.0), 0.9, 0.2),
        t(0.5 + 0.9 * 1.2, 0.5),
    )


def test_td3_target_smoothing_clips_the_noise_and_the_action():
    # noise 0.3 clipped to 0.5 -> 1.9 + 0.3 * 2 = 2.5, clipped to the bound 2; noise -5 clipped to
    # -0.5 -> -1.0
    a = td3.smoothed_target_action(t(1.9, 0.0), t(0.3, -5.0), 0.5, t(2.0, 2.0), t(0.0, 0.0))
    assert torch.allclose(a, t(2.0, -1.0))


def test_sac_squashed_log_prob_is_the_change_of_variables_and_a_density():
    torch.manual_seed(0)
    u, normal = torch.randn(1000, 3), torch.distributions.Normal(torch.zeros(3), torch.ones(3))
    naive = (normal.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(1)
    assert torch.allclose(sac.squashed_log_prob(normal.log_prob(u), u), naive, atol=1e-3)
    y = torch.linspace(-0.9999, 0.9999, 200001)[:, None]
    one_d = torch.distributions.Normal(torch.tensor([0.3]), torch.tensor([0.7]))
    density = sac.squashed_log_prob(one_d.log_prob(torch.atanh(y)), torch.atanh(y)).exp()
    assert float(torch.trapezoid(density, y[:, 0])) == pytest.approx(1.0, abs=1e-3)


def test_sac_temperature_shrinks_when_the_entropy_is_above_its_target():
    log_alpha = torch.zeros(1, requires_grad=True)
    sac.temperature_loss(log_alpha, t(-0.5, -0.5), -1.0).backward()  # entropy 0.5 > target -1
    assert log_alpha.grad > 0  # a gradient step lowers alpha


def test_actors_stay_within_the_bounds_they_save():
    actor = td3.Actor(3, 2, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    assert torch.allclose(actor.action_scale, t(2.0, 0.5)) and torch.allclose(
        actor.action_bias, t(0.0, 0.5)
    )
    out = actor(torch.randn(100, 3))
    assert (out[:, 0].abs() <= 2).all() and (out[:, 1] >= 0).all() and (out[:, 1] <= 1).all()
    stochastic = sac.Actor(3, 1, -2.0, 2.0)
    actions, log_probs = stochastic.get_action(torch.randn(5, 3))
    assert actions.shape == (5, 1) and log_probs.shape == (5,) and (actions.abs() <= 2).all()
    assert "action_scale" in stochastic.state_dict(), "the bounds are saved with the weights"
