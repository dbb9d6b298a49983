"""SAC for discrete actions on Atari (ALE/Breakout-v5 by default) and MinAtar.

Christodoulou 2019, "Soft Actor-Critic for Discrete Action Settings": with a categorical policy the
expectations over actions are exact sums: V(s') (eq. 10), the actor loss (eq. 12, summed over
actions; CleanRL averages) and the temperature loss towards 0.89 log(#actions) (eq. 11). Separate
Nature CNNs; CleanRL's settings, but alpha starts at 0.2; the rest is dqn_atari.py's; evaluation is
greedy.

Run:    python algos/sac_atari.py --env-id ALE/Breakout-v5 --seed 1 --cuda
Quick:  python algos/sac_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 2000 \
            --learning-starts 1000 --buffer-size 2000
Results: benchmark/references.toml
"""

from dataclasses import dataclass
from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from stable_baselines3.common.atari_wrappers import AtariWrapper

from canonrl.envs import register_minatar
from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_ranges,
    check_replay_flags,
    env_spaces,
    fail,
    load_states,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
    learning_rate: float = 3e-4
    """Adam learning rate of the actor, the Q-functions and the temperature"""
    adam_eps: float = 1e-4
    """Adam epsilon (CleanRL's sac_atari.py)"""
    buffer_size: int = 1_000_000
    """replay capacity in 84x84 uint8 frames (a step each, an episode 1 more); 1M: 6.6 GiB"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate (1.0: a hard copy)"""
    target_network_frequency: int = 8000
    """env steps between target network updates"""
    batch_size: int = 64
    """replay minibatch size"""
    learning_starts: int = 20_000
    """env steps of uniformly random actions before learning starts"""
    train_frequency: int = 4
    """vector-env steps between training phases"""
    gradient_steps: int = 1
    """gradient updates per training phase"""
    alpha: float = 0.2
    """entropy temperature: fixed, or its initial value with --autotune"""
    autotune: bool = True
    """tune the temperature towards the target entropy (eq. 11)"""
    target_entropy_scale: float = 0.89
    """target entropy = this times log(#actions), the uniform policy's entropy"""
    eval_epsilon: float = 0.0
    """epsilon of the evaluation games (0: greedy)"""
    env_id: str = "ALE/Breakout-v5"
    """an Atari game: ALE/<Game>-v5 (sticky actions) or <Game>NoFrameskip-v4"""
    total_timesteps: int = 10_000_000
    """environment steps over all envs (agent steps: 4 frames each)"""
    num_envs: int = 1
    """parallel environments (one synchronous vector env)"""


register_minatar()  # the MinAtar/<Game>-v1 ids


# ---- shared: atari/make_env ----
gym.register_envs(ale_py)  # the ALE/<Game>-v5 and <Game>NoFrameskip-v4 ids


