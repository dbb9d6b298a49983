"""Reading the offline scripts' datasets: a Minari dataset opened from a folder or an id (nothing is
downloaded), its transitions as arrays, and D4RL's normalised score. A dataset is data: a damaged
file or numbers that are not finite are a one-line error that says what to do."""

import functools
import os
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np

from canonrl.envs import MINATAR
from canonrl.run import check_continuous_env, check_ranges, env_spaces, fail, first_line


@functools.cache  # opened once: the flag checks and main() share it
def open_dataset(name: str):
    """The Minari dataset `name`: a directory (the dataset's, or its data/ folder), or the id of one
    under MINARI_DATASETS_PATH (default ~/.minari/datasets). Nothing is downloaded; a missing one is
    a one-line error."""
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    path = Path(name).expanduser()
    data = next(
        (d for d in (path / "data", path, root / name / "data") if (d / "metadata.json").is_file()),
        None,
    )
    if data is None:
        fail(
            f"no dataset {name!r}: give a Minari dataset directory or the id "
            f"of one in {root} (make one with python benchmark/datasets.py)"
        )
    try:
        dataset = minari.MinariDataset(data)
        # the data file opens, too
        next(dataset.iterate_episodes([0]), None) if dataset.total_episodes else None
        return dataset
    except Exception as e:
        fail(f"dataset {name!r} cannot be read ({first_line(e)}); make it anew")


def dataset_arrays(dataset) -> dict:
    """Every transition of every episode: obs, next_obs, actions, rewards, terminated, as float32
    arrays (discrete actions as int64). Only termination stops a bootstrap: an episode cut by a time
    limit has a future. A data file that cannot be read to its end, or that holds numbers that are
    not finite, is a one-line error that names it."""
    parts = {"obs": [], "next_obs": [], "actions": [], "rewards": [], "terminated": []}
    data_dir = dataset.storage.data_path
    # HDF5, or Arrow
    where = data_dir / "main_data.hdf5" if (data_dir / "main_data.hdf5").is_file() else data_dir
    # open_dataset read episode 0 only: damaged bytes further on show here (h5py's KeyError,
    # OSError, ...)
    try:
        for episode in dataset.iterate_episodes():
            parts["obs"].append(episode.observations[:-1])
            parts["next_obs"].append(episode.observations[1:])
            parts["actions"].append(episode.actions)
            parts["rewards"].append(episode.rewards)
            parts["terminated"].append(episode.terminations)
    except (KeyError, OSError, RuntimeError, ValueError) as e:
        fail(f"dataset file {where} is damaged ({first_line(e)}); make it anew")
    arrays = {k: np.concatenate(v).astype(np.float32) for k, v in parts.items()}
    # a nan or inf would reach every loss
    if not all(np.isfinite(v).all() for v in arrays.values()):
        fail(f"dataset file {where} holds numbers that are not finite (nan or inf); make it anew")
    if isinstance(dataset.action_space, gym.spaces.Discrete):
        arrays["actions"] = np.concatenate(parts["actions"]).astype(np.int64)
    return arrays


def normalized_scores(returns, dataset) -> list:
    """D4RL's normalised score of each return, 100 * (R - random) / (expert - random), with the
    dataset's reference returns (ref_min_score, ref_max_score); [] for a dataset without them."""
    low = dataset.storage.metadata.get("ref_min_score")
    high = dataset.storage.metadata.get("ref_max_score")
    return [] if low is None or high is None else [100 * (r - low) / (high - low) for r in returns]


def check_dataset(args, script: str, check_env, discrete: bool, *other_scripts: str):
    """The dataset of --dataset (it exists and holds transitions of discrete, or continuous,
    actions; only its metadata and first episode are read) and the env the policy is evaluated in:
    --env-id, checked by check_env(args) (which returns its spaces), or the dataset's env when none
    is given (args.env_id is set to it); the two must have the same spaces. other_scripts: those an
    error suggests for the other kind of actions. `script` is the script's path (__file__)."""
    spaces = check_env(args) if args.env_id is not None else None
    dataset = open_dataset(args.dataset)
    if dataset.total_steps == 0:
        fail(f"dataset {args.dataset!r} is empty: it holds no transition")
    kind = gym.spaces.Discrete if discrete else gym.spaces.Box
    if not isinstance(dataset.action_space, kind):
        fail(
            f"{Path(script).name} needs {'discrete' if discrete else 'continuous (Box)'} actions "
            f"but dataset {args.dataset!r} has {dataset.action_space}",
            *other_scripts,
        )
    if args.env_id is None:
        if dataset.spec.env_spec is None:
            fail(
                f"dataset {args.dataset!r} names no env: give "
                "--env-id, the env to evaluate the policy in"
            )
        args.env_id = dataset.spec.env_spec.id
        spaces = check_env(args)
    if spaces != (dataset.observation_space, dataset.action_space):
        fail(
            f"--env-id {args.env_id} has spaces {spaces}, dataset "
            f"{args.dataset!r} {(dataset.observation_space, dataset.action_space)}: "
            "evaluate in the dataset's env"
        )


def check_offline_args(args, script: str, discrete: bool, rules: dict | None = None):
    """The flags of an offline script: the ranges (check_ranges: its RULES, then `rules`), the
    dataset, and the env the policy is evaluated in (check_dataset), which must have discrete
    actions and flat observations or a MinAtar grid (discrete) or bounded continuous actions and
    flat observations. `script` is the script's path (__file__)."""
    check_ranges(args, rules)
    if discrete:
        env = functools.partial(check_discrete_offline_env, script=script)
        check_dataset(args, script, env, True, "cql_continuous.py", "iql_continuous.py")
    else:
        env = lambda args: check_continuous_env(args.env_id, script, "cql_discrete.py")  # noqa: E731
        check_dataset(args, script, env, False, "cql_discrete.py")


def check_discrete_offline_env(args, script: str):
    """The spaces of --env-id (made once): discrete actions, flat observations or a MinAtar grid."""
    name = Path(script).name
    if args.capture_video and args.env_id in MINATAR:
        fail("MinAtar games record no video: drop --capture-video")
    obs_space, act_space = env_spaces(args.env_id, script)
    if not isinstance(act_space, gym.spaces.Discrete):
        fail(
            f"{name} needs discrete actions but {args.env_id} has {act_space}",
            "cql_continuous.py",
            "iql_continuous.py",
        )
    if not isinstance(obs_space, gym.spaces.Box) or (
        len(obs_space.shape) != 1 and args.env_id not in MINATAR
    ):
        fail(
            f"{name} needs flat vector observations or a "
            f"MinAtar game but {args.env_id} has {obs_space}"
        )
    return obs_space, act_space
