"""PPO with Random Network Distillation (Burda et al. 2018) on MiniGrid's sparse-reward maps.

A fixed random network (the target) maps each view to features; a predictor learns to match them
on the views the agent reaches, and its error, scaled by a running std of its discounted sum, is
the intrinsic reward, with a value head of its own (non-episodic) beside the extrinsic (episodic)
one. --int-coef 0 is plain PPO with the same networks and settings: the control.

Run:    python algos/ppo_rnd.py --seed 1
Quick:  python algos/ppo_rnd.py --env-id MiniGrid-DoorKey-5x5-v0 --total-timesteps 20480
Needs:  pip install -e ".[minigrid]"
Results: benchmark/references.toml
"""

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from canonrl.envs import register_minigrid
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

# A run explores one fixed map (--layout: the map that seed draws, regenerated at every reset), the
# setting RND was made for: Montezuma's Revenge is one map. On maps drawn afresh each episode
# (--layout None), a lifelong novelty bonus rewards new maps more than new places, and helps little
# (Wang et al. 2023, "Revisiting intrinsic reward for exploration in procedurally generated
# environments"). The default map, four rooms joined by closed doors with 80 steps to reach the
# goal, is one that plain PPO does not solve in 250k steps.


# The RND settings are CleanRL's ppo_rnd_envpool.py's (int_gamma 0.99, ext_coef 2, int_coef 1, the
# predictor trained on a random 25% of each minibatch, its input standardised by running statistics
# and clipped to [-5, 5]); the rest is rl-starter-files' MiniGrid PPO (a 3-convolution CNN on the
# 7x7 view, 16 envs x 128 steps, 4 epochs, Adam 1e-3, gamma 0.99, lambda 0.95, entropy 0.01). What
# differs from CleanRL: MLPs for the target and predictor (the view is 7x7x3); the input statistics
# are updated with each rollout before its intrinsic rewards are computed, in place of 50 rollouts
# of random actions first; a time limit is bootstrapped with V_ext; with --int-coef 0 the intrinsic
# head is not trained and the predictor takes no part in the agent's update.
@dataclass
class Args(RunArgs):
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0"""
    num_steps: int = 128
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor of the extrinsic (episodic) return"""
    int_gamma: float = 0.99
    """discount factor of the intrinsic (non-episodic) return"""
    gae_lambda: float = 0.95
    """lambda of GAE (both returns)"""
    ext_coef: float = 2.0
    """weight of the extrinsic advantage"""
    int_coef: float = 1.0
    """weight of the intrinsic advantage (0: plain PPO, the control)"""
    update_proportion: float = 0.25
    """fraction of each minibatch the predictor is trained on"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch"""
    num_minibatches: int = 8
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 4
    """epochs over each rollout"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient (the loss is the mean of the two heads' squared errors)"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update early when the approximate KL exceeds this"""
    env_id: str = "MiniGrid-MultiRoom-N4-S5-v1"
    """a MiniGrid id (its 7x7x3 view is the observation)"""
    layout: int | None = 2
    """the map: every episode, training and evaluation, on the map this seed draws (regenerated at
    each reset); None: a new map each episode"""
    total_timesteps: int = 250_000
    """environment steps over all envs (whole rollouts: 250,000 runs 122 of 2,048, 249,856 steps)"""
    num_envs: int = 16
    """parallel environments (one synchronous vector env)"""


register_minigrid()  # MiniGrid-* ids, where minigrid is installed


class FixedLayout(gym.Wrapper):
    """Every reset regenerates the map of one seed, whatever seed the caller passes."""

    def __init__(self, env, layout: int):
        super().__init__(env)
        self.layout = layout

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=self.layout, options=options)


