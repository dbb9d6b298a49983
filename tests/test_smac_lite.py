"""smac_lite: unit rules, SMAC layouts, batching, determinism, rewards, scripted play and the
PettingZoo API."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import smac_lite
from smac_lite.core import DT, STEP_MUL
from smac_lite.maps import MAPS, UNIT_TYPES, unit_stats
from smac_lite.policies import play_battles, random_policy

torch.set_num_threads(1)
STEP_S = STEP_MUL * DT  # real seconds per agent step

# A target dummy: lots of hp, an attacker (so the battle does not end at once) that never reaches
# anyone.
DUMMY = dict(hp=1000, armour=0, damage=1, range=0.1, cooldown=1.0, speed=0.0, radius=0.5)


@pytest.fixture(autouse=True)
def _dummy_units(monkeypatch):
    monkeypatch.setitem(UNIT_TYPES, "dummy", DUMMY)
    monkeypatch.setitem(UNIT_TYPES, "tank", {**DUMMY, "armour": 10})
    # hits once, so melee units survive
    monkeypatch.setitem(UNIT_TYPES, "post", {**DUMMY, "cooldown": 1e6})
    # a baneling that stays put
    monkeypatch.setitem(UNIT_TYPES, "mine", {**UNIT_TYPES["baneling"], "speed": 0.0})


def duel(agents, enemies, dist, limit=50, a_race="T", b_race="T", **rules):
    """A custom map (maps are data): agents on the left, enemies `dist` to the right, no jitter;
    `rules`: map entries such as pursue=False."""
    spec = dict(
        agents=agents,
        enemies=enemies,
        limit=limit,
        a_race=a_race,
        b_race=b_race,
        type_order=[],
        size=(32.0, 32.0),
        gap=dist,
        **rules,
    )
    env = smac_lite.BatchedSMAC(spec, num_envs=1, seed=0, jitter=0.0, auto_reset=False)
    env.reset()
    A = env.n_agents
    env.x[:, :A] = 16 - dist / 2
    env.x[:, A:] = 16 + dist / 2
    env.y[:] = 16.0
    return env


def act(env, *a):
    return torch.tensor([list(a)])


def engage_then_step_out(env, out, inside):
    """Ally 0 draws the enemy's fire while ally 1 stands out of sight; then ally 0 is moved `out`
    from the enemy and ally 1 `inside`. Returns ally 0's hp and the enemy's x at that moment."""
    env.x[0, 1] = 2.0  # the second ally starts far away
    env.step(act(env, 1, 1))
    assert env.hp[0, 0].item() < 45 and env.hp[0, 1].item() == 45
    hp0, x_enemy = env.hp[0, 0].item(), env.x[0, 2].item()
    env.x[0, 0] = x_enemy - out
    env.x[0, 1] = x_enemy - inside
    return hp0, x_enemy


# ---------------------------------------------------------------------------------------------- uni
def test_damage_armour_and_bonus():
    env = duel([("marine", 1)], [("marauder", 1)], 5.0)
    env.step(act(env, 6))
    assert env.hp[0, 1].item() == pytest.approx(125 - (6 - 1))  # marine 6 dmg - marauder armour 1
    # marauder 10, no bonus against a light marine
    assert env.hp[0, 0].item() == pytest.approx(45 - 10)
    # Marauder against an armoured stalker: 10 + 10 bonus, all absorbed by shields (shields have no
    # armour).
    env = duel([("stalker", 1)], [("marauder", 1)], 5.0, a_race="P")
    env.step(act(env, 6))
    assert env.sh[0, 0].item() == pytest.approx(80 - 20)
    assert env.hp[0, 0].item() == pytest.approx(80)
    # stalker 13 +5 armoured, armour 1
    assert env.hp[0, 1].item() == pytest.approx(125 - (13 + 5 - 1))


def test_armour_minimum_half_damage():
    env = duel([("marine", 1)], [("tank", 1)], 5.0)
    env.step(act(env, 6))
    assert env.hp[0, 1].item() == pytest.approx(1000 - 0.5)


def test_zealot_two_hits_and_shield_spill():
    env = duel([("zealot", 1)], [("stalker", 1)], 1.0, a_race="P", b_race="P")
    env.sh[0, 1] = 10.0
    env.step(act(env, 6))
    # 2 hits of 8: 10 go to shields, the remaining 6 raw reach hp reduced by armour per hit
    # (prorated): 16-2=14 effective for 16 raw -> 14 * 6/16.
    assert env.sh[0, 1].item() == pytest.approx(0.0)
    assert env.hp[0, 1].item() == pytest.approx(80 - 14 * 6 / 16, abs=1e-4)


@pytest.mark.parametrize(
    "unit", ["marine", "marauder", "stalker", "zealot", "colossus", "zergling", "hydralisk"]
)
def test_fire_period_in_game_loops(unit):
    """Over 800 game loops a weapon with a cooldown of C loops fires at loops 0, C, 2C, ... (each
    shot in the first loop at or after its time), i.e. floor(799 / C) + 1 shots: marine C = 13.77 ->
    59 shots, not one per 15 loops."""
    s = unit_stats(unit)
    env = duel([(unit, 1)], [("post", 1)], s["range"] + s["radius"] + DUMMY["radius"] - 0.05)
    for _ in range(100):
        env.step(act(env, 6))
    shots = (1000 - env.hp[0, 1].item()) / (s["damage"] * s["hits"])
    period = s["cooldown"] / DT
    assert shots == pytest.approx(math.floor(799 / period) + 1)


def test_range_mask_chase_and_idle_fire():
    env = duel([("marine", 1)], [("dummy", 1)], 6.5)
    _, _, avail = env._observe()
    assert avail[0, 0, 6] == 0  # SMAC's shoot range 6
    env.step(act(env, 1))  # stop: idle units only fire at targets inside their weapon range
    assert env.hp[0, 1].item() == 1000
    env.step(act(env, 6))  # attack order on a target out of range: walk into range, then fire
    assert env.hp[0, 1].item() < 1000
    env = duel([("marine", 1)], [("dummy", 1)], 5.5)
    _, _, avail = env._observe()
    assert avail[0, 0, 6] == 1
    env.step(act(env, 1))
    assert env.hp[0, 1].item() == pytest.approx(994)


def test_movement_speed_and_move_amount():
    env = duel([("marine", 1)], [("dummy", 1)], 10.0)
    x0 = env.x[0, 0].item()
    env.step(act(env, 4))  # east
    assert env.x[0, 0].item() - x0 == pytest.approx(3.15 * STEP_S, rel=1e-4)
    env = duel([("stalker", 1)], [("dummy", 1)], 10.0, a_race="P")
    y0 = env.y[0, 0].item()
    env.step(act(env, 3))  # south
    assert y0 - env.y[0, 0].item() == pytest.approx(4.13 * STEP_S, rel=1e-4)


def test_shield_regeneration():
    """SC2: shields come back 2 per game second (2.8 per real second) after 10 game seconds (160
    loops, 7.14 real s) without damage."""
    env = duel([("stalker", 1)], [("dummy", 1)], 20.0, a_race="P")
    env.sh[0, 0] = 10.0
    env.since_dmg[0, 0] = 0.0
    for _ in range(19):  # 152 loops
        env.step(act(env, 1))
    assert env.sh[0, 0].item() == pytest.approx(10.0)
    for _ in range(5):  # 192 loops: 32 loops of regeneration at 1/8 per loop
        env.step(act(env, 1))
    assert env.sh[0, 0].item() == pytest.approx(14.0, abs=0.2)
    sh0 = env.sh[0, 0].item()
    for _ in range(16):  # a window of 128 loops = 5.71 real s
        env.step(act(env, 1))
    assert (env.sh[0, 0].item() - sh0) / (16 * STEP_S) == pytest.approx(2.8, rel=1e-3)


def test_ground_weapon_cannot_target_air():
    # Agents: a marauder (ground-only weapon) and a marine (hits air); enemies: a medivac in range
    # of both, and a dummy far away that keeps the battle going.
    env = duel([("marauder", 1), ("marine", 1)], [("medivac", 1), ("dummy", 1)], 4.0)
    env.x[0, 3] = 30.0
    _, _, avail = env._observe()
    assert avail[0, 0, 6] == 0 and avail[0, 1, 6] == 1
    # the marauder's order is invalid (acts as stop); the idle marine fires at the medivac
    env.step(act(env, 6, 1))
    assert env.hp[0, 2].item() == pytest.approx(150 - (6 - 1))
    env.step(act(env, 1, 5))  # marine walks away; the idle marauder has nothing it can shoot
    env.step(act(env, 6, 5))
    assert env.hp[0, 2].item() == pytest.approx(150 - (6 - 1))


def test_move_stops_at_map_edge():
    env = duel([("marine", 1)], [("dummy", 1)], 10.0)
    env.x[0, 0] = 0.5
    env.y[0, 0] = 31.7
    env.step(act(env, 5))  # west: the goal is clipped to x = 0, and the marine stops on it
    assert env.x[0, 0].item() == 0.0
    env.step(act(env, 2))  # north: the goal is clipped to y = 32
    assert env.x[0, 0].item() == 0.0 and env.y[0, 0].item() == 32.0


def test_state_cooldown_scaled_by_smac_table():
    """SMAC's state: weapon cooldown in game loops / a fixed per-type constant (marine 15), not /
    the unit's own."""
    env = duel([("marine", 1)], [("dummy", 1)], 5.0)
    _, state, _, _, _, _ = env.step(act(env, 6))  # fired at loop 0, 8 loops ago
    assert state[0, 1].item() == pytest.approx((0.8608 * 16 - 8) / 15, abs=1e-3)


