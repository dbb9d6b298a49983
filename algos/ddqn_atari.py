"""Double DQN on Atari (ALE/Breakout-v5 by default) and MinAtar: dqn_atari.py, van Hasselt's target.

van Hasselt, Guez and Silver 2016, "Deep Reinforcement Learning with Double Q-learning": DQN's
max_a' Q_target(s', a') picks and values the next action with the same noisy estimates (biased
upwards); Double DQN picks it online and values it with the target: r + gamma Q_target(s', argmax_a'
Q(s', a')) (eq. 4, double_q_target). `diff dqn_atari.py ddqn_atari.py` shows only that. The paper's
tuned variant adds `--target-network-frequency 7500 --end-e 0.01`.

Run:    python algos/ddqn_atari.py --env-id ALE/Breakout-v5 --seed 1 --cuda
Quick:  python algos/ddqn_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 2000 \
            --learning-starts 1000 --buffer-size 2000
Results: benchmark/references.toml
"""

import csv
import difflib
import hashlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import warnings
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from stable_baselines3.common.atari_wrappers import AtariWrapper
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    learning_rate: float = 1e-4
    """Adam learning rate"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0"""
    buffer_size: int = 1_000_000
    """replay capacity in 84x84 uint8 frames (a step each, an episode 1 more); 1M: 6.6 GiB"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate (1.0: a hard copy)"""
    target_network_frequency: int = 1000
    """env steps between target network updates"""
    batch_size: int = 32
    """replay minibatch size"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.01
    """final exploration epsilon"""
    exploration_fraction: float = 0.10
    """fraction of total_timesteps over which epsilon goes from start_e to end_e"""
    learning_starts: int = 80_000
    """env steps before learning starts"""
    train_frequency: int = 4
    """vector-env steps between training phases"""
    gradient_steps: int = 1
    """gradient updates per training phase"""
    eval_epsilon: float = 0.05
    """epsilon of the evaluation games (Nature DQN's; 0: greedy)"""
    compile: bool = False
    """torch.compile the loss and its backward: ~1.6x faster updates on a CPU, ~30 s to compile"""
    env_id: str = "ALE/Breakout-v5"
    """an Atari game: ALE/<Game>-v5 (sticky actions) or <Game>NoFrameskip-v4"""
    total_timesteps: int = 10_000_000
    """environment steps over all envs (agent steps: 4 frames each)"""
    num_envs: int = 1
    """parallel environments (one synchronous vector env)"""
    # ---- shared: args ----
    seed: int = 1
    """seed of torch, numpy, random and the envs"""
    cuda: bool = False
    """run on CUDA when available (the CNN scripts gain from it; small MLPs are fastest on a CPU)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic and one CPU thread"""
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "canonrl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb entity (team)"""
    capture_video: bool = False
    """record episode 0 of the final evaluation to <run_dir>/videos"""
    save_model: bool = False
    """save <run_dir>/model.pt at the end"""
    eval_episodes: int = 10
    """evaluation episodes (the policy evaluate() runs) at the end and each --eval-every"""
    eval_every: int = 0
    """also evaluate every this many steps (0: only at the end); logs charts/train_seconds too"""
    run_dir: str | None = None
    """where the run is written (default runs/<env>__<script>__<seed>__<time>); must be new"""
    resume: str | None = None
    """continue the run in this directory (its flags; --total-timesteps may extend it)"""
    checkpoint_every: int = 50_000
    """save <run_dir>/checkpoint.pt every this many steps (and at the end and on Ctrl-C)"""
    # ---- end shared: args ----


# ---- shared: minatar/register_minatar ----
MINATAR = {
    f"MinAtar/{game.title().replace('_', '')}-v1": game
    for game in ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
}


def register_minatar():
    """Register the MinAtar/<Game>-v1 ids (pip install minatar) here: importing minatar takes 1 s.
    Called at import, and by each of impala.py's actors: a Ray actor's process does not run this
    file's top level."""
    for env_id, game in MINATAR.items():
        if env_id not in gym.registry:
            gym.register(
                env_id,
                "minatar.gym:BaseEnv",
                max_episode_steps=10_000,
                kwargs=dict(game=game, use_minimal_action_set=True),
            )


register_minatar()
# ---- end shared: minatar/register_minatar ----


# ---- shared: atari/make_env ----
gym.register_envs(ale_py)  # the ALE/<Game>-v5 and <Game>NoFrameskip-v4 ids


def minatar_frame(obs):
    """A MinAtar observation (10, 10, channels) of booleans drawn as an 84x84 gray frame: channel c
    at gray level (c + 1) * 255 // channels (the highest wins where objects overlap), each cell 8x8
    pixels, a 2-pixel black border."""
    levels = np.arange(1, obs.shape[-1] + 1, dtype=np.uint8) * (255 // obs.shape[-1])
    return np.pad(np.kron((obs * levels).max(-1), np.ones((8, 8), np.uint8)), 2)


def make_env(env_id, video_dir=None):
    """An Atari game as Stable-Baselines3's AtariWrapper preprocesses it (up to 30 no-ops at reset,
    each action repeated for 4 frames with a max over the last two, a lost life ends the episode
    (not the game), FIRE at reset, 84x84 grayscale, rewards clipped to their sign), or a MinAtar
    game drawn as 84x84 frames; then stacks of the last 4 frames. ALE/<Game>-v5 ids are made with
    frameskip=1 (the wrapper skips) and keep v5's sticky actions (repeat_action_probability 0.25,
    Machado et al. 2018); <Game>NoFrameskip-v4 ids have none (CleanRL's setting). info["episode"]
    (RecordEpisodeStatistics beneath the wrapper) holds the unclipped score of a whole game (all
    lives). With video_dir, game 0 is recorded there as eval-episode-0.mp4 (--capture-video)."""
    # 10x10 games as frames for the same CNN and frame stack (no Atari wrapper)
    if env_id.startswith("MinAtar/"):
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        env = gym.wrappers.TransformObservation(
            env, minatar_frame, gym.spaces.Box(0, 255, (84, 84), np.uint8)
        )
        return gym.wrappers.FrameStackObservation(env, 4)
    if video_dir is None:
        env = gym.make(env_id, frameskip=1)  # the wrapper skips frames (v5's sticky actions stay)
    else:  # the raw game, before the preprocessing: the video shows what a player sees
        env = gym.wrappers.RecordVideo(
            gym.make(env_id, frameskip=1, render_mode="rgb_array"),
            str(video_dir),
            lambda ep: ep == 0,
            name_prefix="eval",
            disable_logger=True,
        )
    # beneath the wrapper: the unclipped score of a whole game
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = AtariWrapper(env)
    env = gym.wrappers.ReshapeObservation(env, (84, 84))
    # at reset, padded with the first frame repeated
    return gym.wrappers.FrameStackObservation(env, 4)


# ---- end shared: atari/make_env ----


class QNetwork(nn.Module):
    """Nature DQN's CNN: uint8 stacks (N, 4, 84, 84) scaled to [0, 1] -> 32 8x8 filters stride 4 ->
    64 4x4 stride 2 -> 64 3x3 stride 1 -> 512 -> one Q-value per action, ReLU; PyTorch's default
    init."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, x):
        return self.network(x / 255.0)

    def get_greedy_action(self, x):
        """argmax_a Q(x, a): the exploiting action of the rollout and the policy that evaluate()
        runs."""
        return self(x).argmax(dim=-1)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def double_q_target(online_q_next, target_q_next, rewards, terminated, gamma):
    """Double Q-learning target r + gamma * Q_target(s', argmax_a' Q(s', a')) (van Hasselt et al.
    2016, eq. 4): the online network picks the next action, the target network values it; only
    termination stops the bootstrap."""
    next_actions = online_q_next.argmax(dim=1, keepdim=True)
    return rewards + gamma * target_q_next.gather(1, next_actions).squeeze(1) * (1.0 - terminated)


def q_loss(q_network, target_network, b_obs, b_next_obs, b_actions, b_rewards, b_terminated, gamma):
    """The squared TD error of the Q-values of the actions taken (MSE, as CleanRL); returns (loss,
    those Q-values)."""
    with torch.no_grad():
        target = double_q_target(
            q_network(b_next_obs), target_network(b_next_obs), b_rewards, b_terminated, gamma
        )
    q_pred = q_network(b_obs).gather(1, b_actions[:, None]).squeeze(1)
    return F.mse_loss(q_pred, target), q_pred


# ---- shared: atari/ReplayBuffer ----
class ReplayBuffer:
    """A replay buffer of frame stacks that stores each frame once: a ring of slots per env, each
    slot holding a frame (the newest of an observation), how many steps into its episode it came,
    and the step taken from it (action, reward, terminated). An episode's first frame gets a slot of
    its own (add's `first`), and its last slot holds the true final observation's frame (cut by a
    time limit or not) with no step taken from it: next_obs is always the stack ending one slot
    later. A stack never reaches back past its episode's first frame, which pads it as
    FrameStackObservation pads at reset. Only `terminated` stops the bootstrap. Checkpointable
    through state_dict()."""

    FIELDS = ("frames", "steps", "actions", "rewards", "terminated", "valid")

    def __init__(self, size: int, num_envs: int, obs_shape: tuple, rng: np.random.Generator):
        self.size = size // num_envs  # slots per env
        self.n_stack = obs_shape[0]  # frames per stack
        self.frames = np.zeros((num_envs, self.size, *obs_shape[1:]), np.uint8)
        self.steps = np.zeros((num_envs, self.size), np.int64)
        self.actions = np.zeros((num_envs, self.size), np.int64)
        self.rewards = np.zeros((num_envs, self.size), np.float32)
        self.terminated = np.zeros((num_envs, self.size), np.float32)
        # a step was taken from the slot and all its frames are kept
        self.valid = np.zeros((num_envs, self.size), bool)
        self.pos = np.zeros(num_envs, np.int64)
        self.full = np.zeros(num_envs, bool)
        self.rng = rng

    def write(self, env: int, frame, step: int):
        """Store a frame at env's cursor; the stacks of the oldest steps that reached back to the
        frame it held go."""
        p = self.pos[env]
        k = np.arange(1, self.n_stack)
        # the stacks of the steps k slots on reach back to p if their episode was k old
        ahead = (p + k) % self.size
        self.valid[env, p] = False  # no step taken from p yet
        self.valid[env, ahead] &= self.steps[env, ahead] < k
        self.frames[env, p] = frame
        self.steps[env, p] = step
        self.pos[env] = (p + 1) % self.size
        self.full[env] = self.full[env] or p + 1 == self.size

    def add(self, obs, next_obs, actions, rewards, terminated, first):
        """One step of every env. obs[i]'s newest frame is stored already (as the last next_obs)
        unless first[i]: obs[i] starts an episode."""
        for i in range(len(obs)):
            if first[i]:
                self.write(i, obs[i, -1], 0)
            t = (self.pos[i] - 1) % self.size  # the slot of obs[i]
            self.actions[i, t] = actions[i]
            self.rewards[i, t] = rewards[i]
            self.terminated[i, t] = terminated[i]
            self.write(i, next_obs[i, -1], self.steps[i, t] + 1)
            self.valid[i, t] = True

    def stacks(self, env, slot):
        """The stacks ending at slot[k] of env[k]'s ring; the frames before an episode's first are
        that first one."""
        # (batch, n_stack)
        back = np.minimum(np.arange(self.n_stack - 1, -1, -1), self.steps[env, slot][:, None])
        return self.frames[env[:, None], (slot[:, None] - back) % self.size]

    def sample(self, batch_size: int, device):
        """A uniform minibatch (obs, next_obs, actions, rewards, terminated) as tensors on
        `device`."""
        env = self.rng.integers(0, len(self.pos), batch_size)
        filled = np.where(self.full, self.size, self.pos)[env]
        slot = self.rng.integers(0, filled)
        # draw again where no step starts (episodes' last slots)
        ok = self.valid[env, slot]
        while not ok.all():
            slot[~ok] = self.rng.integers(0, filled[~ok])
            ok = self.valid[env, slot]
        batch = (
            self.stacks(env, slot),
            self.stacks(env, (slot + 1) % self.size),
            self.actions[env, slot],
            self.rewards[env, slot],
            self.terminated[env, slot],
        )
        return [torch.as_tensor(x, device=device) for x in batch]

    # tensors: torch.save pickles numpy arrays, and its pickle protocol stops at 4 GiB
    def state_dict(self):
        return {
            name: torch.from_numpy(getattr(self, name)) for name in (*self.FIELDS, "pos", "full")
        }

    def load_state_dict(self, state):
        for name, value in state.items():
            setattr(self, name, value.numpy())


# ---- end shared: atari/ReplayBuffer ----


# ---- shared: atari/evaluate ----
@torch.no_grad()
def evaluate(
    agent, env_id, episodes, seed, device="cpu", epsilon=Args.eval_epsilon, video_dir=None
):
    """Whole games (all lives) on a fresh env preprocessed as in training: a random action with
    probability epsilon (--eval-epsilon: 0.05, Nature DQN's evaluation, in the Q-learning scripts; 0
    in sac_atari.py), else agent.get_greedy_action; returns the list of unclipped game scores. With
    video_dir, game 0 is recorded there."""
    env = make_env(env_id, video_dir)
    rng = np.random.default_rng(seed)
    returns = []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        while "episode" not in info:  # RecordEpisodeStatistics's record of the game, when it ends
            if rng.random() < epsilon:
                action = int(rng.integers(env.action_space.n))
            else:
                action = int(agent.get_greedy_action(torch.as_tensor(obs, device=device)[None]))
            obs, _, terminated, truncated, info = env.step(action)
            if (terminated or truncated) and "episode" not in info:  # a life lost: the game goes on
                obs, _ = env.reset()
        returns.append(float(info["episode"]["r"]))
    env.close()
    return returns


# ---- end shared: atari/evaluate ----


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging, parameter by parameter: target <- tau * online + (1 - tau) * target
    (tau = 1: a copy)."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    q_network = QNetwork(n_actions).to(device)
    target_network = QNetwork(n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    # fused: 4x faster step
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    loss_fn = torch.compile(q_loss) if args.compile else q_loss
    rng = np.random.default_rng(args.seed)  # exploration and replay sampling
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_shape, rng)
    num_iterations = args.total_timesteps // args.num_envs  # one iteration = one step of every env
    iteration = 0

    def run_eval(video_dir=None):  # evaluation games are seeded apart from training
        return evaluate(
            q_network,
            args.env_id,
            args.eval_episodes,
            args.seed + 100_000,
            device,
            args.eval_epsilon,
            video_dir,
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
    logger = RunLogger(args, run_dir, num_iterations * args.num_envs, global_step, ckpt=ckpt)

    obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    # obs starts an episode (the buffer then stores its newest frame)
    first = np.ones(args.num_envs, dtype=bool)
    # steps of the game (all its lives) each env is playing
    game_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration, num_iterations):
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        actions = rng.integers(0, n_actions, args.num_envs)
        # the network is asked only where it acts
        exploit = rng.random(args.num_envs) >= epsilon
        if exploit.any():
            with torch.no_grad():
                greedy = q_network.get_greedy_action(torch.as_tensor(obs, device=device))
            actions = np.where(exploit, greedy.cpu().numpy(), actions)
        # ---- shared: atari/step ----
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        # same-step autoreset: store the true last observation, not the reset one
        real_next_obs = next_obs.copy()
        for i in np.flatnonzero(infos.get("_final_obs", [])):
            real_next_obs[i] = infos["final_obs"][i]
        rb.add(obs, real_next_obs, actions, rewards, terminated, first)
        # right after rb.add: on Ctrl-C the steps counted are the steps stored
        global_step += args.num_envs
        # an episode ends with a life; a game with the last one
        obs = next_obs
        first = terminated | truncated
        game_length += 1
        # RecordEpisodeStatistics's unclipped score of each game that ended
        games = infos.get("final_info", {})
        for i in np.flatnonzero(games.get("_episode", [])):  # every finished game of every sub-env
            logger.last_return = games["episode"]["r"][i]
            logger.log(
                global_step,
                {
                    "train/episodic_return": games["episode"]["r"][i],
                    "train/episodic_length": game_length[i],
                },
            )
            game_length[i] = 0
        # the bar moves before learning too
        if global_step <= args.learning_starts and iteration % 1000 == 0:
            logger.progress(global_step)
        # ---- end shared: atari/step ----

        if global_step > args.learning_starts and iteration % args.train_frequency == 0:
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (
                    1.0 - iteration / num_iterations
                )
            for _ in range(args.gradient_steps):
                loss, q_pred = loss_fn(
                    q_network, target_network, *rb.sample(args.batch_size, device), args.gamma
                )
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
        if (
            args.eval_every
            and iteration + 1 < num_iterations
            and global_step % args.eval_every < args.num_envs
        ):
            logger.evaluate(global_step, run_eval)
        if (iteration + 1) % max(
            1, args.checkpoint_every // args.num_envs
        ) == 0 or logger.stop_requested:
            logger.save_checkpoint(stateful, iteration + 1, global_step)
        if logger.stop_requested:  # Ctrl-C: the iteration it came in is finished and saved
            logger.exit_interrupted()
    envs.close()
    video_dir = run_dir / "videos" if args.capture_video else None
    eval_returns = logger.evaluate(global_step, lambda: run_eval(video_dir))
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if args.save_model:
        save_model(
            {
                "q_network": q_network.state_dict(),
                "args": asdict(args),
                "eval_returns": eval_returns,
                "n_actions": n_actions,
            },
            run_dir,
        )
    logger.close(eval_returns)


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "sac_continuous.py",
            "td3_continuous.py",
        )
    pixels = gym.spec(args.env_id).entry_point in ("ale_py.env:AtariEnv", "minatar.gym:BaseEnv")
    if not pixels or len(obs_space.shape) != 3:
        fail(
            f"{SCRIPT} needs an Atari game with image observations "
            "(ALE/<Game>-v5 or <Game>NoFrameskip-v4) or a MinAtar "
            f"game (MinAtar/<Game>-v1) but {args.env_id} is not one",
            "dqn.py",
        )
    if args.capture_video and args.env_id.startswith("MinAtar/"):
        fail("MinAtar games record no video: drop --capture-video")
    check_ranges(
        args,
        {
            "num_envs": "x >= 1",
            "batch_size": "x >= 1",
            "train_frequency": "x >= 1",
            "gradient_steps": "x >= 1",
            "target_network_frequency": "x >= 1",
            "learning_rate": "x > 0",
            "gamma": "0 <= x <= 1",
            "tau": "0 < x <= 1",
            "start_e": "0 <= x <= 1",
            "end_e": "0 <= x <= 1",
            "exploration_fraction": "0 < x <= 1",
            "learning_starts": "x >= 0",
            "buffer_size": "x >= 1",
            "eval_epsilon": "0 <= x <= 1",
        },
    )
    if args.end_e > args.start_e:
        fail(f"--end-e {args.end_e} is above --start-e {args.start_e}: epsilon is annealed down")
    if args.batch_size > min(args.buffer_size, max(args.learning_starts, 1)):
        fail(
            f"--batch-size {args.batch_size} must not exceed --learning-starts "
            f"({args.learning_starts}) or --buffer-size ({args.buffer_size}): "
            "the first minibatch is drawn when learning starts"
        )
    if args.buffer_size < 8 * args.num_envs:
        fail(
            f"--buffer-size {args.buffer_size} must be at "
            f"least 8 per env (--num-envs {args.num_envs})"
        )
    if args.total_timesteps <= args.learning_starts:
        fail(
            f"--total-timesteps {args.total_timesteps} must "
            f"exceed --learning-starts {args.learning_starts}"
        )


# ---- shared: helpers ----
SCRIPT = Path(__file__).name
ALGOS = Path(__file__).resolve().parent


def fail(msg: str, *scripts: str):
    """Bad input: one line on stderr, exit status 2. It suggests those of `scripts` that exist
    beside this one."""
    found = [s for s in scripts if s != SCRIPT and (ALGOS / s).is_file()]
    print(f"error: {msg}" + (f"; use {' or '.join(found)}" if found else ""), file=sys.stderr)
    sys.exit(2)


def other_family(env_id: str) -> tuple[str, ...]:
    """The scripts that take env_id, an id of another family of envs (Atari, MinAtar, mpe2,
    smac_lite)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        return "ppo_atari.py", "dqn_atari.py"
    if env_id.startswith("MinAtar/"):
        return "dqn_atari.py", "ddqn_atari.py"
    if re.fullmatch(r"(simple\w*|collect_treasure)_v\d+", env_id):
        return "mappo_mpe.py", "maddpg_mpe.py"
    if (
        importlib.util.find_spec("smac_lite")
        and env_id in importlib.import_module("smac_lite.maps").MAPS
    ):
        return "mappo_smac_lite.py", "qmix_smac_lite.py"
    return ()


def env_spaces(env_id: str):
    """(observation space, action space) of env_id, or a one-line error. The env is made with the
    start-up messages of ALE (its banner) and MuJoCo (compiler warnings, which it also writes to
    MUJOCO_LOG.TXT) turned off through their own settings: nothing may precede an error."""
    if env_id not in gym.registry:
        scripts = other_family(env_id)
        if scripts:
            fail(f"{env_id} is not an env of {SCRIPT}", *scripts)
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        fail(f"unknown env id '{env_id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    entry_point = str(gym.spec(env_id).entry_point)
    if entry_point.startswith("ale_py"):
        import ale_py

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    mujoco = importlib.import_module("mujoco") if "mujoco" in entry_point else None
    if mujoco:
        mujoco.set_mju_user_warning(lambda message: None)
    try:
        with warnings.catch_warnings(action="ignore"), gym.make(env_id) as env:
            return env.observation_space, env.action_space
    except Exception as e:
        reason = (str(e).strip() or " ").splitlines()[0]
        fail(f"cannot make env '{env_id}': {type(e).__name__}: {reason}")
    finally:
        if mujoco:
            mujoco.set_mju_user_warning(None)  # MuJoCo's default: print and log


# The ranges a flag may be given, by the name its error message shows (plain code, no eval).
RANGES = {
    "x >= 0": lambda x: x >= 0,
    "x >= 1": lambda x: x >= 1,
    "x >= 2": lambda x: x >= 2,
    "x > 0": lambda x: x > 0,
    "0 <= x <= 1": lambda x: 0 <= x <= 1,
    "0 < x <= 1": lambda x: 0 < x <= 1,
    "0 < x < 1": lambda x: 0 < x < 1,
}


def check_ranges(args, rules: dict):
    """Fail on a flag that is not a finite number or lies outside its range: rules maps a flag to
    one of RANGES (e.g. "0 <= x <= 1")."""
    rules = {
        "total_timesteps": "x >= 1",
        "eval_episodes": "x >= 0",
        "eval_every": "x >= 0",
        "checkpoint_every": "x >= 1",
        **rules,
    }
    for name, x in asdict(args).items():
        if isinstance(x, float) and not np.isfinite(x):
            fail(f"--{name.replace('_', '-')} {x} is not a finite number")
    for name, rule in rules.items():
        x = getattr(args, name)
        if x is not None and not RANGES[rule](x):
            fail(f"--{name.replace('_', '-')} {x} is out of range: it must satisfy {rule}")


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def start_run(args, check_args):
    """Resume (--resume DIR), check the flags, choose the run directory (a new run never writes
    into one that holds files), seed everything. Returns (args, checkpoint, dir)."""
    ckpt = None
    if args.resume:
        args, ckpt = resume_run(args)
    check_args(args)
    if args.track:
        check_wandb()
    # SDL warns on every render without it
    if args.capture_video and not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="canonrl-xdg-")
    name = f"{args.env_id.replace('/', '-')}__{SCRIPT[:-3]}__{args.seed}__{time.time():.0f}"
    run_dir = Path(args.run_dir or f"runs/{name}")
    if run_dir.exists() and not run_dir.is_dir():
        fail(f"--run-dir {run_dir} is a file; pass a directory")
    if ckpt is None and run_dir.is_dir() and any(run_dir.iterdir()):
        if (run_dir / "metrics.csv").is_file():
            fail(
                f"--run-dir {run_dir} holds a run; continue it "
                f"with --resume {run_dir} or choose a new --run-dir"
            )
        fail(f"--run-dir {run_dir} is not empty and holds no run; choose a new --run-dir")
    check_writable(run_dir)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # 1: fastest for small nets
    torch.set_num_threads(1 if args.torch_deterministic else torch.get_num_threads())
    return args, ckpt, run_dir


def resume_run(args):
    """--resume DIR: the run's saved flags and its checkpoint, which is data: its SHA-256 must match
    checkpoint.sha256, and it is read with weights_only=True. A flag given now that differs from
    the saved one is ignored, except --total-timesteps, which extends the run."""
    path = Path(args.resume) / "checkpoint.pt"
    if not path.is_file():
        fail(f"no checkpoint at {path}; pass the run directory of an earlier {SCRIPT} run")
    try:
        if sha256(path) != (path.parent / "checkpoint.sha256").read_text().strip():
            raise ValueError("its SHA-256 differs from checkpoint.sha256")
        ckpt = torch.load(path, weights_only=True)
        saved = Args(**ckpt["args"])
    except Exception as e:
        fail(
            f"{path} is corrupt or not a {SCRIPT} checkpoint "
            f"({type(e).__name__}); delete it or start anew"
        )
    changed = []
    for name, value in asdict(args).items():
        if name in ("resume", "run_dir") or value == getattr(saved, name):
            continue
        if name in given_flags() or value != getattr(Args(), name):
            changed.append(name)
    if "total_timesteps" in changed:
        if args.total_timesteps < ckpt["global_step"]:
            fail(
                f"--total-timesteps {args.total_timesteps} is below "
                f"the {ckpt['global_step']} steps already done"
            )
        print(
            f"resume: --total-timesteps {args.total_timesteps} (was {saved.total_timesteps})",
            file=sys.stderr,
        )
        saved.total_timesteps = args.total_timesteps
    elif ckpt["finished"]:
        print(f"the run in {path.parent} is finished; give a larger --total-timesteps to extend it")
        sys.exit(0)
    ignored = [f"--{name.replace('_', '-')}" for name in changed if name != "total_timesteps"]
    if ignored:
        print(
            f"resume: the run's saved flags are kept; ignored: {' '.join(ignored)}",
            file=sys.stderr,
        )
    saved.resume = str(path.parent)
    saved.run_dir = str(path.parent)
    check_metrics(path.parent / "metrics.csv")
    return saved, ckpt


def given_flags() -> set[str]:
    """The Args fields named on the command line (--name, --name=value, --no-name): on --resume, a
    flag given there counts even when its value is the default."""
    names = set()
    for token in sys.argv[1:]:
        if token.startswith("--"):
            name = token[2:].split("=")[0].replace("-", "_")
            names.add(name)
            names.add(name.removeprefix("no_"))
    return names


def check_metrics(path: Path):
    """Fail on a line of metrics.csv that is not global_step,wall_time,name,value (before --resume
    rewrites it)."""
    lines = path.read_text().splitlines()[1:] if path.is_file() else []
    for number, line in enumerate(lines, start=2):
        fields = line.split(",")
        if len(fields) != 4 or not fields[0].isdigit():
            fail(
                f"{path} line {number} is not 'global_step,wall_time,name,value'; "
                "delete that line and resume again"
            )


def check_wandb():
    """--track needs a wandb login, or WANDB_MODE=offline: checked before anything is written."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    try:
        settings = wandb_setup.singleton().settings
    except Exception as e:
        fail(f"--track: wandb cannot start ({type(e).__name__}: {str(e).strip().splitlines()[0]})")
    if settings.mode in ("offline", "dryrun", "disabled"):
        return
    if not (
        os.getenv("WANDB_API_KEY")
        or wbauth.read_netrc_auth(host=settings.base_url)
        or settings.api_key
    ):
        fail(
            "--track needs a wandb login: run `wandb login`, "
            "or set WANDB_MODE=offline to log to files only"
        )


def check_writable(run_dir: Path):
    """Fail unless files can be written in run_dir; the folders made to find out are removed
    again."""
    made = [p for p in [run_dir, *run_dir.parents] if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as e:
        fail(
            f"--run-dir {run_dir} cannot be written "
            f"({e.strerror or type(e).__name__}); choose another --run-dir"
        )
    finally:
        for p in made:
            # only empty folders go; another process (a rank of the same job) may have removed
            # or filled one meanwhile
            try:
                p.rmdir()
            except OSError:
                pass


def finite(state) -> bool:
    """True when every floating-point tensor of a (nested) state_dict is finite."""
    if isinstance(state, dict):
        return all(finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(finite(v) for v in state)
    if torch.is_tensor(state) and state.is_floating_point():
        return bool(torch.isfinite(state).all())
    return True


def load_states(stateful: dict, ckpt: dict, run_dir: Path):
    """Resume every object of `stateful` ({name: object with load_state_dict}) from the
    checkpoint."""
    for name, obj in stateful.items():
        # a buffer may hold unwritten slots
        weights = isinstance(obj, (torch.nn.Module, torch.optim.Optimizer))
        if weights and not finite(ckpt.get(name)):
            fail(f"{run_dir / 'checkpoint.pt'} holds non-finite values in {name}; start anew")
        try:
            obj.load_state_dict(ckpt[name])
        except Exception as e:
            fail(
                f"{run_dir / 'checkpoint.pt'} does not fit this "
                f"run's {name} ({type(e).__name__}); start anew"
            )


def save_with_digest(state: dict, path: Path):
    """torch.save(state) to path, written then renamed (a crash never leaves half a file), and its
    SHA-256 beside it (checkpoint.pt: checkpoint.sha256, model.pt: model.sha256): a file is checked
    against it before it is read."""
    torch.save(state, path.with_suffix(".tmp"))
    digest = sha256(path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    path.with_suffix(".sha256").write_text(digest + "\n")


def save_model(state: dict, run_dir: Path):
    """model.pt: the weights and what evaluation needs (numpy arrays as tensors, so that
    torch.load(weights_only=True) reads it), with its SHA-256 in model.sha256."""
    save_with_digest(plain(state), run_dir / "model.pt")


def plain(obj):
    """obj with numpy arrays as tensors and numpy scalars as numbers: what
    torch.load(weights_only=True) reads."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def by_name(results) -> dict:
    """Evaluation results as {metric name: one value per episode}; a list of returns is
    eval/episodic_return."""
    return results if isinstance(results, dict) else {"eval/episodic_return": results}


class RNGs:
    """torch's global generator and the given numpy Generators, checkpointed as one object."""

    def __init__(self, *np_rngs: np.random.Generator):
        self.np_rngs = np_rngs

    def state_dict(self):
        return {
            "torch": torch.get_rng_state(),
            "numpy": [rng.bit_generator.state for rng in self.np_rngs],
        }

    def load_state_dict(self, state):
        torch.set_rng_state(state["torch"])
        for rng, rng_state in zip(self.np_rngs, state["numpy"], strict=True):
            rng.bit_generator.state = rng_state


def write_config(args, run_dir: Path):
    """config.json: every flag, the script, the git commit of algos/ (if any), package versions."""
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ALGOS)
    config = {
        "script": SCRIPT,
        "args": asdict(args),
        "git_commit": git.stdout.strip() or None,
        "versions": {p: version(p) for p in ("torch", "gymnasium", "numpy")},
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))


class RunLogger:
    """What a run shows and leaves behind: config.json, metrics.csv (global_step, wall_time, name,
    value; append-only), TensorBoard events, a wandb run with --track, the progress bar,
    checkpoint.pt. Resuming drops the rows logged after the checkpoint (those steps are redone): no
    step is logged twice. The training clock stops during evaluations. Ctrl-C sets stop_requested:
    the script finishes its iteration, saves it and calls exit_interrupted()."""

    def __init__(self, args, run_dir: Path, total: int, step: int, ckpt: dict | None):
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / "metrics.csv"
        header = "global_step,wall_time,name,value\n"
        if ckpt is not None:  # keep the rows up to the checkpoint's step
            lines = metrics.read_text().splitlines(keepends=True)[1:] if metrics.is_file() else []
            kept = [line for line in lines if int(line.split(",")[0]) <= step]
            (run_dir / "metrics.tmp").write_text(header + "".join(kept))
            os.replace(run_dir / "metrics.tmp", metrics)
        else:
            write_config(args, run_dir)
            metrics.write_text(header)
        if total != args.total_timesteps:
            print(
                f"{total:,} steps will run: whole iterations up "
                f"to --total-timesteps {args.total_timesteps:,}"
            )
        self.args = args
        self.run_dir = run_dir
        self.wandb = None
        if args.track:  # every row of metrics.csv is one wandb row, plotted against global_step
            import wandb

            self.wandb = wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                config=asdict(args),
                name=run_dir.name,
                dir=str(run_dir),
                id=run_dir.name,
                resume="allow",
            )
            self.wandb.define_metric("global_step")
            self.wandb.define_metric("*", step_metric="global_step")
        self.file = open(metrics, "a", newline="")
        self.csv = csv.writer(self.file, lineterminator="\n")
        self.tb = SummaryWriter(str(run_dir))
        self.bar = tqdm(total=total, initial=step, unit="step", mininterval=1.0)
        self.first_step = step
        self.start = time.time()
        self.eval_seconds = 0.0
        self.last_return = float("nan")
        # of the run resumed
        self.seconds_before = ckpt.get("train_seconds", 0.0) if ckpt is not None else 0.0
        self.stop_requested = False
        self.duration_said = False
        signal.signal(signal.SIGINT, self.request_stop)

    def request_stop(self, *_):
        self.stop_requested = True
        # a second Ctrl-C stops at once, unsaved
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(
            "\nCtrl-C: stopping after this iteration (again: at once, without saving it)",
            file=sys.stderr,
        )

    def log(self, step: int, metrics: dict, to_wandb: bool = True):
        """One row per metric in metrics.csv and TensorBoard; one wandb row for them all. A
        non-finite loss stops the run (the weights have diverged) before it is written; the last
        checkpoint is kept."""
        values = {}
        for name, value in metrics.items():
            # a loss may require grad
            values[name] = float(value.detach() if torch.is_tensor(value) else value)
            if (
                name.startswith("losses/")
                and name != "losses/explained_variance"
                and not np.isfinite(values[name])
            ):
                self.close_files()
                fail(
                    f"{name} is {values[name]} at step {step}: training diverged; "
                    f"{self.run_dir} keeps its last checkpoint (try a lower --learning-rate)"
                )
        for name, value in values.items():
            self.csv.writerow([step, f"{time.time():.3f}", name, repr(value)])
            self.tb.add_scalar(name, value, step)
        self.file.flush()
        if self.wandb is not None and to_wandb:
            self.wandb.log({"global_step": step, **values})

    def train_seconds(self) -> float:
        """Seconds of training (evaluations excluded), those of the run resumed included."""
        return self.seconds_before + time.time() - self.start - self.eval_seconds

    def progress(self, step: int):
        """Log charts/sps (environment steps per training second) and update the progress bar."""
        seconds = time.time() - self.start - self.eval_seconds  # training, in this process
        sps = int((step - self.first_step) / max(seconds, 1e-9))
        self.log(step, {"charts/sps": sps})
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(sps=sps, ret=f"{self.last_return:.1f}", refresh=False)
        if not self.duration_said and seconds > 20:
            self.duration_said = True
            hours = (self.bar.total - step) / max(sps, 1) / 3600
            if hours > 1:
                self.bar.write(
                    f"at {sps:,} steps/s the rest of this run takes about "
                    f"{hours:.1f} hours here; --total-timesteps sets the budget"
                )

    def evaluate(self, step: int, run_episodes):
        """Log charts/train_seconds, then one row per episode of run_episodes(): a list of episodic
        returns (logged as eval/episodic_return) or a dict {metric name: one value per episode}
        (multi-agent: team return, win)."""
        self.log(step, {"charts/train_seconds": self.train_seconds()})
        start = time.time()
        results = run_episodes()
        self.eval_seconds += time.time() - start
        returns = by_name(results).get("eval/episodic_return", [])
        if len(returns):  # the progress bar's ret= (all the offline scripts show)
            self.last_return = float(np.mean(returns))
        for name, values in by_name(results).items():
            for value in values:
                self.log(step, {name: value}, to_wandb=False)
            # wandb keeps one value per step: the mean, and a histogram
            if self.wandb is not None and len(values):
                import wandb

                self.wandb.log(
                    {
                        "global_step": step,
                        name: float(np.mean(values)),
                        f"{name}_histogram": wandb.Histogram(np.asarray(values, dtype=np.float64)),
                    }
                )
        return results

    def save_checkpoint(
        self, stateful: dict, iteration: int, global_step: int, finished: bool = False
    ):
        """checkpoint.pt: the flags, the counters and the state_dict() of every object of
        `stateful`, written then renamed (a crash never leaves half a checkpoint), and its SHA-256
        in checkpoint.sha256."""
        state = {
            "args": asdict(self.args),
            "iteration": iteration,
            "global_step": global_step,
            "finished": finished,
            "train_seconds": self.train_seconds(),
            **{name: obj.state_dict() for name, obj in stateful.items()},
        }
        save_with_digest(plain(state), self.run_dir / "checkpoint.pt")

    def close_files(self):
        self.bar.close()
        self.file.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

    def exit_interrupted(self):
        self.close_files()
        print(f"interrupted: metrics kept, resume with --resume {self.run_dir}", file=sys.stderr)
        sys.exit(130)

    def close(self, results):
        """Close the files; the last lines say the evaluation, where the run is and how it compares
        with the script's reference."""
        self.bar.update(self.bar.total - self.bar.n)
        self.close_files()
        for name, values in by_name(results).items():
            if len(values):
                mean = np.mean(values)
                std = np.std(values)
                print(f"{name}: {mean:.2f} +- {std:.2f} over {len(values)} episodes")
        saved = "model.pt, checkpoint.pt" if self.args.save_model else "checkpoint.pt"
        print(f"run saved in {self.run_dir} ({saved})")
        self.compare_with_reference(by_name(results))

    def compare_with_reference(self, results: dict):
        """Print our multi-seed reference of this script and env (of the budget nearest this run's),
        when benchmark/references.toml is beside algos/, and where this run's evaluation lies."""
        path = ALGOS.parent / "benchmark" / "references.toml"
        refs = tomllib.loads(path.read_text())["reference"] if path.is_file() else []
        refs = [r for r in refs if "values" in r and self.same_setting(r)]
        refs = [r for r in refs if r["score"] in ("final_eval", "final_win_rate")]
        if not refs:
            print(f"no reference for {SCRIPT} on {self.args.env_id} to compare with")
            return
        budget = self.args.total_timesteps
        r = min(refs, key=lambda r: abs(r["total_timesteps"] - budget))
        values = r["values"]
        print(
            f"reference {r['id']} ({r['total_timesteps']:,} steps, {r['score']}, "
            f"{len(values)} seeds): {np.mean(values):.2f} +- {np.std(values):.2f}, "
            f"seeds from {min(values):.2f} to {max(values):.2f}"
        )
        wanted = "win" if r["score"] == "final_win_rate" else "episodic_return"
        name = next((n for n in results if wanted in n), None)
        if name is None or not len(results[name]):
            return
        mean = float(np.mean(results[name]))
        if r["total_timesteps"] != budget:
            print(f"this run: {mean:.2f} after {budget:,} steps: another budget, not compared")
        elif min(values) <= mean <= max(values):
            print(f"this run: {mean:.2f}, within the reference's seeds")
        else:
            side = "below" if mean < min(values) else "above"
            print(f"this run: {mean:.2f}, {side} every seed of the reference")

    def same_setting(self, reference: dict) -> bool:
        """True for a reference of this script and env (and, for an offline script, of this
        dataset)."""
        if (reference["script"], reference["env_id"]) != (SCRIPT, self.args.env_id):
            return False
        flags = reference.get("flags", [])
        if not hasattr(self.args, "dataset") or "--dataset" not in flags:
            return True
        ours = Path(self.args.dataset)  # a directory, or an id such as canonrl/cartpole/medium-v0
        theirs = Path(flags[flags.index("--dataset") + 1]).name  # runs/datasets/cartpole-medium-v0
        return theirs in (ours.name, "-".join(ours.parts[-2:]))


# ---- end shared: helpers ----


if __name__ == "__main__":
    main(tyro.cli(Args))
