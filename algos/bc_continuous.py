"""Behaviour cloning on an offline dataset (a Minari dataset of Pendulum-v1 by default).

The baseline of offline RL: a deterministic policy regresses the dataset's actions, min E (pi(s) -
a)^2, on states normalised by the dataset's mean and std: TD3+BC without its Q term (Fujimoto & Gu
2021), CORL's any-percent BC with every episode kept (Chen et al. 2021's "10% BC" keeps the best).
CORL's settings: 256x256 ReLU, Adam 3e-4, batch 256. --total-timesteps counts gradient steps.

Run:    python benchmark/datasets.py --kind medium --policy <SAC model.pt> --expert <...>
        python algos/bc_continuous.py --dataset canonrl/pendulum/medium-v0
Quick:  python algos/bc_continuous.py --dataset canonrl/pendulum/medium-v0 --total-timesteps 2000
Results: benchmark/references.toml
"""

import csv
import difflib
import functools
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
import minari
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    dataset: str = "canonrl/pendulum/medium-v0"
    """Minari dataset: a directory, or an id in MINARI_DATASETS_PATH"""
    normalize_obs: bool = True
    """states normalised by the dataset's mean and std"""
    learning_rate: float = 3e-4
    """Adam learning rate of the actor"""
    batch_size: int = 256
    """minibatch size"""
    env_id: str | None = None
    """the env the policy is evaluated in (default: the dataset's)"""
    total_timesteps: int = 1_000_000
    """gradient steps (an offline run takes no environment step to learn)"""
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


# ---- shared: offline_continuous/make_env ----
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


# ---- end shared: offline_continuous/make_env ----


class Actor(nn.Module):
    """normalised obs -> 256 -> 256 -> tanh, scaled to the env's action bounds: a deterministic
    policy. The bounds and the dataset's observation mean and std are buffers: saved with the
    weights, so a saved actor needs no dataset."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        action_low=-1.0,
        action_high=1.0,
        obs_mean=0.0,
        obs_std=1.0,
    ):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, action_dim),
            nn.Tanh(),
        )
        low = torch.tensor(action_low, dtype=torch.float32).expand(action_dim).clone()
        high = torch.tensor(action_high, dtype=torch.float32).expand(action_dim).clone()
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        mean = torch.tensor(obs_mean, dtype=torch.float32).expand(obs_dim).clone()
        std = torch.tensor(obs_std, dtype=torch.float32).expand(obs_dim).clone()
        self.register_buffer("obs_mean", mean)
        self.register_buffer("obs_std", std)

    def forward(self, obs):  # obs normalised, as the minibatches hold them
        return self.network(obs) * self.action_scale + self.action_bias

    def get_greedy_action(self, obs):
        """mu(obs) of the env's raw observation, normalised here: the policy evaluate() runs."""
        return self((obs - self.obs_mean) / self.obs_std)


# ---- shared: offline/dataset ----
@functools.cache  # opened once: the flag checks and main() share it
def open_dataset(name: str):
    """The Minari dataset `name`: a directory (the dataset's, or its data/ folder), or the id of one
    under MINARI_DATASETS_PATH (default ~/.minari/datasets). Nothing is downloaded; a missing one is
    a one-line error."""
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    path = Path(name).expanduser()
    data = next(
        (d for d in (path / "data", path, root / name / "data") if (d / "metadata.json").is_file()),
        None,
    )
    if data is None:
        fail(
            f"no dataset {name!r}: give a Minari dataset directory or the id "
            f"of one in {root} (make one with python benchmark/datasets.py)"
        )
    try:
        dataset = minari.MinariDataset(data)
        # the data file opens, too
        next(dataset.iterate_episodes([0]), None) if dataset.total_episodes else None
        return dataset
    except Exception as e:
        fail(
            f"dataset {name!r} cannot be read ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); make it anew"
        )


