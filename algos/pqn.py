"""PQN on classic control (CartPole-v1 by default) and MinAtar: Q-learning without replay or target.

Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning": epsilon-greedy rollouts of
parallel envs, a Q-network with LayerNorm (in place of a target network), Peng's Q(lambda) returns
over each rollout, a few epochs of minibatch regression onto them, RAdam; CleanRL's pqn.py
hyperparameters. Unlike CleanRL's, a time limit is not an end: the last reward of a truncated
episode is bootstrapped with max_a Q(final obs). MinAtar/<Game>-v1 grids pass 16 3x3 convolutions
first (the MinAtar paper's torso; hyperparameters not tuned for them).

Run:    python algos/pqn.py --env-id CartPole-v1 --seed 1
Quick:  python algos/pqn.py --total-timesteps 20000
Results: benchmark/references.toml
"""

import csv
import difflib
import hashlib
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import warnings
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
    learning_rate: float = 2.5e-4
    """RAdam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    num_steps: int = 128
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    q_lambda: float = 0.65
    """lambda of the Q(lambda) returns (0: one-step Q-learning targets, 1: Monte-Carlo returns)"""
    num_minibatches: int = 4
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 4
    """epochs over each rollout"""
    max_grad_norm: float = 10.0
    """global gradient norm clip"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.05
    """final exploration epsilon"""
    exploration_fraction: float = 0.5
    """fraction of total_timesteps over which epsilon goes from start_e to end_e"""
    env_id: str = "CartPole-v1"
    """id of a discrete-action env with flat vector observations, or MinAtar/<Game>-v1"""
    total_timesteps: int = 500_000
    """environment steps over all envs"""
    num_envs: int = 4
    """parallel environments (one synchronous vector env)"""
    # ---- shared: args ----
    seed: int = 1
    """seed of torch, numpy, random and the envs"""
    cuda: bool = False
    """run on CUDA when available (the CNN scripts gain from it; small MLPs are fastest on a CPU)"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic and one CPU thread"""
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "canonrl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb entity (team)"""
    capture_video: bool = False
    """record episode 0 of the final evaluation to <run_dir>/videos"""
    save_model: bool = False
    """save <run_dir>/model.pt at the end"""
    eval_episodes: int = 10
    """evaluation episodes (the policy evaluate() runs) at the end and each --eval-every"""
    eval_every: int = 0
    """also evaluate every this many steps (0: only at the end); logs charts/train_seconds too"""
    run_dir: str | None = None
    """where the run is written (default runs/<env>__<script>__<seed>__<time>); must be new"""
    resume: str | None = None
    """continue the run in this directory (its flags; --total-timesteps may extend it)"""
    checkpoint_every: int = 50_000
    """save <run_dir>/checkpoint.pt every this many steps (and at the end and on Ctrl-C)"""
    # ---- end shared: args ----


# ---- shared: minatar/register_minatar ----
MINATAR = {
    f"MinAtar/{game.title().replace('_', '')}-v1": game
    for game in ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
}


def register_minatar():
    """Register the MinAtar/<Game>-v1 ids (pip install minatar) here: importing minatar takes 1 s.
    Called at import, and by each of impala.py's actors: a Ray actor's process does not run this
    file's top level."""
    for env_id, game in MINATAR.items():
        if env_id not in gym.registry:
            gym.register(
                env_id,
                "minatar.gym:BaseEnv",
                max_episode_steps=10_000,
                kwargs=dict(game=game, use_minimal_action_set=True),
            )


register_minatar()
# ---- end shared: minatar/register_minatar ----


def make_env(env_id, video_dir=None):
    """env_id; a MinAtar game's observation (10, 10, channels) of booleans becomes (channels, 10,
    10) floats for the convolution. With video_dir, episode 0 is recorded there as
    eval-episode-0.mp4 (--capture-video)."""
    if env_id in MINATAR:
        env = gym.make(env_id)
        h, w, c = env.observation_space.shape
        return gym.wrappers.TransformObservation(
            env,
            lambda obs: np.moveaxis(obs, -1, 0).astype(np.float32),
            gym.spaces.Box(0.0, 1.0, (c, h, w), np.float32),
        )
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


