"""pqn.py: the Q(lambda) returns against their definition as a mixture of n-step returns (episodes
ended by termination and by a time limit, in the middle and at the end of a rollout), their two
limits (lambda 0: one-step Q-learning targets, lambda 1: Monte-Carlo returns), the rollout's
episode accounting and time-limit bootstrap under Gymnasium 1.x autoreset, a short run's metrics and
saved model, a MinAtar run, bad input, and a run stopped half-way and resumed. The rest of the run
contract is the generic tests' (conftest.SMOKE)."""

import signal
import sys

import numpy as np
import pytest
import torch
from conftest import CountEnv, one_error_line  # noqa: F401 (CountEnv: registers CountEnv-v0)

from benchmark.runs import load_script, read_metrics, read_rows, run_script

pqn = load_script("pqn.py")


def brute_force_returns(
    rewards, terminated, truncated, final_q, q_max, next_q_max, gamma, q_lambda
):
    """The lambda-return by its definition, one (t, env) at a time, in float64 Python numbers:
    R_t = (1 - lambda) sum_{n=1}^{m-1} lambda^(n-1) G_t^(n) + lambda^(m-1) G_t^(m), where m is the
    number of steps left in the episode or the rollout, and the n-step return G_t^(n) is
    r_t + ... + gamma^(n-1) r_{t+n-1} + gamma^n max_a Q(s_{t+n}, a). At the episode's last step
    the bootstrap is 0 after a termination, max_a Q(final obs) (final_q) after a truncation; at the
    rollout's end it is next_q_max."""
    T, N = rewards.shape
    out = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            m = 1
            while t + m - 1 < T - 1 and not (terminated[t + m - 1, i] or truncated[t + m - 1, i]):
                m += 1
            last = t + m - 1
            if terminated[last, i]:
                tail = 0.0
            elif truncated[last, i]:
                tail = float(final_q[last, i])
            else:  # the rollout's end
                tail = float(next_q_max[i])

            def n_step(n):
                g = sum(gamma**k * float(rewards[t + k, i]) for k in range(n))
                bootstrap = tail if n == m else float(q_max[t + n, i])
                return g + gamma**n * bootstrap

            out[t, i] = sum(
                (1 - q_lambda) * q_lambda ** (n - 1) * n_step(n) for n in range(1, m)
            ) + q_lambda ** (m - 1) * n_step(m)
    return out


def episode_data(T=9, N=6, seed=0):
    """Random rewards and Q-values, terminations and truncations in the middle and at the end of the
    rollout (env 0 none, env 1 a termination at the end, env 2 a truncation at the end)."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, N))
    q_max, next_q_max, final_q = (
        rng.normal(size=(T, N)),
        rng.normal(size=N),
        rng.normal(size=(T, N)),
    )
    ends = rng.random((T, N)) < 0.3
    ends[:, 0] = False
    ends[-1, 1:3] = True
    terminated = ends & (rng.random((T, N)) < 0.5)
    terminated[-1, 1], terminated[-1, 2] = True, False
    truncated = ends & ~terminated
    assert terminated[:-1].any() and truncated[:-1].any()
    return rewards, terminated, truncated, final_q, q_max, next_q_max


def final_observations(values):
    """infos["final_obs"] as a vector env gives it: an object array, here of one-number
    observations."""
    final_obs = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        final_obs[i] = np.array([value])
    return final_obs


def script_returns(rewards, terminated, truncated, final_q, q_max, next_q_max, gamma, q_lambda):
    """What pqn.py computes: each step's reward through bootstrap_time_limits (the final
    observation's value looked up by value_fn), then q_lambda_returns over the rollout."""
    bootstrapped = np.stack(
        [
            pqn.bootstrap_time_limits(
                rewards[t],
                terminated[t],
                truncated[t],
                {"final_obs": final_observations(final_q[t])},
                lambda obs: obs[:, 0],  # a final observation [q] is worth q
                gamma,
            )
            for t in range(len(rewards))
        ]
    )
    return pqn.q_lambda_returns(
        torch.as_tensor(bootstrapped),
        torch.as_tensor(q_max),
        torch.as_tensor(terminated | truncated, dtype=torch.float64),
        torch.as_tensor(next_q_max),
        gamma,
        q_lambda,
    )


@pytest.mark.parametrize("q_lambda", [0.0, 0.3, 0.65, 1.0])
def test_q_lambda_returns_are_the_mixture_of_n_step_returns(q_lambda):
    """(< 1 s)"""
    data = episode_data()
    expected = brute_force_returns(*data, gamma=0.9, q_lambda=q_lambda)
    got = script_returns(*data, gamma=0.9, q_lambda=q_lambda)
    torch.testing.assert_close(got, torch.as_tensor(expected))


