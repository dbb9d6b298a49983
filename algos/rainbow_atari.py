"""Rainbow (Hessel et al. 2018) on Atari (ALE/Breakout-v5 by default) and MinAtar.

c51_atari.py plus, as CleanRL's rainbow_atari.py joins them: factorised noisy nets (Fortunato et al.
2018, sigma0 0.5) that explore instead of epsilon; a dueling head (Wang et al. 2016) over the atoms;
3-step returns; Double Q (the online network picks the next action, the target network's
distribution is projected); proportional prioritised replay (Schaul et al. 2016: alpha 0.5, beta
0.4 -> 1, priority = the cross-entropy). Adam 6.25e-5 eps 1.5e-4, a target copy every 8k steps.

Run:    python algos/rainbow_atari.py --env-id ALE/Breakout-v5 --seed 1 --cuda
Quick:  python algos/rainbow_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 2000 \
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
    learning_rate: float = 6.25e-5
    """Adam learning rate (Rainbow's)"""
    adam_eps: float = 1.5e-4 * 32
    """Adam epsilon times batch_size (Rainbow's eps = 1.5e-4 for batch 32)"""
    anneal_lr: bool = False
    """anneal the learning rate linearly to 0"""
    buffer_size: int = 1_000_000
    """replay capacity in 84x84 uint8 frames (a step each, an episode 1 more); 1M: 6.6 GiB"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate (1.0: a hard copy)"""
    target_network_frequency: int = 8_000
    """env steps between target network updates"""
    batch_size: int = 32
    """replay minibatch size"""
    learning_starts: int = 80_000
    """env steps before learning starts"""
    train_frequency: int = 4
    """vector-env steps between training phases"""
    gradient_steps: int = 1
    """gradient updates per training phase (each with new noise)"""
    eval_epsilon: float = 0.05
    """epsilon of the evaluation games (Nature DQN's; 0: greedy on the mean weights)"""
    n_atoms: int = 51
    """atoms of the categorical return distribution"""
    v_min: float = -10.0
    """lowest return of the support (rewards are clipped to [-1, 1] for learning)"""
    v_max: float = 10.0
    """highest return of the support"""
    n_step: int = 3
    """steps of the multi-step return (fewer where an episode ends first)"""
    prioritized_replay_alpha: float = 0.5
    """priority exponent: transitions are drawn with probability p^alpha / sum p^alpha"""
    prioritized_replay_beta: float = 0.4
    """initial importance-sampling exponent, annealed linearly to 1 at --total-timesteps"""
    prioritized_replay_eps: float = 1e-6
    """added to each priority (no transition's probability falls to 0)"""
    noisy_sigma0: float = 0.5
    """initial noise scale of the noisy layers: sigma = sigma0 / sqrt(inputs)"""
    compile: bool = False
    """torch.compile the loss and its backward (q_loss; float rounding differs from eager)"""
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


class NoisyLinear(nn.Module):
    """A linear layer with learned factorised Gaussian noise (Fortunato et al. 2018, eqs. 10-11):
    w = mu_w + sigma_w * f(eps_out) f(eps_in)^T and b = mu_b + sigma_b * f(eps_out), f(x) = sgn(x)
    sqrt(|x|), eps ~ N(0, 1) drawn again by reset_noise(); mu ~ U[-1/sqrt(p), 1/sqrt(p)] and sigma
    = sigma0 / sqrt(p) for p inputs (section 3.2). noise=False: the mean weights (evaluation)."""

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__()
        bound = in_features**-0.5
        self.weight_mu = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound)
        )
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        # f(eps_in), f(eps_out): buffers, so a checkpoint resumes with the same noise
        self.register_buffer("eps_in", torch.zeros(in_features))
        self.register_buffer("eps_out", torch.zeros(out_features))
        self.reset_noise()

    def reset_noise(self):
        for eps in (self.eps_in, self.eps_out):
            eps.normal_()
            eps.copy_(eps.sign() * eps.abs().sqrt())

    def forward(self, x, noise: bool = True):
        mean = F.linear(x, self.weight_mu, self.bias_mu)
        if not noise:
            return mean
        # (sigma_w * f(eps_out) f(eps_in)^T) x = f(eps_out) * (sigma_w (f(eps_in) * x)): the noise
        # matrix of eq. 10 is never formed (acting on one observation costs 10x less)
        return mean + self.eps_out * F.linear(x * self.eps_in, self.weight_sigma, self.bias_sigma)


