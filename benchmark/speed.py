"""Speed of our scripts against Stable-Baselines3 on the same machine in the same run.

    python benchmark/speed.py  # every entry; writes benchmark/reports/<name>/<name>-cpu-...md
    python benchmark/speed.py --entries ppo --repeats 3 --seeds 5

Two measures per entry of ENTRIES (a later script adds one entry):
1. implementation speed: our script with its default hyperparameters and SB3's algorithm with the
   same ones
   (mapped flag by flag in the entry), no evaluation, one torch thread each, SB3 on the CPU, each in
   a fresh process, interleaved A B A B ...; SPS = environment steps / training seconds (ours: the
   final charts/train_seconds, which excludes start-up; SB3: the time spent in learn()). The ceiling
   is the raw step rate of a gymnasium SyncVectorEnv with the same number of envs taking random
   actions (envs made by gym.make, or by the script's own make_env where the entry says so: Atari
   preprocessing and frame stacks).
2. time to threshold with each side's best settings (ours: our defaults; SB3: rl-zoo's): training
   seconds,
   start-up and evaluation excluded, until a deterministic evaluation every `eval_every` steps first
   reaches `threshold` (ours: --eval-every/--eval-episodes and charts/train_seconds; SB3: a callback
   that evaluates on a separate env and subtracts its own time). Runs stop at the threshold, or at
   the budget.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmark.runs import (  # noqa: E402
    git_commit,
    load_script,
    read_rows,
    run_env,
    run_script,
    script_command,
    tail_rows,
)
from benchmark.sb3_baseline import DIFFERENCES, SAME, make_model  # noqa: E402

REPORTS = Path(__file__).resolve().parent / "reports"


@dataclass
class Entry:
    name: str
    # our script; SB3's algorithm and the hyperparameter mapping are benchmark/sb3_baseline.py's
    # SAME
    script: str
    env_id: str
    sps_steps: int  # budget of one SPS measurement (both sides)
    # flags of both sides' SPS runs and of our best settings
    ours_flags: list[str] = field(default_factory=list)
    sps_goal: float | None = None  # the goal on the median SPS ratio ours / SB3, if there is one
    # SB3's best settings (rl-zoo): (n_envs, kwargs); None: SPS only
    best_sb3: tuple[int, dict] | None = None
    sb3_budget: int = 0  # rl-zoo's budget: SB3's time-to-threshold runs stop there
    # "sb3_median": ours < SB3's median on every seed; "sb3": ours <= SB3 on every seed;
    goal: str = ""
    #                 "half_sb3_median": ours <= SB3's median / 2 on every seed
    threshold: float = 475.0
    eval_every: int = 1000
    eval_episodes: int = 5
    # the ceiling steps the script's make_env (e.g. Atari preprocessing), not gym.make
    raw_env_of_script: bool = False

    @property
    def sb3_algo(self) -> str:
        return SAME[self.script][0]

    @property
    def differences(self) -> str:
        return DIFFERENCES[self.script]


ENTRIES = [
    Entry(
        "ppo",
        "ppo.py",
        "CartPole-v1",
        sps_steps=50_000,
        best_sb3=(
            8,
            dict(
                n_steps=32,
                batch_size=256,
                gae_lambda=0.8,
                gamma=0.98,
                n_epochs=20,
                ent_coef=0.0,
                learning_rate={"linear": 1e-3},
                clip_range={"linear": 0.2},
            ),
        ),
        sb3_budget=100_000,
        goal="sb3_median",
    ),
    # dqn.py's settings for short budgets (its defaults: 500k)
    Entry(
        "dqn",
        "dqn.py",
        "CartPole-v1",
        sps_steps=30_000,
        ours_flags=["--learning-rate", "2.3e-3", "--total-timesteps", "100000"],
        best_sb3=(
            1,
            dict(
                learning_rate=2.3e-3,
                batch_size=64,
                buffer_size=100_000,
                learning_starts=1000,
                gamma=0.99,
                target_update_interval=10,
                train_freq=256,
                gradient_steps=128,
                exploration_fraction=0.16,
                exploration_final_eps=0.04,
                policy_kwargs={"net_arch": [256, 256]},
            ),
        ),
        sb3_budget=50_000,
        goal="sb3_median",
    ),
    # the continuous scripts: SPS only (the goals on the ratio), learning from step 1000 so
    # that the measurement is the update, not the random warm-up
    Entry("ppo_continuous", "ppo_continuous.py", "Hopper-v5", sps_steps=20_480),
    Entry(
        "sac",
        "sac_continuous.py",
        "Pendulum-v1",
        sps_steps=3_000,
        ours_flags=["--learning-starts", "1000"],
        sps_goal=1.5,
    ),
    Entry(
        "td3",
        "td3_continuous.py",
        "Pendulum-v1",
        sps_steps=4_000,
        ours_flags=["--learning-starts", "1000"],
        sps_goal=1.3,
    ),
    Entry(
        "ddpg",
        "ddpg_continuous.py",
        "Pendulum-v1",
        sps_steps=4_000,
        ours_flags=["--learning-starts", "1000"],
        sps_goal=1.3,
    ),
    # Atari: SPS only; the ceiling is the preprocessed env the script trains on (AtariWrapper,
    # 4-frame stacks)
    Entry("ppo_atari", "ppo_atari.py", "ALE/Breakout-v5", sps_steps=20_480, raw_env_of_script=True),
    # learning from step 2000 with a buffer of the run's size, so that the measurement is mostly the
    # update
    Entry(
        "dqn_atari",
        "dqn_atari.py",
        "ALE/Breakout-v5",
        sps_steps=10_000,
        raw_env_of_script=True,
        ours_flags=["--learning-starts", "2000", "--buffer-size", "10000"],
    ),
]


# ---- SB3 side: runs in its own process -----------------------------------------------------------


def sb3_worker(job: dict) -> dict:
    """Train SB3 as `job` says; with job["threshold"], stop when the deterministic evaluation
    reaches it."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(1)

    class EvalUntil(BaseCallback):
        """Deterministic evaluation every `every` steps on a separate env; its time is not training
        time."""

        def __init__(self):
            super().__init__()
            self.next_eval, self.eval_seconds, self.history, self.reached = (
                job["eval_every"],
                0.0,
                [],
                None,
            )
            self.env = Monitor(gym.make(job["env_id"]))
            self.env.reset(seed=job["seed"] + 100_000)

        def _on_training_start(self):
            self.t0 = time.perf_counter()

        def _on_step(self):
            if self.num_timesteps < self.next_eval:
                return True
            while self.next_eval <= self.num_timesteps:
                self.next_eval += job["eval_every"]
            t = time.perf_counter()
            train_seconds = t - self.t0 - self.eval_seconds
            mean, _ = evaluate_policy(
                self.model, self.env, n_eval_episodes=job["eval_episodes"], deterministic=True
            )
            self.eval_seconds += time.perf_counter() - t
            self.history.append((self.num_timesteps, train_seconds, float(mean)))
            if mean >= job["threshold"]:
                self.reached = (self.num_timesteps, train_seconds)
                return False
            return True

    model = make_model(job["algo"], job["env_id"], job["n_envs"], job["kwargs"], job["seed"])
    callback = EvalUntil() if job.get("threshold") is not None else None
    start = time.perf_counter()
    model.learn(total_timesteps=job["steps"], callback=callback)
    seconds = time.perf_counter() - start - (callback.eval_seconds if callback else 0.0)
    result = {
        "steps": int(model.num_timesteps),
        "seconds": seconds,
        "sps": model.num_timesteps / seconds,
    }
    if callback:
        result.update(reached=callback.reached, history=callback.history)
    return result


