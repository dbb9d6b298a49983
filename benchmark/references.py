"""Load benchmark/references.toml (the single source of truth for expected returns) and score
runs exactly as each entry defines its metric."""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REFERENCES = Path(__file__).resolve().parent / "references.toml"


def _last100_train(metrics):
    """Mean of the last 100 training episodes (CleanRL's number)."""
    _, values = metrics["train/episodic_return"]
    return float(values[-100:].mean())


def _eval_means(metrics, name="eval/episodic_return"):
    # multi-agent scripts say which return: eval/episodic_return_team, ..._agent_mean
    if name not in metrics:
        name = next((n for n in metrics if n.startswith(name)), name)
    steps, values = metrics[name]
    return [(s, float(values[steps == s].mean())) for s in np.unique(steps)]


def _final_eval(metrics):
    """Mean of the evaluation episodes logged at the last evaluation (the end of training)."""
    return _eval_means(metrics)[-1][1]


def _max_eval(metrics):
    """Maximum over training of the mean evaluation return (TD3 paper, Tianshou): optimistic by
    construction."""
    return max(m for _, m in _eval_means(metrics))


def _auc_eval(metrics):
    """Mean over all evaluations (every --eval-every steps and the final one) of the mean evaluation
    return: the area under the evaluation curve divided by its length. A run that learns later
    scores lower even if it ends as well."""
    return float(np.mean([m for _, m in _eval_means(metrics)]))


def _final_win_rate(metrics):
    """Share of the evaluation battles won at the last evaluation (multi-agent smac_lite scripts:
    eval/win_rate)."""
    return _eval_means(metrics, "eval/win_rate")[-1][1]


def _auc_win_rate(metrics):
    """Mean over all evaluations of the evaluation win rate: auc_eval for win rates."""
    return float(np.mean([m for _, m in _eval_means(metrics, "eval/win_rate")]))


def eval_curve(metrics, method: str) -> list[tuple[int, float]]:
    """(step, score) of every evaluation of a run scored by `method` (final_eval, final_win_rate):
    the values whose last is the run's final score and whose mean is its curve score
    (AUC_OF[method])."""
    return _eval_means(
        metrics, "eval/win_rate" if method == "final_win_rate" else "eval/episodic_return"
    )


SCORERS = {
    "last100_train": _last100_train,
    "final_eval": _final_eval,
    "max_eval": _max_eval,
    "auc_eval": _auc_eval,
    "final_win_rate": _final_win_rate,
    "auc_win_rate": _auc_win_rate,
}
# a gate's curve score, by its final score
AUC_OF = {"final_eval": "auc_eval", "final_win_rate": "auc_win_rate"}


def score(metrics: dict, method: str) -> float:
    """One run's score. `metrics` is benchmark.runs.read_metrics(run_dir)."""
    if method not in SCORERS:
        raise ValueError(f"unknown score method {method!r}; known: {sorted(SCORERS)}")
    return SCORERS[method](metrics)


@dataclass
class Reference:
    id: str
    script: str
    env_id: str
    total_timesteps: int
    score: str  # a key of SCORERS
    source: str
    seeds: list[int] | int  # the seeds (our runs) or their number (a peer's)
    mean: float | None = None
    std: float | None = None
    values: list[float] | None = None  # per-seed scores, where known
    flags: list[str] = field(default_factory=list)  # extra flags the run used
    note: str = ""  # env version differences and the like
    threshold: float | None = None  # set for CI gates: every listed seed must reach it
    # what one gate run costs here (its test's timeout is a multiple of it)
    cpu_seconds: float | None = None
    # the reference id of the multi-seed runs the threshold was set from
    evidence: str | None = None
    # per-seed curve scores (AUC_OF[score]) of the runs of `values` (evidence)
    auc_values: list[float] | None = None
    # gates: fail below the lowest auc_values of the evidence minus this margin
    auc_margin: float | None = None
    # derived by load_references: min(evidence.auc_values) - auc_margin
    auc_threshold: float | None = None
    # evidence: the steps of its evaluations (every --eval-every and the end)
    eval_steps: list[int] | None = None
    # evidence: each seed's score at each of eval_steps
    eval_curves: list[list[float]] | None = None
    # gates: run only to this evaluation of the evidence (see load_references)
    stop_at: int | None = None

    @property
    def is_gate(self) -> bool:
        return self.threshold is not None

    def command_flags(self, seed: int) -> list[str]:
        """The run's command line; a gate with stop_at ends at that step (--stop-at)."""
        stop = ["--stop-at", str(self.stop_at)] if self.stop_at else []
        return [
            "--env-id",
            self.env_id,
            "--total-timesteps",
            str(self.total_timesteps),
            *stop,
            "--seed",
            str(seed),
            *self.flags,
        ]


