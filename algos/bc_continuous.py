"""Behaviour cloning on an offline dataset (a Minari dataset of Pendulum-v1 by default).

The baseline of offline RL: a deterministic policy regresses the dataset's actions, min E (pi(s) -
a)^2, on states normalised by the dataset's mean and std: TD3+BC without its Q term (Fujimoto & Gu
2021), CORL's any-percent BC with every episode kept (Chen et al. 2021's "10% BC" keeps the best).
CORL's settings: 256x256 ReLU, Adam 3e-4, batch 256. --total-timesteps counts gradient steps.

Run:    python benchmark/datasets.py --kind medium --policy <SAC model.pt> --expert <...>
        python algos/bc_continuous.py --dataset canonrl/pendulum/medium-v0
Quick:  python algos/bc_continuous.py --dataset canonrl/pendulum/medium-v0 --total-timesteps 2000
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
    normalize_obs: bool = True
    """states normalised by the dataset's mean and std"""
    learning_rate: float = 3e-4
    """Adam learning rate of the actor"""
    batch_size: int = 256
    """minibatch size"""
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
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    rng = np.random.default_rng(args.seed)  # minibatch sampling
    buffer = OfflineBuffer(data, device, rng)
    stateful = {
        "actor": actor,
        "actor_optimizer": actor_optimizer,
        "rng": RNGs(rng),
    }  # what a checkpoint holds (not the dataset)

    def run_eval(video_dir=None):
        return offline_eval(actor, args, dataset, device, video_dir)

    global_step = 0
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        global_step = ckpt["global_step"]
    logger = RunLogger(args, run_dir, args.total_timesteps, global_step, ckpt=ckpt, script=__file__)
    # global_step: gradient steps taken
    for global_step in range(global_step + 1, args.total_timesteps + 1):
        b_obs, _, b_actions, _, _ = buffer.sample(args.batch_size)
        actor_loss = F.mse_loss(actor(b_obs), b_actions)  # behaviour cloning
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        if global_step % 100 == 0:  # the only host syncs of the loss
            logger.log(global_step, {"losses/actor_loss": actor_loss})
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
    check_offline_args(args, __file__, discrete=False)


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
