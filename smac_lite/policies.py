"""Batched scripted policies for tests, baselines and GIFs: (env, avail) -> actions (N, n_agents)
long."""

import torch

from .core import N_NO_ATTACK
from .maps import unit_stats


def random_policy(env, avail, generator=None):
    """Uniform over the available actions, sampled on the env's device (argmax of iid uniforms over
    the available actions is uniform among them, and much cheaper than torch.multinomial)."""
    u = torch.rand(avail.shape, generator=generator, device=avail.device) * avail
    return u.argmax(2)


def focus_fire_policy(env, avail):
    """Every agent attacks the available enemy with the least hp + shields (medivacs heal the most
    damaged available ally); an agent with no target moves toward the closest living enemy."""
    A = env.n_agents
    E = env.n_enemies
    hs_e = (env.hp[:, A:] + env.sh[:, A:])[:, None, :].expand(-1, A, -1)
    score = hs_e
    if env.has_agent_healer:
        frac_a = env.hp[:, :A] / env.max_hp[:A]
        if A < E:
            frac_a = torch.cat([frac_a, frac_a.new_ones(frac_a.shape[0], E - A)], 1)
        score = torch.where(env.is_healer[:A, None], frac_a[:, None, :E], hs_e)
    att = avail[:, :, N_NO_ATTACK:]
    score = score + (1.0 - att) * 1e9
    target = score.argmin(2) + N_NO_ATTACK
    has_target = att.sum(2) > 0
    # Move toward the closest living enemy along its dominant axis (2 N, 3 S, 4 E, 5 W).
    dx = env.x[:, None, A:] - env.x[:, :A, None]
    dy = env.y[:, None, A:] - env.y[:, :A, None]
    d2 = dx * dx + dy * dy + (1.0 - env.alive[:, None, A:]) * 1e9
    j = d2.argmin(2, keepdim=True)
    mx = dx.gather(2, j).squeeze(2)
    my = dy.gather(2, j).squeeze(2)
    move = torch.where(mx.abs() > my.abs(), torch.where(mx > 0, 4, 5), torch.where(my > 0, 2, 3))
    act = torch.where(has_target, target, move)
    # blocked move: stop
    act = torch.where(avail.gather(2, act.unsqueeze(2)).squeeze(2) > 0, act, 1)
    return torch.where(env.alive[:, :A] > 0, act, 0)


def pull_back_policy(env, avail, below=0.5):
    """focus_fire_policy, except that an agent below `below` of its hp that an enemy is aiming at
    steps back west (toward its own side), out of that enemy's weapon range unless the enemy
    follows. It reads the enemies' targets from the simulator: a probe of the rules, not a policy an
    agent could observe its way to."""
    A = env.n_agents
    act = focus_fire_policy(env, avail)
    aimed = (env.enemy_target[:, :, None] == torch.arange(A, device=avail.device)) & (
        env.alive[:, A:, None] > 0
    )
    back = (aimed.sum(1) > 0) & (env.hp[:, :A] < below * env.max_hp[:A]) & (env.alive[:, :A] > 0)
    return torch.where(back & (avail[:, :, 5] > 0), 5, act)


