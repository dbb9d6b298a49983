"""learning tier: each CI gate of benchmark/references.toml, one subprocess per (gate, seed). A run must end at or above
the gate's threshold AND learn as fast as the recorded evidence: the mean of its evaluations along the way (area
under the evaluation curve, score auc_eval) must not fall below the lowest recorded seed's by more than the gate's
auc_margin. Thresholds, margins and seeds live in references.toml with the runs that justify them."""
import pytest

from benchmark.references import AUC_OF, load_references, score
from benchmark.runs import read_metrics, run_script

GATES = [(g, seed) for g in load_references() if g.is_gate for seed in g.seeds]
TIMEOUT_FACTOR = 10  # a gate run may take this many times its recorded cpu_seconds (busy or slower machines)


def gate_failures(gate, metrics) -> list[str]:
    """What a finished gate run missed: the final threshold, the curve threshold; empty when it passed."""
    failures = []
    final = score(metrics, gate.score)
    if final < gate.threshold:
        failures.append(f"{gate.score} = {final:.2f} < threshold {gate.threshold}")
    if gate.auc_threshold is not None:
        curve = AUC_OF[gate.score]
        if (auc := score(metrics, curve)) < gate.auc_threshold:
            failures.append(f"{curve} = {auc:.2f} < {gate.auc_threshold:.2f} (lowest seed of {gate.evidence} minus "
                            f"{gate.auc_margin}): it learns more slowly than every recorded run")
    return failures


@pytest.mark.learning
@pytest.mark.parametrize("gate,seed", GATES, ids=[f"{g.id}-seed{s}" for g, s in GATES])
def test_gate(gate, seed, tmp_path):
    out = run_script(gate.script, gate.command_flags(seed), tmp_path, timeout=TIMEOUT_FACTOR * gate.cpu_seconds)
    assert out.returncode == 0, out.stderr[-2000:]
    failures = gate_failures(gate, read_metrics(tmp_path))
    assert not failures, f"{gate.id} seed {seed}: " + "; ".join(failures) + f" (evidence: {gate.evidence})"
