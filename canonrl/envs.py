"""The envs the scripts of algos/ register beside Gymnasium's: the memory envs (<Env>NoVel ids, the
velocities hidden; RepeatFirst-v0), the task distributions of meta-RL (BernoulliBandit-k<K>-v0,
RandomMDP-v0) and the MinAtar games. A script calls register_memory_envs(), register_meta_envs() or
register_minatar() at its top level; registering twice is a no-op."""

import gymnasium as gym
import numpy as np

# The velocity entries of each observation, zeroed in <Env>NoVel ids (rl-zoo's MaskVelocityWrapper)
VELOCITIES = {"CartPole-v1": [1, 3], "Pendulum-v1": [2], "MountainCar-v0": [1]}


class MaskVelocity(gym.ObservationWrapper):
    """env_id with its velocities set to 0 in every observation: a policy must infer them from
    the positions it has seen."""

    def __init__(self, env_id: str, **kwargs):
        super().__init__(gym.make(env_id, **kwargs))
        self.mask = np.ones(self.observation_space.shape, np.float32)
        self.mask[VELOCITIES[env_id]] = 0.0

    def observation(self, observation):
        return observation * self.mask


class RepeatFirst(gym.Env):
    """POPGym's RepeatFirst (Morad et al. 2023) with 16 cards: each observation is a card's suit
    (one-hot, 4 suits) and a flag set on the first card only. At every step the agent names a suit:
    +1/16 if it is the first card's suit, -1/16 if not; the episode ends after 16 steps. Without
    memory the suit is known at step 0 only: at best 1/16 - 15/32 = -0.41; with memory, 1."""

    observation_space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
    action_space = gym.spaces.Discrete(4)
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    length = 16

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.first_suit = int(self.np_random.integers(4))
        self.obs = self.card(self.first_suit, first=True)
        return self.obs, {}

    def step(self, action):
        reward = (1.0 if int(action) == self.first_suit else -1.0) / self.length
        self.t += 1
        self.obs = self.card(int(self.np_random.integers(4)), first=False)
        return self.obs, reward, self.t == self.length, False, {}

    def card(self, suit: int, first: bool):
        obs = np.zeros(5, np.float32)
        obs[suit] = 1.0
        obs[4] = float(first)
        return obs

    def render(self):
        """The card in view, 64x64: a colour per suit, framed in white if it is the first."""
        frame = np.full((64, 64, 3), 255 if self.obs[4] else 0, np.uint8)
        frame[8:-8, 8:-8] = [(200, 0, 0), (0, 160, 0), (0, 0, 200), (200, 160, 0)][
            int(self.obs[:4].argmax())
        ]
        return frame


def register_memory_envs():
    """Register CartPoleNoVel-v1, PendulumNoVel-v1, MountainCarNoVel-v0 and RepeatFirst-v0."""
    for env_id in VELOCITIES:
        masked_id = env_id.replace("-v", "NoVel-v")
        if masked_id not in gym.registry:
            gym.register(masked_id, lambda env_id=env_id, **kwargs: MaskVelocity(env_id, **kwargs))
    if "RepeatFirst-v0" not in gym.registry:
        gym.register("RepeatFirst-v0", RepeatFirst)


class BernoulliBandit(gym.Env):
    """A k-armed Bernoulli bandit as a one-state MDP whose episodes are one pull: arm i pays 1 with
    probability p_i, 0 otherwise. reset(options={"new_task": True}) (and the first reset) draws a
    new task, p_i ~ Uniform[0, 1] for each arm (Duan et al. 2016's bandits); a plain reset keeps it.
    The observation is the one state, one-hot: [1.0]."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def __init__(self, arms: int = 5):
        self.action_space = gym.spaces.Discrete(arms)
        self.probs = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.probs is None or (options or {}).get("new_task"):
            self.probs = self.np_random.uniform(size=self.action_space.n)
        return np.ones(1, np.float32), {}

    def step(self, action):
        reward = float(self.np_random.uniform() < self.probs[int(action)])
        return np.ones(1, np.float32), reward, True, False, {}


class RandomMDP(gym.Env):
    """A random tabular MDP of Duan et al. 2016: 10 states, 5 actions, episodes of 10 steps that
    start in state 0. reset(options={"new_task": True}) (and the first reset) draws a new task: the
    mean reward of each (state, action) ~ Normal(1, 1), each P(. | state, action) ~ Dirichlet(1,
    ..., 1); a plain reset keeps it. A step's reward is its mean plus Normal(0, 1) noise. The
    observation is the state, one-hot."""

    states, actions, horizon = 10, 5, 10
    observation_space = gym.spaces.Box(0.0, 1.0, (states,), np.float32)
    action_space = gym.spaces.Discrete(actions)

    def __init__(self):
        self.means = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.means is None or (options or {}).get("new_task"):
            self.means = self.np_random.normal(1.0, 1.0, (self.states, self.actions))
            self.transitions = self.np_random.dirichlet(
                np.ones(self.states), (self.states, self.actions)
            )
        self.state, self.t = 0, 0
        return self.one_hot(), {}

    def step(self, action):
        action = int(action)
        reward = self.means[self.state, action] + self.np_random.normal()
        self.state = int(self.np_random.choice(self.states, p=self.transitions[self.state, action]))
        self.t += 1
        return self.one_hot(), float(reward), self.t == self.horizon, False, {}

    def one_hot(self):
        obs = np.zeros(self.states, np.float32)
        obs[self.state] = 1.0
        return obs


# the task distributions of meta-RL: a new task at reset(options={"new_task": True})
META_ENVS = {
    **{f"BernoulliBandit-k{k}-v0": lambda k=k: BernoulliBandit(k) for k in (5, 10, 50)},
    "RandomMDP-v0": RandomMDP,
}


def register_meta_envs():
    """Register BernoulliBandit-k5-v0, -k10-v0, -k50-v0 (5, 10 and 50 arms) and RandomMDP-v0."""
    for env_id, make in META_ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, make)


def register_minigrid():
    """Register MiniGrid's ids (MiniGrid-DoorKey-8x8-v0, ...) where minigrid is installed (pip
    install -e ".[minigrid]"); without it, nothing (the script's check says what to install)."""
    try:
        import minigrid  # noqa: F401  (its import registers the ids)
    except ImportError:
        pass


MINATAR = {
    f"MinAtar/{game.title().replace('_', '')}-v1": game
    for game in ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
}


def register_minatar():
    """Register the MinAtar/<Game>-v1 ids (pip install minatar; its module is imported only when
    such an env is made: that takes 1 s). A script calls this at its top level; impala.py's actors
    call it too, since a Ray actor's process does not run the script's top level."""
    for env_id, game in MINATAR.items():
        if env_id not in gym.registry:
            gym.register(
                env_id,
                "minatar.gym:BaseEnv",
                max_episode_steps=10_000,
                kwargs=dict(game=game, use_minimal_action_set=True),
            )
