"""Offline-RL datasets made by this project, written as Minari datasets (no download, no remote):
rollouts of a saved model.pt of algos/ (or of a uniform random policy), or the replay buffer of a
training run's checkpoint.pt. A model.pt or checkpoint.pt is read only if its SHA-256 matches the
model.sha256 or checkpoint.sha256 saved beside it.

    python benchmark/datasets.py --kind expert --policy runs/sac/model.pt \\
        --expert runs/sac/model.pt --steps 100000
    python benchmark/datasets.py --kind medium --policy runs/sac_short/model.pt \\
        --expert runs/sac/model.pt
    python benchmark/datasets.py --kind medium-replay --checkpoint runs/sac_short/checkpoint.pt \\
        --expert runs/sac/model.pt
    python benchmark/datasets.py --kind random --env-id Pendulum-v1 --expert runs/sac/model.pt

Kinds (D4RL's, Fu et al. 2020): `random` (uniform actions), `medium` (a partly trained policy),
`expert` (a trained one), `medium-replay` (the replay buffer of the run that made the medium
policy). A policy acts as its script acts while it trains: SAC samples from its Gaussian, TD3 and
DDPG add their Gaussian exploration noise to the deterministic action, DQN is epsilon-greedy at its
final epsilon (or at --epsilon), IMPALA samples its categorical policy. Episode e of a dataset of
seed S starts from env.reset(seed=S + e). A MinAtar game's dataset holds its (10, 10, channels)
grids of booleans, the env's own observations (impala.py's policy sees them channels first, as it
trains).

The dataset goes to <root>/<id> (root: --root, default MINARI_DATASETS_PATH or ~/.minari/datasets;
id default canonrl/<env>/<kind>-v0), where `minari.load_dataset(id)` and the offline scripts'
`--dataset <id or path>` find it. Its description is JSON: the kind, policy, its SHA-256, commit,
seed and the dataset's own return statistics. Its ref_min_score and ref_max_score give the
D4RL-style normalised score, 100 * (return - random) / (expert - random): `random` is the mean
return of uniform actions and `expert` the mean greedy return of --expert (a model.pt, or a number
such as a published return), each over 100 episodes seeded apart from the dataset's.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/datasets.py` puts benchmark/ first on the path, not the root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmark.runs import git_head, load_script  # noqa: E402

KINDS = ("random", "medium", "expert", "medium-replay")
# committed model.pt files (with their runs' config.json)
POLICIES = Path(__file__).resolve().parent / "policies"
MEDIUM_SAC = POLICIES / "sac_continuous-Pendulum-v1-3k" / "model.pt"
EXPERT_SAC = POLICIES / "sac_continuous-Pendulum-v1-12k" / "model.pt"
MEDIUM_DQN = POLICIES / "dqn-CartPole-v1-20k" / "model.pt"
EXPERT_DQN = POLICIES / "dqn-CartPole-v1-100k" / "model.pt"
# the replay buffer of MEDIUM_DQN's run
MEDIUM_DQN_REPLAY = POLICIES / "dqn-CartPole-v1-20k" / "replay.pt"
MEDIUM_SAC_HOPPER = POLICIES / "sac_continuous-Hopper-v5-100k" / "model.pt"
MEDIUM_IMPALA_BREAKOUT = POLICIES / "impala-MinAtar-Breakout-v1-100k" / "model.pt"
EXPERT_IMPALA_BREAKOUT = POLICIES / "impala-MinAtar-Breakout-v1-1M" / "model.pt"
# D4RL's expert return of Hopper (its REF_MAX_SCORE), so that scores read on D4RL's scale
HOPPER_EXPERT = "3234.3"
# The datasets that the tests and the suites use, made on first use (standard()) from the committed
# policies. Pendulum: sac_continuous.py after 3k steps (greedy return about -750) and after 12k (the
# expert, about -150). CartPole: dqn.py (--learning-rate 2.3e-3) after 20k steps (greedy return
# about 200) and after 100k (the expert, 500); the medium-replay dataset is the replay buffer of
# that 20k-step run (its replay.pt: the checkpoint's buffer and flags only). Hopper:
# sac_continuous.py after 100k steps (seed 4 of the hopper-cpu suite, greedy return about 1,500; its
# model.pt holds the actor of that run's final checkpoint), scored against D4RL's expert return.
# MinAtar Breakout: impala.py (one actor in the process) after 100k steps (greedy return about 3)
# and after 1M (the expert, about 5), sampling its policy; the random dataset is uniform actions,
# scored against the same expert.
STANDARD = {
    "pendulum-medium-v0": dict(
        kind="medium",
        policy=MEDIUM_SAC,
        expert=str(EXPERT_SAC),
        steps=100_000,
        seed=0,
        dataset_id="canonrl/pendulum/medium-v0",
    ),
    "pendulum-medium-tiny-v0": dict(
        kind="medium",
        policy=MEDIUM_SAC,
        expert=str(EXPERT_SAC),
        steps=2_000,
        seed=0,
        dataset_id="canonrl/pendulum/medium-tiny-v0",
    ),
    "cartpole-medium-v0": dict(
        kind="medium",
        policy=MEDIUM_DQN,
        expert=str(EXPERT_DQN),
        steps=100_000,
        seed=0,
        dataset_id="canonrl/cartpole/medium-v0",
    ),
    "cartpole-medium-tiny-v0": dict(
        kind="medium",
        policy=MEDIUM_DQN,
        expert=str(EXPERT_DQN),
        steps=2_000,
        seed=0,
        dataset_id="canonrl/cartpole/medium-tiny-v0",
    ),
    "cartpole-medium-replay-v0": dict(
        kind="medium-replay",
        checkpoint=MEDIUM_DQN_REPLAY,
        expert=str(EXPERT_DQN),
        seed=0,
        dataset_id="canonrl/cartpole/medium-replay-v0",
    ),
    "minatar-breakout-medium-v0": dict(
        kind="medium",
        policy=MEDIUM_IMPALA_BREAKOUT,
        expert=str(EXPERT_IMPALA_BREAKOUT),
        steps=100_000,
        seed=0,
        dataset_id="canonrl/minatar/breakout/medium-v0",
    ),
    "minatar-breakout-random-v0": dict(
        kind="random",
        env_id="MinAtar/Breakout-v1",
        expert=str(EXPERT_IMPALA_BREAKOUT),
        steps=100_000,
        seed=0,
        dataset_id="canonrl/minatar/breakout/random-v0",
    ),
    "minatar-breakout-medium-tiny-v0": dict(
        kind="medium",
        policy=MEDIUM_IMPALA_BREAKOUT,
        expert=str(EXPERT_IMPALA_BREAKOUT),
        steps=2_000,
        seed=0,
        dataset_id="canonrl/minatar/breakout/medium-tiny-v0",
    ),
    # expert demonstrations for algos/gail.py and its BC peers: the first 1, 4 or 16 episodes of the
    # same expert's rollouts (episode e from reset(seed=e) in each)
    **{
        f"{env}-expert-{n}ep-v0": dict(
            kind="expert",
            policy=policy,
            expert=str(policy),
            steps=n * length,
            seed=0,
            dataset_id=f"canonrl/{env}/expert-{n}ep-v0",
        )
        for env, policy, length in (("cartpole", EXPERT_DQN, 500), ("pendulum", EXPERT_SAC, 200))
        for n in (1, 4, 16)
    },
    "hopper-medium-v0": dict(
        kind="medium",
        policy=MEDIUM_SAC_HOPPER,
        expert=HOPPER_EXPERT,
        steps=100_000,
        seed=0,
        dataset_id="canonrl/hopper/medium-v0",
    ),
}
SCORE_EPISODES = 100  # episodes behind ref_min_score and ref_max_score
# their episodes start from env.reset(seed=SCORE_SEED + e): apart from any dataset's
SCORE_SEED = 1_000_000


# The scripts whose model.pt can act as a dataset policy (_actor_of knows their networks).
POLICY_SCRIPTS = (
    "sac_continuous.py",
    "td3_continuous.py",
    "ddpg_continuous.py",
    "dqn.py",
    "impala.py",
)


class DatasetError(ValueError):
    """Bad input to the dataset maker (a missing or foreign file, an env it cannot roll out): one
    line, exit 2."""


def _actor_of(script: str, saved: dict, epsilon: float | None = None):
    """The network of a model.pt of `script` and how it acts: (greedy(obs) -> action, behave(obs,
    rng) -> action). A DQN behaves epsilon-greedily at `epsilon`, default its run's final
    epsilon."""
    module = load_script(script)
    if script in ("sac_continuous.py", "td3_continuous.py", "ddpg_continuous.py"):
        actor = module.Actor(saved["obs_dim"], saved["action_dim"])
        actor.load_state_dict(saved["actor"])
        scale, bias = actor.action_scale.numpy(), actor.action_bias.numpy()

        def greedy(obs):
            return actor.get_greedy_action(torch.as_tensor(obs, dtype=torch.float32)[None])[
                0
            ].numpy()

        def behave(obs, rng):
            if script == "sac_continuous.py":  # a sample of the squashed Gaussian, drawn with rng
                mean, log_std = (
                    x[0].numpy() for x in actor(torch.as_tensor(obs, dtype=torch.float32)[None])
                )
                return (
                    np.tanh(mean + np.exp(log_std) * rng.standard_normal(mean.shape)) * scale + bias
                ).astype(np.float32)
            # TD3/DDPG: noise of half-ranges
            noise = rng.normal(0.0, saved["args"]["exploration_noise"] * scale)
            return np.clip(greedy(obs) + noise, bias - scale, bias + scale).astype(np.float32)

        return greedy, behave
    if script == "dqn.py":
        q_network = module.QNetwork(saved["obs_dim"], saved["n_actions"])
        q_network.load_state_dict(saved["q_network"])

        def greedy(obs):
            return int(
                q_network.get_greedy_action(torch.as_tensor(obs, dtype=torch.float32)[None])[0]
            )

        eps = saved["args"]["end_e"] if epsilon is None else epsilon

        def behave(obs, rng):  # epsilon-greedy
            return int(rng.integers(saved["n_actions"])) if rng.random() < eps else greedy(obs)

        return greedy, behave
    if script == "impala.py":
        agent = module.Agent(saved["obs_shape"], saved["n_actions"])
        agent.load_state_dict(saved["agent"])

        # impala.py's make_env: a MinAtar grid (10, 10, c) becomes (c, 10, 10) floats
        def logits(obs):
            obs = np.moveaxis(obs, -1, 0) if len(saved["obs_shape"]) == 3 else obs
            return agent.actor(torch.as_tensor(obs, dtype=torch.float32)[None])[0]

        def behave(obs, rng):  # a sample of pi(.|obs), drawn with rng
            probs = logits(obs).softmax(dim=-1).double().numpy()
            return int(rng.choice(len(probs), p=probs / probs.sum()))

        return lambda obs: int(logits(obs).argmax()), behave
    raise DatasetError(
        f"no dataset policy for {script}'s model.pt: "
        "sac/td3/ddpg_continuous.py, dqn.py and impala.py are known"
    )


def check_digest(path: Path):
    """Refuse a file (model.pt, checkpoint.pt, replay.pt) whose SHA-256 is not the one in the
    .sha256 file of its name beside it (model.sha256: written with it by the scripts of algos/), or
    that has none: a changed or truncated file is refused before it is read."""
    digest_path = path.with_suffix(".sha256")
    if not digest_path.is_file():
        raise DatasetError(
            f"no {digest_path.name} beside {path}: a {path.name} is checked against "
            f"{digest_path.name} before it is read; save it again (a run with --save-model), or "
            f"if you trust the file: sha256sum {path.name} | cut -d' ' -f1 > {digest_path.name}"
        )
    if sha256(path) != digest_path.read_text().strip():
        raise DatasetError(
            f"{path}: its SHA-256 differs from {digest_path.name} "
            "(the file changed after it was saved); save it again"
        )


def load_policy(model_path: Path, epsilon: float | None = None):
    """(script, env id, greedy, behave) of a model.pt that a script of algos/ wrote beside its
    config.json. model.pt is data: its SHA-256 must match model.sha256 beside it, and it is read
    with weights_only=True."""
    model_path, config_path = Path(model_path), Path(model_path).parent / "config.json"
    if not model_path.is_file():
        raise DatasetError(
            f"no model at {model_path}; train one with --save-model (e.g. "
            "python algos/sac_continuous.py --env-id Pendulum-v1 --save-model)"
        )
    if not config_path.is_file():
        raise DatasetError(
            f"no config.json beside {model_path}: give the model.pt of a run directory of algos/"
        )
    try:
        script = json.loads(config_path.read_text())["script"]
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(
            f"{config_path} is not the config.json of a run of algos/ ({type(e).__name__})"
        )
    # the name is checked before anything is imported: a run folder is data
    if script not in POLICY_SCRIPTS:
        raise DatasetError(
            f"{model_path} is of {script!r}; dataset policies come from {', '.join(POLICY_SCRIPTS)}"
        )
    check_digest(model_path)
    try:
        saved = torch.load(model_path, weights_only=True)
    except Exception as e:
        raise DatasetError(
            f"{model_path} is corrupt or not a model.pt ({type(e).__name__}); train a new one"
        )
    if epsilon is not None and script != "dqn.py":
        raise DatasetError(
            f"--epsilon is for dqn.py policies; {model_path} "
            f"is of {script}, which behaves as it trains"
        )
    greedy, behave = _actor_of(script, saved, epsilon)
    return script, saved["args"]["env_id"], greedy, behave


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def rollout(env_id: str, act, steps: int, seed: int) -> list:
    """Whole episodes of act(obs, rng) until they hold at least `steps` transitions, as Minari
    EpisodeBuffers. Episode e starts from env.reset(seed=seed + e); rng (numpy, seeded with seed)
    draws the policy's noise."""
    from minari.data_collector import EpisodeBuffer

    env, rng, episodes, total = gym.make(env_id), np.random.default_rng(seed), [], 0
    while total < steps:
        e = len(episodes)
        obs, _ = env.reset(seed=seed + e)
        observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
        done = False
        with torch.no_grad():
            while not done:
                action = act(obs, rng)
                obs, reward, terminated, truncated, _ = env.step(action)
                observations.append(obs)
                actions.append(action)
                rewards.append(float(reward))
                terminations.append(bool(terminated))
                truncations.append(bool(truncated))
                done = terminated or truncated
        episodes.append(
            EpisodeBuffer(
                id=e,
                seed=seed + e,
                observations=np.asarray(observations),
                actions=np.asarray(actions),
                rewards=np.asarray(rewards),
                terminations=np.asarray(terminations),
                truncations=np.asarray(truncations),
            )
        )
        total += len(rewards)
    env.close()
    return episodes


