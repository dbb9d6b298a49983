"""d3rlpy (2.8.1) with one of our offline scripts' hyperparameters, on the same Minari dataset
files, run the way our scripts run: learning curves of both side by side in one benchmark report.

    python benchmark/d3rlpy_baseline.py --same-as cql_discrete.py --env-id CartPole-v1 \\
        --dataset runs/datasets/cartpole-medium-v0 --total-timesteps 30000 --seed 1 \\
        --eval-every 2000 --run-dir runs/d3rlpy-cql-cartpole-1

In a suite (benchmark/suites.toml) the script "d3rlpy:<our script>" runs this file with --same-as
<our script>. The hyperparameters are our script's defaults (read from its `Args`, with the flags
given here that both share), mapped onto d3rlpy's algorithm by SAME below; DIFFERENCES lists what
d3rlpy does otherwise. The run leaves what the benchmark reads from ours: config.json and
metrics.csv with charts/train_seconds (evaluations excluded), eval/episodic_return and
eval/normalized_score per episode of a greedy evaluation (seeds seed + 100000 + episode) every
--eval-every gradient steps and at the end.

d3rlpy 2.8.1 declares gymnasium==1.0.0 (and the old gym), which this project's gymnasium pin
excludes. It is therefore installed apart: ensure_d3rlpy() puts d3rlpy and the pure-Python packages
it imports, each pinned in D3RLPY (with no dependency resolution, so no second gymnasium, torch or
numpy), into runs/d3rlpy-2.8.1 (pip --target) on first use and puts that folder on sys.path. d3rlpy
then runs on the project's gymnasium, torch and numpy; tests/test_offline.py checks that it reads
our datasets exactly and learns on them.
"""

import csv
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmark.runs import (  # noqa: E402
    baseline_run_args,
    load_script,
    parse_baseline_args,
    print_baseline_end,
)

D3RLPY = [
    "d3rlpy==2.8.1",
    "structlog==26.1.0",
    "dataclasses-json==0.6.7",
    "marshmallow==4.4.0",
    "typing-inspect==0.9.0",
    "mypy-extensions==1.2.0",
    "gym==0.26.2",
    "gym-notices==0.1.0",
    "scikit-learn==1.9.1",
    "joblib==1.6.0",
    "threadpoolctl==3.8.0",
    "narwhals==2.29.0",
]
TARGET = ROOT / "runs" / "d3rlpy-2.8.1"


def ensure_d3rlpy(target: Path = TARGET):
    """Install D3RLPY into `target` unless it is there (into a temporary folder renamed into place:
    parallel runs leave one whole copy), put it first on sys.path and import d3rlpy quietly (the old
    gym prints a notice)."""
    if not (target / "d3rlpy").is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--target",
                    tmp,
                    *D3RLPY,
                ],
                check=True,
            )
            try:
                os.rename(tmp, target)
                os.mkdir(tmp)  # for TemporaryDirectory's clean-up
            except OSError:  # another process renamed its copy first
                pass
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    import contextlib
    import io
    import warnings

    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings(action="ignore"):
        import d3rlpy
        import structlog
    # d3rlpy's info lines: warnings only
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    return d3rlpy


# ---- our script's Args -> d3rlpy's algorithm config ----------------------------------------------


def mlp(hidden=(256, 256)):
    from d3rlpy.models.encoders import VectorEncoderFactory

    return VectorEncoderFactory(hidden_units=list(hidden))


def scalers(a, continuous: bool, reward: bool = False) -> dict:
    """Observations standardised with the dataset's mean and std (as ours, with --normalize-obs);
    continuous actions mapped to [-1, 1] (d3rlpy's policies act there; ours scale tanh to the
    bounds); rewards times 1000 / (max - min episode return) where ours scale them so."""
    from d3rlpy.preprocessing import (
        MinMaxActionScaler,
        ReturnBasedRewardScaler,
        StandardObservationScaler,
    )

    return {
        **({"observation_scaler": StandardObservationScaler()} if a.normalize_obs else {}),
        **({"action_scaler": MinMaxActionScaler()} if continuous else {}),
        **({"reward_scaler": ReturnBasedRewardScaler(multiplier=1000.0)} if reward else {}),
    }


def bc_discrete_same(a, steps):
    from d3rlpy.algos import DiscreteBCConfig

    return DiscreteBCConfig(
        batch_size=a.batch_size,
        learning_rate=a.learning_rate,
        encoder_factory=mlp(),
        beta=0.0,
        **scalers(a, False),
    )


