"""Unit types and maps for smac_lite: plain data, no simulator code.

Add a map by adding an entry to ``MAPS`` (and a unit type to ``UNIT_TYPES`` if needed); the
simulator reads only these tables.

Time convention: one simulator sub-tick is one StarCraft II game loop = 1/16 *game* second = 1/22.4
*real* second at the "Faster" speed that SMAC and Liquipedia (Legacy of the Void) use. An agent step
is 8 loops (SMAC's step_mul=8) = 0.5 game seconds = 0.357 real seconds. All durations and rates
below are in real seconds ("Faster", Liquipedia's convention), used with dt = 1/22.4 s per loop;
values that SC2's data gives in game seconds are converted with ``_real`` (stalker cooldown 1.87
game s = 1.336 real s = 29.9 game loops).

Distances are in StarCraft II map units. ``range`` is the weapon range measured edge to edge as in
SC2; the simulator fires when the centre distance <= range + radius(attacker) + radius(target).
"""

# SC2 quotes durations in game seconds (16 game loops each); at "Faster" one game second lasts 1/1.4
# real seconds.
GAME_S = 1 / 1.4


def _real(game_seconds):
    """Real seconds ("Faster") of a duration given in game seconds, the unit of SC2's own data."""
    return game_seconds * GAME_S


# name: stats. Keys: hp, shield, armour              max hit points, max shields (protoss), armour
# (per-hit reduction) damage, hits                    damage per hit and hits per attack (zealot 8 x
# 2) bonus_armoured, bonus_light     extra damage per hit against armoured / light targets range,
# cooldown, speed          weapon range, weapon cooldown (real s), move speed (units per real s)
# radius                          unit radius (SC2 footprint), used for ranges and drawing armoured,
# light                 attributes air                             a flying unit: only weapons with
# hits_air can shoot it hits_air                        the weapon can target air units (SC2:
# marine, stalker, hydralisk; not marauder, zealot, colossus, zergling, baneling, spine crawler)
# splash, splash_at               area damage: every enemy ground unit whose edge is within `splash`
# of the centre takes the full hit; the centre is the target ("target") or the attacker itself
# ("self") suicide                         the attack kills the attacker, and the unit also attacks
# when it dies (baneling) collides                        takes part in ground collisions on maps
# with collide=True (not air units, not colossi, which step over small units) heal_rate, heal_range
# medivac only: HP healed per second, heal range (edge to edge) energy_start, energy_max,
# energy_regen, energy_per_hp   medivac energy (1 energy per 3 HP healed) smac_max_cooldown
# the constant SMAC divides the weapon cooldown (in game loops) by in the state
# (StarCraft2Env.unit_max_cooldown; 15 for unit types it does not list) Cooldowns are SC2's values
# in game seconds, converted: marine 0.8608, marauder 1.5, stalker 1.87, zealot 1.2, colossus 1.5,
# zergling 0.696, hydralisk 0.83, spine crawler 1.85 game s (Liquipedia rounds them to 0.61, 1.07,
# 1.34, 0.86, 1.07, 0.497, 0.59, 1.32 real s).
UNIT_TYPES = {
    "marine": dict(
        hp=45,
        armour=0,
        damage=6,
        range=5,
        cooldown=_real(0.8608),
        speed=3.15,
        radius=0.375,
        light=True,
        hits_air=True,
        smac_max_cooldown=15,
    ),
    "marauder": dict(
        hp=125,
        armour=1,
        damage=10,
        bonus_armoured=10,
        range=6,
        cooldown=_real(1.5),
        speed=3.15,
        radius=0.5625,
        armoured=True,
        smac_max_cooldown=25,
    ),
    "medivac": dict(
        hp=150,
        armour=1,
        damage=0,
        range=4,
        cooldown=0.0,
        speed=3.5,
        radius=0.75,
        armoured=True,
        air=True,
        collides=False,
        heal_rate=12.6,
        energy_start=50,
        energy_max=200,
        energy_regen=0.7875,
        energy_per_hp=1 / 3,
    ),
    "stalker": dict(
        hp=80,
        shield=80,
        armour=1,
        damage=13,
        bonus_armoured=5,
        range=6,
        cooldown=_real(1.87),
        speed=4.13,
        radius=0.625,
        armoured=True,
        hits_air=True,
        smac_max_cooldown=35,
    ),
    "zealot": dict(
        hp=100,
        shield=50,
        armour=1,
        damage=8,
        hits=2,
        range=0.1,
        cooldown=_real(1.2),
        speed=3.15,
        radius=0.5,
        light=True,
        smac_max_cooldown=22,
    ),
    # Thermal lances sweep a short line across the target; simplified to a circle of radius 1 around
    # it.
    "colossus": dict(
        hp=200,
        shield=150,
        armour=1,
        damage=10,
        hits=2,
        bonus_light=5,
        range=7,
        cooldown=_real(1.5),
        speed=3.15,
        radius=1.0,
        armoured=True,
        splash=1.0,
        splash_at="target",
        smac_max_cooldown=24,
        collides=False,
    ),
    "zergling": dict(
        hp=35,
        armour=0,
        damage=5,
        range=0.1,
        cooldown=_real(0.696),
        speed=4.13,
        radius=0.375,
        light=True,
        smac_max_cooldown=11,
    ),
    # Volatile Burst: 20 (+15 light) to every enemy ground unit within 2.2, no friendly fire; the
    # baneling dies when it bursts and bursts when it is killed (Liquipedia, LotV).
    "baneling": dict(
        hp=30,
        armour=0,
        damage=20,
        bonus_light=15,
        range=0.25,
        cooldown=0.0,
        speed=3.5,
        radius=0.375,
        splash=2.2,
        splash_at="self",
        suicide=True,
        smac_max_cooldown=1,
    ),
    "hydralisk": dict(
        hp=90,
        armour=0,
        damage=12,
        range=5,
        cooldown=_real(0.83),
        speed=3.15,
        radius=0.625,
        light=True,
        hits_air=True,
        smac_max_cooldown=10,
    ),
    "spine_crawler": dict(
        hp=300,
        armour=2,
        damage=25,
        bonus_armoured=5,
        range=7,
        cooldown=_real(1.85),
        speed=0.0,
        radius=1.0,
        armoured=True,
    ),
}