def minatar_frame(obs):
    """A MinAtar observation (10, 10, channels) of booleans drawn as an 84x84 gray frame: channel c
    at gray level (c + 1) * 255 // channels (the highest wins where objects overlap), each cell 8x8
    pixels, a 2-pixel black border."""
    levels = np.arange(1, obs.shape[-1] + 1, dtype=np.uint8) * (255 // obs.shape[-1])
    return np.pad(np.kron((obs * levels).max(-1), np.ones((8, 8), np.uint8)), 2)


def make_env(env_id, video_dir=None):
    """An Atari game as Stable-Baselines3's AtariWrapper preprocesses it (up to 30 no-ops at reset,
    each action repeated for 4 frames with a max over the last two, a lost life ends the episode
    (not the game), FIRE at reset, 84x84 grayscale, rewards clipped to their sign), or a MinAtar
    game drawn as 84x84 frames; then stacks of the last 4 frames. ALE/<Game>-v5 ids are made with
    frameskip=1 (the wrapper skips) and keep v5's sticky actions (repeat_action_probability 0.25,
    Machado et al. 2018); <Game>NoFrameskip-v4 ids have none (CleanRL's setting). info["episode"]
    (RecordEpisodeStatistics beneath the wrapper) holds the unclipped score of a whole game (all
    lives). With video_dir, game 0 is recorded there as eval-episode-0.mp4 (--capture-video)."""
    # 10x10 games as frames for the same CNN and frame stack (no Atari wrapper)
    if env_id.startswith("MinAtar/"):
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        env = gym.wrappers.TransformObservation(
            env, minatar_frame, gym.spaces.Box(0, 255, (84, 84), np.uint8)
        )
        return gym.wrappers.FrameStackObservation(env, 4)
    if video_dir is None:
        env = gym.make(env_id, frameskip=1)  # the wrapper skips frames (v5's sticky actions stay)
    else:  # the raw game, before the preprocessing: the video shows what a player sees
        env = gym.wrappers.RecordVideo(
            gym.make(env_id, frameskip=1, render_mode="rgb_array"),
            str(video_dir),
            lambda ep: ep == 0,
            name_prefix="eval",
            disable_logger=True,
        )
    # beneath the wrapper: the unclipped score of a whole game
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = AtariWrapper(env)
    env = gym.wrappers.ReshapeObservation(env, (84, 84))
    # at reset, padded with the first frame repeated
    return gym.wrappers.FrameStackObservation(env, 4)


# ---- end shared: atari/make_env ----


class QNetwork(nn.Module):
    """Nature DQN's CNN: uint8 stacks (N, 4, 84, 84) scaled to [0, 1] -> 32 8x8 filters stride 4 ->
    64 4x4 stride 2 -> 64 3x3 stride 1 -> 512 -> one soft Q-value per action, ReLU; PyTorch's
    default init."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, x):
        return self.network(x / 255.0)


class Actor(QNetwork):
    """The same network, its outputs read as one logit per action: a categorical policy (its own
    weights)."""

    def get_action(self, x):
        """(a sampled action, the log-probabilities and probabilities of every action): (batch,),
        (batch, actions)."""
        logits = self(x)
        action = torch.distributions.Categorical(logits=logits, validate_args=False).sample()
        return action, F.log_softmax(logits, dim=1), F.softmax(logits, dim=1)

    def get_greedy_action(self, x):
        """The most probable action (argmax of the logits): the policy that evaluate() runs."""
        return self(x).argmax(dim=-1)


class Temperature(nn.Module):
    """The entropy temperature alpha, learnt as log alpha (it stays positive)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.full((1,), float(np.log(alpha))))


def sac_discrete_target(
    next_probs, next_log_probs, next_q1, next_q2, rewards, terminated, gamma, alpha
):
    """Soft Bellman target r + gamma * V(s'), V(s') = sum_a pi(a|s') [min(Q1', Q2')(s', a) - alpha
    log pi(a|s')]: the expectation over the next action is exact (eq. 10); only termination stops
    the bootstrap. (batch,)."""
    next_v = (next_probs * (torch.min(next_q1, next_q2) - alpha * next_log_probs)).sum(dim=1)
    return rewards + gamma * (1.0 - terminated) * next_v


def actor_loss_fn(probs, log_probs, min_q, alpha):
    """J(pi) = E_s [sum_a pi(a|s) (alpha log pi(a|s) - min(Q1, Q2)(s, a))] (eq. 12); min_q carries
    no gradient."""
    return (probs * (alpha * log_probs - min_q)).sum(dim=1).mean()


def temperature_loss(log_alpha, probs, log_probs, target_entropy):
    """J(alpha) = E_s [sum_a pi(a|s) (-alpha (log pi(a|s) + target entropy))] (eq. 11): alpha grows
    when the policy's entropy falls below the target and shrinks when it exceeds it."""
    return -(log_alpha.exp() * (probs * (log_probs + target_entropy)).detach().sum(dim=1)).mean()