def load_references(path: Path = REFERENCES) -> list[Reference]:
    with open(path, "rb") as f:
        entries = [Reference(**e) for e in tomllib.load(f)["reference"]]
    ids = [e.id for e in entries]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate reference ids in {path}")
    for e in entries:
        if e.score not in SCORERS:
            raise ValueError(f"{e.id}: unknown score method {e.score!r}")
        if e.is_gate and (e.evidence not in ids or not isinstance(e.seeds, list)):
            raise ValueError(
                f"{e.id}: a gate needs a list of seeds and an evidence entry that exists"
            )
        n_seeds = len(e.seeds) if isinstance(e.seeds, list) else e.seeds
        if e.values and len(e.values) != n_seeds:
            raise ValueError(
                f"{e.id}: {len(e.values)} values for {n_seeds} seeds; give one value per seed"
            )
        if e.values and e.mean is not None and abs(e.mean - np.mean(e.values)) > 0.01:
            raise ValueError(
                f"{e.id}: mean {e.mean} is not the mean of its values ({np.mean(e.values):.2f})"
            )
        if e.auc_values and len(e.auc_values) != n_seeds:
            raise ValueError(
                f"{e.id}: {len(e.auc_values)} auc_values for "
                f"{n_seeds} seeds; give one value per seed"
            )
        if e.eval_curves is not None:
            _check_curves(e, n_seeds)
    by_id = {e.id: e for e in entries}
    for e in entries:
        if e.auc_margin is None:
            continue
        ev = by_id.get(e.evidence)
        if not e.is_gate or ev is None or not ev.auc_values:
            raise ValueError(f"{e.id}: auc_margin needs a gate whose evidence entry has auc_values")
        if list(ev.flags) != list(e.flags) or ev.total_timesteps != e.total_timesteps:
            raise ValueError(
                f"{e.id}: the gate must run as its evidence ran (same flags and budget) for the "
                f"curves to compare; evidence {ev.id} has {ev.flags} at {ev.total_timesteps}"
            )
        if e.stop_at is None:
            e.auc_threshold = min(ev.auc_values) - e.auc_margin
        else:
            e.auc_threshold = _cut_short(e, ev)
    return entries


def _check_curves(e: Reference, n_seeds: int):
    """An evidence entry's curves: one per seed, one value per evaluation step, ending at its values
    (the final evaluation) with their means at its auc_values."""
    steps = e.eval_steps or []
    if (
        len(e.eval_curves) != n_seeds
        or any(len(c) != len(steps) for c in e.eval_curves)
        or not steps
    ):
        raise ValueError(
            f"{e.id}: eval_curves needs eval_steps and one curve per seed, one value per step"
        )
    if steps[-1] != e.total_timesteps or steps != sorted(set(steps)):
        raise ValueError(
            f"{e.id}: eval_steps must rise and end at the budget ({e.total_timesteps})"
        )
    if e.values and not np.allclose([c[-1] for c in e.eval_curves], e.values, atol=1e-4):
        raise ValueError(f"{e.id}: the curves do not end at the per-seed values")
    if e.auc_values and not np.allclose(
        [np.mean(c) for c in e.eval_curves], e.auc_values, atol=1e-4
    ):
        raise ValueError(f"{e.id}: the means of the curves are not the auc_values")


def _cut_short(gate: Reference, ev: Reference) -> float:
    """A gate that stops at an evaluation of its evidence (stop_at): it runs the evidence's budget
    with --stop-at, so its schedules are the evidence runs' and its steps are their first stop_at
    steps (tests/test_learning.py checks it on a short run). Every evidence seed must already be at
    or above the final threshold at stop_at; the curve threshold is the lowest evidence curve score
    over the evaluations up to stop_at, minus auc_margin."""
    if not ev.eval_curves or gate.stop_at not in ev.eval_steps:
        raise ValueError(
            f"{gate.id}: stop_at {gate.stop_at} must be one of the eval_steps of evidence {ev.id}"
        )
    upto = ev.eval_steps.index(gate.stop_at) + 1
    if (lowest := min(c[upto - 1] for c in ev.eval_curves)) < gate.threshold:
        raise ValueError(
            f"{gate.id}: at stop_at {gate.stop_at} an evidence seed of {ev.id} "
            f"is at {lowest}, below the threshold {gate.threshold}: stop later"
        )
    return min(float(np.mean(c[:upto])) for c in ev.eval_curves) - gate.auc_margin


def get_reference(ref_id: str, path: Path = REFERENCES) -> Reference:
    for e in load_references(path):
        if e.id == ref_id:
            return e
    raise KeyError(ref_id)


def reference_stats(ref: Reference) -> tuple[float | None, float | None]:
    """(mean, std over seeds, ddof 0) of a reference: as given, or from its per-seed values."""
    if ref.mean is not None:
        return ref.mean, ref.std
    if ref.values:
        return float(np.mean(ref.values)), float(np.std(ref.values))
    return None, None


# Flags that change how a run is watched, not what it learns: a reference matches runs that differ
# from it only in these. (flag, whether it takes a value)
WATCH_FLAGS = {
    "--eval-every": True,
    "--eval-episodes": True,
    "--checkpoint-every": True,
    "--stop-at": True,
    "--save-model": False,
    "--capture-video": False,
    "--track": False,
    "--cuda": False,
    "--no-cuda": False,
}


def learning_flags(flags) -> list[str]:
    """flags without WATCH_FLAGS (and their values)."""
    kept, rest = [], list(flags)
    while rest:
        flag = rest.pop(0)
        if flag in WATCH_FLAGS:
            if WATCH_FLAGS[flag] and rest:
                rest.pop(0)
        else:
            kept.append(flag)
    return kept


def find_reference(
    script: str,
    env_id: str,
    method: str,
    total_timesteps: int | None = None,
    refs: list[Reference] | None = None,
    flags=None,
) -> Reference | None:
    """The reference to compare runs of `script` on `env_id` scored by `method` with: same script,
    env and score method, with a mean (or per-seed values); given flags, one with the same flags
    but for WATCH_FLAGS preferred (the caller must say when they differ: a variant such as
    grpo_lm.py --loss-type dr_grpo is not the defaults' setting); the same budget preferred, else
    the closest one (the caller must say when the budgets differ)."""
    refs = load_references() if refs is None else refs
    cands = [
        r
        for r in refs
        if (r.script, r.env_id, r.score) == (script, env_id, method)
        and reference_stats(r)[0] is not None
    ]
    if flags is not None:
        same = [r for r in cands if learning_flags(r.flags) == learning_flags(flags)]
        cands = same or cands
    if not cands:
        return None
    return min(cands, key=lambda r: abs(r.total_timesteps - (total_timesteps or r.total_timesteps)))