def random_act(env_id: str):
    """Uniform random actions drawn with the rollout's rng."""
    space = gym.make(env_id).action_space
    if isinstance(space, gym.spaces.Discrete):
        return lambda obs, rng: int(rng.integers(space.n))
    return lambda obs, rng: rng.uniform(space.low, space.high).astype(space.dtype)


def replay_episodes(checkpoint: Path) -> tuple[list, dict]:
    """The replay buffer of a training run's checkpoint.pt as EpisodeBuffers, oldest transition
    first, and the run's args. The checkpoint is data: its SHA-256 must match checkpoint.sha256
    beside it (replay.sha256 for a replay.pt), and it is read with weights_only=True. An episode
    ends where a transition terminated or where the next transition does not start from its next
    observation (a time limit, or the end of what the buffer holds): those ends are truncations."""
    from minari.data_collector import EpisodeBuffer

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise DatasetError(
            f"no checkpoint at {checkpoint}; give the checkpoint.pt of a training run"
        )
    check_digest(checkpoint)
    try:
        ckpt = torch.load(checkpoint, weights_only=True)
        rb, args = ckpt["rb"], ckpt["args"]
    except Exception as e:
        raise DatasetError(
            f"{checkpoint} is corrupt or holds no replay buffer ({type(e).__name__})"
        )
    if args.get("num_envs", 1) != 1:
        raise DatasetError(
            f"{checkpoint} is of a run with --num-envs {args['num_envs']}: its "
            "buffer interleaves the envs' episodes; make the run with --num-envs 1"
        )
    n = len(rb["rewards"]) if rb["full"] else int(rb["pos"])
    if n == 0:
        raise DatasetError(f"the replay buffer of {checkpoint} is empty")
    order = np.roll(np.arange(n), -int(rb["pos"])) if rb["full"] else np.arange(n)
    obs, next_obs, actions, rewards, terminated = (
        np.asarray(rb[k])[order] for k in ("obs", "next_obs", "actions", "rewards", "terminated")
    )
    ends = terminated.astype(bool) | np.append(np.any(next_obs[:-1] != obs[1:], axis=1), True)
    episodes, start = [], 0
    for end in np.flatnonzero(ends):
        sl = slice(start, end + 1)
        episodes.append(
            EpisodeBuffer(
                id=len(episodes),
                observations=np.concatenate([obs[sl], next_obs[end : end + 1]]),
                actions=actions[sl],
                rewards=rewards[sl].astype(np.float64),
                terminations=terminated[sl].astype(bool),
                truncations=np.arange(start, end + 1) == end
                if not terminated[end]
                else np.zeros(end + 1 - start, bool),
            )
        )
        start = end + 1
    return episodes, args


