"""CQL on a discrete-action offline dataset (CartPole-v1's by default).

Kumar et al. 2020, "Conservative Q-Learning for Offline RL" on a Double DQN: the Huber TD loss plus
cql_alpha * (logsumexp_a Q(s, a) - Q(s, a_data)), CQL(H) of eq. 4, exact with few actions: every
action's Q is pushed down by its softmax weight and the data's action up (d3rlpy's DiscreteCQL).
Adam, a soft target update (tau 0.005), states normalised, 256x256 ReLU, batch 256 (a MinAtar grid,
such as canonrl/minatar/breakout/medium-v0: the MinAtar paper's network). Steps are gradient steps.

Run:    python benchmark/datasets.py --kind medium --policy <DQN model.pt> --expert <...>
        python algos/cql_discrete.py --dataset canonrl/cartpole/medium-v0
Quick:  python algos/cql_discrete.py --dataset canonrl/cartpole/medium-v0 --total-timesteps 2000
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
    cql_alpha: float = 1.0
    """weight of the conservative penalty logsumexp_a Q(s, a) - Q(s, a_data)"""
    normalize_obs: bool = True
    """vector states normalised by the dataset's mean and std (MinAtar's 0/1 grids never)"""
    learning_rate: float = 3e-4
    """Adam learning rate of the Q-network"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network update rate, every gradient step (1.0: a hard copy)"""
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


class QNetwork(nn.Module):
    """normalised obs -> one Q-value per action, ReLU: 256 -> 256 for a vector (CartPole); for a
    MinAtar grid (10, 10, channels), the MinAtar paper's DQN network (Young & Tian 2019): 16 3x3
    convolutions -> 128. The dataset's observation mean and std are buffers: saved with the weights,
    so a saved network needs no dataset."""

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

    # obs normalised, as the minibatches hold them; a grid goes channels first
    def forward(self, obs):
        return self.network(obs if obs.dim() == 2 else obs.movedim(-1, 1))

    def get_greedy_action(self, obs):
        """argmax_a Q(obs, a) of the env's raw observation, normalised here: the policy evaluate()
        runs."""
        return self((obs - self.obs_mean) / self.obs_std).argmax(dim=-1)


def cql_penalty(q_values, actions):
    """CQL(H)'s regulariser, mean over the batch of logsumexp_a Q(s, a) - Q(s, a_data): exact over a
    discrete action set. q_values: (batch, n_actions); actions: (batch,) int64."""
    return (
        torch.logsumexp(q_values, dim=1) - q_values.gather(1, actions[:, None]).squeeze(1)
    ).mean()


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
    # (obs_dim,) or (10, 10, channels)
    obs_shape = data["obs"].shape[1:]
    n_actions = int(dataset.action_space.n)
    q_network = QNetwork(obs_shape, n_actions, obs_mean, obs_std).to(device)
    target_network = QNetwork(obs_shape, n_actions, obs_mean, obs_std).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    rng = np.random.default_rng(args.seed)  # minibatch sampling
    buffer = OfflineBuffer(data, device, rng)
    stateful = {
        "q_network": q_network,
        "target_network": target_network,
        "optimizer": optimizer,
        "rng": RNGs(rng),
    }  # what a checkpoint holds (not the dataset)

    def run_eval(video_dir=None):
        return offline_eval(q_network, args, dataset, device, video_dir)

    global_step = 0
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        global_step = ckpt["global_step"]
    logger = RunLogger(args, run_dir, args.total_timesteps, global_step, ckpt=ckpt, script=__file__)
    # global_step: gradient steps taken
    for global_step in range(global_step + 1, args.total_timesteps + 1):
        b_obs, b_next_obs, b_actions, b_rewards, b_terminated = buffer.sample(args.batch_size)
        # Double DQN: the online network picks the next action, the target network scores it
        with torch.no_grad():
            next_actions = q_network(b_next_obs).argmax(dim=1, keepdim=True)
            next_q = target_network(b_next_obs).gather(1, next_actions).squeeze(1)
            target = b_rewards + args.gamma * (1.0 - b_terminated) * next_q
        q_values = q_network(b_obs)
        q_data = q_values.gather(1, b_actions[:, None]).squeeze(1)
        td_loss = F.smooth_l1_loss(q_data, target)  # Huber, delta 1
        gap = cql_penalty(q_values, b_actions)
        loss = td_loss + args.cql_alpha * gap
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        soft_update(target_network, q_network, args.tau)
        if global_step % 100 == 0:  # the only host syncs of the losses
            logger.log(
                global_step,
                {
                    "losses/td_loss": td_loss,
                    "losses/cql_gap": gap,
                    "losses/qf_loss": loss,
                    "losses/qf_values": q_data.mean(),
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
            "q_network": q_network.state_dict(),
            "obs_shape": list(obs_shape),
            "n_actions": n_actions,
        },
    )


def check_args(args: Args):
    check_offline_args(args, __file__, discrete=True, rules={"cql_alpha": "x >= 0"})


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
