"""The offline family: the dataset maker (benchmark/datasets.py) and the Minari round trip, the
losses of the offline scripts, and their bad input (a missing dataset, one of the wrong action
space, an empty or damaged one, a reward scale without a spread of returns)."""

import json
import shutil
import warnings

import h5py
import minari
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import OFFLINE_DATASET, OFFLINE_DISCRETE_DATASET, SMOKE

from benchmark import datasets
from benchmark.runs import load_script, read_metrics, run_script

pytestmark = pytest.mark.xdist_group("offline")


@pytest.fixture(scope="module")
def td3_bc():
    return load_script("td3_bc_continuous.py")


def test_a_dataset_round_trip_gives_the_rollout_back(tmp_path, td3_bc):
    """A dataset written by the maker and read by the scripts holds the rollout's arrays exactly,
    its episodes split where they ended (CartPole: terminations of every length; Pendulum: 200-step
    time limits), and records its policy, seed, commit and return statistics."""
    for env_id, steps in (("CartPole-v1", 300), ("Pendulum-v1", 600)):
        path = datasets.make_dataset(
            "random", env_id, expert="100", steps=steps, seed=3, root=tmp_path
        )
        episodes = datasets.rollout(env_id, datasets.random_act(env_id), steps, 3)
        dataset = td3_bc.open_dataset(str(path))
        read = list(dataset.iterate_episodes())
        assert [len(ep.rewards) for ep in read] == [len(ep.rewards) for ep in episodes]
        for ours, theirs in zip(episodes, read):
            for field in ("observations", "actions", "rewards", "terminations", "truncations"):
                assert np.array_equal(np.asarray(getattr(ours, field)), getattr(theirs, field)), (
                    field
                )
            assert theirs.terminations[-1] or theirs.truncations[-1]  # it ends where it ended
            assert not (theirs.terminations[:-1].any() or theirs.truncations[:-1].any())
        arrays = td3_bc.dataset_arrays(dataset)
        n = sum(len(ep.rewards) for ep in episodes)
        assert n >= steps and {k: len(v) for k, v in arrays.items()} == dict.fromkeys(arrays, n)
        assert np.array_equal(
            arrays["next_obs"][: len(episodes[0].rewards)], episodes[0].observations[1:]
        )
        if env_id == "CartPole-v1":
            assert arrays["actions"].dtype == np.int64 and arrays["terminated"].sum() == len(
                episodes
            )
        record = json.loads(dataset.storage.metadata["description"])
        returns = [float(np.sum(ep.rewards)) for ep in episodes]
        assert record["kind"] == "random" and record["seed"] == 3 and record["commit"]
        assert record["return_mean"] == pytest.approx(np.mean(returns)) and record[
            "episodes"
        ] == len(episodes)
        assert dataset.storage.metadata["ref_max_score"] == 100.0
        assert dataset.storage.metadata["ref_min_score"] == pytest.approx(record["random_return"])
        assert td3_bc.normalized_scores([record["random_return"], 100.0], dataset) == pytest.approx(
            [0.0, 100.0]
        )