def test_baneling_bursts_on_all_enemy_ground_units_around_it_and_dies():
    # Agents: a baneling with a zergling beside it; enemies: zerglings at 1 and 2.5 (edge 2.2 +
    # 0.375 away is the limit) and one at 3.5, plus a dummy far away.
    env = duel([("baneling", 1), ("zergling", 1)], [("zergling", 3), ("dummy", 1)], 1.0, b_race="Z")
    env.x[0, 1] = env.x[0, 0] - 0.5
    env.x[0, 3] = env.x[0, 0] + 2.5
    env.x[0, 4] = env.x[0, 0] + 3.5
    env.x[0, 5] = 30.0
    env.step(act(env, 6, 1))
    assert env.alive[0, 0] == 0  # the baneling is gone
    assert env.hp[0, 2].item() == 0 and env.hp[0, 3].item() == 0  # 20 + 15 (light) each
    # out of the burst; no friendly fire
    assert env.hp[0, 4].item() == 35 and env.hp[0, 1].item() == 35


def test_baneling_killed_bursts_where_it_dies():
    env = duel([("marine", 1), ("post", 1)], [("mine", 1), ("dummy", 1)], 5.0, b_race="Z")
    env.x[0, 1] = env.x[0, 2] - 1.8  # beyond the mine's reach (1.125), within its burst (2.2 + 0.5)
    env.y[0, 1] = 16.0
    env.x[0, 3] = 30.0
    env.hp[0, 2] = 1.0
    env.step(act(env, 6, 1))
    assert env.alive[0, 2] == 0 and env.hp[0, 1].item() == 1000 - 20  # not light: 20


