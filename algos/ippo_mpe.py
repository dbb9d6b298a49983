"""IPPO on MPE (mpe2's simple_spread_v3 by default): independent PPO.

de Witt et al. 2020, "Is Independent Learning All You Need in the StarCraft Multi-Agent Challenge?",
as Yu et al. 2022's IPPO baseline: mappo_mpe.py with one change, the critic sees the agent's own
observation and id, not the global state. global_step counts joint steps; the metric is the
per-agent mean return. Deviation: the value loss is a plain MSE (the paper's is Huber and clipped).

Run:    python algos/ippo_mpe.py --env-id simple_spread_v3 --seed 1
Quick:  python algos/ippo_mpe.py --env-id simple_spread_v3 --total-timesteps 20000
Results: benchmark/references.toml
"""

import difflib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical

from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_ranges,
    fail,
    load_states,
    other_family,
    save_gif,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    learning_rate: float = 7e-4
    """Adam learning rate (actor and critic)"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = False
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 25
    """steps per env per rollout (25: one episode)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    num_minibatches: int = 1
    """minibatches per epoch, split by env (must divide num_envs)"""
    update_epochs: int = 10
    """epochs over each rollout"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 1.0
    """value loss coefficient"""
    max_grad_norm: float = 10.0
    """global gradient norm clip"""
    hidden_dim: int = 64
    """width of the actor's layer and GRU, and of the critic's layers"""
    env_id: str = "simple_spread_v3"
    """mpe2 task (the cooperative ones: see TASKS)"""
    total_timesteps: int = 300_000
    """joint steps over all envs"""
    num_envs: int = 64
    """mpe2 parallel_envs stepped in turn (the MAPPO paper used 128 for MPE; 32 let IPPO
    collapse)"""


MAX_CYCLES = 25  # steps per episode (mpe2's default; MAPPO's and JaxMARL's)
# the cooperative mpe2 tasks whose agents have the same observation and action sizes: their settings
TASKS = {
    # N agents cover N landmarks without colliding
    "simple_spread_v3": {"N": 3, "local_ratio": 0.5},
    # 2 agents; each says which landmark the other must reach
    "simple_reference_v3": {"local_ratio": 0.5},
    "simple_formation_v1": {"N": 4},  # N agents form a circle around a landmark
    "simple_line_v1": {"N": 4},  # N agents spread along a line
}
# the other mpe2 tasks, and why one actor shared by a cooperative team does not fit them
NOT_SUPPORTED = {
    "simple_v3": "one agent",
    "simple_speaker_listener_v4": "its agents' observation and action sizes differ",
    "collect_treasure_v1": "its agents' observation sizes differ",
    **{
        t: "competitive"
        for t in (
            "simple_adversary_v3",
            "simple_crypto_v3",
            "simple_push_v3",
            "simple_tag_v3",
            "simple_world_comm_v3",
        )
    },
}


# ---- shared: mpe/MPEEnvs ----
# the competitive tasks' adversary teams (agent name prefixes)
ADVERSARIES = ("adversary", "leadadversary", "eve")


class MPEEnvs:
    """num_envs mpe2 parallel_envs of one task (its settings in TASKS), stepped in turn. The agents'
    observations come concatenated, agent after agent, as one joint observation (num_envs, sum of
    obs_dims) tensor, which is mpe2's state() (MPE is numpy: one host copy per step). Env i's k-th
    episode (from 0) is seeded with seed + i + num_envs * k. With auto_reset, a finished env is
    reset in the same step, its last observation kept in info["final_obs"] for the bootstrap;
    without it (evaluation), it is left finished."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device,
        continuous_actions: bool,
        auto_reset=True,
        render_env0=False,
    ):
        module = importlib.import_module(f"mpe2.{env_id}")
        self.envs = [
            module.parallel_env(
                max_cycles=MAX_CYCLES,
                continuous_actions=continuous_actions,
                **TASKS[env_id],
                render_mode="rgb_array" if render_env0 and i == 0 else None,
            )
            for i in range(num_envs)
        ]
        self.agents = self.envs[0].possible_agents
        env = self.envs[0]
        self.n_agents = len(self.agents)
        self.device = device
        self.auto_reset = auto_reset
        spaces = [env.action_space(a) for a in self.agents]
        self.continuous_actions = continuous_actions
        self.obs_dims = [env.observation_space(a).shape[0] for a in self.agents]
        # discrete: the actions
        self.action_dims = [s.shape[0] if continuous_actions else int(s.n) for s in spaces]
        self.low = (
            np.concatenate([getattr(s, "low") for s in spaces]) if continuous_actions else None
        )
        self.high = (
            np.concatenate([getattr(s, "high") for s in spaces]) if continuous_actions else None
        )
        self.adversary = np.array([a.split("_")[0] in ADVERSARIES for a in self.agents])
        # where each agent's action starts in a continuous joint action
        self.splits = np.cumsum(self.action_dims)[:-1]
        self.seed = 0
        self.episodes = np.zeros(num_envs, dtype=np.int64)
        self.obs = np.zeros((num_envs, sum(self.obs_dims)), dtype=np.float32)
        self.returns = np.zeros((num_envs, self.n_agents))
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def _reset(self, i: int):
        obs, _ = self.envs[i].reset(seed=self.seed + i + len(self.envs) * int(self.episodes[i]))
        self.obs[i] = np.concatenate([obs[a] for a in self.agents])
        self.returns[i] = 0.0
        self.lengths[i] = 0
        self.episodes[i] += 1

    def reset(self, seed: int):
        """Start every env anew (env i with seed + i); returns the joint observations."""
        self.seed = seed
        self.episodes[:] = 0
        for i in range(len(self.envs)):
            self._reset(i)
        return torch.as_tensor(self.obs.copy(), device=self.device)

    def step(self, actions):
        """actions: a numpy array, (num_envs, n_agents) action indices or, with continuous actions,
        (num_envs, sum of action_dims). Returns the joint observations (a tensor) and numpy arrays:
        reward (num_envs, n_agents), each agent's own; terminated (num_envs,): the task ended the
        episode (no bootstrap); done (num_envs,): ended by termination or time limit; info:
        final_obs (the true last joint observation where done), episode_return (num_envs, n_agents:
        each agent's return of the finished episode) and episode_length, which hold where done."""
        n = len(self.envs)
        reward = np.zeros((n, self.n_agents), np.float32)
        terminated = np.zeros(n, bool)
        done = np.zeros(n, bool)
        final_obs = self.obs.copy()
        ep_return = np.zeros((n, self.n_agents))
        ep_length = np.zeros(n)
        for i, env in enumerate(self.envs):
            if not env.agents:  # finished, and not reset (evaluation)
                continue
            agent_actions = (
                np.split(actions[i], self.splits)
                if self.continuous_actions
                else actions[i].tolist()
            )
            obs, rew, term, trunc, _ = env.step(dict(zip(self.agents, agent_actions)))
            self.obs[i] = final_obs[i] = np.concatenate([obs[a] for a in self.agents])
            reward[i] = [rew[a] for a in self.agents]
            self.returns[i] += reward[i]
            self.lengths[i] += 1
            terminated[i] = any(term.values())
            done[i] = all(term[a] or trunc[a] for a in self.agents)
            if done[i]:
                ep_return[i] = self.returns[i]
                ep_length[i] = self.lengths[i]
                if self.auto_reset:
                    self._reset(i)
        info = {"final_obs": final_obs, "episode_return": ep_return, "episode_length": ep_length}
        return torch.as_tensor(self.obs.copy(), device=self.device), reward, terminated, done, info

    def render(self):
        """Env 0's frame (it must have been made with render_env0)."""
        return self.envs[0].render()


