"""Does torch.compile pay for the updates on this CPU? SAC's and TD3's update as the scripts write
it (random minibatches of Hopper-v5's sizes), and dqn_atari's and ppo_atari's (the Nature CNN on
minibatches of 4x84x84 uint8 stacks: DQN's 32, PPO's 256), eager against torch.compile of their loss
functions (forward and backward; the fused Adam steps stay eager), compile time counted (a fresh
inductor cache each run, so the compile seconds are a cold start's).

    python benchmark/compile_speed.py --updates 300 --blocks 3
    python benchmark/compile_speed.py --updates 100 --blocks 3 --scripts dqn_atari.py ppo_atari.py

One process, one torch thread; eager and compiled blocks of `updates` updates are interleaved (A B A
B ...) so that both see the same load. Prints a markdown table: ms per update (median block),
compile seconds (the first compiled call), and the updates after which compiling has paid for itself
(never, when it is not faster).
"""

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ALGOS = Path(__file__).resolve().parents[1] / "algos"
# imported as modules (torch.compile traces through their functions by module name)
sys.path.insert(0, str(ALGOS))


def sac_update_fns(m, obs_dim, action_dim, batch):
    """SAC's update from sac_continuous.py: (q_loss_fn, actor_loss_fn, step) where step runs one
    whole update."""
    import torch
    import torch.nn.functional as F

    low, high = -torch.ones(action_dim).numpy(), torch.ones(action_dim).numpy()
    actor = m.Actor(obs_dim, action_dim, low, high)
    qf1, qf2, qf1_t, qf2_t = (m.QNetwork(obs_dim, action_dim) for _ in range(4))
    q_opt = torch.optim.Adam([*qf1.parameters(), *qf2.parameters()], lr=3e-4, fused=True)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True)
    log_alpha = torch.zeros(1, requires_grad=True)
    t_opt = torch.optim.Adam([log_alpha], lr=3e-4, fused=True)

    def q_loss(b_obs, b_next_obs, b_actions, b_rewards, b_terminated, alpha):
        with torch.no_grad():
            next_actions, next_log_prob = actor.get_action(b_next_obs)
            target = m.sac_target(
                qf1_t(b_next_obs, next_actions),
                qf2_t(b_next_obs, next_actions),
                next_log_prob,
                b_rewards,
                b_terminated,
                0.99,
                alpha,
            )
        return F.mse_loss(qf1(b_obs, b_actions), target) + F.mse_loss(qf2(b_obs, b_actions), target)

    def actor_loss(b_obs, alpha):
        pi, log_prob = actor.get_action(b_obs)
        q_pi = torch.min(qf1(b_obs, pi), qf2(b_obs, pi))
        return (alpha * log_prob - q_pi).mean(), log_prob

    def step(q_loss_fn, actor_loss_fn):
        alpha = log_alpha.detach().exp()
        loss = q_loss_fn(*batch, alpha)
        q_opt.zero_grad()
        loss.backward()
        q_opt.step()
        qf1.requires_grad_(False)
        qf2.requires_grad_(False)
        a_loss, log_prob = actor_loss_fn(batch[0], alpha)
        qf1.requires_grad_(True)
        qf2.requires_grad_(True)
        a_opt.zero_grad()
        a_loss.backward()
        a_opt.step()
        t_loss = m.temperature_loss(log_alpha, log_prob, -float(action_dim))
        t_opt.zero_grad()
        t_loss.backward()
        t_opt.step()
        with torch.no_grad():
            for tp, p in zip(
                [*qf1_t.parameters(), *qf2_t.parameters()], [*qf1.parameters(), *qf2.parameters()]
            ):
                tp.lerp_(p, 0.005)

    return (q_loss, actor_loss), step


def td3_update_fns(m, obs_dim, action_dim, batch):
    """TD3's update from td3_continuous.py (the actor and targets every second update)."""
    import torch
    import torch.nn.functional as F

    low, high = -torch.ones(action_dim).numpy(), torch.ones(action_dim).numpy()
    actor, actor_t = (
        m.Actor(obs_dim, action_dim, low, high),
        m.Actor(obs_dim, action_dim, low, high),
    )
    qf1, qf2, qf1_t, qf2_t = (m.QNetwork(obs_dim, action_dim) for _ in range(4))
    q_opt = torch.optim.Adam([*qf1.parameters(), *qf2.parameters()], lr=3e-4, fused=True)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True)
    count = [0]

    def q_loss(b_obs, b_next_obs, b_actions, b_rewards, b_terminated):
        with torch.no_grad():
            noise = torch.randn_like(b_actions) * 0.2
            next_actions = m.smoothed_target_action(
                actor_t(b_next_obs), noise, 0.5, actor.action_scale, actor.action_bias
            )
            target = m.td3_target(
                qf1_t(b_next_obs, next_actions),
                qf2_t(b_next_obs, next_actions),
                b_rewards,
                b_terminated,
                0.99,
            )
        return F.mse_loss(qf1(b_obs, b_actions), target) + F.mse_loss(qf2(b_obs, b_actions), target)

    def actor_loss(b_obs):
        return -qf1(b_obs, actor(b_obs)).mean()

    def step(q_loss_fn, actor_loss_fn):
        loss = q_loss_fn(*batch)
        q_opt.zero_grad()
        loss.backward()
        q_opt.step()
        count[0] += 1
        if count[0] % 2 == 0:
            qf1.requires_grad_(False)
            a_loss = actor_loss_fn(batch[0])
            qf1.requires_grad_(True)
            a_opt.zero_grad()
            a_loss.backward()
            a_opt.step()
            with torch.no_grad():
                for tp, p in zip(
                    [*actor_t.parameters(), *qf1_t.parameters(), *qf2_t.parameters()],
                    [*actor.parameters(), *qf1.parameters(), *qf2.parameters()],
                ):
                    tp.lerp_(p, 0.005)

    return (q_loss, actor_loss), step


