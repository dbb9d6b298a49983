"""The run contract of every script in algos/, written once: the shared flags (RunArgs, the base of
each script's Args), the run directory (start_run), logging, progress, evaluation and checkpoints
(RunLogger), resume, the one-line errors for bad input (fail, check_ranges, env_spaces) and the
comparison with the recorded references at the end of a run.

A script's main() uses it in five places:

    args, ckpt, run_dir = start_run(args, check_args, __file__)  # flags checked first
    load_states(stateful, ckpt, run_dir)  # --resume: what the checkpoint holds
    logger = RunLogger(args, run_dir, total_steps, global_step, ckpt=ckpt, script=__file__)
    logger.end_iteration(stateful, iteration, global_step, run_eval)  # eval, checkpoint, Ctrl-C
    logger.finish(stateful, iteration, global_step, run_eval, model={...})  # the end of the run

A script passes its own path (__file__) where its identity matters (the run name, config.json, its
references): nothing here holds the state of one script, so two scripts may share a process.

What a run leaves in its directory: config.json (every flag, the script, the git commit, package
versions), metrics.csv (global_step, wall_time, name, value; append-only), TensorBoard events, a
wandb run with --track, checkpoint.pt (with checkpoint.sha256) and model.pt with --save-model.
"""

import contextlib
import csv
import difflib
import hashlib
import importlib.util
import io
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

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class SharedArgs:
    """The flags every script has (the bases below add those of a script with envs or of the
    language-model family); a script's Args adds its algorithm's hyperparameters."""

    seed: int = 1
    """seed of torch, numpy and random"""
    cuda: bool = False
    """run on CUDA when available (the CNN scripts gain from it; small MLPs are fastest on a CPU)"""
    torch_deterministic: bool = True
    """torch.use_deterministic_algorithms, cuDNN's deterministic mode and one CPU thread"""
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "canonrl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb entity (team)"""
    save_model: bool = False
    """save <run_dir>/model.pt at the end"""
    eval_every: int = 0
    """also evaluate every this many steps (0: only at the end); logs charts/train_seconds too"""
    run_dir: str | None = None
    """where the run is written (default runs/<env>__<script>__<seed>__<time>); must be new"""
    resume: str | None = None
    """continue the run in this directory (its flags; --total-timesteps may extend it)"""
    checkpoint_every: int = 50_000
    """save <run_dir>/checkpoint.pt every this many steps (and at the end and on Ctrl-C)"""
    stop_at: int | None = None
    """end the run after the iteration that reaches this step, saved as on Ctrl-C (exit status 0;
    --resume goes on): the schedules still follow --total-timesteps, so the steps it ran are the
    first steps of the whole run"""


@dataclass
class RunArgs(SharedArgs):
    """The shared flags of a script with environments."""

    seed: int = 1
    """seed of torch, numpy, random and the envs"""
    capture_video: bool = False
    """record episode 0 of the final evaluation to <run_dir>/videos"""
    eval_episodes: int = 10
    """evaluation episodes (the policy evaluate() runs) at the end and each --eval-every"""


@dataclass
class TrialRunArgs(SharedArgs):
    """The shared flags of a meta-RL script: its env is a distribution of tasks and each of its
    episodes is a trial (a few episodes of one task, drawn afresh), evaluated on new tasks (no
    video)."""

    seed: int = 1
    """seed of torch, numpy, random and the tasks"""
    eval_episodes: int = 1000
    """evaluation trials, each on a new task (the policy evaluate() runs), at the end and each
    --eval-every"""


@dataclass
class LMRunArgs(SharedArgs):
    """The shared flags of a language-model script: its env is a task of prompts, evaluated on the
    task's held-out prompts (no episodes, no video)."""

    seed: int = 1
    """seed of torch, numpy and random: the order of the prompts and the samples"""
    save_model: bool = False
    """save <run_dir>/model.pt and <run_dir>/model (a folder from_pretrained loads) at the end"""


# the scripts of this checkout, which an error may suggest instead
ALGOS = Path(__file__).resolve().parents[1] / "algos"


def correct(results: dict) -> list[float]:
    """A language-model evaluation's accuracy per held-out prompt: 1.0 where its first reward (the
    task's correctness; eval/reward_<name>, where the task names several, else the reward itself)
    is 1."""
    first = next((v for n, v in results.items() if n.startswith("eval/reward_")), None)
    rewards = results.get("eval/episodic_return", []) if first is None else first
    return [float(r == 1.0) for r in rewards]


