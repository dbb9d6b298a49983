"""benchmark/: the suite runner (local and Ray), resume, crashed runs, scoring, aggregation, the
report, and the plumbing of the speed comparison; all on runs of a few hundred steps."""

import dataclasses
import datetime
import functools
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMOKE, ctrl_c
from scipy import stats as scipy_stats

from benchmark import run as bench
from benchmark import sb3_baseline, speed, stats
from benchmark.random_policy import LM_BASES, load_random_scores, random_returns, register
from benchmark.ray_backend import free_port
from benchmark.references import (
    Reference,
    find_reference,
    learning_flags,
    load_references,
    score,
)
from benchmark.report import cells, judge, write_report
from benchmark.report_path import new_report_path
from benchmark.runs import (
    ROOT,
    RunSpec,
    execute,
    git_head,
    read_metrics,
    read_rows,
    run_finished,
    run_script,
)

pytestmark = pytest.mark.xdist_group("benchmark")


def _split(flags):
    """conftest.SMOKE flags -> (env_id, total_timesteps, the other flags)."""
    flags = list(flags)
    env = flags[flags.index("--env-id") + 1]
    steps = int(flags[flags.index("--total-timesteps") + 1])
    rest = [
        f
        for i, f in enumerate(flags)
        if f not in ("--env-id", "--total-timesteps")
        and (i == 0 or flags[i - 1] not in ("--env-id", "--total-timesteps"))
    ]
    return env, steps, rest


def _toml_list(xs):
    return "[" + ", ".join(json.dumps(x) for x in xs) + "]"


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """A test suite: ppo.py (2 seeds) and dqn.py (2 seeds) on the smoke budgets, one entry with a
    bad flag (crashes), one planned script that does not exist. With 2 seeds no cell gets a verdict
    (5 are needed)."""
    tmp = tmp_path_factory.mktemp("bench")
    entries = []
    for script in ("ppo.py", "dqn.py"):
        env, steps, flags = _split(SMOKE[script])
        entries.append(
            f'[[t.run]]\nscript = "{script}"\nenv_id = "{env}"\ntotal_timesteps = {steps}\n'
            f'score = "final_eval"\nflags = {_toml_list(flags)}\n'
        )
    entries.append(
        '[[t.run]]\nscript = "ppo.py"\nenv_id = "Acrobot-v1"\ntotal_timesteps = 512\n'
        'score = "final_eval"\nflags = ["--no-such-flag"]\n'
    )
    entries.append(
        '[[t.run]]\nscript = "not_written_yet.py"\nenv_id = "CartPole-v1"\ntotal_timesteps = 512\n'
        'score = "final_eval"\n'
    )
    (tmp / "suites.toml").write_text(
        '[t]\ndescription = "test suite"\nseeds = 2\n\n' + "\n".join(entries)
    )
    (tmp / "refs.toml").write_text(
        '[[reference]]\nid = "unreachable-ppo"\nscript = '
        '"ppo.py"\nenv_id = "CartPole-v1"\ntotal_timesteps = 100000\n'
        'score = "final_eval"\nseeds = 3\nmean = 10000.0\nstd = 1.0\nsource = "test"\n\n'
        '[[reference]]\nid = "easy-dqn"\nscript = '
        '"dqn.py"\nenv_id = "CartPole-v1"\ntotal_timesteps = 600\n'
        'score = "final_eval"\nseeds = [1, 2]\nvalues = [1.0, 3.0]\nsource = "test"\n'
    )
    argv = [
        "--suite",
        "t",
        "--out",
        str(tmp / "runs"),
        "--report-dir",
        str(tmp / "reports"),
        "--suites-file",
        str(tmp / "suites.toml"),
        "--references-file",
        str(tmp / "refs.toml"),
    ]
    rc = bench.main(argv)
    return tmp, argv, rc


def test_suite_runs_scores_and_reports(suite_run):
    tmp, _, rc = suite_run
    assert rc == 1, "a crashed run must make the exit status 1"
    runs = tmp / "runs"
    for name in (
        "ppo__CartPole-v1__1",
        "ppo__CartPole-v1__2",
        "dqn__CartPole-v1__1",
        "dqn__CartPole-v1__2",
    ):
        assert run_finished(runs / name), f"{name} did not finish"
    assert not run_finished(runs / "ppo__Acrobot-v1__1")
    assert not (runs / "not_written_yet__CartPole-v1__1").exists()

    reports = list((tmp / "reports").glob("t/t-cpu-*.md"))
    assert len(reports) == 1
    text = reports[0].read_text()
    rows = {
        line.split("|")[1].strip() + " " + line.split("|")[2].strip(): line
        for line in text.splitlines()
        if line.startswith("| ppo.py") or line.startswith("| dqn.py")
    }
    assert "unreachable-ppo" in rows["ppo.py CartPole-v1"]
    assert "reference budget 100,000 steps, ours 512" in rows["ppo.py CartPole-v1"]
    assert "2.0 ± 1.0 [easy-dqn]" in rows["dqn.py CartPole-v1"]
    assert "reference budget" not in rows["dqn.py CartPole-v1"]
    for cell in ("ppo.py CartPole-v1", "dqn.py CartPole-v1"):
        assert "**no verdict**" in rows[cell] and "2 seeds, 5 needed" in rows[cell]
    assert (
        "**no verdict**" in rows["ppo.py Acrobot-v1"]
        and "no run scored" in rows["ppo.py Acrobot-v1"]
    )
    assert "## Failed runs" in text and "ppo__Acrobot-v1__1" in text and "no-such-flag" in text
    assert "## Missing scripts" in text and "not_written_yet.py" in text
    assert f"Verdict rule: {stats.RULE}" in text

    # the scores are each run's final evaluation, aggregated as stats says
    stem = reports[0].stem
    results = json.loads((tmp / "reports" / "t" / stem / "results.json").read_text())
    cell = next(c for c in results["cells"] if c["script"] == "dqn.py")
    for seed in (1, 2):
        evals = [
            r
            for r in read_rows(runs / f"dqn__CartPole-v1__{seed}")
            if r["name"] == "eval/episodic_return"
        ]
        assert cell["scores"][str(seed)] == pytest.approx(np.mean([r["value"] for r in evals]))
        # one evaluation
        assert cell["eval_curves"][str(seed)] == [[600, pytest.approx(cell["scores"][str(seed)])]]
    x = np.array(list(cell["scores"].values()))
    assert cell["summary"]["mean"] == pytest.approx(x.mean()) and cell["summary"][
        "std"
    ] == pytest.approx(x.std())
    for script in ("ppo", "dqn"):
        png = (
            tmp
            / "reports"
            / "t"
            / stem
            / f"{script}__CartPole-v1__{512 if script == 'ppo' else 600}.png"
        )
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({stem}/{png.name})" in text


def test_resume_redoes_only_unfinished_runs(suite_run):
    tmp, argv, _ = suite_run
    runs = tmp / "runs"
    kept = {
        d.name: (d / "metrics.csv").stat().st_mtime_ns for d in runs.iterdir() if run_finished(d)
    }
    # make dqn seed 2 half-done: drop its final evaluation, as if it had been killed before it
    half = runs / "dqn__CartPole-v1__2" / "metrics.csv"
    lines = half.read_text().splitlines()
    half.write_text("\n".join(ln for ln in lines if ",eval/episodic_return," not in ln) + "\n")
    assert not run_finished(half.parent)
    crashed_log = (runs / "ppo__Acrobot-v1__1" / "output.log").stat().st_mtime_ns

    assert bench.main(argv) == 1
    assert run_finished(half.parent)
    redone = read_rows(half.parent)
    assert sum(r["name"] == "eval/episodic_return" for r in redone) == 2
    assert [r["name"] for r in redone].count("charts/train_seconds") == 1, (
        "redone from the start, not appended to"
    )
    for name, mtime in kept.items():
        if name != "dqn__CartPole-v1__2":
            assert (runs / name / "metrics.csv").stat().st_mtime_ns == mtime, f"{name} was redone"
    assert (runs / "ppo__Acrobot-v1__1" / "output.log").stat().st_mtime_ns != crashed_log, (
        "crashed run not retried"
    )


