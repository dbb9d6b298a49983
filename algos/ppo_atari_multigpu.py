"""PPO on Atari (ALE/Breakout-v5 by default) across processes: ppo_atari.py under torchrun.

ppo_atari.py's algorithm and defaults. Each rank (one per GPU, or CPU process) steps its own
--num-envs envs and the gradients are averaged over ranks before each step: an update's batch is
world_size x num_envs x num_steps, and the global step counts all ranks' steps. Rank 0 alone logs,
evaluates and writes the run (see the comment below main). NCCL between GPUs with --cuda,
gloo between CPU processes without it.

Run:    torchrun --standalone --nproc_per_node=2 algos/ppo_atari_multigpu.py --seed 1 --cuda
Quick:  torchrun --standalone --nproc_per_node=2 algos/ppo_atari_multigpu.py \
            --total-timesteps 4096 --eval-episodes 2
Results: benchmark/references.toml
"""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from stable_baselines3.common.atari_wrappers import AtariWrapper
from torch.distributions import Categorical

from canonrl.distributed import Ranks
from canonrl.run import (
    RNGs,
    RunArgs,
    check_ranges,
    env_spaces,
    fail,
    load_states,
    save_model,
    start_run,
)

SCRIPT = Path(__file__).name

gym.register_envs(ale_py)  # the ALE/<Game>-v5 and <Game>NoFrameskip-v4 ids


@dataclass
class Args(RunArgs):
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    anneal_clip: bool = False
    """anneal the clip coefficient linearly to 0"""
    num_steps: int = 128
    """steps per env per rollout"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of GAE"""
    num_minibatches: int = 4
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 4
    """epochs over each rollout"""
    clip_coef: float = 0.1
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's values by the clip coefficient (ppo2, CleanRL)"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient norm clip"""
    compile: bool = False
    """torch.compile the loss and its backward: ~1.4x faster updates on a CPU, ~15 s to compile"""
    target_kl: float | None = None
    """stop the epochs of an update early when the approximate KL exceeds this"""
    env_id: str = "ALE/Breakout-v5"
    """an Atari game: ALE/<Game>-v5 (sticky actions) or <Game>NoFrameskip-v4"""
    total_timesteps: int = 10_000_000
    """environment steps over all envs of all ranks (agent steps: 4 frames each)"""
    num_envs: int = 8
    """parallel environments of each rank (one synchronous vector env per rank)"""


def make_env(env_id, video_dir=None):
    """env_id preprocessed; with video_dir, game 0 is recorded there, unprocessed, as
    eval-episode-0.mp4."""
    # v5's sticky actions
    env = gym.make(env_id, frameskip=1, render_mode=None if video_dir is None else "rgb_array")
    if video_dir is not None:  # the raw game, every frame: what a viewer wants to see
        env = gym.wrappers.RecordVideo(
            env, str(video_dir), lambda ep: ep == 0, name_prefix="eval", disable_logger=True
        )
    # beneath the wrapper: the unclipped score of a whole game
    env = gym.wrappers.RecordEpisodeStatistics(env)
    # no-ops, skip 4 and max-pool, a lost life ends the episode, FIRE, 84x84 gray, clip
    env = AtariWrapper(env)
    env = gym.wrappers.ReshapeObservation(env, (84, 84))
    # at reset, padded with the first frame repeated
    return gym.wrappers.FrameStackObservation(env, 4)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature DQN's CNN shared by both heads, as in CleanRL and SB3: uint8 stacks (N, 4, 84, 84)
    scaled to [0, 1] -> 32 8x8 filters stride 4 -> 64 4x4 stride 2 -> 64 3x3 stride 1 -> 512 (ReLU)
    -> logits / value."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        # std 0.01: a near-uniform first policy
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0)).squeeze(-1)

    def get_greedy_action(self, x):
        """The most probable action: the policy that evaluate() runs."""
        return self.actor(self.network(x / 255.0)).argmax(dim=-1)

    def get_action_and_value(self, x, action=None):
        """Sample an action (or take the given one); return it with its log-probability, the entropy
        and V(x)."""
        hidden = self.network(x / 255.0)
        dist = Categorical(logits=self.actor(hidden), validate_args=False)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden).squeeze(-1)


