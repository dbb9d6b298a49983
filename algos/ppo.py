"""PPO for discrete actions on classic control (CartPole-v1 by default).

Schulman et al. 2017 with the details of Huang et al. 2022, "The 37 Implementation Details of PPO":
separate actor and critic MLPs, orthogonal init, GAE, advantages normalised per minibatch, global
gradient clipping, Adam eps 1e-5; a truncation is bootstrapped with V(final obs). Defaults: rl-zoo's
CartPole-v1, but lr 2e-3. Deviation: the value loss is not clipped (CleanRL's ppo.py clips it).
It also takes the memory envs (CartPoleNoVel-v1, RepeatFirst-v0): the control of ppo_lstm.py.

Run:    python algos/ppo.py --env-id CartPole-v1 --seed 1
Quick:  python algos/ppo.py --total-timesteps 20000
Results: benchmark/references.toml
"""

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from canonrl.envs import register_memory_envs
from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_ranges,
    env_spaces,
    fail,
    load_states,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    learning_rate: float = 2e-3
    """Adam learning rate (rl-zoo: 1e-3; 2e-3 reaches 475 about 2x sooner)"""
    rmsprop: bool = False
    """RMSprop (alpha 0.99, eps 1e-5) in place of Adam: a2c.py's optimiser"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = True
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 32
    """steps per env per rollout"""
    gamma: float = 0.98
    """discount factor"""
    gae_lambda: float = 0.8
    """lambda of GAE"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch"""
    num_minibatches: int = 1
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 20
    """epochs over each rollout"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update early when the approximate KL exceeds this"""
    env_id: str = "CartPole-v1"
    """Gymnasium id of a discrete-action env with a flat observation vector"""
    total_timesteps: int = 100_000
    """environment steps over all envs"""
    num_envs: int = 8
    """parallel environments (one synchronous vector env)"""


register_memory_envs()  # CartPoleNoVel-v1, PendulumNoVel-v1, MountainCarNoVel-v0, RepeatFirst-v0


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


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs, obs -> 64 -> 64 (tanh) -> logits / value, as in CleanRL and
    SB3."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )  # std 0.01: a near-uniform first policy

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_greedy_action(self, x):
        """The most probable action: the policy that evaluate() runs."""
        return self.actor(x).argmax(dim=-1)

    def get_action_and_value(self, x, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the entropy
        and V(x)."""
        dist = torch.distributions.Categorical(logits=self.actor(x), validate_args=False)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x)


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


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy (argmax) episodes on a fresh env; returns the list of episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = agent.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)
            )
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


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
    agent = Agent(obs_dim, n_actions).to(device)
    optimizer = (
        torch.optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=0.99, eps=1e-5)
        if args.rmsprop
        else torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    )
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    # what a checkpoint holds, saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

    @torch.no_grad()
    def value_fn(obs):  # V(obs) of a numpy batch of final observations
        return (
            agent.get_value(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()
        )

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
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
            episode_return = episode_return + reward
            episode_length = episode_length + 1
            global_step += args.num_envs
            reward = bootstrap_time_limits(
                reward, terminated, truncated, infos, value_fn, args.gamma
            )
            rewards[step] = torch.as_tensor(reward)
            dones[step] = torch.as_tensor(terminated | truncated)
            # every finished episode of every sub-env
            for i in np.flatnonzero(terminated | truncated):
                logger.log_episode(global_step, episode_return[i], episode_length[i])
                episode_return[i] = 0.0
                episode_length[i] = 0
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
                mb_advantages = b_advantages[mb]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )
                _, logprob, entropy, value = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                loss, stats = ppo_loss(
                    logprob,
                    entropy,
                    value,
                    b_logprobs[mb],
                    b_values[mb],
                    mb_advantages,
                    b_returns[mb],
                    clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                )
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break
        # nan: constant returns
        stats["explained_variance"] = 1 - (b_returns - b_values).var() / b_returns.var()
        logger.log(
            global_step,
            {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        logger.end_iteration(stateful, iteration, global_step, run_eval)
    envs.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"agent": agent.state_dict(), "obs_dim": obs_dim, "n_actions": n_actions},
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "ppo_continuous.py",
        )
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(
            f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}",
            "ppo_atari.py",
        )
    check_ranges(args)
    batch = args.num_envs * args.num_steps
    if batch % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does "
            f"not divide the batch num_envs*num_steps = {batch}"
        )
    if args.total_timesteps < batch:
        fail(
            f"--total-timesteps {args.total_timesteps} is less "
            f"than one rollout (num_envs*num_steps = {batch})"
        )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
