"""IMPALA on classic control (CartPole-v1 by default) and MinAtar: actors act, a learner corrects.

Espeholt et al. 2018, "IMPALA": --num-actors Ray actors step their own vector envs with a copy of
the policy and send rollouts of --num-steps steps with mu(a|s); the learner takes the first one
ready, takes one step on it and sends that actor new weights. Their policy lags by about num_actors
- 1 updates: V-trace (eq. 1, vtrace()) corrects values and policy gradient with min(rho_bar, pi/mu),
min(c_bar, pi/mu). The paper's loss and clip 40, Adam 5e-4 annealed; --num-actors 0: one actor in
this process.

Run:    python algos/impala.py --env-id CartPole-v1 --seed 1 --num-actors 2
Quick:  python algos/impala.py --num-actors 0 --total-timesteps 20000
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
import socket
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
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm


@dataclass
class Args:
    learning_rate: float = 5e-4
    """learning rate"""
    rmsprop: bool = False
    """RMSprop (alpha 0.99, eps 0.01: the paper's); False: Adam (eps 1e-5)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the updates (as the paper)"""
    num_actors: int = 2
    """Ray actors, one process each (0: one actor in this process, without Ray: deterministic)"""
    num_envs: int = 8
    """environments per actor (one synchronous vector env each)"""
    num_steps: int = 20
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    rho_bar: float = 1.0
    """V-trace: truncation of the importance weights of the TD errors and the policy gradient"""
    c_bar: float = 1.0
    """V-trace: truncation of the importance weights of the trace (how far a TD error reaches
    back)"""
    ent_coef: float = 0.01
    """entropy bonus coefficient (the paper's entropy cost)"""
    vf_coef: float = 0.5
    """value loss coefficient (the paper's baseline cost)"""
    max_grad_norm: float = 40.0
    """global gradient norm clip"""
    ray_address: str | None = None
    """host:port of a Ray head (`ray start --head`); default RAY_ADDRESS (with actors)"""
    env_id: str = "CartPole-v1"
    """id of a discrete-action env with flat vector observations, or MinAtar/<Game>-v1"""
    total_timesteps: int = 300_000
    """environment steps over all actors"""
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


def torso(obs_shape) -> list[nn.Module]:
    """The layers from an observation to its features: for a flat vector an MLP 64 -> 64 (tanh), as
    in a2c.py and ppo.py; for a MinAtar grid (channels, 10, 10) MinAtar's network: 16 3x3
    convolutions, 128 units (ReLU)."""
    if len(obs_shape) == 1:
        return [
            layer_init(nn.Linear(obs_shape[0], 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
        ]
    c, h, w = obs_shape
    return [
        layer_init(nn.Conv2d(c, 16, 3)),
        nn.ReLU(),
        nn.Flatten(),
        layer_init(nn.Linear(16 * (h - 2) * (w - 2), 128)),
        nn.ReLU(),
    ]


class Agent(nn.Module):
    """Separate actor and critic networks, each a torso (above) -> logits / value."""

    def __init__(self, obs_shape: tuple, n_actions: int):
        super().__init__()
        features = 64 if len(obs_shape) == 1 else 128
        self.critic = nn.Sequential(*torso(obs_shape), layer_init(nn.Linear(features, 1), std=1.0))
        self.actor = nn.Sequential(  # std 0.01: a near-uniform first policy
            *torso(obs_shape), layer_init(nn.Linear(features, n_actions), std=0.01)
        )

    def get_value(self, x):
        return self.critic(x).squeeze(-1)

    def get_action(self, x, greedy=False, generator=None):
        """The action the policy takes at x: sampled from pi(.|x) with `generator` (the actors), or
        the most probable one (greedy: evaluate()). Returns it with its log-probability."""
        logits = self.actor(x)
        if greedy:
            action = logits.argmax(dim=-1)
        else:
            action = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
        return action, logits.log_softmax(dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def get_logprob_entropy_value(self, x, action):
        """The learner's view of actions already taken: log pi(a|x), the entropy of pi(.|x) and
        V(x)."""
        dist = torch.distributions.Categorical(logits=self.actor(x), validate_args=False)
        return dist.log_prob(action), dist.entropy(), self.get_value(x)


def vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0):
    """V-trace targets (Espeholt et al. 2018, section 4) on tensors of shape (T, B); bootstrap_value
    is V(x_T), (B,). log_rhos[t] = log pi(a_t|x_t) - log mu(a_t|x_t) (pi: the learner's policy, mu:
    the actor's); discounts[t] is gamma, or 0 where the episode ended at step t (which cuts the
    trace there). With rho_t = min(rho_bar, pi/mu) and c_t = min(c_bar, pi/mu):
        v_s = V(x_s) + sum_{t>=s} gamma^(t-s) (c_s ... c_{t-1}) rho_t (r_t + gamma V(x_{t+1}) -
        V(x_t))
    computed backwards as v_s - V(x_s) = rho_s delta_s + gamma c_s (v_{s+1} - V(x_{s+1})), and the
    policy gradient's advantages rho_s (r_s + gamma v_{s+1} - V(x_s)). On-policy (pi = mu) with
    rho_bar, c_bar >= 1, v_s is the n-step bootstrapped return. Returns (vs, pg_advantages), both
    without gradient."""
    with torch.no_grad():
        rhos = log_rhos.exp()
        clipped_rhos = rhos.clamp(max=rho_bar)
        cs = rhos.clamp(max=c_bar)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        vs_minus_values = torch.zeros_like(values)
        acc = torch.zeros_like(bootstrap_value)
        for t in reversed(range(len(values))):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_values[t] = acc
        vs = values + vs_minus_values
        next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])
        return vs, clipped_rhos * (rewards + discounts * next_vs - values)


def impala_loss(logprob, entropy, value, vs, pg_advantages, ent_coef, vf_coef):
    """Policy gradient -A log pi(a|s) with the V-trace advantages, value MSE to the V-trace targets,
    minus the entropy bonus, averaged over the rollout; returns (loss, statistics)."""
    pg_loss = -(pg_advantages * logprob).mean()
    v_loss = 0.5 * ((value - vs) ** 2).mean()
    entropy = entropy.mean()
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy
    stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy}
    return loss, {k: v.detach() for k, v in stats.items()}


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


