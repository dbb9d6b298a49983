"""The off-policy actor-critic family (ddpg/sac/td3_continuous.py) and the value-decomposition
family (qmix/vdn_smac_lite.py) on the template of issue 30: evaluate() and the rollout act through
the agent's get_greedy_action (a layer added to the agent changes them), --capture-video writes a
video of evaluation episode 0, and a multi-agent script given an env id of another family names the
scripts that take it (Ctrl-C and resume of SAC and QMIX: tests/test_run_contract.py)."""

import inspect

import gymnasium as gym
import pytest
import torch

from benchmark.runs import load_script, run_script

CONTINUOUS = ("ddpg_continuous.py", "sac_continuous.py", "td3_continuous.py")
VALUE_DECOMPOSITION = ("qmix_smac_lite.py", "vdn_smac_lite.py")


class Actions(gym.Wrapper):
    """Records the actions the evaluation takes."""

    taken = []

    def step(self, action):
        Actions.taken.append(torch.as_tensor(action).clone())
        return super().step(action)


@pytest.mark.parametrize("script", CONTINUOUS)
def test_a_layer_added_to_the_actor_changes_evaluation(script, monkeypatch):
    """A layer appended to the actor (a forward hook that pushes its output to the top of the action
    range) decides every action evaluate() takes, through get_greedy_action: evaluate never rebuilds
    the policy from submodules."""
    m = load_script(script)
    torch.manual_seed(0)
    # Pendulum-v1: 3-dim observations, one action in [-2, 2]
    actor, calls = m.Actor(3, 1, -2.0, 2.0), []
    make_env = m.make_env
    monkeypatch.setattr(m, "make_env", lambda *a, **k: Actions(make_env(*a, **k)))
    greedy = actor.get_greedy_action
    monkeypatch.setattr(actor, "get_greedy_action", lambda x: calls.append(1) or greedy(x))
    Actions.taken = []
    m.evaluate(actor, "Pendulum-v1", 1, 5)
    assert calls and len(calls) == len(Actions.taken) == 200, (
        "every action comes from get_greedy_action"
    )
    assert any(abs(float(a)) < 1.99 for a in Actions.taken)

    # SAC's actor returns (mean, log_std): a huge mean squashes to the top bound
    def top(module, inputs, out):
        return (out[0] + 1e6, out[1]) if isinstance(out, tuple) else out + 1e6

    actor.register_forward_hook(top)
    Actions.taken = []
    m.evaluate(actor, "Pendulum-v1", 1, 5)
    assert len(Actions.taken) == 200 and all(float(a) >= 1.99 for a in Actions.taken), (
        "the added layer decides"
    )


class RecordingSMAC:
    """A smac_lite.BatchedSMAC that records (actions, the available actions they were chosen from)
    of every step."""

    steps = []

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, *args, **kwargs):
        out = self.env.reset(*args, **kwargs)
        self.avail = out[2]
        return out

    def step(self, actions):
        RecordingSMAC.steps.append((actions.clone(), self.avail.clone()))
        out = self.env.step(actions)
        self.avail = out[2]
        return out


@pytest.mark.parametrize("script", VALUE_DECOMPOSITION)
def test_a_layer_added_to_the_agent_network_changes_evaluation(script, monkeypatch):
    """A layer appended to the agent network (a forward hook that makes action 1, stop, the best by
    far) decides every action evaluate() takes where stop is available; unavailable actions stay
    masked."""
    m = load_script(script)
    batched = m.smac_lite.BatchedSMAC
    monkeypatch.setattr(m.smac_lite, "BatchedSMAC", lambda *a, **k: RecordingSMAC(batched(*a, **k)))
    torch.manual_seed(0)
    env = batched("3m", num_envs=1, seed=0)
    agent, calls = m.RNNAgent(env.obs_dim + env.n_actions + env.n_agents, env.n_actions, 16), []
    greedy = agent.get_greedy_action
    monkeypatch.setattr(agent, "get_greedy_action", lambda *a: calls.append(1) or greedy(*a))
    RecordingSMAC.steps = []
    m.evaluate(agent, "3m", 2, 5)
    assert calls and len(calls) == len(RecordingSMAC.steps), (
        "every step's actions come from get_greedy_action"
    )
    agent.register_forward_hook(
        lambda mod, inp, out: (out[0] + 1e6 * (torch.arange(out[0].shape[-1]) == 1), out[1])
    )
    RecordingSMAC.steps = []
    m.evaluate(agent, "3m", 2, 5)
    assert RecordingSMAC.steps
    for actions, avail in RecordingSMAC.steps:
        assert avail.gather(-1, actions[..., None]).all(), "an unavailable action was taken"
        assert (actions[avail[..., 1] > 0] == 1).all(), "the added layer decides"


@pytest.mark.parametrize(
    "script,greedy_call",
    [
        ("ddpg_continuous.py", "actor.get_greedy_action("),
        ("td3_continuous.py", "actor.get_greedy_action("),
        ("qmix_smac_lite.py", "agent.get_greedy_action("),
        ("vdn_smac_lite.py", "agent.get_greedy_action("),
    ],
)
def test_the_rollout_exploits_through_get_greedy_action(script, greedy_call):
    """DDPG and TD3 explore around the deterministic action, QMIX and VDN are epsilon-greedy: the
    greedy part is the agent's get_greedy_action (SAC's rollout samples its policy: it takes no
    greedy step)."""
    source = inspect.getsource(load_script(script).main)
    assert greedy_call in source and ".argmax(" not in source


def test_capture_video_records_the_first_evaluation_episode(tmp_path):
    """--capture-video on MuJoCo (headless: rendered through EGL):
    <run_dir>/videos/eval-episode-0.mp4 of the final evaluation's episode 0, one frame per step plus
    the reset frame, and the hopper moves."""
    import imageio.v2 as imageio

    flags = [
        "--env-id",
        "Hopper-v5",
        "--total-timesteps",
        "250",
        "--learning-starts",
        "200",
        "--batch-size",
        "32",
        "--eval-episodes",
        "1",
        "--capture-video",
    ]
    out = run_script("sac_continuous.py", flags, tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    videos = list((tmp_path / "run" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4"]
    # not list(): the reader says its length is inf
    frames = [frame for frame in imageio.get_reader(videos[0])]
    assert len(frames) > 10 and frames[0].ndim == 3
    assert any((f != frames[0]).any() for f in frames[1:]), "the hopper moves"


@pytest.mark.parametrize("script", VALUE_DECOMPOSITION)
@pytest.mark.parametrize(
    "env_id,expected",
    [
        ("CartPole-v1", "dqn.py"),
        ("simple_spread_v3", "mappo_mpe.py"),
        ("ALE/Breakout-v5", "ppo_atari.py"),
        ("3mm", "did you mean '3m'"),
    ],
)
def test_an_env_id_of_another_family_names_its_scripts(script, env_id, expected, capsys):
    m = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        m.check_args(m.Args(env_id=env_id))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and expected in lines[0] and env_id in lines[0]
    assert ("unknown" in lines[0]) == (env_id == "3mm"), lines[0]