def test_medium_replay_is_the_replay_buffer_of_a_run(tmp_path):
    """--kind medium-replay: the transitions of a run's checkpointed replay buffer, in order, cut
    into episodes where they terminated or where the next transition does not continue (Pendulum's
    200-step time limit)."""
    run = tmp_path / "run"
    out = run_script(
        "sac_continuous.py",
        [
            "--env-id",
            "Pendulum-v1",
            "--total-timesteps",
            "500",
            "--learning-starts",
            "100",
            "--batch-size",
            "32",
            "--buffer-size",
            "1000",
            "--eval-episodes",
            "1",
        ],
        run,
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    path = datasets.make_dataset(
        "medium-replay", checkpoint=run / "checkpoint.pt", expert="-150", root=tmp_path
    )
    rb = torch.load(run / "checkpoint.pt", weights_only=True)["rb"]
    read = list(load_script("td3_bc_continuous.py").open_dataset(str(path)).iterate_episodes())
    assert [len(ep.rewards) for ep in read] == [200, 200, 100]
    # the last: where the buffer ends
    assert [bool(ep.truncations[-1]) for ep in read] == [True, True, True]
    obs = np.concatenate([ep.observations[:-1] for ep in read])
    assert np.array_equal(obs, rb["obs"][:500].numpy())
    assert np.array_equal(np.concatenate([ep.actions for ep in read]), rb["actions"][:500].numpy())


def test_the_standard_medium_replay_dataset_is_the_buffer_of_the_medium_policys_run():
    """The committed replay.pt behind cartpole-medium-replay-v0 holds the replay buffer of the run
    whose final policy makes the CartPole medium dataset (its flags are that run's): 20k
    transitions, every one, from random play on."""
    saved = torch.load(datasets.MEDIUM_DQN_REPLAY, weights_only=True)
    run_args = json.loads((datasets.MEDIUM_DQN.parent / "config.json").read_text())["args"]
    assert saved["args"] == run_args and saved["rb"]["pos"] == run_args["total_timesteps"] == 20_000
    episodes, _ = datasets.replay_episodes(datasets.MEDIUM_DQN_REPLAY)
    assert sum(len(ep.rewards) for ep in episodes) == 20_000 and len(episodes) == 198
    assert (
        datasets.STANDARD["cartpole-medium-replay-v0"]["checkpoint"] == datasets.MEDIUM_DQN_REPLAY
    )


def test_epsilon_sets_how_often_a_dqn_policy_acts_at_random(tmp_path, capsys):
    """--epsilon: a dqn.py policy acts greedily at 0 and uniformly at random at 1 (half its actions
    then agree with the greedy one); the dataset records it. A policy of another script refuses it,
    one line, nothing written."""
    _, _, greedy, _ = datasets.load_policy(datasets.MEDIUM_DQN)
    agree = {}
    for epsilon in (0.0, 1.0):
        path = datasets.make_dataset(
            "medium",
            policy=datasets.MEDIUM_DQN,
            expert="500",
            steps=400,
            seed=0,
            root=tmp_path,
            dataset_id=f"cp/eps{epsilon:.0f}-v0",
            epsilon=epsilon,
        )
        episodes = list(minari.load_dataset(str(path)).iterate_episodes())
        agree[epsilon] = np.mean(
            [greedy(o) == a for ep in episodes for o, a in zip(ep.observations, ep.actions)]
        )
        assert (
            json.loads(minari.load_dataset(str(path)).storage.metadata["description"])["epsilon"]
            == epsilon
        )
    assert agree[0.0] == 1.0 and 0.35 < agree[1.0] < 0.65
    assert (
        datasets.main(
            [
                "--kind",
                "medium",
                "--policy",
                str(datasets.MEDIUM_SAC),
                "--expert",
                "1",
                "--epsilon",
                "0.3",
                "--root",
                str(tmp_path / "sac"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--epsilon is for dqn.py policies" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sac").exists()


def test_a_standard_dataset_asked_for_at_once_is_made_once(tmp_path, monkeypatch):
    """Two processes (pytest workers, a suite's runs) that ask for a missing STANDARD dataset at
    once: one makes it, the other waits and finds it whole."""
    import multiprocessing

    made = tmp_path / "made"
    make = datasets.make_dataset

    def counted(*args, **kwargs):
        with open(made, "a") as f:
            f.write("made\n")
        return make(*args, **kwargs)

    monkeypatch.setattr(datasets, "make_dataset", counted)  # the forked processes inherit it
    procs = [
        multiprocessing.get_context("fork").Process(
            target=datasets.standard, args=("cartpole-medium-tiny-v0", tmp_path / "d")
        )
        for _ in range(2)
    ]
    [p.start() for p in procs]
    [p.join(120) for p in procs]
    assert [p.exitcode for p in procs] == [0, 0]
    assert made.read_text() == "made\n"
    assert (tmp_path / "d" / "cartpole-medium-tiny-v0" / "data" / "metadata.json").is_file()
    assert [p.name for p in (tmp_path / "d").iterdir() if not p.name.startswith(".")] == [
        "cartpole-medium-tiny-v0"
    ]


def test_the_maker_refuses_bad_input(tmp_path, capsys):
    assert (
        datasets.main(
            [
                "--kind",
                "medium",
                "--policy",
                str(tmp_path / "none.pt"),
                "--expert",
                "1",
                "--root",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "no model at" in capsys.readouterr().err
    assert (
        datasets.main(["--kind", "random", "--env-id", "Pendulum-v1", "--root", str(tmp_path)]) == 2
    )
    assert "--expert is needed" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "bad" / "checkpoint.sha256").write_text(
        datasets.sha256(tmp_path / "bad" / "checkpoint.pt") + "\n"
    )
    assert (
        datasets.main(
            [
                "--kind",
                "medium-replay",
                "--checkpoint",
                str(tmp_path / "bad" / "checkpoint.pt"),
                "--expert",
                "1",
                "--root",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "is corrupt" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["bad"], "a refused dataset writes nothing"


def test_td3_bc_scales_the_q_term_to_the_bc_term(td3_bc):
    """TD3+BC's actor loss -lambda mean Q + mean (pi - a)^2 with lambda = alpha / mean|Q| (eq. 3):
    the Q term is -alpha times the sign of mean Q whatever Q's scale, and lambda takes no
    gradient."""
    actions, data = torch.tensor([[0.5], [0.0]]), torch.tensor([[0.0], [0.0]])
    for scale in (1.0, 1000.0):
        q = (torch.tensor([1.0, 3.0]) * scale).requires_grad_()
        loss = td3_bc.td3_bc_actor_loss(q, actions, data, 2.5)
        assert loss.item() == pytest.approx(-2.5 + 0.125)  # -2.5 * 2 / 2 + (0.25 + 0) / 2
        loss.backward()
        # d/dq of -lambda mean q, lambda fixed
        assert torch.allclose(q.grad, torch.full((2,), -2.5 / 2 / (2 * scale)))


@pytest.mark.parametrize("script", ["td3_bc_continuous.py", "bc_continuous.py"])
def test_bad_datasets_are_one_line_errors(script, tmp_path, monkeypatch):
    """A missing dataset, one of discrete actions, an empty one (given by its id), a corrupt one,
    one damaged after its first episode and an env other than the dataset's: exit 2, one line,
    before any file is written."""
    cartpole = datasets.make_dataset(
        "random", "CartPole-v1", expert="500", steps=50, seed=0, root=tmp_path / "d"
    )
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "d"))
    with warnings.catch_warnings(action="ignore"):
        minari.create_dataset_from_buffers(
            "canonrl/pendulum/empty-v0", [], env="Pendulum-v1", data_format="hdf5"
        )
    corrupt = tmp_path / "corrupt"
    shutil.copytree(OFFLINE_DATASET, corrupt)
    (corrupt / "data" / "main_data.hdf5").write_bytes(b"not hdf5")
    damaged = damaged_copy(OFFLINE_DATASET, tmp_path / "damaged")
    cases = [
        (["--dataset", str(tmp_path / "nowhere")], "no dataset"),
        (["--dataset", str(cartpole)], "needs continuous (Box) actions"),
        (["--dataset", "canonrl/pendulum/empty-v0"], "is empty"),
        (["--dataset", str(corrupt)], "cannot be read"),
        (
            ["--dataset", str(damaged)],
            f"dataset file {damaged / 'data' / 'main_data.hdf5'} is damaged",
        ),
        (
            ["--dataset", str(OFFLINE_DATASET), "--env-id", "MountainCarContinuous-v0"],
            "the dataset's env",
        ),
    ]
    assert_one_line_errors(script, cases, tmp_path)


def damaged_copy(source, dest):
    """A copy of the dataset `source` in which 64 bytes are flipped at the object header of its last
    episode's rewards (found with h5py): the file opens and its first episode reads (what
    open_dataset checks), a later read fails (h5py raises KeyError)."""
    shutil.copytree(source, dest)
    path = dest / "data" / "main_data.hdf5"
    with h5py.File(path, "r") as f:
        start = h5py.h5o.get_info(f[f"episode_{len(f) - 1}/rewards"].id).addr
    data = bytearray(path.read_bytes())
    data[start : start + 64] = bytes(b ^ 0xFF for b in data[start : start + 64])
    path.write_bytes(bytes(data))
    return dest


def assert_one_line_errors(script, cases, tmp_path) -> list[str]:
    """Each (flags, expected) of `cases`: exit 2, one line starting "error:" that holds `expected`,
    no run directory. Returns the lines."""
    errors = []
    for flags, expected in cases:
        out = run_script(script, flags + ["--total-timesteps", "10"], tmp_path / "run", fork=True)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
        assert expected in lines[0], lines[0]
        assert not (tmp_path / "run").exists()
        errors.append(lines[0])
    return errors


@pytest.mark.parametrize("script", ["iql_continuous.py", "cql_continuous.py"])
def test_reward_normalisation_without_a_spread_of_returns_is_a_one_line_error(script, tmp_path):
    """--normalize-reward (the default) scales rewards by 1000 / (max - min episode return): a
    dataset of one episode has no spread, and the scale was 1e9 (losses of 1e19). It is a one-line
    error before any file is written, and --no-normalize-reward, which it suggests, trains on the
    rewards as they are. (about 5 s)"""
    one = datasets.make_dataset(
        "random", "Pendulum-v1", expert="-150", steps=150, seed=0, root=tmp_path / "d"
    )
    [error] = assert_one_line_errors(
        script, [(["--dataset", str(one)], "--normalize-reward scales rewards")], tmp_path
    )
    assert (
        "the 1 episode(s) of canonrl/pendulum/random-v0 all return" in error
        and "--no-normalize-reward" in error
    )
    out = run_script(
        script,
        [
            "--dataset",
            str(one),
            "--no-normalize-reward",
            "--total-timesteps",
            "10",
            "--eval-episodes",
            "1",
        ],
        tmp_path / "run",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("script", ["cql_discrete.py", "bc_discrete.py"])
def test_bad_datasets_of_the_discrete_scripts_are_one_line_errors(script, tmp_path, monkeypatch):
    """A missing dataset, one of continuous actions, an empty one, an env other than the dataset's
    and a damaged one: exit 2, one line (naming the scripts that take continuous actions), before
    any file is written."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "d"))
    with warnings.catch_warnings(action="ignore"):
        minari.create_dataset_from_buffers(
            "canonrl/cartpole/empty-v0", [], env="CartPole-v1", data_format="hdf5"
        )
    damaged = damaged_copy(OFFLINE_DISCRETE_DATASET, tmp_path / "damaged")
    cases = [
        (["--dataset", str(tmp_path / "nowhere")], "no dataset"),
        (["--dataset", str(OFFLINE_DATASET)], "needs discrete actions"),
        (["--dataset", "canonrl/cartpole/empty-v0"], "is empty"),
        (
            ["--dataset", str(OFFLINE_DISCRETE_DATASET), "--env-id", "Acrobot-v1"],
            "the dataset's env",
        ),
        (
            ["--dataset", str(damaged)],
            f"dataset file {damaged / 'data' / 'main_data.hdf5'} is damaged",
        ),
    ]
    errors = assert_one_line_errors(script, cases, tmp_path)
    # the scripts that take it
    assert errors[1].endswith("use cql_continuous.py or iql_continuous.py"), errors[1]


@pytest.mark.parametrize("script", ["cql_discrete.py", "bc_discrete.py"])
def test_the_discrete_scripts_learn_from_a_minatar_dataset(script, tmp_path):
    """A MinAtar dataset (made from the committed impala.py policies) holds the games' (10, 10,
    channels) grids of booleans, as the env gives them. The discrete scripts read it with the
    MinAtar paper's convolutional network, leave the 0/1 grid unnormalised, evaluate in the
    dataset's game, and save a network that evaluates exactly as it did; --capture-video is a
    one-line error (MinAtar draws no video)."""
    path = datasets.standard("minatar-breakout-medium-tiny-v0", tmp_path / "d")
    dataset = minari.load_dataset(str(path))
    episode = next(dataset.iterate_episodes())
    assert episode.observations.dtype == bool and episode.observations.shape[1:] == (10, 10, 4)
    assert dataset.spec.env_spec.id == "MinAtar/Breakout-v1" and dataset.total_steps >= 2000
    out = run_script(
        script,
        [
            "--dataset",
            str(path),
            "--total-timesteps",
            "50",
            "--eval-episodes",
            "2",
            "--save-model",
            "--seed",
            "3",
        ],
        tmp_path / "run",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    module, saved = (
        load_script(script),
        torch.load(tmp_path / "run" / "model.pt", weights_only=True),
    )
    cls, key = ("QNetwork", "q_network") if script == "cql_discrete.py" else ("Actor", "actor")
    net = getattr(module, cls)(saved["obs_shape"], saved["n_actions"])
    net.load_state_dict(saved[key])
    assert saved["obs_shape"] == [10, 10, 4] and isinstance(net.network[0], torch.nn.Conv2d)
    assert torch.equal(net.obs_mean, torch.zeros(10, 10, 4)) and torch.equal(
        net.obs_std, torch.ones(10, 10, 4)
    )
    assert module.evaluate(net, "MinAtar/Breakout-v1", 2, 3 + 100_000) == saved["eval_returns"]
    no_video = (["--dataset", str(path), "--capture-video"], "record no video")
    assert_one_line_errors(script, [no_video], tmp_path / "video")


def test_cql_discrete_penalty_is_the_exact_logsumexp_minus_the_data_q():
    """CQL(H) over a discrete action set, against a brute force: log sum_a exp Q(s, a) - Q(s,
    a_data), averaged over the batch; its gradient pushes every action down by its softmax weight
    and the dataset's action up by 1."""
    cql = load_script("cql_discrete.py")
    q = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 5.0]], requires_grad=True)
    actions = torch.tensor([0, 2])
    expected = np.mean(
        [np.log(np.exp([1.0, 2.0, 3.0]).sum()) - 1.0, np.log(np.exp([0.0, -1.0, 5.0]).sum()) - 5.0]
    )
    penalty = cql.cql_penalty(q, actions)
    assert penalty.item() == pytest.approx(expected, rel=1e-6)
    penalty.backward()
    softmax = torch.softmax(q.detach(), dim=1)
    assert torch.allclose(q.grad, (softmax - F.one_hot(actions, 3)) / 2, atol=1e-6)


def test_offline_runs_log_the_normalised_score(tmp_path):
    """An offline run counts gradient steps and logs, beside each evaluation's returns, their
    normalised scores."""
    out = run_script(
        "td3_bc_continuous.py",
        SMOKE["td3_bc_continuous.py"] + ["--eval-every", "100"],
        tmp_path / "r",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = read_metrics(tmp_path / "r")
    meta = json.loads((OFFLINE_DATASET / "data" / "metadata.json").read_text())
    low, high = meta["ref_min_score"], meta["ref_max_score"]
    steps, returns = metrics["eval/episodic_return"]
    score_steps, scores = metrics["eval/normalized_score"]
    assert np.array_equal(steps, score_steps) and sorted(set(steps)) == [100, 200, 300]
    assert np.allclose(scores, 100 * (returns - low) / (high - low))
    assert "train/episodic_return" not in metrics and "losses/actor_loss" in metrics


def test_iql_expectile_and_advantage_weights():
    """V minimising the expectile loss over a constant is the tau-expectile of Q (brute force over a
    grid: for Q in {0, 1} and tau 0.7 it is 0.7, where tau (1 - v) = (1 - tau) v); tau 0.5 is half
    the squared error. The weights of advantage-weighted regression are exp(beta A), clipped at the
    maximum, and take no gradient."""
    iql = load_script("iql_continuous.py")
    q = torch.tensor([0.0, 1.0])
    grid = torch.linspace(0, 1, 1001)
    losses = torch.stack([iql.expectile_loss(q - v, 0.7) for v in grid])
    assert grid[losses.argmin()].item() == pytest.approx(0.7, abs=1e-3)
    diff = torch.tensor([0.5, -2.0, 3.0])
    assert iql.expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (diff**2).mean().item())
    advantage = torch.tensor([-1.0, 0.0, 0.5, 10.0], requires_grad=True)
    weights = iql.awr_weights(advantage, 3.0, 100.0)
    assert torch.allclose(
        weights, torch.tensor([float(np.exp(-3.0)), 1.0, float(np.exp(1.5)), 100.0])
    )
    assert not weights.requires_grad


def test_cql_penalty_is_the_importance_weighted_logsumexp_minus_the_data_q():
    """CQL's penalty against a brute force: for each state, log of the mean over the proposal's
    actions of exp(Q(s, a)) / mu(a), up to the constant log(number of actions), minus Q(s, a_data);
    the critic scores N actions per state as it scores one."""
    cql = load_script("cql_continuous.py")
    gen = torch.Generator().manual_seed(0)
    q_data, q_random, q_proposed = (
        torch.randn(shape, generator=gen) for shape in ((4,), (4, 3), (4, 5))
    )
    log_random, log_proposed = -1.2, torch.randn(4, 5, generator=gen)
    for temp in (1.0, 0.5):
        expected = []
        for i in range(4):
            terms = [float(np.exp((q - log_random) / temp)) for q in q_random[i].tolist()]
            terms += [
                float(np.exp((q - d) / temp))
                for q, d in zip(q_proposed[i].tolist(), log_proposed[i].tolist())
            ]
            expected.append(temp * np.log(np.sum(terms)) - float(q_data[i]))
        got = cql.cql_penalty(
            q_data, q_random, torch.tensor(log_random), q_proposed, log_proposed, temp
        )
        assert got.item() == pytest.approx(np.mean(expected), rel=1e-5)
    qf = cql.QNetwork(3, 2)
    obs, actions = torch.randn(4, 3, generator=gen), torch.randn(4, 6, 2, generator=gen)
    many = qf(obs, actions)
    assert many.shape == (4, 6) and torch.allclose(many[:, 2], qf(obs, actions[:, 2]), atol=1e-6)


def test_d3rlpy_reads_our_datasets_exactly_and_learns_on_them(tmp_path):
    """The d3rlpy baseline (benchmark/d3rlpy_baseline.py: d3rlpy 2.8.1 installed without its
    gymnasium==1.0.0 pin, on this project's gymnasium): d3rlpy's episodes of our dataset hold its
    arrays and end where ours ended (a terminated episode keeps its last transition, one cut by a
    time limit loses it: it has no next observation in d3rlpy's format), and a run of
    "d3rlpy:bc_discrete.py" through the benchmark's runner writes our run contract and clones the
    medium CartPole policy (greedy return about 200) from 2,000 transitions in 1,000 gradient
    steps."""
    from benchmark import d3rlpy_baseline

    d3rlpy = d3rlpy_baseline.ensure_d3rlpy()
    td3_bc = load_script("td3_bc_continuous.py")
    for path in (OFFLINE_DISCRETE_DATASET, OFFLINE_DATASET):
        dataset = td3_bc.open_dataset(str(path))
        ours = list(dataset.iterate_episodes())
        theirs = d3rlpy_baseline.to_mdp(dataset, d3rlpy).episodes
        assert len(theirs) == len(ours)
        for a, b in zip(ours, theirs):
            assert np.array_equal(a.observations[:-1], b.observations)
            assert np.array_equal(np.asarray(a.actions).reshape(len(b.actions), -1), b.actions)
            assert np.allclose(a.rewards, b.rewards.ravel()) and b.terminated == bool(
                a.terminations[-1]
            )
            assert b.transition_count == len(a.rewards) - (not a.terminations[-1])
    out = run_script(
        "d3rlpy:bc_discrete.py",
        [
            "--env-id",
            "CartPole-v1",
            "--dataset",
            str(OFFLINE_DISCRETE_DATASET),
            "--total-timesteps",
            "1000",
            "--eval-every",
            "500",
            "--eval-episodes",
            "5",
        ],
        tmp_path / "run",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (
        config["script"] == "d3rlpy:bc_discrete.py" and config["d3rlpy_algo"] == "DiscreteBCConfig"
    )
    metrics = read_metrics(tmp_path / "run")
    steps, returns = metrics["eval/episodic_return"]
    assert sorted(set(steps)) == [500, 1000] and "eval/normalized_score" in metrics
    assert "charts/train_seconds" in metrics and "losses/loss" in metrics
    assert np.mean(returns[steps == 1000]) > 150, returns


def test_offline_speed_writes_both_rates(tmp_path):
    """benchmark/offline_speed.py: a run of ours and one of d3rlpy's, each rate a positive number,
    in a report."""
    from benchmark import offline_speed

    assert (
        offline_speed.main(
            [
                "--scripts",
                "bc_discrete.py",
                "--steps",
                "100",
                "--repeats",
                "1",
                "--report-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    [report] = tmp_path.glob("offline-speed/offline-speed-cpu-*.md")
    row = next(
        line for line in report.read_text().splitlines() if line.startswith("| bc_discrete.py")
    )
    ours, theirs, ratio = (float(cell) for cell in row.strip("|").split("|")[3:6])
    assert ours > 0 and theirs > 0 and ratio == pytest.approx(ours / theirs, rel=0.01)


def test_reevaluate_plays_a_runs_final_policy_again(tmp_path, capsys):
    """benchmark/reevaluate.py: the final actor of a finished run, from its checkpoint, played on
    the run's own evaluation episodes gives the returns the run logged (for each of the four
    continuous offline scripts); two scripts get Welch's t. A checkpoint that does not match its
    SHA-256 is a one-line error."""
    from benchmark import reevaluate

    runs = {}
    for script in ("td3_bc_continuous.py", "bc_continuous.py"):
        for seed in (1, 2):
            runs[script, seed] = tmp_path / f"{script}-{seed}"
            out = run_script(
                script,
                SMOKE[script] + ["--seed", str(seed), "--total-timesteps", "50"],
                runs[script, seed],
                fork=True,
            )
            assert out.returncode == 0, out.stderr[-2000:]
    # the other actors: every offline continuous script
    for script in ("iql_continuous.py", "cql_continuous.py"):
        runs[script, 1] = tmp_path / f"{script}-1"
        out = run_script(
            script,
            SMOKE[script] + ["--seed", "1", "--total-timesteps", "20"],
            runs[script, 1],
            fork=True,
        )
        assert out.returncode == 0, out.stderr[-2000:]
    for script in (
        "td3_bc_continuous.py",
        "bc_continuous.py",
        "iql_continuous.py",
        "cql_continuous.py",
    ):
        run = runs[script, 1]
        assert reevaluate.main([str(run), "--episodes", "2", "--seed", str(1 + 100_000)]) == 0
        row = next(
            line
            for line in capsys.readouterr().out.splitlines()
            if line.startswith(f"| {run.name}")
        )
        _, logged = read_metrics(run)["eval/episodic_return"]
        assert float(row.split("|")[3]) == pytest.approx(np.mean(logged[-2:]), abs=0.006), script
    del runs["iql_continuous.py", 1], runs["cql_continuous.py", 1]
    run = runs["td3_bc_continuous.py", 1]
    assert reevaluate.main([str(r) for r in runs.values()] + ["--episodes", "2"]) == 0
    assert "td3_bc_continuous.py against bc_continuous.py" in capsys.readouterr().out
    (run / "checkpoint.sha256").write_text("0" * 64 + "\n")
    assert reevaluate.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "differs from checkpoint.sha256" in err and len(err.strip().splitlines()) == 1