def dataset_arrays(dataset) -> dict:
    """Every transition of every episode: obs, next_obs, actions, rewards, terminated, as float32
    arrays (discrete actions as int64). Only termination stops a bootstrap: an episode cut by a time
    limit has a future. A data file that cannot be read to its end, or that holds numbers that are
    not finite, is a one-line error that names it."""
    parts = {"obs": [], "next_obs": [], "actions": [], "rewards": [], "terminated": []}
    data_dir = dataset.storage.data_path
    # HDF5, or Arrow
    where = data_dir / "main_data.hdf5" if (data_dir / "main_data.hdf5").is_file() else data_dir
    # open_dataset read episode 0 only: damaged bytes further on show here (h5py's KeyError,
    # OSError, ...)
    try:
        for episode in dataset.iterate_episodes():
            parts["obs"].append(episode.observations[:-1])
            parts["next_obs"].append(episode.observations[1:])
            parts["actions"].append(episode.actions)
            parts["rewards"].append(episode.rewards)
            parts["terminated"].append(episode.terminations)
    except (KeyError, OSError, RuntimeError, ValueError) as e:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        fail(f"dataset file {where} is damaged ({reason}); make it anew")
    arrays = {k: np.concatenate(v).astype(np.float32) for k, v in parts.items()}
    # a nan or inf would reach every loss
    if not all(np.isfinite(v).all() for v in arrays.values()):
        fail(f"dataset file {where} holds numbers that are not finite (nan or inf); make it anew")
    if isinstance(dataset.action_space, gym.spaces.Discrete):
        arrays["actions"] = np.concatenate(parts["actions"]).astype(np.int64)
    return arrays


def normalize_observations(data: dict, on: bool):
    """Standardise the dataset's observations and next observations in place with their mean and
    std (+ 1e-3, CORL's epsilon); returns (mean, std), which the policy keeps to standardise what
    it sees. Off (on False), and for a MinAtar grid of 0/1 cells (a cell never set in the data,
    divided by 1e-3, would blow up): mean 0 and std 1."""
    shape = data["obs"].shape[1:]
    mean = data["obs"].mean(0)
    std = data["obs"].std(0) + 1e-3
    if not on or len(shape) == 3:
        mean = np.zeros(shape, np.float32)
        std = np.ones(shape, np.float32)
    data["obs"] = (data["obs"] - mean) / std
    data["next_obs"] = (data["next_obs"] - mean) / std
    return mean, std


def offline_eval(policy, args, dataset, device, video_dir=None) -> dict:
    """Evaluation episodes of the policy (seeded apart from training) and, where the dataset has
    reference returns, their normalised scores."""
    seed = args.seed + 100_000
    returns = evaluate(policy, args.env_id, args.eval_episodes, seed, device, video_dir)
    scores = normalized_scores(returns, dataset)
    return {
        "eval/episodic_return": returns,
        **({"eval/normalized_score": scores} if scores else {}),
    }


def normalized_scores(returns, dataset) -> list:
    """D4RL's normalised score of each return, 100 * (R - random) / (expert - random), with the
    dataset's reference returns (ref_min_score, ref_max_score); [] for a dataset without them."""
    low = dataset.storage.metadata.get("ref_min_score")
    high = dataset.storage.metadata.get("ref_max_score")
    return [] if low is None or high is None else [100 * (r - low) / (high - low) for r in returns]


class OfflineBuffer:
    """The dataset's transitions as tensors on the device; uniform minibatches drawn with a numpy
    Generator (which a checkpoint holds, so that a resumed run draws what the whole run would
    have)."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(self, arrays: dict, device, rng: np.random.Generator):
        for name in self.FIELDS:
            setattr(self, name, torch.as_tensor(arrays[name], device=device))
        self.size = len(arrays["rewards"])
        self.rng = rng

    def sample(self, batch_size: int):
        idx = torch.as_tensor(self.rng.integers(0, self.size, batch_size), device=self.obs.device)
        return [getattr(self, name)[idx] for name in self.FIELDS]


# ---- end shared: offline/dataset ----


# ---- shared: offline_continuous/evaluate ----
@torch.no_grad()
def evaluate(actor, env_id, episodes, seed, device="cpu", video_dir=None):
    """Deterministic episodes (actor.get_greedy_action, no noise) on a fresh env; returns the
    episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action = actor.get_greedy_action(
                torch.as_tensor(obs, dtype=torch.float32, device=device)[None]
            )
            obs, reward, terminated, truncated, _ = env.step(action[0].cpu().numpy())
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


