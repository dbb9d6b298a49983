"""impala.py: V-trace against hand-computed values and the n-step return it reduces to on-policy;
the Ray actors (policy lag, an actor killed mid-run and replaced); a run whose actors fail stops
with its checkpoint saved; --ray-address errors. The run contract with one in-process actor is the
generic tests' (conftest.SMOKE)."""

import concurrent.futures
import http.server
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmark.runs import load_script, read_metrics, read_rows, run_script, start_script

impala = load_script("impala.py")


def nstep_returns(rewards, discounts, bootstrap_value):
    """v_s = r_s + d_s r_{s+1} + d_s d_{s+1} r_{s+2} + ... + (d_s ... d_{T-1}) V(x_T), one s at a
    time."""
    T, B = rewards.shape
    out = torch.zeros(T, B, dtype=torch.float64)
    for s in range(T):
        for b in range(B):
            total, scale = 0.0, 1.0
            for t in range(s, T):
                total, scale = total + scale * float(rewards[t, b]), scale * float(discounts[t, b])
            out[s, b] = total + scale * float(bootstrap_value[b])
    return out


def test_vtrace_on_policy_is_the_n_step_return():
    """pi = mu (log rhos 0), rho_bar = c_bar = 1: v_s is the n-step bootstrapped return (episode
    ends included) and the advantage is r_s + d_s v_{s+1} - V(x_s). (< 1 s)"""
    g = torch.Generator().manual_seed(0)
    T, B = 6, 4
    rewards, values = (
        torch.randn(T, B, generator=g, dtype=torch.float64),
        torch.randn(T, B, dtype=torch.float64),
    )
    bootstrap = torch.randn(B, dtype=torch.float64)
    # some episodes end (discount 0)
    discounts = 0.9 * (torch.rand(T, B, generator=g) > 0.25).double()
    vs, adv = impala.vtrace(
        torch.zeros(T, B, dtype=torch.float64), discounts, rewards, values, bootstrap
    )
    expected = nstep_returns(rewards, discounts, bootstrap)
    torch.testing.assert_close(vs, expected)
    next_vs = torch.cat([expected[1:], bootstrap[None]])
    torch.testing.assert_close(adv, rewards + discounts * next_vs - values)


# two steps, one env: V(x_0) = 1, V(x_1) = 2, V(x_2) = 3 (bootstrap), rewards 1, gamma 0.9, by hand:
# rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu), delta_t = rho_t (r_t + 0.9 V(x_{t+1}) -
# V(x_t)) v_1 = V(x_1) + delta_1, v_0 = V(x_0) + delta_0 + 0.9 c_0 delta_1; advantage_t = rho_t (r_t
# + 0.9 v_{t+1} - V(x_t))
HAND = [  # (pi/mu at t=0 and t=1, rho_bar, c_bar, expected v, expected advantages)
    # rho_0 = 2 is clipped to 1: delta_0 = 1.8; rho_1 = 0.5: delta_1 = 0.5 * 1.7 = 0.85
    ((2.0, 0.5), 1.0, 1.0, (1 + 1.8 + 0.9 * 1.0 * 0.85, 2 + 0.85), (1 + 0.9 * 2.85 - 1, 0.85)),
    # c_0 = 0.5 halves the reach of delta_1 = 1.7 into v_0; rho_0 = 0.5 halves delta_0 = 0.9
    ((0.5, 2.0), 1.0, 1.0, (1 + 0.9 + 0.9 * 0.5 * 1.7, 2 + 1.7), (0.5 * (1 + 0.9 * 3.7 - 1), 1.7)),
    # rho_bar 2, c_bar 1: the TD errors are weighted 2, the trace 1
    ((3.0, 3.0), 2.0, 1.0, (1 + 3.6 + 0.9 * 1.0 * 3.4, 2 + 3.4), (2 * (1 + 0.9 * 5.4 - 1), 3.4)),
]


