"""Stable-Baselines3 with one of our scripts' hyperparameters, run the way our scripts run: learning
curves of both side by side in one benchmark report, and the mapping benchmark/speed.py measures SPS
with.

    python benchmark/sb3_baseline.py --same-as sac_continuous.py --env-id Hopper-v5 \\
        --total-timesteps 100000 --seed 1 --eval-every 5000 --run-dir runs/sb3-sac-hopper-1

In a suite (benchmark/suites.toml) the script "sb3:<our script>" runs this file with --same-as <our
script>. The hyperparameters are our script's defaults (read from its `Args` at run time, with the
flags given here that both share: --learning-starts, --learning-rate, --batch-size, --num-envs,
...), mapped flag by flag onto SB3's algorithm by SAME below. The run leaves what the benchmark
reads from ours: config.json (the flags) and metrics.csv (global_step, wall_time, name, value) with
train/episodic_return per training episode, charts/train_seconds (evaluation excluded) and
eval/episodic_return per episode of a deterministic evaluation on a separate env (seeds seed +
100000 + episode) every --eval-every steps and at the end.
"""

import csv
import functools
import importlib
import json
import operator
import sys
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

# ---- our script's Args -> (SB3 algorithm, n_envs, SB3 kwargs) ------------------------------------
# kwargs are JSON: {"linear": x} is a schedule from x to 0 over training (rl-zoo's lin_x);
# "activation_fn" inside policy_kwargs names a torch.nn class; "action_noise": sigma is Gaussian
# exploration noise of that std (in SB3's [-1, 1] action space, as ours scales it by the action
# bounds); "normalize": true wraps the env in VecNormalize ("obs": observations only); "atari":
# true makes SB3's Atari env (make_atari_env: AtariWrapper, then VecFrameStack 4) and a CnnPolicy.


def ppo_same(a) -> tuple[int, dict]:
    """ppo.py's Args -> (n_envs, SB3 PPO kwargs) with the same hyperparameters."""
    return a.num_envs, dict(
        n_steps=a.num_steps,
        batch_size=a.num_envs * a.num_steps // a.num_minibatches,
        n_epochs=a.update_epochs,
        learning_rate={"linear": a.learning_rate} if a.anneal_lr else a.learning_rate,
        clip_range={"linear": a.clip_coef} if a.anneal_clip else a.clip_coef,
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        ent_coef=a.ent_coef,
        vf_coef=a.vf_coef,
        max_grad_norm=a.max_grad_norm,
        target_kl=a.target_kl,
        # ppo_continuous/ppo_atari always normalise
        normalize_advantage=getattr(a, "norm_adv", True),
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": "Tanh"},
    )


def ppo_lstm_same(a) -> tuple[int, dict]:
    """ppo_lstm.py's Args -> (n_envs, sb3-contrib RecurrentPPO kwargs): ppo.py's mapping and
    ppo_lstm.py's network, which is rl-zoo's for CartPoleNoVel-v1 (its published model's
    policy_kwargs): separate actor and critic LSTMs of --lstm-size on the observation, one ReLU
    layer of 64 after each, PyTorch's default init; observations normalised, and rewards with
    --norm-reward, as ours."""
    n_envs, kwargs = ppo_same(a)
    kwargs["normalize"] = True if a.norm_reward else "obs"
    kwargs["policy_kwargs"] = {
        "net_arch": {"pi": [64], "vf": [64]},
        "activation_fn": "ReLU",
        "ortho_init": False,
        "lstm_hidden_size": a.lstm_size,
        "shared_lstm": False,
        "enable_critic_lstm": True,
    }
    return n_envs, kwargs


def a2c_same(a) -> tuple[int, dict]:
    """a2c.py's Args -> (n_envs, SB3 A2C kwargs) with the same hyperparameters; SB3's value loss is
    the plain MSE, ours half of it, so SB3's vf_coef is half of ours."""
    return a.num_envs, dict(
        n_steps=a.num_steps,
        learning_rate={"linear": a.learning_rate} if a.anneal_lr else a.learning_rate,
        gamma=a.gamma,
        gae_lambda=a.gae_lambda,
        ent_coef=a.ent_coef,
        vf_coef=a.vf_coef / 2,
        max_grad_norm=a.max_grad_norm,
        use_rms_prop=a.rmsprop,
        rms_prop_eps=1e-5,
        normalize_advantage=a.norm_adv,
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": "Tanh"},
    )


