"""PPO for discrete actions on classic control (CartPole-v1 by default).

Paper: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); details as in
Huang et al. 2022, "The 37 Implementation Details of PPO" and SB3's PPO (separate actor and critic MLPs,
orthogonal init, GAE, clipped surrogate, advantage normalisation, global gradient clipping).
This variant: vector env with same-step autoreset; time-limit truncation is bootstrapped with V(final_obs);
defaults are rl-zoo's CartPole-v1 settings (8 envs x 32 steps, 20 epochs, lr and clip annealed) but a learning
rate of 2e-3 (rl-zoo: 1e-3), which first reached a 5-episode greedy evaluation of 475 after 4-14k steps on seeds
1-8 at 9e93936 (1e-3: 10-25k; benchmark/reports/cartpole-sweeps-cpu-2026-11-22.md); 6-21k on seeds 1-10 at d3aab41.
Speed: on a CPU, torch's per-op overhead, not arithmetic, dominates networks this small, so the script saves ops:
rollouts stay in numpy and the actor acts there too (get_action), the update runs each hidden layer of
actor and critic together as one batched matmul, all weights live in one flat tensor (one gradient norm, one zeroing;
see flat_parameters), and Adam is written out on that tensor (7 ops; torch.optim.Adam's step costs ~10x its kernel
in Python here).

Run:    python algos/ppo.py --env-id CartPole-v1 --seed 1
Result: CartPole-v1, 100k steps, final 10-episode greedy evaluation 500 on seeds 1-3 (see
        benchmark/references.toml, gate "ppo-CartPole-v1-cpu").
"""
import csv, difflib, json, os, random, subprocess, sys, time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    env_id: str = "CartPole-v1"  # Gymnasium id of a discrete-action env with a flat observation vector
    seed: int = 1  # seed of torch, numpy, random and the envs
    total_timesteps: int = 100_000  # total environment steps over all envs
    num_envs: int = 8  # parallel environments (one synchronous vector env)
    cuda: bool = False  # use CUDA if available (small MLPs are faster on the CPU)
    torch_deterministic: bool = True  # torch.backends.cudnn.deterministic and one CPU thread
    track: bool = False  # log to Weights & Biases (works offline with WANDB_MODE=offline)
    wandb_project_name: str = "canonrl"  # wandb project
    wandb_entity: str | None = None  # wandb entity (team)
    capture_video: bool = False  # record videos of the first env to <run_dir>/videos
    save_model: bool = False  # save <run_dir>/model.pt at the end
    eval_episodes: int = 10  # greedy evaluation episodes at the end (logged as eval/episodic_return)
    eval_every: int = 0  # also evaluate every this many steps (0: only at the end); logs charts/train_seconds beside it
    run_dir: str | None = None  # where the run is written (default runs/<env>__ppo__<seed>__<time>)
    resume: str | None = None  # a run directory whose checkpoint.pt to continue from (its saved arguments are used)
    checkpoint_every: int = 50_000  # save <run_dir>/checkpoint.pt every this many steps (and on Ctrl-C)
    learning_rate: float = 2e-3  # Adam learning rate
    anneal_lr: bool = True  # anneal the learning rate and clip coefficient linearly to 0
    num_steps: int = 32  # steps per env per rollout
    gamma: float = 0.98  # discount factor
    gae_lambda: float = 0.8  # lambda of GAE
    num_minibatches: int = 1  # minibatches per epoch (must divide num_envs * num_steps)
    update_epochs: int = 20  # epochs over each rollout
    clip_coef: float = 0.2  # surrogate clipping coefficient
    ent_coef: float = 0.0  # entropy bonus coefficient
    vf_coef: float = 0.5  # value loss coefficient
    max_grad_norm: float = 0.5  # global gradient norm clip
    target_kl: float | None = None  # stop the epochs of an update early when the approximate KL exceeds this


