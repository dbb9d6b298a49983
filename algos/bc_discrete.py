"""Behaviour cloning on a discrete-action offline dataset (CartPole-v1's by default).

The baseline cql_discrete.py must beat: a policy classifies the dataset's actions, min E -log
pi(a_data | s), on states normalised by the dataset's mean and std, and acts greedily: CORL's
any-percent BC for discrete actions. 256x256 ReLU (on a MinAtar grid, such as an impala.py run's
canonrl/minatar/breakout/medium-v0, the MinAtar paper's network), Adam 3e-4, batch 256.
--total-timesteps counts gradient steps.

Run:    python benchmark/datasets.py --kind medium --policy <DQN model.pt> --expert <...>
        python algos/bc_discrete.py --dataset canonrl/cartpole/medium-v0
Quick:  python algos/bc_discrete.py --dataset canonrl/cartpole/medium-v0 --total-timesteps 2000
Results: benchmark/references.toml
"""

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from canonrl.data import check_offline_args, dataset_arrays, normalized_scores, open_dataset
from canonrl.envs import register_minatar
from canonrl.run import RNGs, RunArgs, RunLogger, load_states, start_run

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    dataset: str = "canonrl/cartpole/medium-v0"
    """Minari dataset: a directory, or an id in MINARI_DATASETS_PATH"""
    normalize_obs: bool = True
    """vector states normalised by the dataset's mean and std (MinAtar's 0/1 grids never)"""
    learning_rate: float = 3e-4
    """Adam learning rate of the policy"""
    batch_size: int = 256
    """minibatch size"""
    env_id: str | None = None
    """the env the policy is evaluated in (default: the dataset's)"""
    total_timesteps: int = 100_000
    """gradient steps (an offline run takes no environment step to learn)"""


register_minatar()  # the MinAtar/<Game>-v1 ids


# ---- shared: offline_discrete/make_env ----
def make_env(env_id, video_dir=None):
    """env_id (a MinAtar game's observation is its (10, 10, channels) grid of booleans, as its
    datasets hold it); with video_dir, episode 0 is recorded there as eval-episode-0.mp4
    (--capture-video)."""
    if video_dir is None:
        return gym.make(env_id)
    return gym.wrappers.RecordVideo(
        gym.make(env_id, render_mode="rgb_array"),
        str(video_dir),
        lambda ep: ep == 0,
        name_prefix="eval",
        disable_logger=True,
    )


# ---- end shared: offline_discrete/make_env ----


class Actor(nn.Module):
    """normalised obs -> one logit per action, ReLU: a categorical policy. 256 -> 256 for a vector
    (CartPole); for a MinAtar grid (10, 10, channels), the MinAtar paper's network (Young & Tian
    2019): 16 3x3 convolutions -> 128. The dataset's observation mean and std are buffers: saved
    with the weights, so a saved actor needs no dataset."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_mean=0.0, obs_std=1.0):
        super().__init__()
        if len(obs_shape) == 1:
            self.network = nn.Sequential(
                nn.Linear(obs_shape[0], 256),
                nn.ReLU(),
                nn.Linear(256, 256),
                nn.ReLU(),
                nn.Linear(256, n_actions),
            )
        else:
            h, w, c = obs_shape
            self.network = nn.Sequential(
                nn.Conv2d(c, 16, 3),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(16 * (h - 2) * (w - 2), 128),
                nn.ReLU(),
                nn.Linear(128, n_actions),
            )
        mean = torch.tensor(obs_mean, dtype=torch.float32).expand(obs_shape).clone()
        std = torch.tensor(obs_std, dtype=torch.float32).expand(obs_shape).clone()
        self.register_buffer("obs_mean", mean)
        self.register_buffer("obs_std", std)

    # obs normalised, as the minibatches hold them; a grid goes channels first; the logits
    def forward(self, obs):
        return self.network(obs if obs.dim() == 2 else obs.movedim(-1, 1))

    def get_greedy_action(self, obs):
        """argmax_a pi(a | obs) of the env's raw observation, normalised here: the policy evaluate()
        runs."""
        return self((obs - self.obs_mean) / self.obs_std).argmax(dim=-1)


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


# ---- shared: offline_discrete/evaluate ----
@torch.no_grad()
def evaluate(policy, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy episodes (policy.get_greedy_action, no exploration) on a fresh env; returns the
    episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = policy.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)[None]
            )
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


# ---- end shared: offline_discrete/evaluate ----


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    dataset = open_dataset(args.dataset)
    data = dataset_arrays(dataset)
    obs_mean, obs_std = normalize_observations(data, args.normalize_obs)
    # (obs_dim,) or (10, 10, channels)
    obs_shape = data["obs"].shape[1:]
    n_actions = int(dataset.action_space.n)
    actor = Actor(obs_shape, n_actions, obs_mean, obs_std).to(device)
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
        actor_loss = F.cross_entropy(actor(b_obs), b_actions)  # behaviour cloning
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
        model={"actor": actor.state_dict(), "obs_shape": list(obs_shape), "n_actions": n_actions},
    )


def check_args(args: Args):
    check_offline_args(args, __file__, discrete=True)


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