class QNetwork(nn.Module):
    """Nature DQN's CNN torso (uint8 stacks (N, 4, 84, 84) scaled to [0, 1] -> 32 8x8 filters stride
    4 -> 64 4x4 stride 2 -> 64 3x3 stride 1, ReLU), then a dueling head of noisy layers: a value
    stream 3136 -> 512 -> n_atoms and an advantage stream 3136 -> 512 -> n_actions * n_atoms, joined
    per atom as V + A - mean_a A (Wang et al. 2016, eq. 9, on the logits as in Rainbow) before the
    softmax over atoms. forward() gives Q(s, a) = sum_i p_i(s, a) z_i; noise=False (the default,
    what evaluate() runs) acts on the mean weights, the rollout and the loss pass noise=True."""

    def __init__(
        self,
        n_actions: int,
        n_atoms: int = 51,
        v_min: float = -10.0,
        v_max: float = 10.0,
        sigma0: float = 0.5,
    ):
        super().__init__()
        self.n_actions = n_actions
        self.n_atoms = n_atoms
        self.register_buffer("atoms", torch.linspace(v_min, v_max, n_atoms))
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.value = nn.ModuleList(
            [NoisyLinear(64 * 7 * 7, 512, sigma0), NoisyLinear(512, n_atoms, sigma0)]
        )
        self.advantage = nn.ModuleList(
            [NoisyLinear(64 * 7 * 7, 512, sigma0), NoisyLinear(512, n_actions * n_atoms, sigma0)]
        )

    def logits(self, x, noise: bool):
        """(batch, n_actions, n_atoms) logits of the return distribution of each action."""
        h = self.network(x / 255.0)
        value = self.value[1](F.relu(self.value[0](h, noise)), noise)
        advantage = self.advantage[1](F.relu(self.advantage[0](h, noise)), noise)
        value = value.view(-1, 1, self.n_atoms)
        advantage = advantage.view(-1, self.n_actions, self.n_atoms)
        return value + advantage - advantage.mean(dim=1, keepdim=True)

    def forward(self, x, noise: bool = False):
        return (self.logits(x, noise).softmax(dim=-1) * self.atoms).sum(dim=-1)

    def get_greedy_action(self, x, noise: bool = False):
        """argmax_a Q(x, a): with noise=True the rollout's action (noisy nets explore), without it
        the policy that evaluate() runs (the mean weights)."""
        return self(x, noise).argmax(dim=-1)

    def reset_noise(self):
        for layer in (*self.value, *self.advantage):
            layer.reset_noise()


def double_q_pmfs(next_q_online, next_logits_target):
    """Double Q-learning's next distribution (van Hasselt et al. 2016, as Rainbow uses it): the
    online network's greedy action a* = argmax_a Q_online(s', a) picks the target network's p(s',
    a*). (batch, actions) Q-values and (batch, actions, atoms) logits in, (batch, atoms) out."""
    next_actions = next_q_online.argmax(dim=1)
    return next_logits_target[torch.arange(len(next_actions)), next_actions].softmax(dim=-1)


def categorical_projection(next_pmfs, rewards, terminated, gamma, atoms):
    """The paper's projection (eq. 7, Algorithm 1) of the target distribution: atom z_j of next_pmfs
    moves to Tz_j = r + gamma * z_j (r alone where terminated: a time-limit truncation still has a
    future), clipped to [v_min, v_max], and its mass is split between the two atoms around Tz_j in
    proportion to closeness (all of it to one atom when Tz_j lands on it: floor == ceil). (batch,
    atoms) pmfs in, (batch, atoms) pmfs out."""
    v_min = atoms[0]
    v_max = atoms[-1]
    n_atoms = len(atoms)
    tz = (rewards[:, None] + gamma * (1.0 - terminated[:, None]) * atoms).clamp(v_min, v_max)
    # index of Tz_j (clamp: rounding)
    b = ((tz - v_min) / ((v_max - v_min) / (n_atoms - 1))).clamp(0, n_atoms - 1)
    lower = b.floor().long()
    upper = b.ceil().long()
    target = torch.zeros_like(next_pmfs)
    # lower == upper: all to that atom
    target.scatter_add_(1, lower, next_pmfs * (upper - b + (lower == upper)))
    target.scatter_add_(1, upper, next_pmfs * (b - lower))
    return target