@pytest.mark.parametrize("ratios,rho_bar,c_bar,expected_vs,expected_adv", HAND)
def test_vtrace_truncated_importance_weights_by_hand(
    ratios, rho_bar, c_bar, expected_vs, expected_adv
):
    """(< 1 s)"""
    log_rhos = torch.tensor([[math.log(r)] for r in ratios], dtype=torch.float64)
    f64 = dict(dtype=torch.float64)
    vs, adv = impala.vtrace(
        log_rhos,
        torch.full((2, 1), 0.9, **f64),
        torch.ones(2, 1, **f64),
        torch.tensor([[1.0], [2.0]], **f64),
        torch.tensor([3.0], **f64),
        rho_bar,
        c_bar,
    )
    torch.testing.assert_close(vs[:, 0], torch.tensor(expected_vs, dtype=torch.float64))
    torch.testing.assert_close(adv[:, 0], torch.tensor(expected_adv, dtype=torch.float64))


def test_an_episode_end_cuts_the_trace():
    """Discount 0 at step 0 (the episode ended there): v_0 and the advantage at 0 depend on nothing
    after step 0; off-policy too. (< 1 s)"""
    g = torch.Generator().manual_seed(1)
    log_rhos, values = 0.5 * torch.randn(3, 2, generator=g), torch.randn(3, 2, generator=g)
    discounts = torch.tensor([[0.0, 0.0], [0.9, 0.9], [0.9, 0.9]])
    rewards, bootstrap = torch.randn(3, 2, generator=g), torch.randn(2, generator=g)
    vs, adv = impala.vtrace(log_rhos, discounts, rewards, values, bootstrap)
    other_rewards, other_values = rewards.clone(), values.clone()
    other_rewards[1:], other_values[1:] = 100.0, -100.0
    vs2, adv2 = impala.vtrace(log_rhos, discounts, other_rewards, other_values, bootstrap + 100)
    torch.testing.assert_close(vs[0], vs2[0])
    torch.testing.assert_close(adv[0], adv2[0])
    rho = log_rhos[0].exp().clamp(max=1.0)
    torch.testing.assert_close(vs[0], values[0] + rho * (rewards[0] - values[0]))


def rollout_actors(session: int) -> list[int]:
    """The Ray actor processes (`ray::RolloutActor...`) of a Ray cluster: those of the session its
    head started."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            pid = int(cmdline.parent.name)
            if cmdline.read_bytes().startswith(b"ray::RolloutActor") and os.getsid(pid) == session:
                found.append(pid)
        except (OSError, ValueError):
            pass
    return found


RAY = [
    "--env-id",
    "CartPole-v1",
    "--num-actors",
    "2",
    "--num-envs",
    "4",
    "--num-steps",
    "20",
    "--eval-episodes",
    "2",
    "--save-model",
    "--total-timesteps",
    "16000",
]


def test_ray_actors_killed_mid_run_are_replaced_and_the_run_finishes(ray_cluster, tmp_path):
    """Two Ray actors on a Ray cluster of its own, joined by --ray-address (the gate runs a local
    Ray); once the learner has updated, both actor processes, which the cluster started, are killed
    (SIGKILL): each death is reported, new actors take over, and the run trains to its budget and
    leaves the whole run contract. The rollouts of two actors lag the learner's policy
    (charts/policy_lag). (about 40 s: the cluster's start-up, two actor start-ups, 200 updates)"""
    address, env, session = ray_cluster
    run_dir = tmp_path / "run"
    proc = start_script(
        "impala.py",
        RAY + ["--ray-address", address],
        run_dir,
        fork=True,
        RAY_AUTH_TOKEN_PATH=env["RAY_AUTH_TOKEN_PATH"],
    )
    deadline, killed = time.time() + 120, []
    while time.time() < deadline and proc.poll() is None and not killed:
        if (run_dir / "metrics.csv").exists() and "losses/" in (
            run_dir / "metrics.csv"
        ).read_text():
            # on a busy machine the second actor may still be starting
            found = rollout_actors(session)
            if len(found) == 2:
                killed = found
                for p in killed:
                    os.kill(p, signal.SIGKILL)
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=180)
    assert len(killed) == 2, f"found the actor processes {killed}"
    assert proc.returncode == 0, stderr[-3000:]
    replaced = [
        line for line in stderr.splitlines() if "died" in line and "replaced by a new actor" in line
    ]
    assert len(replaced) == 2, stderr[-3000:]
    rows = read_rows(run_dir)
    lags = [r["value"] for r in rows if r["name"] == "charts/policy_lag"]
    assert len(lags) == 16000 // 80 and min(lags) >= 0 and max(lags) >= 1
    assert max(r["global_step"] for r in rows) == 16000
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["finished"] and ckpt["global_step"] == 16000
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    agent = impala.Agent(saved["obs_shape"], saved["n_actions"])
    agent.load_state_dict(saved["agent"])
    assert impala.evaluate(agent, "CartPole-v1", 2, 1 + 100_000) == saved["eval_returns"]


