"""MADDPG on MPE (mpe2's simple_spread_v3 by default): DDPG with a centralised critic per agent.

Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive Environments": each
agent has its own actor mu_i(o_i) and critic Q_i(o_1..o_N, a_1..a_N), nothing shared. The paper's
settings (64-64 ReLU, lr 1e-2, gamma 0.95, batch 1024, an update every 100 steps, tau 0.01, a 1e-3
penalty on the actor's pre-activations), Gaussian noise on continuous actions in place of
Gumbel-softmax. Deviation: gradients clipped (0.5) per network, not per variable.

Run:    python algos/maddpg_mpe.py --env-id simple_spread_v3 --seed 1
Quick:  python algos/maddpg_mpe.py --env-id simple_spread_v3 --total-timesteps 5000 \
            --learning-starts 2000
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
import torch.nn.functional as F
import tyro

from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_ranges,
    check_replay_flags,
    fail,
    load_states,
    other_family,
    save_gif,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    learning_rate: float = 1e-2
    """Adam learning rate of the actors and the critics"""
    buffer_size: int = 1_000_000
    """replay buffer capacity (joint steps)"""
    gamma: float = 0.95
    """discount factor"""
    tau: float = 0.01
    """target network update rate (1.0: a hard copy)"""
    batch_size: int = 1024
    """replay minibatch size (each agent draws its own)"""
    learning_starts: int = 25_600
    """joint steps stored before the first update (the authors' code: batch x 25)"""
    train_every: int = 100
    """joint steps between updates (each update: one gradient step of every agent)"""
    exploration_noise: float = 0.1
    """std of the Gaussian noise on the actions (in units of the action's range)"""
    max_grad_norm: float = 0.5
    """gradient norm clip of each actor and critic"""
    actor_reg: float = 1e-3
    """weight of the penalty on the actor's squared pre-activations (the authors' code)"""
    hidden_dim: int = 64
    """width of the two hidden layers of every actor and critic"""
    env_id: str = "simple_spread_v3"
    """mpe2 task (see TASKS)"""
    total_timesteps: int = 300_000
    """joint steps over all envs"""
    num_envs: int = 8
    """mpe2 parallel_envs stepped in turn"""


MAX_CYCLES = 25  # steps per episode (mpe2's default; the paper's)
# the mpe2 tasks with more than one agent, and their settings; one actor and critic per agent fits
# them all
TASKS = {
    # cooperative: N agents cover N landmarks without colliding
    "simple_spread_v3": {"N": 3, "local_ratio": 0.5},
    # cooperative: 2 agents; each says which landmark the other must reach
    "simple_reference_v3": {"local_ratio": 0.5},
    "simple_speaker_listener_v4": {},  # cooperative: a speaker (who cannot move) guides a listener
    # cooperative
    "simple_formation_v1": {"N": 4},
    "simple_line_v1": {"N": 4},
    "collect_treasure_v1": {},
    "simple_adversary_v3": {"N": 2},  # competitive: 1 adversary, 2 good agents, 2 landmarks
    "simple_tag_v3": {},  # competitive: 3 slow adversaries chase 1 fast good agent
    "simple_push_v3": {},  # competitive: 1 adversary pushes 1 good agent away from its landmark
    # competitive: alice and bob share a message that eve (the adversary) must not decode
    "simple_crypto_v3": {},
    # competitive: 4 adversaries (one leads, speaking) chase 2 good agents among forests
    "simple_world_comm_v3": {},
}
NOT_SUPPORTED = {"simple_v3": "one agent: nothing to centralise, it is DDPG"}


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


class Actor(nn.Module):
    """mu_i: o_i -> 64 -> 64 (ReLU) -> one pre-activation per action component, squashed by a
    sigmoid into the action box [low, high] (buffers: saved with the weights, so a saved actor needs
    no env to act); nn.Linear's default init."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int, low=0.0, high=1.0):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, action_dim),
        )
        self.register_buffer(
            "low", torch.tensor(low, dtype=torch.float32).expand(action_dim).clone()
        )
        self.register_buffer(
            "high", torch.tensor(high, dtype=torch.float32).expand(action_dim).clone()
        )

    def squash(self, pre_activation):
        return self.low + (self.high - self.low) * torch.sigmoid(pre_activation)

    def forward(self, obs):
        return self.squash(self.network(obs))

    def get_greedy_action(self, obs):
        """mu_i(o_i), the deterministic action: what evaluate() runs and what exploration adds noise
        to."""
        return self(obs)


class Critic(nn.Module):
    """Q_i: the joint observation (every agent's) and the joint action (every agent's) -> 64 -> 64
    (ReLU) -> Q-value."""

    def __init__(self, joint_obs_dim: int, joint_action_dim: int, hidden: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(joint_obs_dim + joint_action_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, joint_obs, joint_actions):
        return self.network(torch.cat([joint_obs, joint_actions], -1)).squeeze(-1)


def joint_action(actors, joint_obs, obs_dims):
    """(a_1..a_N) = (mu_1(o_1)..mu_N(o_N)), concatenated: each actor sees only its own agent's
    observation."""
    return torch.cat(
        [actor.get_greedy_action(o) for actor, o in zip(actors, joint_obs.split(obs_dims, -1))], -1
    )


def with_action(joint_actions, i, action_i, action_dims):
    """The joint action with agent i's part replaced by action_i (eq. 6: the other agents' actions
    stay as drawn)."""
    parts = list(joint_actions.split(action_dims, -1))
    parts[i] = action_i
    return torch.cat(parts, -1)


def maddpg_target(next_q, rewards, terminated, gamma):
    """y_i = r_i + gamma * Q'_i(x', mu'_1(o'_1)..mu'_N(o'_N)) (the paper's eq. 6) with the target
    actors and critic; only termination stops the bootstrap: a time-limit truncation has a future
    (the stored x' is its true last one)."""
    return rewards + gamma * (1.0 - terminated) * next_q


def explore(actions, noise_std, low, high, rng):
    """The actors' actions plus Gaussian noise (std in units of each component's range), clipped to
    the box."""
    noisy = actions + rng.normal(0.0, 1.0, actions.shape) * noise_std * (high - low)
    return np.clip(noisy, low, high).astype(np.float32)


class ReplayBuffer:
    """A ring buffer of preallocated numpy arrays of joint steps: the joint observation, the true
    next joint observation (the last one of an episode cut by the time limit), the joint action,
    every agent's reward and `terminated`. Checkpointable through state_dict(), which holds only the
    filled part."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(
        self, size: int, obs_dim: int, action_dim: int, n_agents: int, rng: np.random.Generator
    ):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros((size, action_dim), np.float32)
        self.rewards = np.zeros((size, n_agents), np.float32)
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
        n = self.size if self.full else self.pos
        return {
            **{name: getattr(self, name)[:n] for name in self.FIELDS},
            "pos": self.pos,
            "full": self.full,
        }

    def load_state_dict(self, state):  # a checkpoint holds the numpy arrays as tensors
        for name in self.FIELDS:
            value = state[name].numpy() if torch.is_tensor(state[name]) else state[name]
            getattr(self, name)[: len(value)] = value
        self.pos = state["pos"]
        self.full = state["full"]


def episode_metrics(prefix: str, returns, adversary) -> dict:
    """{metric name: one value per episode} from each agent's episodic returns (episodes, n_agents):
    the per-agent mean, and in a competitive task the mean of each team (adversary: which agents are
    adversaries)."""
    metrics = {f"{prefix}/episodic_return_agent_mean": returns.mean(-1)}
    if adversary.any() and not adversary.all():
        metrics[f"{prefix}/episodic_return_adversary_mean"] = returns[:, adversary].mean(-1)
        metrics[f"{prefix}/episodic_return_good_mean"] = returns[:, ~adversary].mean(-1)
    return metrics


@torch.no_grad()
def evaluate(actors, env_id, episodes, seed, device="cpu", frames=None):
    """Deterministic play (the actors' actions, no noise) of one episode in each of `episodes` envs
    (env i seeded with seed + i); returns {metric name: [one value per episode]} (episode_metrics).
    frames: a list that receives episode 0's frames (--capture-video)."""
    env = MPEEnvs(
        env_id,
        max(episodes, 1),
        device,
        continuous_actions=True,
        auto_reset=False,
        render_env0=frames is not None,
    )
    if episodes == 0:
        return {k: [] for k in episode_metrics("eval", np.zeros((0, env.n_agents)), env.adversary)}
    obs = env.reset(seed)
    finished = np.zeros(episodes, dtype=bool)
    returns = np.zeros((episodes, env.n_agents))
    if frames is not None:
        frames.append(env.render()[::2, ::2])  # 350 x 350 pixels
    while not finished.all():
        obs, _, _, done, info = env.step(joint_action(actors, obs, env.obs_dims).cpu().numpy())
        returns[done] = info["episode_return"][done]
        if frames is not None and not finished[0]:
            frames.append(env.render()[::2, ::2])
        finished |= done
    return {k: v.tolist() for k, v in episode_metrics("eval", returns, env.adversary).items()}


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging, parameter by parameter: target <- tau * online + (1 - tau) * target
    (tau = 1: a copy)."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    env = MPEEnvs(args.env_id, args.num_envs, device, continuous_actions=True)
    N = args.num_envs
    A = env.n_agents
    obs_dims = env.obs_dims
    action_dims = env.action_dims
    low = np.split(env.low, env.splits)
    high = np.split(env.high, env.splits)
    make_actors = lambda: nn.ModuleList(  # noqa: E731
        Actor(o, a, args.hidden_dim, lo, hi)
        for o, a, lo, hi in zip(obs_dims, action_dims, low, high)
    ).to(device)
    make_critics = lambda: nn.ModuleList(  # noqa: E731
        Critic(sum(obs_dims), sum(action_dims), args.hidden_dim) for _ in range(A)
    ).to(device)
    # agent i: actors[i], critics[i]; nothing is shared
    actors = make_actors()
    critics = make_critics()
    actors_target = make_actors()
    critics_target = make_critics()
    actors_target.load_state_dict(actors.state_dict())
    critics_target.load_state_dict(critics.state_dict())
    actor_optimizers = [torch.optim.Adam(a.parameters(), lr=args.learning_rate) for a in actors]
    critic_optimizers = [torch.optim.Adam(c.parameters(), lr=args.learning_rate) for c in critics]
    rng = np.random.default_rng(args.seed)  # exploration noise and replay sampling
    rb = ReplayBuffer(args.buffer_size, sum(obs_dims), sum(action_dims), A, rng)
    num_iterations = args.total_timesteps // N  # one iteration = one step of every env
    iteration = 0

    def run_eval(video_dir=None):  # seeded apart from training; episode 0 filmed into video_dir
        frames = [] if video_dir else None
        results = evaluate(
            actors, args.env_id, args.eval_episodes, args.seed + 10**9, device, frames
        )
        if frames:
            save_gif(frames, video_dir / "eval_episode0.gif", 100)
        return results

    stateful = {
        "actors": actors,
        "critics": critics,
        "actors_target": actors_target,
        "critics_target": critics_target,
        **{f"actor_optimizer_{i}": opt for i, opt in enumerate(actor_optimizers)},
        **{f"critic_optimizer_{i}": opt for i, opt in enumerate(critic_optimizers)},
        "rb": rb,
        "rng": RNGs(rng),
    }  # what a checkpoint holds, saved and resumed
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * N
    logger = RunLogger(args, run_dir, num_iterations * N, global_step, ckpt=ckpt, script=__file__)

    def update(i):
        """One gradient step of agent i's critic and actor on its own minibatch, then of its targets
        (authors' code)."""
        b_obs, b_next_obs, b_actions, b_rewards, b_terminated = rb.sample(args.batch_size, device)
        with torch.no_grad():
            next_q = critics_target[i](
                b_next_obs, joint_action(actors_target, b_next_obs, obs_dims)
            )
            target = maddpg_target(next_q, b_rewards[:, i], b_terminated, args.gamma)
        q = critics[i](b_obs, b_actions)
        critic_loss = F.mse_loss(q, target)
        critic_optimizers[i].zero_grad()
        critic_loss.backward()
        nn.utils.clip_grad_norm_(critics[i].parameters(), args.max_grad_norm)
        critic_optimizers[i].step()

        pre_activation = actors[i].network(b_obs.split(obs_dims, -1)[i])
        # the actor loss needs no gradient for the critic's weights
        critics[i].requires_grad_(False)
        actions = with_action(b_actions, i, actors[i].squash(pre_activation), action_dims)
        actor_loss = (
            -critics[i](b_obs, actions).mean() + args.actor_reg * pre_activation.pow(2).mean()
        )
        critics[i].requires_grad_(True)
        actor_optimizers[i].zero_grad()
        actor_loss.backward()
        nn.utils.clip_grad_norm_(actors[i].parameters(), args.max_grad_norm)
        actor_optimizers[i].step()

        soft_update(actors_target[i], actors[i], args.tau)
        soft_update(critics_target[i], critics[i], args.tau)
        return {
            f"losses/critic_loss_{i}": critic_loss,
            f"losses/actor_loss_{i}": actor_loss,
            f"losses/q_values_{i}": q.mean(),
        }

    obs = env.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes

    stats = {}
    for iteration in range(iteration, num_iterations):
        with torch.no_grad():
            actions = joint_action(actors, obs, obs_dims).cpu().numpy()
        actions = explore(actions, args.exploration_noise, env.low, env.high, rng)
        next_obs, rewards, terminated, done, info = env.step(actions)
        # true last obs where done
        rb.add(obs.cpu().numpy(), info["final_obs"], actions, rewards, terminated)
        global_step += N
        obs = next_obs
        if done.any():  # every finished episode of every env
            metrics = episode_metrics("train", info["episode_return"][done], env.adversary)
            for k in range(done.sum()):
                logger.log(
                    global_step,
                    {
                        **{name: v[k] for name, v in metrics.items()},
                        "train/episodic_length": info["episode_length"][done][k],
                    },
                )
            logger.last_return = metrics["train/episodic_return_agent_mean"].mean()

        # one update of every agent per train_every steps crossed
        if global_step >= args.learning_starts:
            for _ in range(global_step // args.train_every - (global_step - N) // args.train_every):
                stats = {k: v for i in range(A) for k, v in update(i).items()}
        if iteration % 100 == 0:  # every 100 vector steps (the only host syncs of the losses)
            if stats:
                logger.log(global_step, stats)
            logger.progress(global_step)
        logger.end_iteration(stateful, iteration + 1, global_step, run_eval)
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={
            "actors": actors.state_dict(),
            "obs_dims": obs_dims,
            "action_dims": action_dims,
            "hidden": args.hidden_dim,
        },
    )


def check_args(args: Args):
    check_task(args.env_id, "ddpg_continuous.py", "dqn.py")
    check_ranges(
        args, {"train_every": "x >= 1", "exploration_noise": "x >= 0", "actor_reg": "x >= 0"}
    )
    check_replay_flags(args)


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