# ---- shared: gae/compute_gae ----
def compute_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """GAE (Schulman et al. 2016, eq. 16) on tensors of shape (T, N). dones[t]: the episode ended at
    step t (terminated or truncated; a truncation was already bootstrapped into rewards[t]). Returns
    (advantages, returns)."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        next_values = next_value if t == len(rewards) - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * nonterminal - values[t]
        advantages[t] = last = delta + gamma * gae_lambda * nonterminal * last
    return advantages, advantages + values


# ---- end shared: gae/compute_gae ----


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


# ---- shared: ppo/ppo_loss ----
def ppo_loss(
    logprob,
    entropy,
    value,
    old_logprobs,
    old_values,
    advantages,
    returns,
    clip_coef,
    ent_coef,
    vf_coef,
    clip_vloss: float | None = None,
    mask=None,
):
    """Clipped surrogate objective (PPO paper, eq. 7) + value MSE - entropy bonus, from a
    minibatch's new log-probabilities, entropies and values; returns (loss, statistics). clip_vloss:
    the value error is the larger of V's and that of V kept within clip_vloss of old_values
    (baselines' ppo2, CleanRL); None: not clipped. mask: each term averaged over the entries where
    it is 1 only (multi-agent: living agents); None: over all."""
    mean = (
        (lambda x: x.mean())
        if mask is None
        else (lambda x: (x * mask).sum() / mask.sum().clamp(min=1))
    )
    logratio = logprob - old_logprobs
    ratio = logratio.exp()
    pg_loss = -mean(
        torch.min(advantages * ratio, advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    )
    v_error = (value - returns) ** 2
    if clip_vloss is not None:
        v_error = torch.max(
            v_error,
            (old_values + (value - old_values).clamp(-clip_vloss, clip_vloss) - returns) ** 2,
        )
    v_loss = 0.5 * mean(v_error)
    entropy = mean(entropy)
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy
    # approx_kl: the k3 estimator of Schulman's note "Approximating KL divergence"
    with torch.no_grad():
        stats = {
            "policy_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": mean((ratio - 1) - logratio),
            "clipfrac": mean(((ratio - 1).abs() > clip_coef).float()),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


# ---- end shared: ppo/ppo_loss ----


def minibatch_loss(
    agent,
    obs,
    actions,
    old_logprobs,
    old_values,
    advantages,
    returns,
    clip_coef,
    ent_coef,
    vf_coef,
    clip_vloss,
):
    """The agent's forward pass on a minibatch and ppo_loss: the function --compile compiles."""
    _, logprob, entropy, value = agent.get_action_and_value(obs, actions)
    return ppo_loss(
        logprob,
        entropy,
        value,
        old_logprobs,
        old_values,
        advantages,
        returns,
        clip_coef,
        ent_coef,
        vf_coef,
        clip_vloss,
    )


@torch.no_grad()
def evaluate(agent, env_id, episodes, seed, device="cpu", video_dir=None):
    """Greedy (argmax) whole games (all lives) on a fresh env preprocessed as in training; returns
    the list of unclipped game scores."""
    env = make_env(env_id, video_dir)
    returns = []
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep)
        while "episode" not in info:  # RecordEpisodeStatistics's record of the game, when it ends
            action = agent.get_greedy_action(torch.as_tensor(obs, device=device)[None])
            obs, _, terminated, truncated, info = env.step(int(action))
            if (terminated or truncated) and "episode" not in info:  # a life lost: the game goes on
                obs, _ = env.reset()
        returns.append(float(info["episode"]["r"]))
    env.close()
    return returns


