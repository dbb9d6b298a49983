"""The run contract as a user meets it, on the behaviour the shared blocks give every script:
--track fills a wandb run with every metric, --capture-video writes a video that plays, a checkpoint
is data that is checked before it is loaded, Ctrl-C saves a finished iteration, a finished run is
not evaluated twice. Behaviour that lives in the shared blocks is tested on ppo.py (and dqn.py where
a replay buffer matters); what each script holds is tested on every one."""

import json
import re
import signal
import struct
import time

import numpy as np
import pytest
import torch
from conftest import SMOKE, ctrl_c

from benchmark.runs import ALGOS, load_script, read_rows, run_script, start_script
from canonrl.run import plain

PPO = SMOKE["ppo.py"]  # 4 envs x 32 steps: one iteration is 128 steps
DQN = SMOKE["dqn.py"]


def wandb_history(path) -> list[dict]:
    """The history records of an offline run's .wandb file, as {metric name: value} (the file is
    LevelDB-log framed: 32 KiB blocks, 7-byte record headers (crc, length, type), records split
    FIRST/MIDDLE/LAST across blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunk, history = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # the tail of a block too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                row = {}
                # a histogram arrives as nested keys: (name, "values"), ...
                for item in record.history.item:
                    if len(item.nested_key) > 1:
                        row.setdefault(item.nested_key[0], {})[item.nested_key[1]] = json.loads(
                            item.value_json
                        )
                    else:
                        row[item.nested_key[0] if item.nested_key else item.key] = item.value_json
                history.append(row)
    return history


def test_track_sends_wandb_every_value_of_metrics_csv(tmp_path):
    """wandb keeps one value per key per step: every row of metrics.csv is its own wandb row (every
    training episode, also two that end at the same step), and each evaluation arrives as its mean
    with a histogram of its episodes."""
    flags = PPO + ["--track", "--eval-every", "256", "--eval-episodes", "3"]
    out = run_script("ppo.py", flags, tmp_path / "run", WANDB_MODE="offline", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    sent, histograms = [], {}
    for record in wandb_history(files[0]):
        step = int(record["global_step"])
        for name, value in record.items():
            if isinstance(value, dict):
                histograms[(step, name)] = value
            elif not name.startswith("_") and name != "global_step":
                sent.append((step, name, float(value)))
    rows = read_rows(tmp_path / "run")
    evals = {}
    for r in rows:
        if r["name"].startswith("eval/"):
            evals.setdefault((r["global_step"], r["name"]), []).append(r["value"])
    expected = [
        (r["global_step"], r["name"], r["value"]) for r in rows if not r["name"].startswith("eval/")
    ]
    expected += [(step, name, float(np.mean(values))) for (step, name), values in evals.items()]
    assert sorted(sent) == sorted(expected), "wandb holds exactly the values of metrics.csv"
    assert len(evals) == 2 and {"train/episodic_return", "losses/policy_loss", "charts/sps"} <= {
        n for _, n, _ in sent
    }
    for (step, name), values in evals.items():
        histogram = histograms[(step, f"{name}_histogram")]
        assert sum(histogram["values"]) == len(values) == 3
        assert histogram["bins"][0] <= min(values) and max(values) <= histogram["bins"][-1]


def test_track_without_a_wandb_login_is_refused_before_anything_is_written(tmp_path):
    home = tmp_path / "home"  # no ~/.netrc, no wandb settings
    home.mkdir()
    out = run_script(
        "ppo.py",
        PPO + ["--track"],
        tmp_path / "run",
        fork=True,
        WANDB_MODE="online",
        HOME=str(home),
        WANDB_API_KEY="",
        WANDB_CONFIG_DIR=str(home),
        NETRC=str(home / "none"),
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: --track needs a wandb login: run `wandb "
        "login`, or set WANDB_MODE=offline to log to files only"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script", ["ppo.py", "dqn.py"])
def test_capture_video_records_the_first_evaluation_episode(script, tmp_path):
    """--capture-video: an mp4 of evaluation episode 0 that plays: one frame per step plus the
    first, and it moves."""
    import imageio.v2 as imageio

    out = run_script(
        script, SMOKE[script] + ["--capture-video"], tmp_path / "run", fork=True, XDG_RUNTIME_DIR=""
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "XDG_RUNTIME_DIR" not in out.stderr, "SDL's warning is not shown to the user"
    videos = list((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4"]
    # not list(): the reader says its length is inf
    frames = [frame for frame in imageio.get_reader(videos[0])]
    first_return = next(
        r["value"] for r in read_rows(tmp_path / "run") if r["name"] == "eval/episodic_return"
    )
    assert len(frames) == int(first_return) + 1, (
        "CartPole: one frame per step (reward 1 each) and the reset frame"
    )
    assert frames[0].ndim == 3 and any((f != frames[0]).any() for f in frames[1:]), "the pole moves"


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_or_unverifiable_checkpoint_is_not_loaded(tmp_path):
    run_dir = tmp_path / "run"
    assert run_script("ppo.py", PPO, run_dir, fork=True).returncode == 0
    metrics = (run_dir / "metrics.csv").read_bytes()
    corrupt(run_dir / "checkpoint.pt")
    for damage in ("one byte flipped", "the digest deleted"):
        if damage == "the digest deleted":
            (run_dir / "checkpoint.sha256").unlink()
        out = run_script(
            "ppo.py", ["--resume", str(run_dir), "--total-timesteps", "1024"], fork=True
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "corrupt" in lines[0], (
            damage,
            out.stderr,
        )
        assert (run_dir / "metrics.csv").read_bytes() == metrics, "nothing already written is lost"


def test_resuming_a_finished_run_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert run_script("ppo.py", PPO, run_dir, fork=True).returncode == 0
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    out = run_script("ppo.py", ["--resume", str(run_dir)], fork=True)
    assert out.returncode == 0 and "is finished" in out.stdout, out.stdout + out.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    evals = [r for r in read_rows(run_dir) if r["name"] == "eval/episodic_return"]
    assert len(evals) == 2, "the final evaluation is logged once"


def test_metrics_csv_has_one_line_ending_and_the_budget_is_said(tmp_path):
    """600 steps is not a multiple of the 128-step iteration: the run says that 512 will run, and
    the bar ends full."""
    out = run_script(
        "ppo.py",
        PPO[: PPO.index("--total-timesteps")]
        + ["--total-timesteps", "600"]
        + PPO[PPO.index("--total-timesteps") + 2 :],
        tmp_path / "run",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "512 steps will run" in out.stdout and "512/512" in out.stderr
    data = (tmp_path / "run" / "metrics.csv").read_bytes()
    assert b"\r" not in data and data.endswith(b"\n")
    assert max(r["global_step"] for r in read_rows(tmp_path / "run")) == 512


def test_run_dir_that_is_a_file_or_a_folder_of_something_else(tmp_path):
    (tmp_path / "file").write_text("x")
    out = run_script("ppo.py", PPO, tmp_path / "file", fork=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --run-dir {tmp_path / 'file'} is a file; pass a directory"
    ]
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("x")
    out = run_script("ppo.py", PPO, tmp_path / "folder", fork=True)
    assert out.returncode == 2 and "holds no run" in out.stderr and "--resume" not in out.stderr
    assert [p.name for p in (tmp_path / "folder").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    "script,env_id,expected",
    [
        ("ppo.py", "ALE/Breakout-v5", "ppo_atari.py"),
        ("ppo.py", "simple_spread_v3", "mappo_mpe.py"),
        ("ppo.py", "3m", "mappo_smac_lite.py"),
        ("ppo_atari.py", "MinAtar/Breakout-v1", "dqn_atari.py"),
        ("sac_continuous.py", "ALE/Pong-v5", "dqn_atari.py"),
    ],
)
def test_an_env_of_another_family_names_its_script(script, env_id, expected, tmp_path):
    out = run_script(script, ["--env-id", env_id], tmp_path / "run", fork=True)
    lines = out.stderr.strip().splitlines()
    assert (
        out.returncode == 2
        and len(lines) == 1
        and expected in lines[0]
        and "unknown" not in lines[0]
    ), out.stderr
    assert not (tmp_path / "run").exists()


def same_state(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same_state(x, y) for x, y in zip(a, b))
        )
    return a == b


# Flags under which no schedule reads the budget (a run stopped at step s equals the first s steps
# of a longer one), the budget Ctrl-C interrupts and the steps the resumed runs add: the on-policy
# and the replay templates, SAC (a learnt temperature), QMIX (episode replay, an update count
# derived from the step)
STEADY = {
    "ppo.py": (PPO + ["--no-anneal-lr", "--no-anneal-clip"], 30_000, 1024),
    "dqn.py": (DQN + ["--no-anneal-lr", "--start-e", "0.05", "--end-e", "0.05"], 30_000, 1024),
    "sac_continuous.py": (
        [
            "--env-id",
            "Pendulum-v1",
            "--learning-starts",
            "100",
            "--batch-size",
            "32",
            "--eval-episodes",
            "0",
        ],
        5000,
        200,
    ),
    "qmix_smac_lite.py": (
        [
            "--env-id",
            "3m",
            "--num-envs",
            "4",
            "--learning-starts",
            "200",
            "--batch-size",
            "8",
            "--buffer-size",
            "64",
            "--eval-episodes",
            "0",
        ],
        12_000,
        500,
    ),
}


@pytest.mark.parametrize("script", sorted(STEADY))
def test_ctrl_c_saves_a_finished_iteration_and_resumes_as_an_uninterrupted_run(script, tmp_path):
    """Ctrl-C mid-run leaves the checkpoint a run with exactly that budget leaves at its end
    (weights, optimisers, replay buffer, RNGs), and both, resumed to the same budget, log the same
    losses (QMIX: the same update count)."""
    flags, long, more = STEADY[script]
    flags = [
        f for i, f in enumerate(flags) if "--total-timesteps" not in flags[max(i - 1, 0) : i + 1]
    ]
    step = ctrl_c(script, flags + ["--total-timesteps", str(long)], tmp_path / "a")
    assert step < long
    out = run_script(script, flags + ["--total-timesteps", str(step)], tmp_path / "b", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    a, b = (torch.load(tmp_path / r / "checkpoint.pt", weights_only=True) for r in "ab")
    assert a["global_step"] == b["global_step"] == step and not a["finished"] and b["finished"]
    # the clock is not a state of training
    for key in set(a) - {"args", "finished", "train_seconds"}:
        assert same_state(a[key], b[key]), (
            f"the interrupted run's {key} is not that of a finished iteration"
        )
    for r in "ab":
        out = run_script(
            script,
            ["--resume", str(tmp_path / r), "--total-timesteps", str(step + more)],
            fork=True,
        )
        assert out.returncode == 0, out.stderr[-2000:]
    logged = [
        [
            (x["global_step"], x["name"], x["value"])
            for x in read_rows(tmp_path / r)
            if x["global_step"] > step
            and (x["name"].startswith("losses/") or x["name"] == "charts/updates")
        ]
        for r in "ab"
    ]
    assert logged[0] and logged[0] == logged[1]


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_every_checkpointed_object_round_trips(script, smoke_runs, tmp_path, monkeypatch):
    """The checkpoint holds the state_dict() of every object of the script's `stateful` dict,
    nothing else besides the counters, and each object, resumed, gives back exactly the state that
    was saved."""
    run_dir = tmp_path / "run"
    smoke_runs(script, run_dir)
    module = load_script(script)
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    seen = {}

    def checked_load(stateful, saved, where):
        load_states(stateful, saved, where)
        seen.update(stateful)
        raise StopIteration  # stop before training

    load_states = module.load_states
    monkeypatch.setattr(module, "load_states", checked_load)
    budget = int(SMOKE[script][SMOKE[script].index("--total-timesteps") + 1])
    with pytest.raises(StopIteration):
        module.main(module.Args(resume=str(run_dir), total_timesteps=2 * budget))
    assert set(ckpt) - {"args", "iteration", "global_step", "finished", "train_seconds"} == set(
        seen
    )
    for name, obj in seen.items():
        assert same_state(plain(obj.state_dict()), ckpt[name]), (
            f"{script}: {name} does not round-trip"
        )


def test_resume_extends_to_a_total_timesteps_given_even_when_it_is_the_default(tmp_path):
    """--total-timesteps 100000 is ppo.py's default: given with --resume, it still extends the
    512-step run (it was ignored when a flag counted as given only where it differed from the
    default). Ctrl-C ends the extension."""
    run_dir = tmp_path / "run"
    assert run_script("ppo.py", PPO, run_dir, fork=True).returncode == 0
    proc = start_script(
        "ppo.py", ["--resume", str(run_dir), "--total-timesteps", "100000"], fork=True
    )
    deadline = time.time() + 120
    while (
        max(r["global_step"] for r in read_rows(run_dir)) <= 512
        and proc.poll() is None
        and time.time() < deadline
    ):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "resume: --total-timesteps 100000 (was 512)" in stderr
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["args"]["total_timesteps"] == 100_000 and ckpt["global_step"] > 512


def test_train_seconds_go_on_from_the_resumed_run(tmp_path):
    run_dir = tmp_path / "run"
    assert run_script("ppo.py", PPO + ["--eval-every", "256"], run_dir, fork=True).returncode == 0
    before = [r["value"] for r in read_rows(run_dir) if r["name"] == "charts/train_seconds"]
    out = run_script("ppo.py", ["--resume", str(run_dir), "--total-timesteps", "1024"], fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    seconds = [r["value"] for r in read_rows(run_dir) if r["name"] == "charts/train_seconds"]
    assert len(seconds) > len(before) and seconds == sorted(seconds), seconds


def test_non_finite_weights_in_a_checkpoint_with_a_matching_digest_stop_the_resume(tmp_path):
    """Someone changed checkpoint.pt and checkpoint.sha256 together: the digest matches, the weights
    are NaN."""
    import hashlib

    run_dir = tmp_path / "run"
    assert run_script("ppo.py", PPO, run_dir, fork=True).returncode == 0
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    name = next(k for k, v in ckpt["agent"].items() if v.is_floating_point())
    ckpt["agent"][name].fill_(float("nan"))
    torch.save(ckpt, run_dir / "checkpoint.pt")
    digest = hashlib.sha256((run_dir / "checkpoint.pt").read_bytes()).hexdigest()
    (run_dir / "checkpoint.sha256").write_text(digest + "\n")
    metrics = (run_dir / "metrics.csv").read_bytes()
    out = run_script("ppo.py", ["--resume", str(run_dir), "--total-timesteps", "1024"], fork=True)
    lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("resume: ")]
    assert out.returncode == 2 and len(lines) == 1 and "non-finite values in agent" in lines[0], (
        out.stderr
    )
    assert (run_dir / "metrics.csv").read_bytes() == metrics


@pytest.fixture
def keep_sigint():
    """A RunLogger made in this process installs its Ctrl-C handler: put pytest's back after."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


