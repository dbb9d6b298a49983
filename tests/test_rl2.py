"""rl2.py and its task envs: a trial keeps one task for its n episodes and draws a new one at reset;
its inputs carry the previous action, reward and episode end; the GRU's state is zeroed where a
trial starts and nowhere else (the stretches it runs in one call equal a step-by-step loop); the
update recomputes the rollout's log-probabilities; and the baselines' maths (the Bayes-optimal
bandit value, the bandit simulation, PSRL's planner) against brute force."""

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import one_error_line, record_ppo_loss

from benchmark import meta_baselines
from benchmark.runs import load_script

rl2 = load_script("rl2.py")


def test_a_trial_keeps_its_task_for_n_episodes_and_draws_a_new_one_at_reset():
    env = rl2.make_env("RandomMDP-v0", episodes_per_trial=3)
    obs, _ = env.reset(seed=0)
    means = env.unwrapped.means.copy()
    assert obs.shape == (10 + 5 + 2,) and obs[0] == 1.0 and not obs[10:].any()  # state 0, no past
    steps, ends = 0, []
    terminated = False
    while not terminated:
        action = steps % 5
        obs, reward, terminated, truncated, _ = env.step(action)
        steps += 1
        assert not truncated and (env.unwrapped.means == means).all()
        previous = obs[10:]
        assert previous[action] == 1.0 and previous[:5].sum() == 1.0 and previous[5] == reward
        ends.append(previous[6])
        if previous[6] and steps < 30:  # an episode of the task ended: the next starts in state 0
            assert obs[0] == 1.0 and obs[:10].sum() == 1.0
    assert steps == 30 and [i for i, e in enumerate(ends) if e] == [9, 19, 29]
    env.reset()
    assert not (env.unwrapped.means == means).all(), "a new trial draws a new task"


def test_a_bandit_pays_its_arms_probability():
    env = rl2.make_env("BernoulliBandit-k5-v0", episodes_per_trial=4000)
    env.reset(seed=1)
    probs = env.unwrapped.probs
    rewards = [env.step(2)[1] for _ in range(4000)]
    assert abs(np.mean(rewards) - probs[2]) < 4 * np.sqrt(0.25 / 4000)
    assert gym.make("BernoulliBandit-k50-v0").action_space.n == 50


def stepwise_states(agent, x, state, starts):
    """The GRU one step at a time, each env's state zeroed where its trial starts."""
    num_envs = state.shape[1]
    outputs = []
    for inputs, start in zip(x.view(-1, num_envs, x.shape[-1]), starts.view(-1, num_envs)):
        state = (1.0 - start).view(1, -1, 1) * state
        output, state = agent.gru(inputs[None], state)
        outputs.append(output[0])
    return torch.cat(outputs), state


@pytest.mark.parametrize("pattern", ["together", "apart"])
def test_the_state_is_zeroed_where_a_trial_starts_and_the_stretches_equal_steps(pattern):
    torch.manual_seed(0)
    agent = rl2.Agent(n_inputs=4, n_actions=3, gru_size=8)
    T, N = 12, 3
    x = torch.randn(T * N, 4)
    starts = torch.zeros(T, N)
    if pattern == "together":  # trials of 5 steps, as in a vector env of one trial length
        starts[[0, 5, 10]] = 1.0
    else:
        starts[0, 0] = starts[4, 1] = starts[7, 2] = starts[9, 0] = 1.0
    state = torch.randn(1, N, 8)
    out, last = agent.get_states(x, state, starts.flatten())
    expected, expected_last = stepwise_states(agent, x, state, starts.flatten())
    assert torch.allclose(out, expected, atol=1e-6) and torch.allclose(
        last, expected_last, atol=1e-6
    )
    # a start makes the outputs from there on independent of what came before
    other = x.clone().view(T, N, 4)
    other[:5] = torch.randn(5, N, 4)
    changed, _ = agent.get_states(other.flatten(0, 1), torch.randn(1, N, 8), starts.flatten())
    same = (changed.view(T, N, 8) - out.view(T, N, 8)).abs().amax(-1) < 1e-6
    if pattern == "together":
        assert same[5:].all() and not same[:5].any()


def test_the_update_recomputes_the_rollouts_log_probabilities(tmp_path, monkeypatch):
    """Within a rollout that spans trial and episode ends, the update's first minibatch recomputes
    the rollout's log-probabilities exactly (the state is zeroed at trial starts only, from the
    stored initial state of each sequence)."""
    calls = record_ppo_loss(rl2, monkeypatch)
    args = rl2.Args(
        env_id="RandomMDP-v0",
        episodes_per_trial=2,
        total_timesteps=4 * 30 * 3,
        num_envs=4,
        num_steps=30,  # trials of 20 steps: a rollout starts mid-trial after the first
        num_minibatches=2,
        update_epochs=2,
        eval_episodes=3,
        run_dir=str(tmp_path / "run"),
    )
    rl2.main(args)
    firsts = calls[::4]
    assert len(firsts) == 3
    for new, old in firsts:
        assert torch.allclose(new, old, atol=1e-5)
    assert not torch.allclose(*calls[3], atol=1e-5)


