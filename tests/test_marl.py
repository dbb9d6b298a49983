"""The maths of the multi-agent scripts, on hand-made cases: masking of unavailable actions, death
masking, the GRU's reset at episode starts, value normalisation, the critics' inputs."""

import numpy as np
import pytest
import torch

from benchmark.runs import load_script, read_metrics

PPO_FAMILY = ["mappo_smac_lite.py", "ippo_smac_lite.py"]


@pytest.fixture(params=PPO_FAMILY)
def m(request):
    return load_script(request.param)


def test_unavailable_actions_get_probability_zero(m):
    torch.manual_seed(0)
    agent = m.Agent(obs_dim=5, state_dim=7, n_agents=2, n_actions=4, hidden=8)
    hidden = torch.randn(3, 2, 8)
    avail = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]]).expand(3, 2, 4)
    dist = agent.policy(hidden, avail)
    assert (dist.probs[avail == 0] == 0).all() and torch.allclose(
        dist.probs.sum(-1), torch.ones(3, 2)
    )
    samples = dist.sample((200,))
    assert (avail.expand(200, 3, 2, 4).gather(-1, samples[..., None]) == 1).all(), (
        "only available actions are drawn"
    )
    # an agent with one available action (as a dead agent's no-op) has entropy 0 and log-probability
    # 0 for it
    assert dist.entropy()[:, 1].abs().max() < 1e-6
    assert dist.log_prob(torch.ones(3, 2, dtype=torch.long))[:, 1].abs().max() < 1e-6


def test_the_gru_memory_is_zeroed_where_an_episode_starts(m):
    torch.manual_seed(0)
    agent = m.Agent(obs_dim=5, state_dim=7, n_agents=2, n_actions=4, hidden=8)
    x, h = torch.randn(2, 2, 5 + 2), torch.randn(2, 2, 8)
    out = agent.actor_step(x, h, torch.tensor([1.0, 0.0]))
    fresh = agent.actor_step(x, torch.zeros_like(h), torch.zeros(2))
    assert torch.equal(out[0], fresh[0]), "battle 0 starts an episode: its memory is dropped"
    assert not torch.allclose(out[1], fresh[1]), "battle 1 goes on: its memory is used"


def test_dead_agents_carry_no_loss(m):
    """Death masking: changing anything about an inactive agent's step changes neither the loss nor
    its gradient."""
    torch.manual_seed(0)
    agent = m.Agent(obs_dim=5, state_dim=7, n_agents=2, n_actions=4, hidden=8)
    hidden, avail = torch.randn(6, 2, 8), torch.ones(6, 2, 4)
    actions, old_logprobs = torch.randint(0, 4, (6, 2)), torch.randn(6, 2) * 0.1 - 1.4
    advantages, targets, value = (
        torch.randn(6, 2),
        torch.randn(6, 2),
        torch.randn(6, 2, requires_grad=True),
    )
    active = torch.ones(6, 2)
    active[3:, 1] = 0.0  # agent 1 died at step 3

    def loss_of(adv, tgt, old):
        dist = agent.policy(hidden, avail)
        loss, _ = m.ppo_loss(
            dist.log_prob(actions),
            dist.entropy(),
            value,
            old,
            None,
            adv,
            tgt,
            0.2,
            0.01,
            1.0,
            mask=active,
        )
        return loss

    base = loss_of(advantages, targets, old_logprobs)
    dead = active == 0
    changed = loss_of(
        advantages.masked_fill(dead, 99.0),
        targets.masked_fill(dead, -99.0),
        old_logprobs.masked_fill(dead, 5.0),
    )
    assert torch.allclose(base, changed)
    (grad,) = torch.autograd.grad(base, value)
    assert (grad[dead] == 0).all() and (grad[~dead] != 0).all()


def test_value_norm_tracks_the_targets_and_inverts():
    m = load_script("mappo_smac_lite.py")
    norm, x = m.ValueNorm(), torch.randn(1000) * 3.0 + 7.0
    norm.update(x[:400])
    norm.update(x[400:])
    assert norm.mean.item() == pytest.approx(x.mean().item(), abs=1e-3)
    assert norm.var.item() == pytest.approx(x.var(correction=0).item(), rel=1e-3)
    assert torch.allclose(norm.denormalize(norm.normalize(x)), x, atol=1e-5)
    assert norm.normalize(x).mean().abs() < 1e-3 and norm.normalize(x).std() == pytest.approx(
        1.0, rel=1e-2
    )


def test_mappo_critic_sees_the_global_state_and_ippo_only_its_observation():
    obs, state, ids = torch.randn(3, 2, 5), torch.randn(3, 7), torch.eye(2)
    mappo, ippo = load_script("mappo_smac_lite.py"), load_script("ippo_smac_lite.py")
    full = mappo.critic_inputs(state, obs, ids)
    assert full.shape == (3, 2, 7 + 5 + 2)
    assert torch.equal(full[:, 0, :7], state) and torch.equal(full[:, 1, :7], state), (
        "every agent sees the state"
    )
    assert torch.equal(full[:, 1, 7:12], obs[:, 1]) and torch.equal(
        full[:, 1, 12:], ids[1].expand(3, 2)
    )
    local = ippo.critic_inputs(state, obs, ids)
    assert torch.equal(local, torch.cat([obs, ids.expand(3, 2, 2)], -1)), (
        "IPPO's critic: own observation and id"
    )