def test_a_non_finite_loss_stops_the_run_before_it_is_written(tmp_path, capsys, keep_sigint):
    ppo = load_script("ppo.py")
    logger = ppo.RunLogger(ppo.Args(), tmp_path / "run", 1000, 0, None, ALGOS / "ppo.py")
    # nan by definition when returns are constant
    logger.log(1, {"losses/explained_variance": float("nan")})
    with pytest.raises(SystemExit) as exit_:
        logger.log(2, {"losses/value_loss": torch.tensor(float("inf")), "charts/sps": 5})
    assert exit_.value.code == 2
    assert "losses/value_loss is inf at step 2" in capsys.readouterr().err
    assert [r["global_step"] for r in read_rows(tmp_path / "run")] == [1], (
        "nothing of step 2 is appended"
    )


def recording_logger(tmp_path, **flags):
    """ppo.py's RunLogger for a 576-step run with these flags, recording the steps at which it
    evaluates and saves (into the dict it returns beside it) instead of doing either."""
    ppo = load_script("ppo.py")
    logger = ppo.RunLogger(
        ppo.Args(**flags, total_timesteps=576), tmp_path / "run", 576, 0, None, ALGOS / "ppo.py"
    )
    done = {"eval": [], "checkpoint": []}
    logger.evaluate = lambda step, run_eval: done["eval"].append(step)
    logger.save_checkpoint = lambda stateful, iteration, step: done["checkpoint"].append(step)
    return logger, done


