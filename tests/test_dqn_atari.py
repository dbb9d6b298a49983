"""dqn_atari.py without training: the replay buffer rebuilds exactly the frame stacks the env
returned, the Nature CNN's shapes, the logged return is the unclipped score of a whole game,
MinAtar's frames, --compile computes the same loss, and a non-Atari env id is refused."""

import inspect

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmark.runs import load_script, run_script
from canonrl.run import plain

m = load_script("dqn_atari.py")
SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


@pytest.mark.parametrize("env_id, limit", [("ALE/Breakout-v5", 45), ("MinAtar/Breakout-v1", 8)])
def test_rebuilt_stacks_equal_the_env_stacks(env_id, limit, tmp_path):
    """Two envs stored as the script stores them into a ring of 40 slots per env that wraps many
    times; env 1 is also cut by a time limit every 45 steps (8 for MinAtar's shorter games). At
    every check, each slot the buffer may sample holds the last transition stored there, and its
    rebuilt obs and next_obs are the stacks the env returned: the first steps of an episode (padded
    with the first frame), the true final observation of an episode that ended (life lost, game
    over) or was truncated, across the ring's end."""

    def make():
        return m.make_env(env_id)

    envs = gym.vector.SyncVectorEnv(
        [make, lambda: gym.wrappers.TimeLimit(make(), limit)], autoreset_mode=SAME_STEP
    )
    envs.action_space.seed(0)
    rb = m.ReplayBuffer(80, 2, envs.single_observation_space.shape, np.random.default_rng(0))
    # per env: slot -> (obs, next_obs, action, reward, terminated) of the transition stored there
    stored = [{}, {}]
    seen = {"first": 0, "terminated": 0, "truncated": 0, "near_start": 0}
    obs, _ = envs.reset(seed=0)
    first = np.ones(2, dtype=bool)
    for step in range(700):
        actions = envs.action_space.sample()
        next_obs, rewards, terminated, truncated, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for i in np.flatnonzero(infos.get("_final_obs", [])):
            real_next_obs[i] = infos["final_obs"][i]
        pos = rb.pos.copy()
        rb.add(obs, real_next_obs, actions, rewards, terminated, first)
        for i in range(2):
            for k in range(1 + first[i]):  # the slots written: the frames they held are gone
                stored[i].pop((pos[i] + k) % rb.size, None)
            t = (rb.pos[i] - 2) % rb.size
            stored[i][t] = (
                obs[i],
                real_next_obs[i],
                actions[i],
                np.float32(rewards[i]),
                float(terminated[i]),
            )
            assert rb.valid[i, t], "the newest transition can be sampled"
        if not rb.full.any():
            assert rb.valid.sum() == 2 * (step + 1), (
                "before the ring wraps, every transition stored can be sampled"
            )
        obs, first = next_obs, terminated | truncated
        if step % 5 == 0 or first.any():
            for i in range(2):
                slots = np.flatnonzero(rb.valid[i])
                assert set(slots) <= set(stored[i]), (
                    "a slot without a transition (or a stale one) could be sampled"
                )
                env = np.full(len(slots), i)
                o, n, a, r, d = (np.array(x) for x in zip(*(stored[i][t] for t in slots)))
                assert np.array_equal(rb.stacks(env, slots), o), (
                    f"an obs rebuilt wrong at step {step}"
                )
                assert np.array_equal(rb.stacks(env, (slots + 1) % rb.size), n), (
                    f"a next_obs wrong at step {step}"
                )
                assert (rb.actions[i, slots] == a).all() and (rb.rewards[i, slots] == r).all()
                assert (rb.terminated[i, slots] == d).all()
                seen["near_start"] += (rb.steps[i, slots] < 3).sum()
                if rb.full[i]:
                    assert len(slots) >= rb.size - 12, (
                        "no more than an episode's final slot or so is lost per episode"
                    )
        seen["first"] += first.sum()
        seen["terminated"] += terminated.sum()
        seen["truncated"] += (truncated & ~terminated).sum()
    assert rb.full.all() and (2 * 700 + seen["first"]) / (2 * rb.size) > 10, (
        "the ring wrapped many times"
    )
    assert seen["terminated"] >= 10 and seen["truncated"] >= 5 and seen["near_start"] > 100, seen

    # the minibatch is drawn from those transitions, and the buffer survives a checkpoint
    def sample(buffer):
        return buffer.sample(64, "cpu")

    saved = tmp_path / "rb.pt"
    torch.save(plain({"rb": rb.state_dict(), "rng": rb.rng.bit_generator.state}), saved)
    batch = sample(rb)
    assert batch[0].shape == batch[1].shape == (64, 4, 84, 84) and batch[0].dtype == torch.uint8
    everything = [x for per_env in stored for t, x in per_env.items()]
    for o, n, a, r, d in zip(*(x.numpy() for x in batch)):
        assert any(
            (o == x[0]).all() and (n == x[1]).all() and (a, r, d) == x[2:] for x in everything
        )
    ckpt = torch.load(saved, weights_only=True)
    restored = m.ReplayBuffer(80, 2, envs.single_observation_space.shape, np.random.default_rng())
    restored.load_state_dict(ckpt["rb"])
    restored.rng.bit_generator.state = ckpt["rng"]
    for x, y in zip(batch, sample(restored)):
        assert torch.equal(x, y)
    envs.close()


