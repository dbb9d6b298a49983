"""PPO for discrete actions on classic control (CartPole-v1 by default).

Schulman et al. 2017 (PPO) with the details of Huang et al. 2022, "The 37 Implementation Details of PPO": separate
actor and critic MLPs, orthogonal init, GAE, advantages normalised per minibatch, global gradient clipping, Adam eps
1e-5. A time-limit truncation is bootstrapped with V(final obs). Defaults: rl-zoo's CartPole-v1 settings, but lr 2e-3.

Run:    python algos/ppo.py --env-id CartPole-v1 --seed 1
Result: CartPole-v1, 100k steps: final greedy evaluation 500 on 9 of seeds 1-10, 381.9 on the tenth (references.toml)
"""
import csv, difflib, json, os, random, subprocess, sys, tempfile, time, tomllib, warnings
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    env_id: str = "CartPole-v1"  # Gymnasium id of a discrete-action env with a flat observation vector
    total_timesteps: int = 100_000  # environment steps over all envs
    num_envs: int = 8  # parallel environments (one synchronous vector env)
    # ---- shared: args ----
    seed: int = 1  # seed of torch, numpy, random and the envs
    cuda: bool = False  # use CUDA if available (networks this small are faster on the CPU)
    torch_deterministic: bool = True  # torch.backends.cudnn.deterministic and one CPU thread
    track: bool = False  # log to Weights & Biases (works offline with WANDB_MODE=offline)
    wandb_project_name: str = "canonrl"  # wandb project
    wandb_entity: str | None = None  # wandb entity (team)
    capture_video: bool = False  # record videos of the first env to <run_dir>/videos
    save_model: bool = False  # save <run_dir>/model.pt at the end
    eval_episodes: int = 10  # greedy evaluation episodes at the end (and at each --eval-every)
    eval_every: int = 0  # also evaluate every this many steps (0: only at the end); logs charts/train_seconds too
    run_dir: str | None = None  # where the run is written (default runs/<env>__<script>__<seed>__<time>); must be new
    resume: str | None = None  # continue the run in this directory (its flags; --total-timesteps may extend it)
    checkpoint_every: int = 50_000  # save <run_dir>/checkpoint.pt every this many steps (and at the end and on Ctrl-C)
    # ---- end shared: args ----
    learning_rate: float = 2e-3  # Adam learning rate (rl-zoo: 1e-3; 2e-3 reaches 475 about 2x sooner)
    anneal_lr: bool = True  # anneal the learning rate and the clip coefficient linearly to 0
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


# ---- shared: helpers ----
SCRIPT, ALGOS = Path(__file__).name, Path(__file__).resolve().parent


def fail(msg: str, *scripts: str):
    """Bad input: one line on stderr, exit status 2. It suggests those of `scripts` that exist beside this one."""
    found = [s for s in scripts if (ALGOS / s).is_file()]
    print(f"error: {msg}" + (f"; use {' or '.join(found)}" if found else ""), file=sys.stderr)
    sys.exit(2)


