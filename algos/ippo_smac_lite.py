"""IPPO on smac_lite (3m by default): independent PPO.

de Witt et al. 2020, "Is Independent Learning All You Need in the StarCraft Multi-Agent Challenge?",
as Yu et al. 2022's IPPO baseline: mappo_smac_lite.py with one change, the critic sees the agent's
own observation and id, not the agent-specific global state. global_step counts battle steps.
Deviations: the value loss is a plain MSE (the paper's is Huber and clipped); a dead agent's critic
input is not zeroed.

Run:    python algos/ippo_smac_lite.py --env-id 3m --seed 1
Quick:  python algos/ippo_smac_lite.py --env-id 3m --total-timesteps 20000
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

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import smac_lite
from smac_lite.render import render_frame


@dataclass
class Args:
    learning_rate: float = 5e-4
    """Adam learning rate (actor and critic)"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = False
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 50
    """steps per battle per rollout"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    num_minibatches: int = 4
    """minibatches per epoch, split by battle (must divide num_envs)"""
    update_epochs: int = 10
    """epochs over each rollout"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.03
    """entropy bonus coefficient (the paper: 0.01)"""
    vf_coef: float = 1.0
    """value loss coefficient"""
    max_grad_norm: float = 10.0
    """global gradient norm clip"""
    hidden_dim: int = 64
    """width of the actor's layer and GRU, and of the critic's layers"""
    env_id: str = "3m"
    """smac_lite map name (SMAC's maps: 3m, 8m, 2s3z, 5m_vs_6m, ...)"""
    total_timesteps: int = 300_000
    """battle steps over all battles"""
    num_envs: int = 64
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


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor shared by all agents: [obs, agent id] -> hidden (ReLU) -> GRU cell -> logits,
    unavailable actions masked. Critic, shared too: [obs, agent id] (what the agent itself sees) ->
    hidden -> hidden (ReLU) -> value."""

    def __init__(self, obs_dim: int, state_dim: int, n_agents: int, n_actions: int, hidden: int):
        super().__init__()
        self.actor_in = nn.Sequential(layer_init(nn.Linear(obs_dim + n_agents, hidden)), nn.ReLU())
        self.gru = nn.GRUCell(hidden, hidden)
        # std 0.01: a near-uniform first policy
        self.actor_out = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim + n_agents, hidden)),
            nn.ReLU(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.ReLU(),
            layer_init(nn.Linear(hidden, 1), std=1.0),
        )

    def get_value(self, critic_in):
        """The critic's (normalised) value of each agent's observation."""
        return self.critic(critic_in).squeeze(-1)

    def actor_step(self, actor_in, hidden, start):
        """One GRU step of every agent (inputs (..., agents, features)); memory is zeroed where an
        episode starts."""
        x = self.actor_in(actor_in)
        hidden = hidden * (1.0 - start)[..., None, None]
        return self.gru(x.flatten(0, -2), hidden.flatten(0, -2)).view_as(hidden)

    def policy(self, hidden, avail):
        """The categorical policy over the available actions (the others get probability 0)."""
        return Categorical(
            logits=self.actor_out(hidden).masked_fill(avail == 0, -1e8), validate_args=False
        )

    def get_greedy_action(self, hidden, avail):
        """The most probable available action of each agent (given its GRU state): the policy
        evaluate() runs."""
        return self.policy(hidden, avail).logits.argmax(-1)


def actor_inputs(obs, agent_ids):
    return torch.cat([obs, agent_ids.expand(*obs.shape[:-1], -1)], -1)


def critic_inputs(state, obs, agent_ids):
    """IPPO's critic input: the agent's own observation and its id (the global state is not
    used)."""
    return torch.cat([obs, agent_ids.expand(*obs.shape[:-1], -1)], -1)


class ValueNorm(nn.Module):
    """Running mean and variance of the value targets (MAPPO's value normalisation): the critic
    learns normalised returns, so its loss keeps one scale while the returns change as the agents
    learn."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("count", torch.tensor(1e-4))

    def update(self, x):  # the parallel update of Chan et al., as gymnasium's RunningMeanStd
        delta = x.mean() - self.mean
        n = x.numel()
        total = self.count + n
        self.var.copy_(
            (self.var * self.count + x.var(correction=0) * n + delta**2 * self.count * n / total)
            / total
        )
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def normalize(self, x):
        return (x - self.mean) / self.var.sqrt().clamp(min=1e-5)

    def denormalize(self, x):
        return x * self.var.sqrt().clamp(min=1e-5) + self.mean


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


@torch.no_grad()
def evaluate(agent, map_name, battles, seed, device="cpu", frames=None):
    """Greedy (argmax over the available actions) play of the first episode of `battles` battles;
    returns {"eval/episodic_return_team": [...], "eval/win_rate": [1.0 or 0.0, ...]}, one value per
    battle. frames: a list that receives battle 0's frames (--capture-video)."""
    if battles == 0:
        return {"eval/episodic_return_team": [], "eval/win_rate": []}
    env = smac_lite.BatchedSMAC(
        map_name, num_envs=battles, device=device, seed=seed, auto_reset=False
    )
    obs, _, avail = env.reset()
    agent_ids = torch.eye(env.n_agents, device=device)
    hidden = torch.zeros(battles, env.n_agents, agent.gru.hidden_size, device=device)
    finished = torch.zeros(battles, dtype=torch.bool, device=device)
    won = torch.zeros(battles, device=device)
    returns = torch.zeros(battles, device=device)
    no_start = torch.zeros(battles, device=device)
    for _ in range(env.episode_limit):
        hidden = agent.actor_step(actor_inputs(obs, agent_ids), hidden, no_start)
        obs, _, avail, _, done, info = env.step(agent.get_greedy_action(hidden, avail))
        new = done & ~finished  # each battle's first episode; finished battles are left as they are
        returns = torch.where(new, info["episode_return"], returns)
        won = torch.where(new, info["won"].float(), won)
        if frames is not None and not finished[0]:
            frames.append(render_frame(env, 0, 384))
        finished = finished | done
        if finished.all():
            break
    return {"eval/episodic_return_team": returns.tolist(), "eval/win_rate": won.tolist()}


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    env = smac_lite.BatchedSMAC(
        args.env_id, num_envs=args.num_envs, device=device, seed=args.seed, return_final=True
    )
    N = args.num_envs
    A = env.n_agents
    T = args.num_steps
    obs_dim = env.obs_dim
    state_dim = env.state_dim
    n_actions = env.n_actions
    agent_ids = torch.eye(A, device=device)  # row i: agent i's one-hot id
    agent = Agent(obs_dim, state_dim, A, n_actions, args.hidden_dim).to(device)
    value_norm = ValueNorm().to(device)
    # fused: faster
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    batch_size = N * T
    mb_battles = N // args.num_minibatches
    num_iterations = args.total_timesteps // (N * T)
    iteration = 0

    def run_eval(frames=None):  # evaluation battles are seeded apart from training
        return evaluate(agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, frames)

    # saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "value_norm": value_norm, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # battles are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt)

    actor_in = torch.zeros((T, N, A, obs_dim + A), device=device)
    critic_in = torch.zeros((T, N, A, agent.critic[0].in_features), device=device)
    avails = torch.zeros((T, N, A, n_actions), device=device)
    actions = torch.zeros((T, N, A), dtype=torch.long, device=device)
    logprobs = torch.zeros((T, N, A), device=device)
    rewards = torch.zeros((T, N, A), device=device)
    values = torch.zeros((T, N, A), device=device)
    starts = torch.zeros((T, N), device=device)
    dones = torch.zeros((T, N), device=device)
    won = torch.zeros((T, N), device=device)
    ep_return = torch.zeros((T, N), device=device)
    ep_length = torch.zeros((T, N), device=device)
    # a resumed run starts fresh battles
    obs, state, avail = env.reset(seed=args.seed + global_step)
    hidden = torch.zeros((N, A, args.hidden_dim), device=device)
    start = torch.ones(N, device=device)
    for iteration in range(iteration + 1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = (
            frac * args.learning_rate if args.anneal_lr else args.learning_rate
        )
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef
        # the update replays the GRU from here
        first_hidden = hidden.clone()
        first_step = global_step
        for step in range(T):
            actor_in[step] = actor_inputs(obs, agent_ids)
            critic_in[step] = critic_inputs(state, obs, agent_ids)
            avails[step] = avail
            starts[step] = start
            with torch.no_grad():
                hidden = agent.actor_step(actor_in[step], hidden, start)
                dist = agent.policy(hidden, avail)
                actions[step] = dist.sample()
                logprobs[step] = dist.log_prob(actions[step])
                values[step] = value_norm.denormalize(agent.get_value(critic_in[step]))
            obs, state, avail, reward, done, info = env.step(actions[step])
            # a time limit is not part of the task: bootstrap with V(final state)
            with torch.no_grad():
                final_value = value_norm.denormalize(
                    agent.get_value(
                        critic_inputs(info["final_state"], info["final_obs"], agent_ids)
                    )
                )
            rewards[step] = reward[:, None] + args.gamma * final_value * info["truncated"][:, None]
            dones[step] = done.float()
            start = done.float()
            won[step] = info["won"]
            ep_return[step] = info["episode_return"]
            ep_length[step] = info["episode_length"]
            global_step += N
        with torch.no_grad():
            next_value = value_norm.denormalize(
                agent.get_value(critic_inputs(state, obs, agent_ids))
            )
        advantages, returns = compute_gae(
            rewards, values, dones[..., None], next_value, args.gamma, args.gae_lambda
        )  # dones broadcast over the agents
        active = 1.0 - avails[..., 0]  # the no-op is available to dead agents only
        value_norm.update(returns[active > 0])
        targets = value_norm.normalize(returns)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(N, device=device)
            # whole battle sequences: the GRU is replayed from first_hidden
            for mb in perm.split(mb_battles):
                h = first_hidden[mb]
                hiddens = []
                for t in range(T):
                    h = agent.actor_step(actor_in[t, mb], h, starts[t, mb])
                    hiddens.append(h)
                dist = agent.policy(torch.stack(hiddens), avails[:, mb])
                value = agent.get_value(critic_in[:, mb])
                mb_active = active[:, mb]
                mb_advantages = advantages[:, mb]
                adv_mean = mb_advantages[mb_active > 0].mean()
                adv_std = mb_advantages[mb_active > 0].std()
                loss, stats = ppo_loss(
                    dist.log_prob(actions[:, mb]),
                    dist.entropy(),
                    value,
                    logprobs[:, mb],
                    None,
                    (mb_advantages - adv_mean) / (adv_std + 1e-8),
                    targets[:, mb],
                    clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                    mask=mb_active,
                )
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        # one copy
        ended = (dones > 0).cpu().numpy()
        ret = ep_return.cpu().numpy()
        length = ep_length.cpu().numpy()
        win = won.cpu().numpy()
        for t, i in zip(*np.nonzero(ended)):  # every battle that ended in the rollout
            logger.log(
                first_step + (t + 1) * N,
                {"train/episodic_return_team": ret[t, i], "train/episodic_length": length[t, i]},
            )
        if ended.any():
            logger.last_return = ret[ended].mean()
            logger.log(global_step, {"train/win_rate": win[ended].mean()})
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
            and global_step % args.eval_every < batch_size
        ):
            logger.evaluate(global_step, run_eval)
        if iteration % max(1, args.checkpoint_every // batch_size) == 0 or logger.stop_requested:
            logger.save_checkpoint(stateful, iteration, global_step)
        if logger.stop_requested:  # Ctrl-C: the iteration it came in is finished and saved
            logger.exit_interrupted()
    frames = [] if args.capture_video else None
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
                "args": asdict(args),
                "eval_returns": eval_results,
                "obs_dim": obs_dim,
                "state_dim": state_dim,
                "n_agents": A,
                "n_actions": n_actions,
                "hidden": args.hidden_dim,
            },
            run_dir,
        )
    logger.close(eval_results)


def check_args(args: Args):
    check_map(args.env_id, "ppo.py", "ppo_continuous.py")
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
            "hidden_dim": "x >= 1",
        },
    )
    if args.num_envs % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not "
            f"divide --num-envs {args.num_envs} (split by battle)"
        )
    if args.total_timesteps < args.num_envs * args.num_steps:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one "
            f"rollout (num_envs*num_steps = {args.num_envs * args.num_steps})"
        )


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
