"""smac_lite reference battles: win rate, mean return and episode length of the random and the
scripted focus-fire policies against the scripted enemy, over the first episode of 1000 battles per
map and policy. Writes benchmark/reports/smac_lite-battles/smac_lite-battles-<device>-<date>-
<time>-<commit>.md (never overwrites a report).

    OMP_NUM_THREADS=1 python benchmark/smac_lite_battles.py [--maps 3m 8m] [--battles 1000] \\
        [--seed 0]
"""

import argparse
import math
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from smac_lite.maps import MAPS  # noqa: E402
from smac_lite.policies import play_battles  # noqa: E402

POLICIES = ("random", "focus_fire")

# SMAC's difficulty labels, as tabulated in the d4marl documentation (github.com/jymh/d4marl,
# docs/source/smac/smac_env.rst), which follows the SMAC paper (Samvelyan et al. 2019).
SMAC_DIFFICULTY = {
    "2m_vs_1z": "easy",
    "2s3z": "easy",
    "2s_vs_1sc": "easy",
    "3m": "easy",
    "3s_vs_3z": "easy",
    "3s_vs_4z": "easy",
    "8m": "easy",
    "so_many_baneling": "easy",
    "1c3s5z": "easy",
    "bane_vs_bane": "easy",
    "MMM": "hard",
    "2c_vs_64zg": "hard",
    "3s5z": "hard",
    "5m_vs_6m": "hard",
    "3s_vs_5z": "hard",
    "8m_vs_9m": "hard",
    "25m": "hard",
    "10m_vs_11m": "hard",
    "27m_vs_30m": "super hard",
    "3s5z_vs_3s6z": "super hard",
    "6h_vs_8z": "super hard",
    "MMM2": "super hard",
    "corridor": "super hard",
}


def commit_id():
    """Short commit of the checkout, with -dirty when tracked files in smac_lite/ or benchmark/ (its
    reports aside) have changes."""

    def git(*a):
        return subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True
        ).stdout.strip()

    # the reports do not count: writing one rewrites their index
    dirty = git(
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "smac_lite",
        "benchmark",
        ":!benchmark/reports",
    )
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")


def report_path(kind, device, started, root=ROOT / "benchmark" / "reports"):
    """<root>/smac_lite-<kind>/smac_lite-<kind>-<device>-<date>-<time>-<commit>.md, made empty
    here (the reports' index rewritten): a name already taken, e.g. by a report of the same
    minute, gets -2, -3, ..., so no earlier report is overwritten."""
    from benchmark.report_path import new_report_path

    return new_report_path(root, f"smac_lite-{kind}", device, started)


def load_text(before, after):
    """The machine's load averages around a run (a shared machine: high load slows the timings)."""
    return (
        f"load average (1, 5, 15 min) {', '.join(f'{v:.2f}' for v in before)} "
        f"before the run and {', '.join(f'{v:.2f}' for v in after)} after"
    )


def _ci95(p, n):
    return 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--maps", nargs="+", default=list(MAPS))
    p.add_argument("--battles", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-report", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    started = datetime.now()
    rows = {}
    for m in args.maps:
        for pol in POLICIES:
            t0 = time.perf_counter()
            won, ret, length, terminated = play_battles(
                m, pol, args.battles, seed=args.seed, device=args.device
            )
            n = args.battles
            r = dict(
                win=won.float().mean().item(),
                ret=ret.mean().item(),
                ret_sd=ret.std().item(),
                len=length.float().mean().item(),
                timeout=1 - terminated.float().mean().item(),
                secs=time.perf_counter() - t0,
            )
            r["ci"] = _ci95(r["win"], n)
            rows[m, pol] = r
            print(
                f"{m:16s} {pol:10s} win {r['win']:.3f} +- {r['ci']:.3f}  return {r['ret']:6.2f} "
                f" length {r['len']:6.1f}  timeouts {r['timeout']:.3f}  ({r['secs']:.1f} s)",
                flush=True,
            )
    load_after = os.getloadavg()
    if args.no_report:
        return

    out = report_path("battles", args.device, started)
    cmd = (
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} python "
        f"benchmark/smac_lite_battles.py --battles {args.battles} --seed {args.seed}"
        + ("" if args.maps == list(MAPS) else " --maps " + " ".join(args.maps))
    )
    lines = [
        f"# smac_lite reference battles, {args.device}, "
        f"{started:%Y-%m-%d %H:%M}, commit {commit_id()}",
        "",
        f"Machine: {os.cpu_count()}-core CPU "
        f"({platform.processor() or platform.machine()}), {args.threads} torch thread(s), "
        f"torch {torch.__version__}; {load_text(load_before, load_after)} (the machine is "
        "shared; the load changes only the seconds column, not the results).",
        "",
        f"Each cell: the first episode of {args.battles} battles "
        f"(`BatchedSMAC(seed={args.seed})`, start jitter 0.5), one policy for all of them. "
        "`random`: uniform over the available actions (generator seeded with the same "
        "seed). `focus_fire`: every agent attacks the available enemy with the least hp + "
        "shields (medivacs heal the most damaged ally), an agent with no enemy in shoot "
        "range moves toward the closest one. The enemy: one attack-move order to the "
        "allies' start, then SC2 auto-targeting (keep the target while it lives and is in "
        "weapon range, else the closest ally within 9 it can hit, allies that can shoot "
        "back first); see smac_lite/README.md. Win rate with a 95% normal-approximation "
        "interval; return = SMAC's scaled return (20 for a clean win); length in agent "
        "steps; timeouts = share of battles that hit the episode limit.",
        "",
        "## Summary",
        "",
        "| map | SMAC difficulty | random win | focus_fire "
        "win | focus_fire return | focus_fire length |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for m in args.maps:
        r, f = rows[m, "random"], rows[m, "focus_fire"]
        lines.append(
            f"| {m} | {SMAC_DIFFICULTY.get(m, '')} | {r['win']:.3f} "
            f"| {f['win']:.3f} | {f['ret']:.2f} | {f['len']:.1f} |"
        )
    lines += ["", "## Per map", ""]
    for m in args.maps:
        lines += [
            f"### {m}",
            "",
            "| policy | win rate | mean return (sd) | mean length | timeouts | seconds |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for pol in POLICIES:
            r = rows[m, pol]
            lines.append(
                f"| {pol} | {r['win']:.3f} ± {r['ci']:.3f} | {r['ret']:.2f} "
                f"({r['ret_sd']:.2f}) | {r['len']:.1f} | {r['timeout']:.3f} | {r['secs']:.1f} |"
            )
        lines.append("")
    lines += [f"Command: `{cmd}`", ""]
    out.write_text("\n".join(lines))
    print("wrote", out)


if __name__ == "__main__":
    main()
