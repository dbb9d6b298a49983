"""qrdqn.py's maths: the quantile Huber loss against its formula written as loops over quantile
pairs, the target quantiles against a loop over the batch, sb3-contrib's loss on the same numbers,
and the greedy action (the mean of the quantiles)."""

import pytest
import torch

from benchmark.runs import load_script

qrdqn = load_script("qrdqn.py")


def loss_by_loops(quantiles, target):
    """Dabney et al. 2018, eq. 10: for each sample, sum over i of the mean over j of
    rho^kappa_tau_i(T theta_j - theta_i), kappa 1, tau_i = (2i + 1) / 2N; then the batch mean."""
    batch, n = quantiles.shape
    total = 0.0
    for b in range(batch):
        for i in range(n):
            tau = (2 * i + 1) / (2 * n)
            pair_losses = []
            for j in range(target.shape[1]):
                u = float(target[b, j] - quantiles[b, i])
                huber = 0.5 * u * u if abs(u) <= 1.0 else abs(u) - 0.5
                pair_losses.append(abs(tau - (1.0 if u < 0 else 0.0)) * huber)
            total += sum(pair_losses) / len(pair_losses)
    return total / batch


def test_quantile_huber_loss_against_the_formula():
    generator = torch.Generator().manual_seed(0)
    # spread over [-3, 3]: both branches of the Huber loss, both signs of u
    quantiles = torch.randn(5, 7, generator=generator) * 1.5
    target = torch.randn(5, 7, generator=generator) * 1.5
    ours = float(qrdqn.quantile_huber_loss(quantiles, target))
    assert ours == pytest.approx(loss_by_loops(quantiles, target), rel=1e-5)


def test_quantile_huber_loss_against_sb3_contrib():
    utils = pytest.importorskip("sb3_contrib.common.utils")
    generator = torch.Generator().manual_seed(1)
    quantiles = torch.randn(8, 10, generator=generator) * 2
    target = torch.randn(8, 10, generator=generator) * 2
    theirs = utils.quantile_huber_loss(quantiles, target, sum_over_quantiles=True)
    assert float(qrdqn.quantile_huber_loss(quantiles, target)) == pytest.approx(float(theirs))


def test_minimiser_is_the_huber_quantile_of_the_target():
    target = torch.tensor([[0.0, 10.0, 20.0]])
    quantiles = torch.zeros(1, 3, requires_grad=True)
    optimizer = torch.optim.SGD([quantiles], lr=0.5)
    for _ in range(2000):
        optimizer.zero_grad()
        qrdqn.quantile_huber_loss(quantiles, target).backward()
        optimizer.step()
    # tau = 1/6 near 0: (1 - tau) * theta (the quadratic part, from the atom 0) balances
    # tau * 1 from each of the two atoms above: theta = 2 tau / (1 - tau) = 0.4; tau = 1/2 at the
    # middle atom by symmetry; tau = 5/6 at 20 - 0.4
    assert quantiles.detach().tolist()[0] == pytest.approx([0.4, 10.0, 19.6], abs=0.01)


def test_target_takes_the_action_of_the_largest_mean_and_stops_at_termination():
    # 2 samples, 3 actions, 4 quantiles; action 1 has the largest mean in sample 0 though action 2
    # has the largest single quantile; sample 1 prefers action 0
    next_quantiles = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [-5.0, -5.0, -5.0, 9.0]],
            [[2.0, 3.0, 4.0, 5.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
        ]
    )
    rewards = torch.tensor([0.5, -1.0])
    terminated = torch.tensor([0.0, 1.0])
    target = qrdqn.quantile_target(next_quantiles, rewards, terminated, 0.9)
    expected = torch.empty(2, 4)
    for b in range(2):
        best = int(next_quantiles[b].mean(dim=1).argmax())
        expected[b] = rewards[b] + 0.9 * (1 - terminated[b]) * next_quantiles[b, best]
    assert torch.allclose(target, expected)
    assert target[0].tolist() == pytest.approx([1.4, 1.4, 1.4, 1.4])
    assert target[1].tolist() == [-1.0, -1.0, -1.0, -1.0]


def test_greedy_action_is_the_argmax_of_the_quantile_mean():
    net = qrdqn.QNetwork(4, 3, 5)
    obs = torch.randn(6, 4)
    expected = net.quantiles(obs).mean(dim=2).argmax(dim=1)
    assert torch.equal(net.get_greedy_action(obs), expected)
    assert int(net.get_greedy_action(obs[0])) == int(expected[0])


def test_sb3_contrib_gets_the_same_network_and_hyperparameters():
    pytest.importorskip("sb3_contrib")
    from benchmark import sb3_baseline

    a = qrdqn.Args()
    algo, same = sb3_baseline.SAME["qrdqn.py"]
    n_envs, kwargs = same(a)
    model = sb3_baseline.make_model(algo, "CartPole-v1", n_envs, kwargs, seed=0)
    theirs = [m for m in model.quantile_net.modules() if isinstance(m, torch.nn.Linear)]
    ours = [
        m for m in qrdqn.QNetwork(4, 2, a.n_quantiles).modules() if isinstance(m, torch.nn.Linear)
    ]
    assert [m.weight.shape for m in theirs] == [m.weight.shape for m in ours]
    assert model.n_quantiles == a.n_quantiles
    assert model.policy.optimizer.defaults["eps"] == pytest.approx(0.01 / a.batch_size)
    assert (model.batch_size, model.gradient_steps, model.target_update_interval, model.tau) == (
        a.batch_size,
        a.gradient_steps,
        a.target_network_frequency,
        a.tau,
    )
