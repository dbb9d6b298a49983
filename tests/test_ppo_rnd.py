"""ppo_rnd.py: RND's pieces against brute force (the forward filter that scales the intrinsic
rewards, the observation normalisation, the fixed target and the trained predictor), the two
returns (the intrinsic one runs on across episode ends), and a run's metrics."""

import importlib.util

import numpy as np
import pytest
import torch
from conftest import SMOKE

from benchmark.runs import ALGOS, read_metrics, run_script


@pytest.fixture(scope="module")
def rnd():
    spec = importlib.util.spec_from_file_location("ppo_rnd", ALGOS / "ppo_rnd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_forward_filter_carries_each_envs_discounted_sum_across_rollouts(rnd):
    rng = np.random.default_rng(0)
    rewards = rng.uniform(size=(7, 3))
    running = np.zeros(3)
    first = rnd.discounted_sums(rewards[:4], running, 0.9)
    second = rnd.discounted_sums(rewards[4:], running, 0.9)
    sums = np.concatenate([first, second])
    for i in range(3):  # sum over k <= t of 0.9 ** (t - k) * r_k, one env at a time
        for t in range(7):
            expected = sum(0.9 ** (t - k) * rewards[k, i] for k in range(t + 1))
            assert sums[t, i] == pytest.approx(expected)
    assert running == pytest.approx(sums[-1])


def test_observations_are_standardised_and_clipped(rnd):
    stats = rnd.RunningMeanStd(shape=(4,))
    stats.mean, stats.var = np.array([1.0, 0.0, 2.0, 0.0]), np.array([4.0, 1.0, 1.0, 0.0])
    views = torch.tensor([[[3.0, 1.0], [2.0, 0.0]], [[1.0, 9.0], [-4.0, 1e-3]]])  # (2, 2, 2)
    out = rnd.normalize_obs(views, stats)
    assert out.shape == (2, 4)
    assert out[0].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert out[1].tolist() == pytest.approx([0.0, 5.0, -5.0, 5.0])  # 9 and -6 std: clipped


def test_the_target_stays_fixed_and_the_predictor_learns_what_it_sees(rnd):
    torch.manual_seed(0)
    net = rnd.RND(12)
    target = [p.clone() for p in net.target.parameters()]
    seen, novel = torch.randn(64, 12), torch.randn(64, 12) + 2.0
    before = net.prediction_error(seen).mean()
    optimizer = torch.optim.Adam(net.predictor.parameters(), lr=1e-3)
    for _ in range(200):
        optimizer.zero_grad()
        net.prediction_error(seen).mean().backward()
        optimizer.step()
    assert all(p.grad is None for p in net.target.parameters())
    assert all(torch.equal(a, b) for a, b in zip(target, net.target.parameters()))
    assert net.prediction_error(seen).mean() < 0.1 * before
    # what it has not seen keeps a larger error: the intrinsic reward of novelty
    assert net.prediction_error(novel).mean() > 5 * net.prediction_error(seen).mean()


def test_the_intrinsic_return_runs_on_across_episode_ends(rnd):
    """GAE as the script calls it: the extrinsic return is cut where an episode ends, the intrinsic
    one (no dones) is the plain discounted sum through it."""
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    values, last = torch.zeros(3, 1), torch.tensor([10.0])
    _, ext = rnd.compute_gae(rewards, values, dones, last, 0.5, 1.0)
    _, intrinsic = rnd.compute_gae(rewards, values, torch.zeros_like(dones), last, 0.5, 1.0)
    assert ext[:, 0].tolist() == pytest.approx([1 + 0.5 * 2, 2, 3 + 0.5 * 10])
    assert intrinsic[:, 0].tolist() == pytest.approx(
        [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 10, 2 + 0.5 * 3 + 0.25 * 10, 3 + 0.5 * 10]
    )


@pytest.mark.parametrize("int_coef", ["1.0", "0"])
def test_a_run_logs_its_intrinsic_reward_and_the_predictors_loss(int_coef, tmp_path):
    out = run_script("ppo_rnd.py", SMOKE["ppo_rnd.py"] + ["--int-coef", int_coef], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(tmp_path)
    intrinsic = metrics["charts/intrinsic_reward"][1]
    assert len(intrinsic) == 4 and all(np.isfinite(intrinsic)) and min(intrinsic) > 0
    assert all(v > 0 for v in metrics["losses/rnd_loss"][1])
    assert len(metrics["eval/episodic_return"][1]) == 2


def test_a_minigrid_id_without_minigrid_says_what_to_install(tmp_path):
    code = (
        "import sys, runpy\n"
        "sys.modules['minigrid'] = None\n"  # as if it were not installed
        f"sys.argv = ['ppo_rnd.py', '--run-dir', {str(tmp_path / 'run')!r}]\n"
        f"runpy.run_path({str(ALGOS / 'ppo_rnd.py')!r}, run_name='__main__')\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: MiniGrid-MultiRoom-N4-S5-v1 needs minigrid: pip install -e '.[minigrid]'"
    )
    assert not (tmp_path / "run").exists()


def test_a_fixed_layout_is_the_same_map_at_every_reset_whatever_the_seed(rnd):
    def grid(env, seed):
        obs, _ = env.reset(seed=seed)
        u = env.unwrapped
        return u.grid.encode().tobytes(), tuple(u.agent_pos), u.agent_dir, obs.tobytes()

    env_id = "MiniGrid-MultiRoom-N4-S5-v1"
    fixed = rnd.make_env(env_id, layout=3)
    maps = {grid(fixed, seed) for seed in [None, 0, 1, 2, 12345]}
    assert len(maps) == 1
    assert grid(rnd.make_env(env_id, layout=4), 0) not in maps
    drawn = rnd.make_env(env_id)  # a new map each episode
    assert len({grid(drawn, seed) for seed in range(5)}) == 5
    [(layout, *_)] = maps
    assert grid(drawn, 3)[0] == layout  # the fixed map is the one the seed draws


def test_evaluation_samples_from_its_own_seed_and_leaves_the_runs_stream_alone(rnd):
    torch.manual_seed(0)
    agent = rnd.Agent((7, 7, 3), 7)
    before = torch.get_rng_state()
    first = rnd.evaluate(agent, "MiniGrid-Empty-5x5-v0", 3, seed=5, layout=2)
    assert torch.equal(torch.get_rng_state(), before)
    assert rnd.evaluate(agent, "MiniGrid-Empty-5x5-v0", 3, seed=5, layout=2) == first
    # sampled, not argmax: the untrained near-uniform policy's episodes differ from each other
    assert len(set(rnd.evaluate(agent, "MiniGrid-Empty-5x5-v0", 8, seed=6, layout=2))) > 1
