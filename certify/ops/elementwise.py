"""Elementwise operators with their sound linear relaxations and exact image intervals.

``planes(l, u, alpha)`` returns (lw, lb, uw, ub) with lw·x + lb <= f(x) <= uw·x + ub for
all x in [l, u] (elementwise); ``image(l, u)`` is the exact image interval (every function
here is monotone or convex). Sources: CROWN (Zhang et al. 2018) for ReLU, exp and
reciprocal, as used for attention by Shi et al. 2020; a convex function gets a tangent
below and the chord above. Degenerate intervals use a secant slope that stays on the safe
side (see ``_chord``).
"""
from __future__ import annotations

import torch

from certify.ops.core import Elementwise, register

TINY_WIDTH = 1e-7


def _chord(f, fprime_lo, l, u):
    """Upper chord of a convex f on [l, u]; for tiny widths the line through (u, f(u)) with
    slope f'(l), which is above the convex f on [l, u] (f' is increasing)."""
    w = u - l
    wide = w > TINY_WIDTH
    fu, fl = f(u), f(l)
    slope = torch.where(wide, (fu - fl) / torch.where(wide, w, 1.0), fprime_lo)
    return slope, fu - slope * u


def _tangent(f, fp, m):
    s = fp(m)
    return s, f(m) - s * m


def relu_planes(l, u, alpha=None):
    """Upper: the chord on crossing intervals; lower: slope alpha in [0, 1] (default 1 if
    u > -l else 0, the CROWN choice)."""
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


def exp_planes(l, u, alpha=None):
    """Tangent at min((l+u)/2, l+0.99) below (Shi et al. 2020: well conditioned), chord above."""
    m = torch.minimum((l + u) / 2, l + 0.99)
    lw, lb = _tangent(torch.exp, torch.exp, m)
    uw, ub = _chord(torch.exp, torch.exp(l), l, u)
    return lw, lb, uw, ub


def reciprocal_planes(l, u, alpha=None):
    """1/x on x > 0 is convex decreasing: tangent at the midpoint below, chord above."""
    if (l <= 0).any():
        raise ValueError("reciprocal: input interval must be positive")
    m = (l + u) / 2
    lw, lb = _tangent(lambda t: 1 / t, lambda t: -1 / t**2, m)
    uw, ub = _chord(lambda t: 1 / t, -1 / l**2, l, u)
    return lw, lb, uw, ub


def square_planes(l, u, alpha=None):
    """x² is convex: tangent at the midpoint below, chord above."""
    m = (l + u) / 2
    lw, lb = _tangent(lambda t: t * t, lambda t: 2 * t, m)
    uw, ub = _chord(lambda t: t * t, 2 * l, l, u)
    return lw, lb, uw, ub


def rsqrt_planes(l, u, alpha=None):
    """x^(-1/2) on x > 0 is convex decreasing: tangent at the midpoint below, chord above."""
    if (l <= 0).any():
        raise ValueError("rsqrt: input interval must be positive")
    m = (l + u) / 2
    lw, lb = _tangent(torch.rsqrt, lambda t: -0.5 * t**-1.5, m)
    uw, ub = _chord(torch.rsqrt, -0.5 * l**-1.5, l, u)
    return lw, lb, uw, ub


def _square_image(l, u):
    lo = torch.where((l <= 0) & (u >= 0), 0.0, torch.minimum(l * l, u * u))
    return lo, torch.maximum(l * l, u * u)


register(Elementwise(name="relu", description="max(x, 0)", fn=torch.relu,
                     image=lambda l, u: (torch.relu(l), torch.relu(u)), planes=relu_planes,
                     monotone=True, convex=True, value_range=(0.0, None),
                     slope_init=lambda l, u: (u > -l).to(l.dtype)))
register(Elementwise(name="exp", description="exp(x)", fn=torch.exp,
                     image=lambda l, u: (torch.exp(l), torch.exp(u)), planes=exp_planes,
                     monotone=True, convex=True, value_range=(0.0, None)))
register(Elementwise(name="reciprocal", description="1/x on x > 0", fn=lambda t: 1.0 / t,
                     image=lambda l, u: (1 / u, 1 / l), planes=reciprocal_planes,
                     monotone=True, convex=True, domain=(0.0, None), value_range=(0.0, None)))
register(Elementwise(name="square", description="x²", fn=lambda t: t * t,
                     image=_square_image, planes=square_planes,
                     convex=True, value_range=(0.0, None)))
register(Elementwise(name="rsqrt", description="x^(-1/2) on x > 0", fn=torch.rsqrt,
                     image=lambda l, u: (torch.rsqrt(u), torch.rsqrt(l)), planes=rsqrt_planes,
                     monotone=True, convex=True, domain=(0.0, None), value_range=(0.0, None)))