def fail(msg: str, *scripts: str):
    """Bad input: one line on stderr, exit status 2. It suggests those of `scripts` (names of
    algos/ scripts) that this checkout has."""
    found = [s for s in scripts if (ALGOS / s).is_file()]
    print(f"error: {msg}" + (f"; use {' or '.join(found)}" if found else ""), file=sys.stderr)
    sys.exit(2)


def first_line(e: BaseException) -> str:
    """An exception as one line for an error message: its type and the first line of its text,
    without terminal escape codes (torch's unpickling errors carry bold type)."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(e)).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


SMAC_MAP = r"(\d+[a-z]+)+(_vs_(\d+[a-z]+)+)?|MMM2?|so_many_baneling|bane_vs_bane|corridor"


def other_family(env_id: str) -> tuple[str, ...]:
    """The scripts that take env_id, an id of another family of envs (Atari, MinAtar, mpe2,
    smac_lite)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        return "ppo_atari.py", "dqn_atari.py"
    if env_id.startswith("MinAtar/"):
        return "dqn_atari.py", "ddqn_atari.py"
    # the memory envs (canonrl.envs): velocities hidden, or a card to remember
    if re.fullmatch(r"PendulumNoVel-v\d+", env_id):
        return "ppo_lstm.py", "ppo_continuous.py"
    if re.fullmatch(r"\w+NoVel-v\d+|RepeatFirst-v\d+", env_id):
        return "ppo_lstm.py", "ppo.py"
    if re.fullmatch(r"BernoulliBandit-k\d+-v\d+|RandomMDP-v\d+", env_id):  # meta-RL's tasks
        return ("rl2.py",)
    if env_id.startswith(("MiniGrid-", "BabyAI-")):  # sparse rewards: exploration
        return ("ppo_rnd.py",)
    if re.fullmatch(r"(simple\w*|collect_treasure)_v\d+", env_id):
        return "mappo_mpe.py", "maddpg_mpe.py"
    # the names of SMAC's maps (3m, 2s3z, 5m_vs_6m, MMM2, ...): a pattern, so that a script of
    # another family need not import smac_lite to word its error
    if re.fullmatch(SMAC_MAP, env_id):
        return "mappo_smac_lite.py", "qmix_smac_lite.py"
    return ()


def env_spaces(env_id: str, script: str):
    """(observation space, action space) of env_id, or a one-line error naming the script (its
    path, __file__) and the scripts that take such an id. The env is made with the
    start-up messages of ALE (its banner) and MuJoCo (compiler warnings, which it also writes to
    MUJOCO_LOG.TXT) turned off through their own settings: nothing may precede an error."""
    import gymnasium as gym  # here: the language-model scripts never import it

    if env_id not in gym.registry:
        name = Path(script).name
        scripts = [s for s in other_family(env_id) if s != name]
        close = difflib.get_close_matches(env_id, list(gym.registry), n=1)
        # a typo of an id of a family this script has registered (MinAtar/Breakot-v1) is a typo
        typo = close and other_family(close[0]) == other_family(env_id)
        if scripts and not typo:
            fail(f"{env_id} is not an env of {name}", *scripts)
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
        fail(f"cannot make env '{env_id}': {first_line(e)}")
    finally:
        if mujoco:
            mujoco.set_mju_user_warning(None)  # MuJoCo's default: print and log


def check_continuous_env(env_id: str, script: str, *discrete_scripts: str):
    """(observation space, action space) of env_id, which must have bounded continuous (Box)
    actions (the policy squashes its actions into them) and flat vector observations, or a one-line
    error; discrete_scripts: those it suggests for discrete actions."""
    import gymnasium as gym

    obs_space, act_space = env_spaces(env_id, script)
    name = Path(script).name
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
        fail(
            f"{name} needs continuous (Box) actions but {env_id} has {act_space}", *discrete_scripts
        )
    if not (np.isfinite(act_space.low).all() and np.isfinite(act_space.high).all()):
        fail(
            f"{name} squashes actions into the env's bounds "
            f"but {env_id} has unbounded actions {act_space}"
        )
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"{name} needs flat vector observations but {env_id} has {obs_space}")
    return obs_space, act_space


