"""Play one battle with a policy and save it as a GIF: python -m smac_lite.record 3m focus_fire
out.gif"""

import sys

import torch

from .core import BatchedSMAC
from .policies import POLICIES
from .render import render_frame


def save_gif(map_name, policy, path, seed=0, fps=8, size=384):
    """policy: "focus_fire", "random" or a callable (env, avail) -> actions (1, n_agents) long.
    Returns (won, episode_return, episode_length)."""
    import imageio.v2 as imageio

    policy = POLICIES[policy] if isinstance(policy, str) else policy
    env = BatchedSMAC(map_name, num_envs=1, seed=seed, auto_reset=False)
    _, _, avail = env.reset()
    frames = [render_frame(env, 0, size)]
    for _ in range(env.episode_limit):
        _, _, avail, _, done, info = env.step(policy(env, avail))
        frames.append(render_frame(env, 0, size))
        if bool(done[0]):
            break
    imageio.mimsave(path, frames, duration=1000 / fps, loop=0)
    return bool(info["won"][0]), float(info["episode_return"][0]), int(info["episode_length"][0])


if __name__ == "__main__":
    torch.set_num_threads(1)
    m, p, out = (sys.argv[1:] + ["3m", "focus_fire", "smac_lite.gif"][len(sys.argv) - 1 :])[:3]
    print(save_gif(m, p, out))