def categorical_losses(logits, target_pmfs):
    """Per sample: the cross-entropy -sum_i m_i log p_i between the projected target m and the
    predicted distribution p (its logits) of the action taken; c51_atari.py's categorical_loss
    without the mean over the batch, since each sample has its importance weight and these values
    are its new priority (as CleanRL; the paper prioritises by the KL divergence, which is lower by
    the target's entropy)."""
    return -(target_pmfs * F.log_softmax(logits, dim=-1)).sum(dim=-1)


def q_loss(
    q_network,
    target_network,
    b_obs,
    b_next_obs,
    b_actions,
    b_returns,
    b_terminated,
    b_discounts,
    b_weights,
):
    """The importance-weighted mean cross-entropy of the projected n-step target with the predicted
    distribution of the actions taken, both networks with the noise drawn for this update; returns
    (loss, the per-sample cross-entropies (the new priorities), the Q-values of those actions)."""
    with torch.no_grad():
        next_pmfs = double_q_pmfs(
            q_network(b_next_obs, noise=True), target_network.logits(b_next_obs, noise=True)
        )
        # R + gamma^k z: k = n_step unless the episode ended sooner (b_discounts: gamma^k)
        target = categorical_projection(
            next_pmfs, b_returns, b_terminated, b_discounts[:, None], target_network.atoms
        )
    logits = q_network.logits(b_obs, noise=True)[torch.arange(len(b_actions)), b_actions]
    losses = categorical_losses(logits, target)
    q_pred = (logits.detach().softmax(dim=-1) * q_network.atoms).sum(dim=-1)
    return (b_weights * losses).mean(), losses.detach(), q_pred


class SumTree:
    """Proportional sampling in O(log n) (Schaul et al. 2016, appendix B.2.1): a binary tree (node 1
    the root, node k's children 2k and 2k + 1) whose leaves hold the priorities^alpha and whose
    other nodes hold the sum of their two children. find(u) walks down from the root to the leaf
    where the running sum of the leaves passes u: for u uniform in [0, total), leaf i is found with
    probability leaves[i] / total. numpy, vectorised over the batch."""

    def __init__(self, capacity: int):
        self.n = 1 << (capacity - 1).bit_length()  # leaves: capacity rounded up to a power of 2
        self.nodes = np.zeros(2 * self.n)
        self.leaves = self.nodes[self.n : self.n + capacity]  # a view

    def total(self) -> float:
        return self.nodes[1]

    def update(self, idx, values):
        """leaves[idx] = values, then the sums above them, one level at a time."""
        node = np.asarray(idx, np.int64) + self.n
        self.nodes[node] = values
        while len(node) and node[0] > 1:  # a parent met twice gets the same sum twice
            node = node // 2
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]

    def find(self, u):
        """The leaf of each u in [0, total): the first i with leaves[0] + ... + leaves[i] > u."""
        node = np.ones(len(u), np.int64)
        while node[0] < self.n:
            left = self.nodes[2 * node]
            right = u >= left
            u = np.where(right, u - left, u)
            node = 2 * node + right
        return node - self.n


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


