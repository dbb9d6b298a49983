"""The maths of the multi-agent scripts, on hand-made cases: masking of unavailable actions, death masking, the GRU's
reset at episode starts, value normalisation, the critics' inputs."""
import pytest
import torch

from benchmark.runs import load_script

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
    assert (dist.probs[avail == 0] == 0).all() and torch.allclose(dist.probs.sum(-1), torch.ones(3, 2))
    samples = dist.sample((200,))
    assert (avail.expand(200, 3, 2, 4).gather(-1, samples[..., None]) == 1).all(), "only available actions are drawn"
    # an agent with one available action (as a dead agent's no-op) has entropy 0 and log-probability 0 for it
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
    """Death masking: changing anything about an inactive agent's step changes neither the loss nor its gradient."""
    torch.manual_seed(0)
    agent = m.Agent(obs_dim=5, state_dim=7, n_agents=2, n_actions=4, hidden=8)
    hidden, avail = torch.randn(6, 2, 8), torch.ones(6, 2, 4)
    actions, old_logprobs = torch.randint(0, 4, (6, 2)), torch.randn(6, 2) * 0.1 - 1.4
    advantages, targets, value = torch.randn(6, 2), torch.randn(6, 2), torch.randn(6, 2, requires_grad=True)
    active = torch.ones(6, 2)
    active[3:, 1] = 0.0  # agent 1 died at step 3

    def loss_of(adv, tgt, old):
        loss, _ = m.ppo_loss(agent.policy(hidden, avail), value, actions, old, adv, tgt, active, 0.2, 0.01, 1.0)
        return loss

    base = loss_of(advantages, targets, old_logprobs)
    dead = active == 0
    changed = loss_of(advantages.masked_fill(dead, 99.0), targets.masked_fill(dead, -99.0),
                      old_logprobs.masked_fill(dead, 5.0))
    assert torch.allclose(base, changed)
    grad, = torch.autograd.grad(base, value)
    assert (grad[dead] == 0).all() and (grad[~dead] != 0).all()


def test_value_norm_tracks_the_targets_and_inverts():
    m = load_script("mappo_smac_lite.py")
    norm, x = m.ValueNorm(), torch.randn(1000) * 3.0 + 7.0
    norm.update(x[:400]), norm.update(x[400:])
    assert norm.mean.item() == pytest.approx(x.mean().item(), abs=1e-3)
    assert norm.var.item() == pytest.approx(x.var(correction=0).item(), rel=1e-3)
    assert torch.allclose(norm.denormalize(norm.normalize(x)), x, atol=1e-5)
    assert norm.normalize(x).mean().abs() < 1e-3 and norm.normalize(x).std() == pytest.approx(1.0, rel=1e-2)


def test_mappo_critic_sees_the_global_state_and_ippo_only_its_observation():
    obs, state, ids = torch.randn(3, 2, 5), torch.randn(3, 7), torch.eye(2)
    mappo, ippo = load_script("mappo_smac_lite.py"), load_script("ippo_smac_lite.py")
    full = mappo.critic_inputs(state, obs, ids)
    assert full.shape == (3, 2, 7 + 5 + 2)
    assert torch.equal(full[:, 0, :7], state) and torch.equal(full[:, 1, :7], state), "every agent sees the state"
    assert torch.equal(full[:, 1, 7:12], obs[:, 1]) and torch.equal(full[:, 1, 12:], ids[1].expand(3, 2))
    local = ippo.critic_inputs(state, obs, ids)
    assert torch.equal(local, torch.cat([obs, ids.expand(3, 2, 2)], -1)), "IPPO's critic: own observation and id"


def test_gae_broadcasts_the_team_reward_and_done_over_agents():
    m = load_script("mappo_smac_lite.py")
    rewards = torch.tensor([[1.0], [2.0]]).expand(2, 3).reshape(2, 1, 3).clone()  # (T=2, N=1, A=3)
    values, dones = torch.zeros(2, 1, 3), torch.tensor([[0.0], [1.0]])[..., None]
    advantages, returns = m.compute_gae(rewards, values, dones, torch.full((1, 3), 5.0), 0.5, 1.0)
    assert torch.allclose(returns[:, 0, 0], torch.tensor([1.0 + 0.5 * 2.0, 2.0])), "done at the last step: no bootstrap"
    assert torch.equal(returns[:, :, 0], returns[:, :, 2])