def ppo_continuous_same(a) -> tuple[int, dict]:
    """ppo_continuous.py's Args -> (n_envs, SB3 PPO kwargs): ppo.py's mapping, the value clipped by
    the clip coefficient too, observations and rewards normalised (VecNormalize with the same gamma)
    and SB3's default networks (64x64 tanh, separate)."""
    n_envs, kw = ppo_same(a)
    if a.clip_vloss:
        kw["clip_range_vf"] = a.clip_coef
    return n_envs, {**kw, "normalize": True}


def ppo_atari_same(a) -> tuple[int, dict]:
    """ppo_atari.py's Args -> (n_envs, SB3 PPO kwargs): ppo.py's mapping, the value clipped by the
    clip coefficient too, and SB3's CnnPolicy (the Nature CNN shared by both heads, as ours) on
    SB3's AtariWrapper with 4-frame stacks."""
    n_envs, kw = ppo_same(a)
    del kw["policy_kwargs"]
    if a.clip_vloss:
        kw["clip_range_vf"] = a.clip_coef
    return n_envs, {**kw, "atari": True}


def _replay_schedule(a) -> dict:
    """What dqn.py, qrdqn.py and dqn_atari.py share with SB3's DQN and QRDQN: the learning rate
    (annealed or not), the replay, gradient_steps updates every train_frequency vector steps, the
    target update every target_network_frequency env steps (rate tau), epsilon annealed linearly."""
    return dict(
        learning_rate={"linear": a.learning_rate} if a.anneal_lr else a.learning_rate,
        buffer_size=a.buffer_size,
        learning_starts=a.learning_starts,
        batch_size=a.batch_size,
        tau=a.tau,
        gamma=a.gamma,
        train_freq=a.train_frequency,
        gradient_steps=a.gradient_steps,
        target_update_interval=a.target_network_frequency,
        exploration_fraction=a.exploration_fraction,
        exploration_initial_eps=a.start_e,
        exploration_final_eps=a.end_e,
    )


def dqn_same(a) -> tuple[int, dict]:
    """dqn.py's Args -> (n_envs, SB3 DQN kwargs) with the same hyperparameters (gradient_steps
    updates every train_frequency vector steps, target update every target_network_frequency env
    steps, as ours)."""
    import torch.nn as nn

    # the nn.Sequential as the script builds it now
    layers = list(load_script("dqn.py").QNetwork(4, 2).network)
    sizes = [m.out_features for m in layers if isinstance(m, nn.Linear)][:-1]
    # e.g. "ReLU"
    activation = type(next(m for m in layers if not isinstance(m, nn.Linear))).__name__
    return a.num_envs, dict(
        **_replay_schedule(a),
        policy_kwargs={
            "net_arch": sizes,
            "activation_fn": activation,
            "optimizer_class": "AdamW",
            "optimizer_kwargs": {"weight_decay": a.weight_decay},
        },
    )


def qrdqn_same(a) -> tuple[int, dict]:
    """qrdqn.py's Args -> (n_envs, sb3-contrib QRDQN kwargs) with the same hyperparameters (its
    default Adam epsilon is 0.01 / batch size, and its ReLU MLP is ours)."""
    import torch.nn as nn

    # the nn.Sequential as the script builds it now
    layers = load_script("qrdqn.py").QNetwork(4, 2).network
    sizes = [m.out_features for m in layers if isinstance(m, nn.Linear)][:-1]
    return a.num_envs, dict(
        **_replay_schedule(a),
        policy_kwargs={"net_arch": sizes, "n_quantiles": a.n_quantiles},
    )


