"""ppo_lstm.py: the update recomputes exactly the LSTM states the rollout had (the log-probabilities
of the first minibatch equal the rollout's before any gradient step, discrete and continuous), a
state is zeroed where an episode starts, the continuous policy is a Normal over clipped actions,
and the memory envs (CartPoleNoVel-v1, PendulumNoVel-v1, RepeatFirst-v0) follow their rules."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import record_ppo_loss

from benchmark.runs import load_script

lstm = load_script("ppo_lstm.py")


@pytest.mark.parametrize(
    "env_id, num_minibatches",
    [("RepeatFirst-v0", 1), ("RepeatFirst-v0", 2), ("PendulumNoVel-v1", 2)],
)
def test_update_starts_from_the_rollouts_states(env_id, num_minibatches, tmp_path, monkeypatch):
    """RepeatFirst-v0 ends an episode every 16 steps, so each 24-step rollout holds resets inside
    it and starts mid-episode after the first (PendulumNoVel-v1's continuous actions: mid-episode
    only): the first minibatch's new log-probabilities (whole sequences of some envs, from the
    stored initial states) must equal the rollout's."""
    calls = record_ppo_loss(lstm, monkeypatch)
    args = lstm.Args(
        env_id=env_id,
        total_timesteps=4 * 24 * 3,
        num_envs=4,
        num_steps=24,
        num_minibatches=num_minibatches,
        update_epochs=2,
        eval_episodes=1,
        run_dir=str(tmp_path / "run"),
    )
    lstm.main(args)
    per_update = 2 * num_minibatches
    firsts = calls[::per_update]
    assert len(firsts) == 3
    for new, old in firsts:
        assert new.shape == (4 * 24 // num_minibatches,)
        assert torch.allclose(new, old, atol=1e-5)
    # later minibatches follow gradient steps: they differ
    assert not torch.allclose(*calls[per_update - 1], atol=1e-5)


def test_a_start_zeroes_the_state():
    torch.manual_seed(0)
    agent = lstm.Agent(obs_dim=3, n_actions=2, lstm_size=8)

    def both(*a):  # the actor's and the critic's outputs side by side
        actor, critic, _ = agent.get_states(*a)
        return torch.cat([actor, critic], dim=-1)

    x = torch.randn(10, 2, 3)  # 10 steps of 2 envs
    starts = torch.zeros(10, 2)
    starts[6, 0] = 1.0  # env 0 begins an episode at step 6
    state = (torch.randn(1, 2, 16), torch.randn(1, 2, 16))  # the actor's and the critic's
    hidden = both(x.flatten(0, 1), state, starts.flatten()).view(10, 2, 16)
    # env 0 from step 6 on: as a fresh sequence from the zero state
    fresh = both(x[6:, :1].flatten(0, 1), agent.initial_state(1), torch.zeros(4))
    assert torch.allclose(hidden[6:, 0], fresh, atol=1e-6)
    # env 1 never restarts: its outputs depend on the initial state all along, the actor's on
    # the actor's state, the critic's on the critic's
    for half in (slice(0, 8), slice(8, 16)):
        other = (state[0].clone(), state[1].clone())
        other[0][:, 1, half] += 1.0
        changed = both(x.flatten(0, 1), other, starts.flatten()).view(10, 2, 16)
        assert not torch.allclose(changed[9, 1, half], hidden[9, 1, half], atol=1e-4)
        rest = slice(8, 16) if half.start == 0 else slice(0, 8)
        assert torch.equal(changed[9, 1, rest], hidden[9, 1, rest]), "two separate LSTMs"
    # without the start, env 0's step 6 still sees its past
    unreset = both(x.flatten(0, 1), state, torch.zeros(20)).view(10, 2, 16)
    assert not torch.allclose(unreset[6, 0], hidden[6, 0], atol=1e-4)


def test_greedy_action_carries_the_state():
    """evaluate()'s policy: the action at a step depends on the observations before it."""
    torch.manual_seed(1)
    agent = lstm.Agent(obs_dim=5, n_actions=4, lstm_size=8)
    obs = torch.randn(5)
    start = torch.zeros(1)
    _, state = agent.get_greedy_action(torch.randn(5), agent.initial_state(1), start)
    after_history, _, _ = agent.get_states(obs, state, start)
    from_zero, _, _ = agent.get_states(obs, agent.initial_state(1), start)
    assert not torch.allclose(after_history, from_zero)


def test_continuous_policy_is_a_normal_over_clipped_actions():
    torch.manual_seed(2)
    agent = lstm.Agent(obs_dim=3, n_actions=2, lstm_size=8, continuous=True)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([0.3, -0.5]))
    x, starts = torch.randn(6, 3), torch.zeros(6)  # 3 steps of 2 envs
    state = agent.initial_state(2)
    action, logprob, entropy, _, _ = agent.get_action_and_value(x, state, starts)
    hidden, _, _ = agent.get_states(x, state, starts)
    mean, std = agent.actor(hidden), torch.tensor([0.3, -0.5]).exp()
    # the density of two independent Normals, written out
    expected = (-((action - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * np.log(2 * np.pi)).sum(
        -1
    )
    assert action.shape == (6, 2)
    assert torch.allclose(logprob, expected, atol=1e-5)
    assert torch.allclose(entropy, (0.5 + 0.5 * np.log(2 * np.pi) + std.log()).sum().expand(6))
    greedy, _ = agent.get_greedy_action(x, state, starts)
    assert torch.allclose(greedy, mean)
    # the env clips an action to Pendulum's bounds [-2, 2]
    env = lstm.make_env("PendulumNoVel-v1")
    env.reset(seed=0)
    env.unwrapped.state = np.array([0.0, 0.0])
    env.step(np.array([50.0], np.float32))
    assert env.unwrapped.last_u == pytest.approx(2.0)


def test_norm_reward_divides_by_the_std_of_the_discounted_return(tmp_path, monkeypatch):
    """The same seed with and without --norm-reward: the first rollout's rewards (no gradient
    step before it) are the raw rewards over the running std of each env's discounted return."""
    seen = []
    compute_gae = lstm.compute_gae

    def recording_gae(rewards, *rest):
        seen.append(rewards.clone())
        return compute_gae(rewards, *rest)

    monkeypatch.setattr(lstm, "compute_gae", recording_gae)
    for norm_reward in (False, True):
        args = lstm.Args(
            env_id="PendulumNoVel-v1",
            total_timesteps=4 * 24,
            num_envs=4,
            num_steps=24,
            update_epochs=1,
            eval_episodes=1,
            norm_reward=norm_reward,
            run_dir=str(tmp_path / str(norm_reward)),
        )
        lstm.main(args)
    raw, scaled = (rewards.numpy() for rewards in seen)
    return_rms = gym.wrappers.utils.RunningMeanStd(shape=())
    discounted = np.zeros(4)
    for t in range(24):
        discounted = discounted * args.gamma + raw[t]
        return_rms.update(discounted)
        expected = np.clip(raw[t] / np.sqrt(return_rms.var + 1e-8), -10, 10)
        assert np.allclose(scaled[t], expected, rtol=1e-5)
    assert not np.allclose(raw, scaled)


def test_a_continuous_model_reloads_to_the_return_it_saved(tmp_path):
    """model.pt of a PendulumNoVel-v1 run (weights_only): the Agent rebuilt from it, with the saved
    observation statistics, evaluates to the returns the run saved."""
    args = lstm.Args(
        env_id="PendulumNoVel-v1",
        total_timesteps=4 * 24 * 2,
        num_envs=4,
        num_steps=24,
        update_epochs=1,
        eval_episodes=2,
        norm_reward=True,
        save_model=True,
        run_dir=str(tmp_path / "run"),
    )
    lstm.main(args)
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert saved["continuous"] is True and saved["n_actions"] == 1
    agent = lstm.Agent(saved["obs_dim"], saved["n_actions"], saved["lstm_size"], True)
    agent.load_state_dict(saved["agent"])
    obs_rms = lstm.RunningMeanStd(shape=(3,))
    obs_rms.load_state_dict(saved["obs_rms"])
    returns = lstm.evaluate(agent, obs_rms, args.env_id, 2, args.seed + 100_000)
    assert returns == pytest.approx(saved["eval_returns"], abs=1e-4)
    assert all(r < 0 for r in returns)  # Pendulum's rewards are negative costs


def test_repeat_first_rule():
    env = gym.make("RepeatFirst-v0")
    obs, _ = env.reset(seed=3)
    first_suit = int(obs[:4].argmax())
    assert obs[4] == 1.0 and obs[:4].sum() == 1.0
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(first_suit)
        assert obs[4] == 0.0 and obs[:4].sum() == 1.0
        total, steps, done = total + reward, steps + 1, terminated or truncated
    assert steps == 16 and total == pytest.approx(1.0)
    # naming the suit in view (no memory) scores about 1/16 + 15 * (1/4 - 3/4) / 16 on average
    returns = []
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(obs[:4].argmax()))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    assert np.mean(returns) == pytest.approx(1 / 16 - 15 / 32, abs=0.05)


def test_cartpole_novel_zeroes_the_velocities():
    masked, plain = gym.make("CartPoleNoVel-v1"), gym.make("CartPole-v1")
    a, _ = masked.reset(seed=4)
    b, _ = plain.reset(seed=4)
    for _ in range(5):
        assert a[1] == 0.0 and a[3] == 0.0 and b[1] != 0.0
        assert a[0] == b[0] and a[2] == b[2]
        a, *_ = masked.step(1)
        b, *_ = plain.step(1)
    assert "TimeLimit" in str(masked)  # CartPole-v1's time limit (500 steps) is kept


def test_pendulum_novel_zeroes_the_angular_velocity():
    masked, plain = gym.make("PendulumNoVel-v1"), gym.make("Pendulum-v1")
    a, _ = masked.reset(seed=4)
    b, _ = plain.reset(seed=4)
    for _ in range(5):
        assert a[2] == 0.0 and b[2] != 0.0 and (a[:2] == b[:2]).all()
        a, *_ = masked.step(np.array([1.0], np.float32))
        b, *_ = plain.step(np.array([1.0], np.float32))


def test_sb3_contrib_gets_the_same_lstm_and_normalisation():
    pytest.importorskip("sb3_contrib")
    from stable_baselines3.common.vec_env import VecNormalize

    from benchmark import sb3_baseline

    a = lstm.Args()
    algo, same = sb3_baseline.SAME["ppo_lstm.py"]
    n_envs, kwargs = same(a)
    model = sb3_baseline.make_model(algo, "CartPoleNoVel-v1", n_envs, kwargs, seed=0)
    assert algo == "RecurrentPPO" and n_envs == a.num_envs
    assert model.policy.lstm_actor.hidden_size == a.lstm_size
    assert model.policy.lstm_critic.hidden_size == a.lstm_size  # the critic's own, as ours
    ours = lstm.Agent(4, 2, a.lstm_size)
    shapes = sorted(tuple(p.shape) for p in ours.parameters())
    assert sorted(tuple(p.shape) for p in model.policy.parameters()) == shapes, "the same network"
    env = model.get_env()
    assert isinstance(env, VecNormalize) and env.norm_obs and not env.norm_reward
    assert (model.n_steps, model.n_epochs, model.gamma, model.gae_lambda) == (
        a.num_steps,
        a.update_epochs,
        a.gamma,
        a.gae_lambda,
    )
