"""rainbow_atari.py: the sum tree and the prioritised sampler against brute force, the n-step
windows at episode ends against a Python loop, the projection with gamma^k and Double Q, the noisy
layers, and a tiny MinAtar run that leaves the run contract behind and resumes."""

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import one_error_line

from benchmark.runs import load_script, read_metrics, run_script

m = load_script("rainbow_atari.py")


def stack(episode):
    """FrameStackObservation's stack of an episode's frames so far (padded with the first)."""
    return np.array([episode[max(0, len(episode) - 4 + j)] for j in range(4)], np.uint8)[
        :, None, None
    ]


def scripted(size=40, num_envs=2, steps=150, n_step=3, gamma=0.9, seed=0, rb_seed=0):
    """Steps stored as the script stores them, in envs whose 1x1 frames are numbered (a frame's
    number names its step): random rewards, a termination or a time-limit cut each ~10 steps.
    Returns the buffer, each env's steps in order and the frames each env wrote, in order."""
    rng = np.random.default_rng(seed)
    rb = m.PrioritizedReplayBuffer(
        size * num_envs,
        num_envs,
        (4, 1, 1),
        np.random.default_rng(rb_seed),
        n_step,
        gamma,
        0.5,
        1e-6,
    )
    counter = np.ones(num_envs, int)
    episodes = [[1] for _ in range(num_envs)]
    records, written = [[] for _ in range(num_envs)], [[] for _ in range(num_envs)]
    first = np.ones(num_envs, bool)
    for _ in range(steps):
        obs = np.stack([stack(ep) for ep in episodes])
        rewards = rng.normal(size=num_envs).astype(np.float32)
        terminated = rng.random(num_envs) < 0.1
        truncated = ~terminated & (rng.random(num_envs) < 0.1)
        actions = rng.integers(0, 4, num_envs)
        counter += 1
        for i in range(num_envs):
            if first[i]:
                written[i].append(episodes[i][-1])
            episodes[i].append(counter[i])
            written[i].append(counter[i])
        next_obs = np.stack([stack(ep) for ep in episodes])
        rb.add(obs, next_obs, actions, rewards, terminated, first)
        for i in range(num_envs):
            records[i].append(
                dict(
                    obs=obs[i],
                    next_obs=next_obs[i],
                    action=actions[i],
                    reward=rewards[i],
                    terminated=terminated[i],
                    truncated=truncated[i],
                )
            )
        first = terminated | truncated
        for i in np.flatnonzero(first):
            counter[i] += 1
            episodes[i] = [counter[i]]
    assert counter.max() < 256, "frame numbers fit in uint8"
    return rb, records, written


def n_step_by_loop(records, j, n_step, gamma):
    """The n-step transition that starts at step j, by a plain loop: (return, terminated, steps k,
    the stack k steps on), or None while its window is still open (fewer than n steps, and the
    episode has not ended, or ended by a time limit that the buffer has not yet seen)."""
    ret = 0.0
    for k in range(n_step):
        if j + k >= len(records):
            return None
        step = records[j + k]
        ret += gamma**k * float(step["reward"])
        if step["terminated"]:
            return ret, 1.0, k + 1, step["next_obs"]
        if step["truncated"]:  # the cut is seen when the next episode starts
            return (ret, 0.0, k + 1, step["next_obs"]) if j + k + 1 < len(records) else None
    return ret, 0.0, n_step, records[j + n_step - 1]["next_obs"]


def test_sum_tree_finds_the_leaf_where_the_running_sum_passes_u():
    rng = np.random.default_rng(0)
    tree = m.SumTree(37)  # 64 leaves, 27 never used
    leaves = rng.integers(0, 5, 37).astype(float)  # whole numbers: sums without rounding
    tree.update(np.arange(37), leaves)
    assert tree.total() == leaves.sum()
    inner = np.arange(1, tree.n)
    assert np.array_equal(tree.nodes[inner], tree.nodes[2 * inner] + tree.nodes[2 * inner + 1])
    u = rng.random(10_000) * leaves.sum()
    assert np.array_equal(tree.find(u), np.searchsorted(np.cumsum(leaves), u, side="right"))
    assert (leaves[tree.find(u)] > 0).all(), "a leaf of priority 0 is never found"
    # an update moves the sums above it only
    tree.update(np.array([3, 3, 20]), np.array([7.0, 7.0, 0.0]))
    leaves[3], leaves[20] = 7.0, 0.0
    assert tree.total() == leaves.sum() and np.array_equal(tree.leaves, leaves)
    assert np.array_equal(tree.nodes[inner], tree.nodes[2 * inner] + tree.nodes[2 * inner + 1])


