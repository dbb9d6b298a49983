"""flat_parameters (ppo.py, dqn.py) puts weights and gradients into one flat tensor each: training through the flat
tensor must give the same gradients and the same Adam steps as training the network's own parameters."""
import copy

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
