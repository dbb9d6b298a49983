"""Run an algos/ script as a subprocess and read what it left behind (DESIGN §3)."""
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
    cmd = [sys.executable, str(script_path(script)), *flags]
    return cmd + (["--run-dir", str(run_dir)] if run_dir is not None else [])


def run_script(script: str, flags: list[str], run_dir: Path | str | None = None, timeout: float | None = None,
               **env) -> subprocess.CompletedProcess:
    """Run `python algos/<script> <flags> --run-dir <run_dir>`; stdout and stderr are captured as text."""
    return subprocess.run(script_command(script, flags, run_dir), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=run_env(**env))


def read_rows(run_dir: Path | str) -> list[dict]:
    """metrics.csv as a list of rows {global_step, wall_time, name, value}."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [{"global_step": int(r["global_step"]), "wall_time": float(r["wall_time"]), "name": r["name"],
                 "value": float(r["value"])} for r in csv.DictReader(f)]


def read_metrics(run_dir: Path | str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """metrics.csv as {name: (global_steps, values)} in the order they were logged."""
    series = defaultdict(lambda: ([], []))
    for row in read_rows(run_dir):
        series[row["name"]][0].append(row["global_step"])
        series[row["name"]][1].append(row["value"])
    return {k: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for k, (s, v) in series.items()}