def cql_discrete_same(a, steps):
    from d3rlpy.algos import DiscreteCQLConfig

    return DiscreteCQLConfig(
        batch_size=a.batch_size,
        learning_rate=a.learning_rate,
        gamma=a.gamma,
        alpha=a.cql_alpha,
        target_update_interval=max(1, round(1 / a.tau)),
        encoder_factory=mlp(),
        n_critics=1,
        **scalers(a, False),
    )


def bc_continuous_same(a, steps):
    from d3rlpy.algos import BCConfig

    return BCConfig(
        batch_size=a.batch_size,
        learning_rate=a.learning_rate,
        policy_type="deterministic",
        encoder_factory=mlp(),
        **scalers(a, True),
    )


def td3_bc_continuous_same(a, steps):
    from d3rlpy.algos import TD3PlusBCConfig

    return TD3PlusBCConfig(
        batch_size=a.batch_size,
        gamma=a.gamma,
        tau=a.tau,
        actor_learning_rate=a.learning_rate,
        critic_learning_rate=a.learning_rate,
        actor_encoder_factory=mlp(),
        critic_encoder_factory=mlp(),
        target_smoothing_sigma=a.policy_noise,
        target_smoothing_clip=a.noise_clip,
        alpha=a.alpha,
        update_actor_interval=a.policy_frequency,
        **scalers(a, True),
    )


def iql_continuous_same(a, steps):
    from d3rlpy.algos import IQLConfig
    from d3rlpy.optimizers import AdamFactory
    from d3rlpy.optimizers.lr_schedulers import CosineAnnealingLRFactory

    return IQLConfig(
        batch_size=a.batch_size,
        gamma=a.gamma,
        tau=a.tau,
        actor_learning_rate=a.learning_rate,
        critic_learning_rate=a.learning_rate,
        expectile=a.expectile,
        weight_temp=a.beta,
        max_weight=a.max_weight,
        actor_optim_factory=AdamFactory(lr_scheduler_factory=CosineAnnealingLRFactory(T_max=steps)),
        actor_encoder_factory=mlp(),
        critic_encoder_factory=mlp(),
        value_encoder_factory=mlp(),
        **scalers(a, True, reward=a.normalize_reward),
    )


def cql_continuous_same(a, steps):
    from d3rlpy.algos import CQLConfig

    return CQLConfig(
        batch_size=a.batch_size,
        gamma=a.gamma,
        tau=a.tau,
        actor_learning_rate=a.learning_rate,
        critic_learning_rate=a.q_learning_rate,
        temp_learning_rate=a.learning_rate,
        alpha_learning_rate=a.q_learning_rate if a.lagrange else 0.0,
        initial_alpha=1.0,
        alpha_threshold=a.target_action_gap,
        conservative_weight=a.cql_alpha,
        n_action_samples=a.cql_n_actions,
        soft_q_backup=False,
        max_q_backup=False,
        actor_encoder_factory=mlp((256, 256, 256)),
        critic_encoder_factory=mlp((256, 256, 256)),
        **scalers(a, True, reward=a.normalize_reward),
    )


SAME = {
    "bc_discrete.py": bc_discrete_same,
    "cql_discrete.py": cql_discrete_same,
    "bc_continuous.py": bc_continuous_same,
    "td3_bc_continuous.py": td3_bc_continuous_same,
    "iql_continuous.py": iql_continuous_same,
    "cql_continuous.py": cql_continuous_same,
}
# What d3rlpy does otherwise, with our hyperparameters (the report's reader needs these beside the
# numbers).
DIFFERENCES = {
    "cql_discrete.py": "d3rlpy copies the target network every round(1 / "
    "tau) = 200 steps (ours: a soft update of tau 0.005 every step)",
    "bc_continuous.py": "d3rlpy regresses actions scaled to [-1, 1] (ours: in the env's units)",
    "td3_bc_continuous.py": "d3rlpy's behaviour-cloning term is on actions "
    "scaled to [-1, 1] (ours: the env's units; on Pendulum, whose actions "
    "span [-2, 2], d3rlpy's term is 4x smaller, as if alpha were 4x larger)",
    "iql_continuous.py": "d3rlpy weighs the actor's regression by the value "
    "function after its update (ours: before), updates Q and "
    "V with one Adam and clamps the log std at -5 (ours: -20)",
    "cql_continuous.py": "d3rlpy's logsumexp has no temperature (ours: --cql-temp, 1.0 by default)",
}
# d3rlpy drops the last transition of an episode cut by a time limit (it has no next observation in
# its format); ours keep it with the stored next observation.


# ---- a run with our run contract -----------------------------------------------------------------