class RolloutActor:
    """An actor: a vector env of num_envs copies (seeded from `seed`) and a copy of the policy,
    which samples with the actor's own generator (seeded alike). Used as a plain object
    (--num-actors 0) or as a Ray actor (a process)."""

    def __init__(self, env_id: str, num_envs: int, num_steps: int, gamma: float, seed: int):
        torch.set_num_threads(1)
        register_minatar()
        # same-step autoreset: a finished episode's last observation is in infos
        self.envs = gym.vector.SyncVectorEnv(
            [lambda: make_env(env_id)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        self.agent = Agent(
            self.envs.single_observation_space.shape, int(self.envs.single_action_space.n)
        )
        self.num_steps = num_steps
        self.gamma = gamma
        self.generator = torch.Generator().manual_seed(seed)
        self.next_obs, _ = self.envs.reset(seed=seed)
        self.episode_return = np.zeros(num_envs)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)

    # V(obs) of a numpy batch of final observations, by the actor's copy of the critic
    def value(self, obs):
        return self.agent.get_value(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    @torch.no_grad()
    def rollout(self, weights: dict, version: int) -> dict:
        """Load the policy's weights (`version`: the learner's update count when it sent them), step
        every env num_steps times. Returns numpy arrays: obs (T+1, N, *obs_shape): the T
        observations acted on and the next one; actions, logprobs (log mu(a|s) of the actor's
        policy), rewards (truncations bootstrapped with the actor's critic), dones (T, N); with the
        version and episodes: (return, length) of every episode that ended."""
        self.agent.load_state_dict(weights)
        steps = self.num_steps
        n = self.envs.num_envs
        obs = np.zeros((steps + 1, n, *self.envs.single_observation_space.shape), dtype=np.float32)
        actions = np.zeros((steps, n), dtype=np.int64)
        logprobs = np.zeros((steps, n), dtype=np.float32)
        rewards = np.zeros((steps, n), dtype=np.float32)
        dones = np.zeros((steps, n), dtype=np.float32)
        episodes = []
        for t in range(steps):
            obs[t] = self.next_obs
            action, logprob = self.agent.get_action(
                torch.as_tensor(obs[t]), generator=self.generator
            )
            actions[t] = action.numpy()
            logprobs[t] = logprob.numpy()
            self.next_obs, reward, terminated, truncated, infos = self.envs.step(actions[t])
            self.episode_return = self.episode_return + reward
            self.episode_length = self.episode_length + 1
            rewards[t] = bootstrap_time_limits(
                reward, terminated, truncated, infos, self.value, self.gamma
            )
            dones[t] = terminated | truncated
            # every finished episode of every sub-env
            for i in np.flatnonzero(terminated | truncated):
                episodes.append((float(self.episode_return[i]), int(self.episode_length[i])))
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
        obs[steps] = self.next_obs
        return {
            "obs": obs,
            "actions": actions,
            "logprobs": logprobs,
            "rewards": rewards,
            "dones": dones,
            "version": version,
            "episodes": episodes,
        }

    def close(self):
        self.envs.close()


# seconds without any rollout after which the actors are deemed stuck (the run stops)
ROLLOUT_TIMEOUT = 300.0


class ActorsFailed(Exception):
    """The actors cannot go on: an actor's replacement died before its first rollout, or no rollout
    came."""


class Actors:
    """The learner's side of the actors. request(i, weights, version) asks actor i for its next
    rollout with these weights; ready() returns (i, rollout) of the first rollout to arrive. With
    `ray` (the module, Ray started): one Ray actor per --num-actors, each in its own process.
    Without: one RolloutActor in this process, which rolls out when ready() asks. The k-th actor
    this object starts gets the env seeds seed + 1000 k on. An actor that dies is reported on stderr
    and replaced; ready() raises ActorsFailed if the replacement dies before its first rollout."""

    def __init__(self, args: Args, seed: int, ray=None):
        self.args = args
        self.seed = seed
        self.ray = ray
        self.started = 0
        self.pending = {}
        self.remote_class = ray.remote(num_cpus=1)(RolloutActor) if ray is not None else None
        self.actors = [self.new_actor() for _ in range(max(args.num_actors, 1))]
        self.replaced = [False] * len(self.actors)

    def new_actor(self):
        a = self.args
        seed = self.seed + 1000 * self.started
        self.started += 1
        if self.ray is None:
            return RolloutActor(a.env_id, a.num_envs, a.num_steps, a.gamma, seed)
        return self.remote_class.remote(a.env_id, a.num_envs, a.num_steps, a.gamma, seed)

    def request(self, i: int, weights, version: int):
        if self.ray is None:
            self.pending[i] = (i, weights, version)  # rolled out in ready()
            return
        weights = weights if isinstance(weights, self.ray.ObjectRef) else self.ray.put(weights)
        self.pending[self.actors[i].rollout.remote(weights, version)] = (i, weights, version)

    def ready(self) -> tuple[int, dict]:
        if self.ray is None:
            i, weights, version = self.pending.pop(0)
            return i, self.actors[i].rollout(weights, version)
        while True:
            done, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=ROLLOUT_TIMEOUT)
            if not done:
                raise ActorsFailed(f"no rollout came in {ROLLOUT_TIMEOUT:.0f} seconds")
            i, weights, version = self.pending.pop(done[0])
            try:
                rollout = self.ray.get(done[0])
            except self.ray.exceptions.RayActorError as e:
                if self.replaced[i]:
                    raise ActorsFailed(
                        f"actor {i} died again before its first rollout ({type(e).__name__})"
                    ) from None
                print(
                    f"actor {i} died ({type(e).__name__}); replaced by a new actor (new env seeds)",
                    file=sys.stderr,
                )
                self.actors[i] = self.new_actor()
                self.replaced[i] = True
                self.request(i, weights, version)
                continue
            self.replaced[i] = False
            return i, rollout

    def close(self):
        """Close the in-process actor's envs, or end the Ray actors and this driver's Ray
        session."""
        if self.ray is None:
            self.actors[0].close()
        else:
            self.ray.shutdown()


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy (argmax) episodes on a fresh env; returns the list of episodic returns."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        total = 0.0
        while not done:
            action, _ = agent.get_action(
                torch.as_tensor(obs[None], dtype=torch.float32, device=device), greedy=True
            )
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total = total + float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args)
    # before anything is written: an address that fails is bad input
    ray = start_ray(args) if args.num_actors else None
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    with make_env(args.env_id) as env:
        obs_shape = env.observation_space.shape
        n_actions = int(env.action_space.n)
    agent = Agent(obs_shape, n_actions).to(device)
    optimizer = (
        torch.optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=0.99, eps=0.01)
        if args.rmsprop
        else torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    )
    batch_size = args.num_envs * args.num_steps  # the steps of one rollout: one update
    num_iterations = args.total_timesteps // batch_size
    iteration = 0

    def run_eval(video_dir=None):  # evaluation episodes are seeded apart from training
        return evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    # what a checkpoint holds, saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer}
    if ckpt is not None:
        # the actors are not saved: new ones start with new env seeds
        load_states(stateful, ckpt, run_dir)
        iteration = ckpt["iteration"]
    global_step = iteration * batch_size
    logger = RunLogger(args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt)

    def weights():  # the learner's weights as the actors load them (on the CPU)
        return {k: v.cpu() for k, v in agent.state_dict().items()}

    actors = Actors(args, args.seed + global_step, ray)
    for i in range(len(actors.actors)):
        # version: the learner's update count when it sent the weights
        actors.request(i, weights(), iteration)
    for iteration in range(iteration + 1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = (
            frac * args.learning_rate if args.anneal_lr else args.learning_rate
        )
        try:
            i, rollout = actors.ready()
        except ActorsFailed as e:  # save what was learnt, and stop
            logger.save_checkpoint(stateful, iteration - 1, global_step)
            actors.close()
            logger.close_files()
            print(
                f"error: {e}; stopped at step {global_step}: resume with --resume {run_dir}",
                file=sys.stderr,
            )
            sys.exit(1)
        global_step += batch_size
        for episode_return, episode_length in rollout["episodes"]:
            logger.last_return = episode_return
            logger.log(
                global_step,
                {"train/episodic_return": episode_return, "train/episodic_length": episode_length},
            )
        # (T+1, N, *obs_shape); a copy (Ray's arrays are read-only)
        obs = torch.tensor(rollout["obs"], device=device)
        actions = torch.tensor(rollout["actions"], device=device)
        behaviour_logprob = torch.tensor(rollout["logprobs"], device=device)
        rewards = torch.tensor(rollout["rewards"], device=device)
        dones = torch.tensor(rollout["dones"], device=device)
        # the learner's
        logprob, entropy, value = (
            x.view(actions.shape)
            for x in agent.get_logprob_entropy_value(
                # policy's view of the T x N steps, as one batch
                obs[:-1].flatten(0, 1),
                actions.flatten(),
            )
        )
        bootstrap_value = agent.get_value(obs[-1]).detach()
        log_rhos = logprob.detach() - behaviour_logprob
        vs, pg_advantages = vtrace(
            log_rhos,
            args.gamma * (1.0 - dones),
            rewards,
            value.detach(),
            bootstrap_value,
            args.rho_bar,
            args.c_bar,
        )
        loss, stats = impala_loss(
            logprob, entropy, value, vs, pg_advantages, args.ent_coef, args.vf_coef
        )
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        actors.request(i, weights(), iteration)  # this actor's next rollout, with the new weights
        # importance weights truncated
        stats["clipfrac"] = (log_rhos.exp() > args.rho_bar).float().mean()
        logger.log(
            global_step,
            {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "charts/policy_lag": iteration - 1 - rollout["version"],
                **{f"losses/{k}": v for k, v in stats.items()},
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
        if logger.stop_requested:  # Ctrl-C: the update it came in is finished and saved
            actors.close()
            logger.exit_interrupted()
    actors.close()
    video_dir = run_dir / "videos" if args.capture_video else None
    eval_returns = logger.evaluate(global_step, lambda: run_eval(video_dir))
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if args.save_model:
        save_model(
            {
                "agent": agent.state_dict(),
                "args": asdict(args),
                "eval_returns": eval_returns,
                "obs_shape": list(obs_shape),
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
            "ppo_continuous.py",
        )
    if args.env_id in MINATAR:
        if args.capture_video:
            fail("MinAtar games record no video: drop --capture-video")
    elif not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(
            f"{SCRIPT} needs flat vector observations or a MinAtar game "
            f"(MinAtar/<Game>-v1) but {args.env_id} has {obs_space}",
            "ppo_atari.py",
        )
    check_ranges(
        args,
        {
            "num_actors": "x >= 0",
            "num_envs": "x >= 1",
            "num_steps": "x >= 1",
            "learning_rate": "x > 0",
            "gamma": "0 <= x <= 1",
            "rho_bar": "x > 0",
            "c_bar": "x > 0",
            "ent_coef": "x >= 0",
            "vf_coef": "x >= 0",
            "max_grad_norm": "x > 0",
        },
    )
    batch = args.num_envs * args.num_steps
    if args.total_timesteps < batch:
        fail(
            f"--total-timesteps {args.total_timesteps} is less "
            f"than one rollout (num_envs*num_steps = {batch})"
        )
    # RAY_ADDRESS alone is the environment's: 0 actors need no Ray
    if args.ray_address and not args.num_actors:
        fail(f"--ray-address {args.ray_address} needs --num-actors 1 or more (0 runs without Ray)")
    address = ray_address(args)
    if args.num_actors and address:
        check_ray_address(address)


def check_ray_address(address: str, timeout: float = 5.0):
    """fail() unless address answers as a Ray cluster's head, within seconds: ray.init retries for
    minutes against a port that is closed or speaks another protocol (an HTTP server). The head's
    GCS is a gRPC server that knows GetClusterId (it may refuse a driver without a token: ray.init
    then says so); ray:// (Ray Client) needs a gRPC server."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        fail(f"--ray-address {address!r} is not host:port")
    try:
        socket.create_connection((host, int(port)), timeout).close()
    except OSError as e:
        fail(f"cannot reach a Ray cluster at {address}: {e.strerror or e}")
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "false"):
        return  # a TLS cluster: this plain-text probe cannot speak to it, ray.init can
    import grpc  # gRPC for Python comes with tensorboard

    not_ray = f"{address} does not answer as a Ray cluster (is it the port of `ray start --head`?)"
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)  # an HTTP/2 (gRPC) server at all
        if not address.startswith("ray://"):
            channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")(b"", timeout=timeout)
    except grpc.FutureTimeoutError:
        fail(f"{not_ray}: no gRPC server there")
    except grpc.RpcError as e:
        if e.code() in (
            grpc.StatusCode.UNIMPLEMENTED,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ):
            fail(f"{not_ray}: its gRPC server has no Ray GCS ({e.code().name})")
    finally:
        channel.close()


def ray_address(args: Args) -> str | None:
    """--ray-address, else RAY_ADDRESS, else None (a local Ray)."""
    return args.ray_address or os.environ.get("RAY_ADDRESS") or None


def start_ray(args: Args):
    """Join the Ray cluster at ray_address(args), or start a local Ray of num_actors CPUs (the
    actors' processes; the learner is this process). Returns the ray module; a cluster that refuses
    this driver is a one-line error."""
    address = ray_address(args)
    token = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    if (
        address
        and "RAY_AUTH_MODE" not in os.environ
        and (os.environ.get("RAY_AUTH_TOKEN") or Path(token).is_file())
    ):
        # what `ray start` turned on where it found the token (read at import)
        os.environ["RAY_AUTH_MODE"] = "token"
    import ray

    quiet = dict(log_to_driver=False, configure_logging=False)
    if address is None:  # "local": a new Ray here, even where an earlier `ray start` runs one
        ray.init(address="local", num_cpus=args.num_actors, include_dashboard=False, **quiet)
        return ray
    try:  # an existing cluster brings its own resources
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        fail(f"cannot join the Ray cluster at {address}: {str(e).strip().splitlines()[0]}")
    return ray


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