def test_colossus_splash_around_its_target():
    env = duel([("colossus", 1)], [("zergling", 3), ("dummy", 1)], 7.5, a_race="P", b_race="Z")
    env.x[0, 2] = env.x[0, 1] + 1.2  # edge within 1 of the target's centre
    env.x[0, 3] = env.x[0, 1] + 2.5
    env.x[0, 4] = 30.0
    env.hp[0, 1:4] = 1000.0  # so that one volley's damage can be read off
    env.step(act(env, 6))
    assert env.hp[0, 1].item() == pytest.approx(1000 - 2 * 15)  # 10 (+5 light) x 2
    assert env.hp[0, 2].item() == pytest.approx(1000 - 2 * 15)
    assert env.hp[0, 3].item() == 1000


def test_medivac_heals_and_spends_energy():
    env = duel([("marine", 1), ("medivac", 1)], [("dummy", 2)], 20.0)
    env.hp[0, 0] = 20.0
    obs, state, avail = env._observe()
    # the medivac's target slots are allies (not medivacs)
    assert avail[0, 1, 6] == 1 and avail[0, 1, 7] == 0
    assert avail[0, 0, 6] == 0  # the dummy is out of range for the marine
    env.step(act(env, 1, 6))
    assert env.hp[0, 0].item() == pytest.approx(20 + 12.6 * STEP_S, abs=1e-3)
    assert env.energy[0, 1].item() == pytest.approx(
        50 - 12.6 * STEP_S / 3 + 0.7875 * STEP_S, abs=1e-3
    )
    for _ in range(10):
        env.step(act(env, 1, 6))
    assert env.hp[0, 0].item() == pytest.approx(45)  # capped at max hp


