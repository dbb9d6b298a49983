import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmark.datasets import standard
from benchmark.runs import ALGOS, run_script, start_script

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(1)

# The offline scripts' datasets: 2,000 steps of the medium Pendulum policy (continuous actions) and
# of the medium CartPole policy (discrete), benchmark/datasets.py STANDARD, made under
# runs/datasets/ by the first test session (the fixture below).
OFFLINE_DATASET = ALGOS.parent / "runs" / "datasets" / "pendulum-medium-tiny-v0"
OFFLINE_DISCRETE_DATASET = ALGOS.parent / "runs" / "datasets" / "cartpole-medium-tiny-v0"
OFFLINE_DISCRETE = {"bc_discrete.py", "cql_discrete.py"}
OFFLINE = {
    "bc_continuous.py",
    "td3_bc_continuous.py",
    "iql_continuous.py",
    "cql_continuous.py",
} | OFFLINE_DISCRETE

# Every script with a cheap env and flags for a few hundred steps (the --env-id first: tests read it
# from there).
SMOKE = {
    "ppo.py": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "512",
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--update-epochs",
        "2",
        "--eval-episodes",
        "2",
    ],
    "a2c.py": ["--env-id", "CartPole-v1", "--total-timesteps", "600", "--eval-episodes", "2"],
    "pqn.py": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "512",
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "2",
        "--eval-episodes",
        "2",
    ],
    # one actor in this process (no Ray: deterministic); tests/test_impala.py runs the Ray actors
    "impala.py": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "640",
        "--num-actors",
        "0",
        "--num-envs",
        "4",
        "--eval-episodes",
        "2",
    ],
    **{
        script: [
            "--env-id",
            "CartPole-v1",
            "--total-timesteps",
            "600",
            "--learning-starts",
            "200",
            "--batch-size",
            "32",
            "--eval-episodes",
            "2",
        ]
        for script in ("dqn.py", "c51.py", "qrdqn.py")
    },
    "ppo_continuous.py": [
        "--env-id",
        "Hopper-v5",
        "--total-timesteps",
        "512",
        "--num-steps",
        "128",
        "--num-minibatches",
        "4",
        "--update-epochs",
        "2",
        "--eval-episodes",
        "2",
    ],
    # Breakout: a random game ends within a few hundred steps (Pong's take ~1000); 50 updates of 16
    # frame stacks (a CNN update costs 10-50 ms on one core; the tests check the run contract, not
    # learning)
    **{
        script: [
            "--env-id",
            "ALE/Breakout-v5",
            "--total-timesteps",
            "600",
            "--learning-starts",
            "400",
            "--batch-size",
            "16",
            "--buffer-size",
            "1000",
            "--eval-episodes",
            "1",
        ]
        for script in (
            "dqn_atari.py",
            "ddqn_atari.py",
            "c51_atari.py",
            "sac_atari.py",
            "rainbow_atari.py",
        )
    },
    "iqn_atari.py": [
        "--env-id",
        "ALE/Breakout-v5",
        "--total-timesteps",
        "600",
        "--learning-starts",
        "400",
        "--batch-size",
        "16",
        "--buffer-size",
        "1000",
        "--eval-episodes",
        "1",
        "--n-quantiles",
        "8",
        "--n-target-quantiles",
        "8",
        "--n-policy-quantiles",
        "8",
    ],
    **{
        script: [
            "--env-id",
            "ALE/Breakout-v5",
            "--total-timesteps",
            "512",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--eval-episodes",
            "1",
        ]
        for script in ("ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py")
    },
    **{
        script: [
            "--env-id",
            "Hopper-v5",
            "--total-timesteps",
            "600",
            "--learning-starts",
            "200",
            "--batch-size",
            "32",
            "--buffer-size",
            "1000",
            "--eval-episodes",
            "2",
        ]
        for script in ("ddpg_continuous.py", "sac_continuous.py", "td3_continuous.py")
    },
    **{
        script: [
            "--env-id",
            "3m",
            "--total-timesteps",
            "256",
            "--num-envs",
            "4",
            "--num-steps",
            "32",
            "--update-epochs",
            "2",
            "--eval-episodes",
            "2",
        ]
        for script in ("mappo_smac_lite.py", "ippo_smac_lite.py")
    },
    **{
        script: [
            "--env-id",
            "3m",
            "--total-timesteps",
            "600",
            "--num-envs",
            "4",
            "--learning-starts",
            "200",
            "--batch-size",
            "8",
            "--buffer-size",
            "64",
            "--eval-episodes",
            "2",
        ]
        for script in ("qmix_smac_lite.py", "vdn_smac_lite.py")
    },
    **{
        script: [
            "--env-id",
            "simple_spread_v3",
            "--total-timesteps",
            "512",
            "--num-envs",
            "4",
            "--num-steps",
            "32",
            "--update-epochs",
            "2",
            "--eval-episodes",
            "2",
        ]
        for script in ("mappo_mpe.py", "ippo_mpe.py")
    },
    "maddpg_mpe.py": [
        "--env-id",
        "simple_spread_v3",
        "--total-timesteps",
        "600",
        "--num-envs",
        "4",
        "--learning-starts",
        "200",
        "--batch-size",
        "32",
        "--buffer-size",
        "1000",
        "--train-every",
        "20",
        "--eval-episodes",
        "2",
    ],
    # offline: gradient steps on a tiny dataset, evaluated in its env (Pendulum-v1, CartPole-v1)
    **{
        script: [
            "--env-id",
            "Pendulum-v1",
            "--dataset",
            str(OFFLINE_DATASET),
            "--total-timesteps",
            "300",
            "--batch-size",
            "32",
            "--eval-episodes",
            "2",
        ]
        for script in sorted(OFFLINE - OFFLINE_DISCRETE)
    },
    **{
        script: [
            "--env-id",
            "CartPole-v1",
            "--dataset",
            str(OFFLINE_DISCRETE_DATASET),
            "--total-timesteps",
            "300",
            "--batch-size",
            "32",
            "--eval-episodes",
            "2",
        ]
        for script in sorted(OFFLINE_DISCRETE)
    },
    # language models: 4 updates of 8 prompts x 4 completions of the committed base, 20 held-out
    # prompts
    "grpo_lm.py": [
        "--env-id",
        "addition-v0",
        "--total-timesteps",
        "32",
        "--num-prompts",
        "8",
        "--group-size",
        "4",
        "--eval-prompts",
        "20",
    ],
    # 4 updates of 16 prompts, one completion each, 20 held-out prompts
    "ppo_lm.py": [
        "--env-id",
        "addition-v0",
        "--total-timesteps",
        "64",
        "--num-prompts",
        "16",
        "--num-minibatches",
        "2",
        "--eval-prompts",
        "20",
    ],
    # 4 updates of 16 preference pairs, 20 held-out prompts
    "dpo_lm.py": [
        "--env-id",
        "addition-v0",
        "--total-timesteps",
        "64",
        "--batch-size",
        "16",
        "--eval-prompts",
        "20",
    ],
}
# ppo_lstm.py: ppo.py's flags, on CartPole-v1 with its velocities hidden
SMOKE["ppo_lstm.py"] = ["--env-id", "CartPoleNoVel-v1", *SMOKE["ppo.py"][2:]]
# rl2.py: 2 updates of 32 trials x 20 steps (trials of 10 pulls of a 5-armed bandit), 20 trials
# evaluated
SMOKE["rl2.py"] = [
    "--env-id",
    "BernoulliBandit-k5-v0",
    "--total-timesteps",
    "1280",
    "--num-envs",
    "32",
    "--num-steps",
    "20",
    "--eval-episodes",
    "20",
]
# ppo_rnd.py: pqn.py's flags (4 updates of 4 envs x 32 steps) on MiniGrid's smallest empty room
# (100-step episodes), 2 games evaluated
SMOKE["ppo_rnd.py"] = ["--env-id", "MiniGrid-Empty-5x5-v0", *SMOKE["pqn.py"][2:]]
# gail.py: ppo.py's flags, learning from the small offline CartPole dataset
SMOKE["gail.py"] = [
    "--env-id",
    "CartPole-v1",
    "--dataset",
    str(OFFLINE_DISCRETE_DATASET),
    *SMOKE["ppo.py"][2:],
]
# grpo_agent_lm.py: grpo_lm.py's flags (4 updates of 8 prompts x 4 trajectories), on calc-v0
SMOKE["grpo_agent_lm.py"] = ["--env-id", "calc-v0", *SMOKE["grpo_lm.py"][2:]]
# The multi-agent scripts. smac_lite: --env-id is a map; they log the team return and the win rate.
# MPE: an mpe2 task; they log the per-agent mean return.
SMAC_LITE = {"mappo_smac_lite.py", "ippo_smac_lite.py", "qmix_smac_lite.py", "vdn_smac_lite.py"}
MPE = {"mappo_mpe.py", "ippo_mpe.py", "maddpg_mpe.py"}
MULTI_AGENT = SMAC_LITE | MPE
ENV_TYPO = {
    **{s: ("3mm", "3m") for s in SMAC_LITE},
    **{s: ("simple_spred_v3", "simple_spread_v3") for s in MPE},
    "grpo_lm.py": ("additon-v0", "addition-v0"),
    "grpo_agent_lm.py": ("calc-v1", "calc-v0"),
    "dpo_lm.py": ("additon-v0", "addition-v0"),
    "ppo_lm.py": ("additon-v0", "addition-v0"),
    "rl2.py": ("BernoulliBandit-k6-v0", "BernoulliBandit-k5-v0"),
    "ppo_rnd.py": ("MiniGrid-DoorKey-8x9-v0", "MiniGrid-DoorKey-8x8-v0"),
}
# An env of the action space the script does not handle, and a word its error line must contain.
DISCRETE = {
    "ppo.py",
    "pqn.py",
    "ppo_lstm.py",
    "a2c.py",
    "impala.py",
    "dqn.py",
    "c51.py",
    "qrdqn.py",
    "dqn_atari.py",
    "ddqn_atari.py",
    "c51_atari.py",
    "iqn_atari.py",
    "rainbow_atari.py",
    "ppo_atari.py",
    "ppo_atari_envpool.py",
    "ppo_atari_multigpu.py",
    "sac_atari.py",
    "grpo_lm.py",
    "grpo_agent_lm.py",
    "dpo_lm.py",
    "ppo_lm.py",
    "rl2.py",
    "ppo_rnd.py",
    "gail.py",
    *OFFLINE_DISCRETE,
}
# ppo_lstm.py and gail.py take both action spaces: their wrong env is one of another family (pixels)
WRONG_ENV = {
    s: ("CartPole-v1", "task")
    if s in ("grpo_lm.py", "grpo_agent_lm.py", "dpo_lm.py", "ppo_lm.py", "rl2.py")
    else ("ALE/Breakout-v5", "not an env")
    if s in ("ppo_lstm.py", "gail.py")
    else ("Hopper-v4", "discrete")
    if s in DISCRETE
    else ("CartPole-v1", "map")
    if s in SMAC_LITE
    else ("CartPole-v1", "task")
    if s in MPE
    else ("CartPole-v1", "continuous")
    for s in SMOKE
}
# The budget of the Ctrl-C test: long enough that the run is still training when Ctrl-C comes (after
# its first update), short enough that the resumed run finishes in seconds.
LONG = {
    "ppo.py": 30_000,
    "ppo_lstm.py": 10_000,
    "a2c.py": 10_000,
    "impala.py": 10_000,
    "dqn.py": 10_000,
    "pqn.py": 20_000,
    "c51.py": 10_000,
    "qrdqn.py": 10_000,
    "dqn_atari.py": 800,
    "ddqn_atari.py": 800,
    "c51_atari.py": 800,
    "rainbow_atari.py": 800,
    "iqn_atari.py": 800,
    "ppo_atari.py": 1536,
    "ppo_atari_envpool.py": 1536,
    "ppo_atari_multigpu.py": 1536,
    "sac_atari.py": 800,
    "ppo_continuous.py": 4096,
    "ddpg_continuous.py": 2000,
    "sac_continuous.py": 2000,
    "td3_continuous.py": 2000,
    "mappo_smac_lite.py": 2048,
    "ippo_smac_lite.py": 2048,
    "qmix_smac_lite.py": 2000,
    "vdn_smac_lite.py": 2000,
    "mappo_mpe.py": 2048,
    "ippo_mpe.py": 2048,
    "maddpg_mpe.py": 2000,
    "bc_continuous.py": 3000,
    "td3_bc_continuous.py": 2000,
    "iql_continuous.py": 2000,
    "cql_continuous.py": 1000,
    "bc_discrete.py": 3000,
    "cql_discrete.py": 3000,
    "grpo_lm.py": 800,
    "grpo_agent_lm.py": 800,
    "dpo_lm.py": 3200,
    "ppo_lm.py": 1600,
    "rl2.py": 20_480,
    "ppo_rnd.py": 10_240,
}