UNIT_DEFAULTS = dict(
    shield=0,
    armour=0,
    damage=0,
    hits=1,
    bonus_armoured=0,
    bonus_light=0,
    range=0.1,
    cooldown=1.0,
    speed=0.0,
    radius=0.5,
    armoured=False,
    light=False,
    air=False,
    hits_air=False,
    splash=0.0,
    splash_at="target",
    suicide=False,
    collides=True,
    heal_rate=0.0,
    energy_start=0.0,
    energy_max=0.0,
    energy_regen=0.0,
    energy_per_hp=0.0,
    smac_max_cooldown=15,
)

# Shields regenerate 2 per game second after 10 game seconds without taking damage (SC2, LotV), i.e.
# 2.8 per real second after 7.14 real seconds.
SHIELD_REGEN_RATE = 2.0 / GAME_S
SHIELD_REGEN_DELAY = _real(10.0)


def unit_stats(name):
    """Stats of a unit type with the defaults filled in."""
    return {**UNIT_DEFAULTS, **UNIT_TYPES[name]}


# Maps. agents / enemies: list of (unit type, count), in SMAC's agent order (sorted by unit type
# id). limit: SMAC's episode limit in agent steps. races: "T", "P", "Z" (P gives shield features).
# type_order: the unit types of the type one-hot (SMAC's unit_type_bits = len(type_order); empty =
# no bits). size: playable map size; allies start on the left, enemies on the right, `gap` map units
# apart. collide: ground units push each other apart (SC2 unit collision; colossi and air units are
# exempt). On for the swarm and area-damage maps, where stacking would decide the battle (64
# zerglings in one spot die to one colossus volley); off elsewhere, where it changes little and
# would cost speed. pursue (default True, as SC2's attack-moving units): an enemy keeps chasing its
# target when the target steps out of its weapon range (while it is within sight range 9); with
# pursue=False it turns to the closest ally instead (see smac_lite/README.md, Rules). A unit that
# cannot move (speed 0) never pursues.
_T = "T"
_P = "P"
_Z = "Z"


