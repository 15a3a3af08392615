"""Exact re-check of a Vertex-Softmax bound with rational arithmetic.

Claim (sense "upper"): c·softmax(s) <= V for all lower <= s <= upper. With y = e^{s - M}
(any shift M) this is the linear statement Σ_i (c_i - V) y_i <= 0 for all y in the box
[a, b] = [e^{l-M}, e^{u-M}], which holds iff Σ_i max((c_i - V) a_i, (c_i - V) b_i) <= 0.
a and b are enclosed outward by mpmath interval arithmetic, every float input is an exact
rational, and the sum is evaluated in ``fractions.Fraction``: the verdict is exact. Sense
"lower" checks c·softmax(s) >= V as the upper claim for -c and -V. Source: DESIGN.md §1.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import mpmath
import torch

from bounds.box import coefficient_box


@dataclass(frozen=True)
class CertificateCheck:
    """``holds``: the claim is proved (True) or refuted (False) exactly.

    ``witness`` is the vertex (scores) that maximises Σ (c_i - V) y_i; when the claim fails
    it is a point of the box where c·softmax(s) exceeds V (or falls below V for "lower").
    ``slack`` is c·softmax(witness) - V (for "lower": V - c·softmax(witness)), rounded to
    float; it is <= 0 exactly when the claim holds.
    """

    holds: bool
    witness: torch.Tensor
    slack: float
    sense: str
    method: str = "exact rational check of Σ(c_i - V) y_i <= 0 over an outward exp box"


def _fraction(x: mpmath.mpf) -> Fraction:
    man, exp = mpmath.mpf(x).man_exp
    return Fraction(int(man)) * (Fraction(2) ** int(exp)) if man else Fraction(0)


def check_certificate(c, lower, upper, value, sense: str = "upper", prec: int = 200):
    """Exactly decide c·softmax(s) <= value ("upper") or >= value ("lower") over a box.

    One row (1-D ``c``, ``lower``, ``upper``), n up to a few hundred.
    """
    if sense not in ("upper", "lower"):
        raise ValueError(f"sense: expected 'upper' or 'lower', got {sense!r}")
    c, lo, hi = coefficient_box(c, lower, upper)
    if c.dim() != 1:
        raise ValueError(f"c: check_certificate takes one row (1-D), got shape {tuple(c.shape)}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"value: must be finite, got {v!r}")
    sign = 1 if sense == "upper" else -1
    active = [i for i in range(c.shape[0]) if hi[i].item() != float("-inf")]
    top = max(hi[i].item() for i in active)
    worst = Fraction(0)
    total = Fraction(0)
    witness = lo.clone()
    bound_v = Fraction(sign * v)
    with mpmath.workprec(prec):
        for i in active:
            d = Fraction(sign * c[i].item()) - bound_v
            # outward enclosure of e^{l-M} (its lower end) and e^{u-M} (its upper end)
            lo_i = lo[i].item()
            a = Fraction(0) if lo_i == float("-inf") else _fraction(
                mpmath.iv.exp(mpmath.iv.mpf(lo_i) - top).a)
            b = _fraction(mpmath.iv.exp(mpmath.iv.mpf(hi[i].item()) - top).b)
            if d > 0:
                worst += d * b
                total += b
                witness[i] = hi[i]
            else:
                worst += d * a
                total += a
    slack = float(worst / total) if total else 0.0
    return CertificateCheck(holds=worst <= 0, witness=witness, slack=slack,
                            sense=sense)
