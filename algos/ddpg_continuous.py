"""DDPG on continuous control (Hopper-v5 by default).

Lillicrap et al. 2015, "Continuous control with deep reinforcement learning": a deterministic actor
trained through one Q-function, learnt off-policy from a replay buffer with Polyak-averaged targets.
The variant of CleanRL and of the TD3 paper's baseline: 256x256 ReLU, Adam 3e-4, batch 256, tau
0.005, Gaussian noise 0.1 (in action half-ranges) for Ornstein-Uhlenbeck, no batch norm or weight
decay, 25e3 random steps first; actor and targets updated every step (CleanRL: every second).

Run:    python algos/ddpg_continuous.py --env-id Hopper-v5 --seed 1
Quick:  python algos/ddpg_continuous.py --env-id Pendulum-v1 --total-timesteps 5000 \
            --learning-starts 1000
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

from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_continuous_env,
    check_ranges,
    check_replay_flags,
    load_states,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    learning_rate: float = 3e-4
    """Adam learning rate of the actor and the Q-functions"""
    buffer_size: int = 1_000_000
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network update rate (1.0: a hard copy)"""
    batch_size: int = 256
    """replay minibatch size"""
    learning_starts: int = 25_000
    """env steps of uniformly random actions before learning starts"""
    gradient_steps: int = 1
    """gradient updates after each vector-env step (--num-envs N: N for one per env step)"""
    exploration_noise: float = 0.1
    """std of the Gaussian noise added to the actor's actions while collecting data"""
    env_id: str = "Hopper-v5"
    """Gymnasium id of a continuous-action (bounded Box) env with a flat observation vector"""
    total_timesteps: int = 1_000_000
    """environment steps over all envs"""
    num_envs: int = 1
    """parallel environments (one synchronous vector env)"""


# ---- shared: continuous/make_env ----
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


# ---- end shared: continuous/make_env ----


# ---- shared: continuous/QNetwork ----
class QNetwork(nn.Module):
    """(obs, action) -> 256 -> 256 -> Q-value, ReLU (the critic of the TD3 authors, SAC v2 and
    CleanRL); nn.Linear's default init."""

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


# ---- end shared: continuous/QNetwork ----


class Actor(nn.Module):
    """obs -> 256 -> 256 -> tanh, scaled to the env's action bounds: a deterministic policy
    (action_scale and action_bias are buffers: saved with the weights, so a saved actor needs no env
    to act)."""

    def __init__(self, obs_dim: int, action_dim: int, action_low=-1.0, action_high=1.0):
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

    def forward(self, obs):
        return self.network(obs) * self.action_scale + self.action_bias

    def get_greedy_action(self, obs):
        """The deterministic action mu(obs) (no noise): the policy evaluate() runs, and that
        exploration perturbs."""
        return self(obs)


def ddpg_target(next_q, rewards, terminated, gamma):
    """Target r + gamma * Q'(s', mu'(s')) (Lillicrap et al. 2015, Algorithm 1) with the target
    networks' Q and actor; only termination stops the bootstrap: a time-limit truncation has a
    future."""
    return rewards + gamma * (1.0 - terminated) * next_q


