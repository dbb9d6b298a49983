"""How much does each of smac_lite's simplified rules matter on a map? Plays the first episode of
many battles of one map with the scripted focus-fire, pull-back and take-turns policies
(smac_lite.policies) and, given a run of mappo, ippo, qmix or vdn_smac_lite.py, its trained policy
(greedy, as its evaluation), first under smac_lite's rules and then with one rule changed at a time:

- `enemy drops a target out of range`: an enemy whose target steps out of its weapon range turns
  to the closest ally instead of following it while it is within sight range 9 (the map entry
  `pursue=False`; smac_lite's enemies pursue, as SC2's attack-moving units do);
- `collisions`: marines push each other apart, as SC2 units do (smac_lite turns collisions on only
  for the maps where swarms decide the battle);
- `enemy reacts every loop` / `every 8 loops`: the enemy (and a stopped agent, which fires at the
  closest enemy) re-evaluates its targets every game loop, or every 8, instead of every 4 (a
  reaction time of 0.045 s or 0.36 s instead of 0.18 s; SC2's own cadence is not documented);
- `enemy acquires in weapon range`: the enemy picks a new target only within its weapon range
  (centre distance 6), not within SMAC's sight range 9.

Writes benchmark/reports/smac_lite-rules/smac_lite-rules-<device>-<date>-<time>-<commit>.md
(never overwrites a report).

    OMP_NUM_THREADS=1 python benchmark/smac_lite_rules.py --map 5m_vs_6m \\
        [--run-dir RUN] [--battles 1000]
"""

import argparse
import contextlib
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import smac_lite.core as core  # noqa: E402
from benchmark.runs import load_script  # noqa: E402
from benchmark.smac_lite_battles import _ci95, commit_id, load_text, report_path  # noqa: E402
from smac_lite.maps import MAPS  # noqa: E402
from smac_lite.policies import play_battles  # noqa: E402

# name: (changes to the map's entry, changes to smac_lite.core's constants)
VARIANTS = {
    "smac_lite's rules": ({}, {}),
    "enemy drops a target out of range": ({"pursue": False}, {}),
    "collisions": ({"collide": True}, {}),
    "enemy reacts every loop": ({}, {"RETARGET_EVERY": 1}),
    "enemy reacts every 8 loops": ({}, {"RETARGET_EVERY": 8}),
    "enemy acquires in weapon range": ({}, {"ACQUIRE_RANGE": 6.0}),
}


