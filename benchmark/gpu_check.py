"""The short GPU check: the questions a GPU user asks first, answered in about 9 minutes on one
H100.

    bash benchmark/gpu.sh             # on a GPU machine: installs what is missing, then runs this
    bash benchmark/gpu.sh --dry-run   # every step on the CPU with tiny budgets: checks the plumbing
    (a test runs it)
    python benchmark/gpu_check.py [--dry-run] [--report-dir DIR]  # the check alone, no installs

1. Steps/s of one script per family (classic, continuous, Atari, smac_lite, MPE) on the GPU, default
   hyperparameters, no evaluation: the steady rate over the second half of a run cut off after
   `--seconds` of training (the rows of metrics.csv carry wall-clock times), and the seconds to the
   first logged step (start-up, compilation). The Atari scripts again with --compile (they are the
   scripts that offer it).
2. smac_lite's raw speed: joint steps/s of 1024, 4096 and 8192 random battles of 3m on the GPU.
3. MAPPO's time to a greedy win rate of 0.9 on smac_lite 3m (defaults, 64 evaluation battles every
   10k steps):
   training seconds to the first evaluation at or above 0.9, or where it stood when its time ran
   out.
4. A short Atari curve: ppo_atari_envpool.py on Pong for as many steps as fit in its time (training
   episodes' returns by step: Pong needs millions of steps, so this shows speed and the start of
   the curve).
5. grpo_lm.py on a randomly initialised model of Qwen2-0.5B's shape (built from its config, nothing
   downloaded; bf16 mixed precision on the GPU): prompts/s, generation and update tokens/s.
6. Stable-Baselines3's PPO and SAC beside ppo.py and sac_continuous.py on the same GPU with the
   same hyperparameters and envs: steps/s of each and their ratio, from this one check.

--steps 1 2 3 picks steps (default: all). On one H100 all six take about 11 minutes: in two calls
of under 10 minutes, --steps 1 2 3 and --steps 4 5 6.

Writes <report-dir>/gpu-check/gpu-check-<device>-<date>-<HHMM>-<commit>.md naming the device, torch
version and each step's budget; a step that fails or runs out of time says so in the report, and the
other steps still run. The report is rewritten after every step, so a check stopped from outside
keeps the steps it finished.
"""

import argparse
import datetime
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmark.report_path import new_report_path  # noqa: E402
from benchmark.runs import ROOT, git_commit, read_rows, run_env, script_command, start_script  # noqa: E402

REPORTS = ROOT / "benchmark" / "reports"