def test_failed_actors_stop_the_run_with_its_checkpoint_saved(tmp_path, monkeypatch):
    """When the actors cannot go on (a replacement that dies too, no rollout for minutes), the run
    saves the updates it made, says so in one line and exits 1; --resume then finishes it. (about 3
    s)"""
    ready, calls = impala.Actors.ready, []

    def failing_ready(self):
        calls.append(1)
        if len(calls) == 6:
            raise impala.ActorsFailed(
                "actor 0 died again before its first rollout (ActorDiedError)"
            )
        return ready(self)

    monkeypatch.setattr(impala.Actors, "ready", failing_ready)
    args = dict(
        env_id="CartPole-v1",
        num_actors=0,
        num_envs=4,
        num_steps=20,
        total_timesteps=800,
        eval_episodes=2,
    )
    with pytest.raises(SystemExit) as e:
        impala.main(impala.Args(**args, run_dir=str(tmp_path)))
    assert e.value.code == 1
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 5 * 80 and ckpt["iteration"] == 5 and not ckpt["finished"]
    assert max(r["global_step"] for r in read_rows(tmp_path)) == 400
    monkeypatch.setattr(impala.Actors, "ready", ready)
    out = run_script("impala.py", ["--resume", str(tmp_path)], fork=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert read_metrics(tmp_path)["eval/episodic_return"][0].tolist() == [800, 800]


@pytest.mark.parametrize(
    "flags,env,expected",
    [
        (["--ray-address", "127.0.0.1:1"], {}, "cannot reach a Ray cluster at 127.0.0.1:1"),
        ([], {"RAY_ADDRESS": "127.0.0.1:1"}, "cannot reach a Ray cluster at 127.0.0.1:1"),
        (["--ray-address", "nohost"], {}, "is not host:port"),
        (["--ray-address", "127.0.0.1:1", "--num-actors", "0"], {}, "needs --num-actors 1 or more"),
    ],
)
def test_a_ray_address_that_cannot_be_used_is_one_line_before_training(
    flags, env, expected, tmp_path
):
    """(about 1 s each)"""
    out = run_script("impala.py", flags, tmp_path / "run", fork=True, **env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert expected in lines[0]
    assert not (tmp_path / "run").exists()


class QuietHTTPHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # not a line on the test's stderr per refused request
        pass


@pytest.fixture
def not_ray(request):
    """host:port of a server that accepts connections but is no Ray head: an HTTP server or a gRPC
    server without Ray's services, in a thread of this process."""
    if request.param == "http":
        server = http.server.HTTPServer(("127.0.0.1", 0), QuietHTTPHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"127.0.0.1:{server.server_port}"
        server.shutdown()
        server.server_close()
    else:
        grpc = pytest.importorskip("grpc")
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        yield f"127.0.0.1:{port}"
        server.stop(None)


@pytest.mark.parametrize("not_ray", ["http", "grpc"], indirect=True)
def test_an_address_that_is_not_ray_is_one_line_within_seconds(not_ray, tmp_path):
    """ray.init retried for minutes against a port that accepts connections but speaks no Ray (an
    HTTP server, a gRPC server of another service). (about 6 s for HTTP: the probe's 5 s timeout; 1
    s for gRPC)"""
    start = time.time()
    out = run_script(
        "impala.py",
        ["--ray-address", not_ray, "--num-actors", "1"],
        tmp_path / "run",
        timeout=30,
        fork=True,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: {not_ray} does not answer as a Ray cluster"), lines
    assert time.time() - start < 20
    assert not (tmp_path / "run").exists()


def test_ray_address_in_the_environment_does_not_stop_a_run_without_ray(tmp_path):
    """RAY_ADDRESS (exported for other programs) is used only when there are Ray actors:
    --num-actors 0 needs no Ray and runs. (about 2 s)"""
    flags = [
        "--num-actors",
        "0",
        "--num-envs",
        "2",
        "--num-steps",
        "20",
        "--total-timesteps",
        "80",
        "--eval-episodes",
        "1",
    ]
    out = run_script("impala.py", flags, tmp_path, fork=True, RAY_ADDRESS="127.0.0.1:1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert read_metrics(tmp_path)["eval/episodic_return"][0].size == 1


def test_a_minatar_game_trains_with_minatars_network_and_reloads(tmp_path):
    """MinAtar/Breakout-v1 with one in-process actor: the 10x10 grid of object channels goes to the
    convolution, and the saved model evaluates as it did at the end of training. (about 5 s)"""
    flags = [
        "--env-id",
        "MinAtar/Breakout-v1",
        "--num-actors",
        "0",
        "--num-envs",
        "4",
        "--num-steps",
        "20",
        "--total-timesteps",
        "1600",
        "--eval-episodes",
        "2",
        "--save-model",
    ]
    out = run_script("impala.py", flags, tmp_path, fork=True)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert saved["obs_shape"] == [4, 10, 10]
    agent = impala.Agent(saved["obs_shape"], saved["n_actions"])
    agent.load_state_dict(saved["agent"])
    assert isinstance(agent.actor[0], torch.nn.Conv2d)
    assert impala.evaluate(agent, "MinAtar/Breakout-v1", 2, 1 + 100_000) == saved["eval_returns"]
    assert read_metrics(tmp_path)["losses/policy_loss"][0][-1] == 1600


def test_an_actor_registers_the_minatar_ids_itself(monkeypatch):
    """A Ray actor's process has not run impala.py's top level, which registers the MinAtar ids:
    RolloutActor registers them (here in a registry without them)."""
    for env_id in impala.MINATAR:
        monkeypatch.delitem(impala.gym.registry, env_id)  # put back after the test
    actor = impala.RolloutActor("MinAtar/Breakout-v1", 2, 3, 0.99, seed=1)
    rollout = actor.rollout(actor.agent.state_dict(), 0)
    assert rollout["obs"].shape == (4, 2, 4, 10, 10)
    actor.close()


def test_a_minatar_game_records_no_video(tmp_path):
    """(about 1 s)"""
    out = run_script(
        "impala.py",
        ["--env-id", "MinAtar/Breakout-v1", "--capture-video"],
        tmp_path / "run",
        fork=True,
    )
    assert (
        out.returncode == 2
        and out.stderr.strip() == "error: MinAtar games record no video: drop --capture-video"
    )
    assert not (tmp_path / "run").exists()


def test_speed_benchmark_measures_every_configuration_into_a_report(tmp_path):
    """benchmark/impala_speed.py, shortened (no separate cluster: the fixture's tests start one): a
    row per configuration with its steps/s and wall time. (about 15 s: one local Ray)"""
    from benchmark import impala_speed

    assert (
        impala_speed.main(
            ["--steps", "640", "--actors", "1", "--no-cluster", "--report-dir", str(tmp_path)]
        )
        == 0
    )
    [report] = tmp_path.glob("impala-speed/impala-speed-cpu-*.md")
    rows = [
        line.split("|")[1:4]
        for line in report.read_text().splitlines()
        if line.startswith("| ") and "s |" in line
    ]
    assert [r[0].strip() for r in rows] == [
        "impala.py, --num-actors 0 (in-process)",
        "impala.py, 1 Ray actor, local Ray",
        "a2c.py, 8 envs x 20 steps",
    ]
    assert all(
        float(r[1].replace(",", "")) > 0 and float(r[2].strip().removesuffix(" s")) > 0
        for r in rows
    )