@contextlib.contextmanager
def constants(**values):
    """Set smac_lite.core's module constants for the duration of the block (the simulator reads them
    at each step)."""
    old = {k: getattr(core, k) for k in values}
    for k, v in values.items():
        setattr(core, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(core, k, v)


# The scripts whose trained policy the tool plays: their greedy evaluate() and how their policy is
# built from what the run saved.
TRAINED = {
    "mappo_smac_lite.py": "MAPPO",
    "ippo_smac_lite.py": "IPPO",
    "qmix_smac_lite.py": "QMIX",
    "vdn_smac_lite.py": "VDN",
}


def trained_policy(run_dir: Path):
    """The policy of a mappo/ippo/qmix/vdn_smac_lite.py run (its checkpoint.pt, or model.pt; the
    script named by its config.json) and the script's own greedy evaluate(). Returns (map, steps,
    name, policy)."""
    config = run_dir / "config.json"
    script = json.loads(config.read_text())["script"] if config.is_file() else "mappo_smac_lite.py"
    if script not in TRAINED:
        raise ValueError(f"{run_dir} is a {script} run; give a run of {', '.join(TRAINED)}")
    module = load_script(script)
    path = (
        run_dir / "checkpoint.pt" if (run_dir / "checkpoint.pt").is_file() else run_dir / "model.pt"
    )
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    args = ckpt["args"]
    env = core.BatchedSMAC(args["env_id"], num_envs=1)
    if script in ("qmix_smac_lite.py", "vdn_smac_lite.py"):
        input_dim = ckpt["agent"]["fc1.weight"].shape[1]
        agent = module.RNNAgent(input_dim, env.n_actions, args["hidden_dim"])
    else:
        agent = module.Agent(
            env.obs_dim, env.state_dim, env.n_agents, env.n_actions, args["hidden_dim"]
        )
    agent.load_state_dict(ckpt["agent"])
    agent.eval()
    steps = ckpt.get("global_step", args["total_timesteps"])
    return (
        args["env_id"],
        steps,
        f"trained {TRAINED[script]}",
        lambda spec, battles, seed: module.evaluate(agent, spec, battles, seed),
    )


def play(spec, policy, battles, seed):
    """Win rate and mean return of the first episode of `battles` battles."""
    if isinstance(policy, str):
        won, ret, _, _ = play_battles(spec, policy, battles, seed=seed)
        return won.float().mean().item(), ret.mean().item()
    out = policy(spec, battles, seed)
    return sum(out["eval/win_rate"]) / battles, sum(out["eval/episodic_return_team"]) / battles


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--map",
        default="5m_vs_6m",
        help="a smac_lite map (the run's own map when --run-dir is given)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        help="a mappo/ippo/qmix/vdn_smac_lite.py run directory: also play its trained policy",
    )
    p.add_argument("--battles", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-dir", type=Path, default=ROOT / "benchmark" / "reports")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    policies = {name: name for name in ("focus_fire", "pull_back", "take_turns")}
    map_name, note = args.map, ""
    if map_name not in MAPS:
        p.error(f"unknown map {map_name!r}; smac_lite's maps: {', '.join(MAPS)}")
    if args.run_dir and not any(
        (args.run_dir / f).is_file() for f in ("checkpoint.pt", "model.pt")
    ):
        p.error(f"{args.run_dir} holds no checkpoint.pt or model.pt of a smac_lite run")
    if args.run_dir:
        try:
            map_name, steps, name, policies[name] = trained_policy(args.run_dir)
        except ValueError as e:
            p.error(str(e))
        note = f" `{name}`: the greedy policy of `{args.run_dir.name}` after {steps:,} steps."
    load_before, started = os.getloadavg(), datetime.now()
    rows = {}
    for name, (map_changes, consts) in VARIANTS.items():
        spec = {**MAPS[map_name], **map_changes}
        for pol_name, policy in policies.items():
            t0 = time.perf_counter()
            with constants(**consts):
                rows[name, pol_name] = play(spec, policy, args.battles, args.seed)
            win, ret = rows[name, pol_name]
            print(
                f"{name:32s} {pol_name:14s} win {win:.3f} +- {_ci95(win, args.battles):.3f} "
                f" return {ret:6.2f}  ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    out = report_path("rules", "cpu", started, args.report_dir)
    cmd = (
        "OMP_NUM_THREADS=1 python benchmark/smac_lite_rules.py "
        f"--map {map_name} --battles {args.battles} "
        f"--seed {args.seed}" + (f" --run-dir {args.run_dir}" if args.run_dir else "")
    )
    lines = [
        f"# smac_lite rules on {map_name}, {started:%Y-%m-%d %H:%M}, commit {commit_id()}",
        "",
        f"The first episode of {args.battles} battles (`BatchedSMAC(seed={args.seed})`) per "
        "cell, under smac_lite's rules and with one rule changed at a time "
        "(benchmark/smac_lite_rules.py says what each change is). `focus_fire`: every agent "
        "shoots the enemy with the least hp; `pull_back`: the same, except that an agent "
        "below half its hp that an enemy is aiming at steps back; `take_turns`: the same as "
        "`focus_fire`, except that an agent an enemy is aiming at steps out of its reach, just "
        "after a shot, when its hp + shields are 60 below a partner's, so that the agents "
        f"take turns drawing the fire (smac_lite.policies).{note} "
        "Win rate with a 95% normal-approximation interval, and the mean scaled return (20 "
        f"for a clean win). One CPU thread; {load_text(load_before, os.getloadavg())}.",
        "",
        "| rules | " + " | ".join(f"{p} win | {p} return" for p in policies) + " |",
        "|---|" + "---:|---:|" * len(policies),
    ]
    for name in VARIANTS:
        cells = [
            f"{rows[name, p][0]:.3f} ± "
            f"{_ci95(rows[name, p][0], args.battles):.3f} | {rows[name, p][1]:.2f}"
            for p in policies
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Command: `{cmd}`", ""]
    out.write_text("\n".join(lines))
    print("wrote", out)


if __name__ == "__main__":
    main()