# ---- end shared: mpe/MPEEnvs ----


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor shared by all agents: [obs, agent id] -> hidden (ReLU) -> GRU cell -> logits over the
    actions. Critic, shared too: [obs, agent id] (what the agent itself sees) -> hidden -> hidden
    (ReLU) -> value."""

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

    def policy(self, hidden):
        """The categorical policy over the actions (all are always available in MPE)."""
        return Categorical(logits=self.actor_out(hidden), validate_args=False)

    def get_greedy_action(self, hidden):
        """The most probable action of each agent (given its GRU state): the policy evaluate()
        runs."""
        return self.policy(hidden).logits.argmax(-1)


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
def evaluate(agent, env_id, episodes, seed, device="cpu", frames=None):
    """Greedy (argmax) play of one episode in each of `episodes` envs (env i seeded with seed + i);
    returns {"eval/episodic_return_agent_mean": [...]}, one value (the per-agent mean of the return)
    per episode. frames: a list that receives episode 0's frames (--capture-video)."""
    if episodes == 0:
        return {"eval/episodic_return_agent_mean": []}
    env = MPEEnvs(
        env_id,
        episodes,
        device,
        continuous_actions=False,
        auto_reset=False,
        render_env0=frames is not None,
    )
    state = env.reset(seed)
    agent_ids = torch.eye(env.n_agents, device=device)
    hidden = torch.zeros(episodes, env.n_agents, agent.gru.hidden_size, device=device)
    finished = np.zeros(episodes, dtype=bool)
    returns = np.zeros(episodes, dtype=np.float32)
    no_start = torch.zeros(episodes, device=device)
    if frames is not None:
        frames.append(env.render()[::2, ::2])  # 350 x 350 pixels
    while not finished.all():
        hidden = agent.actor_step(
            actor_inputs(state.view(episodes, env.n_agents, -1), agent_ids), hidden, no_start
        )
        state, _, _, done, info = env.step(agent.get_greedy_action(hidden).cpu().numpy())
        returns[done] = info["episode_return"][done].mean(-1)  # the per-agent mean
        if frames is not None and not finished[0]:
            frames.append(env.render()[::2, ::2])
        finished |= done
    return {"eval/episodic_return_agent_mean": returns.tolist()}


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    env = MPEEnvs(args.env_id, args.num_envs, device, continuous_actions=False)
    N = args.num_envs
    A = env.n_agents
    T = args.num_steps
    # the same for every agent
    obs_dim = env.obs_dims[0]
    state_dim = sum(env.obs_dims)
    n_actions = env.action_dims[0]
    agent_ids = torch.eye(A, device=device)  # row i: agent i's one-hot id
    agent = Agent(obs_dim, state_dim, A, n_actions, args.hidden_dim).to(device)
    value_norm = ValueNorm().to(device)
    # fused: faster
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    batch_size = N * T
    mb_envs = N // args.num_minibatches
    num_iterations = args.total_timesteps // (N * T)
    iteration = 0

    def run_eval(video_dir=None):  # seeded apart from training; episode 0 filmed into video_dir
        frames = [] if video_dir else None
        results = evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 10**9, device, frames
        )
        if frames:
            save_gif(frames, video_dir / "eval_episode0.gif", 100)
        return results

    # saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "value_norm": value_norm, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

    actor_in = torch.zeros((T, N, A, obs_dim + A), device=device)
    critic_in = torch.zeros((T, N, A, agent.critic[0].in_features), device=device)
    actions = torch.zeros((T, N, A), dtype=torch.long, device=device)
    logprobs = torch.zeros((T, N, A), device=device)
    rewards = torch.zeros((T, N, A), device=device)
    values = torch.zeros((T, N, A), device=device)
    starts = torch.zeros((T, N), device=device)
    dones = torch.zeros((T, N), device=device)
    ep_return = torch.zeros((T, N), device=device)
    ep_length = torch.zeros((T, N), device=device)
    state = env.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    obs = state.view(N, A, obs_dim)  # the joint observation is the global state
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
            starts[step] = start
            with torch.no_grad():
                hidden = agent.actor_step(actor_in[step], hidden, start)
                dist = agent.policy(hidden)
                actions[step] = dist.sample()
                logprobs[step] = dist.log_prob(actions[step])
                values[step] = value_norm.denormalize(agent.get_value(critic_in[step]))
            state, reward, terminated, done, info = env.step(actions[step].cpu().numpy())
            obs = state.view(N, A, obs_dim)
            final_state = torch.as_tensor(info["final_obs"], device=device)
            # a time limit is not part of the task: bootstrap with V(final state)
            with torch.no_grad():
                final_value = value_norm.denormalize(
                    agent.get_value(
                        critic_inputs(final_state, final_state.view(N, A, obs_dim), agent_ids)
                    )
                )
            truncated = torch.as_tensor(done & ~terminated, device=device)
            rewards[step] = (
                torch.as_tensor(reward, device=device)
                + args.gamma * final_value * truncated[:, None]
            )
            dones[step] = start = torch.as_tensor(done, device=device).float()
            # per-agent mean
            ep_return[step] = torch.as_tensor(info["episode_return"].mean(-1), device=device)
            ep_length[step] = torch.as_tensor(info["episode_length"], device=device)
            global_step += N
        with torch.no_grad():
            next_value = value_norm.denormalize(
                agent.get_value(critic_inputs(state, obs, agent_ids))
            )
        advantages, returns = compute_gae(
            rewards,
            values,
            dones[..., None],
            next_value,
            args.gamma,
            # per agent; dones broadcast over the agents
            args.gae_lambda,
        )
        value_norm.update(returns)
        targets = value_norm.normalize(returns)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(N, device=device)
            # whole env sequences: the GRU is replayed from first_hidden
            for mb in perm.split(mb_envs):
                h = first_hidden[mb]
                hiddens = []
                for t in range(T):
                    h = agent.actor_step(actor_in[t, mb], h, starts[t, mb])
                    hiddens.append(h)
                dist = agent.policy(torch.stack(hiddens))
                value = agent.get_value(critic_in[:, mb])
                mb_advantages = advantages[:, mb]
                loss, stats = ppo_loss(
                    dist.log_prob(actions[:, mb]),
                    dist.entropy(),
                    value,
                    logprobs[:, mb],
                    None,
                    (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8),
                    targets[:, mb],
                    clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                )
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        # one copy
        ended = (dones > 0).cpu().numpy()
        ret = ep_return.cpu().numpy()
        length = ep_length.cpu().numpy()
        for t, i in zip(*np.nonzero(ended)):  # every episode that ended in the rollout
            logger.log(
                first_step + (t + 1) * N,
                {
                    "train/episodic_return_agent_mean": ret[t, i],
                    "train/episodic_length": length[t, i],
                },
            )
        if ended.any():
            logger.last_return = ret[ended].mean()
        logger.log(
            global_step,
            {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        logger.end_iteration(stateful, iteration, global_step, run_eval)
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={
            "agent": agent.state_dict(),
            "obs_dim": obs_dim,
            "state_dim": state_dim,
            "n_agents": A,
            "n_actions": n_actions,
            "hidden": args.hidden_dim,
        },
    )


def check_args(args: Args):
    check_task(args.env_id, "ppo.py", "ppo_continuous.py")
    check_ranges(args)
    if args.num_envs % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not "
            f"divide --num-envs {args.num_envs} (split by env)"
        )
    if args.total_timesteps < args.num_envs * args.num_steps:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one "
            f"rollout (num_envs*num_steps = {args.num_envs * args.num_steps})"
        )


# ---- shared: mpe/check_task ----
def check_task(env_id: str, *single_agent_scripts: str):
    """A task of TASKS, or one error line that names the scripts that take env_id
    (single_agent_scripts: those suggested for a Gymnasium id)."""
    if env_id in TASKS:
        return
    if env_id in NOT_SUPPORTED:
        fail(
            f"mpe2 task '{env_id}' is not supported by {SCRIPT} "
            f"({NOT_SUPPORTED[env_id]}); the tasks: {', '.join(TASKS)}"
        )
    scripts = other_family(env_id)
    if not scripts and env_id in gym.registry:
        scripts = single_agent_scripts
    if scripts and not re.fullmatch(r"(simple\w*|collect_treasure)_v\d+", env_id):
        fail(f"{env_id} is not an mpe2 task (the tasks of {SCRIPT}: {', '.join(TASKS)})", *scripts)
    close = difflib.get_close_matches(env_id, [*TASKS, *NOT_SUPPORTED], n=1)
    fail(
        f"unknown mpe2 task '{env_id}'"
        + (f"; did you mean '{close[0]}'?" if close and close[0] in TASKS else "")
        + f"; the tasks: {', '.join(TASKS)}"
    )


# ---- end shared: mpe/check_task ----


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