def test_death_win_and_reward():
    env = duel([("marine", 1)], [("marine", 1)], 5.0)
    env.hp[0, 1] = 3.0
    _, _, avail, reward, done, info = env.step(act(env, 6))
    assert (
        env.alive[0, 1] == 0
        and bool(done[0])
        and bool(info["won"][0])
        and not bool(info["truncated"][0])
    )
    scale = 20.0 / (10 + 200 + 45)
    assert reward[0].item() == pytest.approx((3 + 10 + 200) * scale, rel=1e-5)
    assert avail[0, 0, 6] == 0  # dead enemy


def test_loss_and_dead_agent():
    env = duel([("marine", 2)], [("marauder", 1)], 5.0)
    env.hp[0, 0] = 1.0
    env.hp[0, 1] = 1.0
    env.y[0, 1] = 16.2
    env2 = duel([("marine", 2)], [("marauder", 1)], 5.0)
    env2.hp[0, 0] = 1.0
    _, _, avail, _, done, _ = env2.step(act(env2, 1, 1))
    assert avail[0, 0].tolist() == [1.0] + [0.0] * 6  # a dead agent can only no-op
    o, _, _ = env2._observe()
    assert torch.all(o[0, 0] == 0)  # and observes nothing
    assert not bool(done[0])
    # Both marines at 1 hp: the marauder kills one per shot -> the battle is lost within a few
    # steps.
    for _ in range(6):
        _, _, _, r, done, info = env.step(act(env, 0, 0))
        if bool(done[0]):
            break
    assert bool(done[0]) and not bool(info["won"][0]) and not bool(info["truncated"][0])


@pytest.mark.parametrize("only_positive", [True, False])
def test_reward_defeat_in_both_modes(only_positive):
    spec = dict(
        agents=[("marine", 1)],
        enemies=[("marauder", 1)],
        limit=50,
        a_race="T",
        b_race="T",
        type_order=[],
        size=(32.0, 32.0),
        gap=5.0,
    )
    env = smac_lite.BatchedSMAC(
        spec,
        seed=0,
        jitter=0.0,
        auto_reset=False,
        reward_defeat=-7.0,
        reward_only_positive=only_positive,
    )
    env.reset()
    env.hp[0, 0] = 1.0
    # walk away without firing; the marauder kills it
    _, _, _, reward, done, info = env.step(act(env, 5))
    assert bool(done[0]) and not bool(info["won"][0])
    # SMAC: negative mode also charges 0.5 x (the lost hp + 10 for the death).
    expected = -7.0 if only_positive else -7.0 - 0.5 * (1.0 + 10.0)
    assert reward[0].item() == pytest.approx(expected * env.reward_scale, rel=1e-5)


def test_time_limit_truncates():
    env = duel([("marine", 1)], [("dummy", 1)], 20.0, limit=7)
    for t in range(7):
        _, _, _, _, done, info = env.step(act(env, 1))
        assert bool(done[0]) == (t == 6)
    assert (
        bool(info["truncated"][0]) and not bool(info["won"][0]) and not bool(info["terminated"][0])
    )
    assert int(info["episode_length"][0]) == 7


