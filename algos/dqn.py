"""DQN on classic control (CartPole-v1 by default).

Paper: Mnih et al. 2015, "Human-level control through deep reinforcement learning" (Nature 518): experience
replay, a target network, epsilon-greedy exploration annealed linearly. As CleanRL's dqn.py and SB3's DQN.
This variant: vector env with same-step autoreset; the replay buffer stores the true final observation and
only termination (not time-limit truncation) cuts the bootstrap. Defaults chosen on CartPole-v1 (runs in
benchmark/references.toml and benchmark/reports/dqn-cartpole-cpu-2026-11-23.md): one update per step, soft target
updates (tau 0.005, Lillicrap et al. 2016) and a learning rate of 5e-4 annealed linearly to zero. With 1e-3 the
policy was solved after 40-50k steps and then often forgot (training returns fell to 250-350): 5 of 20 seeds ended
below 475 at 100k; with 5e-4 it is solved after 40-70k steps and forgets less: 2 of 20 below. With hard target
copies every 100-500 steps, 1-in-3 seeds ended with a greedy policy that drifts off the track (evaluation 220-430).
Fastest to a 5-episode greedy evaluation of 475 that we found (8-25k steps on seeds 1-10 with 9e93936's code, 2-8 s
here; 11-34k steps on seeds 1-5 at 69ddbab, benchmark/reports/speed-cpu-2026-11-23.md), not the default because its
final evaluation at 100k is less stable (one seed in ten at 462):
`--learning-rate 2.3e-3 --batch-size 128 --train-frequency 32 --gradient-steps 8 --tau 1.0
--target-network-frequency 10 --exploration-fraction 0.08 --end-e 0.04` (benchmark/speed.py uses it).
Speed: on a CPU, torch's per-op overhead, not arithmetic, dominates networks this small, so the script saves ops:
the replay buffer is one numpy array of packed rows (a minibatch is one index and one copy), each layer is one addmm,
the weights of each network live in one flat tensor (one op for the soft target update; see flat_parameters), and
Adam is written out on that tensor (7 ops; torch.optim.Adam's step costs ~10x its kernel in Python here).

Run:    python algos/dqn.py --env-id CartPole-v1 --seed 1
Result: CartPole-v1, 100k steps, final 10-episode greedy evaluation >= 475 on seeds 1-3 (see
        benchmark/references.toml, gate "dqn-CartPole-v1-cpu").
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
    num_envs: int = 1  # parallel environments (one synchronous vector env)
    cuda: bool = False  # use CUDA if available (small MLPs are faster on the CPU)
    torch_deterministic: bool = True  # torch.backends.cudnn.deterministic and one CPU thread
    track: bool = False  # log to Weights & Biases (works offline with WANDB_MODE=offline)
    wandb_project_name: str = "canonrl"  # wandb project
    wandb_entity: str | None = None  # wandb entity (team)
    capture_video: bool = False  # record videos of the first env to <run_dir>/videos
    save_model: bool = False  # save <run_dir>/model.pt at the end
    eval_episodes: int = 10  # greedy evaluation episodes at the end (logged as eval/episodic_return)
    eval_every: int = 0  # also evaluate every this many steps (0: only at the end); logs charts/train_seconds beside it
    run_dir: str | None = None  # where the run is written (default runs/<env>__dqn__<seed>__<time>)
    resume: str | None = None  # a run directory whose checkpoint.pt to continue from (its saved arguments are used)
    checkpoint_every: int = 50_000  # save <run_dir>/checkpoint.pt every this many steps (and on Ctrl-C)
    learning_rate: float = 5e-4  # Adam learning rate
    anneal_lr: bool = True  # anneal the learning rate linearly to 0
    buffer_size: int = 100_000  # replay buffer capacity (transitions)
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # target network update rate (1.0 = hard copy)
    target_network_frequency: int = 1  # env steps between target network updates
    batch_size: int = 64  # replay minibatch size
    start_e: float = 1.0  # initial exploration epsilon
    end_e: float = 0.05  # final exploration epsilon
    exploration_fraction: float = 0.1  # fraction of total_timesteps over which epsilon goes from start_e to end_e
    learning_starts: int = 1_000  # env steps before learning starts
    train_frequency: int = 1  # vector-env steps between training phases
    gradient_steps: int = 1  # gradient updates per training phase (SB3's gradient_steps)


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
        fail(f"dqn.py needs discrete actions but {args.env_id} has {act_space}; use sac_continuous.py or td3_continuous.py")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"dqn.py needs flat vector observations but {args.env_id} has {obs_space}; use dqn_atari.py for images")
    counts = (args.num_envs, args.batch_size, args.train_frequency, args.gradient_steps, args.target_network_frequency)
    if min(counts) < 1 or args.eval_episodes < 0:
        fail("--num-envs, --batch-size, --train-frequency, --gradient-steps, --target-network-frequency must be >= 1, "
             "--eval-episodes >= 0")
    if not (0.0 <= args.end_e <= args.start_e <= 1.0 and 0.0 < args.exploration_fraction <= 1.0 and 0.0 < args.tau <= 1.0):
        fail("need 0 <= --end-e <= --start-e <= 1, 0 < --exploration-fraction <= 1 and 0 < --tau <= 1")
    if args.batch_size > args.buffer_size or args.learning_starts < args.batch_size:
        fail(f"need --batch-size ({args.batch_size}) <= --learning-starts ({args.learning_starts}) and <= --buffer-size")
    if args.total_timesteps <= args.learning_starts:
        fail(f"--total-timesteps {args.total_timesteps} must exceed --learning-starts {args.learning_starts}")


def make_env(env_id, idx, capture_video, run_dir):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            return gym.wrappers.RecordVideo(env, f"{run_dir}/videos")
        return gym.make(env_id)
    return thunk


def linear_parameters(n_in: int, n_out: int):
    """Weight and bias of a linear layer, drawn exactly as nn.Linear(n_in, n_out) draws its own (the same random
    numbers), the weight stored transposed, (in, out), for torch.addmm."""
    layer = nn.Linear(n_in, n_out)
    return nn.Parameter(layer.weight.detach().T.contiguous()), nn.Parameter(layer.bias.detach().clone())


class QNetwork(nn.Module):
    """obs -> 120 -> 84 -> one Q-value per action, ReLU (CleanRL's network). Each layer is one torch.addmm on an
    (in, out) weight: nn.Linear's (out, in) weight costs a transpose op per layer and a node per layer in backward."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.w1, self.b1 = linear_parameters(obs_dim, 120)
        self.w2, self.b2 = linear_parameters(120, 84)
        self.w3, self.b3 = linear_parameters(84, n_actions)

    def forward(self, x):
        """Q-values (batch, n_actions) of observations (batch, obs_dim)."""
        x = torch.relu(torch.addmm(self.b1, x, self.w1))
        x = torch.relu(torch.addmm(self.b2, x, self.w2))
        return torch.addmm(self.b3, x, self.w3)


def flat_parameters(module: nn.Module):
    """Make the parameters of `module` views into one flat tensor, and their gradients views into a second one; return
    the first as a Parameter whose .grad is the second. Adam, zeroing the gradients and the target update then run
    on one tensor instead of one per parameter (an op costs 5-10 µs on a CPU; an update about 0.5 ms). Backward still
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
    Python around a 10 µs kernel here, once per gradient step; this one is 7 ops. Any torch.optim optimizer can take
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


def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def td_target(target_q_next, rewards, terminated, gamma):
    """One-step Q-learning target r + gamma * max_a' Q_target(s', a') (Nature DQN, Algorithm 1); only
    termination stops the bootstrap: a time-limit truncation still has a future."""
    return torch.addcmul(rewards, target_q_next.amax(dim=1, keepdim=True), 1.0 - terminated, value=gamma)  # 3 ops, not 5


class ReplayBuffer:
    """Fixed-size ring buffer in numpy. A transition is one float32 row [obs, next_obs, action, reward, terminated], so
    that a minibatch is one fancy index and one copy to the device: on a CPU the number of ops, not bytes, sets the
    cost. state_dict() makes it checkpointable."""

    def __init__(self, size, obs_dim, rng):
        self.size, self.pos, self.full, self.rng, self.obs_dim = size, 0, False, rng, obs_dim
        self.rows = np.zeros((size, 2 * obs_dim + 3), dtype=np.float32)

    def add(self, obs, next_obs, actions, rewards, terminated):
        idx = (self.pos + np.arange(len(obs))) % self.size
        self.rows[idx] = np.concatenate([obs, next_obs, np.stack([actions, rewards, terminated], axis=1)], axis=1)
        self.full = self.full or self.pos + len(obs) >= self.size
        self.pos = (self.pos + len(obs)) % self.size

    def sample(self, batch_size, device):
        """(obs, next_obs, actions, rewards, terminated) of a uniform minibatch, as tensors on `device`; the last three
        are columns (batch, 1), the shape Q(s).gather(1, actions) has."""
        idx = self.rng.integers(0, self.size if self.full else self.pos, batch_size)
        b, d = torch.as_tensor(self.rows[idx], device=device), self.obs_dim
        return b[:, :d], b[:, d:2 * d], b[:, 2 * d:2 * d + 1].long(), b[:, 2 * d + 1:2 * d + 2], b[:, 2 * d + 2:]

    def state_dict(self):
        return {k: getattr(self, k) for k in ("pos", "full", "rows")}

    def load_state_dict(self, state):
        for k, v in state.items():
            setattr(self, k, v)


@torch.no_grad()
def evaluate(q_network, env_id, episodes, seed, device="cpu"):
    """Greedy (argmax Q) episodes on a fresh env; returns the list of episodic returns."""
    env, returns = gym.make(env_id), []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done, total = False, 0.0
        while not done:
            q_values = q_network(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
            obs, reward, terminated, truncated, _ = env.step(int(q_values.argmax()))
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
            fail(f"no checkpoint at {ckpt_path}; pass the run directory of an earlier dqn.py run")
        try:
            ckpt = torch.load(ckpt_path, weights_only=False)
            args = Args(**ckpt["args"])
        except Exception as e:
            fail(f"{ckpt_path} is corrupt or not a dqn.py checkpoint ({type(e).__name__}); delete it or start anew")
        args.run_dir = args.resume = str(Path(ckpt_path).parent)
    check_args(args)
    run_dir = Path(args.run_dir or f"runs/{args.env_id}__dqn__{args.seed}__{int(time.time())}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:
        torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim, n_actions = envs.single_observation_space.shape[0], int(envs.single_action_space.n)
    q_network = QNetwork(obs_dim, n_actions).to(device)
    target_network = QNetwork(obs_dim, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    flat, target_flat = flat_parameters(q_network), flat_parameters(target_network).detach()  # the weights as views
    optimizer = Adam(flat, lr=args.learning_rate)
    rng = np.random.default_rng(args.seed)  # exploration and replay sampling
    rb = ReplayBuffer(args.buffer_size, obs_dim, rng)
    num_iterations = args.total_timesteps // args.num_envs  # one iteration = one step of every env
    start_iteration = 0
    if args.resume:
        try:
            for obj, key in ((q_network, "q_network"), (target_network, "target_network"), (optimizer, "optimizer"), (rb, "rb")):
                obj.load_state_dict(ckpt[key])
            rng.bit_generator.state = ckpt["rng"]  # the only RNG used after seeding: envs are seeded on reset
        except Exception as e:
            fail(f"{ckpt_path} does not fit this network ({type(e).__name__}); delete it or start anew")
        start_iteration = ckpt["iteration"]
    logger = RunLogger(args, run_dir)

    def save_checkpoint(iteration):
        torch.save({"args": asdict(args), "iteration": iteration, "global_step": iteration * args.num_envs,
                    "q_network": q_network.state_dict(),
                    "target_network": target_network.state_dict(), "optimizer": optimizer.state_dict(),
                    "rb": rb.state_dict(), "rng": rng.bit_generator.state},
                   run_dir / "checkpoint.tmp")
        os.replace(run_dir / "checkpoint.tmp", run_dir / "checkpoint.pt")  # never leave a half-written file

    global_step = start_iteration * args.num_envs
    obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    episode_return, episode_length = np.zeros(args.num_envs), np.zeros(args.num_envs, dtype=np.int64)
    bar = tqdm(total=num_iterations * args.num_envs, initial=global_step, unit="step", mininterval=1.0)
    last_return, iteration, start_time, eval_seconds = float("nan"), start_iteration, time.time(), 0.0
    try:
        for iteration in range(start_iteration, num_iterations):
            epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step)
            actions = rng.integers(0, n_actions, args.num_envs)
            exploit = rng.random(args.num_envs) >= epsilon
            if exploit.any():  # the network is only asked where it acts
                with torch.no_grad():
                    greedy = q_network(torch.as_tensor(obs, dtype=torch.float32, device=device)).argmax(dim=1).cpu().numpy()
                actions = np.where(exploit, greedy, actions)
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            real_next_obs = next_obs.copy()
            if "_final_obs" in infos:  # same-step autoreset: store the true last observation, not the reset one
                for i in np.flatnonzero(infos["_final_obs"]):
                    real_next_obs[i] = infos["final_obs"][i]
            rb.add(obs, real_next_obs, actions, rewards, terminated)
            obs = next_obs
            global_step += args.num_envs
            episode_return += rewards
            episode_length += 1
            for i in np.flatnonzero(terminated | truncated):  # every finished episode of every sub-env
                last_return = float(episode_return[i])
                logger.log(global_step, {"train/episodic_return": last_return,
                                         "train/episodic_length": int(episode_length[i])})
                episode_return[i], episode_length[i] = 0.0, 0

            if global_step > args.learning_starts:
                if iteration % args.train_frequency == 0:
                    if args.anneal_lr:
                        optimizer.lr = args.learning_rate * (1.0 - iteration / num_iterations)
                    for _ in range(args.gradient_steps):
                        b_obs, b_next_obs, b_actions, b_rewards, b_terminated = rb.sample(args.batch_size, device)
                        with torch.no_grad():
                            target = td_target(target_network(b_next_obs), b_rewards, b_terminated, args.gamma)
                        q_pred = q_network(b_obs).gather(1, b_actions)
                        loss = F.mse_loss(q_pred, target)
                        flat.grad.zero_()
                        loss.backward()
                        optimizer.step()
                    if (iteration // args.train_frequency) % max(1, 100 // args.gradient_steps) == 0:  # every ~100 updates
                        sps = int((global_step - start_iteration * args.num_envs) / (time.time() - start_time - eval_seconds))
                        logger.log(global_step, {"losses/td_loss": loss.item(), "losses/q_values": q_pred.mean().item(),
                                                 "charts/epsilon": epsilon, "charts/sps": sps,
                                                 "charts/learning_rate": optimizer.lr})
                        bar.set_postfix(sps=sps, ret=f"{last_return:.1f}", refresh=False)
                if iteration % max(1, args.target_network_frequency // args.num_envs) == 0:
                    with torch.no_grad():  # target <- tau * online + (1 - tau) * target, all weights in one op
                        target_flat.lerp_(flat, args.tau)
            bar.update(args.num_envs)
            if args.eval_every and iteration + 1 < num_iterations and global_step % args.eval_every < args.num_envs:
                train_seconds = time.time() - start_time - eval_seconds  # evaluation time is not training time
                returns = evaluate(q_network, args.env_id, args.eval_episodes, seed=args.seed + 100_000, device=device)
                eval_seconds = time.time() - start_time - train_seconds
                logger.log(global_step, {"charts/train_seconds": train_seconds})
                logger.log_many(global_step, "eval/episodic_return", returns)
            if (iteration + 1) % max(1, args.checkpoint_every // args.num_envs) == 0:
                save_checkpoint(iteration + 1)
    except KeyboardInterrupt:
        save_checkpoint(iteration)  # the interrupted step is redone; the buffer holds every step before it
        logger.close()
        print(f"\ninterrupted: metrics kept, resume with --resume {run_dir}", file=sys.stderr)
        sys.exit(130)
    bar.close()
    envs.close()
    save_checkpoint(num_iterations)

    logger.log(global_step, {"charts/train_seconds": time.time() - start_time - eval_seconds})
    eval_returns = evaluate(q_network, args.env_id, args.eval_episodes, seed=args.seed + 100_000, device=device)
    logger.log_many(global_step, "eval/episodic_return", eval_returns)
    if eval_returns:
        print(f"eval/episodic_return: {np.mean(eval_returns):.2f} +- {np.std(eval_returns):.2f} "
              f"over {len(eval_returns)} episodes")
    if args.save_model:
        torch.save({"q_network": q_network.state_dict(), "args": asdict(args), "eval_returns": eval_returns,
                    "obs_dim": obs_dim, "n_actions": n_actions}, run_dir / "model.pt")
    logger.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
