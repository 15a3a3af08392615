"""Tests for analysis.feedback: rigorous thresholds, sharpness demos, sympy Jacobian norm."""
from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from analysis import feedback as fb


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