def test_minatar_games_are_drawn_as_84x84_frames_for_the_same_pipeline():
    """MinAtar (CI's cheap pixel gate): each of the 10x10 cells is an 8x8 block inside a 2-pixel
    border, each channel at its own gray level; the env returns stacks of the last 4 such frames, as
    the Atari games do, and a game is cut after 10,000 steps."""
    obs = np.zeros((10, 10, 4), bool)
    # two objects in one cell: the higher level wins
    obs[0, 0, 0] = obs[9, 9, 3] = obs[5, 5, 1] = obs[5, 5, 2] = True
    frame = m.minatar_frame(obs)
    assert frame.shape == (84, 84) and frame.dtype == np.uint8
    assert (
        (frame[2:10, 2:10] == 63).all()
        and (frame[74:82, 74:82] == 252).all()
        and (frame[42:50, 42:50] == 189).all()
    )
    assert frame.sum() == 64 * (63 + 252 + 189) and not frame[:2].any() and not frame[:, 82:].any()
    env = m.make_env("MinAtar/Breakout-v1")
    assert env.observation_space.shape == (4, 84, 84) and env.spec.max_episode_steps == 10_000
    stack, _ = env.reset(seed=3)
    for _ in range(5):
        previous, (stack, *_) = stack, env.step(env.action_space.sample())
        assert np.array_equal(stack[:3], previous[1:])
        assert np.array_equal(stack[3], m.minatar_frame(env.unwrapped.game.state()))
    env.close()


