"""Aggregate per-seed scores (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice") and give a
verdict against a reference.

IQM (interquartile mean) = mean of the middle 50% of the scores (scipy.stats.trim_mean(x, 0.25), as rliable).
Its 95% confidence interval is rliable's: a percentile bootstrap, stratified by task (runs are resampled with
replacement within each task, never across tasks). scipy.stats.bootstrap with one sample per task and
paired=False resamples each sample independently, which is that stratified bootstrap; with one task (one env)
it is the ordinary bootstrap over seeds.
"""
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000
# The verdict rule: a cell FAILS when the upper end of our IQM's 95% CI lies below
# reference mean - tolerance, with tolerance = max(TOL_STDS * reference std, TOL_FRAC * |reference mean|).
# Higher scores are better (returns, win rates). Anything else passes: the data do not show us worse.
TOL_STDS = 1.0
TOL_FRAC = 0.05
RULE = (f"FAIL when the upper end of our IQM's {CONFIDENCE:.0%} bootstrap CI is below reference mean - tolerance, "
        f"tolerance = max({TOL_STDS:g} x reference std, {TOL_FRAC:.0%} of |reference mean|); PASS otherwise. "
        "With few seeds the CI is wide, so a PASS says 'not shown worse', not 'shown equal'.")


def iqm(*task_scores) -> float:
    """Interquartile mean of all the scores pooled (one array per task)."""
    return float(stats.trim_mean(np.concatenate([np.ravel(s) for s in task_scores]), 0.25))


def iqm_ci(*task_scores, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
           seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap CI of the IQM, stratified by task (one array of per-seed scores per task)."""
    samples = [np.asarray(s, dtype=float).ravel() for s in task_scores]
    if all(len(s) < 2 or np.ptp(s) == 0 for s in samples):  # nothing to resample: the CI is the point
        value = iqm(*samples)
        return value, value
    res = stats.bootstrap(samples, iqm, n_resamples=resamples, confidence_level=confidence, method="percentile",
                          paired=False, vectorized=False, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


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


def tolerance(ref_mean: float, ref_std: float | None) -> float:
    return max(TOL_STDS * (ref_std or 0.0), TOL_FRAC * abs(ref_mean))


def verdict(summary: Summary, ref_mean: float | None, ref_std: float | None) -> str:
    """'PASS' or 'FAIL' by RULE; 'n/a' without a reference."""
    if ref_mean is None:
        return "n/a"
    return "FAIL" if summary.ci_high < ref_mean - tolerance(ref_mean, ref_std) else "PASS"
