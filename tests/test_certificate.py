"""Exact rational re-check of Vertex-Softmax bounds, cross-checked with z3 (LRA)."""
from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
import z3

import bounds


@pytest.mark.parametrize("n", [1, 2, 8, 32, 64])
def test_vertex_bounds_pass_and_tightened_bounds_fail(n):
    rng = np.random.default_rng(n)
    c = rng.normal(size=n)
    lo = rng.normal(size=n) * 5
    hi = lo + rng.random(size=n) * 2
    res = bounds.vertex_softmax(c, lo, hi)
    up = bounds.check_certificate(c, lo, hi, res.upper.item())
    low = bounds.check_certificate(c, lo, hi, res.lower.item(), sense="lower")
    assert up.holds and low.holds and up.slack <= 0 and low.slack <= 0
    # pushing either bound inwards by 1e-9 of the scale is refuted, with a witness vertex
    scale = max(1.0, abs(res.upper.item()), abs(res.lower.item()))
    bad_up = bounds.check_certificate(c, lo, hi, res.upper.item() - 1e-9 * scale)
    bad_low = bounds.check_certificate(c, lo, hi, res.lower.item() + 1e-9 * scale, sense="lower")
    assert not bad_up.holds and not bad_low.holds
    w = bad_up.witness.numpy()
    assert set(np.flatnonzero(w == hi)) | set(np.flatnonzero(w == lo)) == set(range(n))


def _real(x) -> z3.ArithRef:
    man, exp = mpmath.mpf(x).man_exp
    return z3.RealVal(str(Fraction(int(man)) * Fraction(2) ** int(exp)))


def test_z3_agrees_with_the_rational_check():
    """The same linear claim decided by z3 over the reals (y boxed by outward exp bounds)."""
    rng = np.random.default_rng(9)
    for _ in range(5):
        n = 6
        c = rng.normal(size=n)
        lo = rng.normal(size=n)
        hi = lo + rng.random(size=n)
        res = bounds.vertex_softmax(c, lo, hi)
        for value, expect in ((res.upper.item(), True), (res.upper.item() - 1e-6, False)):
            solver = z3.Solver()
            ys = [z3.Real(f"y{i}") for i in range(n)]
            with mpmath.workprec(200):
                for i, y in enumerate(ys):
                    a = mpmath.iv.exp(mpmath.iv.mpf(lo[i])).a
                    b = mpmath.iv.exp(mpmath.iv.mpf(hi[i])).b
                    solver.add(y >= _real(a), y <= _real(b))
            v = z3.RealVal(str(Fraction(value)))
            solver.add(z3.Sum([(z3.RealVal(str(Fraction(c[i]))) - v) * ys[i] for i in range(n)]) > 0)
            proved = solver.check() == z3.unsat
            assert proved == expect
            assert bounds.check_certificate(c, lo, hi, value).holds == expect


def test_bad_input():
    with pytest.raises(ValueError, match="sense"):
        bounds.check_certificate([1.0], [0.0], [1.0], 1.0, sense="max")
    with pytest.raises(ValueError, match="value"):
        bounds.check_certificate([1.0], [0.0], [1.0], float("nan"))
    with pytest.raises(ValueError, match="one row"):
        bounds.check_certificate([[1.0]], [[0.0]], [[1.0]], 1.0)
