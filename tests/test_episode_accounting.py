"""Episode accounting under Gymnasium 1.x autoreset, on a tiny env with known returns and a time
limit.

CountEnv pays 1 per step and alternates two kinds of episode: even ones terminate after 3 steps
(return 3), odd ones would go on but hit the TimeLimit of 4 steps (return 4, truncated). obs = [t,
kind]."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CountEnv  # noqa: F401 (registers CountEnv-v0)

from benchmark.runs import load_script, read_metrics


def episodes(run_dir):
    metrics = read_metrics(run_dir)
    return sorted(metrics["train/episodic_return"][1].tolist()), sorted(
        metrics["train/episodic_length"][1].tolist()
    )


def test_ppo_logs_every_episode_of_every_env(tmp_path):
    ppo = load_script("ppo.py")
    # 2 envs x 14 steps = 3+4+3+4 steps per env per rollout: 4 episodes per env, 2 rollouts -> 16
    # episodes
    ppo.main(
        ppo.Args(
            env_id="CountEnv-v0",
            num_envs=2,
            num_steps=14,
            total_timesteps=56,
            eval_episodes=0,
            run_dir=str(tmp_path),
        )
    )
    assert episodes(tmp_path) == ([3.0] * 8 + [4.0] * 8, [3.0] * 8 + [4.0] * 8)


def test_dqn_logs_every_episode_and_stores_true_final_obs(tmp_path):
    dqn = load_script("dqn.py")
    dqn.main(
        dqn.Args(
            env_id="CountEnv-v0",
            num_envs=2,
            total_timesteps=56,
            learning_starts=8,
            batch_size=4,
            buffer_size=100,
            eval_episodes=0,
            run_dir=str(tmp_path),
        )
    )
    assert episodes(tmp_path) == ([3.0] * 8 + [4.0] * 8, [3.0] * 8 + [4.0] * 8)
    rb = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["rb"]
    n = rb["pos"]
    obs, next_obs, terminated = (
        torch.as_tensor(rb[k][:n]) for k in ("obs", "next_obs", "terminated")
    )
    assert n == 56
    # every stored next_obs is the real successor (t+1, same kind), never the reset observation
    assert torch.equal(next_obs[:, 0], obs[:, 0] + 1) and torch.equal(next_obs[:, 1], obs[:, 1])
    # only real termination cuts the bootstrap; the time-limit (kind 1, t = 4) does not
    assert torch.equal(terminated.bool(), (obs[:, 1] == 0) & (next_obs[:, 0] == 3))
    assert ((obs[:, 1] == 1) & (next_obs[:, 0] == 4)).sum() == 8


def test_ppo_bootstraps_truncation_not_termination():
    ppo = load_script("ppo.py")
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CountEnv-v0")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=0)

    def value_fn(obs):  # V depends on t so the test sees which observation was used
        return 10.0 + obs[:, 0]

    seen = {"terminated": 0, "truncated": 0}
    for _ in range(14):
        _, reward, terminated, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
        out = ppo.bootstrap_time_limits(reward, terminated, truncated, infos, value_fn, gamma=0.5)
        for i in range(2):
            if truncated[i]:  # bootstrapped with V(s_final) = 10 + 4, not V(reset obs) = 10
                assert out[i] == pytest.approx(1.0 + 0.5 * 14.0)
                seen["truncated"] += 1
            else:
                assert out[i] == 1.0
                seen["terminated"] += bool(terminated[i])
    assert seen == {"terminated": 4, "truncated": 4}
