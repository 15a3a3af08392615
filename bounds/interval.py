"""Elementwise enclosures of softmax over a score box (the case c = e_i of Vertex-Softmax).

p_i ranges over [e^{l_i} / (e^{l_i} + Σ_{j≠i} e^{u_j}),  e^{u_i} / (e^{u_i} + Σ_{j≠i} e^{l_j})],
both ends attained at vertices, so the interval is tight (docs/mathematics.md §1). Each end is
1 / (1 + X·e^{M-x}) with Σ_{j≠i} e^{y_j} = X·e^{M}, X >= 1 computed from a shifted sum;
rounding is bounded in the model of ``kernels.floating`` and applied outward.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from softcert.bounds.box import score_box
from softcert.kernels.floating import EXP_REL, U64, gamma


@dataclass(frozen=True)
class SoftmaxInterval:
    """Proved elementwise bounds lower_i <= softmax(s)_i <= upper_i over the box."""

    lower: torch.Tensor
    upper: torch.Tensor
    method: str = "exact-interval"
    assumptions: str = field(
        default="box lower <= s <= upper; float64, outward rounded; -inf upper = masked",
        repr=False,
    )


def _exclusive_logsum(y: torch.Tensor):
    """For each i: (M_i, X_i, rel_i) with Σ_{j≠i} e^{y_j} = X_i e^{M_i} (1 ± rel_i).

    X_i >= 1 whenever some j ≠ i has y_j > -inf (else X_i = 0): for i other than the
    row's argmax, M_i = max y and the argmax term contributes 1; for the argmax, M_i is the
    second largest value. The subtraction S - e_i loses at most a factor 2 in relative
    accuracy because S <= 2(S - e_i) when S - e_i >= 1 >= e_i.
    """
    n = y.shape[-1]
    top, arg = y.max(dim=-1, keepdim=True)
    top_f = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = (y - top_f).exp()
    total = e.sum(-1, keepdim=True)
    others = total - e
    # the argmax row entry: sum of the others with their own shift
    y_wo = y.scatter(-1, arg, float("-inf"))
    second = y_wo.amax(dim=-1, keepdim=True)
    second_f = torch.where(torch.isfinite(second), second, torch.zeros_like(second))
    x_arg = (y_wo - second_f).exp().sum(-1, keepdim=True)
    is_arg = torch.zeros_like(y, dtype=torch.bool).scatter(-1, arg, True)
    m = torch.where(is_arg, second_f.expand_as(y), top_f.expand_as(y))
    x = torch.where(is_arg, x_arg.expand_as(y), others)
    # spread of the shifted exponents that still matter (|y - M| <= 745 before underflow)
    spread = (top_f - y).clamp(max=745.0)
    spread = torch.where(torch.isfinite(spread), spread, torch.zeros_like(spread))
    rel = 2 * (gamma(n + 1) + EXP_REL + 3 * U64 + 1.01 * U64 * spread.amax(-1, keepdim=True))
    return m, x, rel.expand_as(y)


def _one_over_one_plus(m, x, rel_x, s):
    """1 / (1 + X e^{M - s}) with its relative error bound (s = the entry's own score)."""
    z = m - s  # may be +-inf for masked entries; handled by the caller
    r = x * z.exp()
    p = 1.0 / (1.0 + r)
    zabs = torch.where(torch.isfinite(z), z.abs(), torch.zeros_like(z))
    rel = 1.01 * (rel_x + EXP_REL + 1.01 * U64 * zabs + 4 * U64)
    return p, rel


def softmax_interval(lower, upper) -> SoftmaxInterval:
    """Tight elementwise bounds of softmax(s) over lower <= s <= upper (last axis)."""
    lo, hi = score_box(lower, upper)
    masked = torch.isneginf(hi)
    m_u, x_u, rel_u = _exclusive_logsum(hi)
    m_l, x_l, rel_l = _exclusive_logsum(lo)

    p_lo, r_lo = _one_over_one_plus(m_u, x_u, rel_u, lo)
    p_lo = torch.where(torch.isneginf(lo), 0.0, p_lo)
    p_lo = torch.where(x_u == 0, 1.0, p_lo)  # the only unmasked entry carries all the mass
    p_lo = p_lo * (1 - r_lo)
    p_lo = torch.where(p_lo < 2.0 ** -1000, torch.zeros_like(p_lo), p_lo)

    p_hi, r_hi = _one_over_one_plus(m_l, x_l, rel_l, hi)
    p_hi = torch.where(x_l == 0, 1.0, p_hi)  # every other entry can vanish
    # below the normal range (or when X e^{M-s} overflows) the relative model fails;
    # there the true value is <= 2^-1000 (1 + rel), so a flat floor is a sound upper bound
    p_hi = torch.where(p_hi < 2.0 ** -980, 2.0 ** -980, p_hi * (1 + r_hi)).clamp(max=1.0)

    zero = torch.zeros_like(p_lo)
    return SoftmaxInterval(
        lower=torch.where(masked, zero, p_lo.clamp(min=0.0)),
        upper=torch.where(masked, zero, p_hi),
    )
