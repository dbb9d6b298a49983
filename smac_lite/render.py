"""Draw one battle as an RGB frame with plain numpy (no plotting library)."""

import numpy as np

_BG = (28, 34, 30)
_ALLY = (70, 150, 255)
_ENEMY = (235, 80, 60)
_HEALER = {True: (150, 210, 255), False: (255, 170, 150)}
_DEAD = (80, 80, 80)


def _disc(img, cx, cy, r, color):
    h, w, _ = img.shape
    x0 = max(int(cx - r - 1), 0)
    x1 = min(int(cx + r + 2), w)
    y0 = max(int(cy - r - 1), 0)
    y1 = min(int(cy + r + 2), h)
    if x0 >= x1 or y0 >= y1:
        return
    yy, xx = np.mgrid[y0:y1, x0:x1]
    m = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    img[y0:y1, x0:x1][m] = color


def _bar(img, cx, top, width, frac, color):
    h, w, _ = img.shape
    x0 = int(cx - width / 2)
    x1 = int(cx + width / 2)
    y0 = int(top)
    y1 = int(top) + 2
    if y0 < 0 or y1 > h:
        return
    x0 = max(x0, 0)
    x1 = min(x1, w)
    img[y0:y1, x0:x1] = (60, 20, 20)
    xf = x0 + int(round((x1 - x0) * float(frac)))
    img[y0:y1, x0:xf] = color


def render_frame(env, battle=0, size=None, px_per_unit=12):
    """RGB uint8 (H, W, 3) of one battle of a BatchedSMAC: allies blue, enemies red, medivacs pale,
    dead grey; circle size follows the unit radius; green bar = health, blue bar = shields."""
    if size is not None:
        px_per_unit = size / max(env.map_w, env.map_h)
    s = px_per_unit
    H = int(round(env.map_h * s))
    W = int(round(env.map_w * s))
    img = np.empty((H, W, 3), dtype=np.uint8)
    img[:] = _BG
    x = env.x[battle].detach().cpu().numpy()
    y = env.y[battle].detach().cpu().numpy()
    hp = env.hp[battle].detach().cpu().numpy()
    sh = env.sh[battle].detach().cpu().numpy()
    max_hp = env.max_hp.cpu().numpy()
    max_sh = env.max_sh.cpu().numpy()
    rad = env.radius.cpu().numpy()
    healer = env.is_healer.cpu().numpy()
    # draw the dead first, below the living
    order = sorted(range(env.n_units), key=lambda u: hp[u] > 0)
    for u in order:
        ally = u < env.n_agents
        cx = x[u] * s
        cy = H - y[u] * s
        r = max(rad[u] * s * 1.15, 3.0)
        if hp[u] <= 0:
            _disc(img, cx, cy, r * 0.5, _DEAD)
            continue
        color = _HEALER[ally] if healer[u] else (_ALLY if ally else _ENEMY)
        _disc(img, cx, cy, r + 1, (15, 15, 15))
        _disc(img, cx, cy, r, color)
        bw = max(2 * r, 10)
        _bar(img, cx, cy - r - 5, bw, hp[u] / max_hp[u], (60, 220, 60))
        if max_sh[u] > 0:
            _bar(img, cx, cy - r - 8, bw, sh[u] / max_sh[u], (80, 170, 255))
    return img
