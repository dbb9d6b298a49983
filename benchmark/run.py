"""Run a benchmark suite (benchmark/suites.toml): scripts x envs x seeds as subprocesses, then
score, aggregate and report (benchmark/report.py writes
benchmark/reports/<suite>/<suite>-<device>-<date>-<HHMM>-<commit>.md with learning curves; an
earlier report is never overwritten).

    python benchmark/run.py --suite classic --seeds 5 --device cpu --jobs 2
    python benchmark/run.py --suite classic --device cuda --jobs 4 --backend ray  # a local Ray
    python benchmark/run.py --suite classic --seeds 5 --backend ray \\
        --ray-address 127.0.0.1:6379  # a cluster started with `ray start --head`

Runs go to <out>/<script>__<env>__<seed>/ (default out: runs/benchmark/<suite>-<device>). Running
the same command again resumes: a run whose metrics.csv holds its final evaluation is kept, a run
left half-done (killed, Ctrl-C) goes on from its checkpoint.pt when config.json shows it was started
with the same script and flags (the script's --resume), any other run directory is deleted and the
run redone from the start (under --backend ray every half-done run is: its runs are made on the
workers). A run that crashes is reported and the others go on; its output is in
<run_dir>/output.log. Scripts of the suite that do not exist yet are listed as missing and skipped.
With --backend ray the runs are Ray tasks (benchmark/ray_backend.py): on a local Ray started here,
or with --ray-address (or RAY_ADDRESS) on an existing cluster (`ray start --head`), whose workers
get this checkout's code and send each run directory back to be written under <out>. --seeds-from
REPORT.md (repeatable) adds the per-seed scores of an earlier report of the same suite for seeds
this command does not run, so that a suite too long for one sitting is reported whole: use it only
where the scripts have not changed since that report (the new report names each seed's source; its
curves show only the runs made here). Exit status: 0 when every run finished, 1 when some crashed
(the report is written either way), 2 for bad input (an unknown suite, a Ray address that cannot be
reached, an earlier report that cannot be used).
"""

