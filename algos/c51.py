"""C51 (categorical DQN) on classic control (CartPole-v1 by default): dqn.py with distributions.

Bellemare et al. 2017, "A Distributional Perspective on Reinforcement Learning": for each action the
network gives a categorical distribution over n_atoms fixed returns z_i; Q(s, a) = sum_i p_i z_i.
The target network's distribution at its greedy next action, moved to r + gamma z_i, is projected
back onto the support (eq. 7); the loss is its cross-entropy with the prediction. CleanRL's atoms
(101 in [-100, 100]) and Adam eps 0.01 / batch_size; the rest is dqn.py's, lr 5e-4 for 500k steps
(for about 100k, rl-zoo's 2.3e-3 learns faster).

Run:    python algos/c51.py --env-id CartPole-v1 --seed 1
Quick:  python algos/c51.py --total-timesteps 20000 --learning-rate 2.3e-3
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
    """Adam learning rate (2.3e-3 for budgets of about 100k steps)"""
    adam_eps: float = 0.01
    """Adam epsilon times batch_size (the paper's eps = 0.01 / 32 for batch 32)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
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
    n_atoms: int = 101
    """atoms of the categorical return distribution (the paper's 51)"""
    v_min: float = -100.0
    """lowest return of the support (CartPole-v1's discounted return is in [0, 100])"""
    v_max: float = 100.0
    """highest return of the support"""
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
    """obs -> 120 -> 84 -> n_atoms logits per action, ReLU (CleanRL's network); nn.Linear's default
    init. The atoms z_i are a buffer: saved with the weights. forward() gives Q(s, a) = sum_i p_i(s,
    a) z_i, whose argmax acts."""

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        n_atoms: int = 101,
        v_min: float = -100.0,
        v_max: float = 100.0,
    ):
        super().__init__()
        self.n_actions = n_actions
        self.n_atoms = n_atoms
        self.register_buffer("atoms", torch.linspace(v_min, v_max, n_atoms))
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, n_actions * n_atoms),
        )

    def logits(self, x):
        """(batch, n_actions, n_atoms) logits of the return distribution of each action."""
        return self.network(x).view(-1, self.n_actions, self.n_atoms)

    def forward(self, x):
        return (self.logits(x).softmax(dim=-1) * self.atoms).sum(dim=-1)

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


def greedy_pmfs(next_logits, atoms):
    """The distribution p(s', a*) of the greedy action a* = argmax_a sum_i p_i(s', a) z_i, from
    (batch, actions, atoms) logits: (batch, atoms)."""
    pmfs = next_logits.softmax(dim=-1)
    return pmfs[torch.arange(len(pmfs)), (pmfs * atoms).sum(dim=-1).argmax(dim=1)]


def categorical_projection(next_pmfs, rewards, terminated, gamma, atoms):
    """The paper's projection (eq. 7, Algorithm 1) of the target distribution: atom z_j of next_pmfs
    moves to Tz_j = r + gamma * z_j (r alone where terminated: a time-limit truncation still has a
    future), clipped to [v_min, v_max], and its mass is split between the two atoms around Tz_j in
    proportion to closeness (all of it to one atom when Tz_j lands on it: floor == ceil). (batch,
    atoms) pmfs in, (batch, atoms) pmfs out."""
    v_min = atoms[0]
    v_max = atoms[-1]
    n_atoms = len(atoms)
    tz = (rewards[:, None] + gamma * (1.0 - terminated[:, None]) * atoms).clamp(v_min, v_max)
    # index of Tz_j (clamp: rounding)
    b = ((tz - v_min) / ((v_max - v_min) / (n_atoms - 1))).clamp(0, n_atoms - 1)
    lower = b.floor().long()
    upper = b.ceil().long()
    target = torch.zeros_like(next_pmfs)
    # lower == upper: all to that atom
    target.scatter_add_(1, lower, next_pmfs * (upper - b + (lower == upper)))
    target.scatter_add_(1, upper, next_pmfs * (b - lower))
    return target


def categorical_loss(logits, target_pmfs):
    """Cross-entropy -sum_i m_i log p_i between the projected target m and the predicted
    distribution p (its logits) of the action taken, averaged over the batch."""
    return -(target_pmfs * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


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
    support = (args.n_atoms, args.v_min, args.v_max)
    q_network = QNetwork(obs_dim, n_actions, *support).to(device)
    target_network = QNetwork(obs_dim, n_actions, *support).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(
        q_network.parameters(),
        lr=args.learning_rate,
        eps=args.adam_eps / args.batch_size,
        fused=True,
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
                    next_pmfs = greedy_pmfs(target_network.logits(b_next_obs), target_network.atoms)
                    target = categorical_projection(
                        next_pmfs, b_rewards, b_terminated, args.gamma, target_network.atoms
                    )
                logits = q_network.logits(b_obs)[torch.arange(args.batch_size), b_actions]
                loss = categorical_loss(logits, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            # every ~100 updates
            if (iteration // args.train_frequency) % max(1, 100 // args.gradient_steps) == 0:
                # Q of the actions taken
                q_pred = (logits.softmax(dim=-1) * q_network.atoms).sum(dim=-1)
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
        model={
            "q_network": q_network.state_dict(),
            "obs_dim": obs_dim,
            "n_actions": n_actions,
            "n_atoms": args.n_atoms,
            "v_min": args.v_min,
            "v_max": args.v_max,
        },
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
    check_ranges(args)
    if args.v_min >= args.v_max:
        fail(
            f"--v-min {args.v_min} must be below --v-max "
            f"{args.v_max}: they are the ends of the return's support"
        )
    check_replay_flags(args)


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