# (script, flags, with --compile too): default hyperparameters, learning from the first thousand
# steps
SPEED = [
    ("ppo.py", ["--env-id", "CartPole-v1"], False),
    ("sac_continuous.py", ["--env-id", "Hopper-v5", "--learning-starts", "1000"], False),
    ("dqn_atari.py", ["--env-id", "ALE/Breakout-v5", "--learning-starts", "1000"], True),
    ("ppo_atari_envpool.py", ["--env-id", "ALE/Pong-v5"], True),
    ("mappo_smac_lite.py", ["--env-id", "3m"], False),
    ("qmix_smac_lite.py", ["--env-id", "3m", "--learning-starts", "1000"], False),
    ("mappo_mpe.py", ["--env-id", "simple_spread_v3"], False),
]
BATTLES = [1024, 4096, 8192]
# seconds per step on the GPU, and on the CPU with --dry-run. On one H100 (report
# gpu-check-cuda-2026-11-27-0203-c19cfb5) the check took 529 s with MAPPO at 100 s and the curve at
# 60 s, about 11 s of it per script process for start-up; MAPPO reached 0.9 there after about 105
# training seconds: hence 125 s for MAPPO and 40 s for the curve.
SECONDS = {"speed": 15, "compile": 45, "mappo": 125, "curve": 40, "lm": 60}
DRY_SECONDS = {"speed": 1, "compile": 2, "mappo": 4, "curve": 2, "lm": 3}
# Qwen2-0.5B's shape (its config.json); the dry run's is tiny. The tokenizer is addition-v0's: the
# model samples ids the tokenizer does not have, which decode to nothing (reward 0): speed only.
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
TINY = dict(QWEN2_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
TINY.update(num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
# ours and SB3's with the same flags (step 6)
PEERS = [
    ("ppo.py", ["--env-id", "CartPole-v1"]),
    ("sac_continuous.py", ["--env-id", "Hopper-v5", "--learning-starts", "1000"]),
]


def timed_run(
    script: str, flags: list[str], seconds: float, run_dir: Path, fork: bool
) -> tuple[list[dict], str]:
    """Run algos/<script> for at most `seconds` after its first logged row (start-up not counted);
    returns its metrics rows and how it ended ("finished", "cut off after N s", or the last line of
    its error output). fork: a child of the fork server (benchmark/runs.py), for the dry run; else a
    fresh process."""
    log = run_dir.with_suffix(".log")
    with open(log, "w") as err:
        proc = (
            start_script(script, flags, run_dir, fork=True)
            if fork
            else subprocess.Popen(
                script_command(script, flags, run_dir),
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=ROOT,
                env=run_env(),
            )
        )
        start, first, how = time.time(), None, None
        while proc.poll() is None:
            time.sleep(0.2)
            if first is None and read_rows_safe(run_dir):
                first = time.time()
            if time.time() - start > seconds + 300 or (
                first is not None and time.time() - first > seconds
            ):
                proc.kill()
                how = f"cut off after {seconds} s"
                break
        text = proc.communicate()[1] if fork else (proc.wait(), log.read_text())[1]
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
    how = how or (
        "finished"
        if proc.returncode == 0
        else lines[-1][:120]
        if lines
        else f"exit {proc.returncode}"
    )
    return read_rows_safe(run_dir), how


def read_rows_safe(run_dir: Path) -> list[dict]:
    try:
        return read_rows(run_dir)
    except (OSError, ValueError, KeyError):
        return []


def steady_sps(rows: list[dict]) -> float | None:
    """Steps per second over the second half (in time) of a run's metrics rows, each stamped with
    its step and wall-clock time: the rate once start-up, the first updates and compilation are
    behind it."""
    if len(rows) < 2 or rows[-1]["wall_time"] - rows[0]["wall_time"] <= 0:
        return None
    middle = (rows[0]["wall_time"] + rows[-1]["wall_time"]) / 2
    first = next(r for r in rows if r["wall_time"] >= middle)
    seconds = rows[-1]["wall_time"] - first["wall_time"]
    return (rows[-1]["global_step"] - first["global_step"]) / seconds if seconds > 0 else None


def speed(device_flag: str, seconds: dict, out: Path, dry: bool) -> list[str]:
    lines = [
        "## 1. Steps/s per family (defaults, no evaluation)",
        "",
        f"Steps/s over the second half of {seconds['speed']} s of training "
        f"({seconds['compile']} s with --compile, whose compilation falls in the first half).",
        "",
        "| script | env | compile | steps/s | steps done | how it ended |",
        "|---|---|---|---:|---:|---|",
    ]
    for script, flags, compiles in SPEED:
        for compiled in (False, True) if compiles else (False,):
            run_dir = out / f"speed-{script[:-3]}{'-compile' if compiled else ''}"
            budget = seconds["compile" if compiled else "speed"]
            rows, how = timed_run(
                script,
                flags
                + ["--total-timesteps", "100000000", "--eval-episodes", "0", device_flag]
                + (["--compile"] if compiled else []),
                budget,
                run_dir,
                fork=dry,
            )
            sps, done = steady_sps(rows), max((r["global_step"] for r in rows), default=0)
            lines.append(
                f"| {script} | {flags[1]} | {'yes' if compiled else 'no'} | "
                f"{'–' if sps is None else f'{sps:,.0f}'} | {done:,} | {how} |"
            )
            print(lines[-1], flush=True)
    return lines + [""]


def battles(device: str, dry: bool) -> list[str]:
    from benchmark.smac_lite_speed import measure

    lines = [
        "## 2. smac_lite joint steps/s (3m, random policy)",
        "",
        "| battles | joint steps/s (median of 3) |",
        "|---:|---:|",
    ]
    for n in [16, 32] if dry else BATTLES:
        try:
            med, _, _ = measure(
                "3m", n, torch.device(device), steps=10 if dry else 50, repeats=3, warmup=5
            )
            lines.append(f"| {n} | {med:,.0f} |")
        except Exception as e:  # e.g. out of memory: say so, go on
            lines.append(f"| {n} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} |")
        print(lines[-1], flush=True)
    return lines + [""]


def mappo(device_flag: str, seconds: dict, out: Path, dry: bool) -> list[str]:
    every = 256 if dry else 10_000
    flags = [
        "--env-id",
        "3m",
        "--total-timesteps",
        "100000000",
        "--eval-every",
        str(every),
        "--eval-episodes",
        "4" if dry else "64",
        device_flag,
    ] + (["--num-envs", "4", "--num-steps", "32"] if dry else [])
    rows, how = timed_run("mappo_smac_lite.py", flags, seconds["mappo"], out / "mappo-3m", fork=dry)
    evals = {}
    for r in rows:
        if r["name"] == "eval/win_rate":
            evals.setdefault(r["global_step"], []).append(r["value"])
    train_s = {r["global_step"]: r["value"] for r in rows if r["name"] == "charts/train_seconds"}
    curve = [(s, float(np.mean(v)), train_s.get(s)) for s, v in sorted(evals.items())]
    hit = next(((s, w, t) for s, w, t in curve if w >= 0.9), None)
    lines = [
        "## 3. MAPPO on smac_lite 3m: time to a greedy win rate of 0.9",
        "",
        f"Defaults, {'4' if dry else '64'} evaluation battles every "
        f"{every:,} steps, at most {seconds['mappo']} s of training ({how}). ",
    ]
    if hit:
        lines[-1] += (
            f"**0.9 reached at step {hit[0]:,} after {hit[2]:.0f} "
            f"training seconds** (win rate {hit[1]:.2f})."
        )
    elif curve:
        lines[-1] += (
            f"**0.9 not reached**: last evaluation at step {curve[-1][0]:,}, win "
            f"rate {curve[-1][1]:.2f}, best {max(w for _, w, _ in curve):.2f}."
        )
    else:
        lines[-1] += "**No evaluation was logged.**"
    lines += ["", "| step | win rate | training s |", "|---:|---:|---:|"]
    lines += [f"| {s:,} | {w:.2f} | {'–' if t is None else f'{t:.0f}'} |" for s, w, t in curve]
    return lines + [""]


def atari_curve(device_flag: str, seconds: dict, out: Path, dry: bool) -> list[str]:
    flags = [
        "--env-id",
        "ALE/Pong-v5",
        "--total-timesteps",
        "100000000",
        "--eval-episodes",
        "0",
        device_flag,
    ]
    rows, how = timed_run(
        "ppo_atari_envpool.py", flags, seconds["curve"], out / "ppo-envpool-pong", fork=dry
    )
    games = [(r["global_step"], r["value"]) for r in rows if r["name"] == "train/episodic_return"]
    done = max((r["global_step"] for r in rows), default=0)
    sps = steady_sps(rows)
    lines = [
        "## 4. ppo_atari_envpool.py on Pong (defaults), as far as it gets",
        "",
        f"{done:,} steps in at most {seconds['curve']} s of training ({how}); "
        f"steady {'–' if sps is None else f'{sps:,.0f}'} steps/s; {len(games)} "
        "games ended (Pong: -21 to 21; PPO reaches about 20 after 10M steps).",
        "",
        "| steps up to | games | mean return |",
        "|---:|---:|---:|",
    ]
    if games:
        edges = np.linspace(0, done, 6)[1:]
        lo = 0
        for hi in edges:
            chunk = [v for s, v in games if lo < s <= hi]
            lines.append(
                f"| {int(hi):,} | {len(chunk)} | {np.mean(chunk):.1f} |"
                if chunk
                else f"| {int(hi):,} | 0 | – |"
            )
            lo = hi
    return lines + [""]


def lm(device_flag: str, seconds: dict, out: Path, dry: bool) -> list[str]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmark.lm_task import make_tokenizer

    model_dir = out / "qwen2-0.5b-shape"
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        **(TINY if dry else QWEN2_05B),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    shutil.copy(ROOT / "benchmark" / "policies" / "lm-addition-base" / "task.json", model_dir)
    del model
    flags = [
        "--model",
        str(model_dir),
        "--total-timesteps",
        "100000000",
        "--eval-prompts",
        "0",
        device_flag,
    ] + (["--num-prompts", "2", "--group-size", "2"] if dry else [])
    rows, how = timed_run("grpo_lm.py", flags, seconds["lm"], out / "grpo-qwen2-shape", fork=dry)
    last = {r["name"]: r["value"] for r in rows}
    sps, done = steady_sps(rows), max((r["global_step"] for r in rows), default=0)

    def rate(name):
        return "–" if name not in last else f"{last[name]:,.0f}"

    return [
        "## 5. grpo_lm.py on a random model of Qwen2-0.5B's shape (bf16 mixed precision)",
        "",
        f"{params / 1e6:,.1f}M parameters (Qwen2-0.5B's config, randomly initialised; "
        f"addition-v0's tokenizer), grpo_lm.py's defaults (16 prompts x 8 completions of up to 5 "
        f"tokens), no evaluation, at most {seconds['lm']} s of training ({how}).",
        "",
        "| prompts done | prompts/s | sampled tokens/s (generation) | tokens/s (update) |",
        "|---:|---:|---:|---:|",
        f"| {done:,} | {'–' if sps is None else f'{sps:,.1f}'} | "
        f"{rate('charts/generation_tokens_per_s')} | {rate('charts/update_tokens_per_s')} |",
        "",
    ]


def peers(device_flag: str, seconds: dict, out: Path, dry: bool) -> list[str]:
    lines = [
        "## 6. Stable-Baselines3 beside ours on this device",
        "",
        f"Steps/s over the second half of {seconds['speed']} s of training, our script's defaults "
        "for both (SB3 through benchmark/sb3_baseline.py --same-as), no evaluation.",
        "",
        "| ours | SB3 | env | ours steps/s | SB3 steps/s | ours / SB3 |",
        "|---|---|---|---:|---:|---:|",
    ]
    for script, flags in PEERS:
        rates = []
        for name in (script, f"sb3:{script}"):
            run_dir = out / f"peer-{name.replace(':', '-')[:-3]}"
            run_flags = flags + ["--total-timesteps", "100000000", "--eval-episodes", "0"]
            rows, how = timed_run(name, run_flags + [device_flag], seconds["speed"], run_dir, dry)
            rates.append(steady_sps(rows))
        ours, sb3 = rates
        ratio = "–" if not ours or not sb3 else f"{ours / sb3:.2f}"
        lines.append(
            f"| {script} | sb3:{script} | {flags[1]} | {'–' if ours is None else f'{ours:,.0f}'}"
            f" | {'–' if sb3 is None else f'{sb3:,.0f}'} | {ratio} |"
        )
        print(lines[-1], flush=True)
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="on the CPU with tiny budgets: check that every step runs",
    )
    p.add_argument("--report-dir", type=Path, default=REPORTS)
    p.add_argument(
        "--steps",
        type=int,
        nargs="+",
        choices=range(1, 7),
        default=list(range(1, 7)),
        help="which steps to run (default: all six)",
    )
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device visible to torch; "
            "use --dry-run to check the steps on the CPU",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if args.dry_run else "cuda"
    seconds = DRY_SECONDS if args.dry_run else SECONDS
    name = "CPU dry run" if args.dry_run else torch.cuda.get_device_name(0)
    started = time.time()
    lines = [
        f"# GPU check: {name}",
        "",
        f"Device: {name}; torch {torch.__version__}; commit {git_commit()}; "
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}; command `bash "
        f"benchmark/gpu.sh{' --dry-run' if args.dry_run else ''}`."
        + (" A dry run: tiny budgets on the CPU, numbers of no meaning." if args.dry_run else ""),
        "",
    ]
    device_flag = "--no-cuda" if args.dry_run else "--cuda"
    path = new_report_path(args.report_dir, "gpu-check", device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(tmp)
        steps = [
            lambda: speed(device_flag, seconds, out, args.dry_run),
            lambda: battles(device, args.dry_run),
            lambda: mappo(device_flag, seconds, out, args.dry_run),
            lambda: atari_curve(device_flag, seconds, out, args.dry_run),
            lambda: lm(device_flag, seconds, out, args.dry_run),
            lambda: peers(device_flag, seconds, out, args.dry_run),
        ]
        for step in [steps[n - 1] for n in sorted(set(args.steps))]:
            try:
                lines += step()
            except Exception as e:  # one broken step must not cost the others' numbers
                lines += [f"A step failed: {type(e).__name__}: {e}", ""]
            path.write_text(
                "\n".join(lines + [f"(Unfinished: {time.time() - started:.0f} s so far.)"]) + "\n"
            )
    lines.append(f"The check took {time.time() - started:.0f} s.")
    path.write_text("\n".join(lines) + "\n")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
