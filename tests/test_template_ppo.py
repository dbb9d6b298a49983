"""Issue 30 on the PPO family (ppo*.py, mappo/ippo_*.py) and the MPE family
(mappo/ippo/maddpg_mpe.py): evaluate() goes through each agent's one greedy-action method,
--anneal-lr and --anneal-clip mean one thing each, the shared ppo_loss and MPEEnvs keep their
behaviour, and --capture-video records an evaluation game of ppo_atari.py."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from benchmark.runs import load_script, read_rows, run_script
from canonrl.run import plain

PPO_FAMILY = [
    "ppo.py",
    "ppo_continuous.py",
    "ppo_atari.py",
    "ppo_atari_envpool.py",
    "ppo_atari_multigpu.py",
    "mappo_smac_lite.py",
    "ippo_smac_lite.py",
    "mappo_mpe.py",
    "ippo_mpe.py",
]


def flip_greedy(monkeypatch, cls, flip):
    """Make cls.get_greedy_action return flip(its action); returns the list that records each
    call."""
    calls, greedy = [], cls.get_greedy_action
    monkeypatch.setattr(
        cls, "get_greedy_action", lambda self, *x: calls.append(1) or flip(greedy(self, *x))
    )
    return calls


def test_ppo_continuous_evaluates_the_agents_mean_action_with_its_statistics(monkeypatch):
    m = load_script("ppo_continuous.py")
    torch.manual_seed(0)
    agent, stats = m.Agent(4, 1), m.RunningMeanStd(shape=(4,))
    returns = m.evaluate(agent, stats, "InvertedPendulum-v5", 2, 1)
    with torch.no_grad():  # a layer added to the agent's actor changes the evaluation
        agent.actor_mean = nn.Sequential(agent.actor_mean, nn.Linear(1, 1))
        agent.actor_mean[1].weight.fill_(-50.0)
        agent.actor_mean[1].bias.fill_(3.0)
    assert m.evaluate(agent, stats, "InvertedPendulum-v5", 2, 1) != returns
    calls = flip_greedy(monkeypatch, m.Agent, lambda a: -a)
    m.evaluate(agent, stats, "InvertedPendulum-v5", 1, 1)
    assert calls


def test_running_statistics_round_trip_through_a_weights_only_checkpoint(tmp_path):
    m = load_script("ppo_continuous.py")
    stats = m.RunningMeanStd(shape=(3,))
    stats.update(np.random.default_rng(0).normal(size=(50, 3)))
    torch.save(plain(stats.state_dict()), tmp_path / "s.pt")
    other = m.RunningMeanStd(shape=(3,))
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert isinstance(other.mean, np.ndarray) and np.array_equal(other.mean, stats.mean)
    assert np.array_equal(other.var, stats.var) and other.count == stats.count


@pytest.mark.parametrize(
    "script", ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py"]
)
def test_atari_evaluation_goes_through_the_greedy_action(script, monkeypatch):
    m = load_script(script)
    torch.manual_seed(0)
    agent = m.Agent(4)
    calls = flip_greedy(monkeypatch, m.Agent, lambda a: torch.full_like(a, 3))  # always LEFT
    flipped = m.evaluate(agent, "ALE/Breakout-v5", 1, seed=7)
    assert len(calls) > 10 and isinstance(flipped[0], float), "one call per step of the game"


@pytest.mark.parametrize("script", ["mappo_smac_lite.py", "ippo_smac_lite.py"])
def test_smac_lite_evaluation_goes_through_the_greedy_action(script, monkeypatch):
    m = load_script(script)
    torch.manual_seed(0)
    agent = m.Agent(obs_dim=30, state_dim=48, n_agents=3, n_actions=9, hidden=8)  # 3m's sizes
    first = m.evaluate(agent, "3m", 4, 1)
    # stop; a dead agent's no-op stays
    calls = flip_greedy(monkeypatch, m.Agent, lambda a: torch.where(a == 0, a, 1))
    stopped = m.evaluate(agent, "3m", 4, 1)
    assert calls and stopped != first and stopped["eval/win_rate"] == [0.0] * 4


@pytest.mark.parametrize("script", ["mappo_mpe.py", "ippo_mpe.py"])
def test_mpe_ppo_evaluation_goes_through_the_greedy_action(script, monkeypatch):
    m = load_script(script)
    torch.manual_seed(0)
    # simple_spread_v3's sizes
    agent = m.Agent(obs_dim=18, state_dim=54, n_agents=3, n_actions=5, hidden=8)
    first = m.evaluate(agent, "simple_spread_v3", 3, 1)
    calls = flip_greedy(monkeypatch, m.Agent, lambda a: (a + 1) % 5)
    assert m.evaluate(agent, "simple_spread_v3", 3, 1) != first and calls


def test_maddpg_evaluation_and_rollout_go_through_the_greedy_action(monkeypatch):
    m = load_script("maddpg_mpe.py")
    torch.manual_seed(0)
    env = m.MPEEnvs("simple_spread_v3", 1, "cpu", continuous_actions=True)
    actors = nn.ModuleList(m.Actor(o, a, 8) for o, a in zip(env.obs_dims, env.action_dims))
    first = m.evaluate(actors, "simple_spread_v3", 2, 1)
    calls = flip_greedy(monkeypatch, m.Actor, lambda a: 1.0 - a)
    assert m.evaluate(actors, "simple_spread_v3", 2, 1) != first and calls
    calls.clear()
    # the rollout's (and targets') action
    m.joint_action(actors, torch.zeros(1, sum(env.obs_dims)), env.obs_dims)
    assert len(calls) == env.n_agents


@pytest.mark.parametrize("script", PPO_FAMILY)
def test_anneal_flags_mean_one_thing_each(script):
    """--anneal-lr anneals the learning rate only, --anneal-clip the clip coefficient only; the
    defaults keep each script's former behaviour (ppo.py: both; the others: the learning rate
    (ppo*.py) or nothing (multi-agent))."""
    m = load_script(script)
    args = m.Args()
    assert (args.anneal_lr, args.anneal_clip) == {
        "ppo.py": (True, True),
        "ppo_continuous.py": (True, False),
        "ppo_atari.py": (True, False),
        "ppo_atari_envpool.py": (True, False),
        "ppo_atari_multigpu.py": (True, False),
    }.get(script, (False, False))
    text = open(m.__file__).read()
    assert "frac * args.learning_rate if args.anneal_lr else args.learning_rate" in text
    assert "clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef" in text


def test_ppo_loss_value_clipping_and_mask():
    m = load_script("ppo.py")
    torch.manual_seed(0)
    logprob, entropy, value = torch.randn(8) * 0.1 - 1, torch.rand(8), torch.randn(8)
    old_logprobs, old_values, adv, ret = logprob.clone(), value - 5.0, torch.randn(8), value + 10.0
    _, plain = m.ppo_loss(
        logprob, entropy, value, old_logprobs, old_values, adv, ret, 0.2, 0.01, 0.5
    )
    _, clipped = m.ppo_loss(
        logprob, entropy, value, old_logprobs, old_values, adv, ret, 0.2, 0.01, 0.5, clip_vloss=0.2
    )
    assert plain["value_loss"] == pytest.approx(50.0) and clipped["value_loss"] == pytest.approx(
        0.5 * 14.8**2
    )
    # mask: the masked-out entries count for nothing; all ones: the plain mean
    mask = torch.tensor([1.0] * 4 + [0.0] * 4)
    loss_all, _ = m.ppo_loss(
        logprob, entropy, value, old_logprobs, None, adv, ret, 0.2, 0.01, 0.5, mask=torch.ones(8)
    )
    loss_plain, _ = m.ppo_loss(
        logprob, entropy, value, old_logprobs, None, adv, ret, 0.2, 0.01, 0.5
    )
    assert torch.allclose(loss_all, loss_plain)
    half, _ = m.ppo_loss(
        logprob, entropy, value, old_logprobs, None, adv, ret, 0.2, 0.01, 0.5, mask=mask
    )
    first, _ = m.ppo_loss(
        logprob[:4],
        entropy[:4],
        value[:4],
        old_logprobs[:4],
        None,
        adv[:4],
        ret[:4],
        0.2,
        0.01,
        0.5,
    )
    assert torch.allclose(half, first)


@pytest.mark.parametrize("continuous", [False, True])
def test_mpe_envs_one_step_for_both_action_kinds(continuous):
    """The one MPEEnvs: the joint observation is every agent's, concatenated (mpe2's state()); an
    episode ends by the time limit (done, not terminated) after 25 steps, its true last observation
    in final_obs, and restarts."""
    m = load_script("maddpg_mpe.py" if continuous else "mappo_mpe.py")
    env = m.MPEEnvs("simple_spread_v3", 2, "cpu", continuous_actions=continuous)
    obs = env.reset(seed=3)
    assert obs.shape == (2, sum(env.obs_dims)) and np.array_equal(
        obs.numpy()[0], env.envs[0].state()
    )
    rng = np.random.default_rng(0)
    for t in range(25):
        actions = (
            rng.random((2, sum(env.action_dims)), dtype=np.float32)
            if continuous
            else rng.integers(0, env.action_dims[0], (2, env.n_agents))
        )
        obs, reward, terminated, done, info = env.step(actions)
        assert (
            reward.shape == (2, env.n_agents) and not terminated.any() and done.all() == (t == 24)
        )
    assert (info["episode_length"] == 25).all() and not np.array_equal(
        info["final_obs"], obs.numpy()
    )
    assert np.array_equal(obs.numpy()[0], env.envs[0].state()), "reset in the same step"


def test_ppo_atari_capture_video_records_an_evaluation_game(tmp_path):
    import imageio.v2 as imageio

    out = run_script(
        "ppo_atari.py",
        [
            "--env-id",
            "ALE/Breakout-v5",
            "--total-timesteps",
            "128",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--update-epochs",
            "1",
            "--eval-episodes",
            "1",
            "--capture-video",
        ],
        tmp_path / "run",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    videos = list((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4"]
    first, n, moved = None, 0, False
    for frame in imageio.get_reader(videos[0]):  # not list(): a game is hundreds of 210x160 frames
        first = frame if first is None else first
        n, moved = n + 1, moved or bool((frame != first).any())
    assert n > 1 and moved and first.shape == (210, 160, 3), "the raw game, every frame"
    score = next(
        r["value"] for r in read_rows(tmp_path / "run") if r["name"] == "eval/episodic_return"
    )
    assert score >= 0
