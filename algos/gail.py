"""GAIL (Ho & Ermon 2016): PPO whose reward is a discriminator's, learnt from expert demonstrations.

D(s, a), an MLP of logits (discrete actions one-hot), learns by BCE to tell a Minari dataset's pairs
(1) from the rollout's (0), --disc-epochs passes per rollout; PPO (ppo.py's, its defaults; for Box
actions ppo_continuous.py's Gaussian and obs normalisation) gets softplus(logit) = -log(1 - D); the
env's reward is only logged. Unlike imitation's GAIL: D 64x64 tanh (32x32 ReLU), Adam 3e-4 (1e-3),
every rollout pair each epoch (2 batches of demo_batch_size), the reward scaled by a running std.

Run:    python benchmark/datasets.py --kind expert --steps 1 --policy <P> --expert <P>
        python algos/gail.py --seed 1  # P: benchmark/policies/dqn-CartPole-v1-100k/model.pt
Quick:  python algos/gail.py --total-timesteps 20480
Results: benchmark/references.toml
"""

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.distributions import Categorical, Normal

from canonrl.data import dataset_arrays, normalized_scores, open_dataset
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
    dataset: str = "canonrl/cartpole/expert-v0"
    """expert demonstrations, a Minari dataset: a directory, or an id in MINARI_DATASETS_PATH"""
    demo_episodes: int | None = None
    """use only the dataset's first this many episodes (None: all)"""
    disc_learning_rate: float = 3e-4
    """Adam learning rate of the discriminator"""
    disc_epochs: int = 1
    """discriminator epochs over each rollout (num_minibatches minibatches each)"""
    normalize_reward: bool = True
    """divide the rewards by a running std of their discounted return (as ppo_continuous.py): D's
    rewards change scale as it learns, and with them the critic's targets; on CartPole-v1 from one
    expert episode the runs without it fell back below 500, those with it did not"""
    learning_rate: float = 2e-3
    """Adam learning rate of the policy and value"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = True
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 32
    """steps per env per rollout"""
    gamma: float = 0.98
    """discount factor (also of the running return that normalises the rewards)"""
    gae_lambda: float = 0.8
    """lambda of GAE"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch"""
    num_minibatches: int = 1
    """minibatches per epoch, of PPO and of the discriminator (must divide num_envs * num_steps)"""
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
    """Gymnasium id of an env of discrete or Box actions with flat observations: the dataset's"""
    total_timesteps: int = 100_000
    """environment steps over all envs"""
    num_envs: int = 8
    """parallel environments (one synchronous vector env)"""


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


def make_agent_env(env_id, continuous: bool, video_dir=None):
    """make_env, its Box actions clipped to the bounds when stepping (ppo_continuous.py)."""
    env = make_env(env_id, video_dir)
    return gym.wrappers.ClipAction(env) if continuous else env


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance (of the observations, or of the discounted return),
    checkpointable."""

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state):  # a checkpoint holds the numpy arrays as tensors
        self.mean, self.var, self.count = (
            v.numpy() if torch.is_tensor(v) else v for v in state.values()
        )


def policy_input(obs, obs_rms, continuous: bool, device="cpu"):
    """What the policy sees of a numpy batch of observations: for Box actions, minus obs_rms's
    running mean, over its std, clipped to [-10, 10] (ppo_continuous.py's NormalizeObservation);
    for discrete ones, the observations themselves (ppo.py)."""
    if continuous:
        obs = np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)
    return torch.as_tensor(obs, dtype=torch.float32, device=device)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs, obs -> 64 -> 64 (tanh) -> value / the policy: for discrete
    actions (action_dim of them) Categorical(logits), ppo.py's; for Box actions (action_dim
    dimensions) Normal(mean, exp(actor_logstd)), its log-std a parameter, ppo_continuous.py's."""

    def __init__(self, obs_dim: int, action_dim: int, continuous: bool):
        super().__init__()
        self.continuous = continuous
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
            layer_init(nn.Linear(64, action_dim), std=0.01),
        )  # std 0.01: a near-uniform first policy, first means near 0
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(action_dim))  # std 1 at the start

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None, greedy: bool = False):
        """Sample an action (greedy: the most probable one, or the mean: the policy evaluate()
        runs; or take the given one); return it with its log-probability, the entropy and V(x)."""
        if self.continuous:
            dist = Normal(self.actor(x), self.actor_logstd.exp(), validate_args=False)
        else:
            dist = Categorical(logits=self.actor(x), validate_args=False)
        if action is None:
            action = dist.mode if greedy else dist.sample()
        logprob = dist.log_prob(action)
        entropy = dist.entropy()
        if self.continuous:  # independent dimensions
            logprob = logprob.sum(-1)
            entropy = entropy.sum(-1)
        return action, logprob, entropy, self.get_value(x)


