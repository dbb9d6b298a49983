"""c51.py's maths: the categorical projection, the cross-entropy loss and the greedy action, checked
against cases computed by hand and against the paper's closed form of the projection."""

import pytest
import torch

from benchmark.runs import load_script

c51 = load_script("c51.py")
ATOMS5 = torch.linspace(-2.0, 2.0, 5)  # z = -2, -1, 0, 1, 2: delta_z = 1


def project(pmfs, rewards, terminated, gamma, atoms=ATOMS5):
    pmfs = torch.as_tensor(pmfs, dtype=torch.float32)
    pmfs = pmfs[None] if pmfs.dim() == 1 else pmfs
    rewards, terminated = (
        torch.as_tensor(x, dtype=torch.float32).expand(len(pmfs)) for x in (rewards, terminated)
    )
    return c51.categorical_projection(pmfs, rewards, terminated, gamma, atoms)


def closed_form(pmfs, rewards, terminated, gamma, atoms):
    """The paper's eq. 7: (Phi T z)_i = sum_j [1 - |clip(Tz_j) - z_i| / delta_z]_0^1 p_j, written
    independently of categorical_projection's floor/ceil split (O(atoms^2), fine for a test)."""
    delta_z = (atoms[-1] - atoms[0]) / (len(atoms) - 1)
    tz = (rewards[:, None] + gamma * (1 - terminated[:, None]) * atoms).clamp(atoms[0], atoms[-1])
    # (batch, j, i)
    weights = (1 - (tz[:, :, None] - atoms[None, None, :]).abs() / delta_z).clamp(0, 1)
    return (pmfs[:, :, None] * weights).sum(dim=1)


def test_projection_by_hand():
    # r = 0.25, gamma = 0.5: Tz = -0.75, -0.25, 0.25, 0.75, 1.25, i.e. a quarter or three quarters
    # past an atom
    pmf = [0.1, 0.2, 0.3, 0.2, 0.2]
    # z=-1 gets 0.75*0.1 + 0.25*0.2; z=0 gets 0.25*0.1 + 0.75*0.2 + 0.75*0.3 + 0.25*0.2; z=1 gets
    # 0.25*0.3 + 0.75*0.2 + 0.75*0.2; z=2 gets 0.25*0.2
    expected = torch.tensor([[0.0, 0.125, 0.45, 0.375, 0.05]])
    target = project(pmf, 0.25, 0.0, 0.5)
    assert torch.allclose(target, expected, atol=1e-6)
    # inside the support the projection keeps the mean: r + gamma * E[z] = 0.25 + 0.5 * 0.2
    assert (target * ATOMS5).sum().item() == pytest.approx(0.35, abs=1e-6)


def test_target_on_an_atom_keeps_its_mass_there_and_the_ends_clip():
    pmf = [0.1, 0.2, 0.3, 0.15, 0.25]
    # r = 1, gamma = 1: every atom lands on the next one (floor == ceil); the top one, at 3, clips
    # to 2
    assert torch.equal(project(pmf, 1.0, 0.0, 1.0), torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4]]))
    assert torch.equal(project(pmf, -1.0, 0.0, 1.0), torch.tensor([[0.3, 0.3, 0.15, 0.25, 0.0]]))
    # r = 0, gamma = 1: the identity
    assert torch.equal(project(pmf, 0.0, 0.0, 1.0), torch.tensor([pmf]))
    # far beyond the support: everything at the end atom
    assert torch.equal(project(pmf, 50.0, 0.0, 0.9), torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]]))
    assert torch.equal(project(pmf, -50.0, 0.0, 0.9), torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]]))
    # the default support (101 atoms, delta_z = 2): an even reward moves each atom's mass by whole
    # atoms
    atoms, pmfs = torch.linspace(-100.0, 100.0, 101), torch.rand(3, 101).softmax(dim=1)
    target = project(pmfs, 4.0, 0.0, 1.0, atoms)
    assert torch.equal(target[:, 2:-1], pmfs[:, :-3]) and torch.equal(
        target[:, :2], torch.zeros(3, 2)
    )
    assert torch.allclose(target[:, -1], pmfs[:, -3:].sum(dim=1))