def test_draws_follow_the_priorities_and_the_weights_are_brute_force():
    rb, _, _ = scripted(steps=120)
    stored = np.flatnonzero(rb.tree.leaves)
    assert len(stored) > 50
    assert (rb.tree.leaves[stored] == 1.0).all(), "new transitions come at max priority (1)"
    losses = np.random.default_rng(1).exponential(size=len(stored)) * 3
    rb.update_priorities(stored, losses)
    p_alpha = (losses + 1e-6) ** 0.5
    assert np.allclose(rb.tree.leaves[stored], p_alpha) and rb.max_priority == losses.max() + 1e-6
    expected = p_alpha / p_alpha.sum()
    counts, draws = np.zeros(len(rb.tree.leaves)), 0
    for _ in range(3000):
        (*_, weights), leaves = rb.sample(32, 0.6, "cpu")
        np.add.at(counts, leaves, 1)
        draws += 32
    freq = counts[stored] / draws
    assert counts.sum() == counts[stored].sum(), "only stored transitions are drawn"
    tol = 5 * np.sqrt(expected * (1 - expected) / draws) + 1e-4
    assert (np.abs(freq - expected) < tol).all(), np.abs(freq - expected).max()
    # importance weights of the last batch: (N P(i))^-beta / max_j, N the transitions stored
    n_stored, probs = len(stored), p_alpha[np.searchsorted(stored, leaves)] / p_alpha.sum()
    brute = (n_stored * probs) ** -0.6
    assert np.allclose(weights.numpy(), brute / brute.max(), rtol=1e-5)
    assert weights.max() == 1.0 and not np.allclose(weights.numpy(), 1.0)


def test_priorities_change_only_where_asked_and_new_transitions_get_the_max():
    rb, _, _ = scripted(steps=60)
    before = rb.tree.leaves.copy()
    asked = np.flatnonzero(before)[[0, 5, 9]]
    rb.update_priorities(asked, np.array([0.25, -4.0, 2.0]))  # |loss| + eps
    after = rb.tree.leaves.copy()
    assert np.allclose(after[asked], (np.array([0.25, 4.0, 2.0]) + 1e-6) ** 0.5)
    others = np.setdiff1d(np.arange(len(before)), asked)
    assert np.array_equal(after[others], before[others])
    assert rb.max_priority == pytest.approx(4.0 + 1e-6)
    # the next complete windows come at max_priority ** alpha
    obs = np.zeros((2, 4, 1, 1), np.uint8)
    for _ in range(4):
        rb.add(obs, obs, np.zeros(2, int), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool))
    new = np.flatnonzero((rb.tree.leaves != after) & (rb.tree.leaves > 0))
    assert len(new) >= 2 and np.allclose(rb.tree.leaves[new], (4.0 + 1e-6) ** 0.5)


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_n_step_windows_at_episode_ends_match_a_python_loop(n_step):
    """Two envs into a ring of 40 slots each that wraps several times. Every transition that may be
    drawn (priority > 0) is the loop's: a termination within the n steps cuts the sum and the
    bootstrap (terminated), a time-limit cut keeps the bootstrap from the true final observation
    with gamma^k, k < n; and every complete window whose frames the ring still holds may be
    drawn."""
    gamma = 0.9
    rb, records, written = scripted(steps=200, n_step=n_step, gamma=gamma)
    seen = {"terminated_early": 0, "cut_early": 0}
    for i in range(2):
        by_frame = {int(r["obs"][-1, 0, 0]): j for j, r in enumerate(records[i])}
        ring = set(written[i][-rb.size :])
        slots = np.flatnonzero(rb.tree.leaves[i * rb.size : (i + 1) * rb.size])
        drawn = {by_frame[int(rb.frames[i, t, 0, 0])]: t for t in slots}
        expected = {
            j
            for j in range(len(records[i]))
            if n_step_by_loop(records[i], j, n_step, gamma) is not None
            and set(records[i][j]["obs"].ravel()) <= ring
        }
        assert set(drawn) == expected
        for j, t in drawn.items():
            ret, done, k, next_obs = n_step_by_loop(records[i], j, n_step, gamma)
            env = np.array([i])
            assert rb.returns[i, t] == pytest.approx(ret, rel=1e-5, abs=1e-6)
            assert (rb.done[i, t], rb.horizon[i, t]) == (done, k)
            assert rb.actions[i, t] == records[i][j]["action"]
            assert np.array_equal(rb.stacks(env, np.array([t]))[0], records[i][j]["obs"])
            assert np.array_equal(rb.stacks(env, np.array([(t + k) % rb.size]))[0], next_obs)
            seen["terminated_early"] += done and k < n_step
            seen["cut_early"] += not done and k < n_step
    assert len(written[0]) > 4 * rb.size, "the ring wrapped"
    if n_step > 1:
        assert seen["terminated_early"] >= 5 and seen["cut_early"] >= 5, seen
    # the minibatch carries the same values, gamma^k and the weights
    (obs, next_obs, actions, returns, done, discounts, weights), leaves = rb.sample(64, 0.4, "cpu")
    env, slot = np.divmod(leaves, rb.size)
    assert np.array_equal(returns.numpy(), rb.returns[env, slot])
    assert np.allclose(discounts.numpy(), gamma ** rb.horizon[env, slot])
    assert np.array_equal(
        next_obs.numpy(), rb.stacks(env, (slot + rb.horizon[env, slot]) % rb.size)
    )
    assert obs.dtype == torch.uint8 and weights.shape == (64,)