def test_lambda_0_gives_one_step_q_learning_targets():
    """r_t + gamma max_a Q(s_{t+1}, a), the bootstrap cut where the episode ended; q_max[0] is never
    used (no step leads to s_0). (< 1 s)"""
    rewards, terminated, truncated, _, q_max, next_q_max = episode_data(seed=1)
    dones = terminated | truncated  # a truncation's bootstrap is the caller's (in the reward)
    got = pqn.q_lambda_returns(
        torch.as_tensor(rewards),
        torch.as_tensor(q_max),
        torch.as_tensor(dones, dtype=torch.float64),
        torch.as_tensor(next_q_max),
        0.9,
        0.0,
    )
    next_values = np.concatenate([q_max[1:], next_q_max[None]])
    torch.testing.assert_close(got, torch.as_tensor(rewards + 0.9 * (1 - dones) * next_values))


def test_lambda_1_gives_monte_carlo_returns():
    """The discounted sum of the episode's rewards, bootstrapped with next_q_max only where the
    rollout ends inside an episode; the Q-values within the rollout play no part. By hand, then on
    random data. (< 1 s)"""
    one = [torch.tensor(v, dtype=torch.float64)[:, None] for v in ([1, 2, 3, 4], [0, 1, 0, 0])]
    got = pqn.q_lambda_returns(
        one[0], torch.full((4, 1), 100.0, dtype=torch.float64), one[1], torch.tensor([10.0]), 0.5, 1
    )
    # R_3 = 4 + 0.5 * 10, R_2 = 3 + 0.5 R_3, R_1 = 2 (the episode ends), R_0 = 1 + 0.5 R_1
    torch.testing.assert_close(got[:, 0], torch.tensor([2.0, 2.0, 7.5, 9.0], dtype=torch.float64))

    rewards, terminated, truncated, _, q_max, next_q_max = episode_data(seed=2)
    dones = terminated | truncated
    expected = np.zeros_like(rewards)
    for i in range(rewards.shape[1]):
        following = next_q_max[i]
        for t in reversed(range(len(rewards))):
            following = rewards[t, i] + (0.0 if dones[t, i] else 0.9 * following)
            expected[t, i] = following
    for q in (q_max, -q_max):
        got = pqn.q_lambda_returns(
            torch.as_tensor(rewards),
            torch.as_tensor(q),
            torch.as_tensor(dones, dtype=torch.float64),
            torch.as_tensor(next_q_max),
            0.9,
            1.0,
        )
        torch.testing.assert_close(got, torch.as_tensor(expected))


@pytest.fixture
def in_process(monkeypatch):
    """main() called in this process: no command-line flags of pytest's, and the SIGINT handler
    that RunLogger installs put back afterwards."""
    monkeypatch.setattr(sys, "argv", ["pqn.py"])
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


def test_every_episode_is_logged_and_a_truncation_bootstrapped(tmp_path, monkeypatch, in_process):
    """2 envs x 14 steps = 3+4+3+4 steps per env per rollout, 2 rollouts: 16 episodes logged. The
    rollout handed to q_lambda_returns ends an episode at steps 2, 6, 9, 13 of each env; a
    termination's reward is 1, a truncation's 1 + gamma max_a Q(final obs [4, 1]) by the network of
    the rollout; the reset observation after an end is not a transition of the episode. (~1 s)"""
    networks, rollouts = [], []

    class RecordedQNetwork(pqn.QNetwork):
        def __init__(self, *a):
            super().__init__(*a)
            networks.append(self)

    def recorded_returns(rewards, q_max, dones, next_q_max, gamma, q_lambda):
        with torch.no_grad():
            final_q = networks[0](torch.tensor([4.0, 1.0])).max()
        rollouts.append((rewards.clone(), dones.clone(), float(final_q)))
        return q_lambda_returns(rewards, q_max, dones, next_q_max, gamma, q_lambda)

    q_lambda_returns = pqn.q_lambda_returns
    monkeypatch.setattr(pqn, "QNetwork", RecordedQNetwork)
    monkeypatch.setattr(pqn, "q_lambda_returns", recorded_returns)
    pqn.main(
        pqn.Args(
            env_id="CountEnv-v0",
            num_envs=2,
            num_steps=14,
            num_minibatches=2,
            total_timesteps=56,
            eval_episodes=0,
            run_dir=str(tmp_path),
        )
    )
    metrics = read_metrics(tmp_path)
    assert sorted(metrics["train/episodic_return"][1]) == [3.0] * 8 + [4.0] * 8
    assert sorted(metrics["train/episodic_length"][1]) == [3.0] * 8 + [4.0] * 8
    assert len(rollouts) == 2
    for rewards, dones, final_q in rollouts:
        ends = [2, 6, 9, 13]
        assert dones.T.tolist() == [[float(t in ends) for t in range(14)]] * 2
        for t in range(14):
            expected = 1.0 + 0.99 * final_q if t in (6, 13) else 1.0
            assert rewards[t].tolist() == pytest.approx([expected] * 2, rel=1e-6)


