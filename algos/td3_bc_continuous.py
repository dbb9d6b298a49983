"""TD3+BC on an offline dataset (a Minari dataset of Pendulum-v1 by default).

Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning": TD3 whose actor loss
adds behaviour cloning, -lambda Q(s, pi(s)) + (pi(s) - a)^2 with lambda = alpha / mean|Q|, on states
normalised by the dataset's mean and std. The paper's and CORL's settings: alpha 2.5, 256x256 ReLU,
Adam 3e-4, batch 256, policy noise 0.2 clipped 0.5, delay 2. Steps are gradient steps.

Run:    python benchmark/datasets.py --kind medium --policy <SAC model.pt> --expert <...>
        python algos/td3_bc_continuous.py --dataset canonrl/pendulum/medium-v0
Quick:  python algos/td3_bc_continuous.py --dataset canonrl/pendulum/medium-v0 \
            --total-timesteps 2000
Results: benchmark/references.toml
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from canonrl.data import check_offline_args, dataset_arrays, normalized_scores, open_dataset
from canonrl.run import RNGs, RunArgs, RunLogger, load_states, start_run

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    dataset: str = "canonrl/pendulum/medium-v0"
    """Minari dataset: a directory, or an id in MINARI_DATASETS_PATH"""
    alpha: float = 2.5
    """weight of the Q term against behaviour cloning: lambda = alpha / mean|Q(s, pi(s))|"""
    normalize_obs: bool = True
    """states normalised by the dataset's mean and std (the paper's section 5)"""
    learning_rate: float = 3e-4
    """Adam learning rate of the actor and the Q-functions"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network update rate"""
    batch_size: int = 256
    """minibatch size"""
    policy_noise: float = 0.2
    """std of the target policy smoothing noise (in half-ranges of the action)"""
    noise_clip: float = 0.5
    """the target policy smoothing noise is clipped to [-noise_clip, noise_clip]"""
    policy_frequency: int = 2
    """Q updates per actor and target update (the policy delay)"""
    env_id: str | None = None
    """the env the policy is evaluated in (default: the dataset's)"""
    total_timesteps: int = 1_000_000
    """gradient steps (an offline run takes no environment step to learn)"""


# ---- shared: offline_continuous/make_env ----
def make_env(env_id, video_dir=None):
    """env_id; with video_dir, episode 0 is recorded there as eval-episode-0.mp4
    (--capture-video)."""
    if video_dir is None:
        return gym.make(env_id)
    if sys.platform == "linux" and "DISPLAY" not in os.environ:
        # no display: MuJoCo renders off-screen through EGL
        os.environ.setdefault("MUJOCO_GL", "egl")
    return gym.wrappers.RecordVideo(
        gym.make(env_id, render_mode="rgb_array"),
        str(video_dir),
        lambda ep: ep == 0,
        name_prefix="eval",
        disable_logger=True,
    )


# ---- end shared: offline_continuous/make_env ----


class QNetwork(nn.Module):
    """(obs, action) -> 256 -> 256 -> Q-value, ReLU; nn.Linear's default init."""

    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim + action_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
        )

    def forward(self, obs, actions):
        return self.network(torch.cat([obs, actions], dim=1)).squeeze(1)


class Actor(nn.Module):
    """normalised obs -> 256 -> 256 -> tanh, scaled to the env's action bounds: a deterministic
    policy. The bounds and the dataset's observation mean and std are buffers: saved with the
    weights, so a saved actor needs no dataset."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        action_low=-1.0,
        action_high=1.0,
        obs_mean=0.0,
        obs_std=1.0,
    ):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, action_dim),
            nn.Tanh(),
        )
        low = torch.tensor(action_low, dtype=torch.float32).expand(action_dim).clone()
        high = torch.tensor(action_high, dtype=torch.float32).expand(action_dim).clone()
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        mean = torch.tensor(obs_mean, dtype=torch.float32).expand(obs_dim).clone()
        std = torch.tensor(obs_std, dtype=torch.float32).expand(obs_dim).clone()
        self.register_buffer("obs_mean", mean)
        self.register_buffer("obs_std", std)

    def forward(self, obs):  # obs normalised, as the minibatches hold them
        return self.network(obs) * self.action_scale + self.action_bias

    def get_greedy_action(self, obs):
        """mu(obs) of the env's raw observation, normalised here: the policy evaluate() runs."""
        return self((obs - self.obs_mean) / self.obs_std)