def env_spaces(env_id: str):
    """(observation space, action space) of env_id, or a one-line error. The env is made in a temporary directory
    with stderr muted: MuJoCo prints warnings and leaves MUJOCO_LOG.TXT behind, which must not precede an error."""
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        fail(f"unknown env id '{env_id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    cwd, stderr_fd = os.getcwd(), os.dup(2)
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as null, warnings.catch_warnings(action="ignore"):
        os.chdir(tmp), os.dup2(null.fileno(), 2)
        try:
            with gym.make(env_id) as env:
                return env.observation_space, env.action_space
        except Exception as e:
            error = f"cannot make env '{env_id}': {type(e).__name__}: {(str(e).strip() or ' ').splitlines()[0]}"
        finally:
            os.dup2(stderr_fd, 2), os.close(stderr_fd), os.chdir(cwd)
    fail(error)


def check_ranges(args, rules: dict):
    """Fail on the first flag outside its range; a rule is a condition on x, the flag's value (e.g. "0 <= x <= 1")."""
    rules = {"total_timesteps": "x >= 1", "eval_episodes": "x >= 0", "eval_every": "x >= 0",
             "checkpoint_every": "x >= 1", **rules}
    for name, rule in rules.items():
        if (x := getattr(args, name)) is not None and not eval(rule, {"x": x}):  # the rules are literals of this file
            fail(f"--{name.replace('_', '-')} {x} is out of range: it must satisfy {rule}")


def start_run(args, check_args):
    """Resume (--resume DIR: the run's saved flags; --total-timesteps may extend it), check the flags, choose the run
    directory (a new run never writes into one that holds files), seed everything. Returns (args, checkpoint, dir)."""
    ckpt = None
    if args.resume:
        path = Path(args.resume) / "checkpoint.pt"
        if not path.is_file():
            fail(f"no checkpoint at {path}; pass the run directory of an earlier {SCRIPT} run")
        try:
            ckpt = torch.load(path, weights_only=False)
            saved = Args(**ckpt["args"])
        except Exception as e:
            fail(f"{path} is corrupt or not a {SCRIPT} checkpoint ({type(e).__name__}); delete it or start anew")
        given = [k for k, v in asdict(args).items() if v != getattr(Args(), k) and k not in ("resume", "run_dir")]
        if "total_timesteps" in given:
            if args.total_timesteps < ckpt["global_step"]:
                fail(f"--total-timesteps {args.total_timesteps} is below the {ckpt['global_step']} steps already done")
            print(f"resume: --total-timesteps {args.total_timesteps} (was {saved.total_timesteps})", file=sys.stderr)
            saved.total_timesteps = args.total_timesteps
        if ignored := [f"--{k.replace('_', '-')}" for k in given if k != "total_timesteps"]:
            print(f"resume: the run's saved flags are kept; ignored: {' '.join(ignored)}", file=sys.stderr)
        args = saved
        args.resume = args.run_dir = str(path.parent)
    check_args(args)
    name = f"{args.env_id.replace('/', '-')}__{SCRIPT[:-3]}__{args.seed}__{time.time():.0f}"
    run_dir = Path(args.run_dir or f"runs/{name}")
    if ckpt is None and run_dir.is_dir() and any(run_dir.iterdir()):
        fail(f"--run-dir {run_dir} is not empty; continue that run with --resume {run_dir} or choose a new --run-dir")
    random.seed(args.seed), np.random.seed(args.seed), torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(1 if args.torch_deterministic else torch.get_num_threads())  # 1: fastest for small nets
    return args, ckpt, run_dir


class RunLogger:
    """What a run shows and leaves behind: config.json, metrics.csv (global_step, wall_time, name, value; append-only),
    TensorBoard events, a wandb run with --track, the progress bar. Resuming drops the rows logged after the checkpoint
    (those steps are redone): no step is logged twice. The training clock stops during evaluations."""

    def __init__(self, args, run_dir: Path, total: int, step: int, resuming: bool):
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics, header = run_dir / "metrics.csv", "global_step,wall_time,name,value\n"
        if resuming:
            lines = metrics.read_text().splitlines(keepends=True)[1:] if metrics.is_file() else []
            (run_dir / "metrics.tmp").write_text(header + "".join(ln for ln in lines if int(ln.split(",")[0]) <= step))
            os.replace(run_dir / "metrics.tmp", metrics)
        else:
            git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ALGOS)
            config = {"script": SCRIPT, "args": asdict(args), "git_commit": git.stdout.strip() or None,
                      "versions": {p: version(p) for p in ("torch", "gymnasium", "numpy")}}
            (run_dir / "config.json").write_text(json.dumps(config, indent=2))
            metrics.write_text(header)
        self.file = open(metrics, "a", newline="")
        self.csv, self.tb = csv.writer(self.file), SummaryWriter(str(run_dir))
        if args.track:
            import wandb
            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                       name=run_dir.name, dir=str(run_dir), sync_tensorboard=True, id=run_dir.name, resume="allow")
        self.bar = tqdm(total=total, initial=step, unit="step", mininterval=1.0)
        self.first_step, self.start, self.eval_seconds, self.last_return = step, time.time(), 0.0, float("nan")

    def log(self, step: int, metrics: dict):
        for name, value in metrics.items():
            value = float(value.detach() if torch.is_tensor(value) else value)  # a loss may still require grad
            self.csv.writerow([step, f"{time.time():.3f}", name, repr(value)])
            self.tb.add_scalar(name, value, step)
        self.file.flush()

    def progress(self, step: int):
        """Log charts/sps (environment steps per training second) and update the progress bar."""
        sps = int((step - self.first_step) / max(time.time() - self.start - self.eval_seconds, 1e-9))
        self.log(step, {"charts/sps": sps})
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(sps=sps, ret=f"{self.last_return:.1f}", refresh=False)

    def evaluate(self, step: int, run_episodes):
        """Log charts/train_seconds, then one row per episode of run_episodes(): a list of episodic returns (logged as
        eval/episodic_return) or a dict {metric name: one value per episode} (multi-agent: team return, win)."""
        self.log(step, {"charts/train_seconds": time.time() - self.start - self.eval_seconds})
        start, results = time.time(), run_episodes()
        self.eval_seconds += time.time() - start
        for name, values in (results if isinstance(results, dict) else {"eval/episodic_return": results}).items():
            for value in values:
                self.log(step, {name: value})
        return results

    def close(self, run_dir: Path, args, results):
        """Close the files; the last lines say the evaluation, where the run is and the script's reference."""
        self.bar.close(), self.file.close(), self.tb.close()
        for name, values in (results if isinstance(results, dict) else {"eval/episodic_return": results}).items():
            if len(values):
                print(f"{name}: {np.mean(values):.2f} +- {np.std(values):.2f} over {len(values)} episodes")
        print(f"run saved in {run_dir}" + (" (model.pt, checkpoint.pt)" if args.save_model else " (checkpoint.pt)"))
        path = ALGOS.parent / "benchmark" / "references.toml"  # our multi-seed runs of each script, if present
        refs = [r for r in (tomllib.loads(path.read_text())["reference"] if path.is_file() else []) if "values" in r and
                (r["script"], r["env_id"]) == (SCRIPT, args.env_id) and r["score"] in ("final_eval", "final_win_rate")]
        for r in sorted(refs, key=lambda r: abs(r["total_timesteps"] - args.total_timesteps))[:1]:
            print(f"reference {r['id']} ({r['total_timesteps']:,} steps, {r['score']}, {len(r['values'])} seeds): "
                  f"{np.mean(r['values']):.2f} +- {np.std(r['values']):.2f}, lowest seed {min(r['values']):.2f}")
        if not refs:
            print(f"no reference for {SCRIPT} on {args.env_id} to compare with")