def test_a_short_run_logs_the_metrics_and_its_saved_model_evaluates_alike(tmp_path):
    """(~5 s)"""
    flags = ["--total-timesteps", "2048", "--eval-episodes", "2", "--eval-every", "1024"]
    out = run_script("pqn.py", flags + ["--save-model"], tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(tmp_path / "run")
    for name in (
        "train/episodic_return",
        "train/episodic_length",
        "eval/episodic_return",
        "charts/sps",
        "losses/td_loss",
        "losses/q_values",
        "charts/epsilon",
        "charts/learning_rate",
    ):
        assert name in metrics, f"{name} missing from metrics.csv"
    # one row per rollout of 4 x 128 steps; epsilon from 1 down over half the run, lr annealed
    steps, epsilon = metrics["charts/epsilon"]
    assert steps.tolist() == [512, 1024, 1536, 2048]
    assert epsilon[0] > epsilon[-1] and epsilon[-1] == pytest.approx(0.05)
    lr = metrics["charts/learning_rate"][1]
    assert lr.tolist() == pytest.approx([2.5e-4 * f for f in (1, 0.75, 0.5, 0.25)])
    # an evaluation at 1024 and the final one at 2048
    assert sorted(set(metrics["eval/episodic_return"][0])) == [1024, 2048]
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    q_network = pqn.QNetwork(saved["obs_shape"], saved["n_actions"])
    q_network.load_state_dict(saved["q_network"])
    assert pqn.evaluate(q_network, "CartPole-v1", 2, 1 + 100_000) == saved["eval_returns"]
    # LayerNorm after each hidden layer
    assert [type(m).__name__ for m in q_network.network][:3] == ["Linear", "LayerNorm", "ReLU"]


def test_minatar_runs_on_the_grid(tmp_path):
    """A MinAtar game: (channels, 10, 10) grids through the convolution, evaluated greedily.
    (~5 s)"""
    pytest.importorskip("minatar")
    flags = [
        "--env-id",
        "MinAtar/Breakout-v1",
        "--total-timesteps",
        "512",
        "--num-steps",
        "64",
        "--eval-episodes",
        "1",
        "--save-model",
    ]
    out = run_script("pqn.py", flags, tmp_path / "run", fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(tmp_path / "run")
    assert "losses/td_loss" in metrics and len(metrics["eval/episodic_return"][1]) == 1
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert tuple(saved["obs_shape"]) == (4, 10, 10)
    q_network = pqn.QNetwork(saved["obs_shape"], saved["n_actions"])
    q_network.load_state_dict(saved["q_network"])
    assert isinstance(q_network.network[0], torch.nn.Conv2d)


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--num-envs", "4", "--num-steps", "10", "--num-minibatches", "3"], "40"),
        (["--q-lambda", "1.5"], "--q-lambda 1.5"),
        (["--end-e", "0.5", "--start-e", "0.1"], "--end-e 0.5"),
        (["--env-id", "Pendulum-v1"], "discrete"),
        (["--env-id", "Blackjack-v1"], "flat vector observations"),
        (["--env-id", "ALE/Breakout-v5"], "dqn_atari.py"),
        (["--env-id", "MinAtar/Breakout-v1", "--capture-video"], "no video"),
        (["--total-timesteps", "256"], "less than one rollout"),
    ],
)
def test_bad_input_is_one_line(flags, expected, tmp_path):
    """(~1 s each)"""
    assert expected in one_error_line("pqn.py", flags, tmp_path / "run")


def test_a_run_stopped_half_way_resumes_where_it_stopped(tmp_path, monkeypatch, in_process):
    """Stopped after its second rollout (as Ctrl-C stops it) and resumed, a run of 4 rollouts keeps
    the rows of the first two as an uninterrupted run logged them, and continues the schedules
    (epsilon, learning rate) where they were, not from the start; it ends with the final evaluation.
    (~3 s)"""
    common = dict(total_timesteps=2048, eval_episodes=2, checkpoint_every=100_000)
    pqn.main(pqn.Args(**common, run_dir=str(tmp_path / "whole")))

    progress = pqn.RunLogger.progress

    def stop_at_1024(self, step):  # what Ctrl-C does: finish the iteration, save, exit
        progress(self, step)
        self.stop_requested = self.stop_requested or step >= 1024

    monkeypatch.setattr(pqn.RunLogger, "progress", stop_at_1024)
    with pytest.raises(SystemExit) as stopped:
        pqn.main(pqn.Args(**common, run_dir=str(tmp_path / "stopped")))
    assert stopped.value.code == 130
    assert (
        torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)["global_step"] == 1024
    )
    monkeypatch.setattr(pqn.RunLogger, "progress", progress)
    pqn.main(pqn.Args(resume=str(tmp_path / "stopped")))

    def rows(name, clock=("charts/sps", "charts/train_seconds")):
        return [
            (r["global_step"], r["name"], None if r["name"] in clock else r["value"])
            for r in read_rows(tmp_path / name)
        ]

    whole, resumed = rows("whole"), rows("stopped")
    assert [r for r in resumed if r[0] <= 1024] == [r for r in whole if r[0] <= 1024]
    for name in ("charts/epsilon", "charts/learning_rate"):
        assert [r for r in resumed if r[1] == name] == [r for r in whole if r[1] == name]
    assert resumed[-1][:2] == (2048, "eval/episodic_return")
    assert [r[0] for r in resumed] == sorted(r[0] for r in resumed)
