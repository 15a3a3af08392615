"""Baseline enclosures of c·softmax(s) over a score box, for comparison with Vertex-Softmax.

Each relaxation bounds c·softmax(s) over the same box; all are sound but looser than the
exact optimum. Forms as read in the sources (docs/mathematics.md §1):
- naive interval arithmetic: p_i in [e^{l_i}/Σ_j e^{u_j}, e^{u_i}/Σ_j e^{l_j}], then c·p;
- Shi et al. 2020 (Robustness Verification for Transformers): exp by tangent (at
  min((l+u)/2, l+0.99)) / chord, 1/x by tangent at the midpoint / chord, products e_i·r by
  bilinear planes, composed backwards and concretised over the box;
- Wei et al. 2023 (Convex Bounds on the Softmax Function): LSE and ER convex lower /
  concave upper bounds of each p_i, linearised by their tangent plane at the box centre
  (as auto_LiRPA does) and concretised over the box.
Scores are shifted by the row maximum of ``upper``, which changes none of the relaxations.
Baselines take finite boxes only. They carry no outward rounding: they are comparisons.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from softcert.bounds.box import coefficient_box
from softcert.bounds.interval import softmax_interval


@dataclass(frozen=True)
class BoxBounds:
    """lower <= min c·softmax(s), max c·softmax(s) <= upper over the box (per row)."""

    lower: torch.Tensor
    upper: torch.Tensor
    method: str


def _rows(c, lower, upper):
    c, lo, hi = coefficient_box(c, lower, upper, allow_masked=False)
    shift = hi.amax(dim=-1, keepdim=True)
    return c, lo - shift, hi - shift, c.shape[:-1]


def naive_interval(c, lower, upper) -> BoxBounds:
    """Interval arithmetic without the dependency between numerator and denominator."""
    c, lo, hi, _ = _rows(c, lower, upper)
    a, b = lo.exp(), hi.exp()
    p_lo = a / b.sum(-1, keepdim=True)
    p_hi = (b / a.sum(-1, keepdim=True)).clamp(max=1.0)
    up = torch.maximum(c * p_lo, c * p_hi).sum(-1)
    low = torch.minimum(c * p_lo, c * p_hi).sum(-1)
    return BoxBounds(low, up, "naive-interval")


def _exp_chord(lo, hi):
    """Slope and intercept of the chord of exp on [lo, hi] (tangent when lo == hi)."""
    a, b = lo.exp(), hi.exp()
    width = hi - lo
    slope = torch.where(width > 0, (b - a) / torch.where(width > 0, width, 1.0), a)
    return slope, a - slope * lo


def _shi_upper(c, lo, hi):
    """Upper bound of Σ c_i e_i r (e_i = e^{s_i}, r = 1/Σ e_j) by backward composition."""
    a, b = lo.exp(), hi.exp()
    s_lo, s_hi = a.sum(-1, keepdim=True), b.sum(-1, keepdim=True)
    r_lo, r_hi = 1 / s_hi, 1 / s_lo
    # products: x·y <= y_u x + x_l y - x_l y_u ; x·y >= y_l x + x_l y - x_l y_l  (x=e, y=r)
    pos = c >= 0
    alpha = torch.where(pos, c * r_hi, c * r_lo)
    beta = c * a
    const = torch.where(pos, -c * a * r_hi, -c * a * r_lo).sum(-1, keepdim=True)
    beta_sum = beta.sum(-1, keepdim=True)
    # r as a linear function of S = Σ e_j: chord above, tangent at the midpoint below
    s_mid = (s_lo + s_hi) / 2
    chord_k = -1 / (s_lo * s_hi)
    chord_b = 1 / s_lo - chord_k * s_lo
    tan_k = -1 / s_mid**2
    tan_b = 2 / s_mid
    k = torch.where(beta_sum >= 0, chord_k, tan_k)
    kb = torch.where(beta_sum >= 0, chord_b, tan_b)
    alpha = alpha + beta_sum * k
    const = const + beta_sum * kb
    # e_j as a linear function of s_j: chord above, tangent below
    ch_k, ch_b = _exp_chord(lo, hi)
    m = torch.minimum((lo + hi) / 2, lo + 0.99)
    tg_k = m.exp()
    tg_b = tg_k * (1 - m)
    slope = torch.where(alpha >= 0, alpha * ch_k, alpha * tg_k)
    inter = torch.where(alpha >= 0, alpha * ch_b, alpha * tg_b)
    linear_max = torch.maximum(slope * lo, slope * hi)
    return (linear_max + inter).sum(-1) + const.squeeze(-1)


def shi2020(c, lower, upper) -> BoxBounds:
    """Linear relaxation of Shi et al. 2020 (exp, reciprocal, bilinear products)."""
    c, lo, hi, _ = _rows(c, lower, upper)
    return BoxBounds(-_shi_upper(-c, lo, hi), _shi_upper(c, lo, hi), "shi2020")


def _tangent_upper(c, lo, hi, upper_fn, lower_fn):
    """max over the box of Σ_i c_i T_i(x), T_i the tangent plane at the centre of U_i
    (c_i >= 0, concave upper bound) or of L_i (c_i < 0, convex lower bound)."""
    x0 = ((lo + hi) / 2).detach().requires_grad_(True)
    with torch.enable_grad():
        f = torch.where(c >= 0, upper_fn(x0), lower_fn(x0))
        total = (c * f).sum()
        (grad,) = torch.autograd.grad(total, x0)
    val = (c * f.detach()).sum(-1)
    rad = (hi - lo) / 2
    return val + (grad.abs() * rad).sum(-1)


def _wei(c, lo, hi, kind):
    p = softmax_interval(lo, hi)
    p_lo, p_hi = p.lower, p.upper
    kappa, beta = _exp_chord(lo, hi)

    def lse_lower(x):
        return x.exp() / (kappa * x + beta).sum(-1, keepdim=True)

    def lse_upper(x):
        log_ratio = p_hi.log() - p_lo.log()
        same = log_ratio <= 0
        slope = torch.where(same, 0.0, (p_hi - p_lo) / torch.where(same, 1.0, log_ratio))
        icpt = torch.where(same, p_hi, p_lo - slope * p_lo.log())
        return icpt + slope * (x - torch.logsumexp(x, dim=-1, keepdim=True))

    def er_upper(x):
        z = (x.unsqueeze(-2) - x.unsqueeze(-1)).exp()  # z[i, j] = e^{x_j - x_i}
        z = z.sum(-1) - 1.0
        return p_lo + p_hi - p_lo * p_hi * (1 + z)

    # ER lower: chord of exp on [l_j - u_i, u_j - l_i] for the difference x_j - x_i
    d_lo = lo.unsqueeze(-2) - hi.unsqueeze(-1)
    d_hi = hi.unsqueeze(-2) - lo.unsqueeze(-1)
    k2, b2 = _exp_chord(d_lo, d_hi)
    eye = torch.eye(lo.shape[-1], dtype=torch.bool)

    def er_lower(x):
        diff = x.unsqueeze(-2) - x.unsqueeze(-1)
        terms = torch.where(eye, 0.0, k2 * diff + b2)
        return 1.0 / (1.0 + terms.sum(-1))

    if kind == "lse":
        return _tangent_upper(c, lo, hi, lse_upper, lse_lower)
    return _tangent_upper(c, lo, hi, er_upper, er_lower)


def wei2023_lse(c, lower, upper) -> BoxBounds:
    """Wei et al. 2023 LSE bounds (convex lower e^{x_i}/Σ chord, concave upper chord of exp
    in log p_i), tangent planes at the box centre."""
    c, lo, hi, _ = _rows(c, lower, upper)
    return BoxBounds(-_wei(-c, lo, hi, "lse"), _wei(c, lo, hi, "lse"), "wei2023-lse")


def wei2023_er(c, lower, upper) -> BoxBounds:
    """Wei et al. 2023 ER bounds (reciprocal form 1/(1+Σ e^{x_j-x_i})), tangent planes at
    the box centre. O(n^2) per row."""
    c, lo, hi, _ = _rows(c, lower, upper)
    return BoxBounds(-_wei(-c, lo, hi, "er"), _wei(c, lo, hi, "er"), "wei2023-er")


BASELINES = {
    "naive-interval": naive_interval,
    "shi2020": shi2020,
    "wei2023-lse": wei2023_lse,
    "wei2023-er": wei2023_er,
}
