"""QMIX on smac_lite (3m by default): value decomposition with a monotonic mixing network.

Rashid et al. 2018, "QMIX: Monotonic Value Function Factorisation for Deep Multi-Agent RL": one GRU
Q-network shared by the agents (observation, last action, id), mixed by a network whose non-negative
weights come from hypernetworks of the state, so each agent's argmax is the joint argmax. pymarl's
details: whole episodes replayed, double-Q targets, a target copy every 200 updates, epsilon-greedy
over available actions, clip 10. Deviation: episodes are drawn with replacement.

Run:    python algos/qmix_smac_lite.py --env-id 3m --seed 1
Quick:  python algos/qmix_smac_lite.py --env-id 3m --total-timesteps 5000
Results: benchmark/references.toml
"""

import csv
import difflib
import hashlib
import importlib.util
import json
import math
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

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import smac_lite
from smac_lite.render import render_frame


@dataclass
class Args:
    learning_rate: float = 5e-4
    """Adam learning rate (EPyMARL's QMIX; pymarl's RMSprop used the same rate)"""
    buffer_size: int = 5000
    """replay buffer capacity in episodes (pymarl's 5000; ~190 MB on 3m, less on big maps)"""
    batch_size: int = 32
    """episodes per gradient update (pymarl's 32)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate (1.0: pymarl's hard copy, kept: it learns 3m as is)"""
    target_network_frequency: int = 200
    """gradient updates between target updates (pymarl: 200 episodes = updates)"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.05
    """final exploration epsilon"""
    exploration_steps: int = 50_000
    """battle steps over which epsilon goes from start_e to end_e (pymarl's 50k)"""
    learning_starts: int = 2_000
    """battle steps before learning starts (some 50 episodes of random play)"""
    train_frequency: int = 4
    """env steps between gradient updates (with 8 battles one per 32 steps, ~ per episode)"""
    max_grad_norm: float = 10.0
    """global gradient norm clip (pymarl's 10)"""
    hidden_dim: int = 64
    """width of the agent network's layer and GRU (pymarl's 64)"""
    mixing_embed_dim: int = 32
    """width of the mixing network (pymarl's 32)"""
    hypernet_embed: int = 64
    """hidden width of the 2-layer hypernetworks (pymarl's hypernet_layers=2, 64)"""
    double_q: bool = True
    """the online net picks the next action, the target net rates it (van Hasselt et al. 2016)"""
    env_id: str = "3m"
    """smac_lite map name (SMAC's maps: 3m, 8m, 2s3z, 5m_vs_6m, ...)"""
    total_timesteps: int = 200_000
    """battle steps over all battles"""
    num_envs: int = 8
    """battles stepped at once (one batched smac_lite env)"""
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


# ---- shared: qmix/RNNAgent ----
class RNNAgent(nn.Module):
    """The agent Q-network, one for all agents (pymarl's RNNAgent): [obs, last action, agent id] ->
    hidden (ReLU) -> GRU cell -> one Q-value per action; nn.Linear's default init."""

    def __init__(self, input_dim: int, n_actions: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(input_dim, hidden)
        self.gru = nn.GRUCell(hidden, hidden)
        self.fc2 = nn.Linear(hidden, n_actions)

    def forward(self, inputs, hidden):
        """One step of every agent of every battle: inputs (..., agents, features), hidden (...,
        agents, hidden) -> (Q-values (..., agents, n_actions), the next hidden)."""
        x = F.relu(self.fc1(inputs))
        hidden = self.gru(x.flatten(0, -2), hidden.flatten(0, -2)).view_as(hidden)
        return self.fc2(hidden), hidden

    def get_greedy_action(self, inputs, hidden, avail):
        """(each agent's argmax over its available actions, the next hidden): the exploiting action
        of the rollout and the policy that evaluate() runs."""
        q_values, hidden = self(inputs, hidden)
        return masked(q_values, avail).argmax(-1), hidden


# ---- end shared: qmix/RNNAgent ----


class QMixer(nn.Module):
    """QMIX's mixing network: Q_tot = elu(q W1(s) + b1(s)) . w2(s) + V(s), the agents' chosen-action
    Qs q mixed with weights that hypernetworks compute from the global state s (W1 and w2 by two
    layers: pymarl's hypernet_layers=2). abs() keeps W1 and w2 non-negative, so Q_tot increases with
    every agent's Q (the paper's eq. 5): each agent's argmax is the joint argmax. The biases are
    unconstrained; V(s), two layers, replaces the last bias."""

    def __init__(self, state_dim: int, n_agents: int, embed_dim: int, hypernet_embed: int):
        super().__init__()
        self.n_agents = n_agents
        self.embed_dim = embed_dim
        self.hyper_w1 = nn.Sequential(
            nn.Linear(state_dim, hypernet_embed),
            nn.ReLU(),
            nn.Linear(hypernet_embed, n_agents * embed_dim),
        )
        self.hyper_w2 = nn.Sequential(
            nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, embed_dim)
        )
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.V = nn.Sequential(nn.Linear(state_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))

    def forward(self, agent_qs, states):
        """agent_qs (..., n_agents), states (..., state_dim) -> Q_tot (...)."""
        w1 = self.hyper_w1(states).abs().view(*states.shape[:-1], self.n_agents, self.embed_dim)
        hidden = F.elu((agent_qs.unsqueeze(-2) @ w1).squeeze(-2) + self.hyper_b1(states))
        return (hidden * self.hyper_w2(states).abs()).sum(-1) + self.V(states).squeeze(-1)


def make_mixer(args: Args, state_dim: int, n_agents: int) -> nn.Module:
    """The mixing network main() trains (and its target copy): QMixer with the flags' sizes."""
    return QMixer(state_dim, n_agents, args.mixing_embed_dim, args.hypernet_embed)


# ---- shared: qmix/learning ----
def agent_inputs(obs, last_actions, agent_ids):
    """pymarl's agent input: the observation, the agent's last action one-hot (zeros at an episode's
    start), its id."""
    return torch.cat([obs, last_actions, agent_ids.expand(*obs.shape[:-1], -1)], -1)


def masked(q_values, avail):
    """The Q-values with unavailable actions far below any real one, for the argmax and the max."""
    return q_values.masked_fill(avail == 0, -1e8)


def epsilon_greedy(greedy_actions, avail, epsilon: float):
    """Each agent's greedy action or, with probability epsilon, one of its available actions drawn
    uniformly (pymarl's EpsilonGreedyActionSelector: exploration never picks an unavailable
    action)."""
    random_actions = torch.multinomial(avail.flatten(0, -2).float(), 1).view(avail.shape[:-1])
    explore = torch.rand(avail.shape[:-1], device=avail.device) < epsilon
    return torch.where(explore, random_actions, greedy_actions)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    return max(end_e, start_e + (end_e - start_e) * t / duration)


class EpisodeBuffer:
    """Whole episodes as preallocated tensors on the training device, padded to episode_limit + 1
    steps: step t holds the obs, state, avail seen at t and the actions, reward, terminated flag of
    t; the step after an episode's last holds its final obs, state, avail (a truncated episode
    bootstraps from them); `filled` marks the real steps. Each battle writes its running episode
    into its own staging row at its own step; the battles that end are copied into the ring of
    `size` episodes by one index_copy_ of every staging row, the others into a scratch row (index
    `size`): nothing depends on how many ended, so there is no host sync. Checkpointable through
    state_dict()."""

    def __init__(self, size, num_envs, steps, n_agents, obs_dim, state_dim, n_actions, device):
        shapes = self.step_fields(n_agents, obs_dim, state_dim, n_actions)
        self.episodes = {
            k: torch.zeros(((size + 1), steps + 1, *shape), dtype=dtype, device=device)
            for k, (shape, dtype) in shapes.items()
        }
        self.staging = {
            k: torch.zeros((num_envs, steps + 1, *shape), dtype=dtype, device=device)
            for k, (shape, dtype) in shapes.items()
        }
        # each battle's step in its episode
        self.t = torch.zeros(num_envs, dtype=torch.long, device=device)
        # next row, stored
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.size = size
        self.battles = torch.arange(num_envs, device=device)

    @staticmethod
    def step_fields(n_agents, obs_dim, state_dim, n_actions) -> dict:
        """What one step of an episode holds: {field: (shape, dtype)}."""
        return {
            "obs": ((n_agents, obs_dim), torch.float32),
            "state": ((state_dim,), torch.float32),
            "avail": ((n_agents, n_actions), torch.bool),
            "actions": ((n_agents,), torch.long),
            "reward": ((), torch.float32),
            "terminated": ((), torch.float32),
            "filled": ((), torch.float32),
        }

    @staticmethod
    def episode_bytes(steps, n_agents, obs_dim, state_dim, n_actions) -> int:
        """Memory of one stored episode (steps + 1 rows of step_fields)."""
        fields = EpisodeBuffer.step_fields(n_agents, obs_dim, state_dim, n_actions).values()
        row = sum(math.prod(shape) * dtype.itemsize for shape, dtype in fields)
        return (steps + 1) * row

    def add(
        self,
        obs,
        state,
        avail,
        actions,
        reward,
        terminated,
        done,
        final_obs,
        final_state,
        final_avail,
    ):
        """One step of every battle; the episodes that end (done) go into the ring and their battles
        restart at t 0."""
        for name, value in zip(
            ("obs", "state", "avail", "actions", "reward", "terminated", "filled"),
            (obs, state, avail, actions, reward, terminated, torch.ones_like(reward)),
        ):
            self.staging[name][self.battles, self.t] = value.to(self.staging[name].dtype)
        for name, value in zip(("obs", "state", "avail"), (final_obs, final_state, final_avail)):
            # the next step's
            self.staging[name][self.battles, self.t + 1] = value.to(self.staging[name].dtype)
        # not done: scratch row
        dest = torch.where(done, (self.pos + done.cumsum(0) - 1) % self.size, self.size)
        for name, episodes in self.episodes.items():
            episodes.index_copy_(0, dest, self.staging[name])
        self.pos = (self.pos + done.sum()) % self.size
        self.count = (self.count + done.sum()).clamp(max=self.size)
        # a new episode starts empty (its padding stays unfilled)
        self.staging["filled"].mul_((~done)[:, None])
        self.t = torch.where(done, 0, self.t + 1)

    def sample(self, batch_size: int):
        """batch_size episodes drawn uniformly (with replacement) from those stored: {field: (batch,
        steps + 1, ...)}"""
        idx = (torch.rand(batch_size, device=self.pos.device) * self.count).long()
        return {name: episodes[idx] for name, episodes in self.episodes.items()}

    def state_dict(self):  # the stored episodes only (tensors): a resumed run restarts its battles
        n = int(self.count)
        return {
            "episodes": {k: v[:n].clone() for k, v in self.episodes.items()},
            "pos": self.pos,
            "count": self.count,
        }

    def load_state_dict(self, state):
        for name, episodes in state["episodes"].items():
            self.episodes[name][: len(episodes)] = episodes
        self.pos.copy_(state["pos"])
        self.count.copy_(state["count"])


def unroll(agent, inputs):
    """The Q-values of every step of whole episodes (inputs (batch, steps, agents, features)): the
    GRU starts from a zero memory at each episode's first step, as when acting."""
    hidden = torch.zeros(
        inputs.shape[0], inputs.shape[2], agent.gru.hidden_size, device=inputs.device
    )
    q_values = []
    for t in range(inputs.shape[1]):
        q, hidden = agent(inputs[:, t], hidden)
        q_values.append(q)
    return torch.stack(q_values, 1)


def next_values(q_online_next, q_target_next, avail_next, double_q: bool):
    """Each agent's value of the next step for the target: with double Q the online net's argmax
    over the available actions, rated by the target net; else the target net's max over the
    available actions."""
    if double_q:
        return q_target_next.gather(
            -1, masked(q_online_next, avail_next).argmax(-1, keepdim=True)
        ).squeeze(-1)
    return masked(q_target_next, avail_next).max(-1).values


def td_targets(rewards, terminated, target_q_tot_next, gamma: float):
    """One-step targets r + gamma * Q_tot_target(s', a') of every step (shapes (batch, steps)); only
    termination stops the bootstrap: a time-limit truncation still has a future."""
    return rewards + gamma * (1.0 - terminated) * target_q_tot_next


def td_loss(
    batch, agent, mixer, target_agent, target_mixer, agent_ids, gamma: float, double_q: bool
):
    """The squared TD error of Q_tot averaged over the real steps of a batch of episodes (the filled
    mask; padding adds nothing), and the mean Q_tot of the actions taken."""
    actions = F.one_hot(batch["actions"], batch["avail"].shape[-1]).float()
    last_actions = torch.cat([torch.zeros_like(actions[:, :1]), actions[:, :-1]], 1)
    inputs = agent_inputs(batch["obs"], last_actions, agent_ids)
    q_values = unroll(agent, inputs)  # (batch, steps + 1, agents, n_actions)
    chosen = q_values[:, :-1].gather(-1, batch["actions"][:, :-1, :, None]).squeeze(-1)
    with torch.no_grad():
        q_next = next_values(
            q_values[:, 1:], unroll(target_agent, inputs)[:, 1:], batch["avail"][:, 1:], double_q
        )
        targets = td_targets(
            batch["reward"][:, :-1],
            batch["terminated"][:, :-1],
            target_mixer(q_next, batch["state"][:, 1:]),
            gamma,
        )
    q_tot = mixer(chosen, batch["state"][:, :-1])
    mask = batch["filled"][:, :-1]
    n = mask.sum().clamp(min=1)
    return (((q_tot - targets) * mask) ** 2).sum() / n, (q_tot * mask).sum().detach() / n


@torch.no_grad()
def evaluate(agent, map_name, battles, seed, device="cpu", frames=None):
    """Greedy play (agent.get_greedy_action) of the first episode of `battles` battles; returns
    {"eval/episodic_return_team": [...], "eval/win_rate": [1.0 or 0.0, ...]}, one value per battle.
    frames: a list that receives battle 0's frames (--capture-video)."""
    if battles == 0:
        return {"eval/episodic_return_team": [], "eval/win_rate": []}
    env = smac_lite.BatchedSMAC(
        map_name, num_envs=battles, device=device, seed=seed, auto_reset=False
    )
    obs, _, avail = env.reset()
    agent_ids = torch.eye(env.n_agents, device=device)
    hidden = torch.zeros(battles, env.n_agents, agent.gru.hidden_size, device=device)
    last_actions = torch.zeros(battles, env.n_agents, env.n_actions, device=device)
    finished = torch.zeros(battles, dtype=torch.bool, device=device)
    won = torch.zeros(battles, device=device)
    returns = torch.zeros(battles, device=device)
    for _ in range(env.episode_limit):
        actions, hidden = agent.get_greedy_action(
            agent_inputs(obs, last_actions, agent_ids), hidden, avail
        )
        obs, _, avail, _, done, info = env.step(actions)
        last_actions = F.one_hot(actions, env.n_actions).float()
        new = done & ~finished  # each battle's first episode; finished battles are left as they are
        returns = torch.where(new, info["episode_return"], returns)
        won = torch.where(new, info["won"].float(), won)
        if frames is not None and not finished[0]:
            frames.append(render_frame(env, 0, 384))
        finished = finished | done
        if finished.all():
            break
    return {"eval/episodic_return_team": returns.tolist(), "eval/win_rate": won.tolist()}


# ---- end shared: qmix/learning ----


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging, parameter by parameter: target <- tau * online + (1 - tau) * target
    (tau = 1: a copy)."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


# ---- shared: qmix/main ----
def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    env = smac_lite.BatchedSMAC(
        args.env_id, num_envs=args.num_envs, device=device, seed=args.seed, return_final=True
    )
    N = args.num_envs
    A = env.n_agents
    n_actions = env.n_actions
    agent_ids = torch.eye(A, device=device)  # row i: agent i's one-hot id
    input_dim = env.obs_dim + n_actions + A
    agent = RNNAgent(input_dim, n_actions, args.hidden_dim).to(device)
    target_agent = RNNAgent(input_dim, n_actions, args.hidden_dim).to(device)
    mixer = make_mixer(args, env.state_dim, A).to(device)
    target_mixer = make_mixer(args, env.state_dim, A).to(device)
    target_agent.load_state_dict(agent.state_dict())
    target_mixer.load_state_dict(mixer.state_dict())
    params = [*agent.parameters(), *mixer.parameters()]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, fused=True)  # fused: a faster step
    rb = EpisodeBuffer(
        args.buffer_size, N, env.episode_limit, A, env.obs_dim, env.state_dim, n_actions, device
    )
    num_iterations = args.total_timesteps // N  # one iteration = one step of every battle
    # iterations between logs (and host copies of the episodes' results)
    iteration = 0
    log_every = max(1, 1000 // N)

    def run_eval(frames=None):  # evaluation battles are seeded apart from training
        return evaluate(agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, frames)

    stateful = {
        "agent": agent,
        "mixer": mixer,
        "target_agent": target_agent,
        "target_mixer": target_mixer,
        # what a checkpoint holds
        "optimizer": optimizer,
        "episode_buffer": rb,
        "rng": RNGs(),
    }
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # battles are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * N
    logger = RunLogger(args, run_dir, num_iterations * N, global_step, ckpt=ckpt)
    # gradient updates done: one after each train_frequency-th iteration once global_step passed
    # learning_starts
    updates = sum(
        (i + 1) * N > args.learning_starts and i % args.train_frequency == 0
        for i in range(iteration)
    )

    def log_episodes(ended, first_step):
        """Log the episodes that ended in the steps since first_step (one host copy of (done,
        return, length, won))."""
        if not ended:
            return
        done, ret, length, won = torch.stack(ended, 1).cpu().numpy()  # each (steps, battles)
        for t, i in zip(*np.nonzero(done)):
            logger.log(
                first_step + (t + 1) * N,
                {"train/episodic_return_team": ret[t, i], "train/episodic_length": length[t, i]},
            )
        if done.any():
            logger.last_return = ret[done > 0].mean()
            logger.log(first_step + len(ended) * N, {"train/win_rate": won[done > 0].mean()})
        ended.clear()

    # a resumed run starts fresh battles
    obs, state, avail = env.reset(seed=args.seed + global_step)
    hidden = torch.zeros((N, A, args.hidden_dim), device=device)
    last_actions = torch.zeros((N, A, n_actions), device=device)
    ended = []
    first_step = global_step
    stats = {}
    for iteration in range(iteration, num_iterations):
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_steps, global_step)
        with torch.no_grad():
            greedy, hidden = agent.get_greedy_action(
                agent_inputs(obs, last_actions, agent_ids), hidden, avail
            )
        actions = epsilon_greedy(greedy, avail, epsilon)
        next_obs, next_state, next_avail, reward, done, info = env.step(actions)
        rb.add(
            obs,
            state,
            avail,
            actions,
            reward,
            info["terminated"],
            done,
            info["final_obs"],
            info["final_state"],
            info["final_avail"],
        )
        global_step += N
        ended.append(
            torch.stack(
                [
                    done.float(),
                    info["episode_return"],
                    info["episode_length"].float(),
                    info["won"].float(),
                ],
                0,
            )
        )
        obs = next_obs
        state = next_state
        avail = next_avail
        # a battle that ended starts a new episode: memory and
        going_on = (~done).float()[:, None, None]
        # last action 0
        hidden = hidden * going_on
        last_actions = F.one_hot(actions, n_actions).float() * going_on

        if global_step > args.learning_starts and iteration % args.train_frequency == 0:
            batch = rb.sample(args.batch_size)
            # unroll only to the longest episode drawn
            steps = int(batch["filled"].sum(1).max().clamp(min=1))
            loss, q_values = td_loss(
                {k: v[:, : steps + 1] for k, v in batch.items()},
                agent,
                mixer,
                target_agent,
                target_mixer,
                agent_ids,
                args.gamma,
                args.double_q,
            )
            optimizer.zero_grad()
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            updates += 1
            if updates % args.target_network_frequency == 0:
                soft_update(target_agent, agent, args.tau)
                soft_update(target_mixer, mixer, args.tau)
            stats = {
                "losses/td_loss": loss,
                "losses/q_values": q_values,
                "losses/grad_norm": grad_norm,
            }
        if (
            (iteration + 1) % log_every == 0
            or iteration + 1 == num_iterations
            or logger.stop_requested
        ):
            log_episodes(ended, first_step)
            first_step = global_step
            logger.log(global_step, {**stats, "charts/epsilon": epsilon, "charts/updates": updates})
            logger.progress(global_step)
        if args.eval_every and iteration + 1 < num_iterations and global_step % args.eval_every < N:
            logger.evaluate(global_step, run_eval)
        if (iteration + 1) % max(1, args.checkpoint_every // N) == 0 or logger.stop_requested:
            logger.save_checkpoint(stateful, iteration + 1, global_step)
        if logger.stop_requested:  # Ctrl-C: the iteration it came in is finished, logged and saved
            logger.exit_interrupted()
    frames = [] if args.capture_video else None  # battle 0 of the final evaluation, as a GIF
    eval_results = logger.evaluate(global_step, lambda: run_eval(frames))
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if frames:
        import imageio.v2 as imageio

        (run_dir / "videos").mkdir(exist_ok=True)
        imageio.mimsave(run_dir / "videos" / "eval_battle0.gif", frames, duration=125, loop=0)
    if args.save_model:
        save_model(
            {
                "agent": agent.state_dict(),
                "mixer": mixer.state_dict(),
                "args": asdict(args),
                "eval_returns": eval_results,
                "input_dim": input_dim,
                "obs_dim": env.obs_dim,
                "state_dim": env.state_dim,
                "n_agents": A,
                "n_actions": n_actions,
                "hidden": args.hidden_dim,
            },
            run_dir,
        )
    logger.close(eval_results)


# ---- end shared: qmix/main ----


def check_args(args: Args):
    check_map(args.env_id, "dqn.py", "sac_continuous.py")
    check_value_decomposition_args(args, {"mixing_embed_dim": "x >= 1", "hypernet_embed": "x >= 1"})


# ---- shared: qmix/check_args ----
def check_value_decomposition_args(args, rules: dict):
    """The flags of qmix and vdn, then `rules` (the script's own ranges, as in check_ranges)."""
    check_ranges(
        args,
        {
            "num_envs": "x >= 1",
            "learning_rate": "x > 0",
            "buffer_size": "x >= 1",
            "batch_size": "x >= 1",
            "gamma": "0 <= x <= 1",
            "tau": "0 < x <= 1",
            "target_network_frequency": "x >= 1",
            "start_e": "0 <= x <= 1",
            "end_e": "0 <= x <= 1",
            "exploration_steps": "x >= 1",
            "learning_starts": "x >= 0",
            "train_frequency": "x >= 1",
            "max_grad_norm": "x > 0",
            "hidden_dim": "x >= 1",
            **rules,
        },
    )
    if args.end_e > args.start_e:
        fail(f"--end-e {args.end_e} is above --start-e {args.start_e}: epsilon is annealed down")
    if args.batch_size > args.buffer_size:
        fail(
            f"--batch-size {args.batch_size} exceeds --buffer-size "
            f"{args.buffer_size} (both count episodes)"
        )
    if args.total_timesteps <= args.learning_starts:
        fail(
            f"--total-timesteps {args.total_timesteps} must "
            f"exceed --learning-starts {args.learning_starts}"
        )
    check_buffer_memory(args)


def check_buffer_memory(args):
    """The replay buffer of --buffer-size episodes of the map must fit in half the free memory of
    the device it is kept on (a map of many units asks for tens of GB at pymarl's 5,000)."""
    env = smac_lite.BatchedSMAC(args.env_id, num_envs=1)
    per_episode = EpisodeBuffer.episode_bytes(
        env.episode_limit, env.n_agents, env.obs_dim, env.state_dim, env.n_actions
    )
    if args.cuda and torch.cuda.is_available():
        free = torch.cuda.mem_get_info()[0]
        where = "GPU"
    else:
        free = available_memory()
        where = "CPU"
    episodes = args.buffer_size + 1 + args.num_envs
    if episodes * per_episode > free / 2:
        fits = int(free / 2 / per_episode) - 1 - args.num_envs
        fail(
            f"--buffer-size {args.buffer_size} episodes of {args.env_id} need "
            f"{episodes * per_episode / 1e9:.1f} GB, over half the {free / 1e9:.1f} GB of free "
            f"{where} memory; pass --buffer-size {max(fits, 0)} or less"
        )


def available_memory() -> int:
    """Bytes of memory free for a new allocation (Linux: MemAvailable; elsewhere all of it)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ---- end shared: qmix/check_args ----


# ---- shared: smac_lite/check_map ----
def check_map(env_id: str, *single_agent_scripts: str):
    """A smac_lite map, or one error line that names the scripts that take env_id
    (single_agent_scripts: those suggested for a Gymnasium id)."""
    if env_id in smac_lite.MAPS:
        return
    scripts = other_family(env_id)
    if not scripts and env_id in gym.registry:
        scripts = single_agent_scripts
    if scripts:
        fail(f"{env_id} is not a smac_lite map (the maps: {', '.join(smac_lite.MAPS)})", *scripts)
    close = difflib.get_close_matches(env_id, list(smac_lite.MAPS), n=1)
    fail(
        f"unknown smac_lite map '{env_id}'"
        + (f"; did you mean '{close[0]}'?" if close else "")
        + f"; the maps: {', '.join(smac_lite.MAPS)}"
    )


# ---- end shared: smac_lite/check_map ----


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
