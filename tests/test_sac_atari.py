"""sac_atari.py's maths: the soft target with its exact expectation over the actions, the actor loss
whose minimiser is the Boltzmann policy softmax(Q / alpha), and the temperature's gradient."""

import numpy as np
import pytest
import torch

from benchmark.runs import load_script

m = load_script("sac_atari.py")


def test_sac_discrete_target_by_hand():
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    log_probs = torch.log(torch.tensor([[0.5, 0.5], [1.0, 1e-30]]))
    q1, q2 = torch.tensor([[1.0, 4.0], [2.0, 0.0]]), torch.tensor([[2.0, 3.0], [1.0, 9.0]])
    got = m.sac_discrete_target(
        probs, log_probs, q1, q2, torch.tensor([1.0, 5.0]), torch.tensor([0.0, 1.0]), 0.9, 0.2
    )
    # V(s') = 0.5 * (min(1, 2) - 0.2 log 0.5) + 0.5 * (min(4, 3) - 0.2 log 0.5) = 2 + 0.2 log 2;
    # terminated: r alone
    assert torch.allclose(got, torch.tensor([1.0 + 0.9 * (2.0 + 0.2 * float(np.log(2.0))), 5.0]))


def test_actor_loss_is_minimised_by_the_boltzmann_policy():
    q, alpha = torch.tensor([[1.0, 2.0, 0.5]]), 0.5
    logits = torch.zeros(1, 3, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    for _ in range(2000):
        opt.zero_grad()
        m.actor_loss_fn(logits.softmax(1), logits.log_softmax(1), q, alpha).backward()
        opt.step()
    assert torch.allclose(logits.softmax(1), (q / alpha).softmax(1), atol=1e-3)


def test_temperature_grows_when_the_entropy_is_below_its_target():
    log_alpha = torch.zeros(1, requires_grad=True)
    # entropy ~0.17, far below 0.89 * log 4 = 1.23
    peaked = torch.tensor([[0.97, 0.01, 0.01, 0.01]])
    m.temperature_loss(log_alpha, peaked, peaked.log(), 0.89 * np.log(4)).backward()
    assert log_alpha.grad < 0, "gradient descent raises alpha"
    log_alpha.grad = None
    uniform = torch.full((1, 4), 0.25)  # entropy log 4, above the target
    m.temperature_loss(log_alpha, uniform, uniform.log(), 0.89 * np.log(4)).backward()
    assert log_alpha.grad > 0


def test_actor_and_critics_are_separate_cnns_and_evaluation_is_greedy():
    torch.manual_seed(0)
    actor, qf = m.Actor(4), m.QNetwork(4)
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    action, log_probs, probs = actor.get_action(x)
    assert action.shape == (5,) and log_probs.shape == probs.shape == (5, 4)
    assert torch.allclose(probs.sum(1), torch.ones(5)) and torch.allclose(log_probs.exp(), probs)
    assert qf(x).shape == (5, 4) and not torch.equal(actor(x), qf(x))
    scores = m.evaluate(actor, "ALE/Breakout-v5", 1, seed=3)
    assert scores == m.evaluate(actor, "ALE/Breakout-v5", 1, seed=3)
    assert m.Args().target_entropy_scale == pytest.approx(0.89) and m.Args().batch_size == 64
