"""benchmark/imitation_baseline.py: the `imitation` library's GAIL with gail.py's hyperparameters
(the "imitation:" rows of a suite).

The flag mapping and bad input run here without imitation's venv (nothing is built for them); the
run itself needs that venv (runs/imitation-1.0.1, which the benchmark makes on first use, minutes of
pip) and is skipped where it is not there: CI never builds it."""

import json

import pytest

from benchmark import datasets, imitation_baseline
from benchmark.runs import ALGOS, load_script, read_metrics, run_finished, script_command

CARTPOLE_EXPERT = ALGOS.parent / "benchmark" / "policies" / "dqn-CartPole-v1-100k" / "model.pt"


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    """One expert episode of CartPole-v1, as benchmark/datasets.py writes it."""
    root = tmp_path_factory.mktemp("datasets")
    return datasets.make_dataset("expert", policy=CARTPOLE_EXPERT, expert="500", steps=1, root=root)


@pytest.fixture
def no_venv(monkeypatch):
    """Fails the test if imitation's venv is asked for: bad input must be refused before."""

    def refuse(*a, **k):
        raise AssertionError("ensure_venv was called")

    monkeypatch.setattr(imitation_baseline, "ensure_venv", refuse)


def test_dispatch():
    cmd = script_command("imitation:gail.py", ["--seed", "1"], "runs/x")
    assert cmd[1].endswith("benchmark/imitation_baseline.py")
    assert cmd[2:4] == ["--same-as", "gail.py"] and cmd[-2:] == ["--run-dir", "runs/x"]


def test_the_mapping_takes_gail_py_settings_one_for_one():
    a = load_script("gail.py").Args(num_envs=4, num_steps=1024, num_minibatches=64, disc_epochs=3)
    h = imitation_baseline.gail_same(a)
    assert (h["batch_size"], h["minibatch_size"], h["disc_updates"]) == (4096, 64, 192)
    for k in ("learning_rate", "gamma", "gae_lambda", "clip_coef", "ent_coef", "vf_coef"):
        assert h[k] == getattr(a, k)
    assert (h["anneal_lr"], h["anneal_clip"], h["normalize_reward"]) == (True, True, True)


def argv(dataset, run_dir, *flags):
    return [
        "--same-as",
        "gail.py",
        "--env-id",
        "CartPole-v1",
        "--dataset",
        str(dataset),
        "--total-timesteps",
        "512",
        "--run-dir",
        str(run_dir),
        *flags,
    ]


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--learning-rate", "nan"], "--learning-rate"),
        (["--num-minibatches", "3"], "--num-minibatches"),
        (["--dataset", "/nonexistent/demos"], "no dataset"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_made(
    flags, expected, expert, tmp_path, capsys, no_venv
):
    with pytest.raises(SystemExit) as e:
        imitation_baseline.main(argv(expert, tmp_path / "run", *flags))
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "run").exists()


def test_an_existing_run_dir_is_refused_and_left_as_it_was(expert, tmp_path, capsys, no_venv):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        imitation_baseline.main(argv(expert, run))
    assert e.value.code == 2
    assert "exists" in capsys.readouterr().err
    assert [p.name for p in run.iterdir()] == ["notes.txt"]
    assert (run / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(
    not (imitation_baseline.VENV / "bin" / "python").is_file(),
    reason="imitation's venv is not built (python benchmark/run.py --suite imitation makes it)",
)
def test_a_run_leaves_what_the_benchmark_scores(expert, tmp_path):
    run = tmp_path / "run"
    flags = ["--num-envs", "4", "--num-steps", "32", "--eval-every", "256", "--eval-episodes", "2"]
    assert imitation_baseline.main(argv(expert, run, *flags)) == 0
    assert run_finished(run)
    m = read_metrics(run)
    assert sorted(set(m["eval/episodic_return"][0].tolist())) == [256, 512]
    assert len(m["train/episodic_return"][1]) and len(m["charts/train_seconds"][1])
    config = json.loads((run / "config.json").read_text())
    assert config["script"] == "imitation:gail.py"
    assert any(p.startswith("imitation==1.0.1") for p in config["imitation_venv"])