class QNetwork(nn.Module):
    """obs -> 120 -> 84 -> one Q-value per action, each hidden layer LayerNorm then ReLU, orthogonal
    init (CleanRL's pqn.py). LayerNorm is what lets PQN drop the target network: the paper shows
    that it keeps off-policy TD from diverging. A MinAtar grid (channels, 10, 10) first passes 16
    3x3 convolutions (ReLU), as in MinAtar's network."""

    def __init__(self, obs_shape: tuple, n_actions: int):
        super().__init__()
        torso = []
        features = obs_shape[0]
        if len(obs_shape) == 3:
            c, h, w = obs_shape
            # Flatten(-3): one unbatched observation too, as evaluate() passes
            torso = [layer_init(nn.Conv2d(c, 16, 3)), nn.ReLU(), nn.Flatten(-3)]
            features = 16 * (h - 2) * (w - 2)
        self.network = nn.Sequential(
            *torso,
            layer_init(nn.Linear(features, 120)),
            nn.LayerNorm(120),
            nn.ReLU(),
            layer_init(nn.Linear(120, 84)),
            nn.LayerNorm(84),
            nn.ReLU(),
            layer_init(nn.Linear(84, n_actions)),
        )

    def forward(self, x):
        return self.network(x)

    def get_greedy_action(self, x):
        """argmax_a Q(x, a): the exploiting action of the rollout and the policy that evaluate()
        runs."""
        return self(x).argmax(dim=-1)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def q_lambda_returns(rewards, q_max, dones, next_q_max, gamma, q_lambda):
    """Peng's Q(lambda) returns of a rollout (PQN, Gallici et al. 2024), on tensors of shape (T, N),
    computed backwards:
        R_t = r_t + gamma * (lambda * R_{t+1} + (1 - lambda) * max_a Q(s_{t+1}, a)),
    with R_T = max_a Q(s_T, a) = next_q_max (the observations after the rollout). q_max[t] is
    max_a Q(s_t, a). dones[t]: the episode ended at step t (terminated or truncated; a truncation
    was already bootstrapped into rewards[t]), which cuts both terms. lambda 0 gives one-step
    Q-learning targets, lambda 1 discounted returns bootstrapped only at the rollout's end."""
    returns = torch.zeros_like(rewards)
    next_return = next_q_max
    next_value = next_q_max
    for t in reversed(range(len(rewards))):
        future = q_lambda * next_return + (1.0 - q_lambda) * next_value
        returns[t] = rewards[t] + gamma * (1.0 - dones[t]) * future
        next_return = returns[t]
        next_value = q_max[t]
    return returns


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


