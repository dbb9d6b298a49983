"""Batched SMAC-like battle simulator in torch: one call steps N battles, on CPU or CUDA.

See smac_lite/README.md for the semantics and where they differ from SMAC. Layout of the per-unit
tensors: units are indexed 0..U-1 with the n_agents allies first and the n_enemies enemies after
them. Positions live in (N, U + n_agents + 1) buffers whose next n_agents columns hold the agents'
move goals and whose last column is the enemies' attack-move point, so that "move toward a point"
and "move toward a target unit" are one gather and one code path.
"""

import math
import secrets

import torch

from .maps import MAPS, SHIELD_REGEN_DELAY, SHIELD_REGEN_RATE, expand_units, unit_stats

STEP_MUL = 8  # game loops per agent step (SMAC's step_mul)
DT = 1.0 / 22.4  # real seconds per game loop at "Faster" (16 loops per game second)
MOVE_AMOUNT = 2.0  # a move order goes this far (SMAC's move_amount)
SIGHT_RANGE = 9.0  # SMAC's unit sight range, used by observations
SHOOT_RANGE = 6.0  # SMAC's shoot range, used by the available-action mask
RETARGET_EVERY = 4  # game loops between target re-evaluations of enemies and idle agents
ACQUIRE_RANGE = SIGHT_RANGE  # enemies on attack-move acquire targets this close (centre distance)
# added to the squared distance of a target that cannot shoot back: SC2 prefers threats
_NOT_A_THREAT = 1e4
_OUT_OF_SIGHT = 1e6  # added beyond ACQUIRE_RANGE: such a unit is never acquired
N_NO_ATTACK = 6  # no-op, stop, move N, S, E, W
APPROACH_SLACK = 0.005  # map units
_BIG = 1e9
_M31 = 0x7FFFFFFF

# Directions of actions 2..5 (SMAC: north = +y, south = -y, east = +x, west = -x).
_MOVE_DX = (0.0, 0.0, 0.0, 0.0, 1.0, -1.0)
_MOVE_DY = (0.0, 0.0, 1.0, -1.0, 0.0, 0.0)


def _mix(h):
    """Integer hash on int64 tensors holding 31-bit values (products stay below 2**62: no
    overflow)."""
    h = (((h >> 15) ^ h) * 0x2C1B3C6D) & _M31
    h = (((h >> 12) ^ h) * 0x297A2D39) & _M31
    return ((h >> 15) ^ h) & _M31


