"""cli tier: --help for every script, the shared flags, and bad input -> one line, exit 2, nothing written."""
import pytest

from benchmark.runs import ALGOS, run_script
from conftest import ENV_TYPO, SCRIPTS, SMOKE, WRONG_ENV, smoke_env

SHARED_FLAGS = ["--env-id", "--seed", "--total-timesteps", "--cuda", "--no-cuda", "--torch-deterministic", "--track",
                "--wandb-project-name", "--wandb-entity", "--capture-video", "--save-model", "--eval-episodes",
                "--run-dir", "--resume"]


def test_every_script_is_covered():
    assert SCRIPTS and set(SCRIPTS) == set(SMOKE), "add new scripts to tests/conftest.py SMOKE"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_shared_flags(script):
    out = run_script(script, ["--help"])
    assert out.returncode == 0, out.stderr
    missing = [f for f in SHARED_FLAGS if f not in out.stdout]
    assert not missing, f"{script} lacks {missing}"


def assert_clean_error(out, run_dir, *expected):
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    for text in expected:
        assert text in lines[0]
    assert not run_dir.exists(), "a bad-input run must not write anything"


@pytest.mark.parametrize("script", sorted(SMOKE))
@pytest.mark.parametrize("flags,expected", [
    (["--env-id", "CartPol-v1"], ["CartPol-v1", "did you mean 'CartPole-v1'"]),
    (["--eval-episodes", "-1"], ["--eval-episodes"]),
    (["--learning-rate", "-1"], ["--learning-rate -1.0", "x > 0"]),
    (["--learning-rate", "0"], ["--learning-rate 0.0"]),
    (["--gamma", "1.5"], ["--gamma 1.5"]),
    (["--total-timesteps", "0"], ["--total-timesteps"]),
    (["--checkpoint-every", "0"], ["--checkpoint-every"]),
])
def test_bad_input(script, flags, expected, tmp_path):
    if script in ENV_TYPO and "CartPol-v1" in flags:  # multi-agent: their env ids are smac_lite maps or mpe2 tasks
        typo, meant = ENV_TYPO[script]
        flags, expected = ["--env-id", typo], [typo, f"did you mean '{meant}'"]
    flags = flags if "--env-id" in flags else ["--env-id", smoke_env(script), *flags]
    assert_clean_error(run_script(script, flags, tmp_path / "run"), tmp_path / "run", *expected)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_wrong_action_space_names_only_scripts_that_exist(script, tmp_path):
    """An env of the other action space (a MuJoCo one for discrete scripts): one error line (no MuJoCo or deprecation
    warning before it), nothing left in the working directory (MuJoCo writes MUJOCO_LOG.TXT there), and any script
    the error suggests exists."""
    env_id, word = WRONG_ENV[script]
    out = run_script(script, ["--env-id", env_id], tmp_path / "run", cwd=tmp_path)
    assert_clean_error(out, tmp_path / "run", word, env_id)
    assert list(tmp_path.iterdir()) == [], "the env check left files in the working directory"
    for word in out.stderr.replace(";", " ").split():
        if word.endswith(".py"):
            assert (ALGOS / word).is_file(), f"the error names {word}, which does not exist"


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_new_run_refuses_a_directory_that_holds_a_run(script, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("global_step,wall_time,name,value\n1,0,train/x,1\n")
    assert_clean_error(run_script(script, SMOKE[script], run_dir), tmp_path / "nothing", "--resume")
    assert (run_dir / "metrics.csv").read_text().endswith("1,0,train/x,1\n") and len(list(run_dir.iterdir())) == 1


def test_ppo_minibatches_must_divide_batch(tmp_path):
    out = run_script("ppo.py", ["--num-envs", "4", "--num-steps", "10", "--num-minibatches", "3"], tmp_path / "run")
    assert_clean_error(out, tmp_path / "run", "--num-minibatches 3", "40")


def test_dqn_batch_larger_than_buffer(tmp_path):
    out = run_script("dqn.py", ["--batch-size", "256", "--buffer-size", "100"], tmp_path / "run")
    assert_clean_error(out, tmp_path / "run", "--batch-size")


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_resume_missing_or_corrupt(script, tmp_path):
    out = run_script(script, ["--resume", str(tmp_path / "nope")])
    assert out.returncode == 2 and "no checkpoint" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.csv").write_text("global_step,wall_time,name,value\n1,0,train/x,1\n")
    (tmp_path / "bad" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    out = run_script(script, ["--resume", str(tmp_path / "bad")])
    assert out.returncode == 2 and "corrupt" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert (tmp_path / "bad" / "metrics.csv").read_text().endswith("1,0,train/x,1\n"), "existing logs must be kept"
    assert (tmp_path / "bad" / "checkpoint.pt").read_bytes() == b"not a checkpoint"
