"""smac_lite raw speed: random-policy joint steps per second (one joint step = one step of one
battle, with observations, state, masks, rewards and auto-reset), for several maps and battle
counts, on one CPU thread (and CUDA if available). Writes
benchmark/reports/smac_lite-speed/smac_lite-speed-<device>-<date>-<time>-<commit>.md, with the
machine's load average (the machine may be shared: a high load makes the numbers low).

    OMP_NUM_THREADS=1 python benchmark/smac_lite_speed.py [--maps 3m 2s3z] \\
        [--envs 1 64 1024 4096] [--repeats 5] [--compare-pursue]

--compare-pursue measures every cell twice, under the default rules (enemies pursue a target that
left their range) and with pursue=False (the former rule: they turn to the closest ally), the two
alternating repeat by repeat so that the machine's load falls on both alike, and reports the ratio.
"""

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import smac_lite  # noqa: E402
from benchmark.smac_lite_battles import load_text, report_path  # noqa: E402
from smac_lite.policies import random_policy  # noqa: E402

ANCHORS = (
    "Anchors measured on this 2-core machine, 2026-11: Python "
    "SMAClite 50-105 env steps/s; JaxMARL SMAX (JAX, CPU, 2 cores) "
    "~42k joint steps/s on 3m and ~19k on 2s3z with 64-512 battles."
)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(map_name, num_envs, device, steps, repeats, warmup=20, pursue=True):
    env = smac_lite.BatchedSMAC(map_name, num_envs=num_envs, device=device, seed=0)
    env.pursue = pursue  # what a map entry's pursue=False sets (read at every step)
    gen = torch.Generator(device=device).manual_seed(0)
    _, _, avail = env.reset()

    def run(n):
        nonlocal avail
        for _ in range(n):
            _, _, avail, _, _, _ = env.step(random_policy(env, avail, gen))

    run(warmup)
    _sync(device)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        _sync(device)
        rates.append(steps * num_envs / (time.perf_counter() - t0))
    return statistics.median(rates), min(rates), max(rates)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--maps", nargs="+", default=["3m", "2s3z"])
    p.add_argument("--envs", nargs="+", type=int, default=[1, 64, 1024, 4096])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--device", default=None, help="cpu, cuda or both (default: cpu, plus cuda if available)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-report", action="store_true")
    p.add_argument(
        "--compare-pursue",
        action="store_true",
        help="each cell under the default rules and with pursue=False, and their ratio",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    devices = (
        [args.device]
        if args.device
        else (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    )
    started = datetime.now()

    for dev_name in devices:
        device = torch.device(dev_name)
        rows = []
        load_before = os.getloadavg()
        for m in args.maps:
            for n in args.envs:
                # About 0.3-1 s per repeat: fewer steps for many battles, more for few.
                steps = max(20, min(400, int(200_000 / (n * 8)) + 20))
                if args.compare_pursue:  # the two rules alternate, one repeat each at a time
                    rates = {True: [], False: []}
                    for _ in range(args.repeats):
                        for pursue in (True, False):
                            rates[pursue].append(measure(m, n, device, steps, 1, pursue=pursue)[0])
                    ratios = [a / b for a, b in zip(rates[True], rates[False])]
                    on, off = statistics.median(rates[True]), statistics.median(rates[False])
                    rows.append(
                        (m, n, on, off, statistics.median(ratios), min(ratios), max(ratios))
                    )
                    print(
                        f"{dev_name} {m:6s} {n:5d} battles: pursue {on:10.0f}, pursue=False "
                        f"{off:10.0f} joint steps/s, ratio {rows[-1][4]:.3f}",
                        flush=True,
                    )
                    continue
                med, lo, hi = measure(m, n, device, steps, args.repeats)
                rows.append((m, n, med, lo, hi))
                print(
                    f"{dev_name} {m:6s} {n:5d} battles: median {med:10.0f} "
                    f"joint steps/s (min {lo:.0f}, max {hi:.0f})",
                    flush=True,
                )
        load_after = os.getloadavg()
        if args.no_report:
            continue
        if device.type == "cuda":
            machine = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
        else:
            machine = (
                f"{os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}), "
                f"{args.threads} torch thread(s), "
                f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, torch {torch.__version__}"
            )
        lines = [
            f"# smac_lite speed, {dev_name}, {started:%Y-%m-%d %H:%M}",
            "",
            f"Machine: {machine}; {load_text(load_before, load_after)}. Each cell is the "
            f"median of {args.repeats} timed repeats after a warm-up (min and max in brackets).",
            "",
            "Random policy (uniform over available actions, sampled on the device). One joint "
            "step = one agent step (8 game loops) of one battle, including observations, state, "
            "available-action masks, rewards and auto-reset. Full semantics: shields and their "
            "regeneration, armour, bonus damage, medivac healing, air targeting, SC2-like enemy "
            "targeting (area damage and collisions exist only on maps that use them).",
            "",
        ]
        if args.compare_pursue:
            lines += [
                "Rules: the default (enemies pursue a target that left their weapon range) against "
                "pursue=False (they turn to the closest ally), each repeat of one alternating with "
                "one of the other; the ratio is default / pursue=False, its median over the "
                "repeats (min and max in brackets).",
                "",
                "| map | battles | joint steps/s, default | pursue=False | ratio | min | max |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {m} | {n} | {on:,.0f} | {off:,.0f} | {r:.3f} | {lo:.3f} | {hi:.3f} |"
                for m, n, on, off, r, lo, hi in rows
            ]
        else:
            lines += [
                "| map | battles | joint steps/s (median) | min | max |",
                "|---|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {m} | {n} | {med:,.0f} | {lo:,.0f} | {hi:,.0f} |" for m, n, med, lo, hi in rows
            ]
        lines += [
            "",
            ANCHORS,
            "",
            "Goal (issue 3): >= 120k on 3m and >= 60k on 2s3z with 1024 battles on one core.",
            "",
            f"Command: `OMP_NUM_THREADS={args.threads} python "
            f"benchmark/smac_lite_speed.py --maps {' '.join(args.maps)} "
            f"--envs {' '.join(map(str, args.envs))} --repeats {args.repeats}"
            + (" --compare-pursue`" if args.compare_pursue else "`"),
            "",
        ]
        out = report_path("speed", dev_name, started)
        out.write_text("\n".join(lines))
        print("wrote", out)


if __name__ == "__main__":
    main()