# ---- shared: continuous/ReplayBuffer ----
class ReplayBuffer:
    """A ring buffer of preallocated numpy arrays. next_obs is the true next observation (the last
    one of an episode cut by a time limit), so that only `terminated` stops the bootstrap.
    Checkpointable through state_dict()."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(self, size: int, obs_dim: int, action_dim: int, rng: np.random.Generator):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros((size, action_dim), np.float32)
        self.rewards = np.zeros(size, np.float32)
        self.terminated = np.zeros(size, np.float32)
        self.size = size
        self.pos = 0
        self.full = False
        self.rng = rng

    def add(self, obs, next_obs, actions, rewards, terminated):
        idx = (self.pos + np.arange(len(obs))) % self.size
        for name, value in zip(self.FIELDS, (obs, next_obs, actions, rewards, terminated)):
            getattr(self, name)[idx] = value
        self.full = self.full or self.pos + len(obs) >= self.size
        self.pos = (self.pos + len(obs)) % self.size

    def sample(self, batch_size: int, device):
        """A uniform minibatch (obs, next_obs, actions, rewards, terminated) as tensors on
        `device`."""
        idx = self.rng.integers(0, self.size if self.full else self.pos, batch_size)
        return [torch.as_tensor(getattr(self, name)[idx], device=device) for name in self.FIELDS]

    def state_dict(self):
        return {name: getattr(self, name) for name in (*self.FIELDS, "pos", "full")}

    def load_state_dict(self, state):  # a checkpoint holds the arrays as tensors
        for name, value in state.items():
            setattr(self, name, value.numpy() if torch.is_tensor(value) else value)


# ---- end shared: continuous/ReplayBuffer ----


# ---- shared: continuous/evaluate ----
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


# ---- end shared: continuous/evaluate ----


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging, parameter by parameter: target <- tau * online + (1 - tau) * target
    (tau = 1: a copy)."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_dim = envs.single_observation_space.shape[0]
    action_dim = envs.single_action_space.shape[0]
    low = envs.single_action_space.low
    high = envs.single_action_space.high
    actor = Actor(obs_dim, action_dim, low, high).to(device)
    actor_target = Actor(obs_dim, action_dim, low, high).to(device)
    actor_target.load_state_dict(actor.state_dict())
    qf1 = QNetwork(obs_dim, action_dim).to(device)
    qf1_target = QNetwork(obs_dim, action_dim).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    q_optimizer = torch.optim.Adam(qf1.parameters(), lr=args.learning_rate, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    rng = np.random.default_rng(args.seed)  # random actions, exploration noise and replay sampling
    rb = ReplayBuffer(args.buffer_size, obs_dim, action_dim, rng)
    stateful = {
        "actor": actor,
        "actor_target": actor_target,
        "qf1": qf1,
        "qf1_target": qf1_target,
        "q_optimizer": q_optimizer,
        "actor_optimizer": actor_optimizer,
        "rb": rb,
        "rng": RNGs(rng),
    }  # what a checkpoint holds, saved and resumed
    num_iterations = args.total_timesteps // args.num_envs  # one iteration = one step of every env
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            actor, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * args.num_envs
    logger = RunLogger(
        args, run_dir, num_iterations * args.num_envs, global_step, ckpt=ckpt, script=__file__
    )
    obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration, num_iterations):
        if global_step < args.learning_starts:  # uniform random actions fill the buffer first
            actions = rng.uniform(low, high, (args.num_envs, action_dim)).astype(np.float32)
        else:
            with torch.no_grad():  # exploration: the deterministic action plus Gaussian noise
                actions = actor.get_greedy_action(
                    torch.as_tensor(obs, dtype=torch.float32, device=device)
                )
            actions = actions.cpu().numpy()
            noise = rng.normal(0.0, args.exploration_noise * (high - low) / 2, actions.shape)
            actions = np.clip(actions + noise, low, high).astype(np.float32)
        # ---- shared: continuous/step ----
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        # same-step autoreset: store the true last observation, not the reset one
        real_next_obs = next_obs.copy()
        for i in np.flatnonzero(infos.get("_final_obs", [])):
            real_next_obs[i] = infos["final_obs"][i]
        rb.add(obs, real_next_obs, actions, rewards, terminated)
        # right after rb.add: on Ctrl-C the steps counted are the steps stored
        global_step += args.num_envs
        obs = next_obs
        episode_return = episode_return + rewards
        episode_length = episode_length + 1
        for i in np.flatnonzero(terminated | truncated):  # every finished episode of every sub-env
            logger.log_episode(global_step, episode_return[i], episode_length[i])
            episode_return[i] = 0.0
            episode_length[i] = 0
        # ---- end shared: continuous/step ----

        if global_step > args.learning_starts:
            for _ in range(args.gradient_steps):
                b_obs, b_next_obs, b_actions, b_rewards, b_terminated = rb.sample(
                    args.batch_size, device
                )
                with torch.no_grad():
                    next_actions = actor_target(b_next_obs)
                    target = ddpg_target(
                        qf1_target(b_next_obs, next_actions), b_rewards, b_terminated, args.gamma
                    )
                q1 = qf1(b_obs, b_actions)
                qf1_loss = F.mse_loss(q1, target)
                q_optimizer.zero_grad()
                qf1_loss.backward()
                q_optimizer.step()

                qf1.requires_grad_(False)  # the actor loss needs no gradient for Q weights
                # deterministic policy gradient through Q1
                actor_loss = -qf1(b_obs, actor(b_obs)).mean()
                qf1.requires_grad_(True)
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                soft_update(actor_target, actor, args.tau)
                soft_update(qf1_target, qf1, args.tau)
        if iteration % 100 == 0:  # every 100 vector steps (the only host syncs of the losses)
            if global_step > args.learning_starts:
                logger.log(
                    global_step,
                    {
                        "losses/qf_loss": qf1_loss,
                        "losses/actor_loss": actor_loss,
                        "losses/qf_values": q1.mean(),
                    },
                )
            logger.progress(global_step)
        logger.end_iteration(stateful, iteration + 1, global_step, run_eval)
    envs.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"actor": actor.state_dict(), "obs_dim": obs_dim, "action_dim": action_dim},
    )


def check_args(args: Args):
    check_continuous_args(args, {"exploration_noise": "x >= 0"})


# ---- shared: continuous/check_args ----
def check_continuous_args(args, rules: dict):
    """The flags of every script of this family, then `rules` (the script's own ranges, as in
    check_ranges)."""
    check_continuous_env(args.env_id, __file__, "dqn.py", "ppo.py")
    check_ranges(args, rules)
    check_replay_flags(args)


# ---- end shared: continuous/check_args ----


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