# Families of scripts by the env code they share (the env check and its errors; the shared blocks
# are byte-identical in every script): behaviour of the shared blocks is tested on one
# representative per family (tests/test_cli.py), and every script holds the blocks and calls them
# (tests/test_shared_blocks.py).
FAMILY = {
    **{
        s: "classic"
        for s in (
            "ppo.py",
            "ppo_lstm.py",
            "a2c.py",
            "impala.py",
            "dqn.py",
            "c51.py",
            "qrdqn.py",
            "pqn.py",
        )
    },
    **{
        s: "atari"
        for s in (
            "dqn_atari.py",
            "ddqn_atari.py",
            "c51_atari.py",
            "iqn_atari.py",
            "sac_atari.py",
            "rainbow_atari.py",
            "ppo_atari.py",
            "ppo_atari_envpool.py",
            "ppo_atari_multigpu.py",
        )
    },
    **{
        s: "continuous"
        for s in (
            "ppo_continuous.py",
            "ddpg_continuous.py",
            "sac_continuous.py",
            "td3_continuous.py",
        )
    },
    **{s: "smac_lite" for s in SMAC_LITE},
    **{s: "mpe" for s in MPE},
    **{s: "offline" for s in OFFLINE},
    "grpo_lm.py": "lm",
    "grpo_agent_lm.py": "lm",
    "dpo_lm.py": "lm",
    "ppo_lm.py": "lm",
    "rl2.py": "meta",
    "ppo_rnd.py": "exploration",
    # imitation from demonstrations: learns from a dataset, as the offline scripts do
    "gail.py": "offline",
}
REPRESENTATIVE = {
    "classic": "ppo.py",
    "atari": "dqn_atari.py",
    "continuous": "sac_continuous.py",
    "smac_lite": "mappo_smac_lite.py",
    "mpe": "maddpg_mpe.py",
    "offline": "td3_bc_continuous.py",
    "lm": "grpo_lm.py",
    "meta": "rl2.py",
    "exploration": "ppo_rnd.py",
}