def test_end_iteration_evaluates_and_checkpoints_where_a_multiple_is_passed(tmp_path, keep_sigint):
    """--eval-every and --checkpoint-every count steps: an iteration that passes a multiple of one
    evaluates (not the last: finish() does) or saves; Ctrl-C saves the iteration, then exits 130."""
    logger, done = recording_logger(tmp_path, eval_every=100, checkpoint_every=250)
    for iteration in range(1, 10):  # 64 steps an iteration
        logger.end_iteration({}, iteration, 64 * iteration, lambda: [0.0])
    assert done == {"eval": [128, 256, 320, 448, 512], "checkpoint": [256, 512]}
    logger.end_iteration({}, 10, 640, None)  # no run_eval: no evaluation
    assert done["eval"][-1] == 512
    logger.stop_requested = True
    with pytest.raises(SystemExit) as exit_:
        logger.end_iteration({}, 11, 704, lambda: [0.0])
    assert exit_.value.code == 130 and done["checkpoint"][-1] == 704


def test_stop_at_evaluates_saves_and_exits_0_after_its_iteration(tmp_path, capsys, keep_sigint):
    """--stop-at: the iteration that reaches it evaluates (where --eval-every asks), saves and ends
    the run with status 0 and how to go on; before it, and at the budget's end, nothing stops."""
    logger, done = recording_logger(tmp_path, eval_every=128, stop_at=256)
    assert not logger.stops_after(192) and logger.stops_after(256) and not logger.stops_after(576)
    for iteration in range(1, 4):  # 64 steps an iteration
        logger.end_iteration({}, iteration, 64 * iteration, lambda: [0.0])
    with pytest.raises(SystemExit) as exit_:
        logger.end_iteration({}, 4, 256, lambda: [0.0])
    assert exit_.value.code == 0 and done == {"eval": [128, 256], "checkpoint": [256]}
    assert "--stop-at 256): metrics kept, go on to --total-timesteps 576 with --resume" in (
        capsys.readouterr().out
    )