def test_gae_broadcasts_the_team_reward_and_done_over_agents():
    m = load_script("mappo_smac_lite.py")
    rewards = torch.tensor([[1.0], [2.0]]).expand(2, 3).reshape(2, 1, 3).clone()  # (T=2, N=1, A=3)
    values, dones = torch.zeros(2, 1, 3), torch.tensor([[0.0], [1.0]])[..., None]
    advantages, returns = m.compute_gae(rewards, values, dones, torch.full((1, 3), 5.0), 0.5, 1.0)
    assert torch.allclose(returns[:, 0, 0], torch.tensor([1.0 + 0.5 * 2.0, 2.0])), (
        "done at the last step: no bootstrap"
    )
    assert torch.equal(returns[:, :, 0], returns[:, :, 2])


def test_maddpg_critic_sees_every_agent_and_the_actor_only_its_own():
    """Q_i(o_1..o_N, a_1..a_N) depends on every agent's observation and action; mu_i on o_i alone
    (different sizes, as in simple_adversary_v3)."""
    m = load_script("maddpg_mpe.py")
    torch.manual_seed(0)
    obs_dims, action_dims = [8, 10, 10], [5, 5, 5]
    actors = torch.nn.ModuleList(m.Actor(o, a, 16) for o, a in zip(obs_dims, action_dims))
    critic = m.Critic(sum(obs_dims), sum(action_dims), 16)
    obs, actions = torch.randn(4, 28, requires_grad=True), torch.rand(4, 15, requires_grad=True)
    obs_grad, action_grad = torch.autograd.grad(critic(obs, actions).sum(), (obs, actions))
    for grad, dims in ((obs_grad, obs_dims), (action_grad, action_dims)):
        assert all(part.abs().sum() > 0 for part in grad.split(dims, -1)), (
            "the critic sees every agent"
        )
    joint = m.joint_action(actors, obs, obs_dims)
    assert joint.shape == (4, 15)
    (grad,) = torch.autograd.grad(joint[:, 5:10].sum(), obs)  # agent 1's action
    parts = grad.split(obs_dims, -1)
    assert parts[1].abs().sum() > 0 and parts[0].abs().sum() == 0 and parts[2].abs().sum() == 0
    # eq. 6: the others' actions as drawn
    replaced = m.with_action(actions, 1, torch.zeros(4, 5), action_dims)
    assert torch.equal(replaced[:, 5:10], torch.zeros(4, 5))
    assert torch.equal(replaced[:, :5], actions[:, :5]) and torch.equal(
        replaced[:, 10:], actions[:, 10:]
    )


def test_maddpg_bootstraps_through_truncation_but_not_termination(tmp_path):
    m = load_script("maddpg_mpe.py")
    y = m.maddpg_target(
        torch.tensor([10.0, 10.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0]), 0.5
    )
    assert torch.equal(y, torch.tensor([6.0, 1.0]))
    # a real run: 2 envs, 2 episodes of 25 steps each; every stored next_obs is the true successor,
    # the time limit is no termination, and at an episode's end the stored next_obs is its last
    # observation, not the reset one
    m.main(
        m.Args(
            num_envs=2,
            total_timesteps=100,
            learning_starts=60,
            batch_size=8,
            buffer_size=1000,
            train_every=20,
            eval_episodes=0,
            run_dir=str(tmp_path),
        )
    )
    rb = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["rb"]
    assert rb["pos"] == 100 and not rb["terminated"].any()
    obs, next_obs = torch.as_tensor(rb["obs"]), torch.as_tensor(rb["next_obs"])
    ends = (torch.arange(100) // 2 + 1) % 25 == 0  # row k: env k % 2 at its step k // 2
    successor = (next_obs[:-2] == obs[2:]).all(-1)  # row k + 2: the same env's next step
    assert successor[~ends[:-2]].all() and not successor[ends[:-2]].any()
    metrics = read_metrics(tmp_path)
    assert (
        len(metrics["train/episodic_length"][1]) == 4
        and (metrics["train/episodic_length"][1] == 25).all()
    )


def test_maddpg_actions_stay_inside_the_box():
    m = load_script("maddpg_mpe.py")
    torch.manual_seed(0)
    actor = m.Actor(6, 5, 16, low=[0.0, -1.0, 0.0, 0.0, 2.0], high=[1.0, 1.0, 1.0, 1.0, 3.0])
    actions = actor(torch.randn(1000, 6) * 1e4)  # saturated pre-activations
    assert (actions >= actor.low).all() and (actions <= actor.high).all()
    low, high = actor.low.numpy(), actor.high.numpy()
    noisy = m.explore(actions.detach().numpy(), 5.0, low, high, np.random.default_rng(0))
    assert noisy.dtype == np.float32 and (noisy >= low).all() and (noisy <= high).all()
    assert (noisy == low).any() and (noisy == high).any() and ((noisy > low) & (noisy < high)).any()


@pytest.mark.parametrize(
    "task",
    [
        "simple_adversary_v3",
        "simple_tag_v3",
        "simple_spread_v3",
        "simple_crypto_v3",
        "simple_world_comm_v3",
        "simple_speaker_listener_v4",
    ],
)
def test_maddpg_evaluates_every_kind_of_task_with_team_metrics(task):
    m = load_script("maddpg_mpe.py")
    env = m.MPEEnvs(task, 1, "cpu", continuous_actions=True)
    actors = torch.nn.ModuleList(m.Actor(o, a, 8) for o, a in zip(env.obs_dims, env.action_dims))
    results = m.evaluate(actors, task, 2, 0)
    competitive = env.adversary.any()
    assert competitive == (task not in ("simple_spread_v3", "simple_speaker_listener_v4"))
    names = {"eval/episodic_return_agent_mean"} | (
        {"eval/episodic_return_adversary_mean", "eval/episodic_return_good_mean"}
        if competitive
        else set()
    )
    assert set(results) == names and all(len(v) == 2 for v in results.values())
