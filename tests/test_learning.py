"""learning tier: each CI gate of benchmark/references.toml, one subprocess per (gate, seed); the score must
reach the gate's threshold. Thresholds and seeds live in references.toml with the runs that justify them."""
import pytest

from benchmark.references import load_references, score
from benchmark.runs import read_metrics, run_script

GATES = [(g, seed) for g in load_references() if g.is_gate for seed in g.seeds]


@pytest.mark.learning
@pytest.mark.parametrize("gate,seed", GATES, ids=[f"{g.id}-seed{s}" for g, s in GATES])
def test_gate(gate, seed, tmp_path):
    out = run_script(gate.script, gate.command_flags(seed), tmp_path, timeout=10 * 60)
    assert out.returncode == 0, out.stderr[-2000:]
    value = score(read_metrics(tmp_path), gate.score)
    assert value >= gate.threshold, (f"{gate.id} seed {seed}: {gate.score} = {value:.2f} < threshold "
                                     f"{gate.threshold} (evidence: {gate.evidence})")