def fail(msg: str):
    """Bad input: one line on stderr, exit status 2, before anything is written."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def check_args(args: Args):
    if args.env_id not in gym.registry:
        close = difflib.get_close_matches(args.env_id, list(gym.registry), n=1)
        fail(f"unknown env id '{args.env_id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    env = gym.make(args.env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(f"ppo.py needs discrete actions but {args.env_id} has {act_space}; use ppo_continuous.py")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"ppo.py needs flat vector observations but {args.env_id} has {obs_space}; use ppo_atari.py for images")
    batch = args.num_envs * args.num_steps
    if min(args.num_envs, args.num_steps, args.num_minibatches, args.update_epochs) < 1 or args.eval_episodes < 0:
        fail("--num-envs, --num-steps, --num-minibatches, --update-epochs must be >= 1 and --eval-episodes >= 0")
    if batch % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch num_envs*num_steps = {batch}")
    if args.total_timesteps < batch:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout (num_envs*num_steps = {batch})")


def make_env(env_id, idx, capture_video, run_dir):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            return gym.wrappers.RecordVideo(env, f"{run_dir}/videos")
        return gym.make(env_id)
    return thunk


def tanh(x):
    """tanh(x) = 2 sigmoid(2x) - 1: on a CPU torch.tanh takes about 85 µs on the update's 2x256x64 hidden units,
    these four ops about 30 µs (same values to ~1e-7)."""
    return 2 * torch.sigmoid(2 * x) - 1


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs, obs -> 64 -> 64 (tanh) -> logits / value, as in SB3 and CleanRL. Their two
    hidden layers are stored stacked, [0] critic and [1] actor, so that each layer of both networks is one batched
    matmul: on a CPU, networks this small cost per op, not per FLOP. Weights are (in, out) for baddbmm."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.w1, self.w2 = (nn.Parameter(torch.empty(2, n_in, hidden)) for n_in in (obs_dim, hidden))
        self.b1, self.b2 = (nn.Parameter(torch.zeros(2, 1, hidden)) for _ in range(2))
        for w in (self.w1, self.w2):
            for net in range(2):
                nn.init.orthogonal_(w.data[net].T, np.sqrt(2))  # as layer_init on an nn.Linear(n_in, hidden)
        self.critic_head = layer_init(nn.Linear(hidden, 1), std=1.0)
        self.actor_head = layer_init(nn.Linear(hidden, n_actions), std=0.01)

    def forward(self, x):
        """Logits and values of a batch of observations (batch, obs_dim)."""
        h = tanh(torch.baddbmm(self.b1, x.expand(2, -1, -1), self.w1))
        h = tanh(torch.baddbmm(self.b2, h, self.w2))
        return self.actor_head(h[1]), self.critic_head(h[0]).squeeze(-1)

    def actor(self, x):
        """Logits only, from the actor's halves of the stacked layers as plain matmuls (faster on a few rows)."""
        h = tanh(torch.addmm(self.b1[1], x, self.w1[1]))
        return self.actor_head(tanh(torch.addmm(self.b2[1], h, self.w2[1])))

    def numpy_actor(self):
        """The actor's weights as numpy arrays, for get_action: views of the live weights on a CPU, copies on a GPU
        (so take them anew after each update)."""
        return [t.detach().cpu().numpy() for t in (self.w1[1], self.b1[1], self.w2[1], self.b2[1],
                                                   self.actor_head.weight.T, self.actor_head.bias)]

    def evaluate_actions(self, x, action, with_entropy):
        """Log-probability and (if asked) entropy of the given actions, and the value (the update)."""
        logits, value = self(x)
        logp_all = torch.log_softmax(logits, dim=-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        return logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy, value


def get_action(actor_weights, obs, rng):
    """Sample actions for a batch of observations (numpy, float32) with the actor's weights from Agent.numpy_actor;
    return the actions and their log-probabilities. The same function as Agent.actor, in numpy: in the rollout loop
    a numpy op costs about a third of a torch op on 8 rows (get_action ~30 µs against ~100 µs), and sampling by
    inverse CDF a third of torch.multinomial."""
    w1, b1, w2, b2, w3, b3 = actor_weights
    logits = np.tanh(np.tanh(obs @ w1 + b1) @ w2 + b2) @ w3 + b3
    logp_all = logits - logits.max(1, keepdims=True)
    logp_all -= np.log(np.exp(logp_all).sum(1, keepdims=True))  # log-softmax
    action = (np.exp(logp_all).cumsum(1) < rng.random((len(obs), 1))).sum(1)
    action = np.minimum(action, logp_all.shape[1] - 1)  # the cumsum may end a rounding error below 1
    return action, logp_all[np.arange(len(action)), action]


def flat_parameters(module: nn.Module):
    """Make the parameters of `module` views into one flat tensor, and their gradients views into a second one; return
    the first as a Parameter whose .grad is the second. Adam, the gradient norm and zeroing the gradients then run on
    one tensor instead of one per parameter (an op costs 5-10 µs on a CPU; the whole update about 1 ms). Backward still
    fills each parameter's .grad, in place; zero them with flat.grad.zero_(), never optimizer.zero_grad()."""
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    grad, offset = torch.zeros_like(flat), 0
    for p in params:
        p.data, p.grad = flat[offset:offset + p.numel()].view_as(p), grad[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    flat = nn.Parameter(flat)
    flat.grad = grad
    return flat


class Adam:
    """Adam (Kingma & Ba 2015) on one flat parameter tensor, computing what torch.optim.Adam computes with the same
    arguments (tests/test_flat_parameters.py checks it step by step). torch.optim.Adam's step() spends about 100 µs in
    Python around a 10 µs kernel, 20 times per rollout here; this one is 7 ops. Any torch.optim optimizer can take
    its place: torch.optim.X([flat], ...), with its param_groups[0]["lr"] for the annealing."""

    def __init__(self, param, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.param, self.lr, self.betas, self.eps, self.t = param, lr, betas, eps, 0
        self.data = param.detach()  # the weights, updated in place without autograd
        self.m, self.v = torch.zeros_like(self.data), torch.zeros_like(self.data)

    def step(self):
        (b1, b2), grad = self.betas, self.param.grad
        self.t += 1
        self.m.lerp_(grad, 1 - b1)  # first moment
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)  # second moment
        denom = self.v.sqrt().div_((1 - b2 ** self.t) ** 0.5).add_(self.eps)  # bias-corrected, as torch.optim
        self.data.addcdiv_(self.m, denom, value=-self.lr / (1 - b1 ** self.t))

    def state_dict(self):
        return {"t": self.t, "lr": self.lr, "m": self.m, "v": self.v}

    def load_state_dict(self, state):
        self.t, self.lr = state["t"], state["lr"]
        self.m.copy_(state["m"])
        self.v.copy_(state["v"])


def compute_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """GAE (Schulman et al. 2016, eq. 16) on numpy arrays of shape (T, N). dones[t] = the episode ended at step t
    (terminated or truncated; truncation was already bootstrapped into rewards[t]). Returns (advantages, returns)."""
    advantages = np.zeros_like(rewards)
    last = np.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        nextvalue = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * nextvalue * nonterminal - values[t]
        last = delta + gamma * gae_lambda * nonterminal * last
        advantages[t] = last
    return advantages, advantages + values


def bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, gamma):
    """A time limit is not part of the task (Pardo et al. 2018): where an episode was truncated, add
    gamma * V(s_final) to its last reward. Same-step autoreset keeps s_final in infos["final_obs"]."""
    idx = np.flatnonzero(truncated & ~terminated)
    if len(idx) == 0:
        return reward
    return reward + np.bincount(idx, gamma * value_fn(np.stack(infos["final_obs"][idx])), len(reward))


def ppo_loss(agent, obs, actions, old_logprobs, advantages, returns, clip_coef, ent_coef, vf_coef, with_stats):
    """Clipped surrogate objective (PPO paper, eq. 7) + value MSE - entropy bonus; the entropy only when it is in
    the loss or asked for, the statistics only when asked for (once per epoch): on a CPU each op costs µs."""
    logprob, entropy, value = agent.evaluate_actions(obs, actions, with_entropy=bool(ent_coef) or with_stats)
    logratio = logprob - old_logprobs
    ratio = logratio.exp()
    pg_loss = -torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_loss = 0.5 * F.mse_loss(value, returns)
    loss = pg_loss + vf_coef * v_loss
    if ent_coef:
        loss = loss - ent_coef * entropy.mean()
    if not with_stats:
        return loss, None
    with torch.no_grad():  # "approx_kl" of Schulman's blog, k3 estimator
        stats = torch.stack([pg_loss, v_loss, entropy.mean(), ((ratio - 1) - logratio).mean(),
                             ((ratio - 1).abs() > clip_coef).float().mean()])
    return loss, stats


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu"):
    """Greedy (argmax) episodes on a fresh env; returns the list of episodic returns."""
    env, returns = gym.make(env_id), []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done, total = False, 0.0
        while not done:
            logits = agent.actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax()))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