def mean_return(env_id: str, act, seed: int = SCORE_SEED, episodes: int = SCORE_EPISODES) -> float:
    """The mean return of act(obs, rng) over `episodes` episodes from env.reset(seed=seed + e)."""
    eps = rollout(env_id, act, 1, seed)  # one episode at a time: exactly `episodes` of them
    for e in range(1, episodes):
        eps += rollout(env_id, act, 1, seed + e)
    return float(np.mean([np.sum(ep.rewards) for ep in eps]))


def check_dataset_id(dataset_id: str):
    """Refuse an id that Minari would not take: (namespace/)name-vN, as minari's own DATASET_ID_RE,
    with its version. A namespace has at least two characters; the characters are letters, digits, -
    and _ (and / between levels)."""
    from minari.dataset.minari_dataset import DATASET_ID_RE

    match = DATASET_ID_RE.fullmatch(dataset_id)
    if match is None or match.group("version") is None:
        raise DatasetError(
            f"--id {dataset_id!r} is not a Minari dataset id: "
            "[namespace/]name-vN (letters, digits, - and _; a namespace "
            "of two characters or more), e.g. canonrl/hopper/medium-v0"
        )


def check_root(root: Path):
    """Refuse a root where no dataset can be written: its nearest folder that exists must take a new
    folder. The probe (a temporary folder, removed at once) leaves nothing behind."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DatasetError(f"--root {root}: {existing} is not a folder")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        raise DatasetError(
            f"--root {root} cannot be written: no folder can be made in {existing} ({e.strerror})"
        )


def expert_as_number(expert: str) -> float | None:
    """--expert as a return, or None when it is not a number (then it is a model.pt). A number must
    be finite."""
    try:
        number = float(expert)
    except ValueError:
        return None
    if not math.isfinite(number):
        raise DatasetError(
            f"--expert {expert}: an expert return must be a finite number (or give its model.pt)"
        )
    return number


def make_dataset(
    kind: str,
    env_id: str | None = None,
    policy: Path | None = None,
    checkpoint: Path | None = None,
    expert: str | None = None,
    steps: int = 100_000,
    seed: int = 0,
    root: Path | None = None,
    dataset_id: str | None = None,
    epsilon: float | None = None,
):
    """Write a dataset (see the module's docstring) and return its directory."""
    import minari

    if kind not in KINDS:
        raise DatasetError(f"unknown --kind {kind!r}: one of {', '.join(KINDS)}")
    if (kind in ("medium", "expert")) != (policy is not None) or (kind == "medium-replay") != (
        checkpoint is not None
    ):
        takes = {
            "random": "neither --policy nor --checkpoint (give --env-id)",
            "medium-replay": "--checkpoint (a run's checkpoint.pt) only",
        }.get(kind, "--policy (a model.pt) only")
        raise DatasetError(f"--kind {kind} takes {takes}")
    if dataset_id is not None:
        check_dataset_id(dataset_id)
    root = Path(
        root or os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets"
    ).resolve()
    check_root(root)
    expert_number = None if expert is None else expert_as_number(expert)
    head, dirty = git_head()
    record = {"kind": kind, "seed": seed, "commit": head + ("-dirty" if dirty else "")}
    if policy is not None:
        script, env_id_, _, behave = load_policy(policy, epsilon)
        record.update(policy=str(policy), policy_sha256=sha256(Path(policy)), script=script)
        if epsilon is not None:
            record.update(epsilon=epsilon)
    elif checkpoint is not None:
        episodes, run_args = replay_episodes(Path(checkpoint))
        env_id_ = run_args["env_id"]
        config = Path(checkpoint).parent / "config.json"
        script = json.loads(config.read_text())["script"] if config.is_file() else "unknown"
        record.update(
            policy=f"the replay buffer of {checkpoint}",
            policy_sha256=sha256(Path(checkpoint)),
            script=script,
        )
    else:
        if env_id is None:
            raise DatasetError("--kind random needs --env-id")
        env_id_, script = env_id, "uniform random actions"
        record.update(policy=script)
    if env_id is not None and env_id != env_id_:
        raise DatasetError(f"--env-id {env_id} but the policy was trained on {env_id_}")
    env_id = env_id_
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        load_script("impala.py")  # registers the MinAtar/<Game>-v1 ids as the scripts do
    if env_id not in gym.registry:
        raise DatasetError(f"unknown env id {env_id!r}")
    dataset_id = dataset_id or f"canonrl/{env_id.split('-v')[0].lower()}/{kind}-v0"
    check_dataset_id(dataset_id)
    if (root / dataset_id).exists():
        raise DatasetError(f"{root / dataset_id} exists: delete it or give another --id")
    if expert is None:
        raise DatasetError(
            "--expert is needed: the model.pt whose greedy return is "
            "a normalised score of 100 (or that return as a number)"
        )
    if expert_number is not None:
        expert_return = expert_number
        record["expert"] = f"the return {expert_return} as given"
    else:
        _, e_env, e_greedy, _ = load_policy(Path(expert))
        if e_env != env_id:
            raise DatasetError(
                f"--expert {expert} was trained on {e_env}, the dataset is of {env_id}"
            )
        expert_return = mean_return(env_id, lambda obs, rng: e_greedy(obs))
        record.update(expert=str(expert), expert_sha256=sha256(Path(expert)))
    random_return = mean_return(env_id, random_act(env_id))
    if kind == "random":
        episodes = rollout(env_id, random_act(env_id), steps, seed)
    elif kind in ("medium", "expert"):
        episodes = rollout(env_id, behave, steps, seed)
    returns = np.array([np.sum(ep.rewards) for ep in episodes])
    record.update(
        episodes=len(episodes),
        steps=int(sum(len(ep.rewards) for ep in episodes)),
        return_mean=float(returns.mean()),
        return_std=float(returns.std()),
        return_min=float(returns.min()),
        return_max=float(returns.max()),
        random_return=random_return,
        expert_return=expert_return,
    )
    import warnings

    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)  # Minari writes under it
    try:
        # Minari asks for an author email and an eval env
        with warnings.catch_warnings(action="ignore"):
            minari.create_dataset_from_buffers(
                dataset_id,
                episodes,
                env=env_id,
                algorithm_name=f"{script} ({kind})",
                author="canonrl",
                code_permalink=f"canonrl {record['commit']}: benchmark/datasets.py",
                ref_min_score=random_return,
                ref_max_score=expert_return,
                num_episodes_average_score=SCORE_EPISODES,
                description=json.dumps(record),
                data_format="hdf5",
            )
    finally:
        os.environ.pop("MINARI_DATASETS_PATH") if before is None else os.environ.update(
            MINARI_DATASETS_PATH=before
        )
    return root / dataset_id