# The scripts the run contract's end-to-end tests (Ctrl-C, resume with a new budget, another seed)
# run on: one per family, and impala.py (its actors stop first). Ctrl-C also runs on ppo.py, dqn.py,
# sac_continuous.py and qmix_smac_lite.py against an uninterrupted run (tests/test_run_contract.py);
# every other script's checkpoint is checked object by object, and its loop's calls into canonrl
# statically.
PER_FAMILY = sorted({*REPRESENTATIVE.values(), "impala.py"})


def smoke_env(script: str) -> str:
    return SMOKE[script][SMOKE[script].index("--env-id") + 1]


SCRIPTS = sorted(p.name for p in ALGOS.glob("*.py"))


@pytest.fixture(params=sorted(SMOKE))
def smoke_script(request):
    return request.param


SMOKE_RUN = ["--save-model", "--seed", "7"]  # the shared smoke run's flags after SMOKE[script]


@pytest.fixture(scope="session", autouse=True)
def offline_dataset():
    """OFFLINE_DATASET and OFFLINE_DISCRETE_DATASET, made if they are not there yet (seconds, once
    per checkout)."""
    return [
        standard(path.name, path.parent) for path in (OFFLINE_DATASET, OFFLINE_DISCRETE_DATASET)
    ]


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """smoke_runs(script, dest): the script's smoke run (SMOKE[script] + SMOKE_RUN, forked) with a
    copy of its run directory at dest; returns SimpleNamespace(out=the CompletedProcess,
    run_dir=where it ran). A test worker runs each script's smoke run once, and every test that only
    reads a finished run (or resumes it) gets its own copy: one run instead of one per test. The
    tests that use it are grouped by script, so that one worker runs them all."""
    runs, root = {}, tmp_path_factory.mktemp("smoke-runs")

    def get(script: str, dest):
        if script not in runs:
            run_dir = root / script[:-3]
            runs[script] = SimpleNamespace(
                out=run_script(script, SMOKE[script] + SMOKE_RUN, run_dir, fork=True),
                run_dir=run_dir,
            )
        run = runs[script]
        assert run.out.returncode == 0, run.out.stderr[-2000:]
        shutil.copytree(run.run_dir, dest)
        return run

    return get


