"""The hand-designed baselines of RL^2's tables, computed here on the same task distributions as
algos/rl2.py's envs (canonrl/envs.py): Bernoulli bandits with k arms, p_i ~ Uniform[0, 1], and
n pulls per trial; random tabular MDPs (10 states, 5 actions, episodes of 10 steps from state 0,
mean rewards ~ Normal(1, 1) with unit noise, transitions ~ Dirichlet(1)) and n episodes per trial.

    python benchmark/meta_baselines.py                   # every row, as a markdown table
    python benchmark/meta_baselines.py --report          # and the report: beside the paper's
                                                         # table and our rl2.py runs, with verdicts

Bandits: random; greedy (the arm of highest posterior mean, Beta(1, 1) prior); Thompson sampling;
UCB1 (posterior mean + c * sqrt(2 ln t / (pulls + 1)), c tuned on a grid on other trials, as
Duan et al. tuned theirs); and where n is small enough, the Bayes-optimal policy's exact value
(dynamic programming over the arms' posterior counts): the most any algorithm can expect, above the
paper's Gittins index policy. MDPs: random, and posterior sampling (PSRL, Osband et al. 2013: a
task drawn from the posterior, Dirichlet(1 + counts) transitions and Normal rewards with a
Normal(1, 1) prior on the means, before each episode, then its optimal finite-horizon policy) and
greedy (the same with the posterior's mean in place of a draw; the paper's greedy is named so,
with a prior it does not give).
A trial's return is its total reward; each figure is the mean over `trials` trials with its
standard error.
"""

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # `python benchmark/meta_baselines.py`: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HORIZON, STATES, ACTIONS = 10, 10, 5  # canonrl.envs.RandomMDP's
# Duan et al. 2016 (arXiv:1611.02779), Table 1 (bandits, n pulls of k arms) and Table 2 (random
# MDPs, n episodes): the mean total reward of each policy; (n, k) or n -> {policy: value}
PAPER_BANDITS = {
    (n, k): dict(zip(("random", "Gittins", "TS", "OTS", "UCB1", "eps-greedy", "greedy", "RL2"), v))
    for (n, k), v in {
        (10, 5): (5.0, 6.6, 5.7, 6.5, 6.7, 6.6, 6.6, 6.7),
        (10, 10): (5.0, 6.6, 5.5, 6.2, 6.7, 6.6, 6.6, 6.7),
        (10, 50): (5.1, 6.5, 5.2, 5.5, 6.6, 6.5, 6.5, 6.8),
        (100, 5): (49.9, 78.3, 74.7, 77.9, 78.0, 75.4, 74.8, 78.7),
        (100, 10): (49.9, 82.8, 76.7, 81.4, 82.4, 77.4, 77.1, 83.5),
        (100, 50): (49.8, 85.2, 64.5, 67.7, 84.3, 78.3, 78.0, 84.9),
    }.items()
}
PAPER_MDPS = {
    n: dict(zip(("random", "PSRL", "OPSRL", "UCRL2", "BEB", "eps-greedy", "greedy", "RL2"), v))
    for n, v in {
        10: (100.1, 138.1, 144.1, 146.6, 150.2, 132.8, 134.8, 156.2),
        25: (250.2, 408.8, 425.2, 424.1, 427.8, 377.3, 368.8, 445.7),
    }.items()
}


def bandit_trials(policy: str, k: int, n: int, trials: int, seed: int, c: float = 0.0):
    """Total rewards of `trials` trials of a policy on k-armed Bernoulli bandits, n pulls each,
    all trials side by side."""
    rng = np.random.default_rng(seed)
    probs = rng.uniform(size=(trials, k))
    wins = np.zeros((trials, k))
    pulls = np.zeros((trials, k))
    total = np.zeros(trials)
    rows = np.arange(trials)
    for t in range(n):
        mean = (wins + 1) / (pulls + 2)  # the Beta(1, 1) posterior's
        tie = rng.uniform(size=(trials, k)) * 1e-9  # ties broken at random
        if policy == "random":
            arm = rng.integers(k, size=trials)
        elif policy == "greedy":
            arm = (mean + tie).argmax(1)
        elif policy == "thompson":
            arm = rng.beta(wins + 1, pulls - wins + 1).argmax(1)
        elif policy == "ucb1":
            arm = (mean + c * np.sqrt(2 * np.log(t + 1) / (pulls + 1)) + tie).argmax(1)
        else:
            raise ValueError(policy)
        reward = rng.uniform(size=trials) < probs[rows, arm]
        wins[rows, arm] += reward
        pulls[rows, arm] += 1
        total += reward
    return total