class RunLogger:
    """The run contract (DESIGN §3): config.json, append-only metrics.csv, TensorBoard, optional wandb."""

    def __init__(self, args: Args, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "config.json").exists():
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or None
            pkgs = {p: version(p) for p in ("torch", "gymnasium", "numpy")}
            config = {"script": Path(__file__).name, "args": asdict(args), "git_commit": commit, "versions": pkgs}
            (run_dir / "config.json").write_text(json.dumps(config, indent=2))
        new = not (run_dir / "metrics.csv").exists()
        self.file = open(run_dir / "metrics.csv", "a", newline="")
        self.csv = csv.writer(self.file)
        if new:
            self.csv.writerow(["global_step", "wall_time", "name", "value"])
        if args.track:
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                       name=run_dir.name, dir=str(run_dir), sync_tensorboard=True, id=run_dir.name, resume="allow")
        self.tb = SummaryWriter(str(run_dir))

    def log(self, step: int, metrics: dict):
        now = time.time()
        for name, value in metrics.items():
            self.csv.writerow([step, f"{now:.3f}", name, repr(float(value))])
            self.tb.add_scalar(name, value, step)
        self.file.flush()

    def log_many(self, step: int, name: str, values: list):
        for value in values:
            self.log(step, {name: value})

    def close(self):
        self.file.close()
        self.tb.close()


