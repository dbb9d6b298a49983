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

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from canonrl.envs import MINATAR, register_minatar
from canonrl.run import RunArgs, RunLogger, check_ranges, env_spaces, fail, load_states, start_run

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
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


register_minatar()  # the MinAtar/<Game>-v1 ids


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
    args, ckpt, run_dir = start_run(args, check_args, __file__)
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
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

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
            logger.log_episode(global_step, episode_return, episode_length)
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
        if logger.stops_after(global_step):  # Ctrl-C, --stop-at: the actors stop before the exit
            actors.close()
        logger.end_iteration(stateful, iteration, global_step, run_eval)
    actors.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"agent": agent.state_dict(), "obs_shape": list(obs_shape), "n_actions": n_actions},
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
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
    check_ranges(args, {"num_actors": "x >= 0", "rho_bar": "x > 0", "c_bar": "x > 0"})
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


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