def _m(
    agents,
    enemies,
    limit,
    a_race,
    b_race,
    type_order=(),
    size=(32.0, 32.0),
    gap=13.0,
    collide=False,
):
    return dict(
        agents=list(agents),
        enemies=list(enemies),
        limit=limit,
        a_race=a_race,
        b_race=b_race,
        type_order=list(type_order),
        size=size,
        gap=gap,
        collide=collide,
    )


MAPS = {
    "3m": _m([("marine", 3)], [("marine", 3)], 60, _T, _T),
    "8m": _m([("marine", 8)], [("marine", 8)], 120, _T, _T),
    "25m": _m([("marine", 25)], [("marine", 25)], 150, _T, _T),
    "5m_vs_6m": _m([("marine", 5)], [("marine", 6)], 70, _T, _T),
    "8m_vs_9m": _m([("marine", 8)], [("marine", 9)], 120, _T, _T),
    "10m_vs_11m": _m([("marine", 10)], [("marine", 11)], 150, _T, _T),
    "27m_vs_30m": _m([("marine", 27)], [("marine", 30)], 180, _T, _T),
    "MMM": _m(
        [("marauder", 2), ("marine", 7), ("medivac", 1)],
        [("marauder", 2), ("marine", 7), ("medivac", 1)],
        150,
        _T,
        _T,
        type_order=("marauder", "marine", "medivac"),
    ),
    "MMM2": _m(
        [("marauder", 2), ("marine", 7), ("medivac", 1)],
        [("marauder", 3), ("marine", 8), ("medivac", 1)],
        180,
        _T,
        _T,
        type_order=("marauder", "marine", "medivac"),
    ),
    "2s3z": _m(
        [("stalker", 2), ("zealot", 3)],
        [("stalker", 2), ("zealot", 3)],
        120,
        _P,
        _P,
        type_order=("stalker", "zealot"),
    ),
    "3s5z": _m(
        [("stalker", 3), ("zealot", 5)],
        [("stalker", 3), ("zealot", 5)],
        150,
        _P,
        _P,
        type_order=("stalker", "zealot"),
    ),
    "3s5z_vs_3s6z": _m(
        [("stalker", 3), ("zealot", 5)],
        [("stalker", 3), ("zealot", 6)],
        170,
        _P,
        _P,
        type_order=("stalker", "zealot"),
    ),
    "3s_vs_3z": _m([("stalker", 3)], [("zealot", 3)], 150, _P, _P),
    "3s_vs_4z": _m([("stalker", 3)], [("zealot", 4)], 200, _P, _P),
    "3s_vs_5z": _m([("stalker", 3)], [("zealot", 5)], 250, _P, _P),
    "2m_vs_1z": _m([("marine", 2)], [("zealot", 1)], 150, _T, _P),
    "2s_vs_1sc": _m([("stalker", 2)], [("spine_crawler", 1)], 300, _P, _Z),
    "6h_vs_8z": _m([("hydralisk", 6)], [("zealot", 8)], 150, _Z, _P),
    "1c3s5z": _m(
        [("colossus", 1), ("stalker", 3), ("zealot", 5)],
        [("colossus", 1), ("stalker", 3), ("zealot", 5)],
        180,
        _P,
        _P,
        type_order=("colossus", "stalker", "zealot"),
        collide=True,
    ),
    "corridor": _m([("zealot", 6)], [("zergling", 24)], 400, _P, _Z, collide=True),
    "so_many_baneling": _m([("zealot", 7)], [("baneling", 32)], 100, _P, _Z, collide=True),
    "bane_vs_bane": _m(
        [("baneling", 4), ("zergling", 20)],
        [("baneling", 4), ("zergling", 20)],
        200,
        _Z,
        _Z,
        type_order=("baneling", "zergling"),
        collide=True,
    ),
    "2c_vs_64zg": _m([("colossus", 2)], [("zergling", 64)], 400, _P, _Z, collide=True),
}


def expand_units(groups):
    """[("marine", 2), ("medivac", 1)] -> ["marine", "marine", "medivac"]."""
    return [name for name, count in groups for _ in range(count)]
