"""PPO with an LSTM (recurrent PPO) on partially observed classic control, discrete or continuous.

Schulman et al. 2017 with rl-zoo's recurrent policy: actor and critic LSTMs on the observation, a
ReLU layer after each; states reset where an episode ends, the update reruns whole env sequences.

Run:    python algos/ppo_lstm.py --env-id CartPoleNoVel-v1 --seed 1
Quick:  python algos/ppo_lstm.py --env-id RepeatFirst-v0 --total-timesteps 8192
Pendulum: python algos/ppo_lstm.py --env-id PendulumNoVel-v1 --norm-reward --gamma 0.9 \
    --num-envs 32 --num-steps 128 --num-minibatches 32 --update-epochs 10 --gae-lambda 0.95 \
    --no-anneal-lr --no-anneal-clip --total-timesteps 102400
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
    learning_rate: float = 1e-3
    """Adam learning rate (rl-zoo's for RecurrentPPO on CartPoleNoVel-v1)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = True
    """anneal the clip coefficient linearly to 0"""
    lstm_size: int = 64
    """units of each LSTM (the actor's and the critic's)"""
    num_steps: int = 32
    """steps per env per rollout (the length of the sequences the update runs the LSTM over)"""
    gamma: float = 0.98
    """discount factor"""
    gae_lambda: float = 0.8
    """lambda of GAE"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch"""
    norm_reward: bool = False
    """divide the rewards by the running std of the discounted return (SB3's VecNormalize)"""
    num_minibatches: int = 1
    """minibatches per epoch, each of num_envs / num_minibatches whole env sequences"""
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
    env_id: str = "CartPoleNoVel-v1"
    """Gymnasium id of an env with a flat observation vector and discrete or Box actions"""
    total_timesteps: int = 100_000
    """environment steps over all envs"""
    num_envs: int = 8
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
    """env_id, continuous actions clipped to their bounds; with video_dir, episode 0 is recorded
    there as eval-episode-0.mp4 (--capture-video)."""
    env = gym.make(env_id, render_mode=None if video_dir is None else "rgb_array")
    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.ClipAction(env)
    if video_dir is None:
        return env
    return gym.wrappers.RecordVideo(
        env, str(video_dir), lambda ep: ep == 0, name_prefix="eval", disable_logger=True
    )


class Agent(nn.Module):
    """rl-zoo's recurrent policy for these envs (sb3-contrib's RecurrentPPO with its tuned
    CartPoleNoVel-v1 settings): an actor and a critic, each an LSTM(lstm_size) on the observation,
    then one ReLU layer of 64, then the logits (continuous: the mean of a Normal whose log-std is a
    parameter, std 1 at the start) or the value; PyTorch's default initialisation. The state (h, c)
    holds the actor's and the critic's side by side, each of shape (1, num_envs, 2 * lstm_size).
    Inputs are in time-major order: x of shape (T * N, obs) holds T steps of N envs, `starts`
    (T * N) is 1 where an observation begins an episode (that env's states are zeroed before it)."""

    def __init__(self, obs_dim: int, n_actions: int, lstm_size: int = 64, continuous=False):
        super().__init__()
        self.actor_lstm = nn.LSTM(obs_dim, lstm_size)
        self.critic_lstm = nn.LSTM(obs_dim, lstm_size)
        self.actor = nn.Sequential(nn.Linear(lstm_size, 64), nn.ReLU(), nn.Linear(64, n_actions))
        self.critic = nn.Sequential(nn.Linear(lstm_size, 64), nn.ReLU(), nn.Linear(64, 1))
        self.continuous = continuous
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(n_actions))

    def initial_state(self, num_envs: int, device="cpu"):
        """The zero (h, c) state of num_envs envs: the actor's and the critic's, side by side."""
        zeros = torch.zeros(1, num_envs, 2 * self.actor_lstm.hidden_size, device=device)
        return zeros, zeros.clone()

    def get_states(self, x, lstm_state, starts):
        """The actor's and the critic's LSTM outputs at every step (each (T * N, lstm_size)), one
        step at a time so that each env's states are zeroed where its episode starts, and the
        state after the last step."""
        num_envs = lstm_state[0].shape[1]
        size = self.actor_lstm.hidden_size
        h, c = lstm_state
        actor_state = (h[..., :size], c[..., :size])
        critic_state = (h[..., size:], c[..., size:])
        actor_outputs = []
        critic_outputs = []
        for obs, start in zip(x.view(-1, num_envs, x.shape[-1]), starts.view(-1, num_envs)):
            keep = (1.0 - start).view(1, -1, 1)
            output, actor_state = self.actor_lstm(
                obs[None], (keep * actor_state[0], keep * actor_state[1])
            )
            actor_outputs.append(output[0])
            output, critic_state = self.critic_lstm(
                obs[None], (keep * critic_state[0], keep * critic_state[1])
            )
            critic_outputs.append(output[0])
        state = (
            torch.cat([actor_state[0], critic_state[0]], dim=-1),
            torch.cat([actor_state[1], critic_state[1]], dim=-1),
        )
        return torch.cat(actor_outputs), torch.cat(critic_outputs), state

    def get_value(self, x, lstm_state, starts):
        _, critic_hidden, _ = self.get_states(x, lstm_state, starts)
        return self.critic(critic_hidden).squeeze(-1)

    def get_greedy_action(self, x, lstm_state, starts):
        """The most probable action (the mean, if continuous) and the next LSTM state: the policy
        that evaluate() runs."""
        actor_hidden, _, lstm_state = self.get_states(x, lstm_state, starts)
        if self.continuous:
            return self.actor(actor_hidden), lstm_state
        return self.actor(actor_hidden).argmax(dim=-1), lstm_state

    def get_action_and_value(self, x, lstm_state, starts, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the
        entropy, V(x) and the next LSTM state."""
        actor_hidden, critic_hidden, lstm_state = self.get_states(x, lstm_state, starts)
        if self.continuous:
            dist = torch.distributions.Normal(
                self.actor(actor_hidden), self.actor_logstd.exp(), validate_args=False
            )
            # the action's dimensions are independent: sum their log-probabilities
            dist = torch.distributions.Independent(dist, 1)
        else:
            logits = self.actor(actor_hidden)
            dist = torch.distributions.Categorical(logits=logits, validate_args=False)
        if action is None:
            action = dist.sample()
        value = self.critic(critic_hidden).squeeze(-1)
        return action, dist.log_prob(action), dist.entropy(), value, lstm_state


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


def bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, gamma):
    """A time limit is not part of the task (Pardo et al. 2018): where an episode was truncated, add
    gamma * V(s_final) to its last reward. Unlike ppo.py's, value_fn(final_obs, envs) also gets the
    envs' indices: V of a final observation needs its env's LSTM state."""
    idx = np.flatnonzero(truncated & ~terminated)
    if len(idx) == 0:
        return reward
    final_obs = np.stack(infos["final_obs"][idx])
    return reward + np.bincount(idx, gamma * value_fn(final_obs, idx), len(reward))


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
    """Greedy episodes (the argmax, or the mean action) on a fresh env whose observations are
    normalised by obs_rms, frozen, the LSTM state carried from step to step (zero at the start of
    each episode); returns the list of episodic returns."""
    env = normalize_observation(make_env(env_id, video_dir), obs_rms, update=False)
    returns = []
    no_start = torch.zeros(1, device=device)  # the state is zeroed below, at each reset
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        lstm_state = agent.initial_state(1, device)
        while not done:
            action, lstm_state = agent.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device), lstm_state, no_start
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
    return_rms = RunningMeanStd(shape=())  # of the discounted return, with --norm-reward
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: normalize_observation(make_env(args.env_id), obs_rms, update=True)]
        * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    action_space = envs.single_action_space
    continuous = isinstance(action_space, gym.spaces.Box)
    obs_dim = envs.single_observation_space.shape[0]
    n_actions = action_space.shape[0] if continuous else int(action_space.n)
    agent = Agent(obs_dim, n_actions, args.lstm_size, continuous).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    batch_size = args.num_envs * args.num_steps
    envs_per_minibatch = args.num_envs // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            agent, obs_rms, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    # what a checkpoint holds, saved and resumed
    stateful = {
        "agent": agent,
        "optimizer": optimizer,
        "obs_rms": obs_rms,
        "return_rms": return_rms,
        "rng": RNGs(),
    }
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

    @torch.no_grad()
    def value_fn(final_obs, idx):  # V(final obs) of envs idx, each with its env's LSTM state now
        state = (lstm_state[0][:, idx], lstm_state[1][:, idx])
        final_obs = torch.as_tensor(final_obs, dtype=torch.float32, device=device)
        return agent.get_value(final_obs, state, torch.zeros(len(idx), device=device)).cpu().numpy()

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros(
        (args.num_steps, args.num_envs) + action_space.shape,
        dtype=torch.float32 if continuous else torch.long,
        device=device,
    )
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)  # the episode ended at t
    starts = torch.zeros((args.num_steps, args.num_envs), device=device)  # obs[t] begins one
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    next_start = torch.ones(args.num_envs, device=device)
    lstm_state = agent.initial_state(args.num_envs, device)
    # step t * num_envs + i of the flattened rollout is env i's step t
    flat_index = torch.arange(batch_size, device=device).view(args.num_steps, args.num_envs)
    episode_return = np.zeros(args.num_envs)
    discounted_return = np.zeros(args.num_envs)  # what --norm-reward divides by the std of
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration + 1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = (
            frac * args.learning_rate if args.anneal_lr else args.learning_rate
        )
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef
        initial_state = (lstm_state[0].clone(), lstm_state[1].clone())  # the update starts here
        for step in range(args.num_steps):
            obs[step] = torch.as_tensor(next_obs, device=device)
            starts[step] = next_start
            with torch.no_grad():
                actions[step], logprobs[step], _, values[step], lstm_state = (
                    agent.get_action_and_value(obs[step], lstm_state, starts[step])
                )
            next_obs, reward, terminated, truncated, infos = envs.step(actions[step].cpu().numpy())
            episode_return = episode_return + reward
            episode_length = episode_length + 1
            global_step += args.num_envs
            if args.norm_reward:
                discounted_return = discounted_return * args.gamma + reward
                return_rms.update(discounted_return)
                reward = np.clip(reward / np.sqrt(return_rms.var + 1e-8), -10, 10)
                discounted_return[terminated | truncated] = 0.0
            reward = bootstrap_time_limits(
                reward, terminated, truncated, infos, value_fn, args.gamma
            )
            rewards[step] = torch.as_tensor(reward)
            dones[step] = torch.as_tensor(terminated | truncated)
            next_start = dones[step]  # same-step autoreset: next_obs begins the next episode
            # every finished episode of every sub-env
            for i in np.flatnonzero(terminated | truncated):
                logger.log_episode(global_step, episode_return[i], episode_length[i])
                episode_return[i] = 0.0
                episode_length[i] = 0
        with torch.no_grad():
            next_value = agent.get_value(
                torch.as_tensor(next_obs, device=device), lstm_state, next_start
            )
        advantages, returns = compute_gae(
            rewards, values, dones, next_value, args.gamma, args.gae_lambda
        )
        b_obs = obs.flatten(0, 1)
        b_actions = actions.flatten(0, 1)
        b_logprobs = logprobs.flatten(0, 1)
        b_starts = starts.flatten(0, 1)
        b_advantages = advantages.flatten(0, 1)
        b_returns = returns.flatten(0, 1)
        b_values = values.flatten(0, 1)
        for epoch in range(args.update_epochs):
            env_perm = torch.randperm(args.num_envs, device=device)
            for start in range(0, args.num_envs, envs_per_minibatch):
                mb_envs = env_perm[start : start + envs_per_minibatch]
                mb = flat_index[:, mb_envs].flatten()  # whole sequences, in time-major order
                mb_advantages = b_advantages[mb]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )
                mb_state = (initial_state[0][:, mb_envs], initial_state[1][:, mb_envs])
                _, logprob, entropy, value, _ = agent.get_action_and_value(
                    b_obs[mb], mb_state, b_starts[mb], b_actions[mb]
                )
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
        model={
            "agent": agent.state_dict(),
            "obs_rms": obs_rms.state_dict(),
            "obs_dim": obs_dim,
            "n_actions": n_actions,
            "lstm_size": args.lstm_size,
            "continuous": continuous,
        },
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not isinstance(act_space, gym.spaces.Discrete | gym.spaces.Box) or (
        isinstance(act_space, gym.spaces.Box) and len(act_space.shape) != 1
    ):
        fail(f"{SCRIPT} needs discrete or flat Box actions but {args.env_id} has {act_space}")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}")
    check_ranges(args, {"lstm_size": "x >= 1"})
    if args.num_envs % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide --num-envs "
            f"{args.num_envs}: a minibatch holds whole env sequences"
        )
    if args.total_timesteps < args.num_envs * args.num_steps:
        fail(
            f"--total-timesteps {args.total_timesteps} is less "
            f"than one rollout (num_envs*num_steps = {args.num_envs * args.num_steps})"
        )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
