"""Exact rational re-check of Vertex-Softmax bounds, cross-checked with z3 (LRA)."""
from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
import z3
from conftest import brute_force_extrema
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert import bounds


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


# --- exactness (issue 10): the claim as a rational, exp enclosed at the requested precision ---


def test_claims_are_exact_rationals_not_floats():
    """Issue 10: check_certificate([0.1], [0.], [0.], Fraction(1, 10)) held, although
    c·softmax = float(0.1) > 1/10 (the claim went through float())."""
    for claim in (Fraction(1, 10), Decimal("0.1"), "0.1", "1/10"):
        up = bounds.check_certificate([0.1], [0.0], [0.0], claim)
        assert up.holds is False and up.status == "refuted" and up.slack > 0
        assert bounds.check_certificate([0.1], [0.0], [0.0], claim, sense="lower").holds is True
    # the float 0.1 itself is exactly c·softmax here
    assert bounds.check_certificate([0.1], [0.0], [0.0], 0.1).holds is True
    assert bounds.check_certificate([0.1], [0.0], [0.0], 0.1, sense="lower").holds is True
    exact = Fraction(0.1)
    assert bounds.check_certificate([0.1], [0.0], [0.0], exact - Fraction(1, 10**40)).holds is False
    assert bounds.check_certificate([3.0], [1.0], [2.0], 3).holds is True
    assert bounds.check_certificate([3.0], [1.0], [2.0], torch.tensor(3.0)).holds is True


def test_exact_ties_are_decided_without_precision():
    """Σ(c_i - V) y_i = 0 exactly: equal exponents are merged, so 0 is seen exactly."""
    res = bounds.check_certificate([1.0, -1.0], [0.5, 0.5], [0.5, 0.5], 0)
    assert res.holds is True and res.slack == 0.0
    res = bounds.check_certificate([1.0, -1.0], [0.5, 0.5], [0.5, 0.5], 0, sense="lower")
    assert res.holds is True


def _ulps(x: float, k: int) -> float:
    for _ in range(abs(k)):
        x = float(np.nextafter(x, np.inf if k > 0 else -np.inf))
    return x


@settings(max_examples=60)
@given(data=st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.floats(-3, 3), min_size=n, max_size=n),
    st.lists(st.floats(-700, -600), min_size=n, max_size=n),
    st.lists(st.floats(0, 2), min_size=n, max_size=n),
)))
def test_claims_three_ulps_from_the_exact_optimum(data):
    """Issue 10: at 53-bit intervals 299 of 300 true claims 3 ulps above the exact max (scores
    in [-700, -600]) were refuted. True claims hold, false ones are refuted, both exactly."""
    c, lo, width = (np.array(x, dtype=float) for x in data)
    hi = lo + width
    worst, best = brute_force_extrema(c, lo, hi, dps=60)
    up = float(best)
    up = up if up >= best else _ulps(up, 1)  # the float just above the exact optimum
    down = float(worst)
    down = down if down <= worst else _ulps(down, -1)
    assert bounds.check_certificate(c, lo, hi, _ulps(up, 3)).holds is True
    assert bounds.check_certificate(c, lo, hi, _ulps(down, -3), sense="lower").holds is True
    if best - worst > 1e-300 or float(best) != float(worst):
        # strictly inside the exact range: refuted
        below = _ulps(up, -4)
        if below < best:
            assert bounds.check_certificate(c, lo, hi, below).holds is False
        above = _ulps(down, 4)
        if above > worst:
            assert bounds.check_certificate(c, lo, hi, above, sense="lower").holds is False


def test_undecided_is_reported_not_refuted():
    """S = Σ(c_i - V) y_i ≈ -2^-202 here: 64-bit intervals cannot decide it; the default
    precision does."""
    x = 2.0 ** -100
    claim = Fraction(1) / (2 + Fraction(x))  # c·softmax = 1/(1 + e^x) < 1/(2 + x)
    res = bounds.check_certificate([1.0, 0.0], [0.0, x], [0.0, x], claim, prec=53, max_prec=64)
    assert res.holds is None and res.status == "undecided"
    res = bounds.check_certificate([1.0, 0.0], [0.0, x], [0.0, x], claim)
    assert res.holds is True and res.status == "holds"
    assert bounds.check_certificate([1.0, 0.0], [0.0, x], [0.0, x], claim - Fraction(1, 2**210)
                                    ).holds is True
    assert bounds.check_certificate([1.0, 0.0], [0.0, x], [0.0, x], claim - Fraction(1, 2**200)
                                    ).holds is False


@pytest.mark.parametrize("value", [float("inf"), "nan", "abc", [1.0, 2.0], True, None])
def test_bad_claims_name_the_value(value):
    with pytest.raises(ValueError, match="value"):
        bounds.check_certificate([1.0], [0.0], [1.0], value)


def test_bad_precision():
    with pytest.raises(ValueError, match="prec"):
        bounds.check_certificate([1.0], [0.0], [1.0], 1.0, prec=10)


@settings(max_examples=40)
@given(st.floats(-700, -600), st.floats(1e-12, 1e-3), st.floats(0.1, 1e6))
def test_true_claims_hold_under_cancellation(x, delta, k):
    """c = (k, -k): the optimum -k·tanh(δ/2) is far below |c|, so 53-bit exp enclosures
    (the old check) are much wider than the 3-ulp margin and refuted true claims."""
    c, s = [k, -k], [x, x + delta]
    worst, best = brute_force_extrema(c, s, s, dps=60)
    up = float(best)
    up = up if up >= best else _ulps(up, 1)
    assert bounds.check_certificate(c, s, s, _ulps(up, 3)).holds is True
    assert bounds.check_certificate(c, s, s, _ulps(up, -4)).holds is False


def test_integer_claims_and_coefficients_beyond_2_53():
    """Issue 10 (forged records): JSON integers are exact. c = [2^53 + 4] (a float64) over
    [0, 0] has value 2^53 + 4 > 2^53 + 3; c = [2^53 + 1] is not a float64 and is refused."""
    assert bounds.check_certificate([2**53 + 4], [0.0], [0.0], 2**53 + 3).holds is False
    assert bounds.check_certificate([2**53 + 4], [0.0], [0.0], 2**53 + 4).holds is True
    with pytest.raises(ValueError, match="c: the integer"):
        bounds.check_certificate([2**53 + 1], [0.0], [0.0], 2**53)
