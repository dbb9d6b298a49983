"""PPO on Atari (ALE/Breakout-v5 by default) across processes: ppo_atari.py under torchrun.

ppo_atari.py's algorithm and defaults. Each rank (one per GPU, or CPU process) steps its own
--num-envs envs and the gradients are averaged over ranks before each step: an update's batch is
world_size x num_envs x num_steps, and the global step counts all ranks' steps. Rank 0 alone logs,
evaluates and writes the run (see the comment above said_by_rank_0). NCCL between GPUs with --cuda,
gloo between CPU processes without it.

Run:    torchrun --standalone --nproc_per_node=2 algos/ppo_atari_multigpu.py --seed 1 --cuda
Quick:  torchrun --standalone --nproc_per_node=2 algos/ppo_atari_multigpu.py \
            --total-timesteps 4096 --eval-episodes 2
Results: benchmark/references.toml
"""

import contextlib
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
import torch.distributed as dist
import torch.nn as nn
import tyro
from stable_baselines3.common.atari_wrappers import AtariWrapper
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

gym.register_envs(ale_py)  # the ALE/<Game>-v5 and <Game>NoFrameskip-v4 ids


@dataclass
class Args:
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = False
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 128
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    num_minibatches: int = 4
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 4
    """epochs over each rollout"""
    clip_coef: float = 0.1
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's values by the clip coefficient (ppo2, CleanRL)"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    compile: bool = False
    """torch.compile the loss and its backward: ~1.4x faster updates on a CPU, ~15 s to compile"""
    target_kl: float | None = None
    """stop the epochs of an update early when the approximate KL exceeds this"""
    env_id: str = "ALE/Breakout-v5"
    """an Atari game: ALE/<Game>-v5 (sticky actions) or <Game>NoFrameskip-v4"""
    total_timesteps: int = 10_000_000
    """environment steps over all envs of all ranks (agent steps: 4 frames each)"""
    num_envs: int = 8
    """parallel environments of each rank (one synchronous vector env per rank)"""
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


def make_env(env_id, video_dir=None):
    """env_id preprocessed; with video_dir, game 0 is recorded there, unprocessed, as
    eval-episode-0.mp4."""
    # v5's sticky actions
    env = gym.make(env_id, frameskip=1, render_mode=None if video_dir is None else "rgb_array")
    if video_dir is not None:  # the raw game, every frame: what a viewer wants to see
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), lambda ep: ep == 0, name_prefix="eval", disable_logger=True
        )
    # beneath the wrapper: the unclipped score of a whole game
    env = gym.wrappers.RecordEpisodeStatistics(env)
    # no-ops, skip 4 and max-pool, a lost life ends the episode, FIRE, 84x84 gray, clip
    env = AtariWrapper(env)
    env = gym.wrappers.ReshapeObservation(env, (84, 84))
    # at reset, padded with the first frame repeated
    return gym.wrappers.FrameStackObservation(env, 4)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature DQN's CNN shared by both heads, as in CleanRL and SB3: uint8 stacks (N, 4, 84, 84)
    scaled to [0, 1] -> 32 8x8 filters stride 4 -> 64 4x4 stride 2 -> 64 3x3 stride 1 -> 512 (ReLU)
    -> logits / value."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        # std 0.01: a near-uniform first policy
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0)).squeeze(-1)

    def get_greedy_action(self, x):
        """The most probable action: the policy that evaluate() runs."""
        return self.actor(self.network(x / 255.0)).argmax(dim=-1)

    def get_action_and_value(self, x, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the entropy
        and V(x)."""
        hidden = self.network(x / 255.0)
        dist = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden).squeeze(-1)


# ---- shared: gae/compute_gae ----
def compute_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """GAE (Schulman et al. 2016, eq. 16) on tensors of shape (T, N). dones[t]: the episode ended at
    step t (terminated or truncated; a truncation was already bootstrapped into rewards[t]). Returns
    (advantages, returns)."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        next_values = next_value if t == len(rewards) - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * nonterminal - values[t]
        advantages[t] = last = delta + gamma * gae_lambda * nonterminal * last
    return advantages, advantages + values


# ---- end shared: gae/compute_gae ----


# ---- shared: bootstrap/bootstrap_time_limits ----
def bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, gamma):
    """A time limit is not part of the task (Pardo et al. 2018): where an episode was truncated, add
    gamma * V(s_final) to its last reward, one value_fn call for all (same-step autoreset keeps
    s_final in infos["final_obs"])."""
    idx = np.flatnonzero(truncated & ~terminated)
    if len(idx) == 0:
        return reward
    return reward + np.bincount(
        idx, gamma * value_fn(np.stack(infos["final_obs"][idx])), len(reward)
    )


