"""Aggregate per-seed scores and give a verdict against a reference.

Descriptive: IQM (interquartile mean, the mean of the middle 50% of the scores:
scipy.stats.trim_mean(x, 0.25), as rliable) with rliable's 95% CI, a percentile bootstrap stratified
by task (scipy.stats.bootstrap with one sample per task and paired=False resamples within each task,
never across; with one task it is the ordinary bootstrap over seeds).

The verdict (RULE, verdict()) uses neither. With 3 seeds the percentile bootstrap's upper bound is
the best seed (three resamples all equal to the best one have probability 1/27 > 2.5%), so "the CI
reaches the reference" read "the best seed does". The verdict compares like with like instead, our
mean over seeds with the reference's mean over seeds, on scores normalised so that reward offsets do
not matter (random policy 0, reference 1; see scale()), by two one-sided tests, each at 2.5%:
1. ours against the reference mean, with the Student t-interval of our mean (n - 1 degrees of
   freedom, sample
   std). It is exact for normal scores and widens as seeds get fewer (t_0.975 = 2.78 at 5 seeds).
   The percentile bootstrap of the mean at 5 seeds is about 0.63x as wide (1.96 x the ddof-0 std
   against 2.78 x the ddof-1 std) and misses the true mean on the low side about 8% of the time, not
   2.5%, so it would fail runs drawn from the reference's own distribution about one time in twelve.
2. ours against the reference's own seed spread: a two-sample t-test whose variance is the
   reference's (ddof 1,
   n_ref - 1 degrees of freedom): under "our seeds vary as the reference's do" the difference of the
   means has std s_ref * sqrt(1/n + 1/n_ref). Test 1 alone passes a bimodal result such as CartPole
   [500, 500, 100, 100, 100] (its own spread makes its t-interval reach 532); seeds at 100 are far
   outside a reference of 490.04 +- 6.12.
A result whose seeds truly follow the reference's distribution fails 1 or 2 at most 5% of the time,
less with the margin (tests/test_benchmark.py measures the pass rate on such draws).
"""

from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000  # of the IQM's bootstrap
# below this the t-interval is too wide (t_0.975 = 4.30 at 3 seeds) for a verdict worth stating
MIN_SEEDS = 5
# of the normalised scale: differences this small (env versions, scoring details) are not failures
MARGIN = 0.05
# the scale is at least this fraction of (solved - random): a reference at random level
# (MountainCar)
FLOOR = 0.05
_Q = 0.5 + CONFIDENCE / 2
RULE = (
    f"needs >= {MIN_SEEDS} seeds of ours (fewer: no verdict) and the env's random-policy score "
    "(benchmark/random_scores.toml). Scores are normalised as (score - random) / scale with "
    f"scale = max(reference mean - random, {FLOOR:.0%} of (solved - random)), solved = the env's "
    "Gymnasium reward_threshold: random = 0 and reference = 1, except for a reference that close "
    "to random (PPO's MountainCar-v0: -200 = random), where the floor keeps the scale finite and "
    "the reference stays at (reference - random) / scale. Our mean over seeds is compared with "
    f"the reference's mean over seeds. FAIL when (1) the upper end of the {CONFIDENCE:.0%} "
    "Student t-interval of our normalised mean is below the reference's normalised mean - "
    f"{MARGIN:g}, or (2) our normalised mean is below the reference's normalised mean - "
    f"{MARGIN:g} - t_{_Q:g}(n_ref - 1) x s_ref x sqrt(1/n + 1/n_ref), s_ref the reference's "
    "normalised std over its n_ref seeds (ddof 1; test 2 only where the reference gives a std "
    "and >= 2 seeds): shown worse by our own seeds' spread, or by the reference's. PASS "
    f"otherwise, which says 'not shown worse than the reference by more than {MARGIN:g} of the "
    "scale', not 'shown equal'. A reference made from these very runs: self, no verdict."
)


def iqm(*task_scores) -> float:
    """Interquartile mean of all the scores pooled (one array per task)."""
    return float(stats.trim_mean(np.concatenate([np.ravel(s) for s in task_scores]), 0.25))


def iqm_ci(
    *task_scores, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap CI of the IQM, stratified by task (one array of per-seed scores per
    task)."""
    samples = [np.asarray(s, dtype=float).ravel() for s in task_scores]
    # nothing to resample: the CI is the point
    if all(len(s) < 2 or np.ptp(s) == 0 for s in samples):
        value = iqm(*samples)
        return value, value
    res = stats.bootstrap(
        samples,
        iqm,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        paired=False,
        vectorized=False,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def mean_ci(scores, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student t-interval of the mean (sample std, n - 1 degrees of freedom); at least 2 scores."""
    x = np.asarray(scores, dtype=float)
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


@dataclass
class Summary:
    n: int
    mean: float
    std: float  # over seeds, ddof 0 (as CleanRL reports)
    iqm: float
    ci_low: float
    ci_high: float


def summarize(scores) -> Summary:
    x = np.asarray(scores, dtype=float)
    low, high = iqm_ci(x)
    return Summary(len(x), float(x.mean()), float(x.std()), iqm(x), low, high)


def scale(ref_mean: float, random: float, solved: float | None) -> float | None:
    """The normalising scale: reference - random, floored at FLOOR x (solved - random) so that a
    reference at (or below) random level does not divide by zero; None when that is needed and the
    env has no `solved`."""
    floor = FLOOR * (solved - random) if solved is not None else 0.0
    s = max(ref_mean - random, floor)
    return s if s > 0 else None


@dataclass
class Verdict:
    label: str  # PASS, FAIL, no verdict, self, n/a (no reference)
    why: str = ""  # which test failed, or why there is no verdict
    mean: float | None = None  # ours, normalised, with its t-interval
    low: float | None = None
    high: float | None = None
    reference: float | None = None  # the reference's mean, normalised (1 unless floored)


def verdict(
    scores,
    ref_mean: float | None,
    ref_std: float | None = None,
    ref_seeds: int = 0,
    random: float | None = None,
    solved: float | None = None,
    self_reference: bool = False,
) -> Verdict:
    """RULE on our per-seed scores against a reference (mean, std over seeds with ddof 0, number of
    seeds), given the env's random-policy score and Gymnasium reward_threshold (`solved`);
    self_reference: the reference is made from these runs."""
    x = np.asarray(scores, dtype=float)
    if ref_mean is None:
        return Verdict("n/a", "no reference")
    if self_reference:
        return Verdict("self", "the reference is made from these runs")
    if len(x) < MIN_SEEDS:
        return Verdict("no verdict", f"{len(x)} seeds, {MIN_SEEDS} needed")
    if random is None:
        return Verdict("no verdict", "no random-policy score for the env")
    s = scale(ref_mean, random, solved)
    if s is None:
        return Verdict(
            "no verdict", "reference not above random and no reward_threshold for a fallback scale"
        )
    mean, low, high, ref = (float((v - random) / s) for v in (x.mean(), *mean_ci(x), ref_mean))
    if high < ref - MARGIN:
        return Verdict("FAIL", "(1) our t-interval is below the reference", mean, low, high, ref)
    if ref_std is not None and ref_seeds >= 2:
        s_ref = ref_std * np.sqrt(ref_seeds / (ref_seeds - 1)) / s
        allowed = MARGIN + stats.t.ppf(_Q, ref_seeds - 1) * s_ref * np.sqrt(
            1 / len(x) + 1 / ref_seeds
        )
        if mean < ref - allowed:
            return Verdict(
                "FAIL", "(2) our mean is below the reference's seed spread", mean, low, high, ref
            )
    return Verdict("PASS", "", mean, low, high, ref)