def test_a_run_says_its_duration_when_it_is_over_an_hour(tmp_path, capsys, keep_sigint):
    ppo = load_script("ppo.py")
    logger = ppo.RunLogger(ppo.Args(), tmp_path / "run", 100_000_000, 0, None, ALGOS / "ppo.py")
    logger.start -= 30  # 30 s of training for 1,000 steps: 33 steps/s
    logger.progress(1000)
    logger.progress(2000)
    logger.close_files()
    said = [line for line in capsys.readouterr().out.splitlines() if "hours here" in line]
    assert len(said) == 1 and re.match(
        r"at 3\d steps/s the rest of this run takes about [78]\d\d\.\d hours", said[0]
    )


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--learning-rate", "inf"], "--learning-rate inf is not a finite number"),
        (["--learning-rate", "nan"], "--learning-rate nan is not a finite number"),
    ],
)
def test_non_finite_flags(flags, expected, tmp_path):
    out = run_script("ppo.py", PPO + flags, tmp_path / "run", fork=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"error: {expected}"]
    assert not (tmp_path / "run").exists()


def test_a_stop_at_the_budget_or_within_the_steps_done(tmp_path):
    """--stop-at at or past --total-timesteps, or (on --resume) not past the steps already done,
    is a one-line error before anything is written."""
    at = PPO.index("--total-timesteps") + 1
    out = run_script("ppo.py", PPO + ["--stop-at", PPO[at]], tmp_path / "run", fork=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --stop-at {PPO[at]} must be below --total-timesteps {PPO[at]} "
        "(the run ends there anyway)"
    ]
    assert not (tmp_path / "run").exists()
    assert run_script("ppo.py", PPO, tmp_path / "run", fork=True).returncode == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    resume = ["--resume", str(tmp_path / "run"), "--total-timesteps", str(2 * int(PPO[at]))]
    out = run_script("ppo.py", resume + ["--stop-at", "64"], fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines[-1].startswith("error: --stop-at 64 is not beyond the ")
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before


def test_a_run_dir_that_cannot_be_written(tmp_path):
    out = run_script("ppo.py", PPO, "/proc/canonrl-x", fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "cannot be written" in lines[0], out.stderr


def test_a_garbage_line_in_metrics_csv_is_named_before_resuming(tmp_path):
    run_dir = tmp_path / "run"
    assert run_script("ppo.py", PPO, run_dir, fork=True).returncode == 0
    with open(run_dir / "metrics.csv", "a") as f:
        f.write("garbage\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    out = run_script("ppo.py", ["--resume", str(run_dir), "--total-timesteps", "1024"], fork=True)
    lines = out.stderr.strip().splitlines()
    assert (
        out.returncode == 2 and "metrics.csv line" in lines[-1] and "delete that line" in lines[-1]
    ), out.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("script", ["bc_discrete.py"])
def test_the_end_of_a_run_says_where_it_stands_against_the_reference_of_its_dataset(
    script, smoke_runs, tmp_path, capsys, keep_sigint
):
    """bc_discrete.py on the CartPole medium data: the reference of that dataset, never the
    medium-replay one (it was chosen by budget); a run at the reference's budget is placed within,
    below or above its seeds (medium-replay at 5k steps: seeds from 125.80 to 314.00)."""
    out = smoke_runs(script, tmp_path / "copy").out.stdout
    assert "medium-replay" not in out and "no reference for bc_discrete.py" in out, out
    bc = load_script("bc_discrete.py")
    args = bc.Args(
        env_id="CartPole-v1", dataset="canonrl/cartpole/medium-replay-v0", total_timesteps=5000
    )
    said = []
    for i, returns in enumerate(([200.0, 180.0], [100.0, 110.0], [400.0, 420.0])):
        bc.RunLogger(args, tmp_path / f"run{i}", 5000, 0, None, ALGOS / script).close(
            {"eval/episodic_return": returns}
        )
        said.append(capsys.readouterr().out.splitlines()[-1])
    assert said == [
        "this run: 190.00, within the reference's seeds",
        "this run: 105.00, below every seed of the reference",
        "this run: 410.00, above every seed of the reference",
    ]


def test_the_closing_verdict_compares_only_with_a_reference_of_the_same_flags(capsys):
    """The end-of-run lines name the reference of this script, env and flags (the evaluation
    schedule aside) and say where the run lies; with a hyperparameter the references were not made
    with, they say there is none with these flags."""
    from canonrl.run import RunLogger

    ppo = load_script("ppo.py")
    for args, expected in (
        (ppo.Args(total_timesteps=100_000, eval_every=5000), "reference ours-ppo-CartPole-v1-100k"),
        (ppo.Args(total_timesteps=100_000), "reference ours-ppo-CartPole-v1-100k"),
        (ppo.Args(total_timesteps=100_000, learning_rate=1e-3), "no reference with these flags"),
        (ppo.Args(env_id="Acrobot-v1"), "no reference for ppo.py on Acrobot-v1"),
    ):
        logger = object.__new__(RunLogger)  # only what the comparison reads
        logger.args = args
        logger.script = ALGOS / "ppo.py"
        logger.compare_with_reference({"eval/episodic_return": [500.0]})
        assert capsys.readouterr().out.startswith(expected), args
    dqn = load_script("dqn.py")
    logger = object.__new__(RunLogger)
    logger.args = dqn.Args(total_timesteps=100_000, learning_rate=2.3e-3)
    logger.script = ALGOS / "dqn.py"
    logger.compare_with_reference({"eval/episodic_return": [500.0]})
    out = capsys.readouterr().out
    assert out.startswith("reference ours-dqn-CartPole-v1-100k") and "within" in out, out