# ---- shared: atari/ReplayBuffer ----
class ReplayBuffer:
    """A replay buffer of frame stacks that stores each frame once: a ring of slots per env, each
    slot holding a frame (the newest of an observation), how many steps into its episode it came,
    and the step taken from it (action, reward, terminated). An episode's first frame gets a slot of
    its own (add's `first`), and its last slot holds the true final observation's frame (cut by a
    time limit or not) with no step taken from it: next_obs is always the stack ending one slot
    later. A stack never reaches back past its episode's first frame, which pads it as
    FrameStackObservation pads at reset. Only `terminated` stops the bootstrap. Checkpointable
    through state_dict()."""

    FIELDS = ("frames", "steps", "actions", "rewards", "terminated", "valid")

    def __init__(self, size: int, num_envs: int, obs_shape: tuple, rng: np.random.Generator):
        self.size = size // num_envs  # slots per env
        self.n_stack = obs_shape[0]  # frames per stack
        self.frames = np.zeros((num_envs, self.size, *obs_shape[1:]), np.uint8)
        self.steps = np.zeros((num_envs, self.size), np.int64)
        self.actions = np.zeros((num_envs, self.size), np.int64)
        self.rewards = np.zeros((num_envs, self.size), np.float32)
        self.terminated = np.zeros((num_envs, self.size), np.float32)
        # a step was taken from the slot and all its frames are kept
        self.valid = np.zeros((num_envs, self.size), bool)
        self.pos = np.zeros(num_envs, np.int64)
        self.full = np.zeros(num_envs, bool)
        self.rng = rng

    def write(self, env: int, frame, step: int):
        """Store a frame at env's cursor; the stacks of the oldest steps that reached back to the
        frame it held go."""
        p = self.pos[env]
        k = np.arange(1, self.n_stack)
        # the stacks of the steps k slots on reach back to p if their episode was k old
        ahead = (p + k) % self.size
        self.valid[env, p] = False  # no step taken from p yet
        self.valid[env, ahead] &= self.steps[env, ahead] < k
        self.frames[env, p] = frame
        self.steps[env, p] = step
        self.pos[env] = (p + 1) % self.size
        self.full[env] = self.full[env] or p + 1 == self.size

    def add(self, obs, next_obs, actions, rewards, terminated, first):
        """One step of every env. obs[i]'s newest frame is stored already (as the last next_obs)
        unless first[i]: obs[i] starts an episode."""
        for i in range(len(obs)):
            if first[i]:
                self.write(i, obs[i, -1], 0)
            t = (self.pos[i] - 1) % self.size  # the slot of obs[i]
            self.actions[i, t] = actions[i]
            self.rewards[i, t] = rewards[i]
            self.terminated[i, t] = terminated[i]
            self.write(i, next_obs[i, -1], self.steps[i, t] + 1)
            self.valid[i, t] = True

    def stacks(self, env, slot):
        """The stacks ending at slot[k] of env[k]'s ring; the frames before an episode's first are
        that first one."""
        # (batch, n_stack)
        back = np.minimum(np.arange(self.n_stack - 1, -1, -1), self.steps[env, slot][:, None])
        return self.frames[env[:, None], (slot[:, None] - back) % self.size]

    def sample(self, batch_size: int, device):
        """A uniform minibatch (obs, next_obs, actions, rewards, terminated) as tensors on
        `device`."""
        env = self.rng.integers(0, len(self.pos), batch_size)
        filled = np.where(self.full, self.size, self.pos)[env]
        slot = self.rng.integers(0, filled)
        # draw again where no step starts (episodes' last slots)
        ok = self.valid[env, slot]
        while not ok.all():
            slot[~ok] = self.rng.integers(0, filled[~ok])
            ok = self.valid[env, slot]
        batch = (
            self.stacks(env, slot),
            self.stacks(env, (slot + 1) % self.size),
            self.actions[env, slot],
            self.rewards[env, slot],
            self.terminated[env, slot],
        )
        return [torch.as_tensor(x, device=device) for x in batch]

    # tensors: torch.save pickles numpy arrays, and its pickle protocol stops at 4 GiB
    def state_dict(self):
        return {
            name: torch.from_numpy(getattr(self, name)) for name in (*self.FIELDS, "pos", "full")
        }

    def load_state_dict(self, state):
        for name, value in state.items():
            setattr(self, name, value.numpy())


# ---- end shared: atari/ReplayBuffer ----


