"""PettingZoo ParallelEnv over one smac_lite battle (numpy observations, CPU)."""

import functools

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from .core import BatchedSMAC


class SMACLiteParallelEnv(ParallelEnv):
    """One battle. Observations are dicts {"observation": float32 (obs_dim,), "action_mask": int8
    (n_actions,)}; the team reward is given to every agent; an agent that dies is terminated and
    leaves `agents`; the time limit truncates every agent. infos[agent]["won"] tells whether the
    battle was won. state() is SMAC's global state."""

    metadata = {
        "render_modes": ["rgb_array"],
        "name": "smac_lite_v0",
        "render_fps": 8,
        "is_parallelizable": True,
    }

    def __init__(self, map_name="3m", render_mode=None, seed=None, **kwargs):
        assert render_mode in (None, "rgb_array"), render_mode
        self.render_mode = render_mode
        self.core = BatchedSMAC(
            map_name, num_envs=1, device="cpu", seed=seed, auto_reset=False, **kwargs
        )
        self.map_name = map_name
        self.possible_agents = [f"agent_{i}" for i in range(self.core.n_agents)]
        self.agents = []
        self._index = {a: i for i, a in enumerate(self.possible_agents)}
        self.state_space = spaces.Box(-1.0, 1.0, (self.core.state_dim,), np.float32)
        self._obs = self._state = self._avail = None

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return spaces.Dict(
            {
                "observation": spaces.Box(-1.0, 1.0, (self.core.obs_dim,), np.float32),
                "action_mask": spaces.Box(0, 1, (self.core.n_actions,), np.int8),
            }
        )

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return spaces.Discrete(self.core.n_actions)

    def _agent_obs(self, agent):
        i = self._index[agent]
        return {"observation": self._obs[i], "action_mask": self._avail[i]}

    def _store(self, obs, state, avail):
        self._obs = obs[0].numpy().astype(np.float32)
        self._state = state[0].numpy().astype(np.float32)
        self._avail = avail[0].numpy().astype(np.int8)

    def reset(self, seed=None, options=None):
        self._store(*self.core.reset(seed=seed))
        self.agents = list(self.possible_agents)
        return {a: self._agent_obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        act = torch.zeros(1, self.core.n_agents, dtype=torch.long)
        for a, v in actions.items():
            act[0, self._index[a]] = int(v)
        obs, state, avail, reward, done, info = self.core.step(act)
        self._store(obs, state, avail)
        r = float(reward[0])
        terminated = bool(info["terminated"][0])
        truncated = bool(info["truncated"][0])
        won = bool(info["won"][0])
        alive = self.core.alive[0].numpy() > 0
        live = self.agents
        observations = {a: self._agent_obs(a) for a in live}
        rewards = {a: r for a in live}
        terms = {a: terminated or not alive[self._index[a]] for a in live}
        truncs = {a: truncated for a in live}
        infos = {a: {"won": won} for a in live}
        self.agents = [a for a in live if not (terms[a] or truncs[a])]
        return observations, rewards, terms, truncs, infos

    def state(self):
        return self._state

    def render(self):
        if self.render_mode == "rgb_array":
            return self.core.render(0)
        return None

    def close(self):
        pass
