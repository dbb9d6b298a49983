"""The report of a suite run: benchmark/reports/<suite>/<suite>-<device>-<date>-<HHMM>-<commit>.md
(benchmark/report_path.py; never overwrites an earlier one), a table of our scores against the
references (with their sources) and a verdict per cell (benchmark/stats.py), plus PNG learning
curves and results.json in the folder of the same name. Written by benchmark/run.py after its runs
(`python benchmark/run.py --suite NAME`); this file makes no report by itself."""

import argparse
import datetime
import json
import platform
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/report.py` puts benchmark/ first on the path, not the root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmark import stats  # noqa: E402
from benchmark.random_policy import load_random_scores  # noqa: E402
from benchmark.references import (  # noqa: E402
    AUC_OF,
    Reference,
    eval_curve,
    find_reference,
    learning_flags,
    reference_stats,
    score,
)
from benchmark.report_path import new_report_path  # noqa: E402
from benchmark.runs import file_stem, git_commit, read_metrics  # noqa: E402

CURVE = "train/episodic_return"
# single-agent, multi-agent, then offline scripts (no training episode: the mean of each evaluation)
CURVES = (
    CURVE,
    "train/episodic_return_team",
    "train/episodic_return_agent_mean",
    "eval/episodic_return",
)
# each run's curve is the trailing mean over this many episodes before interpolation
SMOOTH_EPISODES = 10
GRID_POINTS = 200


def learning_curve(
    run_dirs, metric: str = CURVE, points: int = GRID_POINTS, window: int = SMOOTH_EPISODES
):
    """Mean and std over runs of `metric` against global_step, each run smoothed (trailing mean over
    `window` episodes) and linearly interpolated on a common grid from the latest first point to the
    earliest last point of the runs. An eval/ metric is first averaged over each evaluation's
    episodes (one point per step, no smoothing). Returns (grid, mean, std, n_runs), or None when no
    run has 2 points."""
    curves = []
    for d in run_dirs:
        m = read_metrics(d)
        if metric in m and metric.startswith("eval/"):
            steps, inverse = np.unique(m[metric][0], return_inverse=True)
            m[metric], window = (
                (steps, np.bincount(inverse, weights=m[metric][1]) / np.bincount(inverse)),
                1,
            )
        if metric in m and len(m[metric][0]) >= 2:
            steps, values = m[metric]
            c = np.cumsum(np.insert(values, 0, 0.0))
            w = np.minimum(np.arange(1, len(values) + 1), window)
            curves.append((steps, (c[1:] - c[np.arange(len(values)) + 1 - w]) / w))
    if not curves:
        return None
    lo, hi = max(s[0] for s, _ in curves), min(s[-1] for s, _ in curves)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    ys = np.stack([np.interp(grid, s, v) for s, v in curves])
    return grid, ys.mean(0), ys.std(0), len(curves)


def plot_curve(run_dirs, path: Path, title: str, ref: Reference | None = None):
    metric = next((m for m in CURVES if any(m in read_metrics(d) for d in run_dirs)), CURVE)
    curve = learning_curve(run_dirs, metric)
    if curve is None:
        return None
    grid, mean, std, n = curve
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(grid, mean, color="C0", label=f"ours: mean ± std over {n} seeds")
    ax.fill_between(grid, mean - std, mean + std, color="C0", alpha=0.25)
    if ref is not None:
        rm, rs = reference_stats(ref)
        ax.axhline(rm, color="C3", lw=1, ls="--")
        ax.axhspan(
            rm - (rs or 0),
            rm + (rs or 0),
            color="C3",
            alpha=0.15,
            label=f"{ref.id}: {rm:.1f} ± {rs or 0:.1f} at {ref.total_timesteps:,} steps",
        )
    ax.set_xlabel("global step")
    ax.set_ylabel(
        f"{metric} ("
        + (
            "mean of each evaluation"
            if metric.startswith("eval/")
            else f"trailing mean of {SMOOTH_EPISODES}"
        )
        + ")",
        fontsize=8,
    )
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _machine(device: str) -> str:
    import os

    import torch

    desc = f"{platform.platform()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    if device == "cuda" and torch.cuda.is_available():
        desc += f", {torch.cuda.get_device_name(0)}"
    return desc


def _fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def cells(outcomes, refs: list[Reference], random_scores: dict | None = None):
    """Group finished runs by (script, env, budget, score method, flags, reference), score each run,
    match the reference, judge (stats.verdict; random_scores: benchmark/random_scores.toml by
    default). A suite entry with compare_with gets a cell under its own for each script it names:
    the same runs judged against that script's runs. Returns a list of dicts (one per cell) and the
    outcomes whose scoring failed as (outcome, error)."""
    random_scores = load_random_scores() if random_scores is None else random_scores
    groups, unscorable = defaultdict(list), []
    for o in outcomes:
        key = (
            o.spec.script,
            o.spec.env_id,
            o.spec.total_timesteps,
            o.spec.score,
            o.spec.flags,
            o.spec.reference,
            o.spec.self_reference,
            o.spec.compare_with,
        )
        groups[key].append(o)
    result, compared = [], []
    for (script, env_id, budget, method, flags, ref_id, self_ref, others), group in groups.items():
        # finals: the final greedy evaluation, shown beside a peer's metric
        scores, finals, curves = {}, {}, {}
        for o in group:
            if not o.finished:
                continue
            # a seed of an earlier report (benchmark/run.py --seeds-from)
            if o.reported is not None:
                scores[o.spec.seed] = o.reported["score"]
                if o.reported.get("final_eval") is not None:
                    finals[o.spec.seed] = o.reported["final_eval"]
                if o.reported.get("eval_curve"):
                    curves[o.spec.seed] = [(step, v) for step, v in o.reported["eval_curve"]]
                continue
            try:
                metrics = read_metrics(o.run_dir)
                scores[o.spec.seed] = score(metrics, method)
            except (KeyError, IndexError, ValueError, OSError) as e:
                unscorable.append((o, f"cannot score ({type(e).__name__}: {e})"))
                continue
            if method != "final_eval" and "eval/episodic_return" in metrics:
                finals[o.spec.seed] = score(metrics, "final_eval")
            # each evaluation's score: a gate's evidence keeps them (a gate may stop early)
            if method in AUC_OF:
                curves[o.spec.seed] = eval_curve(metrics, method)
        if ref_id:
            ref = next((r for r in refs if r.id == ref_id), None)
        else:
            ref = find_reference(script, env_id, method, budget, refs, flags)
        rm, rs = reference_stats(ref) if ref else (None, None)
        x = list(scores.values())
        verdict = (
            judge(x, env_id, ref, random_scores, self_ref)
            if x
            else stats.Verdict("no verdict", "no run scored")
        )
        other_setting = learning_flags(ref.flags) != learning_flags(flags) if ref else False
        if verdict.label in ("PASS", "FAIL") and other_setting and not ref_id:
            verdict = stats.Verdict("no verdict", "the reference was run with other flags")
        result.append(
            {
                "script": script,
                "env_id": env_id,
                "total_timesteps": budget,
                "score": method,
                "flags": list(flags),
                "scores": scores,
                "summary": stats.summarize(x) if x else None,
                "final_evals": finals,
                "eval_curves": curves,
                "reference": ref,
                "ref_mean": rm,
                "ref_std": rs,
                "runs": group,
                "verdict": verdict,
            }
        )
        compared += [(result[-1], other) for other in others]
    extra = defaultdict(list)
    # a second row, under the first: its runs against another script's runs of this report
    for c, other in compared:
        theirs = next(
            (
                d["scores"]
                for d in result
                if d["scores"]
                and (d["script"], d["env_id"], d["total_timesteps"], d["score"])
                == (other, c["env_id"], c["total_timesteps"], c["score"])
            ),
            {},
        )
        seeds = sorted(theirs)
        ref = (
            Reference(
                f"this report's {other}",
                other,
                c["env_id"],
                c["total_timesteps"],
                c["score"],
                f"the runs of {other} in this report (same machine, same flags), seeds {seeds}",
                seeds,
                values=[theirs[k] for k in seeds],
            )
            if theirs
            else None
        )
        rm, rs = reference_stats(ref) if ref else (None, None)
        x = list(c["scores"].values())
        extra[id(c)].append(
            {
                **c,
                "final_evals": {},
                "eval_curves": {},
                "reference": ref,
                "ref_mean": rm,
                "ref_std": rs,
                "compared": other,
                "verdict": judge(x, c["env_id"], ref, random_scores)
                if x and ref
                else stats.Verdict("no verdict", f"no finished run of {other} in this report"),
            }
        )
    return [row for c in result for row in [c, *extra.get(id(c), [])]], unscorable


def judge(
    scores: list[float],
    env_id: str,
    ref: Reference | None,
    random_scores: dict,
    self_reference: bool = False,
) -> stats.Verdict:
    """stats.verdict of our per-seed scores on env_id against a reference, with the env's
    random-policy score."""
    if ref is None:
        return stats.verdict(scores, None)
    mean, std = reference_stats(ref)
    # a list of seeds or their number
    n_ref = len(ref.seeds) if isinstance(ref.seeds, list) else int(ref.seeds)
    rnd = random_scores.get(env_id)
    return stats.verdict(
        scores,
        mean,
        std,
        n_ref,
        rnd.random if rnd else None,
        rnd.solved if rnd else None,
        self_reference,
    )


def _normalised(v: stats.Verdict) -> str:
    if v.mean is None:
        return "–"
    return f"{v.mean:.2f} [{v.low:.2f}, {v.high:.2f}] vs {v.reference:.2f}"


def write_report(
    suite,
    outcomes,
    missing: list[str],
    device: str,
    report_dir: Path,
    refs: list[Reference],
    now: datetime.datetime | None = None,
    command: str = "",
) -> Path:
    now = now or datetime.datetime.now()
    path = new_report_path(report_dir, suite.name, device, now)
    stem, fig_dir = path.stem, path.with_suffix("")
    fig_dir.mkdir()
    table, unscorable = cells(outcomes, refs)
    seeds = sorted({o.spec.seed for o in outcomes})
    ran = [o for o in outcomes if o.reported is None]
    # an earlier report -> the seeds it gives (benchmark/run.py --seeds-from)
    earlier = defaultdict(set)
    for o in outcomes:
        if o.reported is not None:
            earlier[Path(o.run_dir).stem].add(o.spec.seed)

    lines = [
        f"# Benchmark suite `{suite.name}` on {device}, {now:%Y-%m-%d %H:%M}",
        "",
        suite.description,
        "",
        f"- command: `{command}`" if command else "- command: (called from Python)",
        f"- commit: {git_commit()}",
        f"- machine: {_machine(device)}",
        f"- seeds: {', '.join(map(str, seeds))}"
        + (f"; runs in `{Path(ran[0].run_dir).parent}`" if ran else ""),
        *[
            f"- seeds {', '.join(map(str, sorted(k)))} (their scores, not their runs): from "
            f"the earlier report `{stem_}.md`, whose scripts are the same code as this commit's"
            for stem_, k in earlier.items()
        ],
        "",
        "## Scores",
        "",
        "| script | env | steps | score | seeds | ours mean ± std | ours "
        "IQM [95% CI] | ours final eval mean ± std | reference mean ± std "
        "| normalised mean [95% t-CI] vs reference | verdict | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sources = {}
    for c in table:
        s, ref = c["summary"], c["reference"]
        # win rates and accuracies are fractions
        small = s is not None and max(abs(s.mean), abs(c["ref_mean"] or 0)) <= 1
        d = 3 if "win_rate" in c["score"] or small else 1
        ours = f"{s.mean:.{d}f} ± {s.std:.{d}f}" if s else "–"
        iqm = f"{s.iqm:.{d}f} [{s.ci_low:.{d}f}, {s.ci_high:.{d}f}]" if s else "–"
        f = list(c["final_evals"].values())
        final = f"{np.mean(f):.{d}f} ± {np.std(f):.{d}f} ({len(f)})" if f else "–"
        notes = [c["verdict"].why] if c["verdict"].why else []
        if c.get("compared"):
            notes.insert(0, f"the runs of the row above, against this report's {c['compared']}")
        if c["flags"]:
            notes.append("flags `" + " ".join(c["flags"]) + "`")
        if ref is None:
            refcell = "none"
        else:
            sources[ref.id] = ref
            refcell = f"{_fmt(c['ref_mean'], d)} ± {_fmt(c['ref_std'], d)} [{ref.id}]"
            if ref.total_timesteps != c["total_timesteps"]:
                notes.append(
                    f"reference budget {ref.total_timesteps:,} steps, ours {c['total_timesteps']:,}"
                )
            if ref.flags:
                notes.append("reference flags `" + " ".join(ref.flags) + "`")
        n_fail = sum(not o.finished for o in c["runs"])
        if n_fail:
            notes.append(f"{n_fail} run(s) crashed")
        n_earlier = sum(o.reported is not None for o in c["runs"])
        if n_earlier and not c.get("compared"):
            notes.append(f"{n_earlier} seed(s) from an earlier report; the curve shows the others")
        lines.append(
            f"| {c['script']} | {c['env_id']} | {c['total_timesteps']:,} | {c['score']} | "
            f"{len(c['scores'])}/{len(c['runs'])} | {ours} | {iqm} | {final} | {refcell} | "
            f"{_normalised(c['verdict'])} | **{c['verdict'].label}** | {'; '.join(notes)} |"
        )
    lines += [
        "",
        f"Verdict rule: {stats.RULE}",
        "IQM CI (descriptive, not used by the verdict): percentile bootstrap, "
        f"{stats.RESAMPLES} resamples, stratified by task (here: over seeds within the env), "
        "as rliable (Agarwal et al. 2021). std over seeds with ddof 0. Final eval: the greedy "
        "evaluation at the end of each run (`--eval-episodes` episodes), not judged, shown "
        "beside a peer's metric where the score is another (number of runs in brackets).",
        "",
    ]
    if sources:
        lines += ["### Reference sources", ""]
        for ref in sources.values():
            lines.append(
                f"- `{ref.id}`: {ref.source}; {ref.env_id}, {ref.total_timesteps:,} steps, score "
                f"`{ref.score}`, seeds {ref.seeds}" + (f"; note: {ref.note}" if ref.note else "")
            )
        lines.append("")
    anchors = [
        (c, r)
        for c in table
        for r in refs
        if r.script == c["script"] and r.env_id == f"SMAC/{c['env_id']}"
    ]
    if anchors:
        lines += [
            "### Beside them, on SMAC (StarCraft II), not smac_lite: not compared, no verdict",
            "",
            "smac_lite is a simplified simulator of SMAC's battles; a win rate on one does "
            "not predict the other. These peers' numbers order the maps and the algorithms.",
            "",
        ]
        for c, r in anchors:
            mean, _ = reference_stats(r)
            lines.append(
                f"- {c['script']} {c['env_id']}: SMAC {mean:.3f} at "
                f"{r.total_timesteps:,} steps [`{r.id}`: {r.source}; {r.note}]"
            )
        lines.append("")
    lines += ["### Per-seed scores", ""]
    for c in [c for c in table if not c.get("compared")]:
        reported = {o.spec.seed for o in c["runs"] if o.reported is not None}
        per_seed = (
            ", ".join(
                f"seed {k}: {v:.2f}" + (" (earlier report)" if k in reported else "")
                for k, v in sorted(c["scores"].items())
            )
            or "none"
        )
        if c["final_evals"]:
            per_seed += "; final eval: " + ", ".join(
                f"seed {k}: {v:.2f}" for k, v in sorted(c["final_evals"].items())
            )
        lines.append(f"- {c['script']} {c['env_id']}: {per_seed}")
    lines.append("")

    failed = [(o, o.error) for o in outcomes if not o.finished] + unscorable
    if failed:
        lines += ["## Failed runs", ""]
        for o, err in failed:
            lines.append(f"- `{o.spec.name}`: {err} (log: `{o.run_dir / 'output.log'}`)")
        lines.append("")
    if missing:
        lines += [
            "## Missing scripts",
            "",
            "Planned in the suite but not in algos/ yet, so not run: "
            + ", ".join(f"`{m}`" for m in missing),
            "",
        ]

    lines += [
        "## Learning curves",
        "",
        f"`{CURVE}` (multi-agent scripts: the team return or the per-agent mean; offline "
        "scripts, which train on no episode: the mean return of each evaluation) against "
        f"global step: each seed smoothed over its last {SMOOTH_EPISODES} episodes, "
        "interpolated on a common grid; line = mean over seeds, band = ± std. The reference "
        "is drawn as mean ± std (a horizontal band at its own budget, whatever its metric).",
        "",
    ]
    for c in [c for c in table if not c.get("compared")]:
        dirs = [o.run_dir for o in c["runs"] if o.finished and o.reported is None]
        name = (
            f"{file_stem(c['script'])}__{c['env_id'].replace('/', '-')}__{c['total_timesteps']}.png"
        )
        if dirs and plot_curve(
            dirs,
            fig_dir / name,
            f"{c['script']} {c['env_id']} ({suite.name}, {device})",
            c["reference"],
        ):
            lines += [f"![{c['script']} {c['env_id']}]({stem}/{name})", ""]

    results = [
        {
            "script": c["script"],
            "env_id": c["env_id"],
            "total_timesteps": c["total_timesteps"],
            "score": c["score"],
            "flags": c["flags"],
            "scores": c["scores"],
            "final_evals": c["final_evals"],
            "eval_curves": {
                seed: [[int(step), v] for step, v in curve]
                for seed, curve in c["eval_curves"].items()
            },
            "summary": vars(c["summary"]) if c["summary"] else None,
            "reference": c["reference"].id if c["reference"] else None,
            "verdict": vars(c["verdict"]),
            "compared_with": c.get("compared"),
        }
        for c in table
    ]
    (fig_dir / "results.json").write_text(
        json.dumps(
            {
                "suite": suite.name,
                "device": device,
                "time": now.isoformat(timespec="minutes"),
                "cells": results,
            },
            indent=2,
        )
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """--help prints what this module does; run without it, a one-line error: benchmark/run.py
    writes the reports."""
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    print(
        "error: report.py makes no report by itself; python "
        "benchmark/run.py --suite NAME writes one after its runs",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