# ---------------------------------------------------------------------------------------------- ene
def test_enemy_keeps_its_target_while_in_range():
    """SC2 auto-targeting: an enemy keeps shooting the ally it engaged even when another comes
    closer."""
    env = duel([("marine", 2)], [("marine", 1)], 5.0)
    env.x[0, 1] = 5.0  # the second ally starts far away
    env.step(act(env, 1, 1))
    assert env.hp[0, 0].item() < 45 and env.hp[0, 1].item() == 45
    env.x[0, 1] = env.x[0, 2] - 2.0  # now much closer to the enemy than the engaged ally (5 away)
    env.y[0, 1] = 16.5
    hp0 = env.hp[0, 0].item()
    for _ in range(2):
        env.step(act(env, 1, 1))
    assert env.hp[0, 1].item() == 45 and env.hp[0, 0].item() < hp0


@pytest.mark.parametrize("pursue", [False, True])
def test_enemy_follows_a_target_that_leaves_weapon_range_unless_the_map_says_not(pursue):
    """The engaged ally steps out of the enemy's weapon range (still within sight) while another
    ally is in range: by default (SC2's pursuit) the enemy follows the one it engaged; on a map with
    pursue=False it turns to the ally in range."""
    env = duel([("marine", 2)], [("marine", 1)], 5.0, pursue=pursue)
    # ally 0 out of weapon range (5 + both radii), within sight (9); ally 1 in range
    hp0, x_enemy = engage_then_step_out(env, 7.5, 5.0)
    env.step(act(env, 1, 1))
    # one step (1.125 map units) is not enough to close 7.5 to 5.75: nobody is hit, the enemy walks
    if pursue:
        assert (
            env.hp[0, 1].item() == 45
            and env.hp[0, 0].item() == hp0
            and env.x[0, 2].item() < x_enemy - 1
        )
    else:
        # it follows the engaged ally until its next re-evaluation (4 loops), then shoots the one
        # in range
        assert (
            env.hp[0, 1].item() < 45
            and env.hp[0, 0].item() == hp0
            and env.x[0, 2].item() > x_enemy - 0.6
        )


def test_enemy_prefers_a_threat_and_attack_moves_to_the_allies_start():
    # A medivac (cannot shoot) is closer to the enemy than the marine; the enemy shoots the marine.
    env = duel([("marine", 1), ("medivac", 1)], [("marine", 1), ("dummy", 1)], 5.5)
    env.x[0, 1] = env.x[0, 2] - 3.0
    env.x[0, 3] = 30.0
    env.step(act(env, 1, 1))
    assert env.hp[0, 0].item() < 45 and env.hp[0, 1].item() == 150
    # No ally within acquisition range: the enemy walks to the allies' start and waits there.
    env = duel([("marine", 1)], [("marine", 1)], 8.0)
    x_start = env.point_x[0, env._rally_col].item()
    env.x[0, 0] = 1.0
    env.y[0, 0] = 1.0
    for _ in range(10):
        env.step(act(env, 1))
    assert env.x[0, 1].item() == pytest.approx(x_start, abs=1e-4) and env.y[
        0, 1
    ].item() == pytest.approx(16.0)
    assert env.hp[0, 0].item() == 45


# ---------------------------------------------------------------------------------------------- lay
# SMAC's (obs_shape, state_shape, n_actions) with default settings (state_last_action=True).
SMAC_SHAPES = {
    "3m": (30, 48, 9),
    "8m": (80, 168, 14),
    "25m": (250, 950, 31),
    "5m_vs_6m": (55, 98, 12),
    "8m_vs_9m": (85, 179, 15),
    "10m_vs_11m": (105, 243, 17),
    "27m_vs_30m": (285, 1170, 36),
    "MMM": (160, 290, 16),
    "MMM2": (176, 322, 18),
    "2s3z": (80, 120, 11),
    "3s5z": (128, 216, 14),
    "3s5z_vs_3s6z": (136, 230, 15),
    "3s_vs_5z": (48, 68, 11),
    "2s_vs_1sc": (17, 27, 7),
    "6h_vs_8z": (78, 140, 14),
    # Worked out by hand from SMAC's get_obs_size / get_state_size and its map registry.
    "1c3s5z": (162, 270, 15),
    "corridor": (156, 282, 30),
    "so_many_baneling": (202, 397, 38),
    "bane_vs_bane": (336, 984, 30),
    "2c_vs_64zg": (332, 342, 70),
}