def check_map(env_id: str, *single_agent_scripts: str):
    """A smac_lite map, or one error line that names the scripts that take env_id
    (single_agent_scripts: those suggested for a Gymnasium id)."""
    import gymnasium as gym

    import smac_lite

    if env_id in smac_lite.MAPS:
        return
    # a name that looks like a map's is a typo of one (below), not another family's
    scripts = [s for s in other_family(env_id) if not s.endswith("_smac_lite.py")]
    if not scripts and env_id in gym.registry:
        scripts = single_agent_scripts
    if scripts:
        fail(f"{env_id} is not a smac_lite map (the maps: {', '.join(smac_lite.MAPS)})", *scripts)
    close = difflib.get_close_matches(env_id, list(smac_lite.MAPS), n=1)
    fail(
        f"unknown smac_lite map '{env_id}'"
        + (f"; did you mean '{close[0]}'?" if close else "")
        + f"; the maps: {', '.join(smac_lite.MAPS)}"
    )


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


# The range of a hyperparameter that means the same in every script that has it: check_ranges
# checks each one wherever the flag exists; a script's own rules add to these.
RULES = {
    "total_timesteps": "x >= 1",
    "eval_every": "x >= 0",
    "checkpoint_every": "x >= 1",
    "eval_episodes": "x >= 0",
    "num_envs": "x >= 1",
    "num_steps": "x >= 1",
    "batch_size": "x >= 1",
    "buffer_size": "x >= 1",
    "learning_starts": "x >= 0",
    "train_frequency": "x >= 1",
    "gradient_steps": "x >= 1",
    "target_network_frequency": "x >= 1",
    "update_epochs": "x >= 1",
    "num_minibatches": "x >= 1",
    "hidden_dim": "x >= 1",
    "learning_rate": "x > 0",
    "adam_eps": "x > 0",
    "max_grad_norm": "x > 0",
    "gamma": "0 <= x <= 1",
    "gae_lambda": "0 <= x <= 1",
    "tau": "0 < x <= 1",
    "clip_coef": "x > 0",
    "target_kl": "x > 0",
    "ent_coef": "x >= 0",
    "vf_coef": "x >= 0",
    "start_e": "0 <= x <= 1",
    "end_e": "0 <= x <= 1",
    "exploration_fraction": "0 < x <= 1",
    "eval_epsilon": "0 <= x <= 1",
    "exploration_steps": "x >= 1",
    "stop_at": "x >= 1",
    "n_atoms": "x >= 2",
    "n_quantiles": "x >= 1",
    "num_prompts": "x >= 1",
    "max_new_tokens": "x >= 1",
    "eval_prompts": "x >= 0",
    "temperature": "x > 0",
}


def check_ranges(args, rules: dict | None = None):
    """Fail on a flag that is not a finite number or lies outside its range: RULES for the flags
    every script means the same by, then `rules` ({flag: one of RANGES, e.g. "0 <= x <= 1"}) for
    the script's own."""
    rules = {**{k: v for k, v in RULES.items() if hasattr(args, k)}, **(rules or {})}
    for name, x in asdict(args).items():
        if isinstance(x, float) and not np.isfinite(x):
            fail(f"--{name.replace('_', '-')} {x} is not a finite number")
    for name, rule in rules.items():
        x = getattr(args, name)
        if x is not None and not RANGES[rule](x):
            fail(f"--{name.replace('_', '-')} {x} is out of range: it must satisfy {rule}")


def check_replay_flags(args):
    """The flags of a replay buffer that must agree: epsilon annealed down (when it has one), the
    first minibatch drawn from what is stored when learning starts, learning starting within the
    budget."""
    if hasattr(args, "end_e") and args.end_e > args.start_e:
        fail(f"--end-e {args.end_e} is above --start-e {args.start_e}: epsilon is annealed down")
    if args.batch_size > min(args.buffer_size, max(args.learning_starts, 1)):
        fail(
            f"--batch-size {args.batch_size} must not exceed --learning-starts "
            f"({args.learning_starts}) or --buffer-size ({args.buffer_size}): "
            "the first minibatch is drawn when learning starts"
        )
    if args.total_timesteps <= args.learning_starts:
        fail(
            f"--total-timesteps {args.total_timesteps} must "
            f"exceed --learning-starts {args.learning_starts}"
        )


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def start_run(args, check_args, script: str):
    """Resume (--resume DIR), check the flags, choose the run directory (a new run never writes
    into one that holds files), seed everything. `script` is the script's path (__file__). Returns
    (args, checkpoint, dir)."""
    ckpt = None
    if args.resume:
        args, ckpt = resume_run(args, Path(script).name)
    check_args(args)
    if args.stop_at is not None and args.stop_at >= args.total_timesteps:
        fail(
            f"--stop-at {args.stop_at} must be below --total-timesteps {args.total_timesteps} "
            "(the run ends there anyway)"
        )
    if ckpt is not None and args.stop_at is not None and args.stop_at <= ckpt["global_step"]:
        fail(
            f"--stop-at {args.stop_at} is not beyond the {ckpt['global_step']} steps already "
            "done; give a later step or none"
        )
    if args.track:
        check_wandb()
    # SDL warns on every render without it
    if getattr(args, "capture_video", False) and not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="canonrl-xdg-")
    name = f"{args.env_id.replace('/', '-')}__{Path(script).stem}__{args.seed}__{time.time():.0f}"
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
    torch.backends.cudnn.benchmark = not args.torch_deterministic
    if args.torch_deterministic:  # cuBLAS needs its workspace fixed (read when CUDA starts)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # an op without a deterministic kernel warns rather than stops the run
        torch.use_deterministic_algorithms(True, warn_only=True)
    # 1: fastest for small nets
    torch.set_num_threads(1 if args.torch_deterministic else torch.get_num_threads())
    return args, ckpt, run_dir


