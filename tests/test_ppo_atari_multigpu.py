"""ppo_atari_multigpu.py: one process (plain python, no torchrun) is ppo_atari.py step for step;
under torchrun with 2 gloo processes on the CPU the ranks hold identical weights after every
optimizer step (fresh and resumed), only rank 0 writes the run directory (and draws the progress
bar) and the global step counts both ranks' steps; a rank that dies ends the job non-zero within
seconds; bad flags are said once, by rank 0, before the process group starts. The generic tests
(smoke, determinism, run contract, resume, Ctrl-C, CLI) run it as one process, like any script
(tests/conftest.py).

How identical weights are checked: the script is run unchanged under a real torchrun, through a
launcher (written below) that registers torch's global optimizer step hook
(torch.optim.optimizer.register_optimizer_step_post_hook) and then runs the script with runpy; after
every optimizer step each rank appends a SHA-256 of its parameters to its own file outside the run
directory. The script has no test-only code, the check sees every step (not only the checkpoints,
where the script checks the ranks itself), and the launcher is what torchrun runs in practice. Times
on 2 shared CPU cores: about 15-20 s per torchrun run (most of it two torch imports)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import SMOKE

from benchmark.runs import ALGOS, read_metrics, read_rows, run_env, run_script

SCRIPT = "ppo_atari_multigpu.py"
# 2 envs x 64 steps per rank: 256 steps per update with 2 ranks, 2 minibatches of 64 each
FLAGS = SMOKE[SCRIPT]
LAUNCHER = """import hashlib, os, runpy, sys
from torch.optim.optimizer import register_optimizer_step_post_hook
out = open(os.path.join(os.environ["DIGESTS"], f"rank{os.environ['RANK']}.txt"), "a")


def record(optimizer, args, kwargs):
    params = [p for group in optimizer.param_groups for p in group["params"]]
    weights = b"".join(p.detach().cpu().numpy().tobytes() for p in params)
    out.write(hashlib.sha256(weights).hexdigest() + "\\n")
    out.flush()


