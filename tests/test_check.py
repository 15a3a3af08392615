"""The independent checkers of `softcert check` against oracles (exact values, brute force)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from softcert.analysis import fp, ghosts, topk
from softcert.bounds import vertex_softmax
from softcert.cli import checker as check


def test_zero_count_matches_known_zeros():
    # z=(2,1,0), a=(1,0,-1): F = e^{2+t}(1 + w + w^2), w = e^{-1-t}: zeros at -1 ± 2πi/3 (+2πik)
    z, a = [2.0, 1.0, 0.0], [1.0, 0.0, -1.0]
    r = abs(complex(-1, 2 * math.pi / 3))
    assert check.zero_count(z, a, r * 0.999) == 0
    assert check.zero_count(z, a, r * 1.001) == 2
    # binary: zeros at (-δ + iπ(2m+1))/Δ
    assert check.zero_count([0.0, 0.0], [0.0, 1.0], math.pi * 0.999) == 0
    assert check.zero_count([0.0, 0.0], [0.0, 1.0], 3 * math.pi * 1.001) == 4


def test_radius_lower_bounds_pass_and_inflated_fail(rng):
    for _ in range(3):
        z, a = rng.standard_normal(5) * 2, rng.standard_normal(5)
        lb = ghosts.radius_lower_bound(z, a, "root")
        ex = ghosts.radius_exact(z, a)
        rec = dict(z=z.tolist(), a=a.tolist(), lower_bound=lb, exact=ex.radius, zero=[ex.zero.real, ex.zero.imag])
        assert check.check_radius(rec) is None
        assert check.check_radius(dict(rec, lower_bound=ex.radius * 1.01)) is not None


def test_tail_mass_bounds_enclose_mpmath(rng):
    import mpmath

    for n in (5, 40, 128):
        s = rng.standard_normal(n) * 4
        for k in (1, n // 3, n - 1):
            lo, hi = check.tail_mass_bounds(s, k)
            with mpmath.workdps(50):
                w = sorted((mpmath.exp(mpmath.mpf(float(v))) for v in s), reverse=True)
                tau = mpmath.fsum(w[k:]) / mpmath.fsum(w)
            assert lo <= tau <= hi and hi - lo <= 1e-12 * float(tau) + 1e-300


def test_topk_records_of_analysis_pass(rng):
    s = torch.as_tensor(rng.standard_normal((6, 64)) * 3)
    for e in (0.01, 0.1):
        c = topk.certify_topk(s, e)
        for i in range(6):
            rec = dict(scores=s[i].tolist(), k=int(c.k[i]), eps=e, tail_upper=float(c.tail_upper[i]),
                       tail_lower_prev=float(c.tail_lower_prev[i]), minimal_proved=bool(c.minimal_proved[i]))
            assert check.check_topk(rec) is None
            assert check.check_topk(dict(rec, k=rec["k"] - 1)) is not None


def test_fp_formula_reproduces_error_bound_to_rounding():
    for n in (2, 16, 100, 1000):
        for alg in fp.ALGORITHMS:
            b = fp.error_bound(n, alg, "float32")
            rel, floor = check.fp_formula(n, alg, "float32", 128, b.exp_ulps)
            # error_bound rounds up by 2^-40 relative: never below the exact formula, close to it
            for dtype_rel, exact in ((b.rel, rel), (b.abs_floor, floor)):
                assert exact <= dtype_rel <= exact * (1 + 1e-9)


def test_vertex_check_exact_against_vertex_softmax(rng):
    c, lo = rng.standard_normal(8), rng.standard_normal(8)
    hi = lo + rng.random(8)
    vb = vertex_softmax(torch.as_tensor(c), torch.as_tensor(lo), torch.as_tensor(hi))
    rec = dict(c=c.tolist(), lower=lo.tolist(), upper=hi.tolist(), min=float(vb.lower), max=float(vb.upper))
    assert check.check_vertex(rec) is None
    bad = dict(rec, max=float(vb.upper) - 1e-6)
    assert "refuted" in check.check_vertex(bad)


def test_feedback_check_exact():
    W = 5 * np.ones((4, 4)) + 0.3 * np.eye(4)
    from softcert.analysis import feedback

    cert = feedback.stability_threshold(W, beta=1.0)
    rec = dict(W=W.tolist(), proj_norm_upper=cert.proj_norm.value, norm_upper=cert.full_norm.value,
               beta_star=cert.beta_star, beta_classical=cert.beta_classical, beta=1.0, contraction=cert.contraction)
    assert check.check_feedback(rec) is None
    assert check.check_feedback(dict(rec, proj_norm_upper=0.2999)) is not None  # ‖ΠWΠ‖ = 0.3 exactly


@pytest.mark.parametrize("bad", [{}, {"certificates": []}, {"certificates": [{"id": "x", "kind": "nope"}]}])
def test_malformed_results_fail(bad):
    assert check.check_results(bad)


# ----------------------------------------------------------------------------- exact vertex decision
from fractions import Fraction  # noqa: E402

import mpmath  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.mark.parametrize("c,vmax", [([9007199254740993], 9007199254740992),
                                    ([2 ** 53 + 4], 9007199254740995)])
def test_vertex_check_reads_big_integers_exactly(c, vmax):
    # a single key: softmax = 1, so the value is c exactly; float() would round c to the claim
    rec = dict(c=c, lower=[0.0], upper=[0.0], min=vmax, max=vmax)
    assert "upper bound" in check.check_vertex(rec)
    assert check.check_vertex(dict(rec, min=c[0], max=c[0])) is None
    assert check.check_vertex(dict(rec, c=[0.1], min=0.1, max=0.1)) is None  # the binary64 0.1, exactly


def test_vertex_check_refuses_integers_float64_cannot_hold_as_scores():
    assert "malformed" in check.check_record(dict(kind="vertex", c=[1], lower=[2 ** 53 + 1], upper=[2 ** 60],
                                                  min=1, max=1))


def _mp_extremes(c, lo, hi, dps=60):
    """(min, max) of c·softmax over the box by brute force over the 2^n vertices, at dps digits."""
    import itertools

    with mpmath.workdps(dps):
        vals = []
        for pick in itertools.product((0, 1), repeat=len(c)):
            y = [mpmath.exp(mpmath.mpf(hi[i] if p else lo[i])) for i, p in enumerate(pick)]
            vals.append(mpmath.fsum(mpmath.mpf(ci) * yi for ci, yi in zip(c, y)) / mpmath.fsum(y))
        return min(vals), max(vals)


def _frac(x: mpmath.mpf) -> Fraction:
    m, e = mpmath.mpf(x).man_exp  # man_exp drops the sign
    return (-1 if x < 0 else 1) * Fraction(m) * Fraction(2) ** e


_coef = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.floats(-1e6, 1e6, allow_nan=False),
                  st.floats(-1e-30, 1e-30, allow_nan=False))
_score = st.floats(-700, 700, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_coef, _score, st.floats(0, 30, allow_nan=False)), min_size=1, max_size=5))
def test_vertex_decision_matches_brute_force_at_60_digits(rows):
    # the claim V = exact max ± a relative 1e-40 (well above the 60-digit error, far below float64)
    c = [r[0] for r in rows]
    lo = [r[1] for r in rows]
    hi = [r[1] + r[2] for r in rows]
    with mpmath.workdps(60):
        vmin, vmax = _mp_extremes(c, lo, hi)
        spread = max(abs(mpmath.mpf(ci)) for ci in c) or mpmath.mpf(1)
        d = spread * mpmath.mpf(10) ** -40
        assert check.vertex_claim_holds(c, lo, hi, _frac(vmax + d), "upper")
        assert check.vertex_claim_holds(c, lo, hi, _frac(vmin - d), "lower")
        if vmax - vmin > 4 * d:  # not a constant function: a claim just inside is refuted
            assert not check.vertex_claim_holds(c, lo, hi, _frac(vmax - d), "upper")
            assert not check.vertex_claim_holds(c, lo, hi, _frac(vmin + d), "lower")


def test_vertex_decision_exact_ties_and_masks():
    # c constant: f = c exactly, so V = c holds both ways (merged coefficients are all zero)
    assert check.vertex_claim_holds([3, 3], [0.0, -1.0], [1.0, 2.0], 3, "upper")
    assert check.vertex_claim_holds([3, 3], [0.0, -1.0], [1.0, 2.0], 3, "lower")
    # equal exponents merge: c = (1, -1) on a point box with equal scores gives 0 exactly
    assert check.vertex_claim_holds([1, -1], [0.5, 0.5], [0.5, 0.5], 0, "upper")
    assert not check.vertex_claim_holds([1, -1], [0.5, 0.5], [0.5, 0.5], Fraction(-1, 10 ** 30), "upper")
    # a masked key takes no mass
    assert check.vertex_claim_holds([5, 1], [-math.inf, 0.0], [-math.inf, 0.0], 1, "upper")
    # cancellation below 2^-1074: e^0 - e^(2^-1074) needs ~1100 bits to decide
    tiny = 5e-324
    assert check.vertex_claim_holds([1, 0], [0.0, tiny], [0.0, tiny], Fraction(1, 2), "upper")
    assert not check.vertex_claim_holds([1, 0], [0.0, tiny], [0.0, tiny], Fraction(1, 2), "lower")


# ----------------------------------------------------------------------------- Clopper-Pearson
def _mp_brackets(k, n, ci, tol=1e-10, conf=0.95, dps=50):
    """True when the exact Clopper-Pearson ends lie within ``tol`` of ``ci``: the regularised
    incomplete beta (mpmath, ``dps`` digits) crosses its target inside [end - tol, end + tol].
    lo solves I_p(k, n-k+1) = α/2, hi solves I_p(k+1, n-k) = 1 - α/2; both increase in p."""
    with mpmath.workdps(dps):
        alpha = (1 - mpmath.mpf(conf)) / 2

        def crosses(a, b, target, end):
            lo, hi = max(mpmath.mpf(0), mpmath.mpf(end) - tol), min(mpmath.mpf(1), mpmath.mpf(end) + tol)
            f = lambda p: mpmath.betainc(a, b, 0, p, regularized=True) - target  # noqa: E731
            return f(lo) <= 0 <= f(hi)

        ok_lo = ci[0] == 0 if k == 0 else crosses(k, n - k + 1, alpha, ci[0])
        ok_hi = ci[1] == 1 if k == n else crosses(k + 1, n - k, 1 - alpha, ci[1])
    return ok_lo and ok_hi


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_clopper_pearson_matches_mpmath_and_the_exact_checker(kn):
    from softcert.cli.records import clopper_pearson

    k, n = kn
    ci = clopper_pearson(k, n)
    assert _mp_brackets(k, n, ci)
    assert check.check_proportion_interval(k, n, ci, 0.95) is None
    # the exact checker is not a rubber stamp: an end moved by 1e-6 is refused
    if k > 0:
        assert check.check_proportion_interval(k, n, [ci[0] + 1e-6, ci[1]], 0.95) is not None
        assert check.check_proportion_interval(k, n, [max(0.0, ci[0] - 1e-6), ci[1]], 0.95) is not None
    if k < n:
        assert check.check_proportion_interval(k, n, [ci[0], ci[1] - 1e-6], 0.95) is not None
        assert check.check_proportion_interval(k, n, [ci[0], min(1.0, ci[1] + 1e-6)], 0.95) is not None


def test_clopper_pearson_known_values_and_bad_input():
    from scipy.stats import binomtest

    from softcert.cli.records import clopper_pearson

    # 5/6 (Table 1 of issue 17 printed it as 0.83): scipy's exact interval
    r = binomtest(5, 6).proportion_ci(confidence_level=0.95, method="exact")
    assert clopper_pearson(5, 6) == pytest.approx([r.low, r.high], abs=1e-15)
    assert clopper_pearson(0, 6)[0] == 0.0 and clopper_pearson(6, 6)[1] == 1.0
    # 1 - (α/2)^(1/n) closed forms at k = n and k = 0
    assert clopper_pearson(6, 6)[0] == pytest.approx(0.025 ** (1 / 6), rel=1e-12)
    assert clopper_pearson(0, 6)[1] == pytest.approx(1 - 0.025 ** (1 / 6), rel=1e-12)
    for k, n in ((3, 2), (-1, 4), (1, 0), (1.5, 3), (True, 3)):
        with pytest.raises(ValueError, match="k, n"):
            clopper_pearson(k, n)
    with pytest.raises(ValueError, match="confidence"):
        clopper_pearson(1, 2, confidence=1.5)
    assert check.check_proportion_interval(0, 6, [1e-3, 0.5], 0.95) is not None  # 0/n starts at 0
    assert check.check_proportion_interval(3, 6, "x", 0.95) is not None
    assert check.check_proportion_interval(3, 6, [0.6, 0.4], 0.95) is not None