HALF_DONE = RunSpec(
    "ppo.py",
    "CartPole-v1",
    seed=1,
    total_timesteps=10_000,
    score="final_eval",
    flags=("--num-envs", "4", "--num-steps", "32", "--update-epochs", "2", "--eval-episodes", "2"),
)


def test_a_run_stopped_halfway_goes_on_from_its_checkpoint(tmp_path):
    """A run killed or stopped with Ctrl-C is not redone: the suite runner resumes it from its
    checkpoint, and the rows it had logged stay as they were."""
    run_dir = tmp_path / HALF_DONE.name
    step = ctrl_c(HALF_DONE.script, HALF_DONE.command_flags("cpu"), run_dir)
    assert 0 < step < HALF_DONE.total_timesteps
    (run_dir / "output.log").write_text("the first attempt\n")
    before = read_rows(run_dir)
    outcome = execute(HALF_DONE, run_dir)
    assert outcome.status == "ok", outcome.error
    assert run_finished(run_dir)
    after = read_rows(run_dir)
    assert [r for r in after if r["global_step"] <= step] == before
    assert max(r["global_step"] for r in after) > step
    log = (run_dir / "output.log").read_text()
    assert log.startswith("the first attempt\n") and "--- resumed from" in log
    assert "redone from the start" not in log


@pytest.mark.parametrize("change", ["other flags", "corrupt checkpoint", "no checkpoint"])
def test_a_half_done_run_that_cannot_resume_is_redone_from_the_start(change, tmp_path):
    """A half-done run directory of other flags (here another seed), with a checkpoint the script
    refuses, or with no checkpoint is deleted and the run made from the start."""
    run_dir = tmp_path / HALF_DONE.name
    seed = 2 if change == "other flags" else 1
    flags = dataclasses.replace(HALF_DONE, seed=seed).command_flags("cpu")
    ctrl_c(HALF_DONE.script, flags, run_dir)
    if change == "corrupt checkpoint":
        data = bytearray((run_dir / "checkpoint.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (run_dir / "checkpoint.pt").write_bytes(bytes(data))
    if change == "no checkpoint":
        (run_dir / "checkpoint.pt").unlink()
    first_wall_time = read_rows(run_dir)[0]["wall_time"]
    outcome = execute(HALF_DONE, run_dir)
    assert outcome.status == "ok", outcome.error
    assert json.loads((run_dir / "config.json").read_text())["args"]["seed"] == 1
    assert read_rows(run_dir)[0]["wall_time"] != first_wall_time
    log = (run_dir / "output.log").read_text()
    if change == "corrupt checkpoint":
        assert "--- the resume failed: the run is redone from the start ---" in log
    else:
        assert "--- resumed from" not in log


def test_ray_backend(suite_run, tmp_path):
    pytest.importorskip("ray")
    tmp, _, _ = suite_run
    specs, _ = bench.plan(bench.load_suites(tmp / "suites.toml")["t"], seeds=1)
    specs = [s for s in specs if s.script in ("ppo.py",)]  # the ppo smoke run and the crashing one
    assert len(specs) == 2
    outcomes = bench.run_all(specs, tmp_path, jobs=1, backend="ray", progress=False)
    ok = next(o for o in outcomes if o.spec.env_id == "CartPole-v1")
    bad = next(o for o in outcomes if o.spec.env_id == "Acrobot-v1")
    assert ok.status == "ok" and bad.status == "failed" and "no-such-flag" in bad.error
    # CPU runs are deterministic: the Ray run scores exactly as the same run made by the local
    # backend
    assert score(read_metrics(ok.run_dir), "final_eval") == score(
        read_metrics(tmp / "runs" / ok.spec.name), "final_eval"
    )


def test_ray_backend_on_a_separate_cluster(ray_cluster, suite_run, tmp_path):
    """The smoke suite on a cluster reached by its address: the runs are made in the workers'
    temporary directories and come back to the driver's run directories, where they score exactly as
    local runs."""
    address, env, _ = ray_cluster
    argv = [
        "--suite",
        "smoke",
        "--backend",
        "ray",
        "--ray-address",
        address,
        "--out",
        str(tmp_path / "runs"),
        "--report-dir",
        str(tmp_path / "reports"),
    ]
    # the driver in a process of its own, as a user runs it: no Ray state left by other tests of
    # this process
    driver = [sys.executable, str(Path(bench.__file__)), *argv]
    out = subprocess.run(
        driver, capture_output=True, text=True, env=env, cwd=Path(bench.__file__).parents[1]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    local = suite_run[0] / "runs"  # the same scripts, flags and seeds run by the local backend
    for name in (
        "ppo__CartPole-v1__1",
        "ppo__CartPole-v1__2",
        "dqn__CartPole-v1__1",
        "dqn__CartPole-v1__2",
    ):
        run_dir = tmp_path / "runs" / name
        assert run_finished(run_dir) and (run_dir / "output.log").is_file()
        made_in = json.loads((run_dir / "config.json").read_text())["args"]["run_dir"]
        assert "canonrl-run-" in made_in and not made_in.startswith(str(tmp_path)), made_in
        assert score(read_metrics(run_dir), "final_eval") == score(
            read_metrics(local / name), "final_eval"
        )
    assert len(list((tmp_path / "reports").glob("smoke/smoke-cpu-*.md"))) == 1
    # resuming needs no cluster: every run is finished on the driver's disk
    mtimes = {d: (d / "metrics.csv").stat().st_mtime_ns for d in (tmp_path / "runs").iterdir()}
    assert (
        subprocess.run(
            driver, capture_output=True, env=env, cwd=Path(bench.__file__).parents[1]
        ).returncode
        == 0
    )
    assert all((d / "metrics.csv").stat().st_mtime_ns == t for d, t in mtimes.items())
    assert len(list((tmp_path / "reports").glob("smoke/smoke-cpu-*.md"))) == 2


def test_ray_address_that_cannot_be_reached(tmp_path, capsys):
    pytest.importorskip("ray")
    argv = [
        "--suite",
        "smoke",
        "--backend",
        "ray",
        "--ray-address",
        f"127.0.0.1:{free_port()}",
        "--out",
        str(tmp_path),
    ]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot reach a Ray cluster at 127.0.0.1:"), (
        err
    )
    assert bench.main(["--suite", "smoke", "--backend", "ray", "--ray-address", "nonsense"]) == 2
    assert "is not host:port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--suite", "smoke", "--ray-address", "127.0.0.1:1"])  # needs --backend ray
    assert not list(tmp_path.iterdir())


class QuietHTTPHandler(http.server.BaseHTTPRequestHandler):
    # the requests it refuses would be logged on stderr, which the test reads
    def log_message(self, *args):
        pass


def test_ray_address_that_is_not_ray(tmp_path, capsys):
    """An HTTP server at --ray-address: one line within seconds (ray.init retried for minutes),
    nothing written."""
    pytest.importorskip("ray")
    server = http.server.HTTPServer(("127.0.0.1", 0), QuietHTTPHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_port}"
        argv = [
            "--suite",
            "smoke",
            "--backend",
            "ray",
            "--ray-address",
            address,
            "--out",
            str(tmp_path),
        ]
        assert bench.main(argv) == 2
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {address} does not answer as a Ray cluster"
    ), err
    assert not list(tmp_path.iterdir())