def bayes_optimal_bandit(k: int, n: int) -> float:
    """The Bayes-optimal expected total reward of n pulls of a k-armed Bernoulli bandit with
    Uniform[0, 1] (Beta(1, 1)) priors: dynamic programming over the posterior counts. A state is
    the sorted tuple of (wins, losses) of the arms pulled so far (the others are alike)."""

    @functools.cache
    def value(arms: tuple, left: int) -> float:
        if left == 0:
            return 0.0
        options = [*arms] + ([(0, 0)] if len(arms) < k else [])
        best = 0.0
        for i, (w, f) in enumerate(options):
            rest = [*options[:i], *options[i + 1 :]]
            rest = [a for a in rest if a != (0, 0)]
            p = (w + 1) / (w + f + 2)
            win = tuple(sorted([*rest, (w + 1, f)]))
            loss = tuple(sorted([*rest, (w, f + 1)]))
            best = max(best, p * (1 + value(win, left - 1)) + (1 - p) * value(loss, left - 1))
        return best

    return value((), n)


def tune_ucb1(k: int, n: int, trials: int, seed: int) -> float:
    """The c of UCB1 with the highest mean on its own trials (seed apart from the reported ones)."""
    grid = np.round(np.arange(0.0, 1.01, 0.05), 2)
    return float(max(grid, key=lambda c: bandit_trials("ucb1", k, n, trials, seed, c).mean()))


def finite_horizon_policy(means, transitions):
    """The optimal policy of an MDP over HORIZON steps: policy[t, s] (backward induction)."""
    v = np.zeros(STATES)
    policy = np.zeros((HORIZON, STATES), dtype=np.int64)
    for t in reversed(range(HORIZON)):
        q = means + transitions @ v
        policy[t] = q.argmax(1)
        v = q.max(1)
    return policy


def mdp_trials(policy: str, n: int, trials: int, seed: int):
    """Total rewards of `trials` trials (n episodes of one random MDP each) of random actions,
    PSRL, or greedy (the optimal policy of the posterior's mean MDP, planned before each
    episode)."""
    rng = np.random.default_rng(seed)
    totals = np.zeros(trials)
    for i in range(trials):
        means = rng.normal(1.0, 1.0, (STATES, ACTIONS))
        transitions = rng.dirichlet(np.ones(STATES), (STATES, ACTIONS))
        counts = np.zeros((STATES, ACTIONS, STATES))
        reward_sum = np.zeros((STATES, ACTIONS))
        visits = np.zeros((STATES, ACTIONS))
        for _ in range(n):
            if policy == "psrl":  # Normal(1, 1) prior, unit noise: the posterior of each mean
                var = 1.0 / (1.0 + visits)
                sampled = rng.normal(var * (1.0 + reward_sum), np.sqrt(var))
                p = np.apply_along_axis(rng.dirichlet, 2, 1.0 + counts)
                plan = finite_horizon_policy(sampled, p)
            elif policy == "greedy":
                mean_reward = (1.0 + reward_sum) / (1.0 + visits)
                p = (1.0 + counts) / (1.0 + counts).sum(2, keepdims=True)
                plan = finite_horizon_policy(mean_reward, p)
            s = 0
            for t in range(HORIZON):
                a = int(rng.integers(ACTIONS)) if policy == "random" else int(plan[t, s])
                r = means[s, a] + rng.normal()
                s2 = int(rng.choice(STATES, p=transitions[s, a]))
                counts[s, a, s2] += 1
                reward_sum[s, a] += r
                visits[s, a] += 1
                totals[i] += r
                s = s2
    return totals