class Discriminator(nn.Module):
    """D(s, a) as a logit: [standardised obs, action] -> 64 -> 64 (tanh) -> 1; a high logit says
    expert. Observations are standardised by the demonstrations' mean and std, discrete actions
    one-hot, Box actions clipped to the env's bounds (what the env did) and scaled to [-1, 1]. The
    statistics and bounds are buffers: saved with the weights."""

    def __init__(self, obs_dim, action_dim, continuous, obs_mean, obs_std, low=-1.0, high=1.0):
        super().__init__()
        self.continuous = continuous
        self.action_dim = action_dim
        self.network = nn.Sequential(
            nn.Linear(obs_dim + action_dim, 64),
            nn.Tanh(),
            nn.Linear(64, 64),
            nn.Tanh(),
            nn.Linear(64, 1),
        )
        self.register_buffer("obs_mean", torch.as_tensor(obs_mean, dtype=torch.float32))
        self.register_buffer("obs_std", torch.as_tensor(obs_std, dtype=torch.float32))
        low = torch.as_tensor(low, dtype=torch.float32).expand(action_dim).clone()
        high = torch.as_tensor(high, dtype=torch.float32).expand(action_dim).clone()
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)

    def forward(self, obs, actions):
        if self.continuous:
            actions = actions.clamp(self.action_low, self.action_high)
            scale = (self.action_high - self.action_low) / 2
            actions = (actions - self.action_low) / scale - 1
        else:
            actions = F.one_hot(actions.long(), self.action_dim).float()
        x = torch.cat([(obs - self.obs_mean) / self.obs_std, actions], dim=-1)
        return self.network(x).squeeze(-1)


def gail_reward(logits):
    """The learner's reward of pairs of discriminator logits: -log(1 - D(s, a)) = softplus(logit)
    (imitation's GAIL): positive, larger the more expert the pair looks."""
    return F.softplus(logits)


def discriminator_loss(expert_logits, policy_logits):
    """Binary cross-entropy of the logits, expert pairs labelled 1 and the policy's 0, averaged
    over all the pairs (imitation's; equal numbers of each)."""
    logits = torch.cat([expert_logits, policy_logits])
    labels = torch.cat([torch.ones_like(expert_logits), torch.zeros_like(policy_logits)])
    return F.binary_cross_entropy_with_logits(logits, labels)


def train_discriminator(disc, optimizer, obs, actions, expert_obs, expert_actions, epochs, size):
    """`epochs` passes over the policy's pairs (obs, actions) in shuffled minibatches of `size`,
    each against as many expert pairs drawn uniformly (with replacement) from the demonstrations;
    one Adam step per minibatch. Returns the last minibatch's loss and accuracies."""
    for _ in range(epochs):
        perm = torch.randperm(len(obs), device=obs.device)
        for start in range(0, len(obs), size):
            mb = perm[start : start + size]
            idx = torch.randint(len(expert_obs), (len(mb),), device=obs.device)
            expert_logits = disc(expert_obs[idx], expert_actions[idx])
            policy_logits = disc(obs[mb], actions[mb])
            loss = discriminator_loss(expert_logits, policy_logits)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {
        "losses/discriminator_loss": loss.detach(),
        "charts/discriminator_expert_accuracy": (expert_logits > 0).float().mean(),
        "charts/discriminator_policy_accuracy": (policy_logits < 0).float().mean(),
    }


