"""MADDPG on MPE (mpe2's simple_spread_v3 by default, continuous actions): DDPG with a centralised critic per agent.

Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive Environments" (arXiv:1706.02275): every
agent i has its own deterministic actor mu_i(o_i) and its own centralised critic Q_i(o_1..o_N, a_1..a_N), which sees
every agent's observation and action (so the environment is stationary from the critic's view while the others learn);
no parameters are shared, so agents with different observation or action sizes (the competitive tasks) fit. Q_i learns
the target r_i + gamma * Q'_i(o'_1..o'_N, mu'_1(o'_1)..mu'_N(o'_N)) from a replay buffer, with the target actors and
critics; mu_i follows the deterministic policy gradient of Q_i, the other agents' actions taken from the buffer (eq. 6).
The paper's settings (its Appendix and the authors' code): 64-64 ReLU networks, Adam lr 1e-2, gamma 0.95, batch 1024,
one update of every agent each 100 environment steps, tau 0.01, replay of 1e6 steps, gradient norm clip 0.5, a 1e-3
penalty on the actor's pre-activations. Continuous actions (mpe2's continuous_actions=True: Box(0, 1) per action
component; the actor's sigmoid maps into the box) in place of the paper's Gumbel-softmax over discrete ones;
exploration is Gaussian noise on the actions, clipped to the box. The --num-envs mpe2 parallel_envs step one after
another in a Python loop; global_step counts joint steps (one step of one env). Every episode ends at the time limit
(25 steps): a truncation, whose true final observation is stored and bootstrapped through; only a termination cuts the
bootstrap. Metrics: train/ and eval/episodic_return_agent_mean, the per-agent mean of the episodic return; in the
competitive tasks also per team: .../episodic_return_adversary_mean (adversaries, eve) and .../episodic_return_good_mean
(the others). The evaluation is deterministic (the actors' actions, no noise).

Run:    python algos/maddpg_mpe.py --env-id simple_spread_v3 --seed 1
Result: RESULT
"""
import csv, difflib, importlib, json, os, random, subprocess, sys, tempfile, time, tomllib, warnings
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
    env_id: str = "simple_spread_v3"  # mpe2 task (see TASKS)
    total_timesteps: int = 300_000  # joint steps over all envs
    num_envs: int = 8  # mpe2 parallel_envs stepped in turn
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
    learning_rate: float = 1e-2  # Adam learning rate of the actors and the critics
    buffer_size: int = 1_000_000  # replay buffer capacity (joint steps)
    gamma: float = 0.95  # discount factor
    tau: float = 0.01  # target network update rate (1.0: a hard copy)
    batch_size: int = 1024  # replay minibatch size (each agent draws its own)
    learning_starts: int = 25_600  # joint steps stored before the first update (the authors' code: batch x 25)
    train_every: int = 100  # joint steps between updates (each update: one gradient step of every agent)
    exploration_noise: float = 0.1  # std of the Gaussian noise on the actions (in units of the action's range)
    max_grad_norm: float = 0.5  # gradient norm clip of each actor and critic
    actor_reg: float = 1e-3  # weight of the penalty on the actor's squared pre-activations (the authors' code)
    hidden_dim: int = 64  # width of the two hidden layers of every actor and critic


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