def test_missing_scripts_are_reported_not_run(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(
        '[p]\nseeds = 1\n[[p.run]]\nscript = "qmix_smac_lite_x.py"\nenv_id = "3m"\n'
        'total_timesteps = 10\nscore = "final_eval"\n'
    )
    assert (
        bench.main(
            ["--suite", "p", "--suites-file", str(tmp_path / "s.toml"), "--out", str(tmp_path)]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "missing scripts" in err and "qmix_smac_lite_x.py" in err and "nothing to run" in err
    specs, missing = bench.plan(bench.load_suites()["marl"])
    # the planned suites parse
    assert all(s.script not in missing for s in specs) and specs + missing


def test_first_seed_plans_the_later_seeds_only(tmp_path, capsys):
    """--first-seed 2 --seeds 2 plans seeds 2 and 3 of every run (seed 1 of a suite reported earlier
    is not rerun); --envs plans the runs on those envs only."""
    suite = bench.load_suites()["hopper-cpu"]
    specs, _ = bench.plan(suite, 2, None, first_seed=2)
    assert sorted({s.seed for s in specs}) == [2, 3] and len(specs) == 2 * len(suite.runs)
    # the default is still seeds 1..N
    assert {s.seed for s in bench.plan(suite)[0]} == {1, 2, 3, 4, 5}
    pendulum, _ = bench.plan(bench.load_suites()["continuous-cpu"], envs=["Pendulum-v1"])
    assert {s.env_id for s in pendulum} == {"Pendulum-v1"} and len(pendulum) == 6 * 5
    for bad in (["--first-seed", "-1"], ["--seeds", "0"], ["--envs", "Pendulum-v0"]):
        with pytest.raises(SystemExit):
            bench.main(["--suite", "hopper-cpu", "--out", str(tmp_path), *bad])
    err = capsys.readouterr().err
    assert "--first-seed must be >= 0" in err and "has no runs on ['Pendulum-v0']" in err
    assert not list(tmp_path.iterdir())


def test_every_suite_entry_is_well_formed():
    suites = bench.load_suites()
    assert {"smoke", "classic", "continuous", "atari", "marl"} <= set(suites)
    refs = load_references()
    for suite in suites.values():
        for r in suite.runs:
            assert r["score"] in ("last100_train", "final_eval", "max_eval", "final_win_rate")
            if r.get("reference"):
                assert any(x.id == r["reference"] for x in refs)
    # the gates' references are made from the gates' runs: reported as "self", never judged against
    # themselves
    assert all(r["self_reference"] for r in suites["gates"].runs)
    # every classic cell has a reference to be judged against (named, or found by script, env and
    # score)
    for r in suites["classic"].runs:
        assert r.get("reference") or find_reference(
            r["script"], r["env_id"], r["score"], r["total_timesteps"]
        )
    # MuJoCo cells name CleanRL's number (v4) as theirs: no v5 reference exists to be found by env
    # id
    for r in suites["continuous"].runs:
        ref = next(x for x in refs if x.id == r["reference"])
        assert (ref.script, ref.score, ref.total_timesteps) == (
            r["script"],
            r["score"],
            r["total_timesteps"],
        )


def test_references_file_rejects_values_that_do_not_fit_the_seeds(tmp_path):
    entry = (
        '[[reference]]\nid = "x"\nscript = "ppo.py"\nenv_id = '
        '"CartPole-v1"\ntotal_timesteps = 1000\n'
        'score = "final_eval"\nsource = "test"\n'
    )
    for bad, why in (
        ("seeds = [1, 2]\nvalues = [1.0]\n", "1 values for 2 seeds"),
        ("seeds = [1, 2]\nvalues = [1.0, 3.0]\nmean = 1.0\n", "not the mean"),
    ):
        (tmp_path / "r.toml").write_text(entry + bad)
        with pytest.raises(ValueError, match=why):
            load_references(tmp_path / "r.toml")


def test_a_gate_that_stops_early_takes_its_thresholds_from_the_evidence_curves(tmp_path):
    evidence = (
        '[[reference]]\nid = "ev"\nscript = '
        '"vdn_smac_lite.py"\nenv_id = "3m"\ntotal_timesteps = '
        "300\n"
        'score = "final_win_rate"\nsource = "test"\nseeds = [1, 2]\nvalues = [0.9, 1.0]\n'
        "auc_values = [0.5, 0.6]\neval_steps = [100, 200, "
        "300]\neval_curves = [[0.2, 0.4, 0.9], [0.1, 0.7, 1.0]]\n"
    )
    gate = (
        '[[reference]]\nid = "gate"\nscript = '
        '"vdn_smac_lite.py"\nenv_id = "3m"\ntotal_timesteps = '
        "300\n"
        'score = "final_win_rate"\nsource = "test"\nseeds = '
        '[1]\nevidence = "ev"\nauc_margin = 0.1\n'
    )
    (tmp_path / "r.toml").write_text(evidence + gate + "threshold = 0.3\nstop_at = 200\n")
    g = next(r for r in load_references(tmp_path / "r.toml") if r.id == "gate")
    assert g.auc_threshold == pytest.approx(min((0.2 + 0.4) / 2, (0.1 + 0.7) / 2) - 0.1)
    assert g.command_flags(1)[:6] == [
        "--env-id", "3m", "--total-timesteps", "300", "--stop-at", "200"
    ]  # fmt: skip
    # seed 1 is at 0.4 at 200
    for bad, why in (
        ("threshold = 0.5\nstop_at = 200\n", "below the threshold"),
        ("threshold = 0.3\nstop_at = 250\n", "must be one of the eval_steps"),
    ):
        (tmp_path / "r.toml").write_text(evidence + gate + bad)
        with pytest.raises(ValueError, match=why):
            load_references(tmp_path / "r.toml")
    (tmp_path / "r.toml").write_text(evidence.replace("[0.1, 0.7, 1.0]", "[0.1, 0.7, 0.8]"))
    with pytest.raises(ValueError, match="do not end at the per-seed values"):
        load_references(tmp_path / "r.toml")


def test_run_finished_tells_final_from_intermediate_eval(tmp_path):
    def make(rows, **args):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "config.json").write_text(
            json.dumps(
                {"args": {"num_envs": 1, "eval_episodes": 2, "total_timesteps": 1000, **args}}
            )
        )
        (d / "metrics.csv").write_text(
            "global_step,wall_time,name,value\n" + "".join(f"{s},0.0,{n},1.0\n" for s, n in rows)
        )
        return d

    ev = "eval/episodic_return"
    assert run_finished(
        make(
            [(500, "train/episodic_return"), (1000, "charts/train_seconds"), (1000, ev), (1000, ev)]
        )
    )
    assert not run_finished(make([(1000, ev)]))  # killed in the middle of the final evaluation
    # an evaluation during training (--eval-every)
    assert not run_finished(make([(500, ev), (500, ev)]))
    # ppo-like: 8 x 32 = 256 steps per iteration, 1000 steps end at 768
    assert run_finished(make([(768, ev), (768, ev)], num_envs=8, num_steps=32))
    assert not run_finished(make([(512, ev), (512, ev)], num_envs=8, num_steps=32))
    assert not run_finished(tmp_path / "nothing")


def test_iqm_and_stratified_bootstrap():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0, -50.0, 5.0, 6.0])
    assert stats.iqm(x) == pytest.approx(np.sort(x)[2:6].mean())  # the middle 50% of 8 scores
    low, high = stats.iqm_ci(x)
    assert low < stats.iqm(x) < high
    assert stats.iqm_ci([7.0, 7.0, 7.0]) == (7.0, 7.0)
    # stratified: resampling within each task keeps every bootstrap sample's task sizes, so two
    # tasks far apart give IQMs between them; an unstratified resampling could draw all scores from
    # one task
    a, b = np.zeros(4), np.full(4, 10.0)
    low, high = stats.iqm_ci(a, b)
    assert 0.0 < low <= 5.0 <= high < 10.0
    s = stats.summarize([10.0, 12.0, 11.0])
    assert (s.n, s.mean) == (3, pytest.approx(11.0)) and s.ci_low <= s.iqm <= s.ci_high


REFS = {r.id: r for r in load_references()}
RANDOM = load_random_scores()


def _judge(scores, ref_id):
    """Our per-seed scores against a reference of references.toml, as the report judges them."""
    return judge(scores, REFS[ref_id].env_id, REFS[ref_id], RANDOM)