register_optimizer_step_post_hook(record)
sys.argv[0] = os.environ["SCRIPT_PATH"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def torchrun(program, flags, cwd, nproc=2, **popen):
    """`torchrun --standalone --nproc_per_node=nproc program flags` (as python -m
    torch.distributed.run) in cwd."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(program),
        *flags,
    ]
    return cmd, dict(
        cwd=cwd, env=run_env(DIGESTS=str(cwd), SCRIPT_PATH=str(ALGOS / SCRIPT)), text=True, **popen
    )


def run_recorded(tmp_path, flags, timeout=120):
    """The script under torchrun (2 ranks) through the launcher; returns (CompletedProcess, digests
    of each rank)."""
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    for f in tmp_path.glob("rank*.txt"):
        f.unlink()
    cmd, kw = torchrun(tmp_path / "launcher.py", flags, tmp_path)
    out = subprocess.run(cmd, capture_output=True, timeout=timeout, **kw)
    assert out.returncode == 0, out.stderr[-3000:]
    return out, [(tmp_path / f"rank{r}.txt").read_text().split() for r in (0, 1)]


def comparable(run_dir):
    return [
        (
            r["global_step"],
            r["name"],
            None if r["name"] in ("charts/sps", "charts/train_seconds") else r["value"],
        )
        for r in read_rows(run_dir)
    ]


def test_one_process_is_ppo_atari_step_for_step(tmp_path):
    """Without torchrun the script is ppo_atari.py: the same seed logs the same metrics (the clock
    aside)."""
    for script in (SCRIPT, "ppo_atari.py"):
        out = run_script(script, FLAGS, tmp_path / script, fork=True)
        assert out.returncode == 0, out.stderr[-2000:]
    assert comparable(tmp_path / SCRIPT) == comparable(tmp_path / "ppo_atari.py")


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """One 2-rank run of FLAGS + --save-model (seed 7) with every optimizer step's weights recorded
    per rank."""
    tmp = tmp_path_factory.mktemp("two-ranks")
    out, digests = run_recorded(tmp, FLAGS + ["--save-model", "--seed", "7", "--run-dir", "run"])
    return tmp, out, digests


def test_two_ranks_identical_weights_and_run_contract(two_rank_run):
    tmp, out, (rank0, rank1) = two_rank_run
    # 512 steps = 2 updates of 2 ranks x 2 envs x 64 steps, 1 epoch of 2 minibatches each: 4
    # optimizer steps
    assert len(rank0) == 4 and rank0 == rank1, "the ranks' weights differ after an optimizer step"
    assert len(set(rank0)) == 4, "every step changes the weights"
    assert "2 process(es) x 2 envs x 64 steps = 256 steps per update" in out.stdout
    assert out.stderr.count(" 0/512 [") == 1, "one progress bar (rank 0's)"
    run = tmp / "run"
    files = sorted(p.name for p in run.iterdir())
    assert [f for f in files if not f.startswith("events.out.tfevents.")] == [
        "checkpoint.pt",
        "checkpoint.sha256",
        "config.json",
        "metrics.csv",
        "model.pt",
        "model.sha256",
    ]
    assert len(files) == 7, "one TensorBoard writer (rank 0's)"
    assert sorted(p.name for p in tmp.iterdir()) == [
        "launcher.py",
        "rank0.txt",
        "rank1.txt",
        "run",
    ], "rank 1 writes nothing (no runs/ directory of its own either)"
    metrics = read_metrics(run)
    assert list(metrics["losses/policy_loss"][0]) == [256, 512], (
        "the global step counts both ranks' steps"
    )
    assert list(metrics["eval/episodic_return"][0]) == [512] and "charts/sps" in metrics
    assert out.stdout.count("run saved in") == 1 and out.stdout.count("eval/episodic_return:") == 1


def test_resume_under_torchrun_keeps_the_ranks_identical(two_rank_run, tmp_path):
    """--resume under torchrun: both ranks load rank 0's checkpoint and take identical steps from
    it."""
    tmp, _, (before, _) = two_rank_run
    shutil.copytree(tmp / "run", tmp_path / "run")
    out, (rank0, rank1) = run_recorded(tmp_path, ["--resume", "run", "--total-timesteps", "1024"])
    assert len(rank0) == 4 and rank0 == rank1 and not set(rank0) & set(before)
    steps = list(read_metrics(tmp_path / "run")["losses/policy_loss"][0])
    assert steps == [256, 512, 768, 1024], "the resumed updates continue the global step"
    assert not (tmp_path / "runs").exists()


def test_bad_flags_under_torchrun_are_said_once_before_the_process_group(tmp_path):
    """A flag out of range, and one that cannot be parsed: rank 0 alone prints the error (one line;
    tyro's box once), every rank exits 2 before the process group starts, nothing is written.
    torchrun then reports the failed ranks with its own traceback and exits 1, whatever the ranks'
    status (documented in the script and the README). (10-20 s: two torchrun starts)"""
    for flags, said in (
        (["--num-envs", "0"], "error: --num-envs 0 is out of range: it must satisfy x >= 1"),
        (["--num-envs", "abc"], "Error parsing --num-envs"),
    ):
        cmd, kw = torchrun(ALGOS / SCRIPT, flags + ["--run-dir", "run"], tmp_path)
        out = subprocess.run(cmd, capture_output=True, timeout=120, **kw)
        assert out.stderr.count(said) == 1, out.stderr[-3000:]
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert errors == ([said] if said.startswith("error:") else []), errors
        assert out.returncode == 1 and "ChildFailedError" in out.stderr, out.stderr[-3000:]
        assert "exitcode  : 2 " in out.stderr and "exitcode  : 1 " not in out.stderr, out.stderr[
            -3000:
        ]
        assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def workers(pid):
    """{RANK: pid} of torchrun's worker processes (children of its agent process pid)."""
    found = {}
    for child in open(f"/proc/{pid}/task/{pid}/children").read().split():
        try:
            env = dict(
                kv.split("=", 1)
                for kv in open(f"/proc/{child}/environ").read().split("\0")
                if "=" in kv
            )
        except OSError:
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(child)
    return found


def test_a_dead_rank_ends_the_job_with_an_error(tmp_path):
    """Rank 1 killed mid-run (SIGKILL, after the first update): torchrun stops rank 0 and exits
    non-zero, naming the failed rank, within seconds (no hang in rank 0's next all-reduce)."""
    cmd, kw = torchrun(
        ALGOS / SCRIPT, FLAGS + ["--total-timesteps", "1000000", "--run-dir", "run"], tmp_path
    )
    job = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw
    )
    try:
        deadline = time.time() + 90
        while (
            "losses/policy_loss" not in read_metrics_safe(tmp_path / "run")
            and time.time() < deadline
        ):
            assert job.poll() is None, job.communicate()[1][-3000:]
            time.sleep(0.5)
        ranks = workers(job.pid)
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.time()
        _, stderr = job.communicate(timeout=60)
        elapsed = time.time() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode != 0
    assert elapsed < 30, f"the job took {elapsed:.0f} s to end"
    assert "ChildFailedError" in stderr and "rank" in stderr and "Signal 9 (SIGKILL)" in stderr, (
        stderr[-3000:]
    )
    for pid in ranks.values():
        assert (
            not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
        ), f"worker {pid} outlived the job"


def read_metrics_safe(run_dir):
    try:
        return read_metrics(run_dir)
    except (FileNotFoundError, ValueError, KeyError):
        return {}


def test_a_checkpoint_resumes_only_with_its_number_of_processes(two_rank_run, tmp_path):
    tmp, _, _ = two_rank_run
    shutil.copytree(tmp / "run", tmp_path / "run")
    out = run_script(
        SCRIPT, ["--resume", str(tmp_path / "run"), "--total-timesteps", "1024"], fork=True
    )
    assert (
        out.returncode == 2 and "ran 2 process(es), not 1" in out.stderr.strip().splitlines()[-1]
    ), out.stderr