def test_minatar_run_trains_with_compile_and_refuses_video(tmp_path):
    out = run_script(
        "dqn_atari.py",
        [
            "--env-id",
            "MinAtar/Breakout-v1",
            "--total-timesteps",
            "400",
            "--learning-starts",
            "100",
            "--buffer-size",
            "1000",
            "--eval-episodes",
            "2",
            "--compile",
        ],
        tmp_path / "run",
        fork=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "eval/episodic_return" in (tmp_path / "run" / "metrics.csv").read_text()
    out = run_script(
        "dqn_atari.py",
        ["--env-id", "MinAtar/Breakout-v1", "--capture-video"],
        tmp_path / "video",
        fork=True,
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: MinAtar games record no video: drop --capture-video"
    ]
    assert not (tmp_path / "video").exists()


def test_a_million_transitions_take_under_7_gib():
    # np.zeros: nothing touched, no memory
    rb = m.ReplayBuffer(1_000_000, 1, (4, 84, 84), np.random.default_rng(0))
    nbytes = sum(getattr(rb, name).nbytes for name in m.ReplayBuffer.FIELDS)
    assert rb.frames.nbytes == 1_000_000 * 84 * 84
    # stacked obs and next_obs would take 52.6 GiB
    assert nbytes / 2**30 < 6.6, f"{nbytes / 2**30:.2f} GiB"
    del rb


def test_q_network_maps_uint8_stacks_to_one_value_per_action():
    q = m.QNetwork(6)
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    assert q(x).shape == (5, 6) and q(x).dtype == torch.float32
    assert torch.allclose(q(x), q.network(x.float() / 255))
    convs = [layer for layer in q.network if isinstance(layer, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]


@pytest.mark.parametrize(
    "script",
    [
        "dqn_atari.py",
        "ddqn_atari.py",
        "c51_atari.py",
        "iqn_atari.py",
        "sac_atari.py",
        "ppo_atari.py",
    ],
)
def test_logged_return_is_the_unclipped_score_of_a_whole_game(script):
    """SpaceInvaders: 3 lives, 5 to 30 points an invader. The vector env as in each script that
    wraps the ALE itself; the raw env's rewards are summed beneath every wrapper, and the game's
    score in final_info must be that sum (the learner sees -1/0/1)."""
    make_env = load_script(script).make_env
    # the template's make_env(env_id, video_dir=None)
    if "video_dir" in inspect.signature(make_env).parameters:
        make = lambda: make_env("ALE/SpaceInvaders-v5")  # noqa: E731
    else:  # ppo_atari.py until it takes the template's make_env
        make = make_env("ALE/SpaceInvaders-v5", 0, False, None)
    envs = gym.vector.SyncVectorEnv([make], autoreset_mode=SAME_STEP)
    raw, raw_sum, clipped_sum, lives_lost = envs.envs[0].unwrapped, [0.0], 0.0, 0
    raw_step = raw.step

    def counting_step(action):
        out = raw_step(action)
        raw_sum[0] += out[1]
        return out

    raw.step = counting_step
    envs.action_space.seed(1)
    envs.reset(seed=1)
    raw_sum[0] = 0.0  # the no-ops at reset score nothing anyway
    for _ in range(3000):
        _, rewards, terminated, truncated, infos = envs.step(envs.action_space.sample())
        clipped_sum, lives_lost = clipped_sum + rewards[0], lives_lost + int(terminated[0])
        assert abs(rewards[0]) <= 1
        games = infos.get("final_info", {})
        if games.get("_episode", [False])[0]:
            break
    else:
        raise AssertionError("no game ended in 3000 steps")
    score = games["episode"]["r"][0]
    assert score == raw_sum[0] and score > clipped_sum > 0 and lives_lost >= 3, (
        score,
        raw_sum,
        clipped_sum,
    )
    envs.close()


def test_evaluation_plays_whole_games_reproducibly():
    torch.manual_seed(0)
    q = m.QNetwork(4)
    scores = m.evaluate(q, "ALE/Breakout-v5", 1, seed=7)
    assert scores == m.evaluate(q, "ALE/Breakout-v5", 1, seed=7) and isinstance(scores[0], float)


@pytest.mark.parametrize(
    "script, sibling",
    [
        ("dqn_atari.py", "dqn.py"),
        ("ddqn_atari.py", "dqn.py"),
        ("c51_atari.py", "c51.py"),
        ("iqn_atari.py", "dqn.py"),
        ("sac_atari.py", "dqn.py"),
    ],
)
def test_non_atari_env_id_is_refused(script, sibling, tmp_path):
    """A classic-control id (discrete actions, vector observations): one line naming the script to
    use instead."""
    out = run_script(script, ["--env-id", "CartPole-v1"], tmp_path / "run", fork=True)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "CartPole-v1" in lines[0] and "Atari" in lines[0] and sibling in lines[0]
    assert not (tmp_path / "run").exists()


def test_double_q_target_by_hand():
    """The online network picks the next action, the target network values it: here the online
    argmax (action 0) is not the target's (action 1), so Double DQN's target is below DQN's max;
    termination stops the bootstrap."""
    ddqn = load_script("ddqn_atari.py")
    online = torch.tensor([[3.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    target = torch.tensor([[2.0, 4.0, 0.0], [1.0, 1.0, 1.5]])
    got = ddqn.double_q_target(
        online, target, torch.tensor([1.0, -1.0]), torch.tensor([0.0, 1.0]), 0.9
    )
    assert torch.allclose(got, torch.tensor([1.0 + 0.9 * 2.0, -1.0]))
    assert got[0] < m.td_target(target, torch.tensor([1.0]), torch.tensor([0.0]), 0.9)[0], (
        "DQN takes the max: 4"
    )


def test_ddqn_atari_is_dqn_atari_but_for_its_target():
    """ddqn_atari.py differs from dqn_atari.py in its docstring and the target only, so the replay
    buffer, network and game accounting tests above hold for it too; a change to one file's other
    lines must be made to both."""
    import difflib

    from benchmark.runs import ALGOS

    a, b = (
        (ALGOS / s).read_text().split('"""', 2)[2].splitlines()
        for s in ("dqn_atari.py", "ddqn_atari.py")
    )
    changed = [
        line
        for line in difflib.unified_diff(a, b, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed and all(
        "td_target" in line
        or "double_q_target" in line
        or "next_actions" in line
        or "target_q_next" in line
        or "online network picks" in line
        or "Q-learning target" in line
        or "stops the bootstrap" in line
        or "b_terminated, args.gamma" in line
        or "b_terminated, gamma" in line
        or line[1:].strip() == ")"  # the end of a call the formatter split
        for line in changed
    ), "\n".join(changed)


def test_sb3_baseline_gets_the_same_hyperparameters_and_network():
    """benchmark/sb3_baseline.py's mapping: SB3 DQN with our defaults on SB3's Atari env, a
    CnnPolicy with as many parameters as our QNetwork (the Nature CNN, then one linear layer)."""
    from benchmark import sb3_baseline

    algo, same = sb3_baseline.SAME["dqn_atari.py"]
    args = m.Args()
    args.buffer_size = 1000  # SB3 allocates its buffer up front
    n_envs, kw = same(args)
    assert (
        algo,
        n_envs,
        kw["atari"],
        kw["learning_rate"],
        kw["learning_starts"],
        kw["train_freq"],
    ) == ("DQN", 1, True, 1e-4, 80_000, 4)
    assert (
        kw["target_update_interval"],
        kw["exploration_fraction"],
        kw["exploration_final_eps"],
    ) == (1000, 0.1, 0.01)
    model = sb3_baseline.make_model(algo, "ALE/Breakout-v5", 1, kw, seed=0)
    assert model.observation_space.shape == (4, 84, 84)
    assert sum(p.numel() for p in model.q_net.parameters()) == sum(
        p.numel() for p in m.QNetwork(4).parameters()
    )
    model.env.close()
