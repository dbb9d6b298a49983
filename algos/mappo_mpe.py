"""MAPPO on MPE (mpe2's simple_spread_v3 by default): PPO with a centralised critic for cooperative particle tasks.

Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games": one actor shared by all agents
(its input is the agent's observation and a one-hot agent id), recurrent (a GRU cell, the paper's recurrent policy);
one critic on the global state (every agent's observation, concatenated: mpe2's state()) and the agent's id, a
feed-forward MLP here. The details the paper shows matter: value normalisation (the critic learns normalised returns),
GAE, few epochs over large batches of many episodes, clip 0.2. Rewards are per agent (simple_spread: a shared term for
how well the landmarks are covered and the agent's own collision penalty), and so is GAE: each agent's advantages come
from its own rewards. The --num-envs mpe2 parallel_envs step one after another in a Python loop (MPE is numpy: one host
copy of the stacked observations per step is unavoidable). Every episode ends at the time limit (25 steps): a
truncation, bootstrapped with V(final state); the env is reset in the same step. global_step counts joint steps (one
step of one env). The per-agent mean of the episodic return (the metric MAPPO and JaxMARL report for MPE) is logged as
train/episodic_return_agent_mean; the evaluation is greedy (argmax).

Run:    python algos/mappo_mpe.py --env-id simple_spread_v3 --seed 1
Result: simple_spread_v3, 100k steps: per-agent mean return of 100 greedy episodes -17.7 to -20.4 on seeds 1-10
        (random play -26.1; references.toml)
"""
import csv, difflib, importlib, json, os, random, subprocess, sys, tempfile, time, tomllib, warnings
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    env_id: str = "simple_spread_v3"  # mpe2 task (the cooperative ones: see TASKS)
    total_timesteps: int = 300_000  # joint steps over all envs
    num_envs: int = 64  # mpe2 parallel_envs stepped in turn (the MAPPO paper used 128 for MPE; 32 let IPPO collapse)
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
    learning_rate: float = 7e-4  # Adam learning rate (actor and critic)
    anneal_lr: bool = False  # anneal the learning rate linearly to 0
    num_steps: int = 25  # steps per env per rollout (25: one episode)
    gamma: float = 0.99  # discount factor
    gae_lambda: float = 0.95  # lambda of GAE
    num_minibatches: int = 1  # minibatches per epoch, split by env (must divide num_envs)
    update_epochs: int = 10  # epochs over each rollout
    clip_coef: float = 0.2  # surrogate clipping coefficient
    ent_coef: float = 0.01  # entropy bonus coefficient
    vf_coef: float = 1.0  # value loss coefficient
    max_grad_norm: float = 10.0  # global gradient norm clip
    hidden_dim: int = 64  # width of the actor's layer and GRU, and of the critic's layers


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


MAX_CYCLES = 25  # steps per episode (mpe2's default, MAPPO's and JaxMARL's)
TASKS = {  # the cooperative mpe2 tasks whose agents have the same observation and action sizes: their settings
    "simple_spread_v3": {"N": 3, "local_ratio": 0.5},  # N agents cover N landmarks without colliding
    "simple_reference_v3": {"local_ratio": 0.5},  # 2 agents; each says which landmark the other must reach
    "simple_formation_v1": {"N": 4},  # N agents form a circle around a landmark
    "simple_line_v1": {"N": 4},  # N agents spread along a line
}
NOT_SUPPORTED = {  # the other mpe2 tasks, and why one actor shared by a cooperative team does not fit them
    "simple_v3": "one agent", "simple_speaker_listener_v4": "its agents' observation and action sizes differ",
    "collect_treasure_v1": "its agents' observation sizes differ", **{t: "competitive" for t in (
        "simple_adversary_v3", "simple_crypto_v3", "simple_push_v3", "simple_tag_v3", "simple_world_comm_v3")}}