class PrioritizedReplayBuffer(ReplayBuffer):
    """ReplayBuffer's ring of frames (each frame stored once) with two differences. Each slot from
    which a step was taken starts an n-step transition: its return R = r_t + gamma r_(t+1) + ... +
    gamma^(k-1) r_(t+k-1) and its next observation is the stack ending k slots later, k = n_step, or
    fewer where the episode ended: a termination stops the sum and the bootstrap (`done`), a time
    limit stops the sum at the true final observation, which is bootstrapped with gamma^k. And
    transitions are drawn in proportion to priority^alpha (a SumTree over every slot of every env);
    a transition is drawn only once its window is complete, first at the highest priority so far,
    then at its last loss + eps (update_priorities)."""

    FIELDS = (*ReplayBuffer.FIELDS, "returns", "horizon", "done")

    def __init__(
        self,
        size: int,
        num_envs: int,
        obs_shape: tuple,
        rng: np.random.Generator,
        n_step: int,
        gamma: float,
        alpha: float,
        eps: float,
    ):
        super().__init__(size, num_envs, obs_shape, rng)
        self.n_step = n_step
        self.gamma = gamma
        self.alpha = alpha
        self.eps = eps
        # per slot: the n-step return, its steps k and whether a termination ended it
        self.returns = np.zeros((num_envs, self.size), np.float32)
        self.horizon = np.zeros((num_envs, self.size), np.int64)
        self.done = np.zeros((num_envs, self.size), np.float32)
        # leaf env * size + slot: a slot's priority^alpha, 0 where no transition may be drawn
        self.tree = SumTree(num_envs * self.size)
        self.max_priority = 1.0

    def write(self, env: int, frame, step: int):
        """ReplayBuffer.write; the slot overwritten and the transitions whose stacks reached back to
        its frame can no longer be drawn."""
        super().write(env, frame, step)
        slots = (self.pos[env] - 1 + np.arange(self.n_stack)) % self.size
        leaves = env * self.size + slots[~self.valid[env, slots]]
        if self.tree.leaves[leaves].any():  # all 0 until the ring wraps: no update
            self.tree.update(leaves, 0.0)

    def add(self, obs, next_obs, actions, rewards, terminated, first):
        """ReplayBuffer.add, then the n-step windows: each env's step starts one and extends those
        of the (at most n - 1) steps before it in its episode. A window is complete after n steps,
        at a termination, or when the next episode starts (a time limit cut it)."""
        for i in np.flatnonzero(first):
            last = (self.pos[i] - 1) % self.size  # the final observation of the episode before
            # not a termination (its windows are complete): a time limit, or a resumed run's reset
            if (self.pos[i] or self.full[i]) and not self.terminated[i, (last - 1) % self.size]:
                self.complete(i, last - np.arange(1, min(self.n_step, self.steps[i, last] + 1)))
        super().add(obs, next_obs, actions, rewards, terminated, first)
        for i in range(len(obs)):
            t = (self.pos[i] - 2) % self.size  # the slot of this step
            k = np.arange(min(self.n_step, self.steps[i, t] + 1))  # it is step k of the windows
            window = (t - k) % self.size
            self.returns[i, t] = 0.0
            self.horizon[i, t] = 0
            self.returns[i, window] += self.gamma**k * rewards[i]
            self.horizon[i, window] += 1
            self.done[i, window] = terminated[i]
            self.complete(i, window if terminated[i] else window[k == self.n_step - 1])

    def complete(self, env: int, slots):
        """The windows of `slots` are complete: they may be drawn, at the highest priority so far
        (a new transition is replayed soon at least once, Schaul et al. 2016)."""
        slots = slots % self.size
        slots = slots[self.valid[env, slots]]
        self.tree.update(env * self.size + slots, self.max_priority**self.alpha)

    def sample(self, batch_size: int, beta: float, device):
        """A minibatch drawn in proportion to priority^alpha, one draw in each of batch_size equal
        parts of the total (stratified, as CleanRL): (obs, next_obs, actions, n-step returns,
        terminated, discounts gamma^k, importance weights) as tensors on `device`, and the leaves
        drawn (for update_priorities)."""
        total = self.tree.total()
        leaves = self.tree.find(
            (np.arange(batch_size) + self.rng.random(batch_size)) / batch_size * total
        )
        # draw again where float rounding at the end of a part found an empty leaf
        ok = self.tree.nodes[self.tree.n + leaves] > 0
        while not ok.all():
            leaves[~ok] = self.tree.find(self.rng.random((~ok).sum()) * total)
            ok = self.tree.nodes[self.tree.n + leaves] > 0
        env, slot = np.divmod(leaves, self.size)
        probs = self.tree.leaves[leaves] / total
        # (N P(i))^-beta / max_j (N P(j))^-beta: N (the transitions stored) cancels
        weights = (probs / probs.min()) ** -beta
        batch = (
            self.stacks(env, slot),
            self.stacks(env, (slot + self.horizon[env, slot]) % self.size),
            self.actions[env, slot],
            self.returns[env, slot],
            self.done[env, slot],
            (self.gamma ** self.horizon[env, slot]).astype(np.float32),
            weights.astype(np.float32),
        )
        return [torch.as_tensor(x, device=device) for x in batch], leaves

    def update_priorities(self, leaves, losses):
        """The priority of the transitions drawn: their loss + eps (Schaul et al. 2016's
        proportional variant, with Rainbow's distributional loss in place of |TD error|)."""
        priorities = np.abs(losses) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(leaves, priorities**self.alpha)

    def state_dict(self):
        return {
            **super().state_dict(),
            "priorities": torch.from_numpy(self.tree.leaves.copy()),
            "max_priority": self.max_priority,
        }

    def load_state_dict(self, state):
        state = dict(state)
        self.max_priority = float(state.pop("max_priority"))
        priorities = state.pop("priorities").numpy()
        self.tree.update(np.arange(len(self.tree.leaves)), priorities)
        super().load_state_dict(state)


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
    support = (args.n_atoms, args.v_min, args.v_max, args.noisy_sigma0)
    q_network = QNetwork(n_actions, *support).to(device)
    target_network = QNetwork(n_actions, *support).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(
        q_network.parameters(),
        lr=args.learning_rate,
        eps=args.adam_eps / args.batch_size,
        fused=True,
    )  # fused: 4x faster step
    loss_fn = torch.compile(q_loss) if args.compile else q_loss
    rng = np.random.default_rng(args.seed)  # replay sampling
    rb = PrioritizedReplayBuffer(
        args.buffer_size,
        args.num_envs,
        obs_shape,
        rng,
        args.n_step,
        args.gamma,
        args.prioritized_replay_alpha,
        args.prioritized_replay_eps,
    )
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
        # no epsilon: the noisy network explores, with the noise drawn for the last update (CleanRL)
        with torch.no_grad():
            actions = q_network.get_greedy_action(torch.as_tensor(obs, device=device), noise=True)
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
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (
                    1.0 - iteration / num_iterations
                )
            # importance sampling corrects fully (beta = 1) by the end of training
            beta = min(
                1.0,
                args.prioritized_replay_beta
                + (1.0 - args.prioritized_replay_beta) * global_step / args.total_timesteps,
            )
            for _ in range(args.gradient_steps):
                # new noise for each update, in both networks (the rollout acts on the online one's)
                q_network.reset_noise()
                target_network.reset_noise()
                batch, leaves = rb.sample(args.batch_size, beta, device)
                loss, priorities, q_pred = loss_fn(q_network, target_network, *batch)
                rb.update_priorities(leaves, priorities.cpu().numpy())
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
                        "charts/beta": beta,
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
        model={
            "q_network": q_network.state_dict(),
            "n_actions": n_actions,
            "n_atoms": args.n_atoms,
            "v_min": args.v_min,
            "v_max": args.v_max,
        },
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
            "c51.py",
        )
    if args.capture_video and args.env_id.startswith("MinAtar/"):
        fail("MinAtar games record no video: drop --capture-video")
    check_ranges(
        args,
        {
            "n_step": "x >= 1",
            "prioritized_replay_alpha": "0 <= x <= 1",
            "prioritized_replay_beta": "0 < x <= 1",
            "prioritized_replay_eps": "x > 0",
            "noisy_sigma0": "x >= 0",
        },
    )
    if args.v_min >= args.v_max:
        fail(
            f"--v-min {args.v_min} must be below --v-max "
            f"{args.v_max}: they are the ends of the return's support"
        )
    check_replay_flags(args)
    if args.learning_starts < args.n_step:
        fail(
            f"--learning-starts {args.learning_starts} must be at least --n-step "
            f"{args.n_step}: the first minibatch needs a complete n-step return"
        )
    if args.buffer_size < (args.n_step + 8) * args.num_envs:
        fail(
            f"--buffer-size {args.buffer_size} must be at least --n-step + 8 "
            f"({args.n_step + 8}) per env (--num-envs {args.num_envs})"
        )


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