def to_mdp(dataset, d3rlpy):
    """The Minari dataset's episodes as a d3rlpy MDPDataset: per step the observation, action,
    reward, and where an episode ended, terminal (it terminated) or timeout (a time limit cut
    it)."""
    import gymnasium as gym
    import numpy as np

    obs, actions, rewards, terminals, timeouts = [], [], [], [], []
    for ep in dataset.iterate_episodes():
        obs.append(ep.observations[:-1])
        actions.append(ep.actions)
        rewards.append(ep.rewards)
        terminals.append(ep.terminations)
        timeouts.append(ep.truncations & ~ep.terminations)
    discrete = isinstance(dataset.action_space, gym.spaces.Discrete)
    return d3rlpy.dataset.MDPDataset(
        observations=np.concatenate(obs).astype(np.float32),
        actions=np.concatenate(actions),
        rewards=np.concatenate(rewards).astype(np.float32),
        terminals=np.concatenate(terminals).astype(np.float32),
        timeouts=np.concatenate(timeouts).astype(np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE if discrete else d3rlpy.ActionSpace.CONTINUOUS,
        action_size=int(dataset.action_space.n) if discrete else None,
    )


def evaluate(algo, env_id: str, episodes: int, seed: int) -> list[float]:
    """Greedy episodes (algo.predict: the argmax, or the policy's mean action) on a fresh env."""
    import gymnasium as gym
    import numpy as np

    env, returns = gym.make(env_id), []
    for ep in range(episodes):
        (obs, _), done, total = env.reset(seed=seed + ep), False, 0.0
        while not done:
            action = algo.predict(np.asarray(obs, dtype=np.float32)[None])[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(argv=None) -> int:
    p, a, ours = parse_baseline_args(__doc__, SAME, "d3rlpy", argv, offline=True)
    if a.eval_every and a.total_timesteps % a.eval_every:
        p.error(
            f"--total-timesteps {a.total_timesteps} must be a multiple of "
            f"--eval-every {a.eval_every} (d3rlpy trains in whole epochs)"
        )
    script = load_script(a.same_as)

    import torch

    torch.set_num_threads(1)
    d3rlpy = ensure_d3rlpy()
    dataset = script.open_dataset(ours.dataset)
    config = SAME[a.same_as](ours, a.total_timesteps)
    d3rlpy.seed(a.seed)
    algo = config.create(device="cpu:0")
    a.run_dir.mkdir(parents=True)
    (a.run_dir / "config.json").write_text(
        json.dumps(
            {
                "script": f"d3rlpy:{a.same_as}",
                "d3rlpy_algo": type(config).__name__,
                "d3rlpy_config": dataclasses.asdict(config),
                "difference": DIFFERENCES.get(a.same_as, ""),
                "args": baseline_run_args(a, ours),
            },
            indent=2,
            default=str,
        )
    )
    f = open(a.run_dir / "metrics.csv", "w", newline="")
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(["global_step", "wall_time", "name", "value"])
    start, eval_seconds = None, 0.0

    # at the first gradient step: d3rlpy's set-up (scalers, networks) is not training time
    def start_clock(*_):
        nonlocal start
        start = start or time.time()

    def log_eval(step: int) -> list[float]:
        nonlocal eval_seconds
        writer.writerow(
            [step, f"{time.time():.3f}", "charts/train_seconds", time.time() - start - eval_seconds]
        )
        if a.eval_episodes == 0:
            return []
        t = time.time()
        returns = evaluate(algo, a.env_id, a.eval_episodes, a.seed + 100_000)
        eval_seconds += time.time() - t
        writer.writerows([step, f"{time.time():.3f}", "eval/episodic_return", r] for r in returns)
        writer.writerows(
            [step, f"{time.time():.3f}", "eval/normalized_score", s]
            for s in script.normalized_scores(returns, dataset)
        )
        f.flush()
        return returns

    every = a.eval_every or a.total_timesteps
    fitter = algo.fitter(
        to_mdp(dataset, d3rlpy),
        n_steps=a.total_timesteps,
        n_steps_per_epoch=every,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
        show_progress=False,
        save_interval=10**9,
        callback=start_clock,
    )
    for epoch, metrics in fitter:  # one epoch: every gradient steps
        step = min(epoch * every, a.total_timesteps)
        writer.writerows(
            [step, f"{time.time():.3f}", f"losses/{k}", v]
            for k, v in metrics.items()
            # d3rlpy's loss averages over the epoch, not its timers
            if not k.startswith("time_")
        )
        if step < a.total_timesteps:
            log_eval(step)
    returns = log_eval(a.total_timesteps)
    f.close()
    print_baseline_end(
        returns, a.run_dir, f"d3rlpy {type(config).__name__} with {a.same_as}'s hyperparameters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