def main(args: Args):
    ranks = Ranks()  # torchrun's environment; without torchrun: one process
    world_size = ranks.world_size
    # bad input stops every rank before the process group starts; rank 0 alone says why
    with ranks.said_by_rank_0():
        # on every rank: the same flags, checks, seeds and checkpoint
        args, ckpt, run_dir = start_run(args, check_args, __file__)
        if (
            ckpt is not None
            and ckpt["global_step"]
            != ckpt["iteration"] * world_size * args.num_envs * args.num_steps
        ):
            ran = ckpt["global_step"] // (ckpt["iteration"] * args.num_envs * args.num_steps)
            fail(
                f"{run_dir} ran {ran} process(es), not {world_size}; "
                "resume it with as many (torchrun --nproc_per_node)"
            )
    device = ranks.device(args.cuda)
    ranks.join(device)
    # same-step autoreset: a finished episode's last observation is in infos
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(args.env_id)] * args.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)
    agent = Agent(n_actions).to(device)
    # fused: 4x faster
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    loss_fn = torch.compile(minibatch_loss) if args.compile else minibatch_loss
    batch_size = args.num_envs * args.num_steps  # each rank's rollout
    global_batch = world_size * batch_size  # the steps of one update, all ranks together
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // global_batch
    iteration = 0

    def run_eval(video_dir=None):  # evaluation games are seeded apart from training
        return evaluate(
            agent, args.env_id, args.eval_episodes, args.seed + 100_000, device, video_dir
        )

    # what a checkpoint holds, saved and resumed
    stateful = {"agent": agent, "optimizer": optimizer, "rng": RNGs()}
    if ckpt is not None:
        load_states(stateful, ckpt, run_dir)  # envs are not saved: they are seeded anew on reset
        iteration = ckpt["iteration"]
    # the same initial weights on every rank, then each its own actions (rank 0's: those of
    # ppo_atari.py)
    if ranks.rank > 0:
        torch.manual_seed(args.seed + 10_000 * ranks.rank + iteration)
    ranks.check_same_weights(agent)
    global_step = iteration * global_batch
    if ranks.rank == 0:
        print(
            f"{world_size} process(es) x {args.num_envs} envs x {args.num_steps} steps = "
            f"{global_batch:,} steps per update (minibatches of {minibatch_size} per process); "
            f"{num_iterations:,} updates to --total-timesteps {args.total_timesteps:,} over all "
            "processes" + (", the learning rate annealed over them" if args.anneal_lr else "")
        )
    # the RunLogger (rank 0 alone writes the run)
    logger = ranks.logger(
        args, run_dir, num_iterations * global_batch, global_step, ckpt=ckpt, script=__file__
    )

    @torch.no_grad()
    def value_fn(obs):  # V(obs) of a numpy batch of final observations
        return (
            agent.get_value(torch.as_tensor(obs, dtype=torch.float32, device=device)).cpu().numpy()
        )

    obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    # a resumed run: fresh episodes
    next_obs, _ = envs.reset(seed=args.seed + global_step + ranks.rank * args.num_envs)
    # steps of the game (all its lives) each env is playing
    game_length = np.zeros(args.num_envs, dtype=np.int64)
    for iteration in range(iteration + 1, num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = (
            frac * args.learning_rate if args.anneal_lr else args.learning_rate
        )
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef
        for step in range(args.num_steps):
            obs[step] = torch.as_tensor(next_obs, device=device)
            with torch.no_grad():
                actions[step], logprobs[step], _, values[step] = agent.get_action_and_value(
                    obs[step]
                )
            next_obs, reward, terminated, truncated, infos = envs.step(actions[step].cpu().numpy())
            global_step += world_size * args.num_envs  # every rank steps its envs at once
            reward = bootstrap_time_limits(
                reward, terminated, truncated, infos, value_fn, args.gamma
            )
            rewards[step] = torch.as_tensor(reward)
            dones[step] = torch.as_tensor(terminated | truncated)
            game_length += 1
            # RecordEpisodeStatistics's unclipped score of each game that ended
            games = infos.get("final_info", {})
            # every finished game of every sub-env
            for i in np.flatnonzero(games.get("_episode", [])):
                logger.log_episode(global_step, games["episode"]["r"][i], game_length[i])
                game_length[i] = 0
        with torch.no_grad():
            next_value = agent.get_value(torch.as_tensor(next_obs, device=device))
        advantages, returns = compute_gae(
            rewards, values, dones, next_value, args.gamma, args.gae_lambda
        )
        b_obs = obs.flatten(0, 1)
        b_actions = actions.flatten(0, 1)
        b_logprobs = logprobs.flatten(0, 1)
        b_advantages = advantages.flatten(0, 1)
        b_returns = returns.flatten(0, 1)
        b_values = values.flatten(0, 1)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                mb = perm[start : start + minibatch_size]
                mb_advantages = (b_advantages[mb] - b_advantages[mb].mean()) / (
                    b_advantages[mb].std() + 1e-8
                )
                loss, stats = loss_fn(
                    agent,
                    b_obs[mb],
                    b_actions[mb],
                    b_logprobs[mb],
                    b_values[mb],
                    mb_advantages,
                    b_returns[mb],
                    clip_coef,
                    args.ent_coef,
                    args.vf_coef,
                    clip_coef if args.clip_vloss else None,
                )
                optimizer.zero_grad()
                loss.backward()
                ranks.reduce_gradients(agent.parameters())
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and ranks.mean(stats["approx_kl"]) > args.target_kl:
                break  # on every rank at once: they take the same number of steps
        # nan: constant returns
        stats["explained_variance"] = 1 - (b_returns - b_values).var() / b_returns.var()
        # rank 0 logs them
        stats = dict(zip(stats, ranks.mean(torch.stack(list(stats.values())))))
        # a Ctrl-C that reached any rank (before this all-reduce; a later one: next iteration) stops
        # every rank now
        ranks.agree_to_stop(logger)
        stop = logger.stops_after(global_step)  # Ctrl-C or --stop-at
        logger.log(
            global_step,
            {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                **{f"losses/{k}": v for k, v in stats.items()},
            },
        )
        logger.progress(global_step)
        if (
            args.eval_every
            and iteration < num_iterations
            and global_step % args.eval_every < global_batch
        ):
            logger.evaluate(global_step, run_eval)
        if iteration % max(1, args.checkpoint_every // global_batch) == 0 or stop:
            ranks.check_same_weights(agent)
            logger.save_checkpoint(stateful, iteration, global_step)
        if stop:  # the iteration it came in is finished and saved
            logger.exit_stopped(global_step)
    envs.close()
    # the barrier: no rank tears the group down while another is still in the last all-reduce
    # (gloo aborts it then). No collective after it: the other ranks end while rank 0 evaluates
    ranks.leave()
    video_dir = run_dir / "videos" if args.capture_video else None
    eval_returns = logger.evaluate(global_step, lambda: run_eval(video_dir))
    logger.save_checkpoint(stateful, num_iterations, global_step, finished=True)
    if args.save_model and ranks.rank == 0:
        save_model(
            {
                "agent": agent.state_dict(),
                "args": asdict(args),
                "eval_returns": eval_returns,
                "n_actions": n_actions,
            },
            run_dir,
        )
    logger.close(eval_returns)


# Distributed: torchrun starts one process (rank) per GPU (or per CPU worker). Every rank steps its
# own --num-envs envs (seeded apart: rank r's envs take seeds seed + r * num_envs onwards), computes
# the gradients of its own minibatches, and the gradients are averaged over the ranks before each
# optimizer step, so every rank takes the same step and holds the same weights (checked at the start
# and at every checkpoint). The effective batch of an update is world_size * num_envs * num_steps
# steps, each rank's minibatch num_envs * num_steps / num_minibatches; --total-timesteps and the
# global step count the steps of all ranks, and the learning rate is annealed over total_timesteps /
# (world_size * num_envs * num_steps) updates: N ranks run the same steps in 1/N of the updates of
# one. Rank 0 alone logs (its own envs' games; the losses averaged over the ranks), evaluates and
# writes the run directory (config.json, metrics.csv, checkpoint.pt, model.pt); the others wait for
# it at the next update. A resumed run loads rank 0's checkpoint on every rank (on several machines,
# the run directory must be at the same path on each: a shared file system). Ctrl-C (torchrun passes
# it to every rank) stops every rank after the same iteration, saved by rank 0; a rank that dies
# ends the job: torchrun stops the others and exits non-zero. Bad flags stop every rank before the
# process group starts, rank 0 alone printing the one-line error. The ranks exit 2 (bad flags) or
# 130 (Ctrl-C), but torchrun's own status is 1 after any rank's failure or a Ctrl-C, with its own
# traceback (ChildFailedError or SignalException). Without torchrun (no WORLD_SIZE in the
# environment) it is one process, ppo_atari.py step for step.


def check_args(args: Args):
    obs_space, act_space = env_spaces(args.env_id, __file__)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{SCRIPT} needs discrete actions but {args.env_id} has {act_space}",
            "ppo_continuous.py",
        )
    if gym.spec(args.env_id).entry_point != "ale_py.env:AtariEnv" or len(obs_space.shape) != 3:
        fail(
            f"{SCRIPT} needs an Atari game with image observations (ALE/<Game>-v5 "
            f"or <Game>NoFrameskip-v4) but {args.env_id} is not one",
            "ppo.py",
        )
    check_ranges(args)
    batch = args.num_envs * args.num_steps
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if batch % args.num_minibatches:
        fail(
            f"--num-minibatches {args.num_minibatches} does "
            f"not divide the batch num_envs*num_steps = {batch}"
        )
    if args.total_timesteps < world_size * batch:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one rollout of all "
            f"{world_size} processes (world_size*num_envs*num_steps = {world_size * batch})"
        )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if args.cuda and torch.cuda.is_available() and local_world > torch.cuda.device_count():
        fail(
            f"--cuda needs a GPU per process: {local_world} processes "
            f"on this machine, {torch.cuda.device_count()} GPUs; use "
            f"torchrun --nproc_per_node={torch.cuda.device_count()}"
        )


if __name__ == "__main__":
    # a flag that cannot be parsed (and --help): printed once, not once per rank
    with Ranks().said_by_rank_0():
        cli_args = tyro.cli(Args, description=__doc__)
    main(cli_args)
