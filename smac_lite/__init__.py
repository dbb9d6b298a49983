"""smac_lite: a batched SMAC-like StarCraft micromanagement environment in torch (see
smac_lite/README.md)."""

from .core import BatchedSMAC
from .maps import MAPS, UNIT_TYPES

__all__ = ["BatchedSMAC", "MAPS", "UNIT_TYPES", "parallel_env", "save_gif"]


def parallel_env(map_name="3m", render_mode=None, seed=None, **kwargs):
    """PettingZoo ParallelEnv over one battle (numpy observations)."""
    from .pz import SMACLiteParallelEnv

    return SMACLiteParallelEnv(map_name=map_name, render_mode=render_mode, seed=seed, **kwargs)


def save_gif(map_name, policy, path, **kwargs):
    """Play one battle with `policy` and save it as a GIF (see smac_lite.record.save_gif)."""
    from .record import save_gif as _save_gif

    return _save_gif(map_name, policy, path, **kwargs)