def main(args: Args):
    if args.resume:
        ckpt_path = Path(args.resume) / "checkpoint.pt"
        if not ckpt_path.is_file():
            fail(f"no checkpoint at {ckpt_path}; pass the run directory of an earlier ppo.py run")
        try:
            ckpt = torch.load(ckpt_path, weights_only=False)
            args = Args(**ckpt["args"])
        except Exception as e:
            fail(f"{ckpt_path} is corrupt or not a ppo.py checkpoint ({type(e).__name__}); delete it or start anew")
        args.run_dir = args.resume = str(Path(ckpt_path).parent)
    check_args(args)
    run_dir = Path(args.run_dir or f"runs/{args.env_id}__ppo__{args.seed}__{int(time.time())}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:
        torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n).to(device)
    flat = flat_parameters(agent)  # agent's parameters and gradients as views into `flat` and `flat.grad`
    optimizer = Adam(flat, lr=args.learning_rate, eps=1e-5)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    rng = np.random.default_rng(args.seed)  # action sampling
    start_iteration = 1
    if args.resume:
        try:
            agent.load_state_dict(ckpt["agent"])
            optimizer.load_state_dict(ckpt["optimizer"])
        except Exception as e:
            fail(f"{ckpt_path} does not fit this network ({type(e).__name__}); delete it or start anew")
        torch.set_rng_state(ckpt["torch_rng"])  # minibatch shuffling; the envs are seeded on reset
        rng.bit_generator.state = ckpt["rng"]
        start_iteration = ckpt["iteration"] + 1
    logger = RunLogger(args, run_dir)

    @torch.no_grad()
    def value_fn(obs_np):
        return agent(torch.as_tensor(obs_np, dtype=torch.float32, device=device))[1].cpu().numpy()

    def save_checkpoint(iteration):
        torch.save({"args": asdict(args), "iteration": iteration, "global_step": iteration * batch_size,
                    "agent": agent.state_dict(), "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                    "rng": rng.bit_generator.state},
                   run_dir / "checkpoint.tmp")
        os.replace(run_dir / "checkpoint.tmp", run_dir / "checkpoint.pt")  # never leave a half-written file

    # the rollout is kept in numpy (what the envs return) and moved to the device once per iteration
    obs_buf = np.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape, dtype=np.float32)
    rewards, dones, logprobs = (np.zeros((args.num_steps, args.num_envs), dtype=np.float32) for _ in range(3))
    actions = np.zeros((args.num_steps, args.num_envs), dtype=np.int64)
    global_step = (start_iteration - 1) * batch_size
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    episode_return, episode_length = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=np.int64)
    bar = tqdm(total=num_iterations * batch_size, initial=global_step, unit="step", mininterval=1.0)
    last_return, iteration, start_time, eval_seconds = float("nan"), start_iteration - 1, time.time(), 0.0
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
            optimizer.lr = frac * args.learning_rate
            clip_coef = frac * args.clip_coef
            actor_weights = agent.numpy_actor()
            for step in range(args.num_steps):
                obs_buf[step] = next_obs
                actions[step], logprobs[step] = get_action(actor_weights, obs_buf[step], rng)
                next_obs, reward, terminated, truncated, infos = envs.step(actions[step])
                done = terminated | truncated
                episode_return += reward
                episode_length += 1
                if truncated.any():
                    reward = bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, args.gamma)
                rewards[step], dones[step] = reward, done
                global_step += args.num_envs
                for i in np.flatnonzero(done):  # every finished episode of every sub-env
                    last_return = float(episode_return[i])
                    logger.log(global_step, {"train/episodic_return": last_return,
                                             "train/episodic_length": int(episode_length[i])})
                    episode_return[i], episode_length[i] = 0.0, 0

            # V(s_t) of the whole rollout and of the next observation in one call (the weights did not change)
            values = value_fn(np.concatenate([obs_buf.reshape(batch_size, -1), next_obs]))
            next_value, values = values[batch_size:], values[:batch_size].reshape(args.num_steps, args.num_envs)
            advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)
            b_obs = torch.as_tensor(obs_buf, device=device).reshape((batch_size,) + envs.single_observation_space.shape)
            b_actions, b_logprobs, b_advantages, b_returns, b_values = (
                torch.as_tensor(x, device=device).reshape(-1) for x in (actions, logprobs, advantages, returns, values))
            if args.num_minibatches == 1:  # the one minibatch is the whole batch: normalise its advantages once
                b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
            for epoch in range(args.update_epochs):
                perm = torch.randperm(batch_size, device=device) if args.num_minibatches > 1 else None
                for start in range(0, batch_size, minibatch_size):
                    mb = perm[start:start + minibatch_size] if perm is not None else slice(None)  # one: whole batch
                    mb_adv = b_advantages[mb]
                    if args.num_minibatches > 1:  # advantages normalised per minibatch (SB3, CleanRL)
                        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                    # statistics of the epoch's last minibatch: every epoch for target_kl, else the last epoch's
                    last = start + minibatch_size == batch_size and (
                        args.target_kl is not None or epoch == args.update_epochs - 1)
                    loss, stats = ppo_loss(agent, b_obs[mb], b_actions[mb], b_logprobs[mb], mb_adv, b_returns[mb],
                                           clip_coef, args.ent_coef, args.vf_coef, with_stats=last)
                    flat.grad.zero_()
                    loss.backward()
                    flat.grad.mul_(torch.clamp(args.max_grad_norm / (flat.grad.norm() + 1e-6), max=1.0))  # clip_grad_norm_
                    optimizer.step()
                if args.target_kl is not None and stats[3] > args.target_kl:
                    break

            stats = stats.tolist()
            var_y = b_returns.var()
            explained_var = float("nan") if var_y == 0 else float(1 - (b_returns - b_values).var() / var_y)
            sps = int((global_step - (start_iteration - 1) * batch_size) / (time.time() - start_time - eval_seconds))
            logger.log(global_step, {"charts/learning_rate": optimizer.lr, "charts/sps": sps,
                                     "losses/policy_loss": stats[0], "losses/value_loss": stats[1],
                                     "losses/entropy": stats[2], "losses/approx_kl": stats[3],
                                     "losses/clipfrac": stats[4], "losses/explained_variance": explained_var})
            bar.update(batch_size)
            bar.set_postfix(sps=sps, ret=f"{last_return:.1f}", refresh=False)
            if args.eval_every and iteration < num_iterations and global_step % args.eval_every < batch_size:
                train_seconds = time.time() - start_time - eval_seconds  # evaluation time is not training time
                returns = evaluate(agent, args.env_id, args.eval_episodes, seed=args.seed + 100_000, device=device)
                eval_seconds = time.time() - start_time - train_seconds
                logger.log(global_step, {"charts/train_seconds": train_seconds})
                logger.log_many(global_step, "eval/episodic_return", returns)
            if iteration % max(1, args.checkpoint_every // batch_size) == 0:
                save_checkpoint(iteration)
    except KeyboardInterrupt:
        save_checkpoint(iteration - 1)  # the unfinished iteration is redone on resume
        logger.close()
        print(f"\ninterrupted: metrics kept, resume with --resume {run_dir}", file=sys.stderr)
        sys.exit(130)
    bar.close()
    envs.close()
    save_checkpoint(num_iterations)

    logger.log(global_step, {"charts/train_seconds": time.time() - start_time - eval_seconds})
    eval_returns = evaluate(agent, args.env_id, args.eval_episodes, seed=args.seed + 100_000, device=device)
    logger.log_many(global_step, "eval/episodic_return", eval_returns)
    if eval_returns:
        print(f"eval/episodic_return: {np.mean(eval_returns):.2f} +- {np.std(eval_returns):.2f} "
              f"over {len(eval_returns)} episodes")
    if args.save_model:
        torch.save({"agent": agent.state_dict(), "args": asdict(args), "eval_returns": eval_returns,
                    "obs_dim": envs.single_observation_space.shape[0], "n_actions": int(envs.single_action_space.n)},
                   run_dir / "model.pt")
    logger.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
