"""The run contract as a user meets it, on the behaviour the shared blocks give every script: --track fills a wandb
run with every metric, --capture-video writes a video that plays, a checkpoint is data that is checked before it is
loaded, Ctrl-C saves a finished iteration, a finished run is not evaluated twice. Behaviour that lives in the shared
blocks is tested on ppo.py (and dqn.py where a replay buffer matters); what each script holds is tested on every one."""
import signal
import struct
import time

import pytest
import torch

from benchmark.runs import load_script, read_rows, run_script, start_script
from conftest import SMOKE

PPO = SMOKE["ppo.py"]  # 4 envs x 32 steps: one iteration is 128 steps
DQN = SMOKE["dqn.py"]


def wandb_history(path) -> list[dict]:
    """The history records of an offline run's .wandb file, as {metric name: value} (the file is LevelDB-log framed:
    32 KiB blocks, 7-byte record headers (crc, length, type), records split FIRST/MIDDLE/LAST across blocks)."""
    from wandb.proto import wandb_internal_pb2
    data, pos, chunk, history = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # the tail of a block too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                history.append({item.nested_key[0] if item.nested_key else item.key: item.value_json
                                for item in record.history.item})
    return history


def test_track_logs_every_metric_to_wandb(tmp_path):
    out = run_script("ppo.py", PPO + ["--track"], tmp_path / "run", WANDB_MODE="offline", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    history = wandb_history(files[0])
    logged = {name for record in history for name in record}
    names = {r["name"] for r in read_rows(tmp_path / "run")}
    assert {"eval/episodic_return", "charts/sps", "train/episodic_return", "losses/policy_loss"} <= names
    assert names <= logged, f"metrics.csv names missing from the wandb run: {names - logged}"
    evals = [float(r["eval/episodic_return"]) for r in history if "eval/episodic_return" in r]
    rows = [r["value"] for r in read_rows(tmp_path / "run") if r["name"] == "eval/episodic_return"]
    assert evals[-1] == rows[-1], "the wandb run holds the values metrics.csv holds"


@pytest.mark.parametrize("script", ["ppo.py", "dqn.py"])
def test_capture_video_records_the_first_evaluation_episode(script, tmp_path):
    """--capture-video: an mp4 of evaluation episode 0 that plays: one frame per step plus the first, and it moves."""
    import imageio.v2 as imageio
    out = run_script(script, SMOKE[script] + ["--capture-video"], tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    videos = list((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4"]
    frames = [frame for frame in imageio.get_reader(videos[0])]  # not list(): the reader says its length is inf
    first_return = next(r["value"] for r in read_rows(tmp_path / "run") if r["name"] == "eval/episodic_return")
    assert len(frames) == int(first_return) + 1, "CartPole: one frame per step (reward 1 each) and the reset frame"
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
        out = run_script("ppo.py", ["--resume", str(run_dir), "--total-timesteps", "1024"], fork=True)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "corrupt" in lines[0], (damage, out.stderr)
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
    """600 steps is not a multiple of the 128-step iteration: the run says that 512 will run, and the bar ends full."""
    out = run_script("ppo.py", PPO[:PPO.index("--total-timesteps")] + ["--total-timesteps", "600"] +
                     PPO[PPO.index("--total-timesteps") + 2:], tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "512 steps will run" in out.stdout and "512/512" in out.stderr
    data = (tmp_path / "run" / "metrics.csv").read_bytes()
    assert b"\r" not in data and data.endswith(b"\n")
    assert max(r["global_step"] for r in read_rows(tmp_path / "run")) == 512


def test_run_dir_that_is_a_file_or_a_folder_of_something_else(tmp_path):
    (tmp_path / "file").write_text("x")
    out = run_script("ppo.py", PPO, tmp_path / "file", fork=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --run-dir {tmp_path / 'file'} is a file; pass a directory"]
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("x")
    out = run_script("ppo.py", PPO, tmp_path / "folder", fork=True)
    assert out.returncode == 2 and "holds no run" in out.stderr and "--resume" not in out.stderr
    assert [p.name for p in (tmp_path / "folder").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("script,env_id,expected", [
    ("ppo.py", "ALE/Breakout-v5", "ppo_atari.py"),
    ("ppo.py", "simple_spread_v3", "mappo_mpe.py"),
    ("ppo.py", "3m", "mappo_smac_lite.py"),
    ("ppo_atari.py", "MinAtar/Breakout-v1", "dqn_atari.py"),
    ("sac_continuous.py", "ALE/Pong-v5", "dqn_atari.py"),
])
def test_an_env_of_another_family_names_its_script(script, env_id, expected, tmp_path):
    out = run_script(script, ["--env-id", env_id], tmp_path / "run", fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and expected in lines[0] and "unknown" not in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def ctrl_c(script, flags, run_dir) -> int:
    """Start a run, press Ctrl-C once it has logged losses; returns the step of the checkpoint it left."""
    proc = start_script(script, flags, run_dir, fork=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((run_dir / "metrics.csv").exists() and
                                           "losses/" in (run_dir / "metrics.csv").read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"]


def same_state(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


# Flags under which no schedule reads the budget (a run stopped at step s equals the first s steps of a longer one), the
# budget Ctrl-C interrupts and the steps the resumed runs add: the on-policy and the replay templates, SAC (a learnt
# temperature), QMIX (episode replay, an update count derived from the step)
STEADY = {"ppo.py": (PPO + ["--no-anneal-lr", "--no-anneal-clip"], 30_000, 1024),
          "dqn.py": (DQN + ["--no-anneal-lr", "--start-e", "0.05", "--end-e", "0.05"], 30_000, 1024),
          "sac_continuous.py": (["--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "32",
                                 "--eval-episodes", "0"], 5000, 200),
          "qmix_smac_lite.py": (["--env-id", "3m", "--num-envs", "4", "--learning-starts", "200", "--batch-size", "8",
                                 "--buffer-size", "64", "--eval-episodes", "0"], 12_000, 500)}


@pytest.mark.parametrize("script", sorted(STEADY))
def test_ctrl_c_saves_a_finished_iteration_and_resumes_as_an_uninterrupted_run(script, tmp_path):
    """Ctrl-C mid-run leaves the checkpoint a run with exactly that budget leaves at its end (weights, optimisers,
    replay buffer, RNGs), and both, resumed to the same budget, log the same losses (QMIX: the same update count)."""
    flags, long, more = STEADY[script]
    flags = [f for i, f in enumerate(flags) if "--total-timesteps" not in flags[max(i - 1, 0):i + 1]]
    step = ctrl_c(script, flags + ["--total-timesteps", str(long)], tmp_path / "a")
    assert step < long
    out = run_script(script, flags + ["--total-timesteps", str(step)], tmp_path / "b", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    a, b = (torch.load(tmp_path / r / "checkpoint.pt", weights_only=True) for r in "ab")
    assert a["global_step"] == b["global_step"] == step and not a["finished"] and b["finished"]
    for key in set(a) - {"args", "finished"}:
        assert same_state(a[key], b[key]), f"the interrupted run's {key} is not that of a finished iteration"
    for r in "ab":
        out = run_script(script, ["--resume", str(tmp_path / r), "--total-timesteps", str(step + more)], fork=True)
        assert out.returncode == 0, out.stderr[-2000:]
    logged = [[(x["global_step"], x["name"], x["value"]) for x in read_rows(tmp_path / r) if x["global_step"] > step
               and (x["name"].startswith("losses/") or x["name"] == "charts/updates")] for r in "ab"]
    assert logged[0] and logged[0] == logged[1]


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_every_checkpointed_object_round_trips(script, smoke_runs, tmp_path, monkeypatch):
    """The checkpoint holds the state_dict() of every object of the script's `stateful` dict, nothing else besides the
    counters, and each object, resumed, gives back exactly the state that was saved."""
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
    assert set(ckpt) - {"args", "iteration", "global_step", "finished"} == set(seen)
    for name, obj in seen.items():
        assert same_state(module.plain(obj.state_dict()), ckpt[name]), f"{script}: {name} does not round-trip"