def dqn_atari_same(a) -> tuple[int, dict]:
    """dqn_atari.py's Args -> (n_envs, SB3 DQN kwargs): the same schedule on SB3's Atari env with
    its CnnPolicy (the Nature CNN, then one linear layer to the Q-values, as ours)."""
    return a.num_envs, dict(
        **_replay_schedule(a),
        atari=True,
    )


def _off_policy_same(a) -> dict:
    """What sac/td3/ddpg_continuous.py share: 256x256 ReLU networks, one update per env step, soft
    target updates."""
    return dict(
        learning_rate=a.learning_rate,
        buffer_size=a.buffer_size,
        learning_starts=a.learning_starts,
        batch_size=a.batch_size,
        tau=a.tau,
        gamma=a.gamma,
        train_freq=1,
        gradient_steps=a.gradient_steps,
        policy_kwargs={"net_arch": [256, 256], "activation_fn": "ReLU"},
    )


def sac_same(a) -> tuple[int, dict]:
    """sac_continuous.py's Args -> (n_envs, SB3 SAC kwargs): temperature tuned from alpha towards
    -dim(A)."""
    return a.num_envs, dict(
        **_off_policy_same(a),
        ent_coef=f"auto_{a.alpha}" if a.autotune else a.alpha,
        target_entropy="auto",
    )


def td3_same(a) -> tuple[int, dict]:
    """td3_continuous.py's Args -> (n_envs, SB3 TD3 kwargs)."""
    return a.num_envs, dict(
        **_off_policy_same(a),
        action_noise=a.exploration_noise,
        policy_delay=a.policy_frequency,
        target_policy_noise=a.policy_noise,
        target_noise_clip=a.noise_clip,
    )


def ddpg_same(a) -> tuple[int, dict]:
    """ddpg_continuous.py's Args -> (n_envs, SB3 DDPG kwargs)."""
    return a.num_envs, dict(**_off_policy_same(a), action_noise=a.exploration_noise)


SAME = {
    "ppo.py": ("PPO", ppo_same),
    "a2c.py": ("A2C", a2c_same),
    "dqn.py": ("DQN", dqn_same),
    "ppo_continuous.py": ("PPO", ppo_continuous_same),
    "sac_continuous.py": ("SAC", sac_same),
    "td3_continuous.py": ("TD3", td3_same),
    "ddpg_continuous.py": ("DDPG", ddpg_same),
    "ppo_atari.py": ("PPO", ppo_atari_same),
    "dqn_atari.py": ("DQN", dqn_atari_same),
    "qrdqn.py": ("QRDQN", qrdqn_same),
    "ppo_lstm.py": ("RecurrentPPO", ppo_lstm_same),
}

DIFFERENCES = {
    "ppo.py": "none of substance (same network, orthogonal init, Adam "
    "eps 1e-5, advantage normalisation per minibatch, clipping, GAE); ours bootstraps "
    "time-limit truncation inside GAE's reward, SB3 does the same in its rollout",
    "a2c.py": "none of substance (same network, orthogonal init, "
    "RMSprop alpha 0.99 eps 1e-5 (SB3: PyTorch's RMSprop, "
    "as ours), GAE with lambda 1, one step per rollout)",
    "dqn.py": "SB3 uses the Huber loss and clips gradients at norm 10, "
    "ours uses MSE without clipping (same cost per update)",
    "ppo_continuous.py": "SB3 clips the value prediction and takes the squared "
    "error of the clipped one only, ours the larger of the clipped "
    "and unclipped errors (CleanRL); SB3's VecNormalize normalises "
    "over the vector env, ours per env with shared statistics",
    "sac_continuous.py": "SB3 trains both Q-functions with one Adam and clamps "
    "log_std to [-20, 2] as ours; none of substance",
    "td3_continuous.py": "none of substance (SB3's Gaussian noise is in [-1, "
    "1] action units, ours scaled by the action bounds: the same on envs with symmetric bounds)",
    "ddpg_continuous.py": "none of substance (the TD3 paper's DDPG with "
    "Gaussian noise on both sides)",
    "dqn_atari.py": "SB3 minimises the Huber loss and clips the gradient norm "
    "at 10, ours the squared error unclipped (CleanRL); SB3's replay stores "
    "both stacks of every transition, ours each frame once; SB3's VecFrameStack "
    "pads a new episode's stack with zeros, ours with its first frame",
    "ppo_lstm.py": "the same network; SB3 splits a minibatch's env sequences where episodes end "
    "and pads them, ours reruns whole env rollouts, zeroing the state at each episode start",
    "qrdqn.py": "none of substance (sb3-contrib's QRDQN: the same network, loss, Adam epsilon "
    "and schedules; it also copies the target network before learning starts, ours from then on)",
    "ppo_atari.py": "SB3 clips the value prediction and takes the squared "
    "error of the clipped one only, ours the larger of the clipped and unclipped "
    "errors (CleanRL); SB3's VecFrameStack pads a new episode's stack with zeros, "
    "ours with its first frame; SB3 steps a DummyVecEnv, ours a SyncVectorEnv",
}