def check_args(args: Args):
    if args.env_id not in TASKS:
        close = difflib.get_close_matches(args.env_id, [*TASKS, *NOT_SUPPORTED], n=1)
        why = (f"mpe2 task '{args.env_id}' is not supported ({NOT_SUPPORTED[args.env_id]})" if args.env_id in
               NOT_SUPPORTED else f"unknown mpe2 task '{args.env_id}'" + (f"; did you mean '{close[0]}'?" if close
                                                                          and close[0] in TASKS else ""))
        fail(why + f"; the tasks: {', '.join(TASKS)}", *(("ppo.py", "ppo_continuous.py") if args.env_id in
                                                           gym.registry else ()))  # a single-agent Gymnasium env
    check_ranges(args, {"num_envs": "x >= 1", "num_steps": "x >= 1", "num_minibatches": "x >= 1",
                        "update_epochs": "x >= 1", "learning_rate": "x > 0", "gamma": "0 <= x <= 1",
                        "gae_lambda": "0 <= x <= 1", "clip_coef": "x > 0", "ent_coef": "x >= 0", "vf_coef": "x >= 0",
                        "max_grad_norm": "x > 0", "hidden_dim": "x >= 1"})
    if args.num_envs % args.num_minibatches:
        fail(f"--num-minibatches {args.num_minibatches} does not divide --num-envs {args.num_envs} (split by env)")
    if args.total_timesteps < args.num_envs * args.num_steps:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout (num_envs*num_steps = "
             f"{args.num_envs * args.num_steps})")


class MPEEnvs:
    """num_envs mpe2 parallel_envs of one task, stepped in turn; observations come stacked as one (num_envs, n_agents,
    obs_dim) tensor (MPE is numpy: one host copy per step), with the global state (num_envs, n_agents * obs_dim): every
    agent's observation, which is what mpe2's state() returns. Env i's k-th episode (from 0) is seeded with
    seed + i + num_envs * k. With auto_reset, a finished env is reset in the same step, its last observation kept in
    info["final_obs"] (and info["final_state"]) for the bootstrap; without it (evaluation), it is left finished."""

    def __init__(self, env_id: str, num_envs: int, device, auto_reset=True, render_env0=False):
        module = importlib.import_module(f"mpe2.{env_id}")
        self.envs = [module.parallel_env(max_cycles=MAX_CYCLES, continuous_actions=False, **TASKS[env_id],
                                         render_mode="rgb_array" if render_env0 and i == 0 else None)
                     for i in range(num_envs)]
        self.agents = self.envs[0].possible_agents
        self.n_agents, self.n_actions = len(self.agents), int(self.envs[0].action_space(self.agents[0]).n)
        self.obs_dim = self.envs[0].observation_space(self.agents[0]).shape[0]
        self.state_dim, self.device, self.auto_reset = self.n_agents * self.obs_dim, device, auto_reset
        self.seed, self.episodes = 0, np.zeros(num_envs, dtype=np.int64)
        self.obs = np.zeros((num_envs, self.n_agents, self.obs_dim), dtype=np.float32)
        self.returns, self.lengths = np.zeros((num_envs, self.n_agents)), np.zeros(num_envs, dtype=np.int64)

    def _reset(self, i: int):
        obs, _ = self.envs[i].reset(seed=self.seed + i + len(self.envs) * int(self.episodes[i]))
        self.obs[i], self.returns[i], self.lengths[i] = [obs[a] for a in self.agents], 0.0, 0
        self.episodes[i] += 1

    def _tensors(self, obs):
        obs = torch.as_tensor(obs, device=self.device)
        return obs, obs.flatten(-2)

    def reset(self, seed: int):
        """Start every env anew (env i with seed + i); returns (obs, state)."""
        self.seed, self.episodes[:] = seed, 0
        for i in range(len(self.envs)):
            self._reset(i)
        return self._tensors(self.obs.copy())

    def step(self, actions):
        """actions: (num_envs, n_agents) tensor. Returns obs, state, reward (num_envs, n_agents): each agent's own,
        done (num_envs,) and info: truncated (num_envs,), final_obs, final_state, episode_return (the per-agent mean of
        the finished episode's return) and episode_length, which hold where done."""
        n, actions = len(self.envs), actions.cpu().numpy()
        reward, done, truncated = np.zeros((n, self.n_agents), dtype=np.float32), np.zeros(n, bool), np.zeros(n, bool)
        final_obs, ep_return, ep_length = self.obs.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
        for i, env in enumerate(self.envs):
            if not env.agents:  # finished, and not reset (evaluation)
                continue
            obs, rew, term, trunc, _ = env.step(dict(zip(self.agents, actions[i].tolist())))
            self.obs[i] = final_obs[i] = [obs[a] for a in self.agents]
            reward[i] = [rew[a] for a in self.agents]
            self.returns[i] += reward[i]
            self.lengths[i] += 1
            done[i] = all(term[a] or trunc[a] for a in self.agents)
            if done[i]:
                truncated[i] = not any(term.values())  # every agent's time ran out, no task ended it
                ep_return[i], ep_length[i] = self.returns[i].mean(), self.lengths[i]
                if self.auto_reset:
                    self._reset(i)
        (obs, state), (final_obs, final_state) = self._tensors(self.obs.copy()), self._tensors(final_obs)
        tensor = lambda x: torch.as_tensor(x, device=self.device)  # noqa: E731
        info = {"truncated": tensor(truncated), "final_obs": final_obs, "final_state": final_state,
                "episode_return": tensor(ep_return), "episode_length": tensor(ep_length)}
        return obs, state, tensor(reward), tensor(done), info

    def render(self):
        """Env 0's frame (it must have been made with render_env0)."""
        return self.envs[0].render()


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor shared by all agents: [obs, agent id] -> hidden (ReLU) -> GRU cell -> logits over the actions.
    Critic: [global state, agent id] -> hidden -> hidden (ReLU) -> value."""

    def __init__(self, obs_dim: int, state_dim: int, n_agents: int, n_actions: int, hidden: int):
        super().__init__()
        self.actor_in = nn.Sequential(layer_init(nn.Linear(obs_dim + n_agents, hidden)), nn.ReLU())
        self.gru = nn.GRUCell(hidden, hidden)
        self.actor_out = layer_init(nn.Linear(hidden, n_actions), std=0.01)  # std 0.01: a near-uniform first policy
        self.critic = nn.Sequential(
            layer_init(nn.Linear(state_dim + n_agents, hidden)), nn.ReLU(),
            layer_init(nn.Linear(hidden, hidden)), nn.ReLU(), layer_init(nn.Linear(hidden, 1), std=1.0))

    def get_value(self, critic_in):
        """The critic's (normalised) value of each agent's global state."""
        return self.critic(critic_in).squeeze(-1)

    def actor_step(self, actor_in, hidden, start):
        """One GRU step of every agent (inputs (..., agents, features)); memory is zeroed where an episode starts."""
        x, hidden = self.actor_in(actor_in), hidden * (1.0 - start)[..., None, None]
        return self.gru(x.flatten(0, -2), hidden.flatten(0, -2)).view_as(hidden)

    def policy(self, hidden):
        """The categorical policy over the actions (all are always available in MPE)."""
        return Categorical(logits=self.actor_out(hidden), validate_args=False)


def actor_inputs(obs, agent_ids):
    return torch.cat([obs, agent_ids.expand(*obs.shape[:-1], -1)], -1)


def critic_inputs(state, obs, agent_ids):
    """MAPPO's critic input: the global state (every agent's observation) and the agent's id."""
    return torch.cat([state.unsqueeze(-2).expand(*obs.shape[:-1], -1), agent_ids.expand(*obs.shape[:-1], -1)], -1)


