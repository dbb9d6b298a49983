"""The random-policy score of an env: the 0 of the normalised scores the verdict uses
(benchmark/stats.py).

    python benchmark/random_policy.py CartPole-v1 Acrobot-v1 MountainCar-v0  # the table's entries

The table is benchmark/random_scores.toml: per env the mean undiscounted return of uniform random
actions over `episodes` episodes (the first reset seeded with `seed`, the action space seeded alike,
so the numbers reproduce exactly) and `solved`, the env's Gymnasium reward_threshold (the verdict's
fallback scale, see stats.scale).
"""

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# `python benchmark/random_policy.py` puts benchmark/ first on the path, not the root
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TABLE = Path(__file__).resolve().parent / "random_scores.toml"


@dataclass(frozen=True)
class RandomScore:
    env_id: str
    random: float  # mean return of the random policy
    std: float  # over its episodes, ddof 0
    episodes: int
    seed: int
    solved: float | None = None  # Gymnasium's reward_threshold, where the env has one


def register(env_id: str) -> str:
    """env_id, registered with gymnasium where it is a MinAtar id (minatar's own register_envs; the
    scripts that take MinAtar register the same ids with a limit of 10,000 steps, far beyond a
    random game) or a memory env (<Env>NoVel, RepeatFirst-v0: as ppo.py registers them)."""
    import gymnasium as gym

    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        import minatar.gym

        minatar.gym.register_envs()
    if env_id not in gym.registry:
        from benchmark.runs import load_script

        load_script("ppo.py")  # registers the memory envs at import
    return env_id


def random_returns(env_id: str, episodes: int = 100, seed: int = 0) -> np.ndarray:
    """Undiscounted returns of `episodes` episodes of uniform random actions (time limits as
    registered); for a language-model task (LM_BASES), lm_random_returns."""
    if env_id in LM_BASES:
        return lm_random_returns(env_id, episodes, seed)
    import gymnasium as gym

    env = gym.make(register(env_id))
    env.action_space.seed(seed)
    returns = []
    env.reset(seed=seed)  # later resets go on from this seed's stream
    for _ in range(episodes):
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        env.reset()
    env.close()
    return np.asarray(returns)


# the language-model tasks and the bases whose folders hold them
LM_BASES = {
    "addition-v0": "lm-addition-base",
    "rg:chain_sum:max_digits=1,max_terms=4": "lm-chain-sum-base",
    "calc-v0": "lm-calc-base",  # scored as one turn: random tokens make no well-formed call
}


def lm_random_returns(env_id: str, episodes: int, seed: int) -> np.ndarray:
    """A language-model task (LM_BASES): after each of the first `episodes` held-out prompts
    (cycled), tokens drawn uniformly from its base's vocabulary up to the task's completion
    budget, scored by the task's reward as the LM scripts score it (text before the end token; none:
    0)."""
    import json
    import random

    from transformers import AutoTokenizer

    from benchmark.runs import load_script

    lm = load_script("grpo_lm.py")
    base = ROOT / "benchmark" / "policies" / LM_BASES[env_id]
    tokenizer = AutoTokenizer.from_pretrained(base, trust_remote_code=False)
    task = json.loads((base / "task.json").read_text())
    rng, eos, returns = random.Random(seed), tokenizer.eos_token_id, []
    for i in range(episodes):
        problem = task["heldout"][i % len(task["heldout"])]
        tokens = [rng.randrange(len(tokenizer)) for _ in range(task["max_new_tokens"])]
        text = tokenizer.decode(tokens[: tokens.index(eos)]) if eos in tokens else None
        returns += lm.score([text], lm.problem_targets([problem]), task)["total"]
    return np.asarray(returns)


def load_random_scores(path: Path = TABLE) -> dict[str, RandomScore]:
    with open(path, "rb") as f:
        return {env_id: RandomScore(env_id, **entry) for env_id, entry in tomllib.load(f).items()}


def main(argv: list[str] | None = None) -> int:
    import argparse

    import gymnasium as gym

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("env_ids", nargs="+")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for env_id in a.env_ids:
        x = random_returns(env_id, a.episodes, a.seed)
        solved = None if env_id in LM_BASES else gym.spec(register(env_id)).reward_threshold
        print(
            f'["{env_id}"]\nrandom = {x.mean():.2f}\nstd = '
            f"{x.std():.2f}\nepisodes = {a.episodes}\nseed = {a.seed}"
            + (f"\nsolved = {float(solved)!r}" if solved is not None else "")
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