# ---- shared: atari/evaluate ----
@torch.no_grad()
def evaluate(
    agent, env_id, episodes, seed, device="cpu", epsilon=Args.eval_epsilon, video_dir=None
):
    """Whole games (all lives) on a fresh env preprocessed as in training: a random action with
    probability epsilon (--eval-epsilon: 0.05, Nature DQN's evaluation, in the Q-learning scripts; 0
    in sac_atari.py), else agent.get_greedy_action; returns the list of unclipped game scores. With
    video_dir, game 0 is recorded there."""
    env = make_env(env_id, video_dir)
    rng = np.random.default_rng(seed)
    returns = []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        while "episode" not in info:  # RecordEpisodeStatistics's record of the game, when it ends
            if rng.random() < epsilon:
                action = int(rng.integers(env.action_space.n))
            else:
                action = int(agent.get_greedy_action(torch.as_tensor(obs, device=device)[None]))
            obs, _, terminated, truncated, info = env.step(action)
            if (terminated or truncated) and "episode" not in info:  # a life lost: the game goes on
                obs, _ = env.reset()
        returns.append(float(info["episode"]["r"]))
    env.close()
    return returns


# ---- end shared: atari/evaluate ----


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging, parameter by parameter: target <- tau * online + (1 - tau) * target
    (tau = 1: a copy)."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


