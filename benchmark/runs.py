"""Run an algos/ script as a subprocess and read what it left behind."""
import csv
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"


def script_path(script: str) -> Path:
    path = ALGOS / script
    if not path.is_file():
        raise FileNotFoundError(f"no script {script} in {ALGOS}")
    return path


def run_env(**extra) -> dict:
    """The environment a script runs under: one torch thread, wandb offline, plus `extra`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "offline", **extra}


def script_command(script: str, flags: list[str], run_dir: Path | str | None) -> list[str]:
    """The command line of algos/<script>; "sb3:<script>" is SB3 with that script's hyperparameters
    (benchmark/sb3_baseline.py)."""
    if script.startswith("sb3:"):
        script_path(script.removeprefix("sb3:"))
        cmd = [sys.executable, str(ROOT / "benchmark" / "sb3_baseline.py"), "--same-as", script[4:], *flags]
    else:
        cmd = [sys.executable, str(script_path(script)), *flags]
    return cmd + (["--run-dir", str(run_dir)] if run_dir is not None else [])


def run_script(script: str, flags: list[str], run_dir: Path | str | None = None, timeout: float | None = None,
               cwd: Path | str = ROOT, **env) -> subprocess.CompletedProcess:
    """Run `python algos/<script> <flags> --run-dir <run_dir>` in `cwd` with the extra environment variables `env`;
    stdout and stderr are captured as text."""
    return subprocess.run(script_command(script, flags, run_dir), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=run_env(**env))


def read_rows(run_dir: Path | str) -> list[dict]:
    """metrics.csv as a list of rows {global_step, wall_time, name, value}."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [{"global_step": int(r["global_step"]), "wall_time": float(r["wall_time"]), "name": r["name"],
                 "value": float(r["value"])} for r in csv.DictReader(f)]


def tail_rows(path: Path, offset: int, rows: list) -> int:
    """Append the complete rows written to metrics.csv after byte `offset` to `rows`; returns the new offset.
    For watching a run while it goes: reading only what is new costs little CPU."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    complete = chunk[:chunk.rfind(b"\n") + 1]
    for line in complete.decode().splitlines():
        step, wall, name, value = line.split(",")
        if step != "global_step":
            rows.append({"global_step": int(step), "wall_time": float(wall), "name": name, "value": float(value)})
    return offset + len(complete)


def read_metrics(run_dir: Path | str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """metrics.csv as {name: (global_steps, values)} in the order they were logged."""
    series = defaultdict(lambda: ([], []))
    for row in read_rows(run_dir):
        series[row["name"]][0].append(row["global_step"])
        series[row["name"]][1].append(row["value"])
    return {k: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for k, (s, v) in series.items()}


def file_stem(script: str) -> str:
    """A script's name for file names: "ppo.py" -> "ppo", "sb3:sac_continuous.py" -> "sb3-sac_continuous"."""
    return script.removesuffix(".py").replace(":", "-")


def load_script(script: str):
    """Import algos/<script> as a module (its main() does not run): its Args defaults, functions, classes."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), script_path(script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_finished(run_dir: Path | str) -> bool:
    """True when the run logged its final evaluation: eval/episodic_return(_team) rows (at least --eval-episodes of
    them) at the last step of training. Training ends at the largest multiple of the step granularity
    (num_envs * num_steps for rollout scripts, num_envs otherwise) not above total_timesteps, and evaluations
    during training (--eval-every) happen at least one granularity earlier, so they never pass for the final one."""
    import json
    run_dir = Path(run_dir)
    try:
        args = json.loads((run_dir / "config.json").read_text())["args"]
        rows = read_rows(run_dir)
    except (OSError, ValueError, KeyError):
        return False
    if not rows or args.get("eval_episodes", 1) < 1:
        return False
    last = max(r["global_step"] for r in rows)
    granularity = args.get("num_envs", 1) * args.get("num_steps", 1)
    evals = sum(r["name"].startswith("eval/episodic_return") and r["global_step"] == last for r in rows)  # _team too
    return evals >= args.get("eval_episodes", 1) and last > args["total_timesteps"] - granularity


def pack_dir(run_dir: Path | str) -> dict[str, bytes]:
    """Every file under run_dir as {path relative to it: bytes}: how a run made on another machine comes back."""
    run_dir = Path(run_dir)
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def unpack_dir(run_dir: Path | str, files: dict[str, bytes]) -> None:
    """Write pack_dir's files under run_dir."""
    for rel, data in files.items():
        path = Path(run_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def git_head() -> tuple[str, list[str]]:
    """The short commit of this checkout ("unknown" outside git) and its tracked files with uncommitted changes."""
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") or "unknown", [ln.split(maxsplit=1)[1] for ln in dirty.splitlines()]


def git_commit() -> str:
    """The short commit of this checkout, saying so when tracked files have uncommitted changes."""
    commit, dirty = git_head()
    return commit + (" with uncommitted changes to " + ", ".join(dirty) if dirty else "")