def normalize_rewards(rewards, dones, running_return, return_rms, gamma):
    """rewards (T, N) over the running std of their discounted return, clipped to [-10, 10]
    (gymnasium's NormalizeReward, as ppo_continuous.py). running_return (N,), each env's discounted
    return so far, carries on across rollouts and restarts after an episode's last step."""
    scaled = torch.zeros_like(rewards)
    for t in range(len(rewards)):
        running_return[:] = running_return * gamma + rewards[t].cpu().numpy()
        return_rms.update(running_return)
        scaled[t] = (rewards[t] / np.sqrt(return_rms.var + 1e-8)).clamp(-10, 10)
        running_return[dones[t].cpu().numpy() > 0] = 0.0
    return scaled


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
    """Greedy episodes (the most probable action, or the mean one clipped to the bounds) on a fresh
    env, the observations normalised by obs_rms, frozen (Box actions); returns the episodic
    returns of the env's own reward."""
    env = make_agent_env(env_id, agent.continuous, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            x = policy_input(obs[None], obs_rms, agent.continuous, device)
            action = agent.get_action_and_value(x, greedy=True)[0][0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(
                action if agent.continuous else int(action)
            )
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def demonstrations(dataset, episodes: int | None):
    """The dataset's transitions as arrays (canonrl.data.dataset_arrays), of its first `episodes`
    episodes only (None: all)."""
    if episodes is not None:
        dataset = minari.MinariDataset(dataset.storage, dataset.episode_indices[:episodes])
    return dataset_arrays(dataset)


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    obs_space, act_space = env_spaces(args.env_id, __file__)
    continuous = isinstance(act_space, gym.spaces.Box)
    dataset = open_dataset(args.dataset)
    demos = demonstrations(dataset, args.demo_episodes)
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_agent_env(args.env_id, continuous)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_dim = obs_space.shape[0]
    action_dim = act_space.shape[0] if continuous else int(act_space.n)
    agent = Agent(obs_dim, action_dim, continuous).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    bounds = (act_space.low, act_space.high) if continuous else ()
    # the demonstrations' mean and std (+ 1e-3, CORL's epsilon) standardise what D sees
    disc_obs_std = demos["obs"].std(0) + 1e-3
    disc = Discriminator(
        obs_dim, action_dim, continuous, demos["obs"].mean(0), disc_obs_std, *bounds
    ).to(device)
    disc_optimizer = torch.optim.Adam(disc.parameters(), lr=args.disc_learning_rate, fused=True)
    expert_obs = torch.as_tensor(demos["obs"], device=device)
    expert_actions = torch.as_tensor(demos["actions"], device=device)
    # the policy's observation statistics (Box actions; saved, frozen at evaluation) and those of
    # the discounted return of the rewards
    obs_rms = RunningMeanStd(shape=obs_space.shape)
    return_rms = RunningMeanStd(shape=())
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        returns = evaluate(
            agent, obs_rms, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )
        scores = normalized_scores(returns, dataset)
        return {
            "eval/episodic_return": returns,
            **({"eval/normalized_score": scores} if scores else {}),
        }

    # what a checkpoint holds, saved and resumed (not the dataset)
    stateful = {
        "agent": agent,
        "optimizer": optimizer,
        "discriminator": disc,
        "disc_optimizer": disc_optimizer,
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
    def value_fn(obs):  # V(obs) of a numpy batch of final observations
        return agent.get_value(policy_input(obs, obs_rms, continuous, device)).cpu().numpy()

    act_shape = (action_dim,) if continuous else ()
    act_dtype = torch.float32 if continuous else torch.long
    # raw_obs: the env's observations, which D sees; obs: the policy's (normalised for Box actions)
    raw_obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros(
        (args.num_steps, args.num_envs, *act_shape), dtype=act_dtype, device=device
    )
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    # gamma * V(final obs) where an episode was truncated, added to the reward
    bootstraps = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    running_return = np.zeros(args.num_envs)
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration + 1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = (
            frac * args.learning_rate if args.anneal_lr else args.learning_rate
        )
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef
        for step in range(args.num_steps):
            raw_obs[step] = torch.as_tensor(next_obs, device=device)
            if continuous:
                obs_rms.update(next_obs)
            obs[step] = policy_input(next_obs, obs_rms, continuous, device)
            with torch.no_grad():
                actions[step], logprobs[step], _, values[step] = agent.get_action_and_value(
                    obs[step]
                )
            next_obs, reward, terminated, truncated, infos = envs.step(actions[step].cpu().numpy())
            episode_return = episode_return + reward  # the env's reward: logged, never learnt
            episode_length = episode_length + 1
            global_step += args.num_envs
            bootstrap = bootstrap_time_limits(
                np.zeros(args.num_envs), terminated, truncated, infos, value_fn, args.gamma
            )
            bootstraps[step] = torch.as_tensor(bootstrap)
            dones[step] = torch.as_tensor(terminated | truncated)
            # every finished episode of every sub-env
            for i in np.flatnonzero(terminated | truncated):
                logger.log_episode(global_step, episode_return[i], episode_length[i])
                episode_return[i] = 0.0
                episode_length[i] = 0
        b_raw_obs = raw_obs.flatten(0, 1)
        b_actions = actions.flatten(0, 1)
        disc_stats = train_discriminator(
            disc,
            disc_optimizer,
            b_raw_obs,
            b_actions,
            expert_obs,
            expert_actions,
            args.disc_epochs,
            minibatch_size,
        )
        with torch.no_grad():  # the rewards of the discriminator just trained
            gail_rewards = gail_reward(disc(b_raw_obs, b_actions)).view_as(dones)
        rewards = gail_rewards
        if args.normalize_reward:
            rewards = normalize_rewards(rewards, dones, running_return, return_rms, args.gamma)
        rewards = rewards + bootstraps
        with torch.no_grad():
            next_value = agent.get_value(policy_input(next_obs, obs_rms, continuous, device))
        advantages, returns = compute_gae(
            rewards, values, dones, next_value, args.gamma, args.gae_lambda
        )
        b_obs = obs.flatten(0, 1)
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
                "charts/gail_reward": gail_rewards.mean(),
                **disc_stats,
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
            "continuous": continuous,
            "obs_rms": obs_rms.state_dict(),
            "discriminator": disc.state_dict(),
        },
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    discrete = isinstance(act_space, gym.spaces.Discrete)
    if not discrete and not (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1):
        fail(
            f"{SCRIPT} needs discrete or continuous (Box) actions but {args.env_id} has {act_space}"
        )
    if not discrete and not (
        np.isfinite(act_space.low).all() and np.isfinite(act_space.high).all()
    ):
        fail(f"{SCRIPT} clips actions to the env's bounds but {args.env_id} has {act_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(
            f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}",
            "ppo_atari.py",
        )
    check_ranges(
        args, {"demo_episodes": "x >= 1", "disc_learning_rate": "x > 0", "disc_epochs": "x >= 1"}
    )
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
    # the demonstrations last: the flags above need no dataset
    dataset = open_dataset(args.dataset)
    if dataset.total_episodes == 0 or dataset.total_steps == 0:
        fail(f"dataset {args.dataset!r} is empty: it holds no transition")
    if (dataset.observation_space, dataset.action_space) != (obs_space, act_space):
        fail(
            f"dataset {args.dataset!r} has spaces "
            f"{(dataset.observation_space, dataset.action_space)}, --env-id {args.env_id} "
            f"{(obs_space, act_space)}: give the env the demonstrations were recorded in"
        )
    if args.demo_episodes is not None and args.demo_episodes > dataset.total_episodes:
        fail(
            f"--demo-episodes {args.demo_episodes} is more than the "
            f"{dataset.total_episodes} episode(s) of dataset {args.dataset!r}"
        )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