@pytest.mark.parametrize("map_name", sorted(MAPS))
def test_shapes_every_map(map_name):
    env = smac_lite.BatchedSMAC(map_name, num_envs=3, seed=0)
    obs, state, avail = env.reset()
    A, N = env.n_agents, 3
    assert obs.shape == (N, A, env.obs_dim) and state.shape == (N, env.state_dim)
    assert avail.shape == (N, A, env.n_actions) and env.n_actions == 6 + env.n_enemies
    assert env.episode_limit == MAPS[map_name]["limit"]
    if map_name in SMAC_SHAPES:
        assert (env.obs_dim, env.state_dim, env.n_actions) == SMAC_SHAPES[map_name]
    assert obs.abs().max() <= 1.0 and state.abs().max() <= 1.0
    # alive: no no-op, stop allowed
    assert torch.all(avail[:, :, 0] == 0) and torch.all(avail[:, :, 1] == 1)
    obs, state, avail, reward, done, info = env.step(random_policy(env, avail))
    assert reward.shape == (N,) and done.dtype == torch.bool
    assert info["won"].shape == (N,) and info["episode_return"].shape == (N,)


def test_obs_layout_3m():
    env = smac_lite.BatchedSMAC("3m", num_envs=1, seed=0, jitter=0.0)
    env.reset()
    env.x[0] = torch.tensor([10.0, 10.0, 10.0, 14.0, 30.0, 12.0])
    env.y[0] = torch.tensor([16.0, 17.0, 10.0, 16.0, 16.0, 19.0])
    env.hp[0, 3] = 22.5
    obs, state, avail = env._observe()
    o = obs[0, 0]
    assert o[:4].tolist() == [1, 1, 1, 1]
    # enemy 0 at (+4, 0): attackable, dist 4/9, rel (4/9, 0), health 0.5
    assert o[4:9].tolist() == pytest.approx([1, 4 / 9, 4 / 9, 0, 0.5])
    assert o[9:14].tolist() == [0] * 5  # enemy 1 beyond sight
    # enemy 2: dist 3.6 <= 6
    assert o[14:19].tolist() == pytest.approx([1, 13**0.5 / 9, 2 / 9, 3 / 9, 1])
    assert o[19:24].tolist() == pytest.approx([1, 1 / 9, 0, 1 / 9, 1])  # ally 1
    assert o[24:29].tolist() == pytest.approx([1, 6 / 9, 0, -6 / 9, 1])  # ally 2
    assert o[29].item() == 1.0  # own health
    # state: ally 0 [health, cooldown, rel x, rel y], enemies [health, rel x, rel y], last actions
    assert state[0, :4].tolist() == pytest.approx([1, 0, (10 - 16) / 32, 0])
    assert state[0, 12:15].tolist() == pytest.approx([0.5, (14 - 16) / 32, 0])


# ---------------------------------------------------------------------------------------------- bat
def test_batched_equals_single_battles():
    n, steps = 4, 130
    batched = smac_lite.BatchedSMAC("2s3z", num_envs=n, seed=3)
    singles = [smac_lite.BatchedSMAC("2s3z", num_envs=1, seed=3, env_id_offset=i) for i in range(n)]
    ob, sb, ab = batched.reset()
    outs = [s.reset() for s in singles]
    g = torch.Generator().manual_seed(0)
    n_done = 0
    for _ in range(steps):
        for i in range(n):
            assert torch.allclose(ob[i], outs[i][0][0], atol=1e-5)
            assert torch.allclose(sb[i], outs[i][1][0], atol=1e-5)
            assert torch.equal(ab[i], outs[i][2][0])
        a = random_policy(batched, ab, g)
        ob, sb, ab, rb, db, ib = batched.step(a)
        outs = [s.step(a[i : i + 1]) for i, s in enumerate(singles)]
        for i in range(n):
            assert rb[i].item() == pytest.approx(outs[i][3][0].item(), abs=1e-5)
            assert bool(db[i]) == bool(outs[i][4][0])
        n_done += int(db.sum())
    assert n_done >= n  # auto-reset was exercised