def dqn_atari_update_fns(m):
    """dqn_atari.py's update: the squared TD error of the Nature CNN on 32 stacks, the target
    network's max."""
    import torch
    import torch.nn.functional as F

    q, q_target = m.QNetwork(4), m.QNetwork(4)
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-4, fused=True)
    n = 32
    batch = [
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 4, (n,)),
        torch.randn(n),
        torch.zeros(n),
    ]

    def loss(b_obs, b_next_obs, b_actions, b_rewards, b_terminated):
        with torch.no_grad():
            target = m.td_target(q_target(b_next_obs), b_rewards, b_terminated, 0.99)
        return F.mse_loss(q(b_obs).gather(1, b_actions[:, None]).squeeze(1), target)

    def step(loss_fn):
        optimizer.zero_grad()
        loss_fn(*batch).backward()
        optimizer.step()

    return (loss,), step


def ppo_atari_update_fns(m):
    """ppo_atari.py's update: its minibatch_loss (the forward pass and ppo_loss: clipped surrogate,
    clipped value, entropy) on a minibatch of 256 stacks, the gradient clipped at norm 0.5."""
    import torch

    agent = m.Agent(4)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
    n = 256
    batch = [
        torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 4, (n,)),
        torch.full((n,), -1.386),
        torch.randn(n),
        torch.randn(n),
        torch.randn(n),
    ]

    def loss(b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values):
        return m.minibatch_loss(
            agent,
            b_obs,
            b_actions,
            b_logprobs,
            b_values,
            b_advantages,
            b_returns,
            0.1,
            0.01,
            0.5,
            0.1,
        )[0]

    def step(loss_fn):
        optimizer.zero_grad()
        loss_fn(*batch).backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()

    return (loss,), step


def measure(name, fns, updates, blocks):
    import torch

    losses, step = fns
    compiled = tuple(torch.compile(f) for f in losses)
    t = time.perf_counter()
    for _ in range(3):  # first calls compile (requires_grad toggles may recompile once)
        step(*compiled)
    compile_s = time.perf_counter() - t
    for _ in range(3):
        step(*losses)
    eager, comp = [], []
    for _ in range(blocks):
        for fns_, out in ((losses, eager), (compiled, comp)):
            t = time.perf_counter()
            for _ in range(updates):
                step(*fns_)
            out.append((time.perf_counter() - t) / updates * 1000)
    e, c = statistics.median(eager), statistics.median(comp)
    gain = (e - c) / 1000
    pays = f"{compile_s / gain:,.0f}" if gain > 0 else "never"
    return f"| {name} | {e:.2f} | {c:.2f} | {e / c:.2f}x | {compile_s:.1f} | {pays} |"


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--updates", type=int, default=300, help="updates per block")
    p.add_argument("--blocks", type=int, default=3, help="eager/compiled block pairs")
    p.add_argument(
        "--scripts",
        nargs="+",
        default=["sac_continuous.py", "td3_continuous.py", "dqn_atari.py", "ppo_atari.py"],
        help="whose updates to measure",
    )
    a = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    # cold: compile time all counted
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    obs_dim, action_dim, n = 11, 3, 256  # Hopper-v5, batch 256
    batch = [
        torch.randn(n, obs_dim),
        torch.randn(n, obs_dim),
        torch.rand(n, action_dim) * 2 - 1,
        torch.randn(n),
        torch.zeros(n),
    ]
    print(
        f"torch {torch.__version__}, one thread, load average "
        f"{os.getloadavg()[0]:.2f}, {a.blocks} x {a.updates} updates per side\n"
    )
    print(
        "| update | eager ms/update | compiled ms/update "
        "| speed-up | compile s | updates to pay back |"
    )
    print("|---|---|---|---|---|---|")
    updates = {
        "sac_continuous.py": lambda m: sac_update_fns(m, obs_dim, action_dim, batch),
        "td3_continuous.py": lambda m: td3_update_fns(m, obs_dim, action_dim, batch),
        "dqn_atari.py": dqn_atari_update_fns,
        "ppo_atari.py": ppo_atari_update_fns,
    }
    for script in a.scripts:
        fns = updates[script](importlib.import_module(script[:-3]))
        print(measure(script, fns, a.updates, a.blocks), flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