def standard(name: str, root: Path = ROOT / "runs" / "datasets") -> Path:
    """The directory of the dataset STANDARD[name] under root, made first if it is not there.
    Processes that ask for it at once take turns (a lock file beside it): the first makes it, in a
    temporary directory renamed into place, and the others then find it whole."""
    import fcntl

    final = Path(root) / name
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "data" / "metadata.json").is_file():
            with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
                os.rename(make_dataset(**STANDARD[name], root=Path(tmp)), final)
    return final


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument(
        "--policy", type=Path, help="medium, expert: the model.pt of a run of algos/ that acts"
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="medium-replay: the checkpoint.pt whose replay buffer is the data",
    )
    p.add_argument("--env-id", help="random: the env (the others take the policy's)")
    p.add_argument(
        "--expert", help="the model.pt (or a return) that scores 100 on the normalised scale"
    )
    p.add_argument(
        "--steps", type=int, default=100_000, help="transitions, rounded up to a whole episode"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="episode e starts from env.reset(seed=seed + e)"
    )
    p.add_argument(
        "--epsilon",
        type=float,
        help="medium, expert of a dqn.py policy: act epsilon-greedily at this "
        "epsilon (default the run's final one)",
    )
    p.add_argument("--root", type=Path, help="default MINARI_DATASETS_PATH or ~/.minari/datasets")
    p.add_argument("--id", dest="dataset_id", help="default canonrl/<env>/<kind>-v0")
    args = p.parse_args(argv)
    try:
        if args.steps < 1:
            raise DatasetError("--steps must be >= 1")
        if args.seed < 0:
            raise DatasetError(
                "--seed must be >= 0 (episode e starts from env.reset(seed=seed + e))"
            )
        if args.epsilon is not None and not 0 <= args.epsilon <= 1:  # false for nan too
            raise DatasetError("--epsilon must be in [0, 1]")
        path = make_dataset(
            args.kind,
            args.env_id,
            args.policy,
            args.checkpoint,
            args.expert,
            args.steps,
            args.seed,
            args.root,
            args.dataset_id,
            args.epsilon,
        )
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = json.loads((path / "data" / "metadata.json").read_text())
    record = json.loads(meta["description"])
    print(
        f"{path}: {record['episodes']} episodes, {record['steps']} steps, return "
        f"{record['return_mean']:.2f} +- {record['return_std']:.2f} (random "
        f"{record['random_return']:.2f}, expert {record['expert_return']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