# ---- end shared: helpers ----


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}", "ppo_continuous.py")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}", "ppo_atari.py")
    check_ranges(args, {"num_envs": "x >= 1", "num_steps": "x >= 1", "num_minibatches": "x >= 1",
                        "update_epochs": "x >= 1", "learning_rate": "x > 0", "gamma": "0 <= x <= 1",
                        "gae_lambda": "0 <= x <= 1", "clip_coef": "x > 0", "ent_coef": "x >= 0", "vf_coef": "x >= 0",
                        "max_grad_norm": "x > 0", "target_kl": "x > 0"})
    batch = args.num_envs * args.num_steps
    if batch % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch num_envs*num_steps = {batch}")
    if args.total_timesteps < batch:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout (num_envs*num_steps = {batch})")


def make_env(env_id, idx, capture_video, run_dir):
    def thunk():
        if capture_video and idx == 0:
            return gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), f"{run_dir}/videos")
        return gym.make(env_id)
    return thunk


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs, obs -> 64 -> 64 (tanh) -> logits / value, as in CleanRL and SB3."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01))  # std 0.01: a near-uniform first policy

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the entropy and V(x)."""
        dist = torch.distributions.Categorical(logits=self.actor(x), validate_args=False)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.get_value(x)


def compute_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """GAE (Schulman et al. 2016, eq. 16) on tensors of shape (T, N). dones[t]: the episode ended at step t
    (terminated or truncated; a truncation was already bootstrapped into rewards[t]). Returns (advantages, returns)."""
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        next_values, nonterminal = next_value if t == len(rewards) - 1 else values[t + 1], 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * nonterminal - values[t]
        advantages[t] = last = delta + gamma * gae_lambda * nonterminal * last
    return advantages, advantages + values


def bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, gamma):
    """A time limit is not part of the task (Pardo et al. 2018): where an episode was truncated, add gamma * V(s_final)
    to its last reward, one value_fn call for all (same-step autoreset keeps s_final in infos["final_obs"])."""
    idx = np.flatnonzero(truncated & ~terminated)
    if len(idx) == 0:
        return reward
    return reward + np.bincount(idx, gamma * value_fn(np.stack(infos["final_obs"][idx])), len(reward))


def ppo_loss(agent, obs, actions, old_logprobs, advantages, returns, clip_coef, ent_coef, vf_coef):
    """Clipped surrogate objective (PPO paper, eq. 7) + value MSE - entropy bonus; returns (loss, statistics)."""
    _, logprob, entropy, value = agent.get_action_and_value(obs, actions)
    logratio = logprob - old_logprobs
    ratio = logratio.exp()
    pg_loss = -torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_loss = 0.5 * ((value - returns) ** 2).mean()
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy.mean()
    with torch.no_grad():  # approx_kl: the k3 estimator of Schulman's note "Approximating KL divergence"
        stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy.mean(), "approx_kl":
                 ((ratio - 1) - logratio).mean(), "clipfrac": ((ratio - 1).abs() > clip_coef).float().mean()}
    return loss, {k: v.detach() for k, v in stats.items()}


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu"):
    """Greedy (argmax) episodes on a fresh env; returns the list of episodic returns."""
    env, returns = gym.make(env_id), []
    for ep in range(episodes):
        (obs, _), done, total = env.reset(seed=seed + ep), False, 0.0
        while not done:
            logits = agent.actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
            obs, reward, terminated, truncated, _ = env.step(int(logits.argmax()))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    envs = gym.vector.SyncVectorEnv(  # same-step autoreset: a finished episode's last observation is in infos
        [make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    agent = Agent(obs_dim, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # fused: 4x faster
    batch_size = args.num_envs * args.num_steps
    minibatch_size, num_iterations = batch_size // args.num_minibatches, args.total_timesteps // batch_size
    iteration, eval_seed = 0, args.seed + 100_000  # evaluation episodes are seeded apart from training
    run_eval = lambda: evaluate(agent, args.env_id, args.eval_episodes, eval_seed, device)  # noqa: E731
    if ckpt is not None:
        try:
            agent.load_state_dict(ckpt["agent"]), optimizer.load_state_dict(ckpt["optimizer"])
        except Exception as e:
            fail(f"{run_dir / 'checkpoint.pt'} does not fit this network ({type(e).__name__}); delete it or start anew")
        torch.set_rng_state(ckpt["torch_rng"])  # action sampling and minibatch shuffling; envs are seeded on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(args, run_dir, num_iterations * batch_size, global_step, resuming=ckpt is not None)

    def checkpoint(iteration):  # write, then rename: a crash never leaves a half-written checkpoint.pt
        torch.save({"args": asdict(args), "iteration": iteration, "global_step": iteration * batch_size, "agent":
                    agent.state_dict(), "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()},
                   run_dir / "checkpoint.tmp")
        os.replace(run_dir / "checkpoint.tmp", run_dir / "checkpoint.pt")

    @torch.no_grad()
    def value_fn(obs):  # V(obs) of a numpy batch of final observations
        return agent.get_value(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()

    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs), device=device) for _ in range(4))
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    episode_return, episode_length = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=np.int64)
    try:
        for iteration in range(iteration + 1, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"], clip_coef = frac * args.learning_rate, frac * args.clip_coef
            for step in range(args.num_steps):
                obs[step] = torch.as_tensor(next_obs, device=device)
                with torch.no_grad():
                    actions[step], logprobs[step], _, values[step] = agent.get_action_and_value(obs[step])
                next_obs, reward, terminated, truncated, infos = envs.step(actions[step].cpu().numpy())
                episode_return, episode_length = episode_return + reward, episode_length + 1
                global_step += args.num_envs
                reward = bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, args.gamma)
                rewards[step], dones[step] = torch.as_tensor(reward), torch.as_tensor(terminated | truncated)
                for i in np.flatnonzero(terminated | truncated):  # every finished episode of every sub-env
                    logger.last_return = episode_return[i]
                    logger.log(global_step, {"train/episodic_return": episode_return[i],
                                             "train/episodic_length": episode_length[i]})
                    episode_return[i], episode_length[i] = 0.0, 0
            with torch.no_grad():
                next_value = agent.get_value(torch.as_tensor(next_obs, device=device))
            advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)
            b_obs, b_actions, b_logprobs = obs.reshape(batch_size, obs_dim), actions.reshape(-1), logprobs.reshape(-1)
            b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
            for epoch in range(args.update_epochs):
                perm = torch.randperm(batch_size, device=device)
                for start in range(0, batch_size, minibatch_size):
                    mb = perm[start:start + minibatch_size]
                    mb_advantages = (b_advantages[mb] - b_advantages[mb].mean()) / (b_advantages[mb].std() + 1e-8)
                    loss, stats = ppo_loss(agent, b_obs[mb], b_actions[mb], b_logprobs[mb], mb_advantages,
                                           b_returns[mb], clip_coef, args.ent_coef, args.vf_coef)
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                    break
            stats["explained_variance"] = 1 - (b_returns - b_values).var() / b_returns.var()  # nan: constant returns
            logger.log(global_step, {"charts/learning_rate": optimizer.param_groups[0]["lr"],
                                     **{f"losses/{k}": v for k, v in stats.items()}})
            logger.progress(global_step)
            if args.eval_every and iteration < num_iterations and global_step % args.eval_every < batch_size:
                logger.evaluate(global_step, run_eval)
            if iteration % max(1, args.checkpoint_every // batch_size) == 0:
                checkpoint(iteration)
    except KeyboardInterrupt:
        checkpoint(iteration - 1)  # the unfinished iteration is redone on resume
        print(f"\ninterrupted: metrics kept, resume with --resume {run_dir}", file=sys.stderr)
        sys.exit(130)
    envs.close()
    checkpoint(num_iterations)
    eval_returns = logger.evaluate(global_step, run_eval)
    if args.save_model:
        torch.save({"agent": agent.state_dict(), "args": asdict(args), "eval_returns": eval_returns,
                    "obs_dim": obs_dim, "n_actions": n_actions}, run_dir / "model.pt")
    logger.close(run_dir, args, eval_returns)


if __name__ == "__main__":
    main(tyro.cli(Args))