def test_verdict_fails_clearly_worse_results():
    """The old rule (the IQM's bootstrap CI, i.e. the best of 3 seeds, within 5% of the reference
    mean) passed each of these; now 3 seeds get no verdict and the 5-seed versions fail."""
    for scores, ref_id in (
        ([500.0, 100, 100], "cleanrl-ppo-CartPole-v1"),
        ([-85.0, -300, -500], "cleanrl-ppo-Acrobot-v1"),
        ([-200.0, -200, -200], "cleanrl-dqn-MountainCar-v0"),
    ):
        v = _judge(scores, ref_id)
        assert (v.label, v.why) == ("no verdict", "3 seeds, 5 needed"), (scores, ref_id)
    for scores, ref_id in (
        ([500.0, 100, 100, 100, 100], "cleanrl-ppo-CartPole-v1"),
        # t-interval reaches 532
        ([500.0, 500, 100, 100, 100], "cleanrl-ppo-CartPole-v1"),
        ([500.0, 500, 500, 500, 100], "cleanrl-ppo-CartPole-v1"),
        ([-85.0, -300, -500, -500, -500], "cleanrl-ppo-Acrobot-v1"),
        ([-85.0, -300, -500, -85, -300], "cleanrl-ppo-Acrobot-v1"),
        # random level against -194.95 +- 8.48
        ([-200.0] * 5, "cleanrl-dqn-MountainCar-v0"),
        ([-200.0] * 10, "cleanrl-dqn-MountainCar-v0"),
        ([300.0] * 5, "cleanrl-dqn-CartPole-v1"),
    ):
        assert _judge(scores, ref_id).label == "FAIL", (scores, ref_id)
    # PPO's MountainCar reference is the random policy's -200: nothing scores below it, so nothing
    # fails it, and the floor of the scale (5% of the gap to the reward_threshold -110) keeps the
    # normalisation finite
    v = _judge([-200.0] * 5, "cleanrl-ppo-MountainCar-v0")
    assert v.label == "PASS" and (v.mean, v.reference) == (0.0, 0.0)
    assert (
        stats.scale(-200.0, -200.0, -110.0) == pytest.approx(4.5)
        and stats.scale(-200.0, -200.0, None) is None
    )
    # good results pass; the reference itself sits at 1
    for scores, ref_id in (
        ([500.0] * 5, "cleanrl-ppo-CartPole-v1"),
        ([-80.0, -85, -90, -88, -84], "cleanrl-ppo-Acrobot-v1"),
        ([-200.0, -200, -185, -200, -190], "cleanrl-dqn-MountainCar-v0"),
    ):
        v = _judge(scores, ref_id)
        assert v.label == "PASS" and v.reference == pytest.approx(1.0), (scores, ref_id, v)


CLEANRL = [
    "cleanrl-ppo-CartPole-v1",
    "cleanrl-ppo-Acrobot-v1",
    "cleanrl-ppo-MountainCar-v0",
    "cleanrl-dqn-CartPole-v1",
    "cleanrl-dqn-Acrobot-v1",
    "cleanrl-dqn-MountainCar-v0",
]


def test_verdict_passes_runs_drawn_from_the_reference():
    """Seeds drawn from the reference's own distribution (normal, its mean and std) pass >= 95 times
    in 100, for 5 and 10 seeds; seeds drawn at 0.7 of the way from random to the reference fail >=
    95 times in 100 where the reference's spread is small against its distance from random (not
    MountainCar: 8.48 against 5.05)."""
    rng = np.random.default_rng(0)
    for ref_id in CLEANRL:
        ref = REFS[ref_id]
        for n in (5, 10):
            passed = sum(
                _judge(rng.normal(ref.mean, ref.std, n), ref_id).label == "PASS" for _ in range(100)
            )
            assert passed >= 95, (ref_id, n, passed)
            if "MountainCar" not in ref_id:
                worse = RANDOM[ref.env_id].random + 0.7 * (ref.mean - RANDOM[ref.env_id].random)
                failed = sum(
                    _judge(rng.normal(worse, ref.std, n), ref_id).label == "FAIL"
                    for _ in range(100)
                )
                assert failed >= 95, (ref_id, n, failed)


def test_verdict_ignores_reward_offsets():
    x = np.array([400.0, 450, 480, 300, 490])
    base = stats.verdict(x, 490.04, 6.12, 3, 21.61, 475.0)
    for c in (-1000.0, 37.5, 1e4):
        shifted = stats.verdict(x + c, 490.04 + c, 6.12, 3, 21.61 + c, 475.0 + c)
        assert shifted.label == base.label
        assert (shifted.mean, shifted.low, shifted.high) == pytest.approx(
            (base.mean, base.low, base.high)
        )


def test_verdict_other_cases_and_t_interval():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.mean_ci(x) == pytest.approx(
        scipy_stats.t.interval(0.95, 4, loc=3.0, scale=scipy_stats.sem(x))
    )
    assert stats.verdict(x, None).label == "n/a"
    assert stats.verdict(x, 3.0, 1.0, 3, 0.0, 10.0, self_reference=True).label == "self"
    assert stats.verdict(x, 3.0, 1.0, 3, None).why == "no random-policy score for the env"
    # reference below random, no scale
    assert stats.verdict(x, -1.0, 1.0, 3, 0.0, None).label == "no verdict"
    # test 2 needs the reference's std over >= 2 seeds: without it only our own t-interval judges
    wide = [500.0, 500, 100, 100, 100]
    assert stats.verdict(wide, 490.04, None, 0, 21.61, 475.0).label == "PASS"
    assert stats.verdict(wide, 490.04, 6.12, 3, 21.61, 475.0).label == "FAIL"


def test_random_policy_scores_reproduce():
    """benchmark/random_scores.toml is what random_returns measures, and `solved` is Gymnasium's
    reward_threshold."""
    import gymnasium as gym

    table = load_random_scores()
    assert {"CartPole-v1", "Acrobot-v1", "MountainCar-v0"} <= set(table)
    for env_id, r in table.items():
        x = random_returns(env_id, r.episodes, r.seed)
        assert (round(x.mean(), 2), round(x.std(), 2)) == (
            pytest.approx(r.random),
            pytest.approx(r.std),
        ), env_id
        if env_id not in LM_BASES:  # a language-model task, not a Gymnasium env
            assert r.solved == gym.spec(register(env_id)).reward_threshold


def _fake_run(run_dir, score_name, value, final_eval=None):
    """A run directory whose metrics.csv scores `value` by `score_name` (and, if given, a final
    evaluation)."""
    run_dir.mkdir(parents=True)
    rows = [f"{s},0.0,{score_name},{value}\n" for s in (10, 20)]
    if final_eval is not None:
        rows.append(f"20,0.0,eval/episodic_return,{final_eval}\n")
    (run_dir / "metrics.csv").write_text("global_step,wall_time,name,value\n" + "".join(rows))


def test_report_verdicts_and_names(tmp_path):
    """A report from finished runs: PASS, FAIL, no verdict and self cells; a second report of the
    same suite in the same minute gets a name of its own and the first is left as it was."""
    cells = {  # (script, env, budget, score, reference, self_reference): per-seed scores
        ("ppo.py", "CartPole-v1", 500000, "last100_train", None, False): [
            500.0,
            495,
            490,
            500,
            480,
        ],
        ("ppo.py", "Acrobot-v1", 500000, "last100_train", None, False): [
            -85.0,
            -300,
            -500,
            -500,
            -500,
        ],
        ("dqn.py", "CartPole-v1", 500000, "last100_train", None, False): [500.0, 100, 100],
        ("ppo.py", "CartPole-v1", 100000, "final_eval", "ours-ppo-CartPole-v1-100k", True): [500.0]
        * 10,
    }
    outcomes = []
    for (script, env, budget, method, ref, self_ref), scores in cells.items():
        for seed, value in enumerate(scores, 1):
            spec = bench.RunSpec(script, env, seed, budget, method, (), ref, self_ref)
            run_dir = tmp_path / "runs" / f"{spec.name}-{budget}"
            _fake_run(
                run_dir,
                "train/episodic_return" if method == "last100_train" else "eval/episodic_return",
                value,
                final_eval=400.0 + seed
                if (script, env) == ("ppo.py", "CartPole-v1") and method == "last100_train"
                else None,
            )
            outcomes.append(bench.Outcome(spec, run_dir, "ok"))
    suite = bench.Suite("t", "test", 5)
    now = datetime.datetime(2026, 1, 2, 3, 4)
    first = write_report(
        suite, outcomes, [], "cpu", tmp_path / "reports", load_references(), now=now
    )
    commit, dirty = git_head()
    assert first.name == f"t-cpu-2026-01-02-0304-{commit}{'-dirty' if dirty else ''}.md"
    text = first.read_text()
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| ppo.py") or line.startswith("| dqn.py")
    ]
    verdicts = [re.search(r"\*\*(.+?)\*\*", row).group(1) for row in rows]
    assert verdicts == ["PASS", "FAIL", "no verdict", "self"], rows
    assert "the reference is made from these runs" in rows[3] and "3 seeds, 5 needed" in rows[2]
    # the final evaluation beside CleanRL's metric
    assert "| 403.0 ± 1.4 (5) |" in rows[0] and "| – |" in rows[1], rows
    results = json.loads((first.with_suffix("") / "results.json").read_text())
    assert [c["verdict"]["label"] for c in results["cells"]] == verdicts

    second = write_report(
        suite, outcomes[:5], [], "cpu", tmp_path / "reports", load_references(), now=now
    )
    assert second.name == first.stem + "-2.md" and second.with_suffix("").is_dir()
    assert first.read_text() == text, "the first report was overwritten"