def baselines(trials: int, mdp_count: int, seed: int) -> dict:
    """{(n, k) of a bandit, or n of an MDP: {policy: (mean, standard error)}} computed here; UCB1's
    tuned c under "ucb1_c", the Bayes-optimal value (exact, no error) where n <= 10."""
    rows = {}
    for n, k in PAPER_BANDITS:
        c = tune_ucb1(k, n, trials // 10, seed + 1)
        row = {}
        for policy in ("random", "greedy", "thompson", "ucb1"):
            x = bandit_trials(policy, k, n, trials, seed, c)
            row[policy] = (float(x.mean()), float(x.std() / np.sqrt(len(x))))
        row["ucb1_c"] = c
        if n <= 10:
            row["bayes_optimal"] = (bayes_optimal_bandit(k, n), 0.0)
        rows[(n, k)] = row
        print(f"bandit n={n}, k={k}: {row}", flush=True)
    for n in PAPER_MDPS:
        row = {}
        for policy in ("random", "greedy", "psrl"):
            x = mdp_trials(policy, n, mdp_count, seed)
            row[policy] = (float(x.mean()), float(x.std() / np.sqrt(len(x))))
        rows[n] = row
        print(f"MDP n={n}: {row}", flush=True)
    return rows


def ours(setting) -> tuple[str, list[float]] | None:
    """The id and per-seed scores of our rl2.py reference of a setting ((n, k) of a bandit or n of
    an MDP) in benchmark/references.toml, the longest budget where there are several."""
    from benchmark.references import load_references

    env_id = f"BernoulliBandit-k{setting[1]}-v0" if isinstance(setting, tuple) else "RandomMDP-v0"
    n = setting[0] if isinstance(setting, tuple) else setting
    found = [
        r
        for r in load_references()
        if r.script == "rl2.py"
        and r.env_id == env_id
        and r.values
        and r.id.startswith("ours-")
        and r.flags[r.flags.index("--episodes-per-trial") + 1 :][:1] == [str(n)]
    ]
    if not found:
        return None
    r = max(found, key=lambda r: r.total_timesteps)
    return r.id, r.values


def report_lines(rows: dict, trials: int, mdp_count: int) -> list[str]:
    """The report's table: the paper's numbers, ours computed here, our rl2.py runs and their
    verdicts (benchmark/stats.py) against the paper's RL^2 and, where known, the Bayes-optimal
    value; the random policy (computed here) is the 0 of the normalised scale."""
    from benchmark import stats

    # the random policy's score is computed here, per setting
    rule = stats.RULE.replace(
        "the env's random-policy score (benchmark/random_scores.toml)",
        "the random policy's score computed here",
    )

    def cell(v):
        return f"{v[0]:.2f} ± {v[1]:.2f}" if v[1] else f"{v[0]:.3f}"

    lines = [
        "| setting | paper (bandits: random, Gittins, TS, UCB1, greedy; MDPs: random, PSRL, UCRL2, "
        "BEB, greedy), RL^2 | here: random | greedy | "
        "Thompson | UCB1 (c) | Bayes-optimal | rl2.py (seeds: mean ± std, lowest) | "
        "vs paper's RL^2 | vs Bayes-optimal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, row in rows.items():
        bandit = isinstance(setting, tuple)
        paper = PAPER_BANDITS[setting] if bandit else PAPER_MDPS[setting]
        names = (
            ("random", "Gittins", "TS", "UCB1", "greedy")
            if bandit
            else ("random", "PSRL", "UCRL2", "BEB", "greedy")
        )
        name = f"bandit n={setting[0]}, k={setting[1]}" if bandit else f"MDP n={setting}"
        found = ours(setting)
        runs, vs_paper, vs_optimal = "not run", "-", "-"
        if found:
            ref_id, values = found
            x = np.asarray(values)
            runs = f"{len(x)}: {x.mean():.3f} ± {x.std():.3f}, {x.min():.3f} ({ref_id})"
            rnd = row["random"][0]
            v = stats.verdict(x, paper["RL2"], random=rnd)
            vs_paper = f"{v.label} ({v.mean:.2f} vs {v.reference:.2f})" if v.mean else v.label
            if "bayes_optimal" in row:
                v = stats.verdict(x, row["bayes_optimal"][0], random=rnd)
                vs_optimal = f"{v.label} ({v.mean:.2f} vs 1)" if v.mean else v.label
        here = [
            cell(row["random"]),
            cell(row["greedy"]) if "greedy" in row else "-",
            cell(row["thompson"]) if "thompson" in row else f"PSRL {cell(row['psrl'])}",
            f"{cell(row['ucb1'])} ({row['ucb1_c']})" if "ucb1" in row else "-",
            cell(row["bayes_optimal"]) if "bayes_optimal" in row else "-",
        ]
        lines.append(
            f"| {name} | {', '.join(f'{paper[k]}' for k in names)}, {paper['RL2']} | "
            f"{' | '.join(here)} | {runs} | {vs_paper} | {vs_optimal} |"
        )
    return lines + [
        "",
        f"Computed here: {trials:,} trials per bandit figure, {mdp_count:,} per MDP figure (± is "
        "the standard error of the mean). Verdicts: " + rule,
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trials", type=int, default=100_000, help="trials per bandit figure")
    p.add_argument("--mdp-trials", type=int, default=2_000, help="trials per MDP figure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", action="store_true", help="write benchmark/reports/meta/...md")
    a = p.parse_args(argv)
    rows = baselines(a.trials, a.mdp_trials, a.seed)
    lines = report_lines(rows, a.trials, a.mdp_trials)
    print("\n".join(lines))
    if a.report:
        from benchmark.report_path import REPORTS, new_report_path

        path = new_report_path(REPORTS, "meta", "cpu")
        path.write_text(
            "# RL^2 beside the paper's tables and the baselines computed here\n\n"
            "`python benchmark/meta_baselines.py --report`. The paper's columns are Duan et al. "
            "2016, Tables 1 and 2 (arXiv:1611.02779); ours are the same policies on the task "
            "distributions of canonrl/envs.py, and rl2.py's runs are its references in "
            "benchmark/references.toml (final greedy evaluation on new tasks).\n\n"
            + "\n".join(lines)
            + "\n"
        )
        print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