def test_same_seed_same_battle():
    def rollout(seed):
        env = smac_lite.BatchedSMAC("3m", num_envs=8, seed=seed)
        _, state, avail = env.reset()
        g = torch.Generator().manual_seed(1)
        states = [state]
        for _ in range(40):
            _, state, avail, _, _, _ = env.step(random_policy(env, avail, g))
            states.append(state)
        return torch.stack(states)

    a, b, c = rollout(5), rollout(5), rollout(6)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], c[0])  # different jitter


def test_unseeded_envs_differ():
    a, b = smac_lite.parallel_env("3m"), smac_lite.parallel_env("3m")
    a.reset()
    b.reset()
    assert not np.array_equal(a.state(), b.state())
    c, d = smac_lite.parallel_env("3m", seed=4), smac_lite.parallel_env("3m", seed=4)
    c.reset()
    d.reset()
    assert np.array_equal(c.state(), d.state())


def test_reset_seed_restarts_stream():
    env = smac_lite.BatchedSMAC("3m", num_envs=2, seed=0)
    _, s0, _ = env.reset(seed=9)
    _, s1, _ = env.reset()
    _, s2, _ = env.reset(seed=9)
    assert torch.equal(s0, s2) and not torch.equal(s0, s1)


# ---------------------------------------------------------------------------------------------- rew
def test_max_reward_scale():
    env = smac_lite.BatchedSMAC("2s3z", num_envs=1)
    assert env.max_reward == 5 * 10 + 200 + 2 * 160 + 3 * 150
    assert env.reward_scale == pytest.approx(20 / env.max_reward)


def test_perfect_win_returns_20_and_focus_fire_beats_random():
    won_ff, ret_ff, len_ff, _ = play_battles("3m", "focus_fire", 64)
    won_rand, _, _, _ = play_battles("3m", "random", 64)
    assert (len_ff > 0).all()  # every battle finished within the episode limit
    assert won_ff.sum() > 0
    # A won 3m battle has dealt every enemy hp, every kill and the win bonus: exactly SMAC's max
    # return, 20.
    assert torch.allclose(ret_ff[won_ff], torch.full_like(ret_ff[won_ff], 20.0), atol=1e-4)
    assert ret_ff.max() <= 20.0 + 1e-4
    assert won_ff.float().mean() >= won_rand.float().mean() + 0.3


def test_a_unit_that_cannot_move_turns_to_an_ally_in_range():
    """SC2's static defence cannot follow a target: a spine crawler whose target steps out of its
    weapon range (still within sight) shoots an ally in range, under the default rules too."""
    env = duel([("marine", 2)], [("spine_crawler", 1)], 6.0)
    # ally 0 out of weapon range (7 + both radii), within sight (9); ally 1 in range
    hp0, _ = engage_then_step_out(env, 8.8, 6.0)
    for _ in range(6):  # past the crawler's cooldown (1.85 game s)
        env.step(act(env, 1, 1))
    assert env.hp[0, 1].item() < 45 and env.hp[0, 0].item() == hp0


def test_2s_vs_1sc_plays_the_same_under_either_rule():
    """2s_vs_1sc's only enemy cannot move, so pursuit changes nothing there: the same battles end
    the same under the default rules and pursue=False."""
    for policy in ("random", "pull_back", "take_turns"):  # before the rule, each played otherwise
        a = play_battles("2s_vs_1sc", policy, 256, seed=5)
        b = play_battles(dict(MAPS["2s_vs_1sc"], pursue=False), policy, 256, seed=5)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), policy