# ---- end shared: offline_continuous/evaluate ----


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    dataset = open_dataset(args.dataset)
    data = dataset_arrays(dataset)
    obs_mean, obs_std = normalize_observations(data, args.normalize_obs)
    obs_dim = data["obs"].shape[1]
    action_dim = data["actions"].shape[1]
    low = dataset.action_space.low
    high = dataset.action_space.high
    actor = Actor(obs_dim, action_dim, low, high, obs_mean, obs_std).to(device)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    rng = np.random.default_rng(args.seed)  # minibatch sampling
    buffer = OfflineBuffer(data, device, rng)
    stateful = {
        "actor": actor,
        "actor_optimizer": actor_optimizer,
        "rng": RNGs(rng),
    }  # what a checkpoint holds (not the dataset)

    def run_eval(video_dir=None):
        return offline_eval(actor, args, dataset, device, video_dir)

    global_step = 0
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)
        global_step = ckpt["global_step"]
    logger = RunLogger(args, run_dir, args.total_timesteps, global_step, ckpt=ckpt)
    # global_step: gradient steps taken
    for global_step in range(global_step + 1, args.total_timesteps + 1):
        b_obs, _, b_actions, _, _ = buffer.sample(args.batch_size)
        actor_loss = F.mse_loss(actor(b_obs), b_actions)  # behaviour cloning
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        if global_step % 100 == 0:  # the only host syncs of the loss
            logger.log(global_step, {"losses/actor_loss": actor_loss})
            logger.progress(global_step)
        # ---- shared: offline/loop_end ----
        if (
            args.eval_every
            and global_step % args.eval_every == 0
            and global_step < args.total_timesteps
        ):
            logger.evaluate(global_step, run_eval)
        if global_step % args.checkpoint_every == 0 or logger.stop_requested:
            logger.save_checkpoint(stateful, global_step, global_step)
        if logger.stop_requested:  # Ctrl-C: the gradient step it came in is finished and saved
            logger.exit_interrupted()
        # ---- end shared: offline/loop_end ----
    # ---- shared: offline_continuous/finish ----
    video_dir = run_dir / "videos" if args.capture_video else None
    results = logger.evaluate(args.total_timesteps, lambda: run_eval(video_dir))
    logger.save_checkpoint(stateful, args.total_timesteps, args.total_timesteps, finished=True)
    if args.save_model:
        save_model(
            {
                "actor": actor.state_dict(),
                "args": asdict(args),
                "eval_returns": results["eval/episodic_return"],
                "obs_dim": obs_dim,
                "action_dim": actor.action_scale.shape[0],
            },
            run_dir,
        )
    logger.close(results)
    # ---- end shared: offline_continuous/finish ----


def check_args(args: Args):
    check_offline_continuous_args(args, {"learning_rate": "x > 0"})


# ---- shared: offline_continuous/check_args ----
def check_offline_continuous_args(args, rules: dict):
    """The ranges of `rules` (as in check_ranges), the env the policy is evaluated in when given,
    the dataset (it exists and holds transitions of continuous actions; only its metadata and first
    episode are read), then the dataset's env when none is given, and that the two have the same
    spaces."""
    check_ranges(args, {"batch_size": "x >= 1", **rules})
    spaces = check_env(args) if args.env_id is not None else None
    dataset = open_dataset(args.dataset)
    if dataset.total_steps == 0:
        fail(f"dataset {args.dataset!r} is empty: it holds no transition")
    if not isinstance(dataset.action_space, gym.spaces.Box):
        fail(
            f"{SCRIPT} needs continuous (Box) actions but "
            f"dataset {args.dataset!r} has {dataset.action_space}",
            "cql_discrete.py",
        )
    if args.env_id is None:
        if dataset.spec.env_spec is None:
            fail(
                f"dataset {args.dataset!r} names no env: give "
                "--env-id, the env to evaluate the policy in"
            )
        args.env_id = dataset.spec.env_spec.id
        spaces = check_env(args)
    if spaces != (dataset.observation_space, dataset.action_space):
        fail(
            f"--env-id {args.env_id} has spaces {spaces}, dataset "
            f"{args.dataset!r} {(dataset.observation_space, dataset.action_space)}: "
            "evaluate in the dataset's env"
        )


def check_env(args):
    """The spaces of --env-id (made once), which must be continuous bounded actions and flat
    observations."""
    obs_space, act_space = env_spaces(args.env_id)
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
        fail(
            f"{SCRIPT} needs continuous (Box) actions but {args.env_id} has {act_space}",
            "cql_discrete.py",
        )
    if not (np.isfinite(act_space.low).all() and np.isfinite(act_space.high).all()):
        fail(
            f"{SCRIPT} squashes actions into the env's bounds "
            f"but {args.env_id} has unbounded actions {act_space}"
        )
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"{SCRIPT} needs flat vector observations but {args.env_id} has {obs_space}")
    return obs_space, act_space


# ---- end shared: offline_continuous/check_args ----


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
