"""Bad input to the tools of benchmark/ (the dataset maker, reevaluate.py): a one-line error "error:
..." on stderr and exit status 2, before anything is written. And every tool's --help works as the
README runs it: `python benchmark/<tool>.py --help` from the repository root, with no PYTHONPATH."""

import os
import shutil
import subprocess
import sys

import pytest

from benchmark import datasets, reevaluate
from benchmark.runs import ALGOS

ROOT = ALGOS.parent
# The tools: each benchmark/*.py with a __main__ block (report.py must keep its own: it was run for
# its --help).
TOOLS = sorted(
    {
        p.name
        for p in (ROOT / "benchmark").glob("*.py")
        if 'if __name__ == "__main__"' in p.read_text()
    }
    | {"report.py"}
)
RANDOM_CARTPOLE = [
    "--kind",
    "random",
    "--env-id",
    "CartPole-v1",
    "--expert",
    "500",
    "--steps",
    "10",
]


def one_line_error(capsys) -> str:
    """The one line that the tool printed to stderr, after checking that it printed nothing to
    stdout."""
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "", out.out
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    return lines[0]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_shows_its_help_from_the_repository_root(tool):
    """`python benchmark/<tool>.py --help` puts benchmark/, not the root, first on sys.path: a tool
    that imports benchmark.* must put the root there itself (a fresh process: a forked one has
    benchmark imported already)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, f"benchmark/{tool}", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("name", ["model", "replay"])
def test_a_policy_or_replay_file_is_checked_against_its_digest(name, tmp_path, capsys):
    """A model.pt (or the replay.pt of --kind medium-replay) with 64 bytes flipped inside a tensor
    (torch.load still reads it) and the digest it was saved with is refused, as is one with no
    .sha256 beside it: exit 2, one line, no dataset. The copy as committed loads."""
    policy = tmp_path / "policy"
    shutil.copytree(datasets.MEDIUM_DQN.parent, policy)
    path = policy / f"{name}.pt"
    flags = (
        ["--kind", "medium", "--policy", str(path)]
        if name == "model"
        else ["--kind", "medium-replay", "--checkpoint", str(path)]
    )
    flags += ["--expert", "500", "--steps", "10", "--root", str(tmp_path / "d")]
    if name == "model":
        datasets.load_policy(path)
    else:
        datasets.replay_episodes(path)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # inside the largest tensor: the zip archive stays readable
    for i in range(middle, middle + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    assert datasets.main(flags) == 2
    assert f"its SHA-256 differs from {name}.sha256" in one_line_error(capsys)
    (policy / f"{name}.sha256").unlink()
    assert datasets.main(flags) == 2
    error = one_line_error(capsys)
    assert f"checked against {name}.sha256" in error and f"sha256sum {name}.pt" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"], (
        "a refused dataset writes nothing"
    )


def test_the_committed_policies_match_their_digests():
    """Every model.pt (and replay.pt) under benchmark/policies/ has its model.sha256
    (replay.sha256), and it matches."""
    files = sorted(datasets.POLICIES.glob("*/*.pt"))
    assert len(files) >= 8
    for path in files:
        datasets.check_digest(path)


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--expert", "nan"], "must be a finite number"),
        (["--expert", "inf"], "must be a finite number"),
        (["--expert=-1e999"], "must be a finite number"),
        (["--id", "bad id"], "is not a Minari dataset id"),
        (["--id", "t/hopper-medium-v0"], "is not a Minari dataset id"),  # a one-letter namespace
        (["--id", "canonrl/hopper/medium"], "is not a Minari dataset id"),  # no version
        (["--id", "../../hopper-v0"], "is not a Minari dataset id"),
        (["--root", "/proc/x"], "cannot be written"),
        (["--root", "{tmp}/file/x"], "is not a folder"),
        (["--seed", "-1"], "--seed must be >= 0"),
    ],
    ids=[
        "nan",
        "inf",
        "-inf",
        "space",
        "one-letter-namespace",
        "no-version",
        "dotdot",
        "proc",
        "under-a-file",
        "seed",
    ],
)
def test_the_maker_refuses_bad_numbers_ids_and_roots(flags, expected, tmp_path, capsys):
    """Each bad flag: exit 2, one line, before anything is rolled out or written."""
    (tmp_path / "file").write_text("a file, not a folder")
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    root = ["--root", str(tmp_path / "d")] if "--root" not in flags else []
    assert datasets.main(RANDOM_CARTPOLE + root + flags) == 2
    assert expected in one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"], (
        "a refused dataset writes nothing"
    )
    assert not os.path.exists("/proc/x")


# "script": the smoke_runs fixture groups tests by it
@pytest.mark.parametrize("script", ["bc_continuous.py"])
@pytest.mark.parametrize("case", ["seed", "episodes", "twice", "truncated"])
def test_reevaluate_refuses_bad_input(script, case, smoke_runs, tmp_path, capsys):
    """benchmark/reevaluate.py: --seed -1, --episodes 0, one run given twice (the second time by
    another path) and a truncated checkpoint whose checkpoint.sha256 matches it are each one line,
    exit 2, before anything is played or printed."""
    run = tmp_path / "run"
    smoke_runs(script, run)
    assert reevaluate.main([str(run), "--episodes", "1"]) == 0  # the run itself is fine
    capsys.readouterr()
    if case == "truncated":
        data = (run / "checkpoint.pt").read_bytes()
        (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])
        (run / "checkpoint.sha256").write_text(datasets.sha256(run / "checkpoint.pt") + "\n")
    argv, expected = {
        "seed": ([str(run), "--seed", "-1"], "--seed -1"),
        "episodes": ([str(run), "--episodes", "0"], "--episodes 0"),
        "twice": (
            [str(run), str(tmp_path / "." / "run" / ".." / "run"), "--episodes", "1"],
            "is given twice",
        ),
        "truncated": ([str(run), "--episodes", "1"], "cannot be read as a checkpoint"),
    }[case]
    assert reevaluate.main(argv) == 2
    assert expected in one_line_error(capsys)


def digests(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_lm_task_never_replaces_a_base_or_its_pairs_unasked(tmp_path, capsys):
    """lm_task.py --out on a folder that holds files (the project's base among them), or --pairs on
    a model folder that holds preferences.json, refuses in one line and leaves every file as it
    was; --replace is refused where the folder is not a base this tool wrote."""
    from benchmark import lm_task

    base = tmp_path / "base"
    shutil.copytree(ROOT / "benchmark" / "policies" / "lm-addition-base", base)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    before = digests(base), digests(theirs)
    for argv in (
        ["--out", str(base)],
        ["--out", str(base), "--steps", "0"],
        ["--out", str(theirs), "--replace"],
        ["--out", str(theirs / "notes.txt")],
        ["--pairs", str(base)],
        ["--pairs", str(theirs)],
    ):
        with pytest.raises(SystemExit) as e:
            lm_task.main(argv)
        assert e.value.code == 2, argv
        assert "error: " in capsys.readouterr().err, argv
    assert (digests(base), digests(theirs)) == before


def test_the_suite_runner_never_deletes_a_folder_that_holds_no_run(tmp_path):
    """benchmark/run.py --out whose run folder (e.g. ppo__CartPole-v1__1) holds a user's file and
    no run: one error, exit 2, the file kept (a half-done run of its own would be redone there)."""
    out = tmp_path / "out"
    theirs = out / "ppo__CartPole-v1__1"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine\n")
    cmd = [sys.executable, "benchmark/run.py", "--suite", "classic", "--seeds", "1"]
    cmd += ["--scripts", "ppo.py", "--envs", "CartPole-v1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "holds files that are not a run" in proc.stderr.splitlines()[-1]
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]
    assert (theirs / "notes.txt").read_text() == "mine\n"


TRL = ["--env-id", "addition-v0", "--total-timesteps", "128"]


@pytest.mark.parametrize(
    "same_as,flags,expected",
    [
        ("grpo_lm.py", ["--model", "/nonexistent/model"], "no such folder"),
        ("grpo_lm.py", ["--learning-rate", "nan"], "not a finite number"),
        ("grpo_lm.py", ["--group-size", "1"], "--group-size 1"),
        ("grpo_lm.py", ["--temperature", "0"], "--temperature 0.0"),
        ("grpo_lm.py", ["--total-timesteps", "0"], "--total-timesteps 0"),
        ("grpo_lm.py", ["--total-timesteps", "-16"], "--total-timesteps -16"),
        ("dpo_lm.py", ["--beta", "-1"], "--beta -1.0"),
        ("dpo_lm.py", ["--preferences", "README.md"], "cannot be read"),
    ],
)
def test_the_trl_baseline_checks_every_flag_as_our_script_does(
    same_as, flags, expected, tmp_path, capsys
):
    from benchmark import trl_baseline

    argv = ["--same-as", same_as, *TRL, "--run-dir", str(tmp_path / "run"), *flags]
    with pytest.raises(SystemExit) as e:
        trl_baseline.main(argv)
    assert e.value.code == 2
    assert expected in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "case,expected",
    [
        ("truncated weights", "does not load"),
        ("weights not finite", "not finite"),
        ("task not JSON", "not a model folder"),
        ("steps -5", "--steps must be >= 1"),
        ("batch 30000", "--batch-size from 1 to 4096"),
        ("lr nan", "--lr must be"),
        ("task a file", "give a reasoning-gym task"),
        ("task unknown", "reasoning-gym has no dataset 'chain_summ'"),
    ],
)
def test_lm_task_refuses_a_bad_folder_or_flag_in_one_line(case, expected, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    from benchmark import lm_task

    model = tmp_path / "model"
    shutil.copytree(ROOT / "benchmark" / "policies" / "lm-addition-base", model)
    (model / "preferences.json").unlink()
    argv = ["--pairs", str(model)]
    if case == "truncated weights":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "weights not finite":
        weights = load_file(model / "model.safetensors")
        name = sorted(weights)[0]
        weights[name] = torch.full_like(weights[name], float("nan"))
        save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    elif case == "task not JSON":
        (model / "task.json").write_text("{")
    else:
        flag, value = {
            "steps -5": ("--steps", "-5"),
            "batch 30000": ("--batch-size", "30000"),
            "task a file": ("--task", "my_task.json"),
            "task unknown": ("--task", "rg:chain_summ"),
        }.get(case, ("--lr", "nan"))
        argv = ["--out", str(tmp_path / "new"), flag, value]
    before = digests(model)
    with pytest.raises(SystemExit) as e:
        lm_task.main(argv)
    assert e.value.code == 2
    assert expected in one_line_error(capsys)
    assert digests(model) == before and not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--jobs", "0"], "--jobs 0"),
        (["--timeout", "0"], "--timeout 0.0"),
        (["--report-dir", "README.md"], "is a file"),
        (["--suites-file", "README.md"], "--suites-file README.md cannot be read"),
        (["--references-file", "README.md"], "--references-file README.md cannot be read"),
    ],
)
def test_the_suite_runner_refuses_bad_flags_before_any_run(flags, expected, tmp_path):
    cmd = [sys.executable, "benchmark/run.py", "--suite", "classic", "--seeds", "1"]
    cmd += ["--scripts", "ppo.py", "--envs", "CartPole-v1", "--out", str(tmp_path / "out"), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_suite_runner_refuses_cuda_where_there_is_none(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cmd = [sys.executable, "benchmark/run.py", "--suite", "classic", "--device", "cuda"]
    cmd += ["--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
    assert not (tmp_path / "out").exists()
