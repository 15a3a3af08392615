"""Tests for analysis.feedback: rigorous thresholds, sharpness demos, sympy Jacobian norm."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert.analysis import feedback as fb


def test_example_matrix_thresholds():
    cert = fb.stability_threshold(fb.example_matrix(), beta=6.0)
    assert abs(cert.beta_classical - 1 / 20.3) < 1e-6 and cert.beta_classical <= 1 / 20.3
    assert abs(cert.beta_star - 2 / 0.3) < 1e-6 and cert.beta_star <= 2 / 0.3
    assert cert.beta_star / cert.beta_classical > 100
    assert cert.unique_fixed_point and cert.contraction < 1 and cert.iterations > 0


def test_norm_bound_is_rigorous_and_tight(rng):
    for n in (2, 3, 5, 9):
        W = rng.standard_normal((n, n))
        cert = fb.stability_threshold(W)
        P = np.eye(n) - np.ones((n, n)) / n
        sig = np.linalg.svd(P @ W @ P, compute_uv=False)[0]
        assert sig <= cert.proj_norm.value <= sig * (1 + 1e-5) + 1e-12
        assert cert.proj_norm.method.startswith("exact")
    W = rng.standard_normal((30, 30))  # Frobenius fallback stays an upper bound
    nb = fb.stability_threshold(W).full_norm
    assert nb.value >= np.linalg.svd(W, compute_uv=False)[0]


def test_contraction_certificate_against_iteration(rng):
    n = 6
    W = rng.standard_normal((n, n))
    b = rng.standard_normal(n)
    cert0 = fb.stability_threshold(W)
    beta = 0.9 * cert0.beta_star
    cert = fb.stability_threshold(W, beta=beta, tol=1e-10)
    assert cert.unique_fixed_point
    # all starts reach the same point within the certified number of iterations
    ends = []
    for _ in range(5):
        x0 = rng.dirichlet(np.ones(n))
        orbit = fb.iterate(W, b, beta, x0=x0, steps=cert.iterations)
        ends.append(orbit[-1])
        # contraction holds step by step
        d = np.linalg.norm(np.diff(orbit, axis=0), axis=1)
        assert np.all(d[1:] <= cert.contraction * d[:-1] + 1e-15)
    ends = np.array(ends)
    assert np.max(np.linalg.norm(ends - ends[0], axis=1)) <= 2e-10


def test_pitchfork_is_sharp():
    c = 3.0
    assert fb.stability_threshold(c * np.eye(2)).beta_star == pytest.approx(2 / c, rel=1e-8)
    assert fb.fixed_points_n2(c, beta=0.98 * 2 / c) == 1
    assert fb.fixed_points_n2(c, beta=1.02 * 2 / c) == 3


def test_period_two_is_sharp():
    c = 3.0
    assert fb.stability_threshold(-c * np.eye(2)).beta_star == pytest.approx(2 / c, rel=1e-8)
    assert fb.period_two_amplitude(c, beta=0.95 * 2 / c) < 1e-8
    assert fb.period_two_amplitude(c, beta=1.1 * 2 / c) > 0.1


def test_jacobian_norm_sympy_n2_n3(rng):
    p1, p2 = sp.symbols("p1 p2", nonnegative=True)
    # n = 2: J = p1 p2 [[1, -1], [-1, 1]], eigenvalues 0 and 2 p1 p2 <= 1/2 (AM-GM)
    J2 = sp.diag(p1, 1 - p1) - sp.Matrix([p1, 1 - p1]) * sp.Matrix([[p1, 1 - p1]])
    ev2 = sp.Matrix(list(J2.eigenvals().keys()))
    top2 = max(ev2, key=lambda e: sp.Poly(e, p1).degree())
    assert sp.simplify(sp.Rational(1, 2) - top2 - 2 * (p1 - sp.Rational(1, 2)) ** 2) == 0
    # n = 3: charpoly det(λI - J) = λ (λ² - t λ + e2); both roots <= 1/2 iff q(1/2) >= 0 and t/2 <= 1/2
    lam = sp.symbols("lambda")
    p3 = 1 - p1 - p2
    p = sp.Matrix([p1, p2, p3])
    J3 = sp.diag(p1, p2, p3) - p * p.T
    cp = sp.expand(J3.charpoly(lam).as_expr())
    t, e2 = sp.expand(J3.trace()), sp.expand(3 * p1 * p2 * p3)
    assert sp.expand(cp - lam * (lam ** 2 - t * lam + e2)) == 0
    assert sp.expand(t - (1 - p1 ** 2 - p2 ** 2 - p3 ** 2)) == 0  # so t/2 <= 1/2
    q_half = sp.Rational(1, 4) - t / 2 + e2
    schur = sum(a * (a - b) * (a - c) for a, b, c in ((p1, p2, p3), (p2, p3, p1), (p3, p1, p2)))
    # 4 q(1/2) = Schur's degree-1 form (>= 0) + 3 p1 p2 p3 (>= 0)
    assert sp.expand(4 * q_half - (schur + 3 * p1 * p2 * p3)) == 0
    # numeric code agrees with the closed forms, and never exceeds 1/2
    f = sp.lambdify((p1, p2, lam), lam ** 2 - t * lam + e2)
    for _ in range(200):
        pv = rng.dirichlet(np.ones(3))
        nv = fb.jacobian_norm(pv)
        assert nv <= 0.5 + 1e-15
        assert abs(f(pv[0], pv[1], nv)) < 1e-12
        q = rng.uniform()
        assert fb.jacobian_norm([q, 1 - q]) == pytest.approx(2 * q * (1 - q), abs=1e-15)
    assert fb.jacobian_norm([0.5, 0.5, 0.0]) == pytest.approx(0.5)


def test_bad_input():
    with pytest.raises(ValueError, match="W"):
        fb.stability_threshold(np.ones((2, 3)))
    with pytest.raises(ValueError, match="beta"):
        fb.stability_threshold(np.eye(2), beta=-1)
    with pytest.raises(ValueError, match="W"):
        fb.stability_threshold(np.array([[np.nan]]))


# ---------------------------------------------------------------- extreme scales (issue 10)


def _fixed_point_residual(W, beta, x):
    """|softmax(beta W x) - x|_inf evaluated in mpmath at 60 digits (the oracle)."""
    import mpmath

    with mpmath.workdps(60):
        n = len(x)
        y = [mpmath.mpf(beta) * mpmath.fsum(mpmath.mpf(W[i][j]) * mpmath.mpf(x[j]) for j in range(n))
             for i in range(n)]
        m = max(y)
        e = [mpmath.exp(v - m) for v in y]
        s = mpmath.fsum(e)
        return float(max(abs(e[i] / s - mpmath.mpf(x[i])) for i in range(n)))


def test_frobenius_path_does_not_underflow_reported_case():
    # W = 1e-170 I(25), beta = 1e171: beta W = 10 I has the uniform fixed point and one near
    # a vertex, so no certificate of uniqueness may be given (main claimed contraction 2.5e-153).
    n = 25
    W = 1e-170 * np.eye(n)
    cert = fb.stability_threshold(W, beta=1e171)
    assert not cert.unique_fixed_point and cert.contraction > 1
    # the two fixed points, checked in mpmath: x0 solves x0 = e^{10 x0}/(e^{10 x0} + 24 e^{10 y})
    import mpmath

    with mpmath.workdps(60):
        f = lambda x0: x0 - mpmath.exp(10 * x0) / (mpmath.exp(10 * x0) + 24 * mpmath.exp(10 * (1 - x0) / 24))
        x0 = mpmath.findroot(f, 0.99)
    assert abs(float(x0) - 0.998899) < 1e-5
    other = np.full(n, (1 - float(x0)) / (n - 1))
    other[0] = float(x0)
    assert _fixed_point_residual(W, 1e171, other) < 1e-12
    assert _fixed_point_residual(W, 1e171, np.full(n, 1 / n)) < 1e-15


def _mp_norm2_lower(A):
    """A lower bound on ||A||_2 at 50 digits: ||A v|| / ||v|| for numpy's top right singular
    vector, with A scaled by a power of two (exact) so that nothing under- or overflows."""
    import mpmath

    M = float(np.max(np.abs(A)))
    if M == 0:
        return mpmath.mpf(0)
    e = math.frexp(M)[1]
    B = np.ldexp(A, -e)
    v = np.linalg.svd(B)[2][0]
    with mpmath.workdps(50):
        Bv = [mpmath.fsum(mpmath.mpf(float(B[i, j])) * mpmath.mpf(float(v[j])) for j in range(len(v)))
              for i in range(B.shape[0])]
        ratio = mpmath.sqrt(mpmath.fsum(x * x for x in Bv) / mpmath.fsum(mpmath.mpf(float(x)) ** 2 for x in v))
        return mpmath.ldexp(ratio, e)


@settings(max_examples=40)
@given(st.sampled_from([2, 3, 5, 25, 26]), st.integers(-300, 300), st.integers(0, 2**32 - 1),
       st.floats(1e-3, 1e3))
def test_norm_bounds_enclose_mpmath_over_scales(n, log10_scale, seed, beta):
    import mpmath

    W = np.random.default_rng(seed).standard_normal((n, n)) * 10.0 ** log10_scale
    beta = beta * 10.0 ** (-log10_scale)
    cert = fb.stability_threshold(W, beta=beta)
    Wp = fb.projected([[Fraction(float(v)) for v in row] for row in W])
    Wp_float = np.array([[float(v) for v in row] for row in Wp])
    with mpmath.workdps(50):
        # float(Wp) is within half an ulp per entry: ||E||_2 <= n max|E| <= n 2^-53 ||Wp||_2
        sig_p = _mp_norm2_lower(Wp_float) * (1 - mpmath.mpf(n) * 2 ** -52)
        sig_w = _mp_norm2_lower(W)
        assert 0 < sig_p <= cert.proj_norm.value
        assert 0 < sig_w <= cert.full_norm.value
        # (beta/2)||PWP||_2 <= contraction (rounded up); beta* ||PWP|| <= 2 (rounded down)
        assert mpmath.mpf(beta) * sig_p / 2 <= cert.contraction
        assert mpmath.mpf(cert.beta_star) * sig_p <= 2
        assert mpmath.mpf(cert.beta_classical) * sig_w <= 1
    if n > fb.EXACT_MAX_N:
        assert cert.proj_norm.method.startswith("Frobenius")