def test_prioritised_buffer_survives_a_checkpoint(tmp_path):
    rb, _, _ = scripted(steps=80)
    stored = np.flatnonzero(rb.tree.leaves)
    rb.update_priorities(stored, np.linspace(0.1, 3.0, len(stored)))
    torch.save({"rb": rb.state_dict(), "rng": rb.rng.bit_generator.state}, tmp_path / "rb.pt")
    ckpt = torch.load(tmp_path / "rb.pt", weights_only=True)
    restored = m.PrioritizedReplayBuffer(
        80, 2, (4, 1, 1), np.random.default_rng(5), 3, 0.9, 0.5, 1e-6
    )
    restored.load_state_dict(ckpt["rb"])
    restored.rng.bit_generator.state = ckpt["rng"]
    assert restored.max_priority == rb.max_priority and restored.tree.total() == rb.tree.total()
    (a, la), (b, lb) = rb.sample(16, 0.5, "cpu"), restored.sample(16, 0.5, "cpu")
    assert np.array_equal(la, lb) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_projection_is_c51s_and_takes_gamma_to_the_k_per_sample():
    c51 = load_script("c51_atari.py")
    assert inspect.getsource(m.categorical_projection) == inspect.getsource(
        c51.categorical_projection
    )
    torch.manual_seed(0)
    atoms, batch = torch.linspace(-10.0, 10.0, 51), 64
    pmfs = torch.randn(batch, 51).softmax(dim=1)
    returns = torch.randn(batch) * 4
    terminated = (torch.rand(batch) < 0.3).float()
    k = torch.randint(1, 4, (batch,))
    discounts = 0.99**k
    got = m.categorical_projection(pmfs, returns, terminated, discounts[:, None], atoms)
    for b in range(batch):  # one sample at a time, with its gamma^k as a scalar
        one = m.categorical_projection(
            pmfs[b : b + 1], returns[b : b + 1], terminated[b : b + 1], float(discounts[b]), atoms
        )
        assert torch.allclose(got[b], one[0], atol=1e-6)
    # by hand: Tz_j = R + gamma^3 z_j with eq. 7's triangular split
    tz = (returns[:, None] + 0.99**3 * (1 - terminated[:, None]) * atoms).clamp(-10.0, 10.0)
    closed = (pmfs[:, :, None] * (1 - (tz[:, :, None] - atoms).abs() / 0.4).clamp(0, 1)).sum(1)
    three = m.categorical_projection(
        pmfs, returns, terminated, torch.full((batch, 1), 0.99**3), atoms
    )
    assert torch.allclose(three, closed, atol=1e-5)
    # terminated: all the mass on the (clipped) return, however far the next distribution lies
    end = m.categorical_projection(pmfs[:2], torch.tensor([1.4, 25.0]), torch.ones(2), 0.97, atoms)
    assert torch.allclose(end[0, 28:30], torch.tensor([0.5, 0.5]), atol=1e-5)
    assert end[1, -1] == pytest.approx(1.0) and end.sum() == pytest.approx(2.0)


