"""The value-based family (dqn.py, c51.py and the Atari scripts dqn/ddqn/c51/iqn/sac_atari.py) on
the template of issue 30: evaluate() and the rollout act through the agent's get_greedy_action (a
layer added to the agent changes them), --compile computes the eager loss for c51_atari and
iqn_atari, and --capture-video writes a playable video of evaluation game 0."""

import inspect

import gymnasium as gym
import pytest
import torch

from benchmark.runs import load_script, run_script

ATARI = ("dqn_atari.py", "ddqn_atari.py", "c51_atari.py", "iqn_atari.py", "sac_atari.py")
CLASSIC = ("dqn.py", "c51.py", "qrdqn.py")


def agent_of(m, script: str):
    """The network a script evaluates, freshly initialised (MinAtar Breakout: 3 actions; CartPole:
    2)."""
    torch.manual_seed(0)
    if script == "sac_atari.py":
        return m.Actor(3)
    return m.QNetwork(4, 2) if script in CLASSIC else m.QNetwork(3)


class Actions(gym.Wrapper):
    """Records the actions the evaluation takes."""

    taken = []

    def step(self, action):
        Actions.taken.append(int(action))
        return super().step(action)


@pytest.mark.parametrize("script", ATARI + CLASSIC)
def test_a_layer_added_to_the_agent_changes_evaluation(script, monkeypatch):
    """A layer appended to the agent (a forward hook that makes action 1 the best by far) must
    decide every action evaluate() takes, through get_greedy_action: evaluate never rebuilds the
    policy from the agent's submodules."""
    m = load_script(script)
    agent, calls = agent_of(m, script), []
    make_env = m.make_env
    monkeypatch.setattr(m, "make_env", lambda *a, **k: Actions(make_env(*a, **k)))
    greedy = agent.get_greedy_action
    monkeypatch.setattr(agent, "get_greedy_action", lambda x: calls.append(1) or greedy(x))
    env_id, kwargs = (
        ("CartPole-v1", {}) if script in CLASSIC else ("MinAtar/Breakout-v1", {"epsilon": 0.0})
    )
    Actions.taken = []
    m.evaluate(agent, env_id, 1, 5, **kwargs)
    assert calls and len(calls) == len(Actions.taken), "every action comes from get_greedy_action"
    handle = agent.register_forward_hook(
        lambda mod, inp, out: out + 1e6 * (torch.arange(out.shape[-1]) == 1)
    )
    Actions.taken = []
    m.evaluate(agent, env_id, 1, 5, **kwargs)
    handle.remove()
    assert Actions.taken and set(Actions.taken) == {1}, "the added layer decides the evaluation"


@pytest.mark.parametrize(
    "script", ("dqn_atari.py", "ddqn_atari.py", "c51_atari.py", "iqn_atari.py") + CLASSIC
)
def test_the_rollout_exploits_through_get_greedy_action(script):
    source = inspect.getsource(load_script(script).main)
    assert "q_network.get_greedy_action(" in source and ".argmax(" not in source


@pytest.mark.parametrize(
    "script", ["dqn_atari.py", "ddqn_atari.py", "c51_atari.py", "iqn_atari.py"]
)
def test_compiled_loss_is_the_eager_loss(script):
    """--compile: torch.compile(q_loss) gives the eager loss, Q-values and gradients (to float
    rounding)."""
    m = load_script(script)
    torch.manual_seed(0)
    q, q_target, n = m.QNetwork(4), m.QNetwork(4), 8
    batch = (
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 4, (n,)),
        torch.randn(n),
        (torch.rand(n) < 0.2).float(),
        0.99,
    )
    if script == "iqn_atari.py":
        batch += (torch.rand(n, 8), torch.rand(n, 6), 1.0)  # the fractions tau, tau' and kappa
    results = []
    for fn in (m.q_loss, torch.compile(m.q_loss)):
        q.zero_grad()
        loss, q_pred = fn(q, q_target, *batch)
        loss.backward()
        results.append((loss.detach(), q_pred.detach(), [p.grad.clone() for p in q.parameters()]))
    (eager, eager_q, eager_grads), (comp, comp_q, comp_grads) = results
    assert torch.allclose(eager, comp, rtol=1e-4) and torch.allclose(
        eager_q, comp_q, rtol=1e-4, atol=1e-6
    )
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(eager_grads, comp_grads))


def test_capture_video_records_evaluation_game_0(tmp_path):
    """--capture-video on an Atari game: <run_dir>/videos/eval-episode-0.mp4, the raw game (210x160
    frames) of the final evaluation's game 0, frame by frame; the frames change."""
    import imageio.v2 as imageio

    flags = [
        "--env-id",
        "ALE/Breakout-v5",
        "--total-timesteps",
        "300",
        "--learning-starts",
        "100",
        "--batch-size",
        "16",
        "--buffer-size",
        "400",
        "--eval-episodes",
        "1",
        "--capture-video",
    ]
    out = run_script("dqn_atari.py", flags, tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    videos = list((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4"]
    frames = list(imageio.get_reader(videos[0]).iter_data())
    assert len(frames) > 10 and frames[0].shape[:2] == (210, 160)
    assert any((f != frames[0]).any() for f in frames[1:]), "the game moves"
