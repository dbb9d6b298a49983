"""Double DQN on Atari (ALE/Breakout-v5 by default) and MinAtar: dqn_atari.py, van Hasselt's target.

van Hasselt, Guez and Silver 2016, "Deep Reinforcement Learning with Double Q-learning": DQN's
max_a' Q_target(s', a') picks and values the next action with the same noisy estimates (biased
upwards); Double DQN picks it online and values it with the target: r + gamma Q_target(s', argmax_a'
Q(s', a')) (eq. 4, double_q_target). `diff dqn_atari.py ddqn_atari.py` shows only that. The paper's
tuned variant adds `--target-network-frequency 7500 --end-e 0.01`.

Run:    python algos/ddqn_atari.py --env-id ALE/Breakout-v5 --seed 1 --cuda
Quick:  python algos/ddqn_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 2000 \
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
    learning_rate: float = 1e-4
    """Adam learning rate"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0"""
    buffer_size: int = 1_000_000
    """replay capacity in 84x84 uint8 frames (a step each, an episode 1 more); 1M: 6.6 GiB"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate (1.0: a hard copy)"""
    target_network_frequency: int = 1000
    """env steps between target network updates"""
    batch_size: int = 32
    """replay minibatch size"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.01
    """final exploration epsilon"""
    exploration_fraction: float = 0.10
    """fraction of total_timesteps over which epsilon goes from start_e to end_e"""
    learning_starts: int = 80_000
    """env steps before learning starts"""
    train_frequency: int = 4
    """vector-env steps between training phases"""
    gradient_steps: int = 1
    """gradient updates per training phase"""
    eval_epsilon: float = 0.05
    """epsilon of the evaluation games (Nature DQN's; 0: greedy)"""
    compile: bool = False
    """torch.compile the loss and its backward: ~1.6x faster updates on a CPU, ~30 s to compile"""
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
    64 4x4 stride 2 -> 64 3x3 stride 1 -> 512 -> one Q-value per action, ReLU; PyTorch's default
    init."""

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

    def get_greedy_action(self, x):
        """argmax_a Q(x, a): the exploiting action of the rollout and the policy that evaluate()
        runs."""
        return self(x).argmax(dim=-1)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int):
    return max(end_e, start_e + (end_e - start_e) * t / duration)


def double_q_target(online_q_next, target_q_next, rewards, terminated, gamma):
    """Double Q-learning target r + gamma * Q_target(s', argmax_a' Q(s', a')) (van Hasselt et al.
    2016, eq. 4): the online network picks the next action, the target network values it; only
    termination stops the bootstrap."""
    next_actions = online_q_next.argmax(dim=1, keepdim=True)
    return rewards + gamma * target_q_next.gather(1, next_actions).squeeze(1) * (1.0 - terminated)


def q_loss(q_network, target_network, b_obs, b_next_obs, b_actions, b_rewards, b_terminated, gamma):
    """The squared TD error of the Q-values of the actions taken (MSE, as CleanRL); returns (loss,
    those Q-values)."""
    with torch.no_grad():
        target = double_q_target(
            q_network(b_next_obs), target_network(b_next_obs), b_rewards, b_terminated, gamma
        )
    q_pred = q_network(b_obs).gather(1, b_actions[:, None]).squeeze(1)
    return F.mse_loss(q_pred, target), q_pred


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
    q_network = QNetwork(n_actions).to(device)
    target_network = QNetwork(n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    # fused: 4x faster step
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    loss_fn = torch.compile(q_loss) if args.compile else q_loss
    rng = np.random.default_rng(args.seed)  # exploration and replay sampling
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_shape, rng)
    num_iterations = args.total_timesteps // args.num_envs  # one iteration = one step of every env
    iteration = 0

    def run_eval(video_dir=None):  # evaluation games are seeded apart from training
        return evaluate(
            q_network,
            args.env_id,
            args.eval_episodes,
            args.seed + 100_000,
            device,
            args.eval_epsilon,
            video_dir,
        )

    stateful = {
        "q_network": q_network,
        "target_network": target_network,
        "optimizer": optimizer,
        "rb": rb,
        "rng": RNGs(rng),
    }  # what a checkpoint holds, saved and resumed
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
    for iteration in range(iteration, num_iterations):
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        actions = rng.integers(0, n_actions, args.num_envs)
        # the network is asked only where it acts
        exploit = rng.random(args.num_envs) >= epsilon
        if exploit.any():
            with torch.no_grad():
                greedy = q_network.get_greedy_action(torch.as_tensor(obs, device=device))
            actions = np.where(exploit, greedy.cpu().numpy(), actions)
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
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (
                    1.0 - iteration / num_iterations
                )
            for _ in range(args.gradient_steps):
                loss, q_pred = loss_fn(
                    q_network, target_network, *rb.sample(args.batch_size, device), args.gamma
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            # every ~100 updates
            if (iteration // args.train_frequency) % max(1, 100 // args.gradient_steps) == 0:
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
            global_step > args.learning_starts
            and global_step % args.target_network_frequency < args.num_envs
        ):
            soft_update(target_network, q_network, args.tau)
        logger.end_iteration(stateful, iteration + 1, global_step, run_eval)
    envs.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"q_network": q_network.state_dict(), "n_actions": n_actions},
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
    check_ranges(args)
    check_replay_flags(args)
    if args.buffer_size < 8 * args.num_envs:
        fail(
            f"--buffer-size {args.buffer_size} must be at "
            f"least 8 per env (--num-envs {args.num_envs})"
        )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