def test_evaluate_gives_one_seeded_total_per_trial():
    torch.manual_seed(0)
    agent = rl2.Agent(n_inputs=1 + 5 + 2, n_actions=5, gru_size=8)
    returns = rl2.evaluate(agent, "BernoulliBandit-k5-v0", 10, trials=6, seed=3)
    assert len(returns) == 6 and all(r == int(r) and 0 <= r <= 10 for r in returns)
    assert returns == rl2.evaluate(agent, "BernoulliBandit-k5-v0", 10, trials=6, seed=3)
    assert rl2.evaluate(agent, "BernoulliBandit-k5-v0", 10, trials=0, seed=3) == []


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--env-id", "CartPole-v1"], "not a distribution of tasks"),
        (["--episodes-per-trial", "0"], "--episodes-per-trial 0"),
        (["--gru-size", "0"], "--gru-size 0"),
        (["--num-envs", "6", "--num-minibatches", "4"], "does not divide"),
    ],
)
def test_bad_input_is_one_line(flags, expected, tmp_path):
    assert expected in one_error_line("rl2.py", flags, tmp_path / "run")


def brute_force_bayes(k: int, n: int) -> float:
    """The Bayes-optimal value by enumerating every policy's decision tree value recursively over
    the full (unsorted) counts: no symmetry used."""

    def value(counts: tuple, left: int) -> float:
        if left == 0:
            return 0.0
        best = 0.0
        for i, (w, f) in enumerate(counts):
            p = (w + 1) / (w + f + 2)
            win = counts[:i] + ((w + 1, f),) + counts[i + 1 :]
            loss = counts[:i] + ((w, f + 1),) + counts[i + 1 :]
            best = max(best, p * (1 + value(win, left - 1)) + (1 - p) * value(loss, left - 1))
        return best

    return value(((0, 0),) * k, n)


def test_the_bayes_optimal_value_equals_brute_force():
    assert meta_baselines.bayes_optimal_bandit(2, 2) == pytest.approx(13 / 12)
    assert meta_baselines.bayes_optimal_bandit(1, 3) == pytest.approx(1.5)
    for k, n in itertools.product((2, 3, 4), (1, 3, 5)):
        assert meta_baselines.bayes_optimal_bandit(k, n) == pytest.approx(brute_force_bayes(k, n))


def test_the_bandit_simulation_matches_its_expectations():
    n, k, trials = 10, 5, 40_000
    x = meta_baselines.bandit_trials("random", k, n, trials, seed=0)
    assert abs(x.mean() - n / 2) < 4 * x.std() / np.sqrt(trials)
    best = meta_baselines.bayes_optimal_bandit(k, n)
    for policy in ("greedy", "thompson", "ucb1"):
        x = meta_baselines.bandit_trials(policy, k, n, trials, seed=1, c=0.2)
        assert x.mean() < best + 4 * x.std() / np.sqrt(trials), policy
    # the expected best arm of 5 uniform ones is 5/6: n pulls of it bound every policy from above
    assert best < n * 5 / 6


def test_the_finite_horizon_planner_is_optimal_by_enumeration():
    rng = np.random.default_rng(0)
    means = rng.normal(1.0, 1.0, (meta_baselines.STATES, meta_baselines.ACTIONS))
    transitions = rng.dirichlet(np.ones(meta_baselines.STATES), means.shape)
    policy = meta_baselines.finite_horizon_policy(means, transitions)

    def value(s, t, first_action=None):  # the expected return of the plan (or one deviation)
        if t == meta_baselines.HORIZON:
            return 0.0
        a = policy[t, s] if first_action is None else first_action
        return means[s, a] + sum(
            transitions[s, a, s2] * value(s2, t + 1) for s2 in range(meta_baselines.STATES)
        )

    t = meta_baselines.HORIZON - 3  # the last 3 steps: no single deviation does better
    for s in range(meta_baselines.STATES):
        best = value(s, t)
        assert all(value(s, t, a) <= best + 1e-9 for a in range(meta_baselines.ACTIONS))


def test_the_mdp_baselines_learn_within_a_trial():
    """Greedy (the posterior mean's plan) and PSRL gain on random play, and each gains from its
    first episode to its last: they learn the task within the trial, as rl2.py must."""
    n, trials = 10, 150
    rnd = meta_baselines.mdp_trials("random", n, trials, seed=3)
    for policy in ("greedy", "psrl"):
        x = meta_baselines.mdp_trials(policy, n, trials, seed=3)
        assert x.mean() > rnd.mean() + 20, policy
        first = meta_baselines.mdp_trials(policy, 1, trials, seed=3)  # the first episode alone
        assert x.mean() / n > first.mean() + 1, policy


def test_the_report_sets_our_runs_beside_the_papers_table_with_verdicts():
    rows = {
        (10, 5): {
            "random": (5.0, 0.01),
            "greedy": (6.63, 0.01),
            "thompson": (5.83, 0.01),
            "ucb1": (6.66, 0.01),
            "ucb1_c": 0.05,
            "bayes_optimal": (6.66, 0.0),
        },
        10: {"random": (100.4, 0.5), "greedy": (152.2, 0.6), "psrl": (133.2, 0.6)},
    }
    lines = meta_baselines.report_lines(rows, 100, 100)
    bandit = next(line for line in lines if line.startswith("| bandit n=10, k=5 |"))
    assert (
        "5.0, 6.6, 5.7, 6.7, 6.6, 6.7" in bandit and "ours-rl2-BernoulliBandit-k5-v0-n10" in bandit
    )
    assert bandit.count("PASS") + bandit.count("FAIL") == 2, bandit
    mdp = next(line for line in lines if line.startswith("| MDP n=10 |"))
    assert "156.2" in mdp and "PSRL 133.20" in mdp and "| 152.20 ± 0.60 |" in mdp
