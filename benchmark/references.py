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
    if name not in metrics:  # multi-agent scripts say which return: eval/episodic_return_team, ..._agent_mean
        name = next((n for n in metrics if n.startswith(name)), name)
    steps, values = metrics[name]
    return [(s, float(values[steps == s].mean())) for s in np.unique(steps)]


def _final_eval(metrics):
    """Mean of the evaluation episodes logged at the last evaluation (the end of training)."""
    return _eval_means(metrics)[-1][1]


def _max_eval(metrics):
    """Maximum over training of the mean evaluation return (TD3 paper, Tianshou): optimistic by construction."""
    return max(m for _, m in _eval_means(metrics))


def _auc_eval(metrics):
    """Mean over all evaluations (every --eval-every steps and the final one) of the mean evaluation return: the area
    under the evaluation curve divided by its length. A run that learns later scores lower even if it ends as well."""
    return float(np.mean([m for _, m in _eval_means(metrics)]))


def _final_win_rate(metrics):
    """Share of the evaluation battles won at the last evaluation (multi-agent smac_lite scripts: eval/win_rate)."""
    return _eval_means(metrics, "eval/win_rate")[-1][1]


def _auc_win_rate(metrics):
    """Mean over all evaluations of the evaluation win rate: auc_eval for win rates."""
    return float(np.mean([m for _, m in _eval_means(metrics, "eval/win_rate")]))


SCORERS = {"last100_train": _last100_train, "final_eval": _final_eval, "max_eval": _max_eval, "auc_eval": _auc_eval,
           "final_win_rate": _final_win_rate, "auc_win_rate": _auc_win_rate}
AUC_OF = {"final_eval": "auc_eval", "final_win_rate": "auc_win_rate"}  # a gate's curve score, by its final score


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
    cpu_seconds: float | None = None  # what one gate run costs here (its test's timeout is a multiple of it)
    evidence: str | None = None  # the reference id of the multi-seed runs the threshold was set from
    auc_values: list[float] | None = None  # per-seed curve scores (AUC_OF[score]) of the runs of `values` (evidence)
    auc_margin: float | None = None  # gates: fail below the lowest auc_values of the evidence minus this margin
    auc_threshold: float | None = None  # derived by load_references: min(evidence.auc_values) - auc_margin

    @property
    def is_gate(self) -> bool:
        return self.threshold is not None

    def command_flags(self, seed: int) -> list[str]:
        return ["--env-id", self.env_id, "--total-timesteps", str(self.total_timesteps), "--seed", str(seed),
                *self.flags]


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
            raise ValueError(f"{e.id}: a gate needs a list of seeds and an evidence entry that exists")
        n_seeds = len(e.seeds) if isinstance(e.seeds, list) else e.seeds
        if e.values and len(e.values) != n_seeds:
            raise ValueError(f"{e.id}: {len(e.values)} values for {n_seeds} seeds; give one value per seed")
        if e.values and e.mean is not None and abs(e.mean - np.mean(e.values)) > 0.01:
            raise ValueError(f"{e.id}: mean {e.mean} is not the mean of its values ({np.mean(e.values):.2f})")
        if e.auc_values and len(e.auc_values) != n_seeds:
            raise ValueError(f"{e.id}: {len(e.auc_values)} auc_values for {n_seeds} seeds; give one value per seed")
    by_id = {e.id: e for e in entries}
    for e in entries:
        if e.auc_margin is None:
            continue
        ev = by_id.get(e.evidence)
        if not e.is_gate or ev is None or not ev.auc_values:
            raise ValueError(f"{e.id}: auc_margin needs a gate whose evidence entry has auc_values")
        if list(ev.flags) != list(e.flags) or ev.total_timesteps != e.total_timesteps:
            raise ValueError(f"{e.id}: the gate must run as its evidence ran (same flags and budget) for the curves to "
                             f"compare; evidence {ev.id} has {ev.flags} at {ev.total_timesteps}")
        e.auc_threshold = min(ev.auc_values) - e.auc_margin
    return entries


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


def find_reference(script: str, env_id: str, method: str, total_timesteps: int | None = None,
                   refs: list[Reference] | None = None) -> Reference | None:
    """The reference to compare runs of `script` on `env_id` scored by `method` with: same script, env and score
    method, with a mean (or per-seed values); the same budget preferred, else the closest one (the caller must say
    when the budgets differ)."""
    refs = load_references() if refs is None else refs
    cands = [r for r in refs if (r.script, r.env_id, r.score) == (script, env_id, method)
             and reference_stats(r)[0] is not None]
    if not cands:
        return None
    return min(cands, key=lambda r: abs(r.total_timesteps - (total_timesteps or r.total_timesteps)))
