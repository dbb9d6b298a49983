"""determinism tier: the same seed on CPU gives the same metrics.csv, wall-clock columns aside. One
run of each pair is a fresh process and the other is forked from the fork server, whose children all
start from the same unseeded random state: two forked runs would agree even where a script forgets
to seed something, a fresh one and a forked one do not (and they show that forking changes nothing a
run logs)."""

import pytest
from conftest import PER_FAMILY, SMOKE, SMOKE_RUN

from benchmark.runs import read_rows, run_script

# values measured with the clock
CLOCK = {
    "charts/sps",
    "charts/train_seconds",
    "charts/tokens_per_s",
    "charts/generation_tokens_per_s",
    "charts/update_tokens_per_s",
}


def comparable(run_dir):
    return [
        (r["global_step"], r["name"], None if r["name"] in CLOCK else r["value"])
        for r in read_rows(run_dir)
    ]


def test_same_seed_same_metrics(smoke_script, smoke_runs, tmp_path):
    smoke_runs(smoke_script, tmp_path / "b")  # the shared smoke run (forked, seed 7)
    out = run_script(smoke_script, SMOKE[smoke_script] + SMOKE_RUN, tmp_path / "a", fork=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert comparable(tmp_path / "a") == comparable(tmp_path / "b")


@pytest.mark.parametrize("smoke_script", PER_FAMILY)
def test_another_seed_other_metrics(smoke_script, smoke_runs, tmp_path):
    """--seed reaches what a run draws (start_run seeds torch, numpy and random; the scripts their
    envs and generators from it): once per family."""
    smoke_runs(smoke_script, tmp_path / "b")
    other = run_script(
        smoke_script, SMOKE[smoke_script] + ["--seed", "8"], tmp_path / "c", fork=True
    )
    assert other.returncode == 0 and comparable(tmp_path / "c") != comparable(tmp_path / "b")