# before pytest-xdist reads the xdist_group marks (--dist loadgroup)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if "smoke_runs" in item.fixturenames:
            params = item.callspec.params
            item.add_marker(
                pytest.mark.xdist_group(f"smoke-{params.get('smoke_script') or params['script']}")
            )

    # the learning gates first, the longest first: the two workers then end together, not one
    # of them on a gate of minutes while the other waits
    def order(item):
        gate = getattr(item, "callspec", None) and item.callspec.params.get("gate")
        return -gate.cpu_seconds if item.name.startswith("test_gate[") else 0

    items.sort(key=order)


@pytest.fixture
def ray_cluster():
    """A Ray cluster of its own in a separate process (benchmark.ray_backend.separate_cluster):
    yields its address, the environment a driver needs and the head's pid (the session id of every
    process the cluster starts)."""
    pytest.importorskip("ray")
    from benchmark.ray_backend import separate_cluster

    with separate_cluster(num_cpus=2) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def restore_pythonbreakpoint():
    """ray.init sets PYTHONBREAKPOINT in the process that calls it, and the fork server refuses a
    run whose PYTHON* variables differ from its own: a test that starts Ray in this process must
    not break the forked runs of the tests after it on the same worker."""
    before = os.environ.get("PYTHONBREAKPOINT")
    yield
    if before is None:
        os.environ.pop("PYTHONBREAKPOINT", None)
    else:
        os.environ["PYTHONBREAKPOINT"] = before


