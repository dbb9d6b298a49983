"""The `imitation` library's GAIL (1.0.1) with algos/gail.py's hyperparameters, on the same Minari
demonstrations, run the way our scripts run: learning curves of both side by side in one report.

    python benchmark/imitation_baseline.py --same-as gail.py --env-id CartPole-v1 \\
        --dataset runs/datasets/cartpole-expert-1ep-v0 --total-timesteps 100000 --seed 1 \\
        --eval-every 10240 --run-dir runs/imitation-gail-cartpole-1

In a suite (benchmark/suites.toml) the script "imitation:gail.py" runs this file. imitation 1.0.1
pins gymnasium 0.29 and stable-baselines3 2.2, which this project's pins exclude, so it runs in a
venv of its own: ensure_venv() makes it on first use in runs/imitation-1.0.1 (python -m venv, then
`pip install torch==2.13.0`, then `pip install imitation==1.0.1`, made in a temporary folder renamed
into place) and records its `pip freeze` in the run's config.json. This file reads the dataset with
our code (the first --demo-episodes episodes, as gail.py does), writes its transitions to an .npz
and runs benchmark/imitation_gail.py with that venv's Python: PPO from stable-baselines3 with
gail.py's PPO settings, imitation's GAIL discriminator and reward, the run's metrics.csv as ours
(train/episodic_return, charts/train_seconds, eval/episodic_return every --eval-every env steps and
at the end). DIFFERENCES says what imitation does otherwise.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmark.runs import (  # noqa: E402
    baseline_run_args,
    load_script,
    parse_baseline_args,
    print_baseline_end,
)
from canonrl.run import env_spaces  # noqa: E402

IMITATION = "imitation==1.0.1"
VENV = ROOT / "runs" / "imitation-1.0.1"
CHILD = ROOT / "benchmark" / "imitation_gail.py"


def gail_same(a) -> dict:
    """gail.py's Args -> the child's settings (SB3 PPO and imitation's GAIL)."""
    batch = a.num_envs * a.num_steps
    return {
        "num_envs": a.num_envs,
        "num_steps": a.num_steps,
        "batch_size": batch,
        "minibatch_size": batch // a.num_minibatches,
        "update_epochs": a.update_epochs,
        "learning_rate": a.learning_rate,
        "anneal_lr": a.anneal_lr,
        "clip_coef": a.clip_coef,
        "anneal_clip": a.anneal_clip,
        "gamma": a.gamma,
        "gae_lambda": a.gae_lambda,
        "norm_adv": a.norm_adv,
        "ent_coef": a.ent_coef,
        "vf_coef": a.vf_coef,
        "max_grad_norm": a.max_grad_norm,
        "target_kl": a.target_kl,
        # gail.py: disc_epochs passes over the rollout in num_minibatches minibatches
        "disc_updates": a.disc_epochs * a.num_minibatches,
        "disc_learning_rate": a.disc_learning_rate,
        "normalize_reward": a.normalize_reward,
    }


SAME = {"gail.py": gail_same}
DIFFERENCES = {
    "gail.py": "imitation's discriminator standardises its input with running statistics of "
    "every batch it sees (ours: the demonstrations' mean and std, fixed) and takes continuous "
    "actions as the policy gave them (ours: clipped to the bounds, scaled to [-1, 1]); each of its "
    "updates draws demo_batch_size policy pairs from the last rollout with replacement (ours: a "
    "shuffled pass); SB3's PPO clips the value loss by no coefficient and shares no layers, as "
    "ours; the observations (Box actions) and rewards are normalised by SB3's VecNormalize "
    "(ours: gymnasium's running statistics, the same formulas)",
}


def ensure_venv(venv: Path = VENV) -> Path:
    """imitation's venv (its Python), made in a temporary folder renamed into place unless it is
    there: parallel runs leave one whole copy."""
    python = venv / "bin" / "python"
    if python.is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=venv.parent, prefix=".imitation-venv-"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True)
    pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: the CPU build, not CUDA's
    subprocess.run([*pip, IMITATION], check=True)
    try:
        os.rename(tmp, venv)
    except OSError:  # another process renamed its copy first; this one stays as a hidden folder
        pass
    return python


def main(argv=None) -> int:
    p, a, ours = parse_baseline_args(__doc__, SAME, "imitation", argv)
    script = load_script(a.same_as)
    # gail.py's checks of the flags and the dataset first: bad input is one line, nothing made
    ours.env_id, ours.total_timesteps, ours.seed = a.env_id, a.total_timesteps, a.seed
    script.check_args(ours)
    if a.run_dir.exists():
        p.error(f"--run-dir {a.run_dir} exists: give a new directory")
    python = ensure_venv()
    demos = script.demonstrations(script.open_dataset(ours.dataset), ours.demo_episodes)
    # episode ends: terminated, or the next transition does not start where this one ended
    ends = np.append(np.any(demos["next_obs"][:-1] != demos["obs"][1:], axis=-1), True)
    freeze = subprocess.run(
        [str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout.split()
    a.run_dir.mkdir(parents=True)
    np.savez(
        a.run_dir / "demonstrations.npz",
        obs=demos["obs"],
        next_obs=demos["next_obs"],
        actions=demos["actions"],
        dones=(demos["terminated"] > 0) | ends,
    )
    h = SAME[a.same_as](ours)
    h["normalize_obs"] = isinstance(env_spaces(a.env_id, script.__file__)[1], gym.spaces.Box)
    spec = {
        "env_id": a.env_id,
        "seed": a.seed,
        "total_timesteps": a.total_timesteps,
        "eval_every": a.eval_every,
        "eval_episodes": a.eval_episodes,
        "hyperparameters": h,
        "demonstrations": str(a.run_dir / "demonstrations.npz"),
        "run_dir": str(a.run_dir),
    }
    (a.run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    (a.run_dir / "config.json").write_text(
        json.dumps(
            {
                "script": f"imitation:{a.same_as}",
                "imitation_settings": h,
                "imitation_venv": freeze,
                "difference": DIFFERENCES[a.same_as],
                "args": baseline_run_args(a, ours),
            },
            indent=2,
            default=str,
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    child = subprocess.run(
        [str(python), str(CHILD), str(a.run_dir / "spec.json")],
        env={**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"},
        cwd=a.run_dir,
    )
    if child.returncode:
        print(f"imitation's GAIL failed (exit {child.returncode}): see above", file=sys.stderr)
        return child.returncode
    returns = [
        float(row.split(",")[3])
        for row in (a.run_dir / "metrics.csv").read_text().splitlines()[1:]
        if row.split(",")[2] == "eval/episodic_return"
        and int(row.split(",")[0]) == a.total_timesteps // h["batch_size"] * h["batch_size"]
    ]
    print_baseline_end(returns, a.run_dir, f"imitation's GAIL with {a.same_as}'s hyperparameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