def sb3_kwargs(kwargs: dict, action_dim: int | None = None) -> dict:
    """The JSON kwargs of SAME as SB3 objects (schedules, activation classes, action noise);
    "normalize" and "atari" removed."""
    import numpy as np
    import torch
    import torch.nn as nn

    out = {
        k: functools.partial(operator.mul, v["linear"])
        if isinstance(v, dict) and "linear" in v
        else v
        for k, v in kwargs.items()
        if k not in ("normalize", "atari")
    }
    if "policy_kwargs" in out:
        pk = dict(out["policy_kwargs"])
        if "activation_fn" in pk:
            pk["activation_fn"] = getattr(nn, pk["activation_fn"])
        if "optimizer_class" in pk:
            pk["optimizer_class"] = getattr(torch.optim, pk["optimizer_class"])
        out["policy_kwargs"] = pk
    if "action_noise" in out:
        from stable_baselines3.common.noise import NormalActionNoise

        out["action_noise"] = NormalActionNoise(
            np.zeros(action_dim), out["action_noise"] * np.ones(action_dim)
        )
    return out


def make_model(algo: str, env_id: str, n_envs: int, kwargs: dict, seed: int, device="cpu"):
    """SB3's `algo` on a vector env of `env_id` (Monitor-wrapped; VecNormalize when kwargs say
    "normalize"; Atari preprocessing, 4-frame stacks and a CnnPolicy when they say "atari")."""
    import stable_baselines3
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

    # frameskip=1: AtariWrapper skips (as ppo_atari.py makes ALE/<Game>-v5 ids)
    if kwargs.get("atari"):
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        env = VecFrameStack(
            make_atari_env(env_id, n_envs=n_envs, seed=seed, env_kwargs={"frameskip": 1}), n_stack=4
        )
    else:
        env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if kwargs.get("normalize"):
        norm_reward = kwargs["normalize"] != "obs"
        env = VecNormalize(env, gamma=kwargs.get("gamma", 0.99), norm_reward=norm_reward)
    action_dim = env.action_space.shape[0] if env.action_space.shape else None
    policy = "CnnPolicy" if kwargs.get("atari") else "MlpPolicy"
    if algo == "RecurrentPPO":
        policy = "MlpLstmPolicy"
    if hasattr(stable_baselines3, algo):
        algo_class = getattr(stable_baselines3, algo)
    else:  # QRDQN, RecurrentPPO: sb3-contrib
        algo_class = getattr(importlib.import_module("sb3_contrib"), algo)
    return algo_class(
        policy, env, seed=seed, device=device, verbose=0, **sb3_kwargs(kwargs, action_dim)
    )


# ---- a run with our run contract -----------------------------------------------------------------