def test_report_judges_a_script_against_sb3_of_the_same_report(tmp_path):
    """compare_with: a second row under ours judges the same runs against the SB3 runs of the same
    report (PASS when level, FAIL when far below them), one row per script it names; without those
    runs it says so; a suite naming a row it lacks is refused."""
    sb3 = [-150.0, -160, -155, -170, -145]
    groups = {
        (
            "sac_continuous.py",
            "rlzoo-sac-Pendulum-v1",
            ("sb3:sac_continuous.py", "td3_continuous.py"),
        ): [-152.0, -158, -149, -165, -160],
        ("sb3:sac_continuous.py", "rlzoo-sac-Pendulum-v1", ()): sb3,
        ("td3_continuous.py", "rlzoo-td3-Pendulum-v1", ("sb3:td3_continuous.py",)): [
            -900.0,
            -950,
            -1000,
            -870,
            -990,
        ],
        ("sb3:td3_continuous.py", "rlzoo-td3-Pendulum-v1", ()): sb3,
        ("ddpg_continuous.py", "rlzoo-ddpg-Pendulum-v1", ("sb3:ddpg_continuous.py",)): [-150.0] * 5,
    }
    outcomes = []
    for (script, ref, other), scores in groups.items():
        for seed, value in enumerate(scores, 1):
            spec = bench.RunSpec(
                script, "Pendulum-v1", seed, 20000, "final_eval", (), ref, False, other
            )
            _fake_run(tmp_path / spec.name, "eval/episodic_return", value)
            outcomes.append(bench.Outcome(spec, tmp_path / spec.name, "ok"))
    table, _ = cells(outcomes, load_references())
    rows = [(c["script"], c.get("compared"), c["verdict"].label) for c in table]
    assert rows == [
        ("sac_continuous.py", None, "PASS"),
        ("sac_continuous.py", "sb3:sac_continuous.py", "PASS"),
        # a second script it is compared with
        ("sac_continuous.py", "td3_continuous.py", "PASS"),
        ("sb3:sac_continuous.py", None, "PASS"),
        ("td3_continuous.py", None, "FAIL"),
        ("td3_continuous.py", "sb3:td3_continuous.py", "FAIL"),
        ("sb3:td3_continuous.py", None, "PASS"),
        ("ddpg_continuous.py", None, "PASS"),
        ("ddpg_continuous.py", "sb3:ddpg_continuous.py", "no verdict"),
    ], rows
    assert table[1]["reference"].values == sb3 and table[1]["reference"].seeds == [1, 2, 3, 4, 5]
    assert "no finished run of sb3:ddpg_continuous.py" in table[-1]["verdict"].why
    text = write_report(
        bench.Suite("t", "test", 5), outcomes, [], "cpu", tmp_path / "reports", load_references()
    ).read_text()
    assert "the runs of the row above, against this report's sb3:sac_continuous.py" in text
    bad = (
        "[t]\nseeds = 1\n[[t.run]]\nscript = "
        '"sac_continuous.py"\nenv_id = '
        '"Pendulum-v1"\ntotal_timesteps = 10\n'
        'score = "final_eval"\ncompare_with = "sb3:sac_continuous.py"\n'
    )
    (tmp_path / "s.toml").write_text(bad)
    with pytest.raises(
        ValueError, match="compares with 'sb3:sac_continuous.py', which the suite does not run"
    ):
        bench.load_suites(tmp_path / "s.toml")


def test_a_report_joins_the_seeds_of_an_earlier_report(tmp_path, capsys):
    """--seeds-from: seeds 1-3 reported earlier and seeds 4-5 run now make one 5-seed report with
    verdicts (ours against SB3 of the same report too), each seed's source named; a report of
    another suite, one that scores a seed again with another value, or one with nothing to add is
    refused before anything runs."""
    suite = bench.Suite(
        "s",
        "test",
        5,
        [
            {
                "script": "sac_continuous.py",
                "env_id": "Pendulum-v1",
                "total_timesteps": 20000,
                "score": "final_eval",
                "compare_with": "sb3:sac_continuous.py",
            },
            {
                "script": "sb3:sac_continuous.py",
                "env_id": "Pendulum-v1",
                "total_timesteps": 20000,
                "score": "final_eval",
            },
        ],
    )
    ours, sb3 = [-152.0, -158, -149, -165, -160], [-150.0, -160, -155, -170, -145]

    def outcomes(seeds, where):
        out = []
        for spec in bench.plan(suite, len(seeds), first_seed=seeds[0])[0]:
            value = (ours if spec.script == "sac_continuous.py" else sb3)[spec.seed - 1]
            _fake_run(where / spec.name, "eval/episodic_return", value)
            out.append(bench.Outcome(spec, where / spec.name, "ok"))
        return out

    refs = load_references()
    first = write_report(
        suite,
        outcomes([1, 2, 3], tmp_path / "a"),
        [],
        "cpu",
        tmp_path / "reports",
        refs,
        now=datetime.datetime(2026, 1, 2, 3, 4),
    )
    now_runs = outcomes([4, 5], tmp_path / "b")
    earlier = bench.seeds_from(first, suite, [o.spec for o in now_runs], [])
    assert sorted((o.spec.script, o.spec.seed) for o in earlier) == sorted(
        (script, seed)
        for script in ("sac_continuous.py", "sb3:sac_continuous.py")
        for seed in (1, 2, 3)
    )
    assert all(o.status == "reported" and o.finished for o in earlier)
    table, _ = cells(now_runs + earlier, refs)
    assert [(c["script"], c.get("compared"), len(c["scores"])) for c in table] == [
        ("sac_continuous.py", None, 5),
        ("sac_continuous.py", "sb3:sac_continuous.py", 5),
        ("sb3:sac_continuous.py", None, 5),
    ]
    assert table[1]["verdict"].label == "PASS" and table[1]["reference"].values == sb3
    text = write_report(
        suite, now_runs + earlier, [], "cpu", tmp_path / "reports", refs
    ).read_text()
    assert (
        f"seeds 1, 2, 3 (their scores, not their runs): from the earlier report `{first.stem}.md`"
        in text
    )
    assert "seed 1: -152.00 (earlier report)" in text and "seed 4: -165.00," in text
    assert "3 seed(s) from an earlier report; the curve shows the others" in text

    with pytest.raises(ValueError, match="scores no seed"):  # every seed it has is run again now
        bench.seeds_from(first, suite, bench.plan(suite, 3)[0], [])
    other = bench.Suite("other", "test", 5, suite.runs)
    with pytest.raises(ValueError, match="is a report of suite 's', not 'other'"):
        bench.seeds_from(first, other, [o.spec for o in now_runs], [])
    clash = [dataclasses.replace(earlier[0], reported={**earlier[0].reported, "score": 0.0})]
    with pytest.raises(ValueError, match="give one of them"):
        bench.seeds_from(first, suite, [o.spec for o in now_runs], clash)
    (tmp_path / "s.toml").write_text(
        '[s]\nseeds = 1\n[[s.run]]\nscript = "ppo.py"\nenv_id = "CartPole-v1"\n'
        'total_timesteps = 10\nscore = "final_eval"\n'
    )
    with pytest.raises(SystemExit):
        bench.main(
            [
                "--suite",
                "s",
                "--suites-file",
                str(tmp_path / "s.toml"),
                "--out",
                str(tmp_path / "c"),
                "--seeds-from",
                str(tmp_path / "none.md"),
            ]
        )
    assert "--seeds-from:" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_an_offline_suite_makes_its_datasets_and_runs_on_them(tmp_path, capsys):
    """A suite's `datasets` (benchmark/datasets.py STANDARD names) that its chosen runs read (by
    path) are made before them, and only those; a name the maker does not know is refused when the
    suites file is read."""
    entry = (
        '[o]\nseeds = 1\ndatasets = ["pendulum-medium-tiny-v0", '
        '"cartpole-medium-tiny-v0"]\n[[o.run]]\n'
        'script = "bc_continuous.py"\nenv_id = '
        '"Pendulum-v1"\ntotal_timesteps = 200\nscore = '
        '"final_eval"\n'
        'flags = ["--dataset", "runs/datasets/pendulum-medium-tiny-v0", "--eval-episodes", "2"]\n'
        '[[o.run]]\nscript = "bc_discrete.py"\nenv_id = "CartPole-v1"\ntotal_timesteps = 200\n'
        'score = "final_eval"\nflags = ["--dataset", "runs/datasets/cartpole-medium-tiny-v0"]\n'
    )
    (tmp_path / "s.toml").write_text(entry)
    assert (
        bench.main(
            [
                "--suite",
                "o",
                "--suites-file",
                str(tmp_path / "s.toml"),
                "--out",
                str(tmp_path / "runs"),
                "--report-dir",
                str(tmp_path / "reports"),
                "--scripts",
                "bc_continuous.py",
            ]
        )
        == 0
    )
    made = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dataset ")]
    assert len(made) == 1 and made[0].endswith("pendulum-medium-tiny-v0")
    assert run_finished(tmp_path / "runs" / "bc_continuous__Pendulum-v1__1")
    (tmp_path / "bad.toml").write_text(entry.replace('"cartpole-medium-tiny-v0"]', '"nowhere-v0"]'))
    with pytest.raises(ValueError, match="does not make: \\['nowhere-v0'\\]"):
        bench.load_suites(tmp_path / "bad.toml")