def run_sb3(job: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--sb3-worker", json.dumps(job)],
        capture_output=True,
        text=True,
        env=run_env(),
        cwd=ROOT,
    )
    if out.returncode:
        raise RuntimeError(f"SB3 worker failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- our side ------------------------------------------------------------------------------------


def ours_sps(entry: Entry, seed: int, workdir: Path) -> dict:
    run_dir = workdir / f"{entry.name}-sps-{seed}"
    out = run_script(
        entry.script,
        [
            *entry.ours_flags,
            "--env-id",
            entry.env_id,
            "--seed",
            str(seed),
            "--total-timesteps",
            str(entry.sps_steps),
            "--eval-episodes",
            "0",
            # the measured budget wins over ours_flags'
            "--checkpoint-every",
            "1000000000",
        ],
        run_dir,
    )
    if out.returncode:
        raise RuntimeError(f"{entry.script} failed: {out.stderr[-2000:]}")
    rows = read_rows(run_dir)
    steps = max(r["global_step"] for r in rows)
    seconds = [r["value"] for r in rows if r["name"] == "charts/train_seconds"][-1]
    return {"steps": steps, "seconds": seconds, "sps": steps / seconds}


def _first_reach(rows, threshold, episodes):
    """(step, train_seconds) of the first evaluation whose mean over `episodes` episodes is >=
    threshold."""
    evals, train_s = {}, {}
    for r in rows:
        if r["name"] == "eval/episodic_return":
            evals.setdefault(r["global_step"], []).append(r["value"])
        elif r["name"] == "charts/train_seconds":
            train_s[r["global_step"]] = r["value"]
    for step, values in sorted(evals.items()):
        if (
            len(values) >= episodes
            and sum(values[:episodes]) / episodes >= threshold
            and step in train_s
        ):
            return step, train_s[step]
    return None


def ours_time_to_threshold(entry: Entry, seed: int, workdir: Path) -> dict:
    """Run our script with evaluation every eval_every steps; stop it as soon as an evaluation
    reaches the threshold (the training seconds there are charts/train_seconds, logged just before
    that evaluation)."""
    run_dir = workdir / f"{entry.name}-ttt-{seed}"
    flags = [
        "--env-id",
        entry.env_id,
        "--seed",
        str(seed),
        "--eval-every",
        str(entry.eval_every),
        "--eval-episodes",
        str(entry.eval_episodes),
        "--checkpoint-every",
        "1000000000",
        *entry.ours_flags,
    ]
    proc = subprocess.Popen(
        script_command(entry.script, flags, run_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=run_env(),
        cwd=ROOT,
    )
    reached, rows, offset = None, [], 0
    while reached is None:
        finished = proc.poll() is not None
        offset = tail_rows(run_dir / "metrics.csv", offset, rows)
        reached = _first_reach(rows, entry.threshold, entry.eval_episodes)
        if finished:
            break
        time.sleep(0.25)
    if proc.poll() is None:
        proc.terminate()
        proc.wait()
    elif proc.returncode and reached is None:
        raise RuntimeError(f"{entry.script} exited with {proc.returncode}")
    rows = read_rows(run_dir)
    evals = {}
    for r in rows:
        if r["name"] == "eval/episodic_return":
            evals.setdefault(r["global_step"], []).append(r["value"])
    return {
        "reached": reached,
        "last_step": max(r["global_step"] for r in rows),
        "best_eval": max((sum(v) / len(v) for v in evals.values()), default=None),
    }


def raw_env_sps(
    env_id: str, num_envs: int, seconds: float = 3.0, script: str | None = None
) -> float:
    """Random actions in a gymnasium SyncVectorEnv (same-step autoreset, as our scripts): the
    ceiling. The envs are gym.make(env_id), or with `script` that script's make_env(env_id) (e.g.
    its Atari preprocessing)."""
    import gymnasium as gym
    import numpy as np

    make = (lambda: load_script(script).make_env(env_id)) if script else lambda: gym.make(env_id)
    envs = gym.vector.SyncVectorEnv(
        [make for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=0)
    envs.single_action_space.seed(0)
    actions = [
        np.stack([envs.single_action_space.sample() for _ in range(num_envs)]) for _ in range(1000)
    ]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in actions:
            envs.step(a)
        steps += len(actions) * num_envs
    sps = steps / (time.perf_counter() - start)
    envs.close()
    return sps


# ---- the measurement and its report --------------------------------------------------------------


def _mmm(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), statistics.median(xs), max(xs)) if xs else (None, None, None)


def measure(entry: Entry, repeats: int, seeds: list[int], workdir: Path, log=print) -> dict:
    args = load_script(entry.script).Args()  # read at run time: the defaults may change
    # e.g. --learning-starts 1000
    for flag, value in zip(entry.ours_flags[::2], entry.ours_flags[1::2]):
        name = flag.removeprefix("--").replace("-", "_")
        setattr(args, name, type(getattr(args, name))(value))
    n_envs, same = SAME[entry.script][1](args)
    res = {
        "entry": entry.name,
        "script": entry.script,
        "env_id": entry.env_id,
        "sb3_algo": entry.sb3_algo,
        "ours_defaults": {k: v for k, v in vars(args).items()},
        "sb3_same": {"n_envs": n_envs, **same},
        "sb3_best": {"n_envs": entry.best_sb3[0], **entry.best_sb3[1]} if entry.best_sb3 else None,
        "sps": [],
        "ttt": [],
    }
    res["raw_env_sps"] = raw_env_sps(
        entry.env_id, n_envs, script=entry.script if entry.raw_env_of_script else None
    )
    log(f"[{entry.name}] raw env: {res['raw_env_sps']:.0f} steps/s with {n_envs} envs")
    for r in range(repeats):  # A B A B ...
        ours = ours_sps(entry, r + 1, workdir)
        sb3 = run_sb3(
            {
                "algo": entry.sb3_algo,
                "env_id": entry.env_id,
                "n_envs": n_envs,
                "kwargs": same,
                "seed": r + 1,
                "steps": entry.sps_steps,
            }
        )
        res["sps"].append({"ours": ours, "sb3": sb3})
        log(f"[{entry.name}] SPS repeat {r + 1}: ours {ours['sps']:.0f}, SB3 {sb3['sps']:.0f}")
    for seed in seeds if entry.best_sb3 else []:
        ours = ours_time_to_threshold(entry, seed, workdir)
        sb3 = run_sb3(
            {
                "algo": entry.sb3_algo,
                "env_id": entry.env_id,
                "n_envs": entry.best_sb3[0],
                "kwargs": entry.best_sb3[1],
                "seed": seed,
                "steps": entry.sb3_budget,
                "threshold": entry.threshold,
                "eval_every": entry.eval_every,
                "eval_episodes": entry.eval_episodes,
            }
        )
        res["ttt"].append(
            {"seed": seed, "ours": ours, "sb3": {k: v for k, v in sb3.items() if k != "history"}}
        )
        log(f"[{entry.name}] threshold seed {seed}: ours {ours['reached']}, SB3 {sb3['reached']}")
    return res


def _f(x, fmt="{:.0f}"):
    return "–" if x is None else fmt.format(x)


def _reach_cell(reached, budget_note):
    return (
        f"{reached[1]:.1f} s ({reached[0]:,} steps)" if reached else f"not reached ({budget_note})"
    )


def render(
    results: list[dict],
    date: str,
    repeats: int,
    seeds: int,
    load=(float("nan"),) * 2,
    command: str = "python benchmark/speed.py",
) -> str:
    import gymnasium
    import stable_baselines3
    import torch

    lines = [
        f"# Speed: our scripts against Stable-Baselines3, CPU, {date}",
        "",
        f"Regenerate with `{command}` (one command; about 10-20 minutes with the defaults).",
        "",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPU cores **shared with "
        "other work that may have been running during the measurement** (two other "
        "engineers use the same 2 cores), so absolute numbers are noisy; our runs "
        "and SB3's are interleaved (A B A B ...) so that both see the same load.",
        f"- code: commit {git_commit()}",
        "- load average (1 min) at the start and end of "
        f"the measurement: {load[0]:.2f}, {load[1]:.2f}",
        f"- versions: torch {torch.__version__}, stable-baselines3 "
        f"{stable_baselines3.__version__}, gymnasium {gymnasium.__version__}, Python "
        f"{platform.python_version()}; one torch thread on each side (OMP_NUM_THREADS=1, "
        "torch.set_num_threads(1)); each run in a fresh process; SB3 on the CPU.",
        "",
        "## Summary",
        "",
        *_summary(results),
        "",
        "## 1. Implementation speed (same hyperparameters, no evaluation)",
        "",
        "SPS = environment steps / training seconds (ours: final `charts/train_seconds`, "
        f"start-up excluded; SB3: time inside `learn()`). {repeats} repeats each side, "
        "min / median / max. Ratio = ours / SB3 per repeat; a goal on it only where an "
        "issue set one (the scripts keep the readable shape, whatever that costs). Ours "
        "and SB3 get the same flags (`flags`: both sides). Ceiling: random actions in a "
        "gymnasium SyncVectorEnv with the same number of envs.",
        "",
        "| entry | env | steps | flags | ours SPS | SB3 "
        "SPS | ratio ours/SB3 | raw env SPS (ceiling) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ours = _mmm([x["ours"]["sps"] for x in r["sps"]])
        sb3 = _mmm([x["sb3"]["sps"] for x in r["sps"]])
        ratio = _mmm([x["ours"]["sps"] / x["sb3"]["sps"] for x in r["sps"]])
        steps = r["sps"][0]["ours"]["steps"]
        flags = " ".join(next(e for e in ENTRIES if e.name == r["entry"]).ours_flags) or "defaults"
        lines.append(
            f"| {r['script']} vs SB3 {r['sb3_algo']} | {r['env_id']} | {steps:,} | {flags} | "
            + " | ".join("{} / {} / {}".format(*(_f(v) for v in t)) for t in (ours, sb3))
            + " | "
            + "{} / {} / {}".format(*(_f(v, "{:.2f}x") for v in ratio))
            + " | "
            f"{r['raw_env_sps']:,.0f} |"
        )
    lines += [
        "",
        "Hyperparameters mapped flag by flag from our "
        "script's defaults (read from its `Args` at run time):",
        "",
    ]
    for r, e in zip(results, [next(e for e in ENTRIES if e.name == r["entry"]) for r in results]):
        lines.append(
            f"- {r['script']} -> SB3 {r['sb3_algo']}: "
            f"`{json.dumps(r['sb3_same'])}`; differences: {e.differences}"
        )
    lines += ["", "## 2. Time to threshold (each side's best settings)", ""]
    for r in results:
        e = next(e for e in ENTRIES if e.name == r["entry"])
        if not r["ttt"]:
            continue
        lines += [
            f"### {r['script']} vs SB3 {r['sb3_algo']} on {r['env_id']}",
            "",
            "Training seconds (start-up and evaluation excluded) until a "
            f"{e.eval_episodes}-episode deterministic evaluation, every "
            f"{e.eval_every:,} steps, first reaches {e.threshold:g}. Ours: "
            + (f"defaults with `{' '.join(e.ours_flags)}`" if e.ours_flags else "defaults")
            + f" (`{r['ours_defaults']['total_timesteps']:,}` steps at most); SB3: rl-zoo settings "
            f"`{json.dumps(r['sb3_best'])}`, {e.sb3_budget:,} steps at most.",
            "",
            "| seed | ours | SB3 | ours / SB3 |",
            "|---|---|---|---|",
        ]
        ours_t, sb3_t = [], []
        for t in r["ttt"]:
            o, s = t["ours"]["reached"], t["sb3"]["reached"]
            ours_t.append(o[1] if o else None)
            sb3_t.append(s[1] if s else None)
            ratio = f"{o[1] / s[1]:.2f}" if o and s else "–"
            miss = (
                f"{t['ours']['last_step']:,} steps, best evaluation "
                f"mean {_f(t['ours']['best_eval'], '{:.1f}')}"
            )
            lines.append(
                f"| {t['seed']} | {_reach_cell(o, miss)} | "
                f"{_reach_cell(s, f'{e.sb3_budget:,} steps')} | {ratio} |"
            )
        om, sm = _mmm(ours_t), _mmm(sb3_t)
        lines += [
            "",
            f"Ours min / median / max: {_f(om[0], '{:.1f}')} / {_f(om[1], '{:.1f}')} / "
            f"{_f(om[2], '{:.1f}')} s "
            f"({sum(x is not None for x in ours_t)}/{len(ours_t)} seeds reached); SB3: "
            f"{_f(sm[0], '{:.1f}')} / {_f(sm[1], '{:.1f}')} / {_f(sm[2], '{:.1f}')} s "
            f"({sum(x is not None for x in sb3_t)}/{len(sb3_t)} seeds reached).",
        ]
        lines.append("")
        lines.append("Goal: " + _goal_verdict(e.goal, ours_t, sb3_t, [t["seed"] for t in r["ttt"]]))
        lines.append("")
    return "\n".join(lines) + "\n"


def _summary(results: list[dict]) -> list[str]:
    out = []
    for r in results:
        e = next(e for e in ENTRIES if e.name == r["entry"])
        ratio = _mmm([x["ours"]["sps"] / x["sb3"]["sps"] for x in r["sps"]])
        ours_t = [t["ours"]["reached"][1] if t["ours"]["reached"] else None for t in r["ttt"]]
        seeds = [t["seed"] for t in r["ttt"]]
        sb3_t = [t["sb3"]["reached"][1] if t["sb3"]["reached"] else None for t in r["ttt"]]
        om, sm = _mmm(ours_t), _mmm(sb3_t)
        line = (
            f"- **{r['script']} vs SB3 {r['sb3_algo']}** on {r['env_id']}: SPS ratio "
            f"ours/SB3 median {ratio[1]:.2f}x (min {ratio[0]:.2f}x, max {ratio[2]:.2f}x)"
        )
        if e.sps_goal:
            line += (
                f"; goal >= {e.sps_goal:g}x: **"
                + ("met" if ratio[1] >= e.sps_goal else "missed")
                + "**"
            )
        if not r["ttt"]:
            out.append(line + ".")
            continue
        out.append(
            line + ". Time to "
            f"{e.threshold:g}: ours median {_f(om[1], '{:.1f}')} s "
            f"({sum(x is not None for x in ours_t)}/{len(ours_t)} seeds reached), SB3 median "
            f"{_f(sm[1], '{:.1f}')} s ({sum(x is not None for x in sb3_t)}/{len(sb3_t)}). "
            f"Goal: {_goal_verdict(e.goal, ours_t, sb3_t, seeds)}"
        )
    return out


def _goal_verdict(goal: str, ours_t: list, sb3_t: list, seeds: list[int] | None = None) -> str:
    inf = float("inf")
    o = [x if x is not None else inf for x in ours_t]
    s = [x if x is not None else inf for x in sb3_t]
    if goal == "sb3":
        targets, text = s, "ours <= SB3 on every seed: "
    elif goal == "sb3_median":
        target = statistics.median(s)
        targets, text = [target] * len(o), f"ours < SB3's median ({target:.1f} s) on every seed: "
    else:
        target = statistics.median(s) / 2
        targets, text = (
            [target] * len(o),
            f"ours <= half of SB3's median ({target:.1f} s) on every seed: ",
        )
    seeds = seeds or list(range(1, len(o) + 1))
    bad = [
        i for i, (a, b) in enumerate(zip(o, targets)) if a > b or (goal == "sb3_median" and a == b)
    ]
    if not bad:
        return text + "**met**."
    why = [
        f"seed {seeds[i]} "
        + (
            "never reached the threshold"
            if o[i] == inf
            else f"{o[i]:.1f} s against {targets[i]:.1f} s ({o[i] / targets[i]:.2f}x)"
        )
        for i in bad
    ]
    return text + f"**missed** on {len(bad)} of {len(o)} seeds: " + "; ".join(why) + "."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--entries", nargs="*", default=[e.name for e in ENTRIES], help="entries to measure"
    )
    p.add_argument("--repeats", type=int, default=3, help="SPS measurements per side")
    p.add_argument("--seeds", type=int, default=5, help="time-to-threshold seeds per side")
    p.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="time-to-threshold seeds are first-seed, first-seed+1, ...",
    )
    p.add_argument("--report-dir", type=Path, default=REPORTS)
    p.add_argument(
        "--name",
        default="speed",
        help="the report is <report-dir>/<name>-cpu-<date>-<HHMM>-<commit>.md "
        "(and .json; benchmark/report_path.py)",
    )
    p.add_argument("--sb3-worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.sb3_worker:
        print(json.dumps(sb3_worker(json.loads(a.sb3_worker))))
        return 0
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    unknown = set(a.entries) - {e.name for e in ENTRIES}
    if unknown:
        p.error(f"unknown entries {sorted(unknown)}; known: {[e.name for e in ENTRIES]}")
    date = datetime.date.today().isoformat()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="speed-") as tmp:
        seeds = list(range(a.first_seed, a.first_seed + a.seeds))
        results = [
            measure(
                e, a.repeats, seeds, Path(tmp), log=lambda m: print(m, file=sys.stderr, flush=True)
            )
            for e in ENTRIES
            if e.name in a.entries
        ]
    # one naming for every report, never overwriting
    from benchmark.report_path import new_report_path

    path = new_report_path(a.report_dir, a.name, "cpu")
    path.with_suffix(".json").write_text(json.dumps(results, indent=1))
    command = " ".join(
        ["python benchmark/speed.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )
    path.write_text(
        render(results, date, a.repeats, a.seeds, (load_start, os.getloadavg()[0]), command)
    )
    print(f"report: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
