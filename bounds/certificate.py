"""Exact decision of a claimed Vertex-Softmax bound.

Claim (sense "upper"): c·softmax(s) <= V for all lower <= s <= upper. With y = e^{s - M}
(any shift M) this is the linear statement Σ_i (c_i - V) y_i <= 0 for all y in the box
[a, b] = [e^{l-M}, e^{u-M}], which holds iff S = Σ_i max((c_i - V) a_i, (c_i - V) b_i) <= 0
(docs/mathematics.md §1). Sense "lower" checks c·softmax(s) >= V as the upper claim for -c and -V.

Exactness: V is taken as an exact rational (int, float, Fraction, Decimal or str: never
through float()), every float input is an exact rational, and the choice a_i or b_i follows
the exact sign of d_i = c_i - V. Terms with the same exponent are merged exactly, so
S = Σ_x D_x e^{x - M} over distinct exponents x with rational D_x. S = 0 exactly iff every
D_x = 0 (the e^x for distinct rational x are linearly independent over the rationals,
Lindemann-Weierstrass); otherwise S is enclosed by mpmath interval arithmetic (outward
rounded at ``prec`` bits) and the precision is doubled until the enclosure excludes 0, up to
``max_prec``. Only then is the verdict "holds" or "refuted"; else it is "undecided".
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import mpmath
import torch

from softcert.bounds.box import coefficient_box


@dataclass(frozen=True)
class CertificateCheck:
    """Verdict on a claimed bound: ``status`` is "holds", "refuted" or "undecided".

    ``holds`` is True (proved), False (refuted) or None (undecided at ``max_prec`` bits; not
    a proof either way). ``witness`` is the vertex (scores) that maximises Σ (c_i - V) y_i;
    when the claim fails, c·softmax(witness) exceeds V (falls below V for "lower").
    ``slack`` is c·softmax(witness) - V (for "lower": V - c·softmax(witness)), rounded to
    float: <= 0 when the claim holds, > 0 when it is refuted. ``prec`` is the interval
    precision (bits) at which the verdict was reached.
    """

    holds: bool | None
    witness: torch.Tensor
    slack: float
    sense: str
    status: str = "holds"
    prec: int = 0
    method: str = ("exact: rational coefficients, exponent groups merged, outward mpmath "
                   "interval exp at rising precision")


def exact_rational(value, name: str = "value") -> Fraction:
    """``value`` as an exact rational: int, float (its binary value), Fraction, Decimal, str
    ("0.1", "1/10", "1e-5"), numpy scalars and one-element tensors. NaN and inf raise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected one number, got a tensor of shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a number, got a bool")
    if hasattr(value, "dtype") and hasattr(value, "item"):  # numpy scalar
        value = value.item()
    try:
        if isinstance(value, (numbers.Rational, Decimal, str)):
            return Fraction(value)
        if isinstance(value, numbers.Real):
            return Fraction(float(value))
    except (ValueError, OverflowError, ZeroDivisionError) as exc:
        raise ValueError(f"{name}: must be a finite number ({exc})") from None
    raise ValueError(f"{name}: expected a number, got {type(value).__name__}")


def _interval(q: Fraction):
    """An outward interval enclosing the rational q at the current iv precision."""
    iv = mpmath.iv
    return iv.mpf(q.numerator) / iv.mpf(q.denominator)


def check_certificate(c, lower, upper, value, sense: str = "upper", prec: int = 200,
                      max_prec: int = 12800) -> CertificateCheck:
    """Exactly decide c·softmax(s) <= value ("upper") or >= value ("lower") over a box.

    One row (1-D ``c``, ``lower``, ``upper``), n up to a few thousand. ``value`` is read as
    an exact rational (see ``exact_rational``). The interval precision starts at ``prec``
    bits and doubles up to ``max_prec``; a claim whose S is nonzero but smaller than that
    precision resolves is reported "undecided" (holds=None), never refuted.
    """
    if sense not in ("upper", "lower"):
        raise ValueError(f"sense: expected 'upper' or 'lower', got {sense!r}")
    if not (isinstance(prec, int) and isinstance(max_prec, int) and 53 <= prec <= max_prec):
        raise ValueError(f"prec, max_prec: expected integers 53 <= prec <= max_prec, "
                         f"got {prec!r}, {max_prec!r}")
    c, lo, hi = coefficient_box(c, lower, upper)
    if c.dim() != 1:
        raise ValueError(f"c: check_certificate takes one row (1-D), got shape {tuple(c.shape)}")
    sign = 1 if sense == "upper" else -1
    v = sign * exact_rational(value)
    witness = lo.clone()
    groups: dict[float, Fraction] = {}  # exponent -> exact Σ d_i over the entries choosing it
    weights: dict[float, int] = {}  # exponent -> count (for the slack's denominator)
    for i, (ci, li, ui) in enumerate(zip(c.tolist(), lo.tolist(), hi.tolist())):
        if ui == -math.inf:
            continue  # masked entry: no mass
        d = sign * Fraction(ci) - v
        x = ui if d > 0 else li
        if d > 0:
            witness[i] = hi[i]
        if x == -math.inf:
            continue  # y_i = 0 is allowed (d <= 0): the term is 0
        groups[x] = groups.get(x, Fraction(0)) + d
        weights[x] = weights.get(x, 0) + 1
    nonzero = {x: dd for x, dd in groups.items() if dd != 0}
    if not nonzero:
        return CertificateCheck(True, witness, 0.0, sense, "holds", 0)
    top = max(weights)  # shift: keeps the interval exponents moderate, not needed for sign
    iv = mpmath.iv
    old = iv.prec
    p = prec
    try:
        while True:
            iv.prec = p
            s_sum = iv.mpf(0)
            for x, dd in nonzero.items():
                s_sum += _interval(dd) * iv.exp(iv.mpf(x) - iv.mpf(top))
            if s_sum.b <= 0 or s_sum.a > 0 or p >= max_prec:
                break
            p = min(2 * p, max_prec)
        total = iv.mpf(0)
        for x, k in weights.items():
            total += k * iv.exp(iv.mpf(x) - iv.mpf(top))
        slack = float(mpmath.mpf(s_sum.mid) / mpmath.mpf(total.mid))
        if s_sum.b <= 0:
            return CertificateCheck(True, witness, min(slack, 0.0), sense, "holds", p)
        if s_sum.a > 0:
            return CertificateCheck(False, witness, max(slack, 5e-324), sense, "refuted", p)
        return CertificateCheck(None, witness, slack, sense, "undecided", p)
    finally:
        iv.prec = old