def test_report_path_never_reuses_a_name(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4)
    a = new_report_path(tmp_path, "speed", "cpu", now)
    a.write_text("first")
    b = new_report_path(tmp_path, "speed", "cpu", now)
    (a.parent / (a.stem + "-3")).mkdir()  # a curves folder without its report still holds the name
    c = new_report_path(tmp_path, "speed", "cpu", now)
    assert (b.name, c.name) == (a.stem + "-2.md", a.stem + "-4.md") and a.read_text() == "first"


def test_smac_lite_reports_of_one_minute_keep_apart(tmp_path):
    """The smac_lite tools (rules, battles, speed) run map after map within a minute: each report
    gets its own file."""
    from benchmark.smac_lite_battles import report_path

    now = datetime.datetime(2026, 1, 2, 3, 4)
    first = report_path("rules", "cpu", now, tmp_path)
    first.write_text("2s3z")
    second = report_path("rules", "cpu", now, tmp_path)
    assert second.name == first.stem + "-2.md" and first.read_text() == "2s3z"
    assert first.parent == tmp_path / "smac_lite-rules"


def test_find_reference_prefers_same_budget():
    refs = [
        Reference("a", "x.py", "E-v1", 500, "final_eval", "s", 3, mean=1.0),
        Reference("b", "x.py", "E-v1", 100, "final_eval", "s", 3, mean=2.0),
        Reference("c", "x.py", "E-v1", 100, "last100_train", "s", 3, mean=3.0),
        Reference("d", "x.py", "E-v1", 100, "final_eval", "s", 3, threshold=1.0),
    ]
    assert find_reference("x.py", "E-v1", "final_eval", 100, refs).id == "b"
    assert find_reference("x.py", "E-v1", "final_eval", 400, refs).id == "a"
    assert find_reference("x.py", "E-v1", "max_eval", 100, refs) is None


def test_find_reference_prefers_the_same_learning_flags():
    """A variant (other learning flags) is matched to its own reference where there is one; the
    evaluation schedule and device flags do not count."""
    refs = [
        Reference("defaults", "x.py", "E-v1", 100, "final_eval", "s", 3, mean=1.0),
        Reference(
            "dr", "x.py", "E-v1", 100, "final_eval", "s", 3, mean=2.0, flags=["--loss-type", "dr"]
        ),
    ]
    find = functools.partial(find_reference, "x.py", "E-v1", "final_eval", 100, refs)
    assert find(["--eval-every", "960", "--cuda"]).id == "defaults"
    assert find(["--loss-type", "dr", "--eval-episodes", "5"]).id == "dr"
    assert find(["--loss-type", "token"]).id == "defaults", "none the same: the closest, said so"
    assert learning_flags(["--eval-every", "9", "--save-model", "--lr", "1"]) == ["--lr", "1"]


def test_speed_maps_our_defaults_onto_sb3():
    from benchmark.runs import load_script

    a = load_script("ppo.py").Args()
    n_envs, kw = sb3_baseline.ppo_same(a)
    assert (
        n_envs == a.num_envs and kw["n_steps"] == a.num_steps and kw["n_epochs"] == a.update_epochs
    )
    assert (
        kw["batch_size"] == a.num_envs * a.num_steps // a.num_minibatches
        and kw["gae_lambda"] == a.gae_lambda
    )
    d = load_script("dqn.py").Args()
    n_envs, kw = sb3_baseline.dqn_same(d)
    assert (n_envs, kw["batch_size"], kw["train_freq"], kw["gradient_steps"]) == (
        d.num_envs,
        d.batch_size,
        d.train_frequency,
        d.gradient_steps,
    )
    assert (
        kw["target_update_interval"] == d.target_network_frequency
        and kw["buffer_size"] == d.buffer_size
    )
    optimizer = sb3_baseline.sb3_kwargs(kw)["policy_kwargs"]
    assert optimizer["optimizer_class"] is torch.optim.AdamW and optimizer["optimizer_kwargs"] == {
        "weight_decay": d.weight_decay
    }
    # the network SB3 is given computes what dqn.py's does: SB3 builds Linear layers of net_arch
    # with activation_fn
    net = load_script("dqn.py").QNetwork(4, 2)
    ours = [m for m in net.network if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in ours[:-1]] == kw["policy_kwargs"]["net_arch"]
    x = h = torch.randn(16, 4)
    for layer in ours[:-1]:
        h = getattr(torch.nn, kw["policy_kwargs"]["activation_fn"])()(layer(h))
    assert torch.allclose(net(x), ours[-1](h))
    sched = sb3_baseline.sb3_kwargs({"learning_rate": {"linear": 1e-3}})["learning_rate"]
    assert sched(1.0) == pytest.approx(1e-3) and sched(0.5) == pytest.approx(5e-4)