def main(args: Args):
    args, ckpt, run_dir = start_run(args, check_args, __file__)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    actor = Actor(n_actions).to(device)
    qf1 = QNetwork(n_actions).to(device)
    qf2 = QNetwork(n_actions).to(device)
    qf1_target = QNetwork(n_actions).to(device)
    qf2_target = QNetwork(n_actions).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = torch.optim.Adam(
        [*qf1.parameters(), *qf2.parameters()], lr=args.learning_rate, eps=args.adam_eps, fused=True
    )  # fused: 4x faster step
    actor_optimizer = torch.optim.Adam(
        actor.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True
    )
    # a share of the uniform policy's entropy
    target_entropy = args.target_entropy_scale * float(np.log(n_actions))
    temperature = Temperature(args.alpha).to(device)
    alpha_optimizer = torch.optim.Adam(
        temperature.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True
    )
    # random actions before learning starts and replay sampling
    rng = np.random.default_rng(args.seed)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_shape, rng)
    num_iterations = args.total_timesteps // args.num_envs  # one iteration = one step of every env
    iteration = 0

    def run_eval(video_dir=None):  # evaluation games are seeded apart from training
        return evaluate(
            actor,
            args.env_id,
            args.eval_episodes,
            args.seed + 100_000,
            device,
            args.eval_epsilon,
            video_dir,
        )

    stateful = {
        "actor": actor,
        "qf1": qf1,
        "qf2": qf2,
        "qf1_target": qf1_target,
        "qf2_target": qf2_target,
        "q_optimizer": q_optimizer,
        "actor_optimizer": actor_optimizer,
        "temperature": temperature,
        "alpha_optimizer": alpha_optimizer,
        "rb": rb,
        # what a checkpoint holds, saved and resumed; torch's RNG: the policy's samples
        "rng": RNGs(rng),
    }
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    global_step = iteration * args.num_envs
    logger = RunLogger(
        args, run_dir, num_iterations * args.num_envs, global_step, ckpt=ckpt, script=__file__
    )

    obs, _ = envs.reset(seed=args.seed + global_step)  # a resumed run starts fresh episodes
    # obs starts an episode (the buffer then stores its newest frame)
    first = np.ones(args.num_envs, dtype=bool)
    # steps of the game (all its lives) each env is playing
    game_length = np.zeros(args.num_envs, dtype=np.int64)
    alpha = temperature.log_alpha.detach().exp()  # a tensor: reading it never waits for the host
    for iteration in range(iteration, num_iterations):
        if global_step < args.learning_starts:  # uniform random actions fill the buffer first
            actions = rng.integers(0, n_actions, args.num_envs)
        else:
            with torch.no_grad():
                actions, _, _ = actor.get_action(torch.as_tensor(obs, device=device))
            actions = actions.cpu().numpy()
        # ---- shared: atari/step ----
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        # same-step autoreset: store the true last observation, not the reset one
        real_next_obs = next_obs.copy()
        for i in np.flatnonzero(infos.get("_final_obs", [])):
            real_next_obs[i] = infos["final_obs"][i]
        rb.add(obs, real_next_obs, actions, rewards, terminated, first)
        # right after rb.add: on Ctrl-C the steps counted are the steps stored
        global_step += args.num_envs
        # an episode ends with a life; a game with the last one
        obs = next_obs
        first = terminated | truncated
        game_length += 1
        # RecordEpisodeStatistics's unclipped score of each game that ended
        games = infos.get("final_info", {})
        for i in np.flatnonzero(games.get("_episode", [])):  # every finished game of every sub-env
            logger.log_episode(global_step, games["episode"]["r"][i], game_length[i])
            game_length[i] = 0
        # the bar moves before learning too
        if global_step <= args.learning_starts and iteration % 1000 == 0:
            logger.progress(global_step)
        # ---- end shared: atari/step ----

        if global_step > args.learning_starts and iteration % args.train_frequency == 0:
            for _ in range(args.gradient_steps):
                b_obs, b_next_obs, b_actions, b_rewards, b_terminated = rb.sample(
                    args.batch_size, device
                )
                with torch.no_grad():
                    _, next_log_probs, next_probs = actor.get_action(b_next_obs)
                    target = sac_discrete_target(
                        next_probs,
                        next_log_probs,
                        qf1_target(b_next_obs),
                        qf2_target(b_next_obs),
                        b_rewards,
                        b_terminated,
                        args.gamma,
                        alpha,
                    )
                q1 = qf1(b_obs)
                q2 = qf2(b_obs)
                q1_taken = q1.gather(1, b_actions[:, None]).squeeze(1)
                q2_taken = q2.gather(1, b_actions[:, None]).squeeze(1)
                qf_loss = F.mse_loss(q1_taken, target) + F.mse_loss(q2_taken, target)
                q_optimizer.zero_grad()
                qf_loss.backward()
                q_optimizer.step()

                _, log_probs, probs = actor.get_action(b_obs)
                with torch.no_grad():  # the Q-functions just updated
                    min_q = torch.min(qf1(b_obs), qf2(b_obs))
                actor_loss = actor_loss_fn(probs, log_probs, min_q, alpha)
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()
                if args.autotune:
                    alpha_loss = temperature_loss(
                        temperature.log_alpha, probs, log_probs, target_entropy
                    )
                    alpha_optimizer.zero_grad()
                    alpha_loss.backward()
                    alpha_optimizer.step()
                    alpha = temperature.log_alpha.detach().exp()
            # every ~100 updates
            if (iteration // args.train_frequency) % max(1, 100 // args.gradient_steps) == 0:
                logger.log(
                    global_step,
                    {
                        "losses/qf_loss": qf_loss / 2,
                        "losses/qf_values": (q1_taken.mean() + q2_taken.mean()) / 2,
                        "losses/actor_loss": actor_loss,
                        "charts/alpha": alpha,
                        **({"losses/alpha_loss": alpha_loss} if args.autotune else {}),
                    },
                )
                logger.progress(global_step)
        if (
            global_step > args.learning_starts
            and global_step % args.target_network_frequency < args.num_envs
        ):
            soft_update(qf1_target, qf1, args.tau)
            soft_update(qf2_target, qf2, args.tau)
        logger.end_iteration(stateful, iteration + 1, global_step, run_eval)
    envs.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"actor": actor.state_dict(), "n_actions": n_actions},
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "sac_continuous.py",
            "td3_continuous.py",
        )
    pixels = gym.spec(args.env_id).entry_point in ("ale_py.env:AtariEnv", "minatar.gym:BaseEnv")
    if not pixels or len(obs_space.shape) != 3:
        fail(
            f"{SCRIPT} needs an Atari game with image observations "
            "(ALE/<Game>-v5 or <Game>NoFrameskip-v4) or a MinAtar "
            f"game (MinAtar/<Game>-v1) but {args.env_id} is not one",
            "dqn.py",
        )
    if args.capture_video and args.env_id.startswith("MinAtar/"):
        fail("MinAtar games record no video: drop --capture-video")
    check_ranges(args, {"alpha": "x > 0", "target_entropy_scale": "0 <= x <= 1"})
    check_replay_flags(args)
    if args.buffer_size < 8 * args.num_envs:
        fail(
            f"--buffer-size {args.buffer_size} must be at "
            f"least 8 per env (--num-envs {args.num_envs})"
        )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