def changed_json(source, tmp_path, change) -> str:
    """A copy of the JSON file `source` in tmp_path (same name), changed by change(contents) in
    place; returns its path."""
    contents = json.loads(Path(source).read_text())
    change(contents)
    path = tmp_path / Path(source).name
    path.write_text(json.dumps(contents))
    return str(path)


def record_ppo_loss(module, monkeypatch) -> list:
    """Wrap module.ppo_loss so that each call appends (the new log-probabilities, the rollout's)
    to the list returned."""
    calls = []
    ppo_loss = module.ppo_loss

    def recording_loss(logprob, entropy, value, old_logprobs, *rest, **kwargs):
        calls.append((logprob.detach().clone(), old_logprobs.clone()))
        return ppo_loss(logprob, entropy, value, old_logprobs, *rest, **kwargs)

    monkeypatch.setattr(module, "ppo_loss", recording_loss)
    return calls


def one_error_line(script: str, flags: list[str], run_dir) -> str:
    """Run script with bad flags: exit status 2, one line on stderr, nothing written to run_dir;
    returns the line."""
    from benchmark.runs import run_script

    out = run_script(script, flags, run_dir, fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert not run_dir.exists(), "a bad-input run must not write anything"
    return lines[0]


class CountEnv(gym.Env):
    """Pays 1 per step; even episodes terminate after 3 steps (return 3), odd ones would go on but
    hit the TimeLimit of 4 steps (return 4, truncated). obs = [t, kind]. Registered as
    CountEnv-v0 (tests/test_episode_accounting.py, tests/test_pqn.py)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.episode = -1

    def _obs(self):
        return np.array([self.t, self.episode % 2], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.episode % 2 == 0 and self.t == 3, False, {}


gym.register("CountEnv-v0", entry_point=CountEnv, max_episode_steps=4)


def ctrl_c(script, flags, run_dir) -> int:
    """Start a run, press Ctrl-C once it has logged losses; returns the step of the checkpoint it
    left."""
    proc = start_script(script, flags, run_dir, fork=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (
        (run_dir / "metrics.csv").exists() and "losses/" in (run_dir / "metrics.csv").read_text()
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"]