def test_terminated_puts_all_mass_at_the_clipped_reward():
    pmf = [0.1, 0.2, 0.3, 0.15, 0.25]
    assert torch.allclose(
        project(pmf, 1.3, 1.0, 0.99), torch.tensor([[0.0, 0.0, 0.0, 0.7, 0.3]]), atol=1e-6
    )
    # on an atom
    assert torch.equal(project(pmf, -1.0, 1.0, 0.99), torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]]))
    # clipped to v_max
    assert torch.equal(project(pmf, 7.0, 1.0, 0.99), torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]]))
    # to v_min
    assert torch.equal(project(pmf, -7.0, 1.0, 0.99), torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize(
    "n_atoms,v_min,v_max", [(101, -100.0, 100.0), (51, -10.0, 10.0), (2, 0.0, 1.0)]
)
def test_projection_conserves_mass_and_matches_the_closed_form(n_atoms, v_min, v_max):
    torch.manual_seed(0)
    atoms, batch = torch.linspace(v_min, v_max, n_atoms), 256
    pmfs = torch.randn(batch, n_atoms).softmax(dim=1)
    rewards = torch.randn(batch) * (v_max - v_min)  # many beyond the support
    rewards[:32] = atoms[torch.randint(0, n_atoms, (32,))]  # some exactly on an atom
    terminated = (torch.rand(batch) < 0.3).float()
    target = c51.categorical_projection(pmfs, rewards, terminated, 0.99, atoms)
    assert target.shape == pmfs.shape and (target >= 0).all()
    assert torch.allclose(target.sum(dim=1), torch.ones(batch), atol=1e-5)
    assert torch.allclose(target, closed_form(pmfs, rewards, terminated, 0.99, atoms), atol=1e-5)


def test_loss_is_the_cross_entropy_of_the_taken_actions_distribution():
    torch.manual_seed(1)
    target, logits = torch.rand(8, 5).softmax(dim=1), torch.randn(8, 5, requires_grad=True)
    loss = c51.categorical_loss(logits, target)
    expected = -(target * torch.log(logits.softmax(dim=1))).sum(dim=1).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    # the minimum is at the target itself, where the loss is the target's entropy and the gradient
    # vanishes
    at_target = target.log().clone().requires_grad_(True)
    best = c51.categorical_loss(at_target, target)
    best.backward()
    assert best.item() == pytest.approx(-(target * target.log()).sum(dim=1).mean().item(), abs=1e-6)
    assert at_target.grad.abs().max() < 1e-6 and best.item() < loss.item()


def greedy_test_network():
    """A QNetwork whose output ignores the observation: over atoms (-10, 0, 10), action 0 is sure of
    0 (the most probable single atom of all), action 1 gives -10 or 10 with probabilities 0.4, 0.6
    (mean 2)."""
    net = c51.QNetwork(obs_dim=3, n_actions=2, n_atoms=3, v_min=-10.0, v_max=10.0)
    pmfs = torch.tensor([[1e-6, 1.0, 1e-6], [0.4, 1e-6, 0.6]])
    with torch.no_grad():
        net.network[-1].weight.zero_()
        net.network[-1].bias.copy_(pmfs.log().flatten())
    return net


def test_greedy_action_maximises_the_expected_return():
    net, obs = greedy_test_network(), torch.randn(4, 3)
    # sum_i p_i z_i
    assert torch.allclose(net(obs), torch.tensor([[0.0, 2.0]]).expand(4, 2), atol=1e-3)
    assert (net(obs).argmax(dim=1) == 1).all(), (
        "the greedy action is the mean's argmax, not the likeliest atom's"
    )
    pmfs = c51.greedy_pmfs(net.logits(obs), net.atoms)
    assert torch.allclose(pmfs, torch.tensor([[0.4, 0.0, 0.6]]).expand(4, 3), atol=1e-5)


def test_atoms_are_saved_with_the_network():
    net = c51.QNetwork(4, 2, 11, -5.0, 5.0)
    assert torch.equal(net.state_dict()["atoms"], torch.linspace(-5.0, 5.0, 11))
    other = c51.QNetwork(4, 2, 11, -5.0, 5.0)
    other.load_state_dict(net.state_dict())
    obs = torch.randn(6, 4)
    assert torch.equal(other(obs), net(obs)) and net.logits(obs).shape == (6, 2, 11)


@pytest.mark.parametrize(
    "flags,expected",
    [
        ({"v_min": 10.0, "v_max": 10.0}, "--v-min 10.0 must be below --v-max 10.0"),
        ({"v_min": 5.0, "v_max": -5.0}, "--v-min 5.0 must be below --v-max -5.0"),
        ({"n_atoms": 1}, "--n-atoms 1 is out of range"),
    ],
)
def test_bad_support_is_a_one_line_error(flags, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        c51.check_args(c51.Args(**flags))
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        exit_.value.code == 2
        and len(lines) == 1
        and lines[0].startswith("error:")
        and expected in lines[0]
    )


def test_c51_atari_has_the_same_maths_and_its_network_gives_a_distribution_per_action():
    """c51_atari.py's target, projection and loss are c51.py's, line for line (so the cases above
    cover them); its Nature CNN gives n_atoms logits per action, and forward() is the expectation
    under their softmax."""
    import inspect

    atari = load_script("c51_atari.py")
    for name in ("greedy_pmfs", "categorical_projection", "categorical_loss"):
        assert inspect.getsource(getattr(atari, name)) == inspect.getsource(getattr(c51, name)), (
            name
        )
    torch.manual_seed(0)
    net = atari.QNetwork(4)  # the paper's Atari support: 51 atoms in [-10, 10]
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    logits = net.logits(x)
    assert logits.shape == (3, 4, 51) and torch.equal(net.atoms, torch.linspace(-10, 10, 51))
    assert torch.allclose(net(x), (logits.softmax(-1) * net.atoms).sum(-1))
    assert atari.Args().n_atoms == 51 and (atari.Args().v_min, atari.Args().v_max) == (-10.0, 10.0)