class BatchedSMAC:
    """N independent battles of one map, stepped together.

    reset() -> obs (N, n_agents, obs_dim), state (N, state_dim), avail (N, n_agents, n_actions)
    step(actions (N, n_agents) long) -> obs, state, avail, reward (N,), done (N,) bool, info
    Finished battles are reset automatically (auto_reset=True): the returned obs/state/avail of a
    finished battle are the first ones of its next episode; info["won"], info["truncated"],
    info["episode_return"], info["episode_length"] describe the episode that just ended (valid where
    done).

    Randomness (start-position jitter) comes from a counter-based hash of (seed, battle id, episode
    index), so battle i of BatchedSMAC(seed=s, num_envs=N) replays exactly BatchedSMAC(seed=s,
    num_envs=1, env_id_offset=i), whatever N is.
    """

    def __init__(
        self,
        map_name="3m",
        num_envs=1,
        device="cpu",
        seed=0,
        env_id_offset=0,
        auto_reset=True,
        return_final=False,
        state_last_action=True,
        jitter=0.5,
        reward_only_positive=True,
        reward_death_value=10.0,
        reward_win=200.0,
        reward_defeat=0.0,
        reward_negative_scale=0.5,
        reward_scale=True,
        reward_scale_rate=20.0,
    ):
        spec = MAPS[map_name] if isinstance(map_name, str) else map_name
        self.map_name = map_name if isinstance(map_name, str) else "custom"
        self.spec = spec
        self.device = torch.device(device)
        self.num_envs = N = int(num_envs)
        self.auto_reset = auto_reset
        self.return_final = return_final
        self.state_last_action = state_last_action
        self.jitter = float(jitter)
        self.reward_only_positive = reward_only_positive
        self.reward_death_value = float(reward_death_value)
        self.reward_win = float(reward_win)
        self.reward_defeat = float(reward_defeat)
        self.reward_negative_scale = float(reward_negative_scale)

        agent_types = expand_units(spec["agents"])
        enemy_types = expand_units(spec["enemies"])
        self.unit_types = agent_types + enemy_types
        self.n_agents = A = len(agent_types)
        self.n_enemies = E = len(enemy_types)
        self.n_units = U = A + E
        self.n_actions = N_NO_ATTACK + E
        self.episode_limit = int(spec["limit"])
        self.map_w, self.map_h = map(float, spec["size"])
        type_order = list(spec.get("type_order", []))
        self.unit_type_bits = tb = len(type_order) if len(type_order) > 1 else 0
        self.shield_bits_ally = int(spec["a_race"] == "P")
        self.shield_bits_enemy = int(spec["b_race"] == "P")

        dev = self.device
        f32 = dict(dtype=torch.float32, device=dev)
        stats = [unit_stats(t) for t in self.unit_types]

        def col(key):
            return torch.tensor([float(s[key]) for s in stats], **f32)

        self.max_hp = col("hp")
        # SMAC's state divides the weapon cooldown in game loops by a fixed per-type constant, not
        # the unit's own.
        self.cd_scale = 1.0 / (DT * col("smac_max_cooldown"))
        self.max_sh = col("shield")
        self.cd_max = col("cooldown")
        self.speed_dt = col("speed") * DT
        self.radius = col("radius")
        is_healer = [s["heal_rate"] > 0 for s in stats]
        self.is_healer = torch.tensor(is_healer, dtype=torch.bool, device=dev)
        self.has_agent_healer = any(is_healer[:A])
        self.has_enemy_healer = any(is_healer[A:])
        self.has_healer = self.has_agent_healer or self.has_enemy_healer
        self.has_shields = any(s["shield"] > 0 for s in stats)
        # Energy: medivacs only; other units get +inf so that "energy > 0" never stops them.
        self.energy_start = torch.tensor(
            [s["energy_start"] if h else math.inf for s, h in zip(stats, is_healer)], **f32
        )
        self.energy_max = torch.tensor(
            [s["energy_max"] if h else math.inf for s, h in zip(stats, is_healer)], **f32
        )
        self.energy_regen_dt = col("energy_regen") * DT
        self.energy_per_hp = col("energy_per_hp")
        # Units that can win a fight (SMAC: a side with only medivacs left has lost).
        attacker = torch.tensor([s["damage"] > 0 for s in stats], dtype=torch.float32, device=dev)
        self.attacker_a = attacker[:A]
        self.attacker_e = attacker[A:]

        # Pair tables (U, n_points) attacker a -> target column t (t < U: a unit, U <= t < U + A: an
        # agent's move goal, U + A: the enemies' attack-move point), flattened so that an (N, U)
        # index tensor picks each unit's value for its current target with one torch.take.
        n_points = U + A + 1
        self._rally_col = U + A
        # A mover stops APPROACH_SLACK inside its reach (so that float rounding cannot leave it a
        # hair out of range). Points get reach = APPROACH_SLACK: a unit stops exactly on its move
        # goal, never past it.
        reach = torch.full((U, n_points), APPROACH_SLACK)
        raw = torch.zeros(U, n_points)
        eff = torch.zeros(U, n_points)
        heal = torch.zeros(U, n_points)
        can_hit = torch.zeros(U, U, dtype=torch.bool)
        for a, sa in enumerate(stats):
            team_a = a < A
            for t, st in enumerate(stats):
                reach[a, t] = sa["range"] + sa["radius"] + st["radius"]
                can_hit[a, t] = (
                    (t < A) != team_a and sa["damage"] > 0 and (sa["hits_air"] or not st["air"])
                )
                if can_hit[a, t]:
                    per_hit = (
                        sa["damage"]
                        + sa["bonus_armoured"] * st["armoured"]
                        + sa["bonus_light"] * st["light"]
                    )
                    raw[a, t] = sa["hits"] * per_hit
                    # Armour reduces every hit, down to 0.5 (SC2's minimum damage).
                    eff[a, t] = sa["hits"] * max(per_hit - st["armour"], 0.5)
                if (t < A) == team_a and sa["heal_rate"] > 0 and st["heal_rate"] == 0:
                    heal[a, t] = sa["heal_rate"] * DT
        self._reach = reach.to(dev).flatten()
        # Agent i may attack enemy j (a ground-only weapon cannot target an air unit); as an
        # additive penalty for the closest-enemy search of idle agents. Tables that are
        # all-permissive (no air units, every unit armed) are None: the step skips them.
        self._agent_can_hit = can_hit[:A, A:].to(dev) if not can_hit[:A, A:].all() else None
        self._agent_no_hit_pen = (
            None if self._agent_can_hit is None else (~self._agent_can_hit).float() * _BIG
        )
        # Enemy j's preference penalty for ally i (E, A): cannot hit it at all, or it is not a
        # threat (cannot hit j).
        pen = torch.where(
            ~can_hit[A:, :A], _BIG, (~can_hit[:A, A:]).T.to(torch.float32) * _NOT_A_THREAT
        )
        self._enemy_target_pen = pen.to(dev) if pen.any() else None
        # Area weapons (colossus, baneling) deal all their damage through the splash tables below,
        # which include the target itself: their rows of the single-target tables are zero.
        splash_units = [u for u, su in enumerate(stats) if su["splash"] > 0]
        self.has_splash = bool(splash_units)
        if self.has_splash:
            self._splash_idx = torch.tensor(splash_units, device=dev)  # (S,)
            # Victims: the opponents the weapon can hit and that are on the ground; a victim is hit
            # when its edge is within the splash radius of the centre.
            victim = can_hit[splash_units] & ~torch.tensor([su["air"] for su in stats])
            self._splash_raw = (raw[splash_units, :U] * victim).to(dev)  # (S, U)
            self._splash_eff = (eff[splash_units, :U] * victim).to(dev)
            radii = torch.tensor([su["radius"] for su in stats])
            self._splash_reach2 = (
                (torch.tensor([stats[u]["splash"] for u in splash_units])[:, None] + radii) ** 2
            ).to(dev)
            self._splash_at_self = torch.tensor(
                [stats[u]["splash_at"] == "self" for u in splash_units], device=dev
            )
            self._suicide = torch.tensor([stats[u]["suicide"] for u in splash_units], device=dev)
            raw[splash_units] = 0.0
            eff[splash_units] = 0.0
        self._raw = raw.to(dev).flatten()
        self._eff = eff.to(dev).flatten()
        self._heal = heal.to(dev).flatten()
        self._pair_base = (torch.arange(U, device=dev) * n_points).unsqueeze(0)
        self._goal_idx = torch.arange(U, U + A, device=dev).unsqueeze(0)

        # Action decoding tables.
        na = self.n_actions
        self._act_dx = torch.tensor(list(_MOVE_DX) + [0.0] * E, **f32)
        self._act_dy = torch.tensor(list(_MOVE_DY) + [0.0] * E, **f32)
        self._act_is_move = torch.tensor(
            [2 <= k <= 5 for k in range(na)], dtype=torch.bool, device=dev
        )
        # Attack slot j of a non-healer agent is enemy j (unit A + j); of a medivac it is ally j
        # (unit j).
        self._slot_offset = torch.tensor([0 if h else A for h in is_healer[:A]], device=dev)
        self._slot_limit = torch.tensor([A if h else E for h in is_healer[:A]], device=dev)
        self._agent_healer = self.is_healer[:A]
        self._heal_target_ok = torch.tensor(
            [not h for h in is_healer[:A]], dtype=torch.bool, device=dev
        )

        # Type one-hot (U, tb) and observation / state column indices.
        onehot = torch.zeros(U, max(tb, 1))
        if tb:
            for u, t in enumerate(self.unit_types):
                if t in type_order:
                    onehot[u, type_order.index(t)] = 1.0
        self._type_onehot = onehot[:, :tb].to(dev)
        nfv = 6 + tb  # per unit in an agent's view: col0, dist, dx, dy, health, shield, types
        self._view_unit_feats = nfv
        en_cols = [0, 1, 2, 3, 4] + ([5] if self.shield_bits_enemy else []) + list(range(6, 6 + tb))
        al_cols = [0, 1, 2, 3, 4] + ([5] if self.shield_bits_ally else []) + list(range(6, 6 + tb))
        own_cols = [4] + ([5] if self.shield_bits_ally else []) + list(range(6, 6 + tb))
        rows = []
        for i in range(A):
            idx = [0, 1, 2, 3]
            for e in range(E):
                idx += [4 + (A + e) * nfv + c for c in en_cols]
            for j in range(A):
                if j != i:
                    idx += [4 + j * nfv + c for c in al_cols]
            idx += [4 + i * nfv + c for c in own_cols]
            rows.append(idx)
        self._obs_idx = torch.tensor(rows, device=dev)
        self.obs_dim = len(rows[0])
        self.obs_enemy_feats = len(en_cols)
        self.obs_ally_feats = len(al_cols)
        self.obs_own_feats = len(own_cols)
        nfs = 5 + tb  # per unit in the state: health, cooldown/energy, rel x, rel y, shield, types
        self._state_unit_feats = nfs
        st_al = [0, 1, 2, 3] + ([4] if self.shield_bits_ally else []) + list(range(5, 5 + tb))
        st_en = [0, 2, 3] + ([4] if self.shield_bits_enemy else []) + list(range(5, 5 + tb))
        sidx = [u * nfs + c for u in range(A) for c in st_al] + [
            u * nfs + c for u in range(A, U) for c in st_en
        ]
        self._state_idx = torch.tensor(sidx, device=dev)
        self.state_dim = len(sidx) + (A * na if state_last_action else 0)
        self.state_ally_feats = len(st_al)
        self.state_enemy_feats = len(st_en)

        # Reward scale exactly as SMAC: max_reward = n_enemies * death_value + win + sum of enemy hp
        # + shields.
        self.max_reward = (
            E * self.reward_death_value
            + self.reward_win
            + float((self.max_hp + self.max_sh)[A:].sum())
        )
        self.reward_scale = (reward_scale_rate / self.max_reward) if reward_scale else 1.0

        # Start formation (before jitter): allies on the left facing east, enemies mirrored on the
        # right.
        self._x0, self._y0 = self._formation(spec)

        # Enemies pursue, as SC2's attack-moving units do: they keep a target that left their
        # weapon range while it is within ACQUIRE_RANGE. A map entry with pursue=False makes them
        # drop it and acquire the closest ally instead.
        self.pursue = bool(spec.get("pursue", True))
        # A unit that cannot move (a spine crawler) cannot follow a target: like SC2's static
        # defence it turns to one in range when its target leaves it. None when every enemy moves.
        mobile_e = torch.tensor([s["speed"] > 0 for s in stats[A:]], device=dev)
        self._enemy_mobile = None if bool(mobile_e.all()) else mobile_e
        # Ground collisions (maps with collide=True): pairs closer than the sum of their radii are
        # pushed apart.
        self.collide = bool(spec.get("collide", False))
        if self.collide:
            rad = torch.tensor([su["radius"] if su["collides"] else 0.0 for su in stats])
            both = torch.tensor([su["collides"] for su in stats])
            min_gap = (rad[:, None] + rad[None, :]) * (both[:, None] & both[None, :])
            self._min_gap = min_gap.fill_diagonal_(0.0).to(dev)  # (U, U)

        # Per-battle state. Points (N, n_points): the units' positions (views x, y: (N, U)), then
        # the agents' move goals, then the enemies' attack-move point; point_alive is 1/0 for units
        # and stays 1 for the other points.
        self.point_x = torch.zeros(N, n_points, **f32)
        self.point_y = torch.zeros(N, n_points, **f32)
        self.x = self.point_x[:, :U]
        self.y = self.point_y[:, :U]
        self.point_alive = torch.ones(N, n_points, **f32)
        self.alive = self.point_alive[:, :U]
        # The enemies' single attack-move order goes to the allies' start (the centre of their
        # formation).
        self.point_x[:, self._rally_col] = self._x0[:A].mean()
        self.point_y[:, self._rally_col] = self._y0[:A].mean()
        # column in point_x
        self.enemy_target = torch.full((N, E), self._rally_col, dtype=torch.long, device=dev)
        self._enemy_in_range = torch.zeros(N, E, dtype=torch.bool, device=dev)
        self.hp = torch.zeros(N, U, **f32)
        self.sh = torch.zeros(N, U, **f32)
        self.cd = torch.zeros(N, U, **f32)
        self.energy = torch.zeros(N, U, **f32)
        self.since_dmg = torch.zeros(N, U, **f32)
        # (N, S) a suicide unit (baneling) killed last loop, which bursts this loop.
        self.burst_pending = torch.zeros(N, len(splash_units), dtype=torch.bool, device=dev)
        self.last_action = torch.zeros(N, A, dtype=torch.long, device=dev)
        self.has_last_action = torch.zeros(N, 1, **f32)
        self.steps = torch.zeros(N, dtype=torch.long, device=dev)
        self.ep_return = torch.zeros(N, **f32)
        self.episode_idx = torch.zeros(N, dtype=torch.long, device=dev)
        self.battle_ids = torch.arange(env_id_offset, env_id_offset + N, device=dev)
        self._was_reset = False
        self._set_seed(seed)

    # ------------------------------------------------------------------ setup helpers
    def _formation(self, spec):
        xs = []
        ys = []
        for side, groups in ((0, spec["agents"]), (1, spec["enemies"])):
            names = expand_units(groups)
            n = len(names)
            spacing = 2 * max(unit_stats(t)["radius"] for t in names) + 0.25
            rows = max(1, min(n, max(3, math.ceil(math.sqrt(2 * n)))))
            front = self.map_w / 2 + (spec["gap"] / 2) * (1 if side else -1)
            for k in range(n):
                c, r = divmod(k, rows)
                in_col = min(rows, n - c * rows)
                xs.append(front + (c * spacing if side else -c * spacing))
                ys.append(self.map_h / 2 + (r - (in_col - 1) / 2) * spacing)
        return (
            torch.tensor(xs, dtype=torch.float32, device=self.device),
            torch.tensor(ys, dtype=torch.float32, device=self.device),
        )

    def _set_seed(self, seed):
        # No seed: draw one from the OS, so that unseeded environments differ (as gymnasium /
        # PettingZoo envs do).
        self.seed = secrets.randbits(31) if seed is None else int(seed)
        self._seed_key = _mix(torch.tensor(self.seed & _M31, device=self.device) ^ 0x1234567)
        # < 2**31 / 2 * U ok
        self._elem = torch.arange(2 * self.n_units, device=self.device) * 0x9E3779B

    def _start_positions(self):
        """Jittered start positions (N, U) for each battle's current episode index."""
        key = _mix(_mix(self._seed_key ^ self.battle_ids) + self.episode_idx)  # (N,)
        h = _mix((key.unsqueeze(1) ^ (self._elem & _M31)) & _M31)  # (N, 2U)
        u = h.to(torch.float32) * (1.0 / _M31) - 0.5  # uniform in [-0.5, 0.5)
        j = 2 * self.jitter
        U = self.n_units
        return self._x0 + j * u[:, :U], self._y0 + j * u[:, U:]

    # ------------------------------------------------------------------ API
    def reset(self, seed=None):
        """Reset every battle; returns obs, state, avail."""
        if seed is not None:
            self._set_seed(seed)
            self.episode_idx.zero_()
        elif self._was_reset:
            self.episode_idx += 1  # a plain reset starts the next episode of every battle's stream
        self._was_reset = True
        x0, y0 = self._start_positions()
        self.x.copy_(x0)
        self.y.copy_(y0)
        self.hp.copy_(self.max_hp.expand_as(self.hp))
        self.sh.copy_(self.max_sh.expand_as(self.sh))
        self.cd.zero_()
        self.energy.copy_(self.energy_start.expand_as(self.energy))
        self.since_dmg.fill_(SHIELD_REGEN_DELAY)
        self.burst_pending.zero_()
        self.alive.fill_(1.0)
        self.enemy_target.fill_(self._rally_col)
        self.last_action.zero_()
        self.has_last_action.zero_()
        self.steps.zero_()
        self.ep_return.zero_()
        return self._observe()

    def step(self, actions):
        A = self.n_agents
        U = self.n_units
        actions = actions.to(self.device, torch.long)
        alive_a = self.alive[:, :A] > 0
        # SMAC's reward looks at the enemies' hp + shields before and after the step.
        prev_hs_e = self.hp[:, A:] + self.sh[:, A:]
        prev_alive_e = self.alive[:, A:].clone()
        prev_hs_a = self.hp[:, :A] + self.sh[:, :A]
        prev_alive_a = self.alive[:, :A].clone()

        # Decode orders. Invalid orders are not an error: an attack on a dead or missing target
        # becomes "stop", a move past the map edge stops at the edge, a dead agent does nothing.
        is_move = self._act_is_move[actions] & alive_a
        slot = actions - N_NO_ATTACK
        is_att = (slot >= 0) & (slot < self._slot_limit) & alive_a
        ordered = torch.where(is_att, slot.clamp(min=0) + self._slot_offset, 0)
        # (N, A) column in point_x each agent heads for
        ordered = torch.where(is_move, self._goal_idx, ordered)
        idle = ~(is_move | is_att)  # (N, A)
        self.point_x[:, U : U + A] = (self.x[:, :A] + MOVE_AMOUNT * self._act_dx[actions]).clamp(
            0.0, self.map_w
        )
        self.point_y[:, U : U + A] = (self.y[:, :A] + MOVE_AMOUNT * self._act_dy[actions]).clamp(
            0.0, self.map_h
        )
        fire_ok_a = ~is_move
        chase_e = torch.ones_like(self.enemy_target, dtype=torch.bool)
        heal_tgt_e = self._enemy_heal_targets() if self.has_enemy_healer else None

        for k in range(STEP_MUL):
            if k % RETARGET_EVERY == 0:
                closest_enemy, fire_ok_e = self._retarget(heal_tgt_e)
                fire_ok = torch.cat([fire_ok_a, fire_ok_e], 1)
            self._subtick(ordered, idle, fire_ok, chase_e, closest_enemy, self.enemy_target)

        # Outcome.
        alive_e = self.alive[:, A:]
        hs_e = self.hp[:, A:] + self.sh[:, A:]
        delta_enemy = ((prev_hs_e - hs_e) * prev_alive_e).sum(1)
        deaths_e = (prev_alive_e - alive_e).sum(1)
        delta_deaths = self.reward_death_value * deaths_e
        n_att_a = (self.alive[:, :A] * self.attacker_a).sum(1)
        n_att_e = (alive_e * self.attacker_e).sum(1)
        won = (n_att_a > 0) & (n_att_e == 0)
        lost = (n_att_a == 0) & (n_att_e > 0)
        draw = (n_att_a == 0) & (n_att_e == 0)
        if self.reward_only_positive:
            reward = (delta_enemy + delta_deaths).abs()
        else:
            alive_a_now = self.alive[:, :A]
            hs_a = self.hp[:, :A] + self.sh[:, :A]
            delta_ally = self.reward_negative_scale * ((prev_hs_a - hs_a) * prev_alive_a).sum(1)
            deaths_a = (prev_alive_a - alive_a_now).sum(1)
            reward = (
                delta_enemy
                + delta_deaths
                - delta_ally
                - self.reward_death_value * self.reward_negative_scale * deaths_a
            )
        # As SMAC: the win bonus and the defeat value are added after the positive-only abs(), in
        # both modes.
        reward = (reward + self.reward_win * won + self.reward_defeat * lost) * self.reward_scale

        self.steps += 1
        self.ep_return += reward
        terminated = won | lost | draw
        truncated = (self.steps >= self.episode_limit) & ~terminated
        done = terminated | truncated
        self.last_action.copy_(actions)
        self.has_last_action.fill_(1.0)
        info = {
            "won": won,
            "terminated": terminated,
            "truncated": truncated,
            "episode_return": self.ep_return.clone(),
            "episode_length": self.steps.clone(),
        }
        if self.return_final:
            info["final_obs"], info["final_state"], info["final_avail"] = self._observe()
        if self.auto_reset:
            self._reset_where(done)
        obs, state, avail = self._observe()
        return obs, state, avail, reward, done, info

    # ------------------------------------------------------------------ simulation
    def _enemy_heal_targets(self):
        """Enemy medivacs heal the teammate (not a medivac) with the lowest health fraction."""
        A = self.n_agents
        frac = (
            self.hp[:, A:] / self.max_hp[A:]
            + (1 - self.alive[:, A:]) * _BIG
            + self.is_healer[A:] * _BIG
        )
        return frac.argmin(1, keepdim=True) + A

    def _retarget(self, heal_tgt_e):
        """Targets, re-evaluated every RETARGET_EVERY game loops (a reaction time of 0.18 s;
        small-dim argmin is too costly to run every loop).

        Agents without a live order (stop, or their target died) fire at the closest enemy they can
        hit in range. Enemies follow SC2-like auto-targeting under their one attack-move order: keep
        the current target while it lives and is within ACQUIRE_RANGE (within weapon range only,
        on a map with pursue=False or for a unit that cannot move); otherwise acquire the closest
        ally within ACQUIRE_RANGE that they can hit, preferring allies that can shoot back; with
        none, walk on to the attack-move point (the allies' start). Enemy medivacs heal their most
        damaged teammate. Updates self.enemy_target; returns the closest enemy of every agent
        (N, A) and whether each enemy may fire (N, E): not while heading for the point."""
        A = self.n_agents
        x = self.x
        y = self.y
        alive = self.alive
        dx = x[:, None, A:] - x[:, :A, None]
        dy = y[:, None, A:] - y[:, :A, None]
        dist2 = dx * dx + dy * dy  # (N, A, E)
        pen = (1.0 - alive) * _BIG
        d2 = dist2 + pen[:, :A, None] + pen[:, None, A:]  # (N, A, E), dead pairs pushed out
        agent_score = d2 if self._agent_no_hit_pen is None else d2 + self._agent_no_hit_pen
        closest_enemy = agent_score.argmin(2) + A  # (N, A) unit index
        # (N, E, A)
        score = (d2 + (dist2 > ACQUIRE_RANGE**2) * _OUT_OF_SIGHT).transpose(1, 2).contiguous()
        if self._enemy_target_pen is not None:
            score += self._enemy_target_pen
        # (N, E); a min over a strided dim is ~5x slower, hence the contiguous
        best, closest_a = score.min(2)
        acquired = torch.where(best < _OUT_OF_SIGHT, closest_a, self._rally_col)  # (N, E)
        cur = self.enemy_target  # (N, E)
        # In range in the last game loop (set by _subtick) and still alive: keep it.
        keep = self._enemy_in_range
        if self.pursue:  # or within ACQUIRE_RANGE of it
            # (N, E)
            d2_cur = dist2.transpose(1, 2).gather(2, cur.clamp(max=A - 1).unsqueeze(2)).squeeze(2)
            follow = d2_cur <= ACQUIRE_RANGE**2
            if self._enemy_mobile is not None:
                follow = follow & self._enemy_mobile
            keep = keep | follow
        keep = keep & (cur < A) & (self.point_alive.gather(1, cur) > 0)
        target = torch.where(keep, cur, acquired)
        if heal_tgt_e is not None:
            target = torch.where(self.is_healer[A:], heal_tgt_e, target)
        self.enemy_target.copy_(target)
        return closest_enemy, target != self._rally_col

    def _subtick(self, ordered, idle, fire_ok, chase_e, closest_enemy, target_e):
        """One game loop. ordered (N, A): the column each agent was ordered to (enemy, ally for a
        medivac, or its move goal); idle (N, A): stop / no-op / invalid order; fire_ok (N, U);
        chase_e (N, E); closest_enemy (N, A) and target_e (N, E) from _retarget."""
        U = self.n_units
        x = self.x
        y = self.y
        alive = self.alive
        # (N, A): no live order -> act as stopped
        auto = idle | (self.point_alive.gather(1, ordered) == 0)
        # (N, U) column in point_x
        target = torch.cat([torch.where(auto, closest_enemy, ordered), target_e], 1)
        chase = torch.cat([~auto, chase_e], 1)  # (N, U) walks toward its target when out of range

        to_x = self.point_x.gather(1, target) - x  # (N, U) vector to the target
        to_y = self.point_y.gather(1, target) - y
        target_alive = self.point_alive.gather(1, target)  # (N, U)
        dist = torch.sqrt(to_x * to_x + to_y * to_y)  # (N, U) centre distance to the target
        # (N, U) index into the flattened (U, n_points) pair tables
        pair_idx = target + self._pair_base
        reach = torch.take(self._reach, pair_idx)
        in_range = dist <= reach + 2 * APPROACH_SLACK
        active = (alive * target_alive) > 0
        # Move (toward the target until in range, or onto the goal); units in range stand and fire.
        mv = (chase & ~in_range & active).to(x.dtype)
        step = (
            torch.minimum(self.speed_dt, dist - reach + APPROACH_SLACK) * mv / dist.clamp(min=1e-6)
        )
        x.add_(to_x * step)
        y.add_(to_y * step)
        if self.collide:
            self._separate()
        # (N, E), for _retarget's keep-the-target rule
        self._enemy_in_range = in_range[:, self.n_agents :]
        # (N, U) shoots this loop
        fire = fire_ok & in_range & active & (self.cd <= 1e-4) & (self.energy > 0)
        fire_f = fire.to(x.dtype)
        # Damage: every hit is reduced by the target's armour (per hit, min 0.5); shields absorb
        # first.
        # (N, U) damage each unit deals, before armour
        raw = torch.take(self._raw, pair_idx) * fire_f
        eff = torch.take(self._eff, pair_idx) * fire_f  # (N, U) the same after the target's armour
        zeros = torch.zeros_like(self.point_x)
        # (N, U) damage each unit takes, before armour
        damage_taken = zeros.scatter_add(1, target, raw)[:, :U]
        # (N, U) after armour: what reaches hp unshielded
        hp_damage = zeros.scatter_add(1, target, eff)[:, :U]
        if self.has_splash:
            burst = self._splash(fire, target, damage_taken, hp_damage)
        if self.has_shields:
            absorbed = torch.minimum(self.sh, damage_taken)
            self.sh.sub_(absorbed)
            hp_damage = hp_damage * (1.0 - absorbed / damage_taken.clamp(min=1e-6))
        self.hp.sub_(hp_damage).clamp_(min=0.0)
        if self.has_healer:
            heal = torch.take(self._heal, pair_idx) * fire_f
            healing = zeros.scatter_add(1, target, heal)[:, :U]  # (N, U) hp each unit receives
            torch.minimum(self.hp + healing * (self.hp > 0), self.max_hp, out=self.hp)
            self.energy.sub_(heal * self.energy_per_hp).add_(self.energy_regen_dt)
            torch.minimum(self.energy, self.energy_max, out=self.energy)
        if self.has_shields:
            # Shields regenerate once a unit has gone SHIELD_REGEN_DELAY without taking damage (SC2:
            # 2 per game second after 10 game seconds).
            self.since_dmg.add_(DT).masked_fill_(damage_taken > 0, 0.0)
            regen = (self.since_dmg >= SHIELD_REGEN_DELAY).to(x.dtype) * (SHIELD_REGEN_RATE * DT)
            torch.minimum(self.sh + regen, self.max_sh, out=self.sh)
        # The cooldown runs down in the loop of the shot too. A weapon that fires in the first loop
        # it is ready keeps the fraction of a loop it waited (cd in (-DT, 0]), so the mean period is
        # the cooldown itself (marine 13.77 loops), not a whole loop longer; one that waited longer
        # for a target starts afresh.
        carry = torch.where(self.cd > -DT, self.cd, 0.0)
        self.cd.copy_(torch.where(fire, self.cd_max + carry, self.cd) - DT)
        if self.has_splash:
            # A baneling dies by bursting; one killed by damage bursts in the next loop (where it
            # died).
            sidx = self._splash_idx
            was_alive = alive[:, sidx] > 0
            self.hp[:, sidx] = torch.where(burst & self._suicide, 0.0, self.hp[:, sidx])
            self.burst_pending.copy_(was_alive & (self.hp[:, sidx] <= 0) & ~burst & self._suicide)
        alive.copy_(self.hp > 0)
        if self.has_shields:
            self.sh.mul_(alive)

    def _separate(self):
        """Push overlapping living ground units apart, each by half the overlap (one relaxation pass
        per loop), so that a swarm surrounds its target instead of stacking on one spot."""
        x = self.x
        y = self.y
        alive = self.alive
        dx = x[:, :, None] - x[:, None, :]  # (N, U, U)
        dy = y[:, :, None] - y[:, None, :]
        d = torch.sqrt(dx * dx + dy * dy).clamp(min=1e-4)
        # (N, U, U)
        overlap = (self._min_gap - d).clamp(min=0.0) * (alive[:, :, None] * alive[:, None, :])
        push = overlap * (0.5 / d)
        x.add_((push * dx).sum(2)).clamp_(0.0, self.map_w)
        y.add_((push * dy).sum(2)).clamp_(0.0, self.map_h)

    def _splash(self, fire, target, damage_taken, hp_damage):
        """Add the area damage of this loop to damage_taken and hp_damage (N, U, in place). The
        centre is the target (colossus) or the attacker (baneling, which also bursts the loop after
        it is killed). Returns the area weapons that went off (N, S)."""
        sidx = self._splash_idx
        burst = fire[:, sidx] | self.burst_pending  # (N, S)
        # (N, S)
        cx = torch.where(
            self._splash_at_self, self.x[:, sidx], self.point_x.gather(1, target[:, sidx])
        )
        cy = torch.where(
            self._splash_at_self, self.y[:, sidx], self.point_y.gather(1, target[:, sidx])
        )
        dx = self.x[:, None, :] - cx[:, :, None]  # (N, S, U)
        dy = self.y[:, None, :] - cy[:, :, None]
        hit = ((dx * dx + dy * dy) <= self._splash_reach2) & burst[:, :, None]  # (N, S, U)
        hit = hit.to(dx.dtype)
        damage_taken.add_((hit * self._splash_raw).sum(1))
        hp_damage.add_((hit * self._splash_eff).sum(1))
        return burst

    def _reset_where(self, done):
        d = done.unsqueeze(1)
        self.episode_idx += done
        x0, y0 = self._start_positions()
        self.x.copy_(torch.where(d, x0, self.x))
        self.y.copy_(torch.where(d, y0, self.y))
        self.hp.copy_(torch.where(d, self.max_hp, self.hp))
        self.sh.copy_(torch.where(d, self.max_sh, self.sh))
        self.cd.masked_fill_(d, 0.0)
        self.energy.copy_(torch.where(d, self.energy_start, self.energy))
        self.since_dmg.masked_fill_(d, SHIELD_REGEN_DELAY)
        self.burst_pending.masked_fill_(d, False)
        self.alive.masked_fill_(d, 1.0)
        self.enemy_target.masked_fill_(d, self._rally_col)
        self.last_action.masked_fill_(d, 0)
        self.has_last_action.masked_fill_(d, 0.0)
        self.steps.masked_fill_(done, 0)
        self.ep_return.masked_fill_(done, 0.0)

    # ------------------------------------------------------------------ observations
    def _observe(self):
        A = self.n_agents
        E = self.n_enemies
        U = self.n_units
        N = self.num_envs
        x = self.x
        y = self.y
        alive = self.alive
        xa = x[:, :A]
        ya = y[:, :A]
        alive_a = alive[:, :A]
        dx = x[:, None, :] - xa[:, :, None]  # (N, A, U)
        dy = y[:, None, :] - ya[:, :, None]
        dist = torch.sqrt(dx * dx + dy * dy)
        pair_alive = alive[:, None, :] * alive_a[:, :, None]
        vis = (dist < SIGHT_RANGE) * pair_alive  # (N, A, U) agent sees unit
        in_shoot = (dist <= SHOOT_RANGE) * pair_alive  # (N, A, U)

        # Available actions: 0 no-op (dead only), 1 stop, 2-5 move N/S/E/W (stay inside the map),
        # 6.. attack.
        att = in_shoot[:, :, A:]  # (N, A, E) attack action available
        if self._agent_can_hit is not None:
            att = att * self._agent_can_hit
        if self.has_agent_healer:
            heal = in_shoot[:, :, :A] * self._heal_target_ok
            if A < E:
                heal = torch.cat([heal, heal.new_zeros(N, A, E - A)], 2)
            att = torch.where(self._agent_healer[:, None], heal[:, :, :E], att)
        avail = torch.cat(
            [
                1.0 - alive_a[:, :, None],
                alive_a[:, :, None],
                ((ya + 1.0) < self.map_h).mul(alive_a)[:, :, None],
                ((ya - 1.0) > 0.0).mul(alive_a)[:, :, None],
                ((xa + 1.0) < self.map_w).mul(alive_a)[:, :, None],
                ((xa - 1.0) > 0.0).mul(alive_a)[:, :, None],
                att,
            ],
            2,
        )

        # Observation: per (agent, unit) [available/visible, dist, dx, dy, health, shield, type...]
        # then a gather that lays out SMAC's order: move feats, enemies, other allies, own feats.
        col0 = torch.cat([vis[:, :, :A], att * vis[:, :, A:]], 2)
        s = vis * (1.0 / SIGHT_RANGE)
        pair = torch.stack([col0, dist * s, dx * s, dy * s], 3)  # (N, A, U, 4)
        unit = [
            (self.hp / self.max_hp).unsqueeze(2),
            (self.sh / self.max_sh.clamp(min=1.0)).unsqueeze(2),
        ]
        if self.unit_type_bits:
            unit.append(self._type_onehot.expand(N, U, -1))
        unit = torch.cat(unit, 2)  # (N, U, 2 + tb)
        feats = torch.cat([pair, unit[:, None] * vis[..., None]], 3).reshape(
            N, A, U * self._view_unit_feats
        )
        buf = torch.cat([avail[:, :, 2:6], feats], 2)
        obs = buf.gather(2, self._obs_idx.expand(N, -1, -1))

        # Global state: allies [health, cooldown (energy for medivacs), rel x, rel y, shield, type],
        # enemies [health, rel x, rel y, shield, type], dead units zero; then the agents' last
        # actions one-hot.
        energy_frac = self.energy / self.energy_max
        # (N, U)
        cooldown_feat = torch.where(
            self.is_healer, energy_frac, self.cd.clamp(min=0) * self.cd_scale
        )
        st = [
            unit[:, :, :1],
            cooldown_feat.unsqueeze(2),
            ((x - self.map_w / 2) / self.map_w).unsqueeze(2),
            ((y - self.map_h / 2) / self.map_h).unsqueeze(2),
            unit[:, :, 1:],
        ]
        st = (torch.cat(st, 2) * alive[:, :, None]).reshape(N, U * self._state_unit_feats)
        state = st.index_select(1, self._state_idx)
        if self.state_last_action:
            la = (
                torch.nn.functional.one_hot(self.last_action, self.n_actions).to(state.dtype)
                * self.has_last_action[:, :, None]
            )
            state = torch.cat([state, la.reshape(N, -1)], 1)
        return obs, state, avail

    # ------------------------------------------------------------------ helpers
    def get_env_info(self):
        """SMAC's get_env_info() keys."""
        return dict(
            state_shape=self.state_dim,
            obs_shape=self.obs_dim,
            n_actions=self.n_actions,
            n_agents=self.n_agents,
            n_enemies=self.n_enemies,
            episode_limit=self.episode_limit,
        )

    def render(self, battle=0, size=None):
        """RGB frame (H, W, 3) uint8 of one battle."""
        from .render import render_frame

        return render_frame(self, battle, size)