def make_env(env_id, layout=None, video_dir=None):
    """env_id with its image as the observation (the agent's 7x7 view, 3 channels: object, colour,
    state; the mission string is dropped). layout: every reset regenerates the map of this seed (one
    fixed map, as Montezuma's Revenge is for RND); None: a new map each episode. With video_dir,
    episode 0 is recorded there as eval-episode-0.mp4 (--capture-video)."""
    from minigrid.wrappers import ImgObsWrapper

    env = gym.make(env_id, render_mode=None if video_dir is None else "rgb_array")
    if layout is not None:
        env = FixedLayout(env, layout)
    env = ImgObsWrapper(env)
    if video_dir is None:
        return env
    return gym.wrappers.RecordVideo(
        env, str(video_dir), lambda ep: ep == 0, name_prefix="eval", disable_logger=True
    )


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance (of the observations, or of the discounted return),
    checkpointable."""

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state):  # a checkpoint holds the numpy arrays as tensors
        self.mean, self.var, self.count = (
            v.numpy() if torch.is_tensor(v) else v for v in state.values()
        )


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """rl-starter-files' MiniGrid CNN (2x2 convolutions of 16, 32 and 64 channels with a max-pool:
    64 features of the 7x7 view), shared by a policy head and two value heads (extrinsic,
    intrinsic), each 64 -> 64 (tanh) -> out. Input: views (N, 7, 7, 3) as floats."""

    def __init__(self, view_shape: tuple, n_actions: int):
        super().__init__()
        height, width, channels = view_shape
        self.trunk = nn.Sequential(
            nn.Conv2d(channels, 16, 2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 2),
            nn.ReLU(),
            nn.Conv2d(32, 64, 2),
            nn.ReLU(),
            nn.Flatten(),
        )
        features = 64 * ((height - 1) // 2 - 2) * ((width - 1) // 2 - 2)

        def head(out, std):
            return nn.Sequential(
                layer_init(nn.Linear(features, 64)),
                nn.Tanh(),
                layer_init(nn.Linear(64, out), std=std),
            )

        self.actor = head(n_actions, 0.01)  # std 0.01: a near-uniform first policy
        self.critic_ext = head(1, 1.0)
        self.critic_int = head(1, 1.0)

    def features(self, x):
        return self.trunk(x.permute(0, 3, 1, 2))

    def get_value(self, x):
        """(V_ext, V_int) of each view: shape (N, 2)."""
        hidden = self.features(x)
        return torch.cat([self.critic_ext(hidden), self.critic_int(hidden)], dim=-1)

    def get_action_and_value(self, x, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the entropy
        and (V_ext, V_int) of x (shape (N, 2)). Training and evaluate() act by it."""
        hidden = self.features(x)
        dist = torch.distributions.Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = dist.sample()
        value = torch.cat([self.critic_ext(hidden), self.critic_int(hidden)], dim=-1)
        return action, dist.log_prob(action), dist.entropy(), value


class RND(nn.Module):
    """The target (fixed, random) and the predictor, MLPs on a normalised flat view:
    target obs -> 256 -> 256 -> 64 (leaky ReLU), predictor obs -> 256 -> 256 -> 256 -> 64 (ReLU;
    one layer more, as in the paper). prediction_error(x) is the mean squared difference of their
    features per observation: the intrinsic reward before its normalisation, and the predictor's
    loss."""

    def __init__(self, obs_dim: int, out: int = 64):
        super().__init__()
        self.target = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 256)),
            nn.LeakyReLU(),
            layer_init(nn.Linear(256, 256)),
            nn.LeakyReLU(),
            layer_init(nn.Linear(256, out)),
        )
        self.predictor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 256)),
            nn.ReLU(),
            layer_init(nn.Linear(256, 256)),
            nn.ReLU(),
            layer_init(nn.Linear(256, 256)),
            nn.ReLU(),
            layer_init(nn.Linear(256, out)),
        )
        self.target.requires_grad_(False)

    def prediction_error(self, x):
        return ((self.predictor(x) - self.target(x)) ** 2).mean(dim=-1)


