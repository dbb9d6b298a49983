"""impala.py's throughput with 1, 2, 4 actors against a2c.py at the same batch, on this machine, one
run each in a row (CartPole-v1, no evaluation during training):

    python benchmark/impala_speed.py  # 100k steps per run; writes benchmark/reports/impala-speed/
    python benchmark/impala_speed.py --steps 20000 --actors 1 2 --report-dir /tmp/r

The runs: impala.py with --num-actors 0 (one actor in the learner's process); with each --actors
count on a local Ray that impala.py starts itself; with the same counts on a separate Ray cluster
(`ray start --head` here, joined with --ray-address: the actors run in the cluster's processes, as
they would on other machines); a2c.py with the envs of one actor (8 x 20 steps per update) and of
all of them (8 x actors x 20). Steps/s: the run's final charts/sps (steps over its training seconds:
start-up excluded); wall: the whole process, Ray's start-up included.
"""

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/impala_speed.py` puts benchmark/ first on the path, not the root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmark.ray_backend import separate_cluster  # noqa: E402
from benchmark.report_path import new_report_path  # noqa: E402
from benchmark.runs import git_commit, read_metrics, run_script  # noqa: E402

REPORTS = Path(__file__).resolve().parent / "reports"


def configurations(actors: list[int]) -> list[tuple[str, str, list[str]]]:
    """(label, script, flags) of every run but those on the separate cluster."""
    runs = [("impala.py, --num-actors 0 (in-process)", "impala.py", ["--num-actors", "0"])]
    runs += [
        (
            f"impala.py, {n} Ray actor{'s' * (n > 1)}, local Ray",
            "impala.py",
            ["--num-actors", str(n)],
        )
        for n in actors
    ]
    runs += [
        (
            f"a2c.py, {8 * n} envs x 20 steps",
            "a2c.py",
            ["--num-envs", str(8 * n), "--num-steps", "20"],
        )
        for n in sorted({1, *actors})
    ]
    return runs


def measure(script: str, flags: list[str], steps: int, tmp: Path, **env) -> tuple[float, float]:
    """(steps/s, wall seconds) of one run of `steps` CartPole-v1 steps; a failed run is an error."""
    run_dir = tmp / f"run{len(list(tmp.iterdir()))}"
    start = time.perf_counter()
    out = run_script(
        script,
        [
            "--env-id",
            "CartPole-v1",
            "--total-timesteps",
            str(steps),
            "--eval-episodes",
            "0",
            *flags,
        ],
        run_dir,
        timeout=3600,
        **env,
    )
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(flags)} failed: {out.stderr.strip()[-1500:]}")
    return float(read_metrics(run_dir)["charts/sps"][1][-1]), wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=100_000, help="CartPole-v1 steps per run")
    p.add_argument(
        "--actors", type=int, nargs="+", default=[1, 2, 4], help="Ray actor counts to measure"
    )
    p.add_argument(
        "--cluster-cpus", type=int, default=4, help="CPUs the separate cluster offers its actors"
    )
    p.add_argument(
        "--no-cluster", action="store_true", help="leave out the runs on a separate cluster"
    )
    p.add_argument("--report-dir", type=Path, default=REPORTS)
    a = p.parse_args(argv)
    if a.cluster_cpus < max(a.actors) and not a.no_cluster:
        p.error(
            f"--cluster-cpus {a.cluster_cpus} is fewer than "
            f"{max(a.actors)} actors: they would wait for CPUs"
        )
    rows = []

    def run(label, script, flags, **env):
        rows.append((label, *measure(script, flags, a.steps, Path(tmp), **env)))
        print(f"{label}: {rows[-1][1]:,.0f} steps/s, {rows[-1][2]:.1f} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        for label, script, flags in configurations(a.actors):
            run(label, script, flags)
        if not a.no_cluster:
            with separate_cluster(a.cluster_cpus) as (address, env, _):
                for n in a.actors:
                    run(
                        f"impala.py, {n} Ray actor{'s' * (n > 1)}, separate cluster",
                        "impala.py",
                        ["--num-actors", str(n), "--ray-address", address],
                        RAY_AUTH_TOKEN_PATH=env["RAY_AUTH_TOKEN_PATH"],
                    )
    path = new_report_path(a.report_dir, "impala-speed", "cpu")
    path.write_text(
        "\n".join(
            [
                f"# impala.py speed, {datetime.datetime.now():%Y-%m-%d %H:%M}",
                "",
                "- command: `python benchmark/impala_speed.py "
                f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
                f"- commit: {git_commit()}",
                f"- machine: {platform.platform()}, {os.cpu_count()} CPU cores",
                "",
                __doc__.split("\n\n", 2)[2].strip(),
                "",
                f"CartPole-v1, {a.steps:,} steps per run, one run each, in the order below.",
                "",
                "| configuration | steps/s (training) | wall |",
                "|---|---:|---:|",
                *[f"| {label} | {sps:,.0f} | {wall:.1f} s |" for label, sps, wall in rows],
                "",
            ]
        )
    )
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
