"""IQL on an offline dataset (a Minari dataset of Pendulum-v1 by default).

Kostrikov, Nair & Levine 2021, "Offline RL with Implicit Q-Learning": V(s) fits an upper expectile
(0.7) of the target Q(s, a) over the data's actions, Q fits r + gamma V(s'), so no unseen action is
evaluated; the Gaussian policy (state-independent std) is extracted by advantage-weighted
regression, exp(3 (Q - V)) clipped at 100. CORL's settings, actor lr cosine-annealed, states
normalised, rewards x 1000 / (max - min episode return). --total-timesteps counts gradient steps.

Run:    python benchmark/datasets.py --kind medium --policy <SAC model.pt> --expert <...>
        python algos/iql_continuous.py --dataset canonrl/pendulum/medium-v0
Quick:  python algos/iql_continuous.py --dataset canonrl/pendulum/medium-v0 --total-timesteps 2000
Results: benchmark/references.toml
"""

import math
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
from canonrl.run import RNGs, RunArgs, RunLogger, fail, load_states, start_run

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    dataset: str = "canonrl/pendulum/medium-v0"
    """Minari dataset: a directory, or an id in MINARI_DATASETS_PATH"""
    expectile: float = 0.7
    """tau of the expectile loss of V: 0.5 is the mean of Q, towards 1 its maximum"""
    beta: float = 3.0
    """inverse temperature of the advantage weights exp(beta * (Q - V)): 0 is behaviour cloning"""
    max_weight: float = 100.0
    """the advantage weights are clipped at this"""
    normalize_obs: bool = True
    """states normalised by the dataset's mean and std"""
    normalize_reward: bool = True
    """rewards times 1000 / (max - min episode return of the dataset)"""
    learning_rate: float = 3e-4
    """Adam learning rate of Q, V and the actor (the actor's annealed by a cosine)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target Q-network update rate"""
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


class ValueNetwork(nn.Module):
    """obs -> 256 -> 256 -> V(s), ReLU; nn.Linear's default init."""

    def __init__(self, obs_dim: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        )

    def forward(self, obs):
        return self.network(obs).squeeze(1)


class Actor(nn.Module):
    """normalised obs -> 256 -> 256 -> tanh: the mean of a Gaussian scaled to the env's action
    bounds, with a learned state-independent log std. The bounds and the dataset's observation mean
    and std are buffers: saved with the weights, so a saved actor needs no dataset."""

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
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        low = torch.tensor(action_low, dtype=torch.float32).expand(action_dim).clone()
        high = torch.tensor(action_high, dtype=torch.float32).expand(action_dim).clone()
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        mean = torch.tensor(obs_mean, dtype=torch.float32).expand(obs_dim).clone()
        std = torch.tensor(obs_std, dtype=torch.float32).expand(obs_dim).clone()
        self.register_buffer("obs_mean", mean)
        self.register_buffer("obs_std", std)

    def forward(self, obs):  # obs normalised, as the minibatches hold them
        """The policy's Gaussian over actions."""
        mean = self.network(obs) * self.action_scale + self.action_bias
        return torch.distributions.Normal(
            mean, self.log_std.clamp(-20.0, 2.0).exp(), validate_args=False
        )

    def get_greedy_action(self, obs):
        """The Gaussian's mean for the env's raw observation, normalised here: the policy evaluate()
        runs."""
        return self((obs - self.obs_mean) / self.obs_std).mean


def expectile_loss(diff, expectile):
    """mean |tau - 1(diff < 0)| diff^2 with diff = Q - V (IQL, eq. 5): tau > 0.5 weighs Q above V
    more, so that V tends to an upper expectile of Q over the dataset's actions."""
    return (torch.abs(expectile - (diff < 0).float()) * diff**2).mean()


def awr_weights(advantage, beta, max_weight):
    """exp(beta * A(s, a)) clipped at max_weight, without gradient (IQL, eq. 7): the dataset's
    actions with a higher advantage are cloned more."""
    return torch.exp(beta * advantage.detach()).clamp(max=max_weight)


