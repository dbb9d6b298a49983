"""MAPPO on smac_lite (3m by default): PPO with a centralised critic for cooperative battles.

Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games": one GRU
actor shared by all agents (unavailable actions masked), one critic on the agent-specific global
state, value normalisation, GAE, death masking. The paper's SMAC defaults but 4 minibatches and
entropy 0.03. Deviations: the value loss is a plain MSE (the paper's is Huber and clipped); a dead
agent's critic input is not zeroed.

Run:    python algos/mappo_smac_lite.py --env-id 3m --seed 1
Quick:  python algos/mappo_smac_lite.py --env-id 3m --total-timesteps 20000
Results: benchmark/references.toml
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical

import smac_lite
from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_map,
    check_ranges,
    fail,
    load_states,
    save_gif,
    start_run,
)
from smac_lite.render import render_frame


@dataclass
class Args(RunArgs):
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


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor shared by all agents: [obs, agent id] -> hidden (ReLU) -> GRU cell -> logits,
    unavailable actions masked.
    Critic: [global state, obs, agent id] (the agent-specific global state) -> hidden -> hidden
    (ReLU) -> value."""

    def __init__(self, obs_dim: int, state_dim: int, n_agents: int, n_actions: int, hidden: int):
        super().__init__()
        self.actor_in = nn.Sequential(layer_init(nn.Linear(obs_dim + n_agents, hidden)), nn.ReLU())
        self.gru = nn.GRUCell(hidden, hidden)
        # std 0.01: a near-uniform first policy
        self.actor_out = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(state_dim + obs_dim + n_agents, hidden)),
            nn.ReLU(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.ReLU(),
            layer_init(nn.Linear(hidden, 1), std=1.0),
        )

    def get_value(self, critic_in):
        """The critic's (normalised) value of each agent's global state."""
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
    """MAPPO's agent-specific global state: the global state, the agent's own observation and its
    id."""
    return torch.cat(
        [
            state.unsqueeze(-2).expand(*obs.shape[:-1], -1),
            obs,
            agent_ids.expand(*obs.shape[:-1], -1),
        ],
        -1,
    )


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
    args, ckpt, run_dir = start_run(args, check_args, __file__)
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

    def run_eval(video_dir=None):  # seeded apart from training; battle 0 filmed into video_dir
        frames = [] if video_dir else None
        results = evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, frames
        )
        if frames:
            save_gif(frames, video_dir / "eval_battle0.gif", 125)
        return results

    # saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "value_norm": value_norm, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # battles are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

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
    check_map(args.env_id, "ppo.py", "ppo_continuous.py")
    check_ranges(args)
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


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