def evaluate(model, env_id: str, episodes: int, seed: int) -> list[float]:
    """Deterministic episodes on a fresh env (observations normalised with the training statistics,
    frozen). Atari (image observations): whole games (all lives) preprocessed as ppo_atari.py's,
    unclipped scores."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import VecNormalize

    if len(model.observation_space.shape) == 3:
        return evaluate_atari(model, env_id, episodes, seed)
    env, returns = gym.make(env_id), []
    norm = model.get_vec_normalize_env()
    for ep in range(episodes):
        (obs, _), done, total = env.reset(seed=seed + ep), False, 0.0
        state, start = None, np.ones(1, dtype=bool)  # a recurrent policy's state (RecurrentPPO)
        while not done:
            action, state = model.predict(
                norm.normalize_obs(obs) if isinstance(norm, VecNormalize) else obs,
                state=state,
                episode_start=start,
                deterministic=True,
            )
            start = np.zeros(1, dtype=bool)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def evaluate_atari(model, env_id: str, episodes: int, seed: int) -> list[float]:
    """evaluate() for Atari: ppo_atari.py's env ((4, 84, 84) stacks, as SB3's policy takes them) and
    game loop."""
    env, returns = load_script("ppo_atari.py").make_env(env_id), []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        while "episode" not in info:  # RecordEpisodeStatistics's record of the game, when it ends
            obs, _, terminated, truncated, info = env.step(
                int(model.predict(obs, deterministic=True)[0])
            )
            if (terminated or truncated) and "episode" not in info:  # a life lost: the game goes on
                obs, _ = env.reset()
        returns.append(float(info["episode"]["r"]))
    env.close()
    return returns


def main(argv=None) -> int:
    _, a, ours = parse_baseline_args(__doc__, SAME, "SB3", argv)

    import torch

    torch.set_num_threads(1)
    from stable_baselines3.common.callbacks import BaseCallback

    algo, same = SAME[a.same_as]
    n_envs, kwargs = same(ours)
    a.run_dir.mkdir(parents=True)
    (a.run_dir / "config.json").write_text(
        json.dumps(
            {
                "script": f"sb3:{a.same_as}",
                "sb3_algo": algo,
                "sb3_kwargs": kwargs,
                "n_envs": n_envs,
                "args": baseline_run_args(
                    a, ours, num_envs=n_envs, num_steps=kwargs.get("n_steps", 1)
                ),
            },
            indent=2,
            default=str,
        )
    )
    # line-buffered: each row reaches the file as it is written, so a reader watching the run
    # (a time-limited speed run, a progress check) sees the episodes as they end
    f = open(a.run_dir / "metrics.csv", "w", newline="", buffering=1)
    writer = csv.writer(f)
    writer.writerow(["global_step", "wall_time", "name", "value"])
    device = "cuda" if a.cuda and torch.cuda.is_available() else "cpu"
    model = make_model(algo, a.env_id, n_envs, kwargs, a.seed, device)

    class Log(BaseCallback):
        """Training episodes as they end; evaluations every eval_every steps (their time is not
        training time)."""

        def _on_training_start(self):
            self.start, self.eval_seconds, self.next_eval = (
                time.time(),
                0.0,
                a.eval_every or float("inf"),
            )

        def evaluate(self):
            step = self.num_timesteps
            writer.writerow(
                [
                    step,
                    time.time(),
                    "charts/train_seconds",
                    time.time() - self.start - self.eval_seconds,
                ]
            )
            t = time.time()
            returns = evaluate(self.model, a.env_id, a.eval_episodes, a.seed + 100_000)
            self.eval_seconds += time.time() - t
            writer.writerows([step, time.time(), "eval/episodic_return", r] for r in returns)
            f.flush()
            return returns

        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:
                    writer.writerow(
                        [
                            self.num_timesteps,
                            time.time(),
                            "train/episodic_return",
                            info["episode"]["r"],
                        ]
                    )
                    writer.writerow(
                        [
                            self.num_timesteps,
                            time.time(),
                            "train/episodic_length",
                            info["episode"]["l"],
                        ]
                    )
            if self.num_timesteps >= self.next_eval and self.num_timesteps < a.total_timesteps:
                while self.next_eval <= self.num_timesteps:
                    self.next_eval += a.eval_every
                self.evaluate()
            return True

    log = Log()
    model.learn(total_timesteps=a.total_timesteps, callback=log)
    returns = log.evaluate() if a.eval_episodes > 0 else []
    f.close()
    print_baseline_end(returns, a.run_dir, f"SB3 {algo} with {a.same_as}'s hyperparameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