def test_sb3_maps_the_continuous_scripts():
    """SB3 gets each off-policy script's hyperparameters and its 256x256 ReLU networks; PPO gets
    normalisation."""
    from benchmark.runs import load_script

    for script, algo in [
        ("sac_continuous.py", "SAC"),
        ("td3_continuous.py", "TD3"),
        ("ddpg_continuous.py", "DDPG"),
    ]:
        mod = load_script(script)
        a = mod.Args()
        assert sb3_baseline.SAME[script][0] == algo
        n_envs, kw = sb3_baseline.SAME[script][1](a)
        assert (
            n_envs,
            kw["learning_rate"],
            kw["batch_size"],
            kw["learning_starts"],
            kw["tau"],
            kw["gamma"],
        ) == (a.num_envs, a.learning_rate, a.batch_size, a.learning_starts, a.tau, a.gamma)
        linears = [m for m in mod.QNetwork(3, 1).network if isinstance(m, torch.nn.Linear)]
        assert [m.out_features for m in linears[:-1]] == kw["policy_kwargs"]["net_arch"]
        assert any(
            isinstance(m, getattr(torch.nn, kw["policy_kwargs"]["activation_fn"]))
            for m in mod.QNetwork(3, 1).network
        )
    a = load_script("sac_continuous.py").Args()
    assert sb3_baseline.sac_same(a)[1]["ent_coef"] == f"auto_{a.alpha}"
    t = load_script("td3_continuous.py").Args()
    kw = sb3_baseline.td3_same(t)[1]
    assert (kw["policy_delay"], kw["target_policy_noise"], kw["target_noise_clip"]) == (
        t.policy_frequency,
        t.policy_noise,
        t.noise_clip,
    )
    noise = sb3_baseline.sb3_kwargs(kw, action_dim=2)["action_noise"]
    assert noise._sigma.tolist() == [t.exploration_noise] * 2
    kw = sb3_baseline.ppo_continuous_same(load_script("ppo_continuous.py").Args())[1]
    assert kw["normalize"] and "normalize" not in sb3_baseline.sb3_kwargs(kw)
    assert kw["clip_range"] == kw["clip_range_vf"] == 0.2, (
        "ppo_continuous.py anneals the learning rate only"
    )


def test_sb3_baseline_runs_in_a_suite(tmp_path):
    """ "sb3:<script>" in a suite runs SB3 with that script's flags and leaves a run the report can
    score."""
    from benchmark.run import RunSpec, execute

    spec = RunSpec(
        "sb3:td3_continuous.py",
        "Pendulum-v1",
        1,
        600,
        "final_eval",
        ("--learning-starts", "400", "--eval-every", "400", "--eval-episodes", "2"),
    )
    out = execute(spec, tmp_path / spec.name)
    assert out.status == "ok", out.error
    assert spec.name == "sb3-td3_continuous__Pendulum-v1__1"
    m = read_metrics(tmp_path / spec.name)
    assert m["eval/episodic_return"][0].tolist() == [400, 400, 600, 600]
    assert len(m["train/episodic_return"][1]) == 3  # Pendulum's episodes are 200 steps
    config = json.loads((tmp_path / spec.name / "config.json").read_text())
    assert config["sb3_algo"] == "TD3" and config["args"]["learning_starts"] == 400
    bad = execute(
        RunSpec(
            "sb3:td3_continuous.py", "Pendulum-v1", 1, 600, "final_eval", ("--no-such-flag", "1")
        ),
        tmp_path / "bad",
    )
    assert bad.status == "failed" and "no flag --no-such-flag" in bad.error


def test_speed_sps_run_measures_its_own_budget(tmp_path):
    """ours_flags may set a longer --total-timesteps for the time-to-threshold runs; the SPS run
    keeps sps_steps."""
    entry = speed.Entry(
        "t",
        "ppo.py",
        "CartPole-v1",
        sps_steps=512,
        ours_flags=["--total-timesteps", "400000", "--num-envs", "4", "--update-epochs", "1"],
    )
    assert speed.ours_sps(entry, 1, tmp_path)["steps"] == 512


def test_speed_time_to_threshold_plumbing(tmp_path):
    """Both sides stop at the first evaluation reaching the threshold and report its training
    seconds."""
    entry = speed.Entry(
        "t",
        "ppo.py",
        "CartPole-v1",
        sps_steps=512,
        best_sb3=(4, {"n_steps": 32, "batch_size": 128, "n_epochs": 1}),
        sb3_budget=2048,
        goal="sb3",
        threshold=0.0,
        eval_every=256,
        eval_episodes=2,
        ours_flags=["--total-timesteps", "400000", "--num-envs", "4", "--update-epochs", "1"],
    )
    ours = speed.ours_time_to_threshold(entry, 1, tmp_path)
    assert ours["reached"] is not None and ours["reached"][0] <= 512 and ours["reached"][1] > 0
    # ~1 min unstopped
    assert ours["last_step"] < 400_000, "our run was not stopped at the threshold"
    sb3 = speed.run_sb3(
        {
            "algo": "PPO",
            "env_id": "CartPole-v1",
            "n_envs": 4,
            "kwargs": entry.best_sb3[1],
            "seed": 1,
            "steps": 2048,
            "threshold": 0.0,
            "eval_every": 256,
            "eval_episodes": 2,
        }
    )
    assert sb3["reached"][0] <= 512 and sb3["steps"] < 2048 and sb3["seconds"] > 0
    assert (
        speed._first_reach(
            [
                {"name": "charts/train_seconds", "global_step": 5, "value": 1.5},
                {"name": "eval/episodic_return", "global_step": 5, "value": 480.0},
            ],
            475,
            2,
        )
        is None
    )
    assert "missed" in speed._goal_verdict("half_sb3_median", [3.0, 1.0], [4.0, 4.0])
    assert "**met**" in speed._goal_verdict("sb3_median", [2.9, 1.0, 2.9], [4.0, 2.0, 3.0])
    # median 3.0: 3.0 is not less
    verdict = speed._goal_verdict("sb3_median", [3.0, 1.0], [4.0, 2.0], seeds=[101, 102])
    assert "**missed** on 1 of 2 seeds: seed 101" in verdict
    assert "**met**" in speed._goal_verdict("sb3", [3.0, 1.0], [4.0, 2.0])
    assert "seed 2 never reached" in speed._goal_verdict("sb3", [3.0, None], [4.0, 2.0])


def test_learning_curve_smooths_interpolates_and_averages(tmp_path):
    from benchmark.report import learning_curve

    def run(name, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.csv").write_text(
            "global_step,wall_time,name,value\n"
            + "".join(f"{s},0.0,train/episodic_return,{v}\n" for s, v in rows)
        )
        return d

    a = run("a", [(0, 0.0), (100, 10.0), (200, 20.0)])
    b = run("b", [(50, 30.0), (150, 30.0), (300, 30.0)])
    grid, mean, std, n = learning_curve([a, b], points=3, window=1)
    # from the latest first step to the earliest last one
    assert n == 2 and list(grid) == [50.0, 125.0, 200.0]
    assert np.allclose(mean, [(5.0 + 30) / 2, (12.5 + 30) / 2, (20.0 + 30) / 2])
    assert np.allclose(std, [12.5, 8.75, 5.0])
    # trailing mean over 2 episodes: 0, 5, 15
    grid, mean, _, _ = learning_curve([a], points=3, window=2)
    assert np.allclose(mean, [0.0, 5.0, 15.0])
    c = tmp_path / "offline"  # evaluations only: one point per evaluation, the mean of its episodes
    c.mkdir()
    (c / "metrics.csv").write_text(
        "global_step,wall_time,name,value\n"
        + "".join(
            f"{s},0.0,eval/episodic_return,{v}\n"
            for s, v in [(100, 1.0), (100, 3.0), (200, 5.0), (200, 9.0)]
        )
    )
    grid, mean, _, n = learning_curve([c], "eval/episodic_return", points=3)
    assert n == 1 and list(grid) == [100.0, 150.0, 200.0] and np.allclose(mean, [2.0, 4.5, 7.0])


def test_report_puts_smac_numbers_beside_smac_lite_runs_without_judging(tmp_path):
    """A smac_lite cell (2s3z) lists the MAPPO paper's SMAC win rate in a section of its own, marked
    as SMAC; the cell's verdict does not use it (SMAC is another simulator)."""
    outcomes = []
    for seed, value in enumerate([0.5, 0.6, 0.7], 1):
        spec = bench.RunSpec(
            "mappo_smac_lite.py", "2s3z", seed, 500000, "final_win_rate", (), None, False
        )
        run_dir = tmp_path / "runs" / spec.name
        _fake_run(run_dir, "eval/win_rate", value)
        outcomes.append(bench.Outcome(spec, run_dir, "ok"))
    path = write_report(
        bench.Suite("t", "test", 3),
        outcomes,
        [],
        "cpu",
        tmp_path / "reports",
        load_references(),
        now=datetime.datetime(2026, 1, 2, 3, 4),
    )
    text = path.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| mappo_smac_lite.py"))
    # no reference on smac_lite's 2s3z: no verdict against SMAC
    assert "SMAC" not in row and "| none |" in row, row
    section = text.split("### Beside them, on SMAC")[1].split("###")[0]
    assert (
        "mappo_smac_lite.py 2s3z: SMAC 1.000" in section
        and "mappo-paper-mappo-SMAC-2s3z" in section
    )