class ValueNorm(nn.Module):
    """Running mean and variance of the value targets (MAPPO's value normalisation): the critic learns normalised
    returns, so its loss keeps one scale while the returns change as the agents learn (simple_spread: from about -26 to
    -20 per agent)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("count", torch.tensor(1e-4))

    def update(self, x):  # the parallel update of Chan et al., as gymnasium's RunningMeanStd
        delta, n = x.mean() - self.mean, x.numel()
        total = self.count + n
        self.var.copy_((self.var * self.count + x.var(correction=0) * n + delta ** 2 * self.count * n / total) / total)
        self.mean.add_(delta * n / total), self.count.copy_(total)

    def normalize(self, x):
        return (x - self.mean) / self.var.sqrt().clamp(min=1e-5)

    def denormalize(self, x):
        return x * self.var.sqrt().clamp(min=1e-5) + self.mean


def compute_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """GAE (Schulman et al. 2016, eq. 16) on tensors of shape (T, N). dones[t]: the episode ended at step t
    (terminated or truncated; a truncation was already bootstrapped into rewards[t]). Returns (advantages, returns)."""
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        next_values, nonterminal = next_value if t == len(rewards) - 1 else values[t + 1], 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * nonterminal - values[t]
        advantages[t] = last = delta + gamma * gae_lambda * nonterminal * last
    return advantages, advantages + values


def ppo_loss(dist, value, actions, old_logprobs, advantages, targets, clip_coef, ent_coef, vf_coef):
    """Clipped surrogate objective (PPO paper, eq. 7) + value MSE on normalised targets - entropy bonus, each averaged
    over every agent's steps."""
    logprob, entropy = dist.log_prob(actions), dist.entropy().mean()
    logratio = logprob - old_logprobs
    ratio = logratio.exp()
    pg_loss = -torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_loss = 0.5 * ((value - targets) ** 2).mean()
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy
    with torch.no_grad():  # approx_kl: the k3 estimator of Schulman's note "Approximating KL divergence"
        stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy, "approx_kl":
                 ((ratio - 1) - logratio).mean(), "clipfrac": ((ratio - 1).abs() > clip_coef).float().mean()}
    return loss, {k: v.detach() for k, v in stats.items()}


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu", frames=None):
    """Greedy (argmax) play of one episode in each of `episodes` envs (env i seeded with seed + i); returns
    {"eval/episodic_return_agent_mean": [...]}, one value (the per-agent mean of the return) per episode. frames: a
    list that receives episode 0's frames (--capture-video)."""
    if episodes == 0:
        return {"eval/episodic_return_agent_mean": []}
    env = MPEEnvs(env_id, episodes, device, auto_reset=False, render_env0=frames is not None)
    (obs, _), agent_ids = env.reset(seed), torch.eye(env.n_agents, device=device)
    hidden = torch.zeros(episodes, env.n_agents, agent.gru.hidden_size, device=device)
    finished, returns = torch.zeros(episodes, dtype=torch.bool, device=device), torch.zeros(episodes, device=device)
    no_start = torch.zeros(episodes, device=device)
    if frames is not None:
        frames.append(env.render()[::2, ::2])  # 350 x 350 pixels
    while not finished.all():
        hidden = agent.actor_step(actor_inputs(obs, agent_ids), hidden, no_start)
        obs, _, _, done, info = env.step(agent.policy(hidden).logits.argmax(-1))
        returns = torch.where(done, info["episode_return"], returns)
        if frames is not None and not finished[0]:
            frames.append(env.render()[::2, ::2])
        finished |= done
    return {"eval/episodic_return_agent_mean": returns.tolist()}


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    env = MPEEnvs(args.env_id, args.num_envs, device)
    N, A, T = args.num_envs, env.n_agents, args.num_steps
    obs_dim, state_dim, n_actions = env.obs_dim, env.state_dim, env.n_actions
    agent_ids = torch.eye(A, device=device)  # row i: agent i's one-hot id
    agent = Agent(obs_dim, state_dim, A, n_actions, args.hidden_dim).to(device)
    value_norm = ValueNorm().to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # fused: faster
    batch_size, mb_envs, num_iterations = N * T, N // args.num_minibatches, args.total_timesteps // (N * T)
    iteration, eval_seed = 0, args.seed + 10**9  # evaluation episodes are seeded apart from training
    run_eval = lambda frames=None: evaluate(  # noqa: E731
        agent, args.env_id, args.eval_episodes, eval_seed, device, frames)
    if ckpt is not None:
        try:
            agent.load_state_dict(ckpt["agent"]), optimizer.load_state_dict(ckpt["optimizer"])
            value_norm.load_state_dict(ckpt["value_norm"])
        except Exception as e:
            fail(f"{run_dir / 'checkpoint.pt'} does not fit this network ({type(e).__name__}); delete it or start anew")
        torch.set_rng_state(ckpt["torch_rng"])  # action sampling and minibatch shuffling; episodes are seeded on reset
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(args, run_dir, num_iterations * batch_size, global_step, resuming=ckpt is not None)

    def checkpoint(iteration):  # write, then rename: a crash never leaves a half-written checkpoint.pt
        torch.save({"args": asdict(args), "iteration": iteration, "global_step": iteration * batch_size, "agent":
                    agent.state_dict(), "optimizer": optimizer.state_dict(), "value_norm": value_norm.state_dict(),
                    "torch_rng": torch.get_rng_state()}, run_dir / "checkpoint.tmp")
        os.replace(run_dir / "checkpoint.tmp", run_dir / "checkpoint.pt")

    actor_in = torch.zeros((T, N, A, obs_dim + A), device=device)
    critic_in = torch.zeros((T, N, A, agent.critic[0].in_features), device=device)
    actions = torch.zeros((T, N, A), dtype=torch.long, device=device)
    logprobs, rewards, values = (torch.zeros((T, N, A), device=device) for _ in range(3))
    starts, dones, ep_return, ep_length = (torch.zeros((T, N), device=device) for _ in range(4))
    obs, state = env.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    hidden, start = torch.zeros((N, A, args.hidden_dim), device=device), torch.ones(N, device=device)
    try:
        for iteration in range(iteration + 1, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            first_hidden, first_step = hidden.clone(), global_step  # the update replays the GRU from here
            for step in range(T):
                actor_in[step], critic_in[step] = actor_inputs(obs, agent_ids), critic_inputs(state, obs, agent_ids)
                starts[step] = start
                with torch.no_grad():
                    hidden = agent.actor_step(actor_in[step], hidden, start)
                    dist = agent.policy(hidden)
                    actions[step] = dist.sample()
                    logprobs[step] = dist.log_prob(actions[step])
                    values[step] = value_norm.denormalize(agent.get_value(critic_in[step]))
                obs, state, reward, done, info = env.step(actions[step])
                with torch.no_grad():  # a time limit is not part of the task: bootstrap with V(final state)
                    final_value = value_norm.denormalize(agent.get_value(
                        critic_inputs(info["final_state"], info["final_obs"], agent_ids)))
                rewards[step] = reward + args.gamma * final_value * info["truncated"][:, None]
                dones[step], start = done.float(), done.float()
                ep_return[step], ep_length[step] = info["episode_return"], info["episode_length"]
                global_step += N
            with torch.no_grad():
                next_value = value_norm.denormalize(agent.get_value(critic_inputs(state, obs, agent_ids)))
            advantages, returns = compute_gae(rewards, values, dones[..., None], next_value, args.gamma,
                                              args.gae_lambda)  # per agent; dones broadcast over the agents
            value_norm.update(returns)
            targets = value_norm.normalize(returns)
            for epoch in range(args.update_epochs):
                perm = torch.randperm(N, device=device)
                for mb in perm.split(mb_envs):  # whole env sequences: the GRU is replayed from first_hidden
                    h, hiddens = first_hidden[mb], []
                    for t in range(T):
                        hiddens.append(h := agent.actor_step(actor_in[t, mb], h, starts[t, mb]))
                    dist, value = agent.policy(torch.stack(hiddens)), agent.get_value(critic_in[:, mb])
                    mb_advantages = advantages[:, mb]
                    loss, stats = ppo_loss(dist, value, actions[:, mb], logprobs[:, mb],
                                           (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8),
                                           targets[:, mb], args.clip_coef, args.ent_coef, args.vf_coef)
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
            ended, ret, length = (x.cpu().numpy() for x in (dones > 0, ep_return, ep_length))  # one copy
            for t, i in zip(*np.nonzero(ended)):  # every episode that ended in the rollout
                logger.log(first_step + (t + 1) * N, {"train/episodic_return_agent_mean": ret[t, i],
                                                      "train/episodic_length": length[t, i]})
            if ended.any():
                logger.last_return = ret[ended].mean()
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
    checkpoint(num_iterations)
    frames = [] if args.capture_video else None
    eval_results = logger.evaluate(global_step, lambda: run_eval(frames))
    if frames:
        import imageio.v2 as imageio
        (run_dir / "videos").mkdir(exist_ok=True)
        imageio.mimsave(run_dir / "videos" / "eval_episode0.gif", frames, duration=100, loop=0)
    if args.save_model:
        torch.save({"agent": agent.state_dict(), "args": asdict(args), "eval_returns": eval_results,
                    "obs_dim": obs_dim, "state_dim": state_dim, "n_agents": A, "n_actions": n_actions,
                    "hidden": args.hidden_dim}, run_dir / "model.pt")
    logger.close(run_dir, args, eval_results)


if __name__ == "__main__":
    main(tyro.cli(Args))
