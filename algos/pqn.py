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

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from canonrl.envs import MINATAR, register_minatar
from canonrl.run import (
    RNGs,
    RunArgs,
    RunLogger,
    check_ranges,
    env_spaces,
    fail,
    load_states,
    start_run,
)

SCRIPT = Path(__file__).name


@dataclass
class Args(RunArgs):
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
    args, ckpt, run_dir = start_run(args, check_args, __file__)
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
    logger = RunLogger(
        args, run_dir, num_iterations * batch_size, global_step, ckpt=ckpt, script=__file__
    )

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
                logger.log_episode(global_step, episode_return[i], episode_length[i])
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
        logger.end_iteration(stateful, iteration, global_step, run_eval)
    envs.close()
    logger.finish(
        stateful,
        num_iterations,
        global_step,
        run_eval,
        model={"q_network": q_network.state_dict(), "obs_shape": obs_shape, "n_actions": n_actions},
    )


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
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
    check_ranges(args, {"q_lambda": "0 <= x <= 1"})
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


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