def td3_bc_actor_loss(q, actions, dataset_actions, alpha):
    """-lambda * mean Q(s, pi(s)) + mean (pi(s) - a)^2, lambda = alpha / mean|Q| without gradient
    (TD3+BC, eq. 3): the Q term is scaled to the size of the BC term whatever the scale of the
    rewards."""
    lmbda = alpha / q.abs().mean().detach()
    return -lmbda * q.mean() + F.mse_loss(actions, dataset_actions)


def smoothed_target_action(target_actions, noise, noise_clip, action_scale, action_bias):
    """a' = clip(mu'(s') + clip(noise, -c, c) * scale, low, high), noise ~ N(0, policy_noise) (TD3,
    eq. 14)."""
    actions = target_actions + noise.clamp(-noise_clip, noise_clip) * action_scale
    return actions.clamp(action_bias - action_scale, action_bias + action_scale)


def td3_target(next_q1, next_q2, rewards, terminated, gamma):
    """Clipped double-Q target r + gamma * min(Q1', Q2')(s', a'); only termination stops the
    bootstrap."""
    return rewards + gamma * (1.0 - terminated) * torch.min(next_q1, next_q2)


# ---- shared: offline/dataset ----
def normalize_observations(data: dict, on: bool):
    """Standardise the dataset's observations and next observations in place with their mean and
    std (+ 1e-3, CORL's epsilon); returns (mean, std), which the policy keeps to standardise what
    it sees. Off (on False), and for a MinAtar grid of 0/1 cells (a cell never set in the data,
    divided by 1e-3, would blow up): mean 0 and std 1."""
    shape = data["obs"].shape[1:]
    mean = data["obs"].mean(0)
    std = data["obs"].std(0) + 1e-3
    if not on or len(shape) == 3:
        mean = np.zeros(shape, np.float32)
        std = np.ones(shape, np.float32)
    data["obs"] = (data["obs"] - mean) / std
    data["next_obs"] = (data["next_obs"] - mean) / std
    return mean, std


def offline_eval(policy, args, dataset, device, video_dir=None) -> dict:
    """Evaluation episodes of the policy (seeded apart from training) and, where the dataset has
    reference returns, their normalised scores."""
    seed = args.seed + 100_000
    returns = evaluate(policy, args.env_id, args.eval_episodes, seed, device, video_dir)
    scores = normalized_scores(returns, dataset)
    return {
        "eval/episodic_return": returns,
        **({"eval/normalized_score": scores} if scores else {}),
    }


class OfflineBuffer:
    """The dataset's transitions as tensors on the device; uniform minibatches drawn with a numpy
    Generator (which a checkpoint holds, so that a resumed run draws what the whole run would
    have)."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(self, arrays: dict, device, rng: np.random.Generator):
        for name in self.FIELDS:
            setattr(self, name, torch.as_tensor(arrays[name], device=device))
        self.size = len(arrays["rewards"])
        self.rng = rng

    def sample(self, batch_size: int):
        idx = torch.as_tensor(self.rng.integers(0, self.size, batch_size), device=self.obs.device)
        return [getattr(self, name)[idx] for name in self.FIELDS]


# ---- end shared: offline/dataset ----


# ---- shared: offline_continuous/evaluate ----
@torch.no_grad()
def evaluate(actor, env_id, episodes, seed, device="cpu", video_dir=None):
    """Deterministic episodes (actor.get_greedy_action, no noise) on a fresh env; returns the
    episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = actor.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)[None]
            )
            obs, reward, terminated, truncated, _ = env.step(action[0].cpu().numpy())
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


