"""RL^2 (Duan et al. 2016): a recurrent policy trained by PPO across trials, so that its hidden
state learns to explore and exploit a task it has never seen.

A trial is n episodes of one task drawn afresh (a bandit's arm probabilities, a random MDP); the
GRU's state is kept across the episodes of a trial and reset between trials; at each step it reads
the observation, the previous action, reward and episode-end flag. The objective is the trial's
total reward. The paper used TRPO; PPO here (as lucaslingle/pytorch_rl2 does).

Run:    python algos/rl2.py --env-id BernoulliBandit-k5-v0 --episodes-per-trial 10 --seed 1
Quick:  python algos/rl2.py --total-timesteps 20480
100 pulls: suite meta-100 in benchmark/suites.toml gives the flags (the defaults are for 10)
Results: benchmark/references.toml; benchmark/meta_baselines.py computes the paper's baselines
"""

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from canonrl.envs import META_ENVS, register_meta_envs
from canonrl.run import (
    RNGs,
    RunLogger,
    TrialRunArgs,
    check_ranges,
    env_spaces,
    fail,
    load_states,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(TrialRunArgs):
    episodes_per_trial: int = 10
    """episodes of one task per trial (n; a bandit's episode is one pull)"""
    learning_rate: float = 1e-2
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    gru_size: int = 64
    """units of the GRU"""
    num_steps: int = 20
    """steps per env per rollout (the length of the sequences the update runs the GRU over)"""
    gamma: float = 0.99
    """discount factor (within a trial; trials are independent)"""
    gae_lambda: float = 0.3
    """lambda of GAE (the paper's)"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch"""
    norm_reward: bool = False
    """divide the rewards the loss sees by the running std of the discounted return (SB3's
    VecNormalize; the policy's input keeps the raw reward)"""
    num_minibatches: int = 8
    """minibatches per epoch, each of num_envs / num_minibatches whole env sequences"""
    update_epochs: int = 4
    """epochs over each rollout"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update early when the approximate KL exceeds this"""
    env_id: str = "BernoulliBandit-k5-v0"
    """a distribution of tasks: BernoulliBandit-k5-v0, -k10-v0, -k50-v0 (arms), RandomMDP-v0"""
    total_timesteps: int = 512_000
    """environment steps over all envs"""
    num_envs: int = 256
    """trials run in parallel (one synchronous vector env)"""


register_meta_envs()  # BernoulliBandit-k5-v0, -k10-v0, -k50-v0, RandomMDP-v0


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance (of the observations, or of the discounted return),
    checkpointable."""

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state):  # a checkpoint holds the numpy arrays as tensors
        self.mean, self.var, self.count = (
            v.numpy() if torch.is_tensor(v) else v for v in state.values()
        )


class Trial(gym.Wrapper):
    """One trial per episode of this env: reset draws a new task and the trial runs `episodes`
    episodes of it, then terminates; its return is the trial's total reward. The observation is the
    task env's, then the previous action (one-hot), the previous reward and 1.0 where the previous
    step ended an episode of the task (all 0 at the trial's first step)."""

    def __init__(self, env: gym.Env, episodes: int):
        super().__init__(env)
        self.episodes = episodes
        self.n_actions = int(env.action_space.n)
        size = env.observation_space.shape[0] + self.n_actions + 2
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def inputs(self, obs, action, reward, episode_end):
        previous = np.zeros(self.n_actions + 2, np.float32)
        if action is not None:
            previous[int(action)] = 1.0
        previous[-2:] = reward, episode_end
        return np.concatenate([obs, previous])

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options={"new_task": True})
        self.episode = 0
        return self.inputs(obs, None, 0.0, 0.0), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        episode_end = terminated or truncated
        if episode_end:
            self.episode += 1
            if self.episode < self.episodes:  # the same task, from its start
                obs, _ = self.env.reset()
        trial_end = self.episode == self.episodes
        return self.inputs(obs, action, reward, float(episode_end)), reward, trial_end, False, info


def make_env(env_id, episodes_per_trial):
    return Trial(gym.make(env_id), episodes_per_trial)


class Agent(nn.Module):
    """A GRU(gru_size) on the trial's inputs, its output read by a linear policy head (the
    logits) and a linear value head. Inputs are in time-major order: x of shape (T * N, inputs)
    holds T steps of N envs, `starts` (T * N) is 1 where an input begins a trial (that env's state
    is zeroed before it); the state has shape (1, N, gru_size)."""

    def __init__(self, n_inputs: int, n_actions: int, gru_size: int = 128):
        super().__init__()
        self.gru = nn.GRU(n_inputs, gru_size)
        self.actor = nn.Linear(gru_size, n_actions)
        self.critic = nn.Linear(gru_size, 1)

    def initial_state(self, num_envs: int, device="cpu"):
        return torch.zeros(1, num_envs, self.gru.hidden_size, device=device)

    def get_states(self, x, state, starts):
        """The GRU's output at every step ((T * N, gru_size)) and the state after the last step. An
        env's state is zeroed where its trial starts; the GRU runs over each stretch of steps in
        which no trial starts in one call (trials have one length, so they start together)."""
        num_envs = state.shape[1]
        x = x.view(-1, num_envs, x.shape[-1])
        starts = starts.view(-1, num_envs)
        bounds = [0, *(starts[1:].any(dim=1).nonzero()[:, 0] + 1).tolist(), len(x)]
        outputs = []
        for first, end in zip(bounds[:-1], bounds[1:]):
            output, state = self.gru(x[first:end], (1.0 - starts[first]).view(1, -1, 1) * state)
            outputs.append(output)
        return torch.cat(outputs).flatten(0, 1), state

    def get_value(self, x, state, starts):
        hidden, _ = self.get_states(x, state, starts)
        return self.critic(hidden).squeeze(-1)

    def get_greedy_action(self, x, state, starts):
        """The most probable action and the next state: the policy that evaluate() runs."""
        hidden, state = self.get_states(x, state, starts)
        return self.actor(hidden).argmax(dim=-1), state

    def get_action_and_value(self, x, state, starts, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the
        entropy, V(x) and the next state."""
        hidden, state = self.get_states(x, state, starts)
        dist = torch.distributions.Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = dist.sample()
        value = self.critic(hidden).squeeze(-1)
        return action, dist.log_prob(action), dist.entropy(), value, state


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
def evaluate(agent, env_id, episodes_per_trial, trials, seed, device="cpu"):
    """Greedy trials (the argmax), each on a new task, run side by side in one vector env (a trial
    has the same length on every task); returns the total reward of each. Trial i's task is drawn
    from seed + i."""
    if trials == 0:
        return []
    envs = gym.vector.SyncVectorEnv([lambda: make_env(env_id, episodes_per_trial)] * trials)
    obs, _ = envs.reset(seed=seed)
    state = agent.initial_state(trials, device)
    no_start = torch.zeros(trials, device=device)  # the state starts at zero, for one trial each
    totals = np.zeros(trials)
    done = np.zeros(trials, dtype=bool)
    while not done.all():
        action, state = agent.get_greedy_action(
            torch.as_tensor(obs, device=device), state, no_start
        )
        obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
        totals = totals + np.where(done, 0.0, reward)
        done = done | terminated | truncated
    envs.close()
    return totals.tolist()


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # same-step autoreset: the observation after a trial's last step begins the next trial
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id, args.episodes_per_trial)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    n_inputs = envs.single_observation_space.shape[0]
    n_actions = int(envs.single_action_space.n)
    agent = Agent(n_inputs, n_actions, args.gru_size).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    batch_size = args.num_envs * args.num_steps
    envs_per_minibatch = args.num_envs // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval():  # evaluation tasks are drawn apart from training's
        return evaluate(
            agent,
            args.env_id,
            args.episodes_per_trial,
            args.eval_episodes,
            args.seed + 100_000,
            device,
        )

    return_rms = RunningMeanStd(shape=())  # of the discounted return, with --norm-reward
    # what a checkpoint holds, saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "return_rms": return_rms, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: new trials start on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

    obs = torch.zeros((args.num_steps, args.num_envs, n_inputs), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)  # the trial ended at t
    starts = torch.zeros((args.num_steps, args.num_envs), device=device)  # obs[t] begins one
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts new trials
    next_start = torch.ones(args.num_envs, device=device)
    state = agent.initial_state(args.num_envs, device)
    # step t * num_envs + i of the flattened rollout is env i's step t
    flat_index = torch.arange(batch_size, device=device).view(args.num_steps, args.num_envs)
    trial_return = np.zeros(args.num_envs)
    trial_length = np.zeros(args.num_envs, dtype=np.int64)
    discounted_return = np.zeros(args.num_envs)  # what --norm-reward divides by the std of
    for iteration in range(iteration + 1, num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        initial_state = state.clone()  # the update starts here
        for step in range(args.num_steps):
            obs[step] = torch.as_tensor(next_obs, device=device)
            starts[step] = next_start
            with torch.no_grad():
                actions[step], logprobs[step], _, values[step], state = agent.get_action_and_value(
                    obs[step], state, starts[step]
                )
            next_obs, reward, terminated, truncated, _ = envs.step(actions[step].cpu().numpy())
            trial_return = trial_return + reward
            trial_length = trial_length + 1
            global_step += args.num_envs
            if args.norm_reward:
                discounted_return = discounted_return * args.gamma + reward
                return_rms.update(discounted_return)
                reward = np.clip(reward / np.sqrt(return_rms.var + 1e-8), -10, 10)
                discounted_return[terminated | truncated] = 0.0
            # a trial ends only by termination (Trial never truncates): nothing to bootstrap
            rewards[step] = torch.as_tensor(reward, device=device)
            dones[step] = torch.as_tensor(terminated | truncated, device=device)
            next_start = dones[step]
            for i in np.flatnonzero(terminated | truncated):  # every finished trial
                logger.log_episode(global_step, trial_return[i], trial_length[i])
                trial_return[i] = 0.0
                trial_length[i] = 0
        with torch.no_grad():
            next_value = agent.get_value(
                torch.as_tensor(next_obs, device=device), state, next_start
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
                _, logprob, entropy, value, _ = agent.get_action_and_value(
                    b_obs[mb], initial_state[:, mb_envs], b_starts[mb], b_actions[mb]
                )
                loss, stats = ppo_loss(
                    logprob,
                    entropy,
                    value,
                    b_logprobs[mb],
                    b_values[mb],
                    mb_advantages,
                    b_returns[mb],
                    args.clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                )
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break
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
            "n_inputs": n_inputs,
            "n_actions": n_actions,
            "gru_size": args.gru_size,
        },
    )


def check_args(args: Args):
    env_spaces(args.env_id, __file__)
    if args.env_id not in META_ENVS:
        fail(
            f"{args.env_id} is not a distribution of tasks: {SCRIPT} takes "
            "BernoulliBandit-k5-v0, -k10-v0, -k50-v0 or RandomMDP-v0",
            "ppo_lstm.py",
        )
    check_ranges(args, {"gru_size": "x >= 1", "episodes_per_trial": "x >= 1"})
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
