"""iqn_atari.py's maths: the quantile Huber loss by hand and as a quantile estimator, the target by
hand, and the network's quantiles and Q-values."""

import numpy as np
import pytest
import torch

from benchmark.runs import load_script

m = load_script("iqn_atari.py")


def test_quantile_huber_loss_by_hand():
    # one state, one predicted quantile theta = 0 at tau = 0.25, two target samples 2 and -0.5,
    # kappa = 1: delta = 2 -> Huber 1.5 (linear part), weight |0.25 - 0| = 0.25; delta = -0.5 ->
    # Huber 0.125, weight |0.25 - 1|
    loss = m.quantile_huber_loss(
        torch.zeros(1, 1), torch.tensor([[2.0, -0.5]]), torch.tensor([[0.25]]), 1.0
    )
    assert float(loss) == pytest.approx((0.25 * 1.5 + 0.75 * 0.125) / 2)
    # summed over the predicted quantiles, averaged over the targets and the batch
    two = m.quantile_huber_loss(
        torch.zeros(2, 2), torch.tensor([[2.0, -0.5]] * 2), torch.full((2, 2), 0.25), 1.0
    )
    assert float(two) == pytest.approx(2 * float(loss))


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
def test_minimising_the_loss_finds_the_quantile(tau):
    """With a small kappa the loss is the quantile regression loss: its minimiser over theta is the
    tau-quantile of the target samples (what makes the network's output at tau the return's
    tau-quantile)."""
    targets = torch.arange(100.0)[None]
    theta = torch.zeros(1, 1, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=1.0)
    for _ in range(600):
        opt.zero_grad()
        m.quantile_huber_loss(theta, targets, torch.tensor([[tau]]), 0.01).backward()
        opt.step()
    assert theta.item() == pytest.approx(np.quantile(np.arange(100.0), tau), abs=1.5)


def test_iqn_target_by_hand():
    next_q = torch.tensor([[1.0, 3.0], [5.0, 0.0]])  # greedy next actions: 1 and 0
    # (batch 2, N' 2, actions 2)
    next_quantiles = torch.tensor([[[0.0, 10.0], [1.0, 20.0]], [[7.0, 0.0], [9.0, 0.0]]])
    got = m.iqn_target(
        next_q, next_quantiles, torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]), 0.5
    )
    assert torch.allclose(got, torch.tensor([[1.0 + 5.0, 1.0 + 10.0], [2.0, 2.0]]))


def test_network_gives_quantiles_at_any_fraction_and_q_as_their_mean():
    torch.manual_seed(0)
    net = m.QNetwork(4)
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    taus = torch.rand(3, 5)
    z = net.quantiles(x, taus)
    assert z.shape == (3, 5, 4)
    assert not torch.allclose(z[:, 0], z[:, 1]), "different fractions give different outputs"
    midpoints = ((torch.arange(32) + 0.5) / 32).expand(3, -1)
    assert torch.allclose(net(x), net.quantiles(x, midpoints).mean(dim=1))
    assert torch.equal(net(x), net(x)), "Q-values are deterministic"
    assert "policy_taus" in net.state_dict() and "cos_freqs" in net.state_dict()
