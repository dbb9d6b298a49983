"""The fork server (benchmark/runs.py): a run forked from it behaves as a fresh `python script.py`
does: argv, working directory, environment, sys.path[0], output written by Python and by C code (at
the file-descriptor level), output still buffered at exit, non-daemon threads and atexit functions,
exit codes (0, sys.exit(n), sys.exit("message") -> 1, an uncaught exception -> 1 with the script's
traceback, 2, 130 after Ctrl-C, death by SIGINT for an uncaught KeyboardInterrupt), SIGINT as a
KeyboardInterrupt, timeouts; and a training run gives the same metrics.csv."""

import signal
import subprocess
import sys
import time

import pytest

from benchmark.runs import fork_server, read_rows, run_env, run_script

PROBE = """import atexit, os, signal, sys, threading, time
mode = sys.argv[1]
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE"),
      "path0", sys.path[0], __name__)
os.write(1, b"written to fd 1\\n")
os.write(2, b"written to fd 2\\n")
sys.stdout.write("still buffered at exit")
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
if mode == "exit3":
    sys.exit(3)
if mode == "exit2":
    print("error: bad input", file=sys.stderr)
    sys.exit(2)
if mode == "message":
    sys.exit("a message")
if mode == "raise":
    def inner():
        raise ValueError("boom")
    inner()
if mode in ("ctrl-c", "ctrl-c-caught"):
    try:
        open(sys.argv[2], "w").close()  # the test sends SIGINT once this file exists
        time.sleep(60)
    except KeyboardInterrupt:
        if mode == "ctrl-c-caught":
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        raise
if mode == "sleep":
    time.sleep(60)
"""


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "cwd").mkdir()
    return tmp_path / "probe.py"


def both(probe, *args):
    """(fresh, forked) CompletedProcess of `python probe.py args` in probe's cwd/ with PROBE=x."""
    cmd, cwd, env = [sys.executable, str(probe), *args], probe.parent / "cwd", run_env(PROBE="x")
    fresh = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    proc = fork_server().start(cmd, cwd, env)
    stdout, stderr = proc.communicate(timeout=60)
    return fresh, subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.parametrize(
    "mode,code", [("ok", 0), ("exit3", 3), ("exit2", 2), ("message", 1), ("raise", 1)]
)
def test_a_forked_run_exits_and_prints_as_a_fresh_process(probe, mode, code):
    fresh, forked = both(probe, mode)
    assert fresh.returncode == code
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert (
        "written to fd 1" in forked.stdout
        and "thread joined" in forked.stdout
        and "atexit ran" in forked.stdout
    )
    assert (
        f"'{probe.parent / 'cwd'}'" not in forked.stdout
        and f"cwd {probe.parent / 'cwd'}" in forked.stdout
    )
    if mode == "raise":
        lines = forked.stderr.splitlines()
        assert lines[lines.index("Traceback (most recent call last):") + 1].startswith(
            f'  File "{probe}"'
        ), "the traceback starts in the script (no frame of the fork server or runpy)"


@pytest.mark.parametrize("mode,code", [("ctrl-c-caught", 130), ("ctrl-c", -signal.SIGINT)])
def test_sigint_is_a_keyboard_interrupt(probe, mode, code):
    results = []
    ready = probe.parent / "ready"
    for fork in (False, True):
        ready.unlink(missing_ok=True)
        cmd, cwd, env = (
            [sys.executable, str(probe), mode, str(ready)],
            probe.parent / "cwd",
            run_env(),
        )
        # SIGINT restored to its default: a shell that starts pytest in the background (`pytest &`)
        # ignores it, and the probe would then inherit the ignored signal and sleep through it
        proc = (
            fork_server().start(cmd, cwd, env)
            if fork
            else subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        )
        deadline = time.time() + 60
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        results.append((proc.returncode, stdout, stderr))
    assert results[0][0] == code and results[1] == results[0]


def test_a_timeout_kills_the_run(probe):
    proc = fork_server().start([sys.executable, str(probe), "sleep"], probe.parent, run_env())
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_forked_and_fresh_runs_write_the_same_metrics(tmp_path):
    """A deterministic training run (ppo.py on CartPole) logs the same rows forked and fresh, clock
    values aside."""
    clock = {"charts/sps", "charts/train_seconds"}
    flags = [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "512",
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--update-epochs",
        "2",
        "--eval-episodes",
        "2",
        "--seed",
        "5",
    ]
    rows = []
    for fork in (False, True):
        out = run_script("ppo.py", flags, tmp_path / str(fork), fork=fork)
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"run saved in {tmp_path / str(fork)}" in out.stdout
        rows.append(
            [
                (r["global_step"], r["name"], None if r["name"] in clock else r["value"])
                for r in read_rows(tmp_path / str(fork))
            ]
        )
    assert rows[0] and rows[0] == rows[1]
    assert any(name.startswith("losses/") for _, name, _ in rows[0])


def test_bad_input_exits_2_with_one_line_forked_and_fresh(tmp_path):
    outs = [
        run_script("ppo.py", ["--env-id", "CartPol-v1"], tmp_path / str(fork), fork=fork)
        for fork in (False, True)
    ]
    assert [(o.returncode, o.stdout, o.stderr) for o in outs] == [(2, "", outs[0].stderr)] * 2
    assert len(outs[0].stderr.splitlines()) == 1 and not list(tmp_path.iterdir())


def test_import_time_variables_must_match_the_server():
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        run_script("ppo.py", ["--help"], fork=True, OMP_NUM_THREADS="2")
