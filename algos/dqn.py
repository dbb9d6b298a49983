"""DQN on classic control (CartPole-v1 by default).

Mnih et al. 2015, "Human-level control through deep reinforcement learning": experience replay, a
target network, epsilon-greedy annealed linearly; CleanRL's network and loss. The buffer keeps the
true final observation; only termination cuts the bootstrap. 8 gradient steps every 32 env steps, a
soft target update (tau 0.005), AdamW (its weight decay keeps the hidden weights from growing until
the greedy policy fails under training's random actions), lr 5e-4 annealed, for 500k steps; for
about 100k, rl-zoo's 2.3e-3 learns faster.

Run:    python algos/dqn.py --env-id CartPole-v1 --seed 1
Quick:  python algos/dqn.py --total-timesteps 20000 --learning-rate 2.3e-3
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

from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_ranges,
    check_replay_flags,
    env_spaces,
    fail,
    load_states,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    learning_rate: float = 5e-4
    """AdamW learning rate (2.3e-3 for budgets of about 100k steps)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay (PyTorch's default): keeps the weights from growing"""
    buffer_size: int = 100_000
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network update rate (1.0: a hard copy)"""
    target_network_frequency: int = 1
    """env steps between target network updates"""
    batch_size: int = 128
    """replay minibatch size"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.04
    """final exploration epsilon"""
    exploration_fraction: float = 0.08
    """fraction of total_timesteps over which epsilon goes from start_e to end_e"""
    learning_starts: int = 1_000
    """env steps before learning starts"""
    train_frequency: int = 32
    """vector-env steps between training phases"""
    gradient_steps: int = 8
    """gradient updates per training phase"""
    env_id: str = "CartPole-v1"
    """Gymnasium id of a discrete-action env with a flat observation vector"""
    total_timesteps: int = 500_000
    """environment steps over all envs"""
    num_envs: int = 1
    """parallel environments (one synchronous vector env)"""


# ---- shared: classic/make_env ----
def make_env(env_id, video_dir=None):
    """env_id; with video_dir, episode 0 is recorded there as eval-episode-0.mp4
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


# ---- end shared: classic/make_env ----


class QNetwork(nn.Module):
    """obs -> 120 -> 84 -> one Q-value per action, ReLU (CleanRL's network); nn.Linear's default
    init."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, n_actions),
        )

    def forward(self, x):
        return self.network(x)

    def get_greedy_action(self, x):
        """argmax_a Q(x, a): the exploiting action of the rollout and the policy that evaluate()
        runs."""
        return self(x).argmax(dim=-1)


# ---- shared: classic/ReplayBuffer ----
class ReplayBuffer:
    """A ring buffer of preallocated numpy arrays. next_obs is the true next observation (the last
    one of an episode cut by a time limit), so that only `terminated` stops the bootstrap.
    Checkpointable through state_dict()."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(self, size: int, obs_dim: int, rng: np.random.Generator):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros(size, np.int64)
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


# ---- end shared: classic/ReplayBuffer ----


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def td_target(target_q_next, rewards, terminated, gamma):
    """One-step Q-learning target r + gamma * max_a' Q_target(s', a') (Nature DQN, Algorithm 1);
    only termination stops the bootstrap: a time-limit truncation still has a future."""
    return rewards + gamma * target_q_next.max(dim=1).values * (1.0 - terminated)


# ---- shared: classic/evaluate ----
@torch.no_grad()
def evaluate(q_network, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy (argmax Q) episodes on a fresh env; returns the list of episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = q_network.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)
            )
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


# ---- end shared: classic/evaluate ----


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
    n_actions = int(envs.single_action_space.n)
    q_network = QNetwork(obs_dim, n_actions).to(device)
    target_network = QNetwork(obs_dim, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.AdamW(
        q_network.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay, fused=True
    )  # fused: 4x faster step
    rng = np.random.default_rng(args.seed)  # exploration and replay sampling
    rb = ReplayBuffer(args.buffer_size, obs_dim, rng)
    num_iterations = args.total_timesteps // args.num_envs  # one iteration = one step of every env
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            q_network, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    stateful = {
        "q_network": q_network,
        "target_network": target_network,
        "optimizer": optimizer,
        "rb": rb,
        "rng": RNGs(rng),
    }  # what a checkpoint holds, saved and resumed
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
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        actions = rng.integers(0, n_actions, args.num_envs)
        # the network is asked only where it acts
        exploit = rng.random(args.num_envs) >= epsilon
        if exploit.any():
            with torch.no_grad():
                greedy = q_network.get_greedy_action(
                    torch.as_tensor(obs, dtype=torch.float32, device=device)
                )
            actions = np.where(exploit, greedy.cpu().numpy(), actions)
        # ---- shared: classic/step ----
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
        # ---- end shared: classic/step ----

        if global_step > args.learning_starts and iteration % args.train_frequency == 0:
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (
                    1.0 - iteration / num_iterations
                )
            for _ in range(args.gradient_steps):
                b_obs, b_next_obs, b_actions, b_rewards, b_terminated = rb.sample(
                    args.batch_size, device
                )
                with torch.no_grad():
                    target = td_target(
                        target_network(b_next_obs), b_rewards, b_terminated, args.gamma
                    )
                q_pred = q_network(b_obs).gather(1, b_actions[:, None]).squeeze(1)
                loss = F.mse_loss(q_pred, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            # every ~100 updates
            if (iteration // args.train_frequency) % max(1, 100 // args.gradient_steps) == 0:
                logger.log(
                    global_step,
                    {
                        "losses/td_loss": loss,
                        "losses/q_values": q_pred.mean(),
                        "charts/epsilon": epsilon,
                        "charts/learning_rate": optimizer.param_groups[0]["lr"],
                    },
                )
                logger.progress(global_step)
        if (
            global_step > args.learning_starts
            and global_step % args.target_network_frequency < args.num_envs
        ):
            soft_update(target_network, q_network, args.tau)
        logger.end_iteration(stateful, iteration + 1, global_step, run_eval)
    envs.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"q_network": q_network.state_dict(), "obs_dim": obs_dim, "n_actions": n_actions},
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "sac_continuous.py",
            "td3_continuous.py",
        )
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(
            f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}",
            "dqn_atari.py",
        )
    check_ranges(args, {"weight_decay": "x >= 0"})
    check_replay_flags(args)


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