def take_turns_policy(env, avail, margin=60.0, after_shot=0.67):
    """focus_fire_policy, except that agents take turns drawing the enemies' fire (the trick that
    wins 2s_vs_1sc in StarCraft II): an agent that an enemy aims at, with hp + shields more than
    `margin` below the healthiest other agent still fighting, steps away from the closest enemy.
    It starts only just after a shot (its weapon cooldown above `after_shot` of the whole), so
    that it loses as little firing time as it can, stops once it is out of that enemy's reach,
    and comes back when no enemy aims at it. Like pull_back_policy it reads the enemies' targets
    from the simulator, and it keeps which agents are stepping away on `env` between calls."""
    A = env.n_agents
    act = focus_fire_policy(env, avail)
    alive = env.alive[:, :A] > 0
    agents = torch.arange(A, device=avail.device)
    aimed = (env.enemy_target[:, :, None] == agents) & (env.alive[:, A:, None] > 0)
    aimed = aimed.sum(1) > 0
    away = getattr(env, "taking_turn", None)
    if away is None or away.shape != alive.shape:
        away = torch.zeros_like(alive)
    # hp + shields of the healthiest other agent that is fighting (not stepping away)
    ehp = env.hp[:, :A] + env.sh[:, :A]
    fighting = torch.where(alive & ~away, ehp, -1e9)
    others = fighting[:, None, :].expand(-1, A, -1).clone()
    others[:, agents, agents] = -1e9
    best_other = others.max(2).values
    just_shot = env.cd[:, :A] > after_shot * env.cd_max[:A]
    # Step away from the closest living enemy along its dominant axis (2 N, 3 S, 4 E, 5 W), until
    # out of its reach (weapon range + both radii, centre to centre).
    dx = env.x[:, None, A:] - env.x[:, :A, None]
    dy = env.y[:, None, A:] - env.y[:, :A, None]
    d2 = dx * dx + dy * dy + (1.0 - env.alive[:, None, A:]) * 1e9
    j = d2.argmin(2, keepdim=True)
    mx = dx.gather(2, j).squeeze(2)
    my = dy.gather(2, j).squeeze(2)
    weapon_range = torch.tensor([unit_stats(t)["range"] for t in env.unit_types])
    enemy_reach = weapon_range[A:].to(avail.device) + env.radius[A:]
    reach = enemy_reach[j.squeeze(2)] + env.radius[:A]
    in_reach = mx * mx + my * my <= (reach + 0.2) ** 2
    start = aimed & alive & just_shot & (ehp < best_other - margin)
    away = (away | start) & aimed & alive & in_reach
    env.taking_turn = away
    east_west = torch.where(mx > 0, 5, 4)
    north_south = torch.where(my > 0, 3, 2)
    step = torch.where(mx.abs() > my.abs(), east_west, north_south)
    step_ok = avail.gather(2, step.unsqueeze(2)).squeeze(2) > 0
    return torch.where(away & step_ok, step, act)


POLICIES = {
    "random": random_policy,
    "focus_fire": focus_fire_policy,
    "pull_back": pull_back_policy,
    "take_turns": take_turns_policy,
}


def play_battles(map_name, policy, num_battles, seed=0, device="cpu", **env_kwargs):
    """Play the first episode of `num_battles` battles with `policy` ("random", "focus_fire" or a
    callable (env, avail) -> actions). The random policy draws from a generator seeded with `seed`.
    Returns won (bool), episode_return, episode_length, terminated (bool): (num_battles,)
    tensors."""
    from .core import BatchedSMAC

    env = BatchedSMAC(map_name, num_envs=num_battles, device=device, seed=seed, **env_kwargs)
    policy = POLICIES.get(policy, policy)
    gen = torch.Generator(device=env.device).manual_seed(seed)
    _, _, avail = env.reset()
    n = num_battles
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    won = torch.zeros_like(finished)
    terminated = torch.zeros_like(finished)
    ret = torch.zeros(n, device=env.device)
    length = torch.zeros(n, dtype=torch.long, device=env.device)
    for _ in range(env.episode_limit):
        actions = random_policy(env, avail, gen) if policy is random_policy else policy(env, avail)
        _, _, avail, _, done, info = env.step(actions)
        # the first episode of each battle; later ones (auto-reset) are ignored
        new = done & ~finished
        won |= new & info["won"]
        terminated |= new & info["terminated"]
        ret = torch.where(new, info["episode_return"], ret)
        length = torch.where(new, info["episode_length"], length)
        finished |= done
        # a host sync per step: fine for evaluation, not for training loops
        if bool(finished.all()):
            break
    return won, ret, length, terminated