def test_double_q_and_the_weighted_loss():
    # the online network prefers action 0; the target network action 1 (its mass on the highest
    # atom), whose own argmax DQN would take: Double Q projects the target's distribution of 0
    online_q = torch.tensor([[2.0, 1.0]])
    target_logits = torch.tensor([[[5.0, 0.0, 0.0], [0.0, 0.0, 3.0]]])
    got = m.double_q_pmfs(online_q, target_logits)
    assert torch.allclose(got, target_logits[0, 0].softmax(dim=0)[None])
    torch.manual_seed(0)
    q, q_target, n = m.QNetwork(3, 11, -2.0, 2.0), m.QNetwork(3, 11, -2.0, 2.0), 6
    batch = [
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 3, (n,)),
        torch.randn(n),
        (torch.rand(n) < 0.3).float(),
        0.99 ** torch.randint(1, 4, (n,)).float(),
    ]
    ones, losses, _ = m.q_loss(q, q_target, *batch, torch.ones(n))
    weights = torch.rand(n)
    weighted, same_losses, _ = m.q_loss(q, q_target, *batch, weights)
    assert torch.equal(losses, same_losses), "the noise is only drawn by reset_noise()"
    assert (losses > 0).all() and not losses.requires_grad
    assert ones.item() == pytest.approx(losses.mean().item(), rel=1e-6)
    assert weighted.item() == pytest.approx((weights * losses).mean().item(), rel=1e-6)


def test_noisy_linear_is_factorised_and_off_gives_the_mean_weights():
    torch.manual_seed(0)
    layer = m.NoisyLinear(16, 5, sigma0=0.5)
    assert torch.allclose(layer.weight_sigma, torch.full((5, 16), 0.5 / 4))
    assert torch.allclose(layer.bias_sigma, torch.full((5,), 0.5 / 4))
    assert layer.weight_mu.abs().max() <= 0.25 and layer.bias_mu.abs().max() <= 0.25
    x = torch.randn(7, 16)
    mean = F.linear(x, layer.weight_mu, layer.bias_mu)
    assert torch.equal(layer(x, noise=False), mean)
    torch.manual_seed(3)
    layer.reset_noise()
    torch.manual_seed(3)
    e_in, e_out = torch.randn(16), torch.randn(5)
    f_in, f_out = e_in.sign() * e_in.abs().sqrt(), e_out.sign() * e_out.abs().sqrt()
    assert torch.allclose(layer.eps_in, f_in) and torch.allclose(layer.eps_out, f_out)
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(f_out, f_in)  # eq. 10
    noisy = layer(x)
    assert torch.allclose(
        noisy, F.linear(x, weight, layer.bias_mu + layer.bias_sigma * f_out), atol=1e-6
    )
    assert not torch.allclose(noisy, mean) and torch.equal(layer(x), noisy)
    layer.reset_noise()
    assert not torch.allclose(layer(x), noisy), "resampling changes the output"
    assert torch.equal(layer(x, noise=False), mean), "the mean weights do not move"


def test_network_is_dueling_over_atoms_and_greedy_action_ignores_the_noise():
    torch.manual_seed(0)
    q = m.QNetwork(4, 21, -5.0, 5.0)
    x = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    logits = q.logits(x, noise=False)
    assert logits.shape == (6, 4, 21)
    h = q.network(x / 255.0)
    value = q.value[1](F.relu(q.value[0](h, False)), False)
    assert torch.allclose(logits.mean(dim=1), value, atol=1e-5), "mean_a (V + A - mean A) = V"
    assert torch.allclose(q(x), (logits.softmax(-1) * q.atoms).sum(-1))
    greedy, noisy_q = q.get_greedy_action(x), q(x, noise=True)
    q.reset_noise()
    assert torch.equal(q.get_greedy_action(x), greedy)
    assert not torch.allclose(q(x, noise=True), noisy_q)
    assert {"value.0.eps_in", "advantage.1.eps_out", "atoms"} <= set(q.state_dict())


