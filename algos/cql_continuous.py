"""CQL on an offline dataset (a Minari dataset of Pendulum-v1 by default).

Kumar et al. 2020, "Conservative Q-Learning for Offline RL": SAC whose Q-functions are pushed down
on proposal actions (uniform, the policy's at s and s') and up on the data's: cql_alpha (logsumexp_a
Q(s, a) - Q(s, a_data)), importance-weighted (CQL(H), eq. 4); --lagrange tunes cql_alpha to a
--target-action-gap. CORL's D4RL settings: cql_alpha 10, 10 sampled actions, 3x256 nets (Q lr 3e-4,
policy 3e-5), states normalised, rewards x 1000 / (max - min return). A step is a gradient step.

Run:    python benchmark/datasets.py --kind medium --policy <SAC model.pt> --expert <...>
        python algos/cql_continuous.py --dataset canonrl/pendulum/medium-v0
Quick:  python algos/cql_continuous.py --dataset canonrl/pendulum/medium-v0 --total-timesteps 500
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
    cql_alpha: float = 10.0
    """weight of the conservative penalty (with --lagrange: its scale, times alpha')"""
    cql_n_actions: int = 10
    """actions of each proposal (random, the policy's at s, at s') per state"""
    cql_temp: float = 1.0
    """temperature of the logsumexp over the proposal's actions"""
    lagrange: bool = False
    """tune alpha' so that the penalty's gap stays at --target-action-gap (dual descent)"""
    target_action_gap: float = 5.0
    """with --lagrange: the gap logsumexp Q - Q(s, a_data) it keeps"""
    normalize_obs: bool = True
    """states normalised by the dataset's mean and std"""
    normalize_reward: bool = True
    """rewards times 1000 / (max - min episode return of the dataset)"""
    q_learning_rate: float = 3e-4
    """Adam learning rate of the Q-functions (and of alpha' with --lagrange)"""
    learning_rate: float = 3e-5
    """Adam learning rate of the policy and the entropy temperature"""
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
    """(obs, action) -> 256 -> 256 -> 256 -> Q-value, ReLU (CQL's critic). Several actions per
    state: obs (B, d) with actions (B, N, a) gives (B, N)."""

    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim + action_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
        )

    def forward(self, obs, actions):
        if actions.dim() == 3:  # N actions per state
            obs = obs.unsqueeze(1).expand(-1, actions.shape[1], -1)
        return self.network(torch.cat([obs, actions], dim=-1)).squeeze(-1)