# ---- shared: offline_reward/reward_scale ----
def reward_scale(dataset) -> float:
    """1000 / (max - min return of the dataset's episodes): CORL's reward normalisation of IQL and
    CQL on D4RL MuJoCo. Without a spread (one episode, or equal returns) there is no scale: a
    one-line error, not rewards times 1e9; the hyperparameters assume scaled rewards, so training
    on the raw ones is the user's choice (--no-normalize-reward)."""
    returns = [float(np.sum(episode.rewards)) for episode in dataset.iterate_episodes()]
    spread = max(returns) - min(returns)
    # round-off between equal returns included
    if spread <= 1e-6 * max(1.0, max(abs(r) for r in returns)):
        fail(
            "--normalize-reward scales rewards by 1000 / (max - min episode return), "
            f"but the {len(returns)} episode(s) of {dataset.spec.dataset_id} all "
            f"return {returns[0]:.2f}; pass --no-normalize-reward"
        )
    return 1000.0 / spread


# ---- end shared: offline_reward/reward_scale ----


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
    if args.normalize_reward:
        data["rewards"] = data["rewards"] * reward_scale(dataset)
    actor = Actor(obs_dim, action_dim, low, high, obs_mean, obs_std).to(device)
    qf1 = QNetwork(obs_dim, action_dim).to(device)
    qf2 = QNetwork(obs_dim, action_dim).to(device)
    qf1_target = QNetwork(obs_dim, action_dim).to(device)
    qf2_target = QNetwork(obs_dim, action_dim).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    vf = ValueNetwork(obs_dim).to(device)
    q_optimizer = torch.optim.Adam(
        [*qf1.parameters(), *qf2.parameters()], lr=args.learning_rate, fused=True
    )
    v_optimizer = torch.optim.Adam(vf.parameters(), lr=args.learning_rate, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    rng = np.random.default_rng(args.seed)  # minibatch sampling
    buffer = OfflineBuffer(data, device, rng)
    stateful = {
        "actor": actor,
        "qf1": qf1,
        "qf2": qf2,
        "qf1_target": qf1_target,
        "qf2_target": qf2_target,
        "vf": vf,
        "q_optimizer": q_optimizer,
        "v_optimizer": v_optimizer,
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
        b_obs, b_next_obs, b_actions, b_rewards, b_terminated = buffer.sample(args.batch_size)
        with torch.no_grad():
            target_q = torch.min(qf1_target(b_obs, b_actions), qf2_target(b_obs, b_actions))
            next_v = vf(b_next_obs)
        advantage = target_q - vf(b_obs)  # V: an upper expectile of the dataset's Q(s, a)
        v_loss = expectile_loss(advantage, args.expectile)
        v_optimizer.zero_grad()
        v_loss.backward()
        v_optimizer.step()

        # Q: r + gamma V(s'), no policy action
        target = b_rewards + args.gamma * (1.0 - b_terminated) * next_v
        q1 = qf1(b_obs, b_actions)
        q2 = qf2(b_obs, b_actions)
        qf_loss = (F.mse_loss(q1, target) + F.mse_loss(q2, target)) / 2
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        soft_update(qf1_target, qf1, args.tau)
        soft_update(qf2_target, qf2, args.tau)

        # the actor's learning rate: cosine from the start to 0
        for group in actor_optimizer.param_groups:
            group["lr"] = (
                args.learning_rate
                * 0.5
                * (1 + math.cos(math.pi * (global_step - 1) / args.total_timesteps))
            )
        # advantage-weighted regression
        weights = awr_weights(advantage, args.beta, args.max_weight)
        actor_loss = -(weights * actor(b_obs).log_prob(b_actions).sum(1)).mean()
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        if global_step % 100 == 0:  # the only host syncs of the losses
            logger.log(
                global_step,
                {
                    "losses/qf_loss": qf_loss,
                    "losses/v_loss": v_loss,
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
        rules={"expectile": "0 < x < 1", "beta": "x >= 0", "max_weight": "x > 0"},
    )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