def test_pulling_back_wins_5m_vs_6m_under_the_default_rules_only():
    """The rule that decides 5m_vs_6m (benchmark/smac_lite_rules.py): a damaged marine that steps
    back drags its attackers out of the fight only if they follow it, as SC2's do (the default).
    Seeds 0-3 of 200-500 battles gave 0.93-0.96 and, with pursue=False, 0.00; this battle seed was
    not among them."""
    won, _, _, _ = play_battles("5m_vs_6m", "pull_back", 100, seed=914)
    won_dropping, _, _, _ = play_battles(
        dict(MAPS["5m_vs_6m"], pursue=False), "pull_back", 100, seed=914
    )
    assert won.float().mean() >= 0.5 and won_dropping.float().mean() <= 0.05


def test_taking_turns_wins_2s_vs_1sc_where_focus_fire_and_pulling_back_lose():
    """2s_vs_1sc's trick in StarCraft II: the stalker the spine crawler shoots steps out of its
    reach, just after a shot, and the crawler turns to the other. take_turns_policy won every one
    of 64 battles on seeds 0-9 and 500 on seed 10; focus fire and pull-back win none."""
    won, _, _, _ = play_battles("2s_vs_1sc", "take_turns", 64, seed=11)
    won_ff, _, _, _ = play_battles("2s_vs_1sc", "focus_fire", 64, seed=11)
    won_pb, _, _, _ = play_battles("2s_vs_1sc", "pull_back", 64, seed=11)
    assert won.float().mean() >= 0.9
    assert won_ff.sum() == 0 and won_pb.sum() == 0


def test_a_learned_policy_wins_2m_vs_1z_where_the_scripted_ones_lose():
    """2m_vs_1z can be won on smac_lite: QMIX's greedy policy after 500k steps (seed 1 of the
    marl-2m-vs-1z suite, stored with its digest in benchmark/policies/) won 0.86-0.95 of 64 battles
    on each of seeds 100-109 and 0.886 of 1000 on seed 0. It retreats while firing, then one marine
    draws the zealot along the map's edge while the other follows and shoots. Focus fire, pull-back
    and take-turns win none."""
    from benchmark.datasets import POLICIES, check_digest
    from benchmark.runs import load_script

    path = POLICIES / "qmix_smac_lite-2m_vs_1z-500k" / "model.pt"
    check_digest(path)
    saved = torch.load(path, weights_only=True)
    qmix = load_script("qmix_smac_lite.py")
    agent = qmix.RNNAgent(saved["input_dim"], saved["n_actions"], saved["hidden"])
    agent.load_state_dict(saved["agent"])
    won = qmix.evaluate(agent, "2m_vs_1z", 64, seed=11)["eval/win_rate"]
    assert np.mean(won) >= 0.7
    for policy in ("focus_fire", "pull_back", "take_turns"):
        won_scripted, _, _, _ = play_battles("2m_vs_1z", policy, 64, seed=11)
        assert won_scripted.sum() == 0, policy


# ---------------------------------------------------------------------------------------------- Pet
@pytest.mark.parametrize("map_name", ["3m", "MMM"])
def test_parallel_api(map_name):
    from pettingzoo.test import parallel_api_test

    env = smac_lite.parallel_env(map_name, seed=0)
    parallel_api_test(env, num_cycles=1000)
    env.reset(seed=1)
    assert env.state().shape == (env.core.state_dim,)


def test_render_rgb_array(tmp_path):
    env = smac_lite.parallel_env("2s3z", render_mode="rgb_array", seed=0)
    env.reset()
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 3  # something is drawn
    won, ret, length = smac_lite.save_gif("3m", "focus_fire", str(tmp_path / "b.gif"))
    assert (tmp_path / "b.gif").stat().st_size > 0 and length > 0


def test_the_speed_tool_compares_the_two_pursuit_rules():
    """benchmark/smac_lite_speed.py --compare-pursue measures each cell under both rules (a few
    seconds at 2 battles)."""
    tool = Path(__file__).resolve().parents[1] / "benchmark" / "smac_lite_speed.py"
    flags = ["--maps", "3m", "--envs", "2", "--repeats", "2", "--device", "cpu"]
    out = subprocess.run(
        [sys.executable, str(tool), *flags, "--compare-pursue", "--no-report"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert "pursue=False" in line and float(line.rsplit("ratio ", 1)[1]) > 0