def resume_run(args, script: str):
    """--resume DIR: the run's saved flags and its checkpoint, which is data: its SHA-256 must match
    checkpoint.sha256, and it is read with weights_only=True. A flag given now that differs from
    the saved one is ignored, except --total-timesteps, which extends the run, and --stop-at,
    which is this sitting's (the saved one is not kept)."""
    path = Path(args.resume) / "checkpoint.pt"
    if not path.is_file():
        fail(f"no checkpoint at {path}; pass the run directory of an earlier {script} run")
    try:
        if sha256(path) != (path.parent / "checkpoint.sha256").read_text().strip():
            raise ValueError("its SHA-256 differs from checkpoint.sha256")
        ckpt = torch.load(path, weights_only=True)
        saved = type(args)(**ckpt["args"])
    except Exception as e:
        fail(
            f"{path} is corrupt or not a {script} checkpoint "
            f"({type(e).__name__}); delete it or start anew"
        )
    changed = []
    for name, value in asdict(args).items():
        if name in ("resume", "run_dir", "stop_at") or value == getattr(saved, name):
            continue
        if name in given_flags() or value != getattr(type(args)(), name):
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
    saved.stop_at = args.stop_at
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
    """--track needs a wandb login, or WANDB_MODE=offline: checked before anything is written,
    through wandb's public API (wandb.setup's settings, wandb.login without a prompt)."""
    import wandb

    try:
        mode = wandb.setup().settings.mode
    except Exception as e:
        fail(f"--track: wandb cannot start ({first_line(e)})")
    if mode in ("offline", "dryrun", "disabled"):
        return
    with contextlib.redirect_stderr(io.StringIO()):  # its "Loaded credentials ..." line
        logged_in = wandb.login(prompt=False, verify=False)
    if not logged_in:
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


