"""PPO for continuous actions on MuJoCo (Hopper-v5 by default).

Schulman et al. 2017 with Huang et al. 2022's details, as CleanRL's ppo_continuous_action.py. Unlike
ppo.py: a Gaussian policy (its log-std a parameter), actions clipped to the bounds when stepping,
observations and rewards normalised by running statistics (clipped to [-10, 10]; saved with the
model and frozen at evaluation, which takes the mean action), the value loss clipped, the clip
coefficient not annealed. Defaults: CleanRL's MuJoCo settings. It also takes ppo_lstm.py's
PendulumNoVel-v1 (velocities hidden), as the control without memory.

Run:    python algos/ppo_continuous.py --env-id Hopper-v5 --seed 1
Quick:  python algos/ppo_continuous.py --env-id InvertedPendulum-v5 --total-timesteps 20480
Results: benchmark/references.toml
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Normal

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
    learning_rate: float = 3e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = False
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 2048
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor (also of the running return that normalises the rewards)"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    num_minibatches: int = 32
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 10
    """epochs over each rollout"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's values by the clip coefficient (ppo2, CleanRL)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update early when the approximate KL exceeds this"""
    env_id: str = "Hopper-v5"
    """Gymnasium id of a continuous-action (Box) env with a flat observation vector"""
    total_timesteps: int = 1_000_000
    """environment steps over all envs"""
    num_envs: int = 1
    """parallel environments (one synchronous vector env)"""


register_memory_envs()  # CartPoleNoVel-v1, PendulumNoVel-v1, MountainCarNoVel-v0, RepeatFirst-v0


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance (of the observations, or of the discounted return),
    checkpointable."""

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state):  # a checkpoint holds the numpy arrays as tensors
        self.mean, self.var, self.count = (
            v.numpy() if torch.is_tensor(v) else v for v in state.values()
        )


def normalize_observation(env, obs_rms: RunningMeanStd, update: bool):
    """Observations minus the running mean, over the running std of obs_rms, clipped to [-10, 10]
    (CleanRL, SB3's VecNormalize). update=False freezes the statistics (evaluation). One obs_rms
    serves every env that uses it."""
    env = gym.wrappers.NormalizeObservation(env)
    env.obs_rms = obs_rms
    env.update_running_mean = update
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.clip(obs, -10, 10), env.observation_space
    )


def make_env(env_id, video_dir=None):
    """env_id; with video_dir, episode 0 is recorded there as eval-episode-0.mp4
    (--capture-video)."""
    if video_dir is None:
        return gym.make(env_id)
    if sys.platform == "linux" and "DISPLAY" not in os.environ:
        # no display: MuJoCo renders off-screen through EGL
        os.environ.setdefault("MUJOCO_GL", "egl")
    return gym.wrappers.RecordVideo(
        gym.make(env_id, render_mode="rgb_array"),
        str(video_dir),
        lambda ep: ep == 0,
        name_prefix="eval",
        disable_logger=True,
    )


def make_train_env(env_id, obs_rms, return_rms, gamma):
    """A training env: observations normalised by obs_rms (updated), rewards by return_rms's
    discounted return."""
    # the true returns, before rewards are normalised
    env = gym.wrappers.RecordEpisodeStatistics(make_env(env_id))
    env = normalize_observation(gym.wrappers.ClipAction(env), obs_rms, update=True)
    # divided by the running std of the discounted return
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    env.return_rms = return_rms
    return gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs, obs -> 64 -> 64 (tanh) -> action mean / value, as in CleanRL
    and SB3; the policy is Normal(mean, exp(actor_logstd)), its log-std a parameter independent of
    the state."""

    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, action_dim), std=0.01),
        )  # std 0.01: first means near 0
        self.actor_logstd = nn.Parameter(torch.zeros(action_dim))  # std 1 at the start

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_greedy_action(self, x):
        """The mean action: the policy that evaluate() runs (the env clips it to the bounds)."""
        return self.actor_mean(x)

    def get_action_and_value(self, x, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the entropy
        and V(x)."""
        dist = Normal(self.actor_mean(x), self.actor_logstd.exp(), validate_args=False)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.get_value(x)


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
def evaluate(agent, obs_rms, env_id, episodes, seed, device="cpu", video_dir=None):
    """Deterministic episodes (the mean action, clipped to the bounds) on a fresh env whose
    observations are normalised by obs_rms, frozen; returns the list of episodic returns."""
    env = normalize_observation(
        gym.wrappers.ClipAction(make_env(env_id, video_dir)), obs_rms, update=False
    )
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = agent.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)[None]
            )
            obs, reward, terminated, truncated, _ = env.step(action[0].cpu().numpy())
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # one set of normalisation statistics for all envs: the set that is saved and used at evaluation
    obs_rms = RunningMeanStd(shape=env_spaces(args.env_id, __file__)[0].shape)
    return_rms = RunningMeanStd(shape=())
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_train_env(args.env_id, obs_rms, return_rms, args.gamma)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_dim = envs.single_observation_space.shape[0]
    action_dim = envs.single_action_space.shape[0]
    agent = Agent(obs_dim, action_dim).to(device)
    # fused: 4x faster
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            agent, obs_rms, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    stateful = {
        "agent": agent,
        "optimizer": optimizer,
        "rng": RNGs(),
        "obs_rms": obs_rms,
        "return_rms": return_rms,
    }
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

    @torch.no_grad()
    # V(obs) of a numpy batch of final observations (normalised by their env's wrapper)
    def value_fn(obs):
        return (
            agent.get_value(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()
        )

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs, action_dim), device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
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
            global_step += args.num_envs
            reward = bootstrap_time_limits(
                reward, terminated, truncated, infos, value_fn, args.gamma
            )
            rewards[step] = torch.as_tensor(reward)
            dones[step] = torch.as_tensor(terminated | truncated)
            # RecordEpisodeStatistics's unnormalised return of each that ended
            episodes = infos.get("final_info", {})
            # every finished episode of every sub-env
            for i in np.flatnonzero(episodes.get("_episode", [])):
                logger.log_episode(
                    global_step, episodes["episode"]["r"][i], episodes["episode"]["l"][i]
                )
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
                    clip_coef if args.clip_vloss else None,
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
    # obs_rms: the observation statistics the agent was trained with, needed to evaluate it
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={
            "agent": agent.state_dict(),
            "obs_dim": obs_dim,
            "action_dim": action_dim,
            "obs_rms": obs_rms.state_dict(),
        },
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
        fail(f"{SCRIPT} needs continuous (Box) actions but {args.env_id} has {act_space}", "ppo.py")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}")
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
