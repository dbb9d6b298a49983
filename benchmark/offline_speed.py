"""Gradient steps per second of the offline scripts against d3rlpy with the same hyperparameters, on
the same dataset and batch size (benchmark/d3rlpy_baseline.py): runs interleaved (ours, d3rlpy,
ours, ...), one at a time, one torch thread each, no evaluation. A run's rate is its gradient steps
over its charts/train_seconds, which starts at its first gradient step on our side (after the
dataset is loaded) and at d3rlpy's first step on its side (after its scalers and networks are
built). Writes benchmark/reports/offline-speed/offline-speed-<device>-<date>-<HHMM>-<commit>.md.

    python benchmark/offline_speed.py --steps 3000 --repeats 3
    python benchmark/offline_speed.py --scripts cql_discrete.py --steps 1000 --repeats 1
"""

import argparse
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmark.datasets import standard  # noqa: E402
from benchmark.report_path import new_report_path  # noqa: E402
from benchmark.runs import git_commit, load_script, read_metrics, run_script  # noqa: E402

# our script -> (env, the STANDARD dataset it trains on)
PAIRS = {
    "bc_discrete.py": ("CartPole-v1", "cartpole-medium-v0"),
    "cql_discrete.py": ("CartPole-v1", "cartpole-medium-v0"),
    "bc_continuous.py": ("Pendulum-v1", "pendulum-medium-v0"),
    "td3_bc_continuous.py": ("Pendulum-v1", "pendulum-medium-v0"),
    "iql_continuous.py": ("Pendulum-v1", "pendulum-medium-v0"),
    "cql_continuous.py": ("Pendulum-v1", "pendulum-medium-v0"),
}


def rate(script: str, env_id: str, dataset: Path, steps: int, seed: int, where: Path) -> float:
    """Gradient steps per training second of one run of `script` ("d3rlpy:<script>" for
    d3rlpy's)."""
    run_dir = where / f"{script.replace(':', '-')}-{seed}"
    out = run_script(
        script,
        [
            "--env-id",
            env_id,
            "--dataset",
            str(dataset),
            "--total-timesteps",
            str(steps),
            "--seed",
            str(seed),
            "--eval-episodes",
            "0",
        ],
        run_dir,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script} failed: {out.stderr[-2000:]}")
    steps_at, seconds = read_metrics(run_dir)["charts/train_seconds"]
    return float(steps_at[-1] / seconds[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scripts", nargs="+", default=sorted(PAIRS), choices=sorted(PAIRS))
    p.add_argument("--steps", type=int, default=3000, help="gradient steps of each run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each side, interleaved")
    p.add_argument("--report-dir", type=Path, default=ROOT / "benchmark" / "reports")
    a = p.parse_args(argv)
    rates = {s: {"ours": [], "d3rlpy": []} for s in a.scripts}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for script in a.scripts:
                env_id, name = PAIRS[script]
                dataset = standard(name, ROOT / "runs" / "datasets")
                for side, run in (("ours", script), ("d3rlpy", f"d3rlpy:{script}")):
                    rates[script][side].append(
                        rate(run, env_id, dataset, a.steps, r + 1, Path(tmp))
                    )
                    print(
                        f"{script} repeat {r + 1}: {side} "
                        f"{rates[script][side][-1]:.1f} gradient steps/s",
                        flush=True,
                    )
    path = new_report_path(a.report_dir, "offline-speed", "cpu")
    lines = [
        "# Offline scripts against d3rlpy: gradient steps per second",
        "",
        "- command: `python benchmark/offline_speed.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"- commit: {git_commit()}",
        f"- machine: {platform.platform()}, one torch thread per run, runs one at a time, "
        f"ours and d3rlpy's interleaved; {a.steps} gradient steps per run, no evaluation",
        "",
        "| script | dataset | batch | ours: steps/s, each "
        "run | d3rlpy: steps/s, each run | median ratio |",
        "|---|---|---|---|---|---|",
    ]
    for script in a.scripts:
        ours, theirs = rates[script]["ours"], rates[script]["d3rlpy"]
        ratio = np.median(np.array(ours) / np.array(theirs))
        lines.append(
            f"| {script} | {PAIRS[script][1]} | {load_script(script).Args().batch_size} "
            f"| {', '.join(f'{x:.1f}' for x in ours)} | "
            f"{', '.join(f'{x:.1f}' for x in theirs)} | {ratio:.2f} |"
        )
    lines += [
        "",
        "Median ratio: the median over repeats of ours / d3rlpy's, each of two runs "
        "made one after the other (repeat r of ours, then repeat r of d3rlpy's), so "
        "that a change in the load touches both sides of a ratio alike.",
        "",
    ]
    path.write_text("\n".join(lines))
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
