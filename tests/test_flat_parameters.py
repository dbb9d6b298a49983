"""The scripts' fast paths compute what plain torch computes. flat_parameters (ppo.py, dqn.py) puts weights and
gradients into one flat tensor each: training through the flat tensor must give the same gradients and the same Adam
steps as training the network's own parameters. ppo.py acts in numpy and computes tanh from a sigmoid."""
import copy

import numpy as np
import pytest
import torch

from benchmark.runs import load_script


@pytest.mark.parametrize("script,cls", [("ppo.py", "Agent"), ("dqn.py", "QNetwork")])
def test_flat_parameters_train_like_the_parameters(script, cls):
    module = load_script(script)
    torch.manual_seed(0)
    net = getattr(module, cls)(4, 2)
    ref = copy.deepcopy(net)
    flat = module.flat_parameters(net)
    opt = torch.optim.Adam([flat], lr=1e-2, fused=True)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, fused=True)

    def loss_of(m, x):
        out = m(x)
        return sum(o.square().sum() for o in (out if isinstance(out, tuple) else (out,)))

    for _ in range(3):
        x = torch.randn(16, 4)
        flat.grad.zero_()
        loss_of(net, x).backward()
        ref_opt.zero_grad()
        loss_of(ref, x).backward()
        for p, q in zip(net.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, atol=1e-6)
        opt.step()
        ref_opt.step()
        for p, q in zip(net.parameters(), ref.parameters()):
            assert torch.allclose(p, q, atol=1e-6)
    # the parameters stay views: loading a state dict writes into the flat tensor
    fresh = getattr(module, cls)(4, 2)
    fresh_flat = module.flat_parameters(fresh)
    fresh.load_state_dict(net.state_dict())
    assert torch.equal(fresh_flat, flat)


@pytest.mark.parametrize("script,eps", [("ppo.py", 1e-5), ("dqn.py", 1e-8)])
def test_adam_steps_like_torch_optim_adam(script, eps):
    """The scripts' Adam on the flat tensor takes the steps torch.optim.Adam takes, through a change of learning rate
    (the annealing) and a checkpoint round trip."""
    module = load_script(script)
    torch.manual_seed(0)
    ours, ref = torch.nn.Parameter(torch.randn(300)), torch.nn.Parameter(torch.randn(300))
    ref.data.copy_(ours.data)
    opt, ref_opt = module.Adam(ours, lr=1e-2, eps=eps), torch.optim.Adam([ref], lr=1e-2, eps=eps)
    for i in range(50):
        grad = torch.randn(300) * (i + 1)
        ours.grad, ref.grad = grad.clone(), grad.clone()
        if i == 20:
            opt.lr = ref_opt.param_groups[0]["lr"] = 3e-3
        if i == 30:  # resume from a checkpoint into a fresh optimizer
            opt = module.Adam(ours, lr=1.0, eps=eps)
            opt.load_state_dict(copy.deepcopy(state))
        opt.step()
        ref_opt.step()
        state = opt.state_dict()
        assert torch.allclose(ours, ref, atol=1e-6, rtol=0), i


def test_ppo_numpy_actor_samples_what_the_torch_actor_gives():
    """The rollout's numpy actor (get_action) and the update's torch one (evaluate_actions) give the same
    log-probabilities, or the first epoch's probability ratio is not 1; and the actions follow those probabilities."""
    module = load_script("ppo.py")
    torch.manual_seed(0)
    agent = module.Agent(4, 3)
    module.flat_parameters(agent)
    with torch.no_grad():
        agent.actor_head.weight.mul_(1000)  # far from uniform (here 0.13, 0.33, 0.54), so that a wrong sampler shows
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    actions, logp = module.get_action(agent.numpy_actor(), obs, np.random.default_rng(1))
    ref, _, _ = agent.evaluate_actions(torch.as_tensor(obs), torch.as_tensor(actions), with_entropy=False)
    np.testing.assert_allclose(logp, ref.detach().numpy(), atol=1e-5)
    one = np.repeat(obs[:1], 20_000, axis=0)
    actions, _ = module.get_action(agent.numpy_actor(), one, np.random.default_rng(2))
    probs = torch.softmax(agent.actor(torch.as_tensor(obs[:1])), -1)[0].detach().numpy()
    np.testing.assert_allclose(np.bincount(actions, minlength=3) / len(actions), probs, atol=0.015)


def test_ppo_tanh_is_tanh():
    module = load_script("ppo.py")
    x = torch.linspace(-30, 30, 100_001, requires_grad=True)
    ours, ref = module.tanh(x), torch.tanh(x)
    assert torch.allclose(ours, ref, atol=1e-6, rtol=0)
    (g,), (g_ref,) = torch.autograd.grad(ours.sum(), x), torch.autograd.grad(ref.sum(), x)
    assert torch.allclose(g, g_ref, atol=1e-6, rtol=0)