# ---- end shared: offline_continuous/evaluate ----


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging, parameter by parameter: target <- tau * online + (1 - tau) * target
    (tau = 1: a copy)."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    dataset = open_dataset(args.dataset)
    data = dataset_arrays(dataset)
    obs_mean, obs_std = normalize_observations(data, args.normalize_obs)
    obs_dim = data["obs"].shape[1]
    action_dim = data["actions"].shape[1]
    low = dataset.action_space.low
    high = dataset.action_space.high
    actor = Actor(obs_dim, action_dim, low, high, obs_mean, obs_std).to(device)
    actor_target = Actor(obs_dim, action_dim, low, high, obs_mean, obs_std).to(device)
    actor_target.load_state_dict(actor.state_dict())
    qf1 = QNetwork(obs_dim, action_dim).to(device)
    qf2 = QNetwork(obs_dim, action_dim).to(device)
    qf1_target = QNetwork(obs_dim, action_dim).to(device)
    qf2_target = QNetwork(obs_dim, action_dim).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(
        [*qf1.parameters(), *qf2.parameters()], lr=args.learning_rate, fused=True
    )
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    rng = np.random.default_rng(args.seed)  # minibatch sampling
    buffer = OfflineBuffer(data, device, rng)
    stateful = {
        "actor": actor,
        "actor_target": actor_target,
        "qf1": qf1,
        "qf2": qf2,
        "qf1_target": qf1_target,
        "qf2_target": qf2_target,
        "q_optimizer": q_optimizer,
        "actor_optimizer": actor_optimizer,
        # what a checkpoint holds (not the dataset); torch's RNG: the smoothing noise
        "rng": RNGs(rng),
    }

    def run_eval(video_dir=None):
        return offline_eval(actor, args, dataset, device, video_dir)

    global_step = 0
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        global_step = ckpt["global_step"]
    logger = RunLogger(args, run_dir, args.total_timesteps, global_step, ckpt=ckpt, script=__file__)
    actor_loss = torch.tensor(float("nan"))  # logged before the first delayed actor update
    # global_step: gradient steps taken
    for global_step in range(global_step + 1, args.total_timesteps + 1):
        b_obs, b_next_obs, b_actions, b_rewards, b_terminated = buffer.sample(args.batch_size)
        with torch.no_grad():
            noise = torch.randn_like(b_actions) * args.policy_noise
            next_actions = smoothed_target_action(
                actor_target(b_next_obs),
                noise,
                args.noise_clip,
                actor.action_scale,
                actor.action_bias,
            )
            target = td3_target(
                qf1_target(b_next_obs, next_actions),
                qf2_target(b_next_obs, next_actions),
                b_rewards,
                b_terminated,
                args.gamma,
            )
        q1 = qf1(b_obs, b_actions)
        q2 = qf2(b_obs, b_actions)
        qf1_loss = F.mse_loss(q1, target)
        qf2_loss = F.mse_loss(q2, target)
        q_optimizer.zero_grad()
        (qf1_loss + qf2_loss).backward()
        q_optimizer.step()

        if global_step % args.policy_frequency == 0:  # delayed policy updates
            pi = actor(b_obs)
            qf1.requires_grad_(False)  # the actor loss needs no gradient for Q weights
            actor_loss = td3_bc_actor_loss(qf1(b_obs, pi), pi, b_actions, args.alpha)
            qf1.requires_grad_(True)
            actor_optimizer.zero_grad()
            actor_loss.backward()
            actor_optimizer.step()

            soft_update(actor_target, actor, args.tau)
            soft_update(qf1_target, qf1, args.tau)
            soft_update(qf2_target, qf2, args.tau)
        if global_step % 100 == 0:  # the only host syncs of the losses
            logger.log(
                global_step,
                {
                    "losses/qf_loss": (qf1_loss + qf2_loss) / 2,
                    "losses/actor_loss": actor_loss,
                    "losses/qf_values": (q1.mean() + q2.mean()) / 2,
                },
            )
            logger.progress(global_step)
        logger.end_iteration(stateful, global_step, global_step, run_eval)
    logger.finish(
        stateful,
        args.total_timesteps,
        args.total_timesteps,
        run_eval,
        model={
            "actor": actor.state_dict(),
            "obs_dim": obs_dim,
            "action_dim": actor.action_scale.shape[0],
        },
    )


def check_args(args: Args):
    check_offline_args(
        args,
        __file__,
        discrete=False,
        rules={
            "alpha": "x >= 0",
            "policy_noise": "x >= 0",
            "noise_clip": "x >= 0",
            "policy_frequency": "x >= 1",
        },
    )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