def save_gif(frames: list, path: Path, ms_per_frame: int):
    """frames (height x width x 3 arrays) as a looping GIF at path (its folder made)."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, frames, duration=ms_per_frame, loop=0)


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


def write_config(args, run_dir: Path, script: Path):
    """config.json: every flag, the script, the git commit of its folder (if any), package
    versions."""
    git = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=script.parent
    )
    config = {
        "script": script.name,
        "args": asdict(args),
        "git_commit": git.stdout.strip() or None,
        "versions": {p: version(p) for p in ("torch", "gymnasium", "numpy")},
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))


# flags that change where and how a run is recorded, not what it learns; the dataset of an
# offline script is compared by same_setting
NOT_HYPERPARAMETERS = {
    "env_id",
    "total_timesteps",
    "seed",
    "cuda",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "save_model",
    "eval_episodes",
    "eval_every",
    "eval_prompts",
    "run_dir",
    "resume",
    "checkpoint_every",
    "stop_at",
    "dataset",
}


def flag_values(flags: list[str]) -> dict[str, list[str]] | None:
    """The flags of a command line as {field name: the tokens after it} ("--no-x" is x: ["False"],
    a flag alone is ["True"]); None for a token that is not a flag and follows none."""
    values = {}
    name = None
    for token in flags:
        if token.startswith("--"):
            name = token[2:].replace("-", "_")
            values[name] = []
        elif name is None:
            return None
        else:
            values[name].append(token)
    for name in list(values):
        if not values[name]:
            values.pop(name)
            if name.startswith("no_"):
                values[name[3:]] = ["False"]
            else:
                values[name] = ["True"]
    return values


def same_value(token: str, value) -> bool:
    """Whether a command-line token gives the value config.json saved."""
    if isinstance(value, bool) or value is None:
        return token == str(value)
    if isinstance(value, (int, float)):
        try:
            return float(token) == float(value)
        except ValueError:
            return False
    return token == str(value)


def stop_at_reached(args, step: int, total: int) -> bool:
    """Whether `step` is at or past --stop-at and short of `total`, the steps the run would do."""
    return args.stop_at is not None and args.stop_at <= step < total


class RunLogger:
    """What a run shows and leaves behind: config.json, metrics.csv (global_step, wall_time, name,
    value; append-only), TensorBoard events, a wandb run with --track, the progress bar,
    checkpoint.pt. Resuming drops the rows logged after the checkpoint (those steps are redone): no
    step is logged twice. The training clock stops during evaluations. Ctrl-C sets stop_requested:
    the script finishes its iteration, saves it and exits (status 130); --stop-at does the same at
    its step (status 0). `script` is the script's path (__file__)."""

    def __init__(self, args, run_dir: Path, total: int, step: int, ckpt: dict | None, script: str):
        self.script = Path(script).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / "metrics.csv"
        header = "global_step,wall_time,name,value\n"
        if ckpt is not None:  # keep the rows up to the checkpoint's step
            lines = metrics.read_text().splitlines(keepends=True)[1:] if metrics.is_file() else []
            kept = [line for line in lines if int(line.split(",")[0]) <= step]
            (run_dir / "metrics.tmp").write_text(header + "".join(kept))
            os.replace(run_dir / "metrics.tmp", metrics)
        else:
            write_config(args, run_dir, self.script)
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
        self.total = total
        self.first_step = step
        self.last_step = step  # of the last end_iteration()
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
        if isinstance(self.args, LMRunArgs) and len(returns):  # a reward per held-out prompt
            self.log(
                step,
                {
                    "eval/accuracy": float(np.mean(correct(by_name(results)))),
                    "eval/reward": float(np.mean(returns)),
                },
            )
        return results

    def log_episode(self, step: int, episodic_return, episodic_length):
        """train/episodic_return and train/episodic_length of an episode that ended at `step`
        (the progress bar's ret= shows the last)."""
        self.last_return = episodic_return
        self.log(
            step,
            {"train/episodic_return": episodic_return, "train/episodic_length": episodic_length},
        )

    def stops_after(self, step: int) -> bool:
        """Whether the run ends after the iteration that reached `step`: Ctrl-C asked for it, or
        --stop-at is reached before the end of the budget."""
        return self.stop_requested or stop_at_reached(self.args, step, self.total)

    def end_iteration(self, stateful: dict, iteration: int, step: int, run_eval=None):
        """After each iteration (`iteration` of them done, `step` steps): an evaluation when `step`
        passes a multiple of --eval-every (the last is finish()'s; none without run_eval), a
        checkpoint when it passes a multiple of --checkpoint-every, then, on Ctrl-C or at
        --stop-at, a checkpoint and the exit."""
        every, last, self.last_step = self.args.eval_every, self.last_step, step
        if every and run_eval is not None and step < self.total and step // every > last // every:
            self.evaluate(step, run_eval)
        every = self.args.checkpoint_every
        stop = self.stops_after(step)
        if step // every > last // every or stop:
            self.save_checkpoint(stateful, iteration, step)
        if stop:  # the iteration it came in is finished and saved
            self.exit_stopped(step)

    def finish(self, stateful, iteration, step, run_eval=None, model=None, save_also=None):
        """The end of a run: the final evaluation (with --capture-video, its episode 0 filmed into
        <run_dir>/videos; none without run_eval), the final checkpoint, with --save-model
        model.pt (`model`: the weights and what evaluation needs; the flags and the evaluation's
        returns added) after save_also(run_dir), then the closing lines. Returns the evaluation."""
        results = {"eval/episodic_return": []}
        if run_eval is not None and hasattr(self.args, "capture_video"):
            video_dir = self.run_dir / "videos" if self.args.capture_video else None
            results = self.evaluate(step, lambda: run_eval(video_dir))
        elif run_eval is not None:
            results = self.evaluate(step, run_eval)
        self.save_checkpoint(stateful, iteration, step, finished=True)
        if self.args.save_model:
            if save_also is not None:
                save_also(self.run_dir)
            # the episodic returns (multi-agent: every metric by name)
            returns = by_name(results).get("eval/episodic_return", results)
            save_model({**model, "args": asdict(self.args), "eval_returns": returns}, self.run_dir)
        self.close(results)
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

    def exit_stopped(self, step: int):
        """The exit after a saved iteration: Ctrl-C's (status 130) or --stop-at's (status 0)."""
        self.close_files()
        if self.stop_requested:
            print(
                f"interrupted: metrics kept, resume with --resume {self.run_dir}", file=sys.stderr
            )
            sys.exit(130)
        print(
            f"stopped at step {step:,} (--stop-at {self.args.stop_at:,}): metrics kept, go on to "
            f"--total-timesteps {self.args.total_timesteps:,} with --resume {self.run_dir}"
        )
        sys.exit(0)

    def close(self, results):
        """Close the files; the last lines say the evaluation, where the run is and how it compares
        with the script's reference."""
        self.bar.update(self.bar.total - self.bar.n)
        self.close_files()
        results = by_name(results)
        unit = "trials" if isinstance(self.args, TrialRunArgs) else "episodes"
        digits = 2
        saved = "model.pt, checkpoint.pt" if self.args.save_model else "checkpoint.pt"
        if isinstance(self.args, LMRunArgs):  # a reward per held-out prompt
            rewards = results.get("eval/episodic_return", [])
            results = {"eval/accuracy": correct(results), "eval/reward": list(rewards)}
            unit = "held-out prompts"
            digits = 3
            saved = "model.pt, model/, checkpoint.pt" if self.args.save_model else "checkpoint.pt"
        for name, values in results.items():
            if len(values):
                mean = np.mean(values)
                std = np.std(values)
                print(f"{name}: {mean:.{digits}f} +- {std:.{digits}f} over {len(values)} {unit}")
        print(f"run saved in {self.run_dir} ({saved})")
        self.compare_with_reference(results)

    def compare_with_reference(self, results: dict):
        """Print our multi-seed reference of this script and env made with this run's flags (of
        the budget nearest this run's), when benchmark/references.toml is beside the script's
        folder, and where this run's evaluation lies."""
        path = self.script.parent.parent / "benchmark" / "references.toml"
        refs = tomllib.loads(path.read_text())["reference"] if path.is_file() else []
        refs = [r for r in refs if "values" in r and self.same_setting(r)]
        refs = [r for r in refs if r["score"] in ("final_eval", "final_win_rate")]
        same = [r for r in refs if self.same_flags(r.get("flags", []))]
        if not same:
            what = "with these flags " if refs else ""
            print(
                f"no reference {what}for {self.script.name} on {self.args.env_id} to compare with"
            )
            return
        budget = self.args.total_timesteps
        r = min(same, key=lambda r: abs(r["total_timesteps"] - budget))
        values = r["values"]
        print(
            f"reference {r['id']} ({r['total_timesteps']:,} steps, {r['score']}, "
            f"{len(values)} seeds): {np.mean(values):.2f} +- {np.std(values):.2f}, "
            f"seeds from {min(values):.2f} to {max(values):.2f}"
        )
        wanted = "win" if r["score"] == "final_win_rate" else "episodic_return"
        wanted = "accuracy" if isinstance(self.args, LMRunArgs) else wanted
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

    def same_flags(self, flags: list[str]) -> bool:
        """True when a reference's flags (those it was run with beyond its env, budget and seed)
        set what this run's do: the same hyperparameters, each one given or left at its default
        alike. Flags of the run's plumbing (where it is written, logging, how often it evaluates)
        do not count."""
        given = flag_values(flags)
        if given is None:
            return False
        defaults = type(self.args)()
        for name, value in asdict(self.args).items():
            if name in NOT_HYPERPARAMETERS:
                continue
            tokens = given.get(name)
            if tokens is None:
                if value != getattr(defaults, name):
                    return False
                continue
            values = value if isinstance(value, list) else [value]
            if len(values) != len(tokens) or not all(map(same_value, tokens, values)):
                return False
        return all(name in asdict(self.args) for name in given)

    def same_setting(self, reference: dict) -> bool:
        """True for a reference of this script and env (and, for an offline script, of this
        dataset)."""
        if (reference["script"], reference["env_id"]) != (self.script.name, self.args.env_id):
            return False
        flags = reference.get("flags", [])
        if not hasattr(self.args, "dataset") or "--dataset" not in flags:
            return True
        ours = Path(self.args.dataset)  # a directory, or an id such as canonrl/cartpole/medium-v0
        theirs = Path(flags[flags.index("--dataset") + 1]).name  # runs/datasets/cartpole-medium-v0
        return theirs in (ours.name, "-".join(ours.parts[-2:]))