def normalize_obs(obs, obs_rms):
    """Flat views standardised by the running statistics and clipped to [-5, 5] (RND's input)."""
    mean = torch.as_tensor(obs_rms.mean, dtype=torch.float32, device=obs.device)
    var = torch.as_tensor(obs_rms.var, dtype=torch.float32, device=obs.device)
    return ((obs.flatten(1) - mean) / torch.sqrt(var + 1e-8)).clamp(-5.0, 5.0)


def discounted_sums(rewards, running, gamma):
    """RND's reward forward filter: running[i] = gamma * running[i] + rewards[t, i] along a rollout
    (T, N), carried over from the last rollout in `running` (updated in place); returns the (T, N)
    sums, whose variance scales the intrinsic rewards."""
    sums = np.zeros_like(rewards)
    for t in range(len(rewards)):
        running *= gamma
        running += rewards[t]
        sums[t] = running
    return sums


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
def evaluate(agent, env_id, episodes, seed, device="cpu", video_dir=None, layout=None):
    """Episodes on a fresh env (on the map of `layout`, where given), actions sampled from the
    policy as in training, by a generator seeded with `seed` (the run's own random stream is left
    as it was); returns the list of episodic returns. Sampled, not greedy: on a fixed map the argmax
    policy repeats any loop it enters for good (a run whose sampled policy reached the goal in 98%
    of its training episodes scored 0 greedily)."""
    env = make_env(env_id, layout, video_dir)
    returns = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + ep)
            done = False
            total = 0.0
            while not done:
                action, _, _, _ = agent.get_action_and_value(
                    torch.as_tensor(obs[None], dtype=torch.float32, device=device)
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
        [lambda: make_env(args.env_id, args.layout)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    view_shape = envs.single_observation_space.shape
    obs_dim = int(np.prod(view_shape))
    n_actions = int(envs.single_action_space.n)
    agent = Agent(view_shape, n_actions).to(device)
    rnd = RND(obs_dim).to(device)
    params = list(agent.parameters()) + list(rnd.predictor.parameters())
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5, fused=True)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            agent,
            args.env_id,
            args.eval_episodes,
            args.seed + 100_000,
            device,
            video_dir,
            args.layout,
        )

    obs_rms = RunningMeanStd(shape=(obs_dim,))  # of the flat views: RND's input
    int_return_rms = RunningMeanStd(shape=())  # of the intrinsic rewards' discounted sums
    # what a checkpoint holds, saved and resumed
    stateful = {
        "agent": agent,
        "rnd": rnd,
        "optimizer": optimizer,
        "obs_rms": obs_rms,
        "int_return_rms": int_return_rms,
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
    def value_fn(obs):  # V_ext(obs) of a numpy batch of final observations
        x = torch.as_tensor(obs, dtype=torch.float32, device=device)
        return agent.get_value(x)[:, 0].cpu().numpy()

    obs = torch.zeros((args.num_steps, args.num_envs, *view_shape), device=device)
    reached = torch.zeros((args.num_steps, args.num_envs, *view_shape), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs, 2), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    int_running = np.zeros(args.num_envs)  # the forward filter's discounted intrinsic sums
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration + 1, num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        for step in range(args.num_steps):
            obs[step] = torch.as_tensor(next_obs, device=device)
            with torch.no_grad():
                actions[step], logprobs[step], _, values[step] = agent.get_action_and_value(
                    obs[step]
                )
            next_obs, reward, terminated, truncated, infos = envs.step(actions[step].cpu().numpy())
            done = terminated | truncated
            # the view each env reached: where an episode ended, its last one, not the reset's
            reached[step] = torch.as_tensor(next_obs, device=device)
            for i in np.flatnonzero(done):
                reached[step, i] = torch.as_tensor(infos["final_obs"][i], device=device)
            episode_return = episode_return + reward
            episode_length = episode_length + 1
            global_step += args.num_envs
            reward = bootstrap_time_limits(
                reward, terminated, truncated, infos, value_fn, args.gamma
            )
            rewards[step] = torch.as_tensor(reward)
            dones[step] = torch.as_tensor(done)
            # every finished episode of every sub-env
            for i in np.flatnonzero(done):
                logger.log_episode(global_step, episode_return[i], episode_length[i])
                episode_return[i] = 0.0
                episode_length[i] = 0
        # the intrinsic rewards of the rollout: the predictor's error on the views reached,
        # divided by the running std of their discounted sums
        b_reached = reached.flatten(0, 1)
        obs_rms.update(b_reached.flatten(1).cpu().numpy())
        b_reached_norm = normalize_obs(b_reached, obs_rms)
        with torch.no_grad():
            int_rewards = rnd.prediction_error(b_reached_norm).view(args.num_steps, args.num_envs)
        int_return_rms.update(
            discounted_sums(int_rewards.cpu().numpy(), int_running, args.int_gamma).flatten()
        )
        int_rewards = int_rewards / np.sqrt(int_return_rms.var + 1e-8)
        with torch.no_grad():
            next_value = agent.get_value(
                torch.as_tensor(next_obs, dtype=torch.float32, device=device)
            )
        ext_advantages, ext_returns = compute_gae(
            rewards, values[..., 0], dones, next_value[:, 0], args.gamma, args.gae_lambda
        )
        # non-episodic: the intrinsic return runs on across episode ends
        int_advantages, int_returns = compute_gae(
            int_rewards,
            values[..., 1],
            torch.zeros_like(dones),
            next_value[:, 1],
            args.int_gamma,
            args.gae_lambda,
        )
        b_obs = obs.flatten(0, 1)
        b_actions = actions.flatten(0, 1)
        b_logprobs = logprobs.flatten(0, 1)
        b_advantages = (args.ext_coef * ext_advantages + args.int_coef * int_advantages).flatten()
        b_returns = torch.stack([ext_returns, int_returns], dim=-1).flatten(0, 1)
        b_values = values.flatten(0, 1)
        heads = 2 if args.int_coef > 0 else 1  # --int-coef 0: V_int is not trained (plain PPO)
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
                    value[:, :heads],
                    b_logprobs[mb],
                    b_values[mb, :heads],
                    mb_advantages,
                    b_returns[mb, :heads],
                    args.clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                )
                # the predictor learns on a random update_proportion of the minibatch
                keep = (torch.rand(len(mb), device=device) < args.update_proportion).float()
                errors = rnd.prediction_error(b_reached_norm[mb])
                rnd_loss = (errors * keep).sum() / keep.sum().clamp(min=1.0)
                optimizer.zero_grad()
                (loss + rnd_loss).backward()
                # each clipped on its own: the predictor's gradients do not scale the agent's
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                nn.utils.clip_grad_norm_(rnd.predictor.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break
        # nan: constant returns
        stats["explained_variance"] = (
            1 - (b_returns[:, 0] - b_values[:, 0]).var() / b_returns[:, 0].var()
        )
        stats["rnd_loss"] = rnd_loss.detach()
        logger.log(
            global_step,
            {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "charts/intrinsic_reward": int_rewards.mean(),
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
            "view_shape": list(view_shape),
            "n_actions": n_actions,
            "layout": args.layout,
        },
    )


def check_args(args: Args):
    if args.env_id.startswith("MiniGrid-"):
        try:
            import minigrid  # noqa: F401
        except ImportError:
            fail(f"{args.env_id} needs minigrid: pip install -e '.[minigrid]'")
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not (
        isinstance(obs_space, gym.spaces.Dict) and "image" in obs_space.spaces
    ) or not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs a MiniGrid env (an image view, discrete actions) but "
            f"{args.env_id} has {obs_space} and {act_space}",
            "ppo.py",
        )
    check_ranges(
        args,
        {
            "int_gamma": "0 <= x <= 1",
            "ext_coef": "x >= 0",
            "int_coef": "x >= 0",
            "update_proportion": "0 < x <= 1",
            "layout": "x >= 0",
        },
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


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
