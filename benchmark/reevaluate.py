"""Evaluate the final policies of finished offline runs again, on more episodes: a second, less
noisy measurement of the same policies (an offline run's own evaluations are 10 episodes by
default).

    python benchmark/reevaluate.py RUN_DIR [RUN_DIR ...] --episodes 100 --seed 2000000

Each run's checkpoint.pt gives its final actor (a continuous offline script: bc, td3_bc, iql or
cql_continuous.py), read as data (weights_only=True, its SHA-256 checked against checkpoint.sha256).
The script's own evaluate() plays --episodes greedy episodes from env.reset(seed=--seed + e): the
same starts for every run. Prints each run's mean return, each script's mean and std over its runs
(ddof 1) and, with two scripts, Welch's t of the first's runs against the second's, with its
one-sided p (the first better).
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/reevaluate.py` puts benchmark/ first on the path, not the root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from benchmark.runs import load_script  # noqa: E402

SCRIPTS = ("bc_continuous.py", "td3_bc_continuous.py", "iql_continuous.py", "cql_continuous.py")


def final_actor(run_dir: Path):
    """(script, env id, the actor of the run's checkpoint, ready to evaluate). A checkpoint of an
    unfinished run, of another script, that does not match its SHA-256 or that cannot be read as a
    checkpoint of the script (truncated, not a checkpoint, another network) is a ValueError."""
    config = json.loads((run_dir / "config.json").read_text())
    script = config.get("script") if isinstance(config, dict) else None
    path = run_dir / "checkpoint.pt"
    if script not in SCRIPTS:
        raise ValueError(f"{run_dir} is a run of {script}; this re-evaluates {', '.join(SCRIPTS)}")
    with open(path, "rb") as f:
        if (
            hashlib.file_digest(f, "sha256").hexdigest()
            != (run_dir / "checkpoint.sha256").read_text().strip()
        ):
            raise ValueError(f"{path}: its SHA-256 differs from checkpoint.sha256")
    try:
        ckpt = torch.load(path, weights_only=True)
    except Exception as e:
        # a truncated or foreign file whose digest was written after it (or by hand)
        raise ValueError(
            f"{path} cannot be read as a checkpoint ({type(e).__name__}); run the training again"
        )
    if not isinstance(ckpt, dict):
        raise ValueError(
            f"{path} is not a checkpoint of {script} (it holds a {type(ckpt).__name__})"
        )
    if not ckpt.get("finished"):
        raise ValueError(f"{run_dir} has not finished: its checkpoint is not the final policy")
    try:
        state = ckpt["actor"]
        actor = load_script(script).Actor(
            state["obs_mean"].shape[0], state["action_scale"].shape[0]
        )
        # the buffers too: the dataset's observation mean and std, the action range
        actor.load_state_dict(state)
        env_id = ckpt["args"]["env_id"]
    except (KeyError, TypeError, AttributeError, IndexError, RuntimeError) as e:
        raise ValueError(f"{path} holds no actor of {script} ({type(e).__name__})")
    return script, env_id, actor


def final_actors(run_dirs: list[Path], episodes: int, seed: int) -> list:
    """final_actor of each run, after the flags are checked: every bad input is a ValueError (or
    OSError, KeyError) before anything is played or printed. A run given twice (the same folder, by
    any path) would count twice: it is refused."""
    if episodes < 1:
        raise ValueError(f"--episodes {episodes}: at least 1 episode per run")
    if seed < 0:
        raise ValueError(
            f"--seed {seed}: a seed is >= 0 (episode e starts from env.reset(seed=seed + e))"
        )
    seen = {}
    for run_dir in run_dirs:
        resolved = run_dir.resolve()
        if resolved in seen:
            raise ValueError(
                f"{run_dir} is given twice (as {seen[resolved]} too): each run counts once"
            )
        seen[resolved] = run_dir
    return [final_actor(run_dir) for run_dir in run_dirs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument(
        "--seed", type=int, default=2_000_000, help="episode e starts from env.reset(seed=seed + e)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    try:
        actors = final_actors(args.run_dirs, args.episodes, args.seed)
    except (OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    means = {}
    print("| run | script | mean return | std over episodes |\n|---|---|---|---|")
    for run_dir, (script, env_id, actor) in zip(args.run_dirs, actors):
        returns = load_script(script).evaluate(actor, env_id, args.episodes, args.seed)
        means.setdefault(script, []).append(float(np.mean(returns)))
        print(
            f"| {run_dir.name} | {script} | {np.mean(returns):.2f} | {np.std(returns):.2f} |",
            flush=True,
        )
    print()
    for script, x in means.items():
        print(
            f"{script}: {np.mean(x):.2f} ± {np.std(x, ddof=1) if len(x) > 1 else 0.0:.2f} "
            f"over {len(x)} runs ({args.episodes} episodes each, from seed {args.seed})"
        )
    if len(means) == 2 and all(len(x) > 1 for x in means.values()):
        (a, x), (b, y) = means.items()
        t = stats.ttest_ind(x, y, equal_var=False, alternative="greater")
        print(
            f"{a} against {b}: {np.mean(x) - np.mean(y):+.2f}, Welch's "
            f"t = {t.statistic:.2f}, one-sided p = {t.pvalue:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
