"""VDN on smac_lite (3m by default): value decomposition as a sum of the agents' Qs.

Sunehag et al. 2018, "Value-Decomposition Networks For Cooperative Multi-Agent Learning": one GRU
Q-network shared by the agents (observation, last action, id); Q_tot = sum_i Q_i(o_i, a_i), so each
agent's argmax is the joint argmax. qmix_smac_lite.py's sibling (no mixing network), with pymarl's
details: whole episodes replayed, double-Q targets, a target copy every 200 updates, epsilon-greedy,
clip 10. Deviation: episodes are drawn with replacement.

Run:    python algos/vdn_smac_lite.py --env-id 3m --seed 1
Quick:  python algos/vdn_smac_lite.py --env-id 3m --total-timesteps 5000
Results: benchmark/references.toml
"""

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

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
    double_q: bool = True
    """the online net picks the next action, the target net rates it (van Hasselt et al. 2016)"""
    env_id: str = "3m"
    """smac_lite map name (SMAC's maps: 3m, 8m, 2s3z, 5m_vs_6m, ...)"""
    total_timesteps: int = 200_000
    """battle steps over all battles"""
    num_envs: int = 8
    """battles stepped at once (one batched smac_lite env)"""


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


class VDNMixer(nn.Module):
    """VDN's mixer: Q_tot = the sum of the agents' chosen-action Qs. No parameters, and the global
    state is not used (QMIX's mixer conditions on it)."""

    def forward(self, agent_qs, states):
        """agent_qs (..., n_agents), states (..., state_dim) -> Q_tot (...)."""
        return agent_qs.sum(-1)


def make_mixer(args: Args, state_dim: int, n_agents: int) -> nn.Module:
    """The mixing network main() trains (and its target copy): VDN's sum, which has no flags."""
    return VDNMixer()


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
    args, ckpt, run_dir = start_run(args, check_args, __file__)
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

    def run_eval(video_dir=None):  # seeded apart from training; battle 0 filmed into video_dir
        frames = [] if video_dir else None
        results = evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, frames
        )
        if frames:
            save_gif(frames, video_dir / "eval_battle0.gif", 125)
        return results

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
    logger = RunLogger(args, run_dir, num_iterations * N, global_step, ckpt=ckpt, script=__file__)
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
            or logger.stops_after(global_step)
        ):
            log_episodes(ended, first_step)
            first_step = global_step
            logger.log(global_step, {**stats, "charts/epsilon": epsilon, "charts/updates": updates})
            logger.progress(global_step)
        logger.end_iteration(stateful, iteration + 1, global_step, run_eval)
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={
            "agent": agent.state_dict(),
            "mixer": mixer.state_dict(),
            "input_dim": input_dim,
            "obs_dim": env.obs_dim,
            "state_dim": env.state_dim,
            "n_agents": A,
            "n_actions": n_actions,
            "hidden": args.hidden_dim,
        },
    )


# ---- end shared: qmix/main ----


def check_args(args: Args):
    check_map(args.env_id, "dqn.py", "sac_continuous.py")
    check_value_decomposition_args(args, {})


# ---- shared: qmix/check_args ----
def check_value_decomposition_args(args, rules: dict):
    """The flags of qmix and vdn, then `rules` (the script's own ranges, as in check_ranges)."""
    check_ranges(args, rules)
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


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
