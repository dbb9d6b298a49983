"""learning tier: each CI gate of benchmark/references.toml, one subprocess per (gate, seed). A run
must end at or above the gate's threshold AND learn as fast as the recorded evidence: the mean of
its evaluations along the way (area under the evaluation curve, score auc_eval) must not fall below
the lowest recorded seed's by more than the gate's auc_margin. Thresholds, margins and seeds live in
references.toml with the runs that justify them. A gate with `stop_at` runs the evidence's budget
with --stop-at: only to that evaluation of its evidence runs (where every evidence seed already
passed). An offline gate reads a dataset of benchmark/datasets.py by path (--dataset
runs/datasets/<name>), made first if missing."""

from pathlib import Path

import pytest
from conftest import SMOKE

from benchmark.datasets import STANDARD, standard
from benchmark.references import AUC_OF, load_references, score
from benchmark.runs import read_metrics, read_rows, run_script

GATES = [(g, seed) for g in load_references() if g.is_gate for seed in g.seeds]
# a gate run may take this many times its recorded cpu_seconds (busy or slower machines)
TIMEOUT_FACTOR = 10


def gate_failures(gate, metrics) -> list[str]:
    """What a finished gate run missed: the final threshold, the curve threshold; empty when it
    passed."""
    failures = []
    final = score(metrics, gate.score)
    if final < gate.threshold:
        failures.append(f"{gate.score} = {final:.2f} < threshold {gate.threshold}")
    if gate.auc_threshold is not None:
        curve = AUC_OF[gate.score]
        if (auc := score(metrics, curve)) < gate.auc_threshold:
            failures.append(
                f"{curve} = {auc:.2f} < {gate.auc_threshold:.2f} (lowest seed of {gate.evidence} "
                f"minus {gate.auc_margin}): it learns more slowly than every recorded run"
            )
    return failures


@pytest.mark.learning
@pytest.mark.parametrize("gate,seed", GATES, ids=[f"{g.id}-seed{s}" for g, s in GATES])
def test_gate(gate, seed, tmp_path):
    if (
        "--dataset" in gate.flags
        and (name := Path(gate.flags[gate.flags.index("--dataset") + 1]).name) in STANDARD
    ):
        standard(name)
    # forked from the fork server: the run without its seconds of start-up (it logs the same)
    out = run_script(
        gate.script,
        gate.command_flags(seed),
        tmp_path,
        timeout=TIMEOUT_FACTOR * gate.cpu_seconds,
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    failures = gate_failures(gate, read_metrics(tmp_path))
    assert not failures, (
        f"{gate.id} seed {seed}: " + "; ".join(failures) + f" (evidence: {gate.evidence})"
    )


CUT_SHORT = sorted({g.script for g in load_references() if g.is_gate and g.stop_at})


@pytest.mark.parametrize("script", CUT_SHORT)
def test_a_gate_cut_short_runs_as_the_first_steps_of_its_evidence(script, tmp_path):
    """A gate with stop_at compares a run stopped there (--stop-at) with the first stop_at steps of
    the evidence runs. Here, on a small budget: a run stopped at half of it logs, up to there, the
    same evaluations and losses as the whole run."""
    flags = list(SMOKE[script])
    at = flags.index("--total-timesteps") + 1
    budget, rows = 2 * int(flags[at]), {}
    flags[at] = str(budget)
    for name, stop in (("whole", []), ("half", ["--stop-at", str(budget // 2)])):
        out = run_script(
            script, flags + ["--eval-every", str(budget // 4), *stop], tmp_path / name, fork=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        rows[name] = {
            (r["global_step"], r["name"]): r["value"]
            for r in read_rows(tmp_path / name)
            if r["name"].startswith(("eval/", "losses/"))
        }
    end = max(step for step, _ in rows["half"])
    assert any(name.startswith("eval/") and step == end for step, name in rows["whole"]), (
        "an evaluation at the cut"
    )
    common = {k for k in rows["half"] if k in rows["whole"]}
    assert {k for k in rows["whole"] if k[0] <= end and k[1].startswith("eval/")} <= common
    assert all(rows["half"][k] == rows["whole"][k] for k in common), (
        f"{script}: the stopped run is not the first steps of the whole one"
    )