def test_compile_speed_updates_run_eagerly():
    """benchmark/compile_speed.py's updates still fit the scripts' functions: one eager update each,
    parameters move."""
    import importlib

    from benchmark import compile_speed

    obs_dim, action_dim, n = 11, 3, 8
    batch = [
        torch.randn(n, obs_dim),
        torch.randn(n, obs_dim),
        torch.rand(n, action_dim) * 2 - 1,
        torch.randn(n),
        torch.zeros(n),
    ]
    makers = {
        "sac_continuous": lambda m: compile_speed.sac_update_fns(m, obs_dim, action_dim, batch),
        "td3_continuous": lambda m: compile_speed.td3_update_fns(m, obs_dim, action_dim, batch),
        "dqn_atari": compile_speed.dqn_atari_update_fns,
        "ppo_atari": compile_speed.ppo_atari_update_fns,
    }
    for name, make in makers.items():
        torch.manual_seed(0)
        losses, step = make(importlib.import_module(name))
        step(*losses)
        step(*losses)  # TD3's actor moves every second update


def test_a2c_defaults_are_sb3s_a2c_defaults():
    """a2c.py's defaults, mapped for SB3, are SB3's A2C defaults (rl-zoo's CartPole-v1 adds only 8
    envs)."""
    import inspect

    from stable_baselines3 import A2C

    from benchmark.runs import load_script

    n_envs, kw = sb3_baseline.SAME["a2c.py"][1](load_script("a2c.py").Args())
    defaults = {k: p.default for k, p in inspect.signature(A2C.__init__).parameters.items()}
    for name in (
        "n_steps",
        "learning_rate",
        "gamma",
        "gae_lambda",
        "ent_coef",
        "vf_coef",
        "max_grad_norm",
        "use_rms_prop",
        "rms_prop_eps",
        "normalize_advantage",
    ):
        assert kw[name] == defaults[name], name
    assert n_envs == 8


def test_smac_lite_rules_report(tmp_path):
    """benchmark/smac_lite_rules.py plays every rule variant with the three scripted policies and a
    trained MAPPO actor (a short run's checkpoint) and writes one table row per variant. (about 10
    s)"""
    from benchmark import smac_lite_rules

    run_dir = tmp_path / "mappo"
    out = run_script(
        "mappo_smac_lite.py",
        [
            "--env-id",
            "3m",
            "--total-timesteps",
            "640",
            "--num-envs",
            "8",
            "--num-steps",
            "40",
            "--num-minibatches",
            "2",
            "--eval-episodes",
            "2",
        ],
        run_dir,
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    smac_lite_rules.main(
        ["--battles", "16", "--run-dir", str(run_dir), "--report-dir", str(tmp_path)]
    )
    (report,) = tmp_path.glob("smac_lite-rules/smac_lite-rules-cpu-*.md")
    rows = [
        ln for ln in report.read_text().splitlines() if ln.startswith("| ") and "win |" not in ln
    ]
    assert [r.split(" | ")[0][2:] for r in rows] == list(smac_lite_rules.VARIANTS)
    assert all(len(r.split(" | ")) == 9 for r in rows) and "trained MAPPO" in report.read_text()


def test_smac_lite_rules_plays_a_qmix_run(tmp_path):
    """A qmix_smac_lite.py run (its config.json names the script) is played by the script's own
    greedy evaluate(); a run of a script without a smac_lite policy is a one-line error."""
    from benchmark import smac_lite_rules

    run_dir = tmp_path / "qmix"
    flags = ["--env-id", "3m", "--total-timesteps", "300", "--num-envs", "4"]
    flags += ["--learning-starts", "100", "--batch-size", "8", "--buffer-size", "64"]
    out = run_script("qmix_smac_lite.py", flags + ["--eval-episodes", "2"], run_dir, fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    map_name, steps, name, policy = smac_lite_rules.trained_policy(run_dir)
    assert (map_name, steps, name) == ("3m", 300, "trained QMIX")
    win, ret = smac_lite_rules.play(smac_lite_rules.MAPS["3m"], policy, 4, 0)
    assert 0 <= win <= 1 and ret >= 0
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "script": "ppo.py"}))
    with pytest.raises(SystemExit) as e:
        smac_lite_rules.main(["--run-dir", str(run_dir), "--report-dir", str(tmp_path)])
    assert e.value.code == 2


def test_the_ray_backend_does_not_import_the_runner():
    """benchmark/run.py uses ray_backend.py; ray_backend.py takes what both need from runs.py."""
    import ast

    tree = ast.parse((ROOT / "benchmark" / "ray_backend.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "benchmark.run" not in imported and "benchmark.runs" in imported


def test_the_reports_are_grouped_and_indexed(tmp_path):
    """benchmark/reports/<suite or tool>/<report>.md, and README.md there lists them all, newest
    first (python benchmark/report_path.py rewrites it; every tool does when it writes a report)."""
    import datetime

    from benchmark.report_path import REPORTS, index_text, new_report_path

    assert [p.name for p in REPORTS.glob("*.md")] == ["README.md"], "a report outside a group"
    assert (REPORTS / "README.md").read_text() == index_text(), "run benchmark/report_path.py"
    day = datetime.datetime(2026, 1, 2, 3, 4)
    first = new_report_path(tmp_path, "s", "cpu", now=day)
    second = new_report_path(tmp_path, "s", "cpu", now=day + datetime.timedelta(days=1))
    assert first.parent == second.parent == tmp_path / "s"
    text = (tmp_path / "README.md").read_text()
    assert f"(s/{second.name})" in text and text.index(second.stem) < text.index(first.stem)


def test_a_peer_takes_our_switches_as_tyro_spells_them(tmp_path):
    """--norm-reward and --no-anneal-lr take no value (tyro's spelling); the others take one."""
    from benchmark import sb3_baseline
    from benchmark.runs import parse_baseline_args

    argv = ["--same-as", "ppo_lstm.py", "--env-id", "PendulumNoVel-v1", "--total-timesteps", "4096"]
    argv += ["--run-dir", str(tmp_path / "run"), "--norm-reward", "--num-envs", "32"]
    argv += ["--no-anneal-lr", "--gamma", "0.9"]
    _, _, ours = parse_baseline_args("", sb3_baseline.SAME, "SB3", argv)
    assert ours.norm_reward is True and ours.anneal_lr is False
    assert (ours.num_envs, ours.gamma, ours.anneal_clip) == (32, 0.9, True)
    with pytest.raises(SystemExit):
        parse_baseline_args("", sb3_baseline.SAME, "SB3", [*argv, "--gamma"])
    with pytest.raises(SystemExit):
        parse_baseline_args("", sb3_baseline.SAME, "SB3", [*argv, "--no-such-flag", "1"])


def test_a_suite_that_runs_one_script_twice_into_the_same_folders_is_refused(tmp_path):
    """Run folders are <script>__<env>__<seed>: two runs of one script on one env at one budget
    with other flags (e.g. another dataset) would replace each other's runs."""
    run = '[[s.run]]\nscript = "ppo.py"\nenv_id = "CartPole-v1"\ntotal_timesteps = 512\n'
    path = tmp_path / "suites.toml"
    path.write_text(
        "[s]\nseeds = 1\n\n"
        + run
        + 'score = "final_eval"\nflags = ["--gamma", "0.9"]\n\n'
        + run
        + 'score = "final_eval"\nflags = ["--gamma", "0.99"]\n'
    )
    with pytest.raises(ValueError, match="twice"):
        bench.load_suites(path)
    path.write_text(path.read_text().replace("512\nscore", "1024\nscore", 1))
    assert len(bench.load_suites(path)["s"].runs) == 2  # another budget: the resume goes on