@torch.no_grad()
def evaluate(q_network, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy (argmax Q) episodes on a fresh env; returns the list of episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = q_network.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)
            )
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    q_network = QNetwork(obs_shape, n_actions).to(device)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=args.learning_rate)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            q_network, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    # what a checkpoint holds, saved and resumed (exploration draws from torch's generator)
    stateful = {"q_network": q_network, "optimizer": optimizer, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt)

    @torch.no_grad()
    def value_fn(obs):  # max_a Q(obs, a) of a numpy batch of final observations
        x = torch.as_tensor(obs, dtype=torch.float32, device=device)
        return q_network(x).max(dim=-1).values.cpu().numpy()

    obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    episode_return = np.zeros(args.num_envs)
    episode_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration + 1, num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        for step in range(args.num_steps):
            epsilon = linear_schedule(
                args.start_e,
                args.end_e,
                args.exploration_fraction * args.total_timesteps,
                global_step,
            )
            obs[step] = torch.as_tensor(next_obs, device=device)
            with torch.no_grad():
                greedy = q_network.get_greedy_action(obs[step])
            explore = torch.rand(args.num_envs, device=device) < epsilon
            random_actions = torch.randint(n_actions, (args.num_envs,), device=device)
            actions[step] = torch.where(explore, random_actions, greedy)
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
                logger.last_return = episode_return[i]
                logger.log(
                    global_step,
                    {
                        "train/episodic_return": episode_return[i],
                        "train/episodic_length": episode_length[i],
                    },
                )
                episode_return[i] = 0.0
                episode_length[i] = 0
        b_obs = obs.flatten(0, 1)
        b_actions = actions.flatten(0, 1)
        # the targets come from the network that collected the rollout, once, before the epochs
        with torch.no_grad():
            q_max = q_network(b_obs).max(dim=-1).values.view(args.num_steps, args.num_envs)
            next_q_max = q_network(torch.as_tensor(next_obs, device=device)).max(dim=-1).values
        returns = q_lambda_returns(rewards, q_max, dones, next_q_max, args.gamma, args.q_lambda)
        b_returns = returns.flatten(0, 1)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                mb = perm[start : start + minibatch_size]
                q_pred = q_network(b_obs[mb]).gather(1, b_actions[mb, None]).squeeze(1)
                loss = F.mse_loss(q_pred, b_returns[mb])
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()
        logger.log(
            global_step,
            {
                "losses/td_loss": loss,
                "losses/q_values": q_pred.mean(),
                "charts/epsilon": epsilon,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        logger.progress(global_step)
        if (
            args.eval_every
            and iteration < num_iterations
            and global_step % args.eval_every < batch_size
        ):
            logger.evaluate(global_step, run_eval)
        if iteration % max(1, args.checkpoint_every // batch_size) == 0 or logger.stop_requested:
            logger.save_checkpoint(stateful, iteration, global_step)
        if logger.stop_requested:  # Ctrl-C: the iteration it came in is finished and saved
            logger.exit_interrupted()
    envs.close()
    video_dir = run_dir / "videos" if args.capture_video else None
    eval_returns = logger.evaluate(global_step, lambda: run_eval(video_dir))
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if args.save_model:
        save_model(
            {
                "q_network": q_network.state_dict(),
                "args": asdict(args),
                "eval_returns": eval_returns,
                "obs_shape": obs_shape,
                "n_actions": n_actions,
            },
            run_dir,
        )
    logger.close(eval_returns)


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "sac_continuous.py",
            "td3_continuous.py",
        )
    if args.env_id in MINATAR:
        if args.capture_video:
            fail("MinAtar games record no video: drop --capture-video")
    elif not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(
            f"{SCRIPT} needs flat vector observations or a MinAtar game "
            f"(MinAtar/<Game>-v1) but {args.env_id} has {obs_space}",
            "dqn_atari.py",
        )
    check_ranges(
        args,
        {
            "num_envs": "x >= 1",
            "num_steps": "x >= 1",
            "num_minibatches": "x >= 1",
            "update_epochs": "x >= 1",
            "learning_rate": "x > 0",
            "gamma": "0 <= x <= 1",
            "q_lambda": "0 <= x <= 1",
            "max_grad_norm": "x > 0",
            "start_e": "0 <= x <= 1",
            "end_e": "0 <= x <= 1",
            "exploration_fraction": "0 < x <= 1",
        },
    )
    if args.end_e > args.start_e:
        fail(f"--end-e {args.end_e} is above --start-e {args.start_e}: epsilon is annealed down")
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


# ---- shared: helpers ----
SCRIPT = Path(__file__).name
ALGOS = Path(__file__).resolve().parent


def fail(msg: str, *scripts: str):
    """Bad input: one line on stderr, exit status 2. It suggests those of `scripts` that exist
    beside this one."""
    found = [s for s in scripts if s != SCRIPT and (ALGOS / s).is_file()]
    print(f"error: {msg}" + (f"; use {' or '.join(found)}" if found else ""), file=sys.stderr)
    sys.exit(2)


def other_family(env_id: str) -> tuple[str, ...]:
    """The scripts that take env_id, an id of another family of envs (Atari, MinAtar, mpe2,
    smac_lite)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        return "ppo_atari.py", "dqn_atari.py"
    if env_id.startswith("MinAtar/"):
        return "dqn_atari.py", "ddqn_atari.py"
    if re.fullmatch(r"(simple\w*|collect_treasure)_v\d+", env_id):
        return "mappo_mpe.py", "maddpg_mpe.py"
    if (
        importlib.util.find_spec("smac_lite")
        and env_id in importlib.import_module("smac_lite.maps").MAPS
    ):
        return "mappo_smac_lite.py", "qmix_smac_lite.py"
    return ()


def env_spaces(env_id: str):
    """(observation space, action space) of env_id, or a one-line error. The env is made with the
    start-up messages of ALE (its banner) and MuJoCo (compiler warnings, which it also writes to
    MUJOCO_LOG.TXT) turned off through their own settings: nothing may precede an error."""
    if env_id not in gym.registry:
        scripts = other_family(env_id)
        if scripts:
            fail(f"{env_id} is not an env of {SCRIPT}", *scripts)
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        fail(f"unknown env id '{env_id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    entry_point = str(gym.spec(env_id).entry_point)
    if entry_point.startswith("ale_py"):
        import ale_py

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    mujoco = importlib.import_module("mujoco") if "mujoco" in entry_point else None
    if mujoco:
        mujoco.set_mju_user_warning(lambda message: None)
    try:
        with warnings.catch_warnings(action="ignore"), gym.make(env_id) as env:
            return env.observation_space, env.action_space
    except Exception as e:
        reason = (str(e).strip() or " ").splitlines()[0]
        fail(f"cannot make env '{env_id}': {type(e).__name__}: {reason}")
    finally:
        if mujoco:
            mujoco.set_mju_user_warning(None)  # MuJoCo's default: print and log


# The ranges a flag may be given, by the name its error message shows (plain code, no eval).
RANGES = {
    "x >= 0": lambda x: x >= 0,
    "x >= 1": lambda x: x >= 1,
    "x >= 2": lambda x: x >= 2,
    "x > 0": lambda x: x > 0,
    "0 <= x <= 1": lambda x: 0 <= x <= 1,
    "0 < x <= 1": lambda x: 0 < x <= 1,
    "0 < x < 1": lambda x: 0 < x < 1,
}


def check_ranges(args, rules: dict):
    """Fail on a flag that is not a finite number or lies outside its range: rules maps a flag to
    one of RANGES (e.g. "0 <= x <= 1")."""
    rules = {
        "total_timesteps": "x >= 1",
        "eval_episodes": "x >= 0",
        "eval_every": "x >= 0",
        "checkpoint_every": "x >= 1",
        **rules,
    }
    for name, x in asdict(args).items():
        if isinstance(x, float) and not np.isfinite(x):
            fail(f"--{name.replace('_', '-')} {x} is not a finite number")
    for name, rule in rules.items():
        x = getattr(args, name)
        if x is not None and not RANGES[rule](x):
            fail(f"--{name.replace('_', '-')} {x} is out of range: it must satisfy {rule}")


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def start_run(args, check_args):
    """Resume (--resume DIR), check the flags, choose the run directory (a new run never writes
    into one that holds files), seed everything. Returns (args, checkpoint, dir)."""
    ckpt = None
    if args.resume:
        args, ckpt = resume_run(args)
    check_args(args)
    if args.track:
        check_wandb()
    # SDL warns on every render without it
    if args.capture_video and not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="canonrl-xdg-")
    name = f"{args.env_id.replace('/', '-')}__{SCRIPT[:-3]}__{args.seed}__{time.time():.0f}"
    run_dir = Path(args.run_dir or f"runs/{name}")
    if run_dir.exists() and not run_dir.is_dir():
        fail(f"--run-dir {run_dir} is a file; pass a directory")
    if ckpt is None and run_dir.is_dir() and any(run_dir.iterdir()):
        if (run_dir / "metrics.csv").is_file():
            fail(
                f"--run-dir {run_dir} holds a run; continue it "
                f"with --resume {run_dir} or choose a new --run-dir"
            )
        fail(f"--run-dir {run_dir} is not empty and holds no run; choose a new --run-dir")
    check_writable(run_dir)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # 1: fastest for small nets
    torch.set_num_threads(1 if args.torch_deterministic else torch.get_num_threads())
    return args, ckpt, run_dir


def resume_run(args):
    """--resume DIR: the run's saved flags and its checkpoint, which is data: its SHA-256 must match
    checkpoint.sha256, and it is read with weights_only=True. A flag given now that differs from
    the saved one is ignored, except --total-timesteps, which extends the run."""
    path = Path(args.resume) / "checkpoint.pt"
    if not path.is_file():
        fail(f"no checkpoint at {path}; pass the run directory of an earlier {SCRIPT} run")
    try:
        if sha256(path) != (path.parent / "checkpoint.sha256").read_text().strip():
            raise ValueError("its SHA-256 differs from checkpoint.sha256")
        ckpt = torch.load(path, weights_only=True)
        saved = Args(**ckpt["args"])
    except Exception as e:
        fail(
            f"{path} is corrupt or not a {SCRIPT} checkpoint "
            f"({type(e).__name__}); delete it or start anew"
        )
    changed = []
    for name, value in asdict(args).items():
        if name in ("resume", "run_dir") or value == getattr(saved, name):
            continue
        if name in given_flags() or value != getattr(Args(), name):
            changed.append(name)
    if "total_timesteps" in changed:
        if args.total_timesteps < ckpt["global_step"]:
            fail(
                f"--total-timesteps {args.total_timesteps} is below "
                f"the {ckpt['global_step']} steps already done"
            )
        print(
            f"resume: --total-timesteps {args.total_timesteps} (was {saved.total_timesteps})",
            file=sys.stderr,
        )
        saved.total_timesteps = args.total_timesteps
    elif ckpt["finished"]:
        print(f"the run in {path.parent} is finished; give a larger --total-timesteps to extend it")
        sys.exit(0)
    ignored = [f"--{name.replace('_', '-')}" for name in changed if name != "total_timesteps"]
    if ignored:
        print(
            f"resume: the run's saved flags are kept; ignored: {' '.join(ignored)}",
            file=sys.stderr,
        )
    saved.resume = str(path.parent)
    saved.run_dir = str(path.parent)
    check_metrics(path.parent / "metrics.csv")
    return saved, ckpt


def given_flags() -> set[str]:
    """The Args fields named on the command line (--name, --name=value, --no-name): on --resume, a
    flag given there counts even when its value is the default."""
    names = set()
    for token in sys.argv[1:]:
        if token.startswith("--"):
            name = token[2:].split("=")[0].replace("-", "_")
            names.add(name)
            names.add(name.removeprefix("no_"))
    return names


def check_metrics(path: Path):
    """Fail on a line of metrics.csv that is not global_step,wall_time,name,value (before --resume
    rewrites it)."""
    lines = path.read_text().splitlines()[1:] if path.is_file() else []
    for number, line in enumerate(lines, start=2):
        fields = line.split(",")
        if len(fields) != 4 or not fields[0].isdigit():
            fail(
                f"{path} line {number} is not 'global_step,wall_time,name,value'; "
                "delete that line and resume again"
            )


def check_wandb():
    """--track needs a wandb login, or WANDB_MODE=offline: checked before anything is written."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    try:
        settings = wandb_setup.singleton().settings
    except Exception as e:
        fail(f"--track: wandb cannot start ({type(e).__name__}: {str(e).strip().splitlines()[0]})")
    if settings.mode in ("offline", "dryrun", "disabled"):
        return
    if not (
        os.getenv("WANDB_API_KEY")
        or wbauth.read_netrc_auth(host=settings.base_url)
        or settings.api_key
    ):
        fail(
            "--track needs a wandb login: run `wandb login`, "
            "or set WANDB_MODE=offline to log to files only"
        )


def check_writable(run_dir: Path):
    """Fail unless files can be written in run_dir; the folders made to find out are removed
    again."""
    made = [p for p in [run_dir, *run_dir.parents] if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as e:
        fail(
            f"--run-dir {run_dir} cannot be written "
            f"({e.strerror or type(e).__name__}); choose another --run-dir"
        )
    finally:
        for p in made:
            # only empty folders go; another process (a rank of the same job) may have removed
            # or filled one meanwhile
            try:
                p.rmdir()
            except OSError:
                pass


def finite(state) -> bool:
    """True when every floating-point tensor of a (nested) state_dict is finite."""
    if isinstance(state, dict):
        return all(finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(finite(v) for v in state)
    if torch.is_tensor(state) and state.is_floating_point():
        return bool(torch.isfinite(state).all())
    return True


def load_states(stateful: dict, ckpt: dict, run_dir: Path):
    """Resume every object of `stateful` ({name: object with load_state_dict}) from the
    checkpoint."""
    for name, obj in stateful.items():
        # a buffer may hold unwritten slots
        weights = isinstance(obj, (torch.nn.Module, torch.optim.Optimizer))
        if weights and not finite(ckpt.get(name)):
            fail(f"{run_dir / 'checkpoint.pt'} holds non-finite values in {name}; start anew")
        try:
            obj.load_state_dict(ckpt[name])
        except Exception as e:
            fail(
                f"{run_dir / 'checkpoint.pt'} does not fit this "
                f"run's {name} ({type(e).__name__}); start anew"
            )


def save_with_digest(state: dict, path: Path):
    """torch.save(state) to path, written then renamed (a crash never leaves half a file), and its
    SHA-256 beside it (checkpoint.pt: checkpoint.sha256, model.pt: model.sha256): a file is checked
    against it before it is read."""
    torch.save(state, path.with_suffix(".tmp"))
    digest = sha256(path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    path.with_suffix(".sha256").write_text(digest + "\n")


def save_model(state: dict, run_dir: Path):
    """model.pt: the weights and what evaluation needs (numpy arrays as tensors, so that
    torch.load(weights_only=True) reads it), with its SHA-256 in model.sha256."""
    save_with_digest(plain(state), run_dir / "model.pt")


def plain(obj):
    """obj with numpy arrays as tensors and numpy scalars as numbers: what
    torch.load(weights_only=True) reads."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def by_name(results) -> dict:
    """Evaluation results as {metric name: one value per episode}; a list of returns is
    eval/episodic_return."""
    return results if isinstance(results, dict) else {"eval/episodic_return": results}


class RNGs:
    """torch's global generator and the given numpy Generators, checkpointed as one object."""

    def __init__(self, *np_rngs: np.random.Generator):
        self.np_rngs = np_rngs

    def state_dict(self):
        return {
            "torch": torch.get_rng_state(),
            "numpy": [rng.bit_generator.state for rng in self.np_rngs],
        }

    def load_state_dict(self, state):
        torch.set_rng_state(state["torch"])
        for rng, rng_state in zip(self.np_rngs, state["numpy"], strict=True):
            rng.bit_generator.state = rng_state


def write_config(args, run_dir: Path):
    """config.json: every flag, the script, the git commit of algos/ (if any), package versions."""
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ALGOS)
    config = {
        "script": SCRIPT,
        "args": asdict(args),
        "git_commit": git.stdout.strip() or None,
        "versions": {p: version(p) for p in ("torch", "gymnasium", "numpy")},
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))


class RunLogger:
    """What a run shows and leaves behind: config.json, metrics.csv (global_step, wall_time, name,
    value; append-only), TensorBoard events, a wandb run with --track, the progress bar,
    checkpoint.pt. Resuming drops the rows logged after the checkpoint (those steps are redone): no
    step is logged twice. The training clock stops during evaluations. Ctrl-C sets stop_requested:
    the script finishes its iteration, saves it and calls exit_interrupted()."""

    def __init__(self, args, run_dir: Path, total: int, step: int, ckpt: dict | None):
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / "metrics.csv"
        header = "global_step,wall_time,name,value\n"
        if ckpt is not None:  # keep the rows up to the checkpoint's step
            lines = metrics.read_text().splitlines(keepends=True)[1:] if metrics.is_file() else []
            kept = [line for line in lines if int(line.split(",")[0]) <= step]
            (run_dir / "metrics.tmp").write_text(header + "".join(kept))
            os.replace(run_dir / "metrics.tmp", metrics)
        else:
            write_config(args, run_dir)
            metrics.write_text(header)
        if total != args.total_timesteps:
            print(
                f"{total:,} steps will run: whole iterations up "
                f"to --total-timesteps {args.total_timesteps:,}"
            )
        self.args = args
        self.run_dir = run_dir
        self.wandb = None
        if args.track:  # every row of metrics.csv is one wandb row, plotted against global_step
            import wandb

            self.wandb = wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                config=asdict(args),
                name=run_dir.name,
                dir=str(run_dir),
                id=run_dir.name,
                resume="allow",
            )
            self.wandb.define_metric("global_step")
            self.wandb.define_metric("*", step_metric="global_step")
        self.file = open(metrics, "a", newline="")
        self.csv = csv.writer(self.file, lineterminator="\n")
        self.tb = SummaryWriter(str(run_dir))
        self.bar = tqdm(total=total, initial=step, unit="step", mininterval=1.0)
        self.first_step = step
        self.start = time.time()
        self.eval_seconds = 0.0
        self.last_return = float("nan")
        # of the run resumed
        self.seconds_before = ckpt.get("train_seconds", 0.0) if ckpt is not None else 0.0
        self.stop_requested = False
        self.duration_said = False
        signal.signal(signal.SIGINT, self.request_stop)

    def request_stop(self, *_):
        self.stop_requested = True
        # a second Ctrl-C stops at once, unsaved
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(
            "\nCtrl-C: stopping after this iteration (again: at once, without saving it)",
            file=sys.stderr,
        )

    def log(self, step: int, metrics: dict, to_wandb: bool = True):
        """One row per metric in metrics.csv and TensorBoard; one wandb row for them all. A
        non-finite loss stops the run (the weights have diverged) before it is written; the last
        checkpoint is kept."""
        values = {}
        for name, value in metrics.items():
            # a loss may require grad
            values[name] = float(value.detach() if torch.is_tensor(value) else value)
            if (
                name.startswith("losses/")
                and name != "losses/explained_variance"
                and not np.isfinite(values[name])
            ):
                self.close_files()
                fail(
                    f"{name} is {values[name]} at step {step}: training diverged; "
                    f"{self.run_dir} keeps its last checkpoint (try a lower --learning-rate)"
                )
        for name, value in values.items():
            self.csv.writerow([step, f"{time.time():.3f}", name, repr(value)])
            self.tb.add_scalar(name, value, step)
        self.file.flush()
        if self.wandb is not None and to_wandb:
            self.wandb.log({"global_step": step, **values})

    def train_seconds(self) -> float:
        """Seconds of training (evaluations excluded), those of the run resumed included."""
        return self.seconds_before + time.time() - self.start - self.eval_seconds

    def progress(self, step: int):
        """Log charts/sps (environment steps per training second) and update the progress bar."""
        seconds = time.time() - self.start - self.eval_seconds  # training, in this process
        sps = int((step - self.first_step) / max(seconds, 1e-9))
        self.log(step, {"charts/sps": sps})
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(sps=sps, ret=f"{self.last_return:.1f}", refresh=False)
        if not self.duration_said and seconds > 20:
            self.duration_said = True
            hours = (self.bar.total - step) / max(sps, 1) / 3600
            if hours > 1:
                self.bar.write(
                    f"at {sps:,} steps/s the rest of this run takes about "
                    f"{hours:.1f} hours here; --total-timesteps sets the budget"
                )

    def evaluate(self, step: int, run_episodes):
        """Log charts/train_seconds, then one row per episode of run_episodes(): a list of episodic
        returns (logged as eval/episodic_return) or a dict {metric name: one value per episode}
        (multi-agent: team return, win)."""
        self.log(step, {"charts/train_seconds": self.train_seconds()})
        start = time.time()
        results = run_episodes()
        self.eval_seconds += time.time() - start
        returns = by_name(results).get("eval/episodic_return", [])
        if len(returns):  # the progress bar's ret= (all the offline scripts show)
            self.last_return = float(np.mean(returns))
        for name, values in by_name(results).items():
            for value in values:
                self.log(step, {name: value}, to_wandb=False)
            # wandb keeps one value per step: the mean, and a histogram
            if self.wandb is not None and len(values):
                import wandb

                self.wandb.log(
                    {
                        "global_step": step,
                        name: float(np.mean(values)),
                        f"{name}_histogram": wandb.Histogram(np.asarray(values, dtype=np.float64)),
                    }
                )
        return results

    def save_checkpoint(
        self, stateful: dict, iteration: int, global_step: int, finished: bool = False
    ):
        """checkpoint.pt: the flags, the counters and the state_dict() of every object of
        `stateful`, written then renamed (a crash never leaves half a checkpoint), and its SHA-256
        in checkpoint.sha256."""
        state = {
            "args": asdict(self.args),
            "iteration": iteration,
            "global_step": global_step,
            "finished": finished,
            "train_seconds": self.train_seconds(),
            **{name: obj.state_dict() for name, obj in stateful.items()},
        }
        save_with_digest(plain(state), self.run_dir / "checkpoint.pt")

    def close_files(self):
        self.bar.close()
        self.file.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

    def exit_interrupted(self):
        self.close_files()
        print(f"interrupted: metrics kept, resume with --resume {self.run_dir}", file=sys.stderr)
        sys.exit(130)

    def close(self, results):
        """Close the files; the last lines say the evaluation, where the run is and how it compares
        with the script's reference."""
        self.bar.update(self.bar.total - self.bar.n)
        self.close_files()
        for name, values in by_name(results).items():
            if len(values):
                mean = np.mean(values)
                std = np.std(values)
                print(f"{name}: {mean:.2f} +- {std:.2f} over {len(values)} episodes")
        saved = "model.pt, checkpoint.pt" if self.args.save_model else "checkpoint.pt"
        print(f"run saved in {self.run_dir} ({saved})")
        self.compare_with_reference(by_name(results))

    def compare_with_reference(self, results: dict):
        """Print our multi-seed reference of this script and env (of the budget nearest this run's),
        when benchmark/references.toml is beside algos/, and where this run's evaluation lies."""
        path = ALGOS.parent / "benchmark" / "references.toml"
        refs = tomllib.loads(path.read_text())["reference"] if path.is_file() else []
        refs = [r for r in refs if "values" in r and self.same_setting(r)]
        refs = [r for r in refs if r["score"] in ("final_eval", "final_win_rate")]
        if not refs:
            print(f"no reference for {SCRIPT} on {self.args.env_id} to compare with")
            return
        budget = self.args.total_timesteps
        r = min(refs, key=lambda r: abs(r["total_timesteps"] - budget))
        values = r["values"]
        print(
            f"reference {r['id']} ({r['total_timesteps']:,} steps, {r['score']}, "
            f"{len(values)} seeds): {np.mean(values):.2f} +- {np.std(values):.2f}, "
            f"seeds from {min(values):.2f} to {max(values):.2f}"
        )
        wanted = "win" if r["score"] == "final_win_rate" else "episodic_return"
        name = next((n for n in results if wanted in n), None)
        if name is None or not len(results[name]):
            return
        mean = float(np.mean(results[name]))
        if r["total_timesteps"] != budget:
            print(f"this run: {mean:.2f} after {budget:,} steps: another budget, not compared")
        elif min(values) <= mean <= max(values):
            print(f"this run: {mean:.2f}, within the reference's seeds")
        else:
            side = "below" if mean < min(values) else "above"
            print(f"this run: {mean:.2f}, {side} every seed of the reference")

    def same_setting(self, reference: dict) -> bool:
        """True for a reference of this script and env (and, for an offline script, of this
        dataset)."""
        if (reference["script"], reference["env_id"]) != (SCRIPT, self.args.env_id):
            return False
        flags = reference.get("flags", [])
        if not hasattr(self.args, "dataset") or "--dataset" not in flags:
            return True
        ours = Path(self.args.dataset)  # a directory, or an id such as canonrl/cartpole/medium-v0
        theirs = Path(flags[flags.index("--dataset") + 1]).name  # runs/datasets/cartpole-medium-v0
        return theirs in (ours.name, "-".join(ours.parts[-2:]))


# ---- end shared: helpers ----


if __name__ == "__main__":
    main(tyro.cli(Args))