import argparse
import dataclasses
import json
import os
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/run.py` puts benchmark/ first on the path, not the root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tqdm import tqdm  # noqa: E402

from benchmark.runs import (  # noqa: E402
    ALGOS,
    OneLineParser,
    Outcome,
    RunSpec,
    Unreachable,
    execute,
    not_a_run,
)

SUITES = Path(__file__).resolve().parent / "suites.toml"
REPORTS = Path(__file__).resolve().parent / "reports"


@dataclass
class Suite:
    name: str
    description: str
    seeds: int
    runs: list[dict] = field(default_factory=list)
    # benchmark/datasets.py STANDARD names its runs read
    datasets: list[str] = field(default_factory=list)


def load_suites(path: Path = SUITES) -> dict[str, Suite]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    from benchmark.datasets import STANDARD  # the datasets a suite may name

    suites = {}
    for name, s in data.items():
        runs = s.get("run", [])
        for r in runs:
            missing = {"script", "env_id", "total_timesteps", "score"} - set(r)
            if missing:
                raise ValueError(f"{path}: a run of suite {name!r} lacks {sorted(missing)}")
            if r.get("self_reference") and not r.get("reference"):
                raise ValueError(
                    f"{path}: a run of suite {name!r} has self_reference but no reference"
                )
            for other in compared_with(r):
                if not any(
                    (o["script"], o["env_id"], o["total_timesteps"], o["score"])
                    == (other, r["env_id"], r["total_timesteps"], r["score"])
                    for o in runs
                ):
                    raise ValueError(
                        f"{path}: a run of suite {name!r} compares with {other!r}, "
                        f"which the suite does not run on {r['env_id']} at "
                        f"{r['total_timesteps']} steps with score {r['score']!r}"
                    )
        # a run's folder is <script>__<env>__<seed>: two runs of one script on one env at one
        # budget with other flags would write into the same folders, the second replacing the
        # first (at another budget the longer run goes on from the shorter, the contract's resume)
        keys = [(r["script"], r["env_id"], r["total_timesteps"]) for r in runs]
        if twice := sorted({k for k in keys if keys.count(k) > 1}):
            raise ValueError(
                f"{path}: suite {name!r} runs {twice[0][0]} on {twice[0][1]} at {twice[0][2]} "
                "steps twice (other flags): their run folders would be the same; put one of "
                "them in a suite of its own"
            )
        if unknown := set(s.get("datasets", [])) - set(STANDARD):
            raise ValueError(
                f"{path}: suite {name!r} names datasets that "
                f"benchmark/datasets.py does not make: {sorted(unknown)}"
            )
        suites[name] = Suite(
            name, s.get("description", ""), int(s.get("seeds", 1)), runs, s.get("datasets", [])
        )
    return suites


def compared_with(run: dict) -> tuple[str, ...]:
    """The scripts a suite's run is also judged against: its compare_with, one script or a list of
    them."""
    others = run.get("compare_with", ())
    return (others,) if isinstance(others, str) else tuple(others)


def plan(
    suite: Suite,
    seeds: int | None = None,
    scripts: list[str] | None = None,
    first_seed: int = 1,
    envs: list[str] | None = None,
) -> tuple[list[RunSpec], list[str]]:
    """The runs of a suite (N seeds from first_seed on; only `scripts` and `envs` if given) whose
    script exists, and the scripts that do not exist yet."""
    specs, missing = [], []
    for r in suite.runs:
        if (scripts and r["script"] not in scripts) or (envs and r["env_id"] not in envs):
            continue
        # sb3:<script> and d3rlpy:<script> too
        if not (ALGOS / r["script"].split(":")[-1]).is_file():
            missing += [r["script"]] if r["script"] not in missing else []
            continue
        for seed in range(first_seed, first_seed + (seeds or suite.seeds)):
            specs.append(
                RunSpec(
                    r["script"],
                    r["env_id"],
                    seed,
                    int(r["total_timesteps"]),
                    r["score"],
                    tuple(r.get("flags", ())),
                    r.get("reference"),
                    bool(r.get("self_reference")),
                    compared_with(r),
                )
            )
    return specs, missing


def seeds_from(
    report_md: Path, suite: Suite, specs: list[RunSpec], known: list[Outcome]
) -> list[Outcome]:
    """The seeds that an earlier report of this suite scored for the runs of `specs`, except the
    seeds that `specs` run or `known` holds already, as "reported" outcomes (run_dir: that report).
    ValueError when the report is not one of this suite's, holds none of these runs, or scores a
    seed that `known` has with another value."""
    results = Path(report_md).with_suffix("") / "results.json"
    if not results.is_file():
        raise ValueError(
            f"{report_md}: no {results} beside it; give a report .md that benchmark/run.py wrote"
        )
    data = json.loads(results.read_text())
    if data.get("suite") != suite.name:
        raise ValueError(
            f"{report_md} is a report of suite {data.get('suite')!r}, not {suite.name!r}"
        )
    templates, running = {}, {(s.script, s.env_id, s.seed) for s in specs}
    for s in specs:
        templates.setdefault((s.script, s.env_id, s.total_timesteps, s.score, s.flags), s)
    have = {(o.spec.script, o.spec.env_id, o.spec.seed): o for o in known}
    added = []
    for cell in data["cells"]:
        key = (
            cell["script"],
            cell["env_id"],
            cell["total_timesteps"],
            cell["score"],
            tuple(cell["flags"]),
        )
        if cell.get("compared_with") or key not in templates:
            continue
        for seed, value in cell["scores"].items():
            spec = dataclasses.replace(templates[key], seed=int(seed))
            if (spec.script, spec.env_id, spec.seed) in running:
                continue
            earlier = have.get((spec.script, spec.env_id, spec.seed))
            if earlier is not None:
                if earlier.reported["score"] != value:
                    raise ValueError(
                        f"{report_md} scores {spec.name} {value}, {earlier.run_dir} "
                        f"{earlier.reported['score']}: give one of them"
                    )
                continue
            curve = cell.get("eval_curves", {}).get(seed, [])
            o = Outcome(
                spec,
                Path(report_md),
                "reported",
                reported={
                    "score": value,
                    "final_eval": cell.get("final_evals", {}).get(seed),
                    "eval_curve": curve,
                },
            )
            have[(spec.script, spec.env_id, spec.seed)] = o
            added.append(o)
    if not added:
        raise ValueError(
            f"{report_md} scores no seed of these runs that this command does not run itself"
        )
    return added


def run_all(
    specs: list[RunSpec],
    out: Path,
    device: str = "cpu",
    jobs: int = 1,
    backend: str = "local",
    timeout: float | None = None,
    progress: bool = True,
    ray_address: str | None = None,
) -> list[Outcome]:
    """Run every spec under out/<spec.name>, `jobs` at a time (ray with an address: as the cluster's
    CPUs allow); returns the outcomes in the order of specs."""
    out = Path(out).resolve()
    items = [(spec, out / spec.name) for spec in specs]
    bar = tqdm(total=len(items), unit="run", disable=not progress, desc=f"{backend} x{jobs}")
    outcomes = {}

    def record(o: Outcome):
        outcomes[o.spec] = o
        bar.update(1)
        bar.set_postfix(failed=sum(not x.finished for x in outcomes.values()), refresh=False)
        if not o.finished:
            tqdm.write(f"FAILED {o.spec.name}: {o.error} (log: {o.run_dir / 'output.log'})")

    try:
        if backend == "ray":
            from benchmark.ray_backend import execute_all

            for o in execute_all(items, device, jobs, timeout, ray_address):
                record(o)
        elif backend == "local":
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [
                    pool.submit(execute, spec, run_dir, device, timeout) for spec, run_dir in items
                ]
                for fut in as_completed(futures):
                    record(fut.result())
        else:
            raise ValueError(f"unknown backend {backend!r}: local or ray")
    finally:
        bar.close()
    return [outcomes[spec] for spec in specs]


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--suite",
        required=True,
        help="a suite of benchmark/suites.toml (smoke, classic, continuous, ...)",
    )
    p.add_argument("--seeds", type=int, default=None, help="number of seeds (default: the suite's)")
    p.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="seeds first-seed .. first-seed + seeds - 1 (e.g. "
        "--first-seed 2 --seeds 2 adds seeds 2 and 3 to "
        "a suite run whose seed 1 is reported already)",
    )
    p.add_argument(
        "--scripts",
        nargs="+",
        default=None,
        help="run only these scripts of the suite (e.g. ppo.py)",
    )
    p.add_argument(
        "--envs",
        nargs="+",
        default=None,
        help="run only on these envs of the suite (e.g. Pendulum-v1)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time (each uses one CPU thread); with "
        "--ray-address the cluster's free CPUs decide, and --jobs is only the runs per GPU on cuda",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directories (default runs/benchmark/<suite>-<device>)",
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: subprocesses from a thread pool; ray: the same as Ray tasks",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --backend ray: the cluster to run on, "
        "host:port of its head (`ray start --head`); default "
        "RAY_ADDRESS; without either a local Ray is started here",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before a run is killed and counted as failed",
    )
    p.add_argument(
        "--seeds-from",
        type=Path,
        action="append",
        default=[],
        metavar="REPORT_MD",
        help="an earlier report of this suite whose seeds (those "
        "this command does not run) join the new report; only "
        "where the scripts are unchanged since (repeatable)",
    )
    p.add_argument("--report-dir", type=Path, default=REPORTS)
    p.add_argument("--suites-file", type=Path, default=SUITES)
    p.add_argument(
        "--references-file", type=Path, default=None, help="default benchmark/references.toml"
    )
    args = p.parse_args(argv)
    if args.ray_address and args.backend != "ray":
        p.error("--ray-address needs --backend ray")
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs}: at least one run at a time")
    if args.timeout is not None and not args.timeout > 0:
        p.error(f"--timeout {args.timeout}: give seconds > 0 (or leave it out: no limit)")
    if args.report_dir.exists() and not args.report_dir.is_dir():
        p.error(f"--report-dir {args.report_dir} is a file; pass a directory")
    if args.device == "cuda" and args.backend == "local":  # (a Ray cluster's GPUs are its own)
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: this machine has no CUDA device; run with --device cpu")
    try:
        return _main(
            p,
            args,
            "python benchmark/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        )
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(p: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    ray_address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if args.backend == "ray" and ray_address:
        from benchmark.ray_backend import check_reachable

        check_reachable(ray_address)  # before any work: a wrong address is bad input
    try:
        suites = load_suites(args.suites_file)
    except (OSError, ValueError) as e:  # tomllib's TOMLDecodeError is a ValueError
        p.error(f"--suites-file {args.suites_file} cannot be read ({type(e).__name__}: {e})")
    from benchmark import references, report

    # read before any run: a references file that cannot be read would fail only at the end
    try:
        refs = references.load_references(args.references_file or references.REFERENCES)
    except (OSError, ValueError, TypeError, KeyError) as e:
        where = args.references_file or references.REFERENCES
        p.error(f"--references-file {where} cannot be read ({type(e).__name__}: {e})")
    if args.suite not in suites:
        p.error(f"unknown suite {args.suite!r}; known: {', '.join(suites)}")
    suite = suites[args.suite]
    unknown = set(args.scripts or []) - {r["script"] for r in suite.runs}
    if unknown:
        p.error(f"suite {args.suite!r} has no runs of {sorted(unknown)}")
    unknown = set(args.envs or []) - {r["env_id"] for r in suite.runs}
    if unknown:
        p.error(f"suite {args.suite!r} has no runs on {sorted(unknown)}")
    if args.first_seed < 0 or (args.seeds is not None and args.seeds < 1):
        p.error("--first-seed must be >= 0 and --seeds >= 1")
    specs, missing = plan(suite, args.seeds, args.scripts, args.first_seed, args.envs)
    if missing:
        print(
            "missing scripts (planned, not in algos/ yet; "
            f"their runs are skipped): {', '.join(missing)}",
            file=sys.stderr,
        )
    if not specs:
        print(
            f"nothing to run: none of the scripts of suite {args.suite!r} exists yet",
            file=sys.stderr,
        )
        return 0
    earlier = []
    # checked before any run: a report that cannot be used is bad input
    for report_md in args.seeds_from:
        try:
            earlier += seeds_from(report_md, suite, specs, earlier)
        except (ValueError, OSError, KeyError) as e:
            p.error(f"--seeds-from: {e}")
    out = args.out or ROOT / "runs" / "benchmark" / f"{args.suite}-{args.device}"
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file; pass a directory")
    # a half-done run is redone from the start, its folder cleared: never a folder of someone's
    if foreign := [spec.name for spec in specs if not_a_run(out / spec.name)]:
        p.error(
            f"--out {out}: {out / foreign[0]} holds files that are not a run, and would be "
            "replaced; move it or choose another --out"
        )
    # the datasets that the chosen offline runs read under runs/datasets/ (made once, from the
    # committed policies)
    if read := [
        name
        for name in suite.datasets
        if any(f"runs/datasets/{name}" in spec.flags for spec in specs)
    ]:
        from benchmark.datasets import standard

        for name in read:
            print(f"dataset {standard(name)}", file=sys.stderr)
    print(f"suite {args.suite}: {len(specs)} runs in {out}", file=sys.stderr)
    outcomes = run_all(
        specs, out, args.device, args.jobs, args.backend, args.timeout, ray_address=ray_address
    )

    path = report.write_report(
        suite, outcomes + earlier, missing, args.device, args.report_dir, refs, command=command
    )
    failed = [o for o in outcomes if not o.finished]
    print(
        f"report: {path}" + (f"; {len(failed)} of {len(outcomes)} runs failed" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    # so that Ray pickles RunSpec and Outcome as benchmark.run's, not __main__'s
    from benchmark import run as _module

    sys.exit(_module.main())