# ---- end shared: bootstrap/bootstrap_time_limits ----


# ---- shared: ppo/ppo_loss ----
def ppo_loss(
    logprob,
    entropy,
    value,
    old_logprobs,
    old_values,
    advantages,
    returns,
    clip_coef,
    ent_coef,
    vf_coef,
    clip_vloss: float | None = None,
    mask=None,
):
    """Clipped surrogate objective (PPO paper, eq. 7) + value MSE - entropy bonus, from a
    minibatch's new log-probabilities, entropies and values; returns (loss, statistics). clip_vloss:
    the value error is the larger of V's and that of V kept within clip_vloss of old_values
    (baselines' ppo2, CleanRL); None: not clipped. mask: each term averaged over the entries where
    it is 1 only (multi-agent: living agents); None: over all."""
    mean = (
        (lambda x: x.mean())
        if mask is None
        else (lambda x: (x * mask).sum() / mask.sum().clamp(min=1))
    )
    logratio = logprob - old_logprobs
    ratio = logratio.exp()
    pg_loss = -mean(
        torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    )
    v_error = (value - returns) ** 2
    if clip_vloss is not None:
        v_error = torch.max(
            v_error,
            (old_values + (value - old_values).clamp(-clip_vloss, clip_vloss) - returns) ** 2,
        )
    v_loss = 0.5 * mean(v_error)
    entropy = mean(entropy)
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy
    # approx_kl: the k3 estimator of Schulman's note "Approximating KL divergence"
    with torch.no_grad():
        stats = {
            "policy_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": mean((ratio - 1) - logratio),
            "clipfrac": mean(((ratio - 1).abs() > clip_coef).float()),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


# ---- end shared: ppo/ppo_loss ----


def minibatch_loss(
    agent,
    obs,
    actions,
    old_logprobs,
    old_values,
    advantages,
    returns,
    clip_coef,
    ent_coef,
    vf_coef,
    clip_vloss,
):
    """The agent's forward pass on a minibatch and ppo_loss: the function --compile compiles."""
    _, logprob, entropy, value = agent.get_action_and_value(obs, actions)
    return ppo_loss(
        logprob,
        entropy,
        value,
        old_logprobs,
        old_values,
        advantages,
        returns,
        clip_coef,
        ent_coef,
        vf_coef,
        clip_vloss,
    )


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy (argmax) whole games (all lives) on a fresh env preprocessed as in training; returns
    the list of unclipped game scores."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        while "episode" not in info:  # RecordEpisodeStatistics's record of the game, when it ends
            action = agent.get_greedy_action(torch.as_tensor(obs, device=device)[None])
            obs, _, terminated, truncated, info = env.step(int(action))
            if (terminated or truncated) and "episode" not in info:  # a life lost: the game goes on
                obs, _ = env.reset()
        returns.append(float(info["episode"]["r"]))
    env.close()
    return returns


def main(args: Args):
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # torchrun's environment; without torchrun: one process
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # bad input stops every rank before the process group starts; rank 0 alone says why
    with said_by_rank_0():
        # on every rank: the same flags, checks, seeds and checkpoint
        args, ckpt, run_dir = start_run(args, check_args)
        if (
            ckpt is not None
            and ckpt["global_step"]
            != ckpt["iteration"] * world_size * args.num_envs * args.num_steps
        ):
            ran = ckpt["global_step"] // (ckpt["iteration"] * args.num_envs * args.num_steps)
            fail(
                f"{run_dir} ran {ran} process(es), not {world_size}; "
                "resume it with as many (torchrun --nproc_per_node)"
            )
    device = (
        torch.device("cuda", local_rank)
        if torch.cuda.is_available() and args.cuda
        else torch.device("cpu")
    )
    if world_size > 1:
        join_process_group(device)
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    agent = Agent(n_actions).to(device)
    # fused: 4x faster
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    loss_fn = torch.compile(minibatch_loss) if args.compile else minibatch_loss
    batch_size = args.num_envs * args.num_steps  # each rank's rollout
    global_batch = world_size * batch_size  # the steps of one update, all ranks together
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // global_batch
    iteration = 0

    def run_eval(video_dir=None):  # evaluation games are seeded apart from training
        return evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    # what a checkpoint holds, saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    # the same initial weights on every rank, then each its own actions (rank 0's: those of
    # ppo_atari.py)
    if rank > 0:
        torch.manual_seed(args.seed + 10_000 * rank + iteration)
    check_same_weights(agent, world_size, device)
    global_step = iteration * global_batch
    if rank == 0:
        print(
            f"{world_size} process(es) x {args.num_envs} envs x {args.num_steps} steps = "
            f"{global_batch:,} steps per update (minibatches of {minibatch_size} per process); "
            f"{num_iterations:,} updates to --total-timesteps {args.total_timesteps:,} over all "
            "processes" + (", the learning rate annealed over them" if args.anneal_lr else "")
        )
    logger = (
        RunLogger(args, run_dir, num_iterations * global_batch, global_step, ckpt=ckpt)
        if rank == 0
        else QuietLogger()
    )

    @torch.no_grad()
    def value_fn(obs):  # V(obs) of a numpy batch of final observations
        return (
            agent.get_value(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()
        )

    obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    # a resumed run: fresh episodes
    next_obs, _ = envs.reset(seed=args.seed + global_step + rank * args.num_envs)
    # steps of the game (all its lives) each env is playing
    game_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration + 1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = (
            frac * args.learning_rate if args.anneal_lr else args.learning_rate
        )
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef
        for step in range(args.num_steps):
            obs[step] = torch.as_tensor(next_obs, device=device)
            with torch.no_grad():
                actions[step], logprobs[step], _, values[step] = agent.get_action_and_value(
                    obs[step]
                )
            next_obs, reward, terminated, truncated, infos = envs.step(actions[step].cpu().numpy())
            global_step += world_size * args.num_envs  # every rank steps its envs at once
            reward = bootstrap_time_limits(
                reward, terminated, truncated, infos, value_fn, args.gamma
            )
            rewards[step] = torch.as_tensor(reward)
            dones[step] = torch.as_tensor(terminated | truncated)
            game_length += 1
            # RecordEpisodeStatistics's unclipped score of each game that ended
            games = infos.get("final_info", {})
            # every finished game of every sub-env
            for i in np.flatnonzero(games.get("_episode", [])):
                logger.last_return = games["episode"]["r"][i]
                logger.log(
                    global_step,
                    {
                        "train/episodic_return": games["episode"]["r"][i],
                        "train/episodic_length": game_length[i],
                    },
                )
                game_length[i] = 0
        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, device=device))
        advantages, returns = compute_gae(
            rewards, values, dones, next_value, args.gamma, args.gae_lambda
        )
        b_obs = obs.flatten(0, 1)
        b_actions = actions.flatten(0, 1)
        b_logprobs = logprobs.flatten(0, 1)
        b_advantages = advantages.flatten(0, 1)
        b_returns = returns.flatten(0, 1)
        b_values = values.flatten(0, 1)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                mb = perm[start : start + minibatch_size]
                mb_advantages = (b_advantages[mb] - b_advantages[mb].mean()) / (
                    b_advantages[mb].std() + 1e-8
                )
                loss, stats = loss_fn(
                    agent,
                    b_obs[mb],
                    b_actions[mb],
                    b_logprobs[mb],
                    b_values[mb],
                    mb_advantages,
                    b_returns[mb],
                    clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                    clip_coef if args.clip_vloss else None,
                )
                optimizer.zero_grad()
                loss.backward()
                if world_size > 1:
                    average_gradients(agent.parameters(), world_size)
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if (
                args.target_kl is not None
                and mean_over_ranks(stats["approx_kl"], world_size) > args.target_kl
            ):
                break  # on every rank at once: they take the same number of steps
        # nan: constant returns
        stats["explained_variance"] = 1 - (b_returns - b_values).var() / b_returns.var()
        # rank 0 logs them
        stats = dict(zip(stats, mean_over_ranks(torch.stack(list(stats.values())), world_size)))
        # a Ctrl-C that reached any rank (before this all-reduce; a later one: next iteration) stops
        # every rank now
        stop = bool(
            mean_over_ranks(torch.tensor(float(logger.stop_requested), device=device), world_size)
            > 0
        )
        logger.log(
            global_step,
            {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        if (
            args.eval_every
            and iteration < num_iterations
            and global_step % args.eval_every < global_batch
        ):
            logger.evaluate(global_step, run_eval)
        if iteration % max(1, args.checkpoint_every // global_batch) == 0 or stop:
            check_same_weights(agent, world_size, device)
            logger.save_checkpoint(stateful, iteration, global_step)
        if stop:  # Ctrl-C: the iteration it came in is finished and saved
            logger.exit_interrupted()
    envs.close()
    # the barrier: no rank tears the group down while another is still in the last all-reduce
    # (gloo aborts it then). No collective after it: the other ranks end while rank 0 evaluates
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    video_dir = run_dir / "videos" if args.capture_video else None
    eval_returns = logger.evaluate(global_step, lambda: run_eval(video_dir))
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if args.save_model and rank == 0:
        save_model(
            {
                "agent": agent.state_dict(),
                "args": asdict(args),
                "eval_returns": eval_returns,
                "n_actions": n_actions,
            },
            run_dir,
        )
    logger.close(eval_returns)


# Distributed: torchrun starts one process (rank) per GPU (or per CPU worker). Every rank steps its
# own --num-envs envs (seeded apart: rank r's envs take seeds seed + r * num_envs onwards), computes
# the gradients of its own minibatches, and the gradients are averaged over the ranks before each
# optimizer step, so every rank takes the same step and holds the same weights (checked at the start
# and at every checkpoint). The effective batch of an update is world_size * num_envs * num_steps
# steps, each rank's minibatch num_envs * num_steps / num_minibatches; --total-timesteps and the
# global step count the steps of all ranks, and the learning rate is annealed over total_timesteps /
# (world_size * num_envs * num_steps) updates: N ranks run the same steps in 1/N of the updates of
# one. Rank 0 alone logs (its own envs' games; the losses averaged over the ranks), evaluates and
# writes the run directory (config.json, metrics.csv, checkpoint.pt, model.pt); the others wait for
# it at the next update. A resumed run loads rank 0's checkpoint on every rank (on several machines,
# the run directory must be at the same path on each: a shared file system). Ctrl-C (torchrun passes
# it to every rank) stops every rank after the same iteration, saved by rank 0; a rank that dies
# ends the job: torchrun stops the others and exits non-zero. Bad flags stop every rank before the
# process group starts, rank 0 alone printing the one-line error. The ranks exit 2 (bad flags) or
# 130 (Ctrl-C), but torchrun's own status is 1 after any rank's failure or a Ctrl-C, with its own
# traceback (ChildFailedError or SignalException). Without torchrun (no WORLD_SIZE in the
# environment) it is one process, ppo_atari.py step for step.


@contextlib.contextmanager
def said_by_rank_0():
    """Drop what the block prints on ranks other than 0 (torchrun's RANK): every rank parses and
    checks the flags and stops on bad ones, and one copy of the message is enough. A traceback is
    still printed on every rank."""
    if int(os.environ.get("RANK", "0")) == 0:
        yield
        return
    with (
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
        contextlib.redirect_stderr(devnull),
    ):
        yield


def join_process_group(device: torch.device):
    """Join the process group torchrun's environment describes (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT): NCCL between GPUs, gloo between CPU processes. The barrier: no rank writes the run
    directory before every rank has checked it (start_run)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        device_id=device if device.type == "cuda" else None,
    )
    dist.barrier()


def mean_over_ranks(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """x averaged over the ranks (one all-reduce); x itself in one process."""
    if world_size == 1:
        return x
    x = x.clone()
    dist.all_reduce(x)
    return x.div_(world_size)


def average_gradients(params, world_size: int):
    """Replace every rank's gradients by their mean over the ranks, with one all-reduce of them all,
    flattened. This is what DistributedDataParallel computes (in buckets, overlapped with the
    backward pass); an explicit all-reduce keeps Agent, its methods and --compile exactly as in
    ppo_atari.py (DDP only syncs through forward(), which the agent's get_action_and_value is not),
    and one all-reduce of 1.7M floats per minibatch is cheap."""
    grads = [p.grad for p in params]
    flat = mean_over_ranks(torch.cat([g.flatten() for g in grads]), world_size)
    for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(mean.view_as(grad))


def check_same_weights(agent: nn.Module, world_size: int, device: torch.device):
    """Raise unless every rank holds bit-identical parameters (64 bits of a SHA-256 of their bytes,
    gathered)."""
    if world_size == 1:
        return
    digest = hashlib.sha256(
        b"".join(p.detach().cpu().numpy().tobytes() for p in agent.parameters())
    ).digest()
    mine = torch.tensor(int.from_bytes(digest[:8], "little", signed=True), device=device)
    every = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    if any(d != mine for d in every):
        raise RuntimeError(
            f"the ranks hold different weights (rank {dist.get_rank()}: {mine.item():x}); a "
            "rank resumed from another checkpoint, or the ranks' hardware computes differently"
        )


class QuietLogger:
    """What ranks other than 0 hold in place of the RunLogger: they log, evaluate and save nothing
    (rank 0 does so for the run). A Ctrl-C that reaches one of them (torchrun passes it to every
    rank) stops the run as on rank 0."""

    def __init__(self):
        self.stop_requested = False
        self.last_return = float("nan")
        signal.signal(signal.SIGINT, self.request_stop)

    def request_stop(self, *_):
        self.stop_requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once

    def log(self, *args, **kwargs):  # and progress, save_checkpoint, close: nothing to write
        pass

    progress = save_checkpoint = close = log

    def evaluate(self, step: int, run_episodes):
        return []

    def exit_interrupted(self):
        sys.exit(130)


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "ppo_continuous.py",
        )
    if gym.spec(args.env_id).entry_point != "ale_py.env:AtariEnv" or len(obs_space.shape) != 3:
        fail(
            f"{SCRIPT} needs an Atari game with image observations (ALE/<Game>-v5 "
            f"or <Game>NoFrameskip-v4) but {args.env_id} is not one",
            "ppo.py",
        )
    check_ranges(
        args,
        {
            "num_envs": "x >= 1",
            "num_steps": "x >= 1",
            "num_minibatches": "x >= 1",
            "update_epochs": "x >= 1",
            "learning_rate": "x > 0",
            "gamma": "0 <= x <= 1",
            "gae_lambda": "0 <= x <= 1",
            "clip_coef": "x > 0",
            "ent_coef": "x >= 0",
            "vf_coef": "x >= 0",
            "max_grad_norm": "x > 0",
            "target_kl": "x > 0",
        },
    )
    batch = args.num_envs * args.num_steps
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if batch % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does "
            f"not divide the batch num_envs*num_steps = {batch}"
        )
    if args.total_timesteps < world_size * batch:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout of all "
            f"{world_size} processes (world_size*num_envs*num_steps = {world_size * batch})"
        )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.cuda and torch.cuda.is_available() and local_world > torch.cuda.device_count():
        fail(
            f"--cuda needs a GPU per process: {local_world} processes "
            f"on this machine, {torch.cuda.device_count()} GPUs; use "
            f"torchrun --nproc_per_node={torch.cuda.device_count()}"
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
    # a flag that cannot be parsed (and --help): printed once, not once per rank
    with said_by_rank_0():
        cli_args = tyro.cli(Args)
    main(cli_args)