class Actor(nn.Module):
    """normalised obs -> 256 -> 256 -> 256 -> mean and log_std of a Gaussian over u; the action
    tanh(u) is scaled to the env's bounds. The bounds and the dataset's observation mean and std are
    buffers: saved with the weights, so a saved actor needs no dataset."""

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
        self.trunk = nn.Sequential(
            nn.Linear(obs_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
        )
        self.mean = nn.Linear(256, action_dim)
        self.log_std = nn.Linear(256, action_dim)
        low = torch.tensor(action_low, dtype=torch.float32).expand(action_dim).clone()
        high = torch.tensor(action_high, dtype=torch.float32).expand(action_dim).clone()
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        mean = torch.tensor(obs_mean, dtype=torch.float32).expand(obs_dim).clone()
        std = torch.tensor(obs_std, dtype=torch.float32).expand(obs_dim).clone()
        self.register_buffer("obs_mean", mean)
        self.register_buffer("obs_std", std)

    def forward(self, obs):  # obs normalised, as the minibatches hold them
        hidden = self.trunk(obs)
        return self.mean(hidden), self.log_std(hidden).clamp(-20.0, 2.0)

    def get_action(self, obs, n: int | None = None):
        """(a sampled action, its log-density in the env's units), reparameterised; with n: n
        actions per state, shaped (B, n, a) and (B, n)."""
        mean, log_std = self(obs)
        if n is not None:
            mean = mean.unsqueeze(1).expand(-1, n, -1)
            log_std = log_std.unsqueeze(1).expand(-1, n, -1)
        normal = torch.distributions.Normal(mean, log_std.exp(), validate_args=False)
        u = normal.rsample()
        log_prob = squashed_log_prob(normal.log_prob(u), u) - self.action_scale.log().sum()
        return torch.tanh(u) * self.action_scale + self.action_bias, log_prob

    def get_greedy_action(self, obs):
        """The Gaussian's mean, squashed and scaled, for the env's raw observation, normalised here:
        the policy evaluate() runs."""
        return (
            torch.tanh(self((obs - self.obs_mean) / self.obs_std)[0]) * self.action_scale
            + self.action_bias
        )


class Scalar(nn.Module):
    """A learned log-scale weight: log(alpha) of the entropy temperature, log(alpha') of the
    Lagrangian penalty."""

    def __init__(self, value: float):
        super().__init__()
        self.log_value = nn.Parameter(torch.full((1,), math.log(value)))


def squashed_log_prob(gaussian_log_prob, u):
    """log pi(tanh(u)) = sum_i [log N(u_i) - log(1 - tanh(u_i)^2)] (SAC, eq. 21), in the stable form
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)): the density of tanh(u) in [-1, 1]."""
    return (gaussian_log_prob - 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(dim=-1)


def cql_penalty(q_data, q_random, log_density_random, q_proposed, log_density_proposed, temp):
    """temp * logsumexp over the proposal's actions of (Q(s, a) - log mu(a)) / temp, minus Q(s,
    a_data), averaged over the batch (CQL(H) with importance sampling, appendix F): q_random (B, N)
    of uniform actions with log-density log_density_random, q_proposed (B, M) of policy actions with
    log_density_proposed (B, M)."""
    weighted = torch.cat([q_random - log_density_random, q_proposed - log_density_proposed], dim=1)
    return (temp * torch.logsumexp(weighted / temp, dim=1) - q_data).mean()


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
    temperature = Scalar(1.0).to(device)
    alpha_prime = Scalar(1.0).to(device)
    q_optimizer = torch.optim.Adam(
        [*qf1.parameters(), *qf2.parameters()], lr=args.q_learning_rate, fused=True
    )
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    alpha_optimizer = torch.optim.Adam(temperature.parameters(), lr=args.learning_rate, fused=True)
    prime_optimizer = torch.optim.Adam(
        alpha_prime.parameters(), lr=args.q_learning_rate, fused=True
    )
    target_entropy = -float(action_dim)  # SAC v2: -dim(A)
    # uniform actions over the env's box
    log_density_random = -torch.log(actor.action_scale * 2).sum()
    rng = np.random.default_rng(args.seed)  # minibatch sampling
    buffer = OfflineBuffer(data, device, rng)
    stateful = {
        "actor": actor,
        "qf1": qf1,
        "qf2": qf2,
        "qf1_target": qf1_target,
        "qf2_target": qf2_target,
        "temperature": temperature,
        "alpha_prime": alpha_prime,
        "q_optimizer": q_optimizer,
        "actor_optimizer": actor_optimizer,
        "alpha_optimizer": alpha_optimizer,
        "prime_optimizer": prime_optimizer,
        # what a checkpoint holds (not the dataset); torch's RNG: the policy's noise
        "rng": RNGs(rng),
    }

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
        alpha = temperature.log_value.detach().exp()
        pi, log_prob = actor.get_action(b_obs)  # SAC's policy and temperature steps
        # the actor loss needs no gradient for Q weights
        qf1.requires_grad_(False)
        qf2.requires_grad_(False)
        actor_loss = (alpha * log_prob - torch.min(qf1(b_obs, pi), qf2(b_obs, pi))).mean()
        qf1.requires_grad_(True)
        qf2.requires_grad_(True)
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        alpha_loss = -(temperature.log_value.exp() * (log_prob.detach() + target_entropy)).mean()
        alpha_optimizer.zero_grad()
        alpha_loss.backward()
        alpha_optimizer.step()

        with torch.no_grad():  # SAC's target without the entropy term (CORL's backup_entropy False)
            next_actions, _ = actor.get_action(b_next_obs)
            next_q = torch.min(
                qf1_target(b_next_obs, next_actions), qf2_target(b_next_obs, next_actions)
            )
            target = b_rewards + args.gamma * (1.0 - b_terminated) * next_q
            # the proposal: uniform actions, and the policy's at s and at s' (scored at s)
            n = args.cql_n_actions
            random_actions = (
                torch.rand(len(b_obs), n, action_dim, device=device) * 2 - 1
            ) * actor.action_scale + actor.action_bias
            now_actions, now_log_prob = actor.get_action(b_obs, n)
            next_pi, next_log_prob = actor.get_action(b_next_obs, n)
            proposed = torch.cat([now_actions, next_pi], 1)
            log_density = torch.cat([now_log_prob, next_log_prob], 1)
        q1 = qf1(b_obs, b_actions)
        q2 = qf2(b_obs, b_actions)
        gaps = [
            cql_penalty(
                q,
                qf(b_obs, random_actions),
                log_density_random,
                qf(b_obs, proposed),
                log_density,
                args.cql_temp,
            )
            for q, qf in ((q1, qf1), (q2, qf2))
        ]
        weight = (
            args.cql_alpha * alpha_prime.log_value.exp().clamp(0.0, 1e6).detach()
            if args.lagrange
            else args.cql_alpha
        )
        qf_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target) + weight * (gaps[0] + gaps[1])
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        if args.lagrange:  # alpha' grows while the gap exceeds its target (dual gradient step)
            prime_loss = -(
                alpha_prime.log_value.exp().clamp(0.0, 1e6)
                * args.cql_alpha
                * (sum(g.detach() for g in gaps) / 2 - args.target_action_gap)
            ).sum()
            prime_optimizer.zero_grad()
            prime_loss.backward()
            prime_optimizer.step()
        soft_update(qf1_target, qf1, args.tau)
        soft_update(qf2_target, qf2, args.tau)
        if global_step % 100 == 0:  # the only host syncs of the losses
            logger.log(
                global_step,
                {
                    "losses/qf_loss": qf_loss,
                    "losses/cql_gap": (gaps[0] + gaps[1]) / 2,
                    "losses/actor_loss": actor_loss,
                    "losses/alpha_loss": alpha_loss,
                    "losses/qf_values": (q1.mean() + q2.mean()) / 2,
                    "charts/alpha": alpha,
                    **(
                        {"charts/alpha_prime": alpha_prime.log_value.exp()} if args.lagrange else {}
                    ),
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
            "cql_alpha": "x >= 0",
            "cql_n_actions": "x >= 1",
            "cql_temp": "x > 0",
            "q_learning_rate": "x > 0",
        },
    )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
