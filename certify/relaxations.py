"""Sound relaxations of every nonlinear primitive, registered as data.

``UNARY[op](l, u, alpha)`` returns planes (lw, lb, uw, ub) with
lw·x + lb <= f(x) <= uw·x + ub for all x in [l, u] (elementwise). ``INTERVAL[op](l, u)`` is
the exact image interval (all functions here are monotone or convex). ``PRODUCT[op]`` is the
backward step through a two-input product using McCormick planes (Shi et al. 2020):
  x·y >= y_l x + x_l y - x_l y_l,   x·y <= y_u x + x_l y - x_l y_u.
Sources: CROWN (Zhang et al. 2018) for ReLU, exp, reciprocal; convex functions get a
tangent below and the chord above. Degenerate intervals use a secant slope that stays on
the safe side (see ``_chord``).
"""
from __future__ import annotations

import torch

from certify.operators import sum_rest

TINY_WIDTH = 1e-7


def _chord(f, fprime_lo, l, u):
    """Upper chord of a convex f on [l, u]; for tiny widths the line through (u, f(u)) with
    slope f'(l), which is above the convex f on [l, u] (f' is increasing)."""
    w = u - l
    wide = w > TINY_WIDTH
    fu, fl = f(u), f(l)
    slope = torch.where(wide, (fu - fl) / torch.where(wide, w, 1.0), fprime_lo)
    return slope, fu - slope * u


def relu_planes(l, u, alpha=None):
    l, u = torch.minimum(l, u), u
    active, dead = l >= 0, u <= 0
    cross = ~(active | dead)
    den = torch.where(cross, u - l, 1.0)
    uw = torch.where(active, 1.0, torch.where(cross, u / den, 0.0))
    ub = torch.where(cross, -u * l / den, 0.0)
    if alpha is None:
        alpha = (u > -l).to(l.dtype)
    lw = torch.where(active, 1.0, torch.where(cross, alpha.clamp(0, 1), 0.0))
    return lw, torch.zeros_like(l), uw, ub


def _tangent(f, fp, m):
    s = fp(m)
    return s, f(m) - s * m


def exp_planes(l, u, alpha=None):
    m = torch.minimum((l + u) / 2, l + 0.99)  # Shi et al.: keeps the tangent well conditioned
    lw, lb = _tangent(torch.exp, torch.exp, m)
    uw, ub = _chord(torch.exp, torch.exp(l), l, u)
    return lw, lb, uw, ub


def reciprocal_planes(l, u, alpha=None):
    # 1/x on x > 0 is convex decreasing
    if (l <= 0).any():
        raise ValueError("reciprocal: input interval must be positive")
    m = (l + u) / 2
    lw, lb = _tangent(lambda t: 1 / t, lambda t: -1 / t**2, m)
    uw, ub = _chord(lambda t: 1 / t, -1 / l**2, l, u)
    return lw, lb, uw, ub


def square_planes(l, u, alpha=None):
    m = (l + u) / 2
    lw, lb = _tangent(lambda t: t * t, lambda t: 2 * t, m)
    uw, ub = _chord(lambda t: t * t, 2 * l, l, u)
    return lw, lb, uw, ub


def rsqrt_planes(l, u, alpha=None):
    if (l <= 0).any():
        raise ValueError("rsqrt: input interval must be positive")
    m = (l + u) / 2
    lw, lb = _tangent(torch.rsqrt, lambda t: -0.5 * t**-1.5, m)
    uw, ub = _chord(torch.rsqrt, -0.5 * l**-1.5, l, u)
    return lw, lb, uw, ub


UNARY = {
    "relu": relu_planes,
    "exp": exp_planes,
    "reciprocal": reciprocal_planes,
    "square": square_planes,
    "rsqrt": rsqrt_planes,
}


def _square_interval(l, u):
    lo = torch.where((l <= 0) & (u >= 0), 0.0, torch.minimum(l * l, u * u))
    return lo, torch.maximum(l * l, u * u)


INTERVAL = {
    "relu": lambda l, u: (torch.relu(l), torch.relu(u)),
    "exp": lambda l, u: (torch.exp(l), torch.exp(u)),
    "reciprocal": lambda l, u: (1 / u, 1 / l),
    "square": _square_interval,
    "rsqrt": lambda l, u: (torch.rsqrt(u), torch.rsqrt(l)),
}


def _sum_to(t, shape):
    """Sum the broadcast dims of t (B, S, *bshape) down to (B, S, *shape)."""
    extra = t.dim() - 2 - len(shape)
    if extra:
        t = t.sum(dim=tuple(range(2, 2 + extra)))
    dims = tuple(i + 2 for i, s in enumerate(shape) if s == 1 and t.shape[i + 2] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def mccormick_mul(A, xb, yb, x_shape, y_shape):
    """Lower-bound step for z = x ⊙ y (broadcasting): returns ([A_x, A_y], bias)."""
    (xl, _), (yl, yu) = xb, yb
    xl, yl, yu = xl.unsqueeze(1), yl.unsqueeze(1), yu.unsqueeze(1)
    ap, an = A.clamp(min=0), A.clamp(max=0)
    ax = _sum_to(ap * yl + an * yu, x_shape)
    ay = _sum_to(A * xl, y_shape)
    bias = -sum_rest(ap * xl * yl + an * xl * yu)
    return [ax, ay], bias


def mccormick_matmul(A, xb, yb, x_shape, y_shape):
    """Lower-bound step for Z = X @ Y (X (.., n, k), Y (.., k, m)) with McCormick planes."""
    (xl, _), (yl, yu) = xb, yb
    xl, yl, yu = xl.unsqueeze(1), yl.unsqueeze(1), yu.unsqueeze(1)
    ap, an = A.clamp(min=0), A.clamp(max=0)
    ax = ap @ yl.transpose(-1, -2) + an @ yu.transpose(-1, -2)
    ay = xl.transpose(-1, -2) @ A
    bias = -sum_rest(ap * (xl @ yl) + an * (xl @ yu))
    return [ax, ay], bias


def interval_mul(xb, yb):
    (xl, xu), (yl, yu) = xb, yb
    c = torch.stack([xl * yl, xl * yu, xu * yl, xu * yu])
    c = torch.nan_to_num(c, nan=0.0, posinf=torch.inf, neginf=-torch.inf)  # 0·inf: the 0 factor wins
    return c.min(0).values, c.max(0).values


def interval_matmul(xb, yb):
    (xl, xu), (yl, yu) = xb, yb
    xc, xr = (xl + xu) / 2, (xu - xl) / 2
    yc, yr = (yl + yu) / 2, (yu - yl) / 2
    mid = xc @ yc
    rad = xr @ yc.abs() + xc.abs() @ yr + xr @ yr
    return mid - rad, mid + rad


PRODUCT = {"mul": mccormick_mul, "matmul": mccormick_matmul}
PRODUCT_INTERVAL = {"mul": interval_mul, "matmul": interval_matmul}