def test_rollout_acts_noisy_and_evaluation_on_the_mean(monkeypatch):
    """The rollout acts through get_greedy_action with the noise on; evaluate() calls it without
    noise (the mean weights), so drawing new noise leaves the evaluation unchanged."""
    source = inspect.getsource(m.main)
    assert "q_network.get_greedy_action(" in source and "noise=True" in source
    assert ".argmax(" not in source
    torch.manual_seed(0)
    q, calls = m.QNetwork(3), []
    greedy = q.get_greedy_action
    monkeypatch.setattr(q, "get_greedy_action", lambda x, **kw: calls.append(kw) or greedy(x, **kw))
    returns = m.evaluate(q, "MinAtar/Breakout-v1", 1, 5)
    assert calls and all(not kw.get("noise", False) for kw in calls)
    q.reset_noise()
    assert m.evaluate(q, "MinAtar/Breakout-v1", 1, 5) == returns


def test_tiny_minatar_run_logs_the_metrics_and_resumes(tmp_path):
    flags = [
        "--env-id",
        "MinAtar/Breakout-v1",
        "--total-timesteps",
        "600",
        "--learning-starts",
        "200",
        "--batch-size",
        "16",
        "--buffer-size",
        "1000",
        "--eval-episodes",
        "1",
        "--save-model",
    ]
    run_dir = tmp_path / "run"
    out = run_script("rainbow_atari.py", flags, run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(run_dir)
    for name in (
        "train/episodic_return",
        "train/episodic_length",
        "eval/episodic_return",
        "charts/sps",
        "losses/td_loss",
        "losses/q_values",
        "charts/learning_rate",
        "charts/beta",
    ):
        assert name in metrics, name
    steps, betas = metrics["charts/beta"]
    assert np.allclose(betas, 0.4 + 0.6 * steps / 600) and (np.diff(betas) > 0).all()
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["rb"]["priorities"].shape == (1000,) and (ckpt["rb"]["priorities"] > 0).sum() > 400
    assert ckpt["rb"]["max_priority"] > 1.0, "the losses raised the highest priority"
    # model.pt alone evaluates to the returns logged at the end (the mean weights act)
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    net = m.QNetwork(saved["n_actions"], saved["n_atoms"], saved["v_min"], saved["v_max"])
    net.load_state_dict(saved["q_network"])
    assert m.evaluate(net, "MinAtar/Breakout-v1", 1, 1 + 100_000) == saved["eval_returns"]

    out = run_script(
        "rainbow_atari.py", ["--resume", str(run_dir), "--total-timesteps", "900"], fork=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    after = read_metrics(run_dir)
    assert after["losses/td_loss"][0].max() > 600 and after["eval/episodic_return"][0].max() == 900
    steps, betas = after["charts/beta"]
    assert np.allclose(betas[steps > 600], 0.4 + 0.6 * steps[steps > 600] / 900)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--n-step", "0"], "--n-step 0 is out of range"),
        (["--prioritized-replay-alpha", "1.5"], "--prioritized-replay-alpha 1.5 is out of range"),
        (["--prioritized-replay-beta", "0"], "--prioritized-replay-beta 0.0 is out of range"),
        (["--v-min", "5", "--v-max", "5"], "must be below --v-max"),
        (["--n-atoms", "1"], "--n-atoms 1 is out of range"),
        (["--learning-starts", "2", "--batch-size", "1"], "needs a complete n-step return"),
    ],
)
def test_bad_flags_give_one_line(flags, words, tmp_path):
    line = one_error_line(
        "rainbow_atari.py", ["--env-id", "MinAtar/Breakout-v1", *flags], tmp_path / "run"
    )
    assert line.startswith("error: ") and words in line, line
