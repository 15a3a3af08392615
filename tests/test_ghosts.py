"""Oracles for analysis.ghosts: DESIGN test vectors, polynomial roots, sympy, properties."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from softcert.analysis.ghosts import (
    batch_radius,
    binary_radius,
    radius_exact,
    radius_lower_bound,
    radius_lower_bound_batch,
    top2_estimate,
)
from softcert.analysis.ghosts_symbolic import binary_zero_set, half_plane_lemma, log_odds_lemma

METHODS = ("pi", "closed", "root")

# ---------------------------------------------------------------- DESIGN.md test vectors


@pytest.mark.parametrize(
    "delta, Delta, expected",
    [(0.0, 1.0, math.pi), (2.0, 1.0, 3.7241918), (10.0, 3.0, 3.4939568), (-5.0, 0.5, 11.8100981)],
)
def test_binary_vectors(delta, Delta, expected):
    z, a = [delta, 0.0], [0.0, Delta]
    assert binary_radius(delta, Delta) == pytest.approx(expected, abs=1e-7)
    res = radius_exact(z, a)
    assert res.radius == pytest.approx(expected, abs=1e-7)
    # the zero is a zero of F, at the reported modulus, in the upper half-plane
    t = res.zero
    F = np.exp(delta) * np.exp(0 * t) + np.exp(Delta * t)
    assert abs(F) < 1e-9 * (np.exp(delta) + abs(np.exp(Delta * t)))
    assert abs(t) == pytest.approx(res.radius, rel=1e-12) and t.imag > 0
    # closed and root are exact in the binary case (up to their downward rounding)
    for m in ("closed", "root"):
        lb = radius_lower_bound(z, a, m)
        assert lb <= res.radius
        assert lb == pytest.approx(expected, abs=1e-7)
    assert radius_lower_bound(z, a, "pi") == pytest.approx(math.pi / abs(Delta), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_equal_weights(n):
    res = radius_exact(np.zeros(n), np.arange(n, dtype=float))
    assert res.radius == pytest.approx(2 * math.pi / n, abs=1e-7)


def test_three_class_vector():
    res = radius_exact([2.0, 1.0, 0.0], [1.0, 0.0, -1.0])
    assert res.radius == pytest.approx(2.3208815, abs=1e-7)
    assert res.zero.real == pytest.approx(-1.0, abs=1e-9)
    assert res.zero.imag == pytest.approx(2 * math.pi / 3, abs=1e-9)


def test_top2_estimate_is_not_a_bound():
    z, a = [5.0, 4.0, 0.0], [0.0, 0.1, 10.0]
    exact = radius_exact(z, a).radius
    assert exact == pytest.approx(0.61895, abs=1e-5)
    assert top2_estimate(z, a) == pytest.approx(32.97, abs=1e-2)
    assert top2_estimate(z, a) > 50 * exact  # why it is only ever labelled an estimate
    for m in METHODS:
        assert radius_lower_bound(z, a, m) <= exact


def test_equal_slopes_infinite():
    assert binary_radius(1.0, 0.0) == math.inf
    assert radius_lower_bound([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], "root") == math.inf
    assert radius_exact([1.0, 2.0], [0.5, 0.5]).radius == math.inf


@pytest.mark.parametrize(
    "z, a, match",
    [
        ([1.0], [1.0], "z"),
        ([1.0, 2.0], [1.0], "a"),
        ([float("nan"), 2.0], [1.0, 0.0], "z"),
        ([1.0, 2.0], [float("inf"), 0.0], "a"),
    ],
)
def test_bad_input(z, a, match):
    with pytest.raises(ValueError, match=match):
        radius_lower_bound(z, a)
    with pytest.raises(ValueError, match=match):
        radius_exact(z, a)


def test_bad_method_and_batch_shapes():
    with pytest.raises(ValueError, match="method"):
        radius_lower_bound([0.0, 1.0], [0.0, 1.0], "top2")
    with pytest.raises(ValueError, match="z"):
        radius_lower_bound_batch(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="a"):
        radius_lower_bound_batch(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="delta"):
        binary_radius(float("nan"), 1.0)


# ---------------------------------------------------------------- polynomial-root oracle


def poly_radius(z, m, a0, h):
    """Exact radius when a_k = a0 + m_k h: F = e^{a0 t} P(e^{h t}), P(s) = sum e^{z_k} s^{m_k}.

    Each root s of P gives zeros t = (log|s| + i(arg s + 2 pi j))/h; the nearest has j = 0.
    """
    m = np.asarray(m) - min(m)  # roots at s = 0 give no zero of F
    coef = np.zeros(int(m.max()) + 1)
    for zk, mk in zip(z, m):
        coef[mk] += math.exp(zk)
    roots = np.roots(coef[::-1])
    return min(abs(complex(np.log(complex(r)))) for r in roots) / abs(h)


@given(
    st.lists(st.tuples(st.floats(-4, 4), st.integers(0, 4)), min_size=2, max_size=6),
    st.floats(-3, 3),
    st.floats(0.2, 3.0),
)
def test_commensurate_slopes_match_polynomial_roots(pairs, a0, h):
    z = np.array([p[0] for p in pairs])
    m = np.array([p[1] for p in pairs])
    assume(m.max() > m.min())
    a = a0 + m * h
    expected = poly_radius(z, m, a0, h)
    res = radius_exact(z, a)
    assert res.radius == pytest.approx(expected, rel=1e-7, abs=1e-7)
    for meth in METHODS:
        assert radius_lower_bound(z, a, meth) <= res.radius


# ---------------------------------------------------------------- property tests

vectors = st.integers(2, 6).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-12, 12), min_size=n, max_size=n),
        st.lists(st.floats(-6, 6), min_size=n, max_size=n),
    )
)


@given(vectors)
def test_lower_bounds_below_exact(za):
    z, a = map(np.array, za)
    assume(np.ptp(a) > 1e-3)
    res = radius_exact(z, a)
    with mpmath.workdps(50):  # the zero really is one
        F = mpmath.fsum(mpmath.exp(mpmath.mpf(zk) + mpmath.mpf(ak) * mpmath.mpc(res.zero)) for zk, ak in zip(z, a))
        scale = mpmath.fsum(mpmath.exp(mpmath.mpf(zk) + mpmath.mpf(ak) * res.zero.real) for zk, ak in zip(z, a))
        assert abs(F) <= 1e-9 * scale
    bounds = {m: radius_lower_bound(z, a, m) for m in METHODS}
    for m, b in bounds.items():
        assert 0 < b <= res.radius, (m, b, res.radius)
    assert bounds["pi"] <= bounds["closed"] * (1 + 1e-12)
    assert bounds["closed"] <= bounds["root"] * (1 + 1e-12)
    # independent check that no nearer zero was missed: Newton from a grid over the disk
    assert newton_nearest(z, a, res.radius) >= res.radius * (1 - 1e-7)


def newton_nearest(z, a, R, grid=40, iters=60):
    """Smallest modulus of a zero reached by Newton from a grid covering |t| <= R (or inf)."""
    x = np.linspace(-R, R, grid)
    t = (x[:, None] + 1j * x[None, :]).ravel()
    t = t[np.abs(t) <= R]
    for _ in range(iters):
        w = z[None] + a[None] * t[:, None]
        mx = w.real.max(axis=1, keepdims=True)
        e = np.exp(w - mx)
        F, dF = e.sum(axis=1), (e * a[None]).sum(axis=1)
        step = np.where(np.abs(dF) > 0, F / np.where(np.abs(dF) > 0, dF, 1), 0)
        t = t - np.clip(np.abs(step), 0, R) * np.exp(1j * np.angle(step))
    w = z[None] + a[None] * t[:, None]
    mx = w.real.max(axis=1, keepdims=True)
    e = np.exp(w - mx)
    ok = np.abs(e.sum(axis=1)) <= 1e-10 * np.abs(e).sum(axis=1)
    return float(np.abs(t[ok]).min()) if ok.any() else math.inf


@given(st.floats(-20, 20), st.floats(-8, 8).filter(lambda v: abs(v) > 1e-3), st.floats(-5, 5))
def test_binary_exactness(delta, Delta, shift):
    z, a = [delta + shift, shift], [Delta + shift, shift]  # a common shift changes nothing
    exact = binary_radius(delta, Delta)
    for m in ("closed", "root"):
        lb = radius_lower_bound(z, a, m)
        assert lb <= exact * (1 + 4e-16)
        assert lb == pytest.approx(exact, rel=1e-12)
    assert radius_exact(z, a).radius == pytest.approx(exact, rel=1e-9)


# ---------------------------------------------------------------- batched torch versions


@pytest.mark.parametrize("method", METHODS)
def test_batch_matches_scalar(method, rng):
    z = rng.normal(size=(16, 5)) * 4
    a = rng.normal(size=(16, 5)) * 2
    a[3] = 0.7  # equal slopes: infinite radius
    got = radius_lower_bound_batch(torch.tensor(z), torch.tensor(a), method)
    assert got.dtype == torch.float64 and got.shape == (16,)
    for i in range(16):
        ref = radius_lower_bound(z[i], a[i], method)
        if math.isinf(ref):
            assert math.isinf(got[i])
            continue
        assert float(got[i]) == pytest.approx(ref, rel=1e-9)
        assert float(got[i]) <= radius_exact(z[i], a[i]).radius
    assert batch_radius(torch.tensor(z), torch.tensor(a), method) == float(got.min())


def test_batch_pi_is_pi_over_max_spread(rng):
    a = torch.tensor(rng.normal(size=(32, 10)))
    z = torch.tensor(rng.normal(size=(32, 10)))
    spread = (a.max(1).values - a.min(1).values).max()
    assert batch_radius(z, a) == pytest.approx(math.pi / float(spread), rel=1e-12)
    assert batch_radius(z, a) <= math.pi / float(spread)


# ---------------------------------------------------------------- sympy derivations


def test_symbolic_binary_zero_set_matches_numeric():
    b = binary_zero_set()
    assert b.residual == 0  # the derived t_m are zeros of 1 + e^{delta + Delta t}
    radius = sp.lambdify((b.delta, b.Delta), sp.sqrt(b.radius_sq))
    zero = sp.lambdify((b.delta, b.Delta), b.zero.subs(b.m, 0))
    for delta, Delta in [(0.0, 1.0), (2.0, 1.0), (10.0, 3.0), (-5.0, 0.5), (1.3, -2.2)]:
        assert radius(delta, Delta) == pytest.approx(binary_radius(delta, Delta), rel=1e-14)
        res = radius_exact([delta, 0.0], [Delta, 0.0])
        t0 = complex(zero(delta, Delta))
        t0 = complex(t0.real, abs(t0.imag))
        assert res.zero == pytest.approx(t0, abs=1e-9)
    # |t_m| grows with |2m+1|: m = 0 (and -1) are the nearest zeros
    mod = sp.lambdify((b.delta, b.Delta, b.m), sp.Abs(b.zero))
    assert all(mod(2.0, 1.0, m) > mod(2.0, 1.0, 0) for m in (1, 2, -2, 5))
    assert mod(2.0, 1.0, -1) == pytest.approx(mod(2.0, 1.0, 0))


def test_symbolic_half_plane_matches_pi_bound():
    h = half_plane_lemma()
    assert h["cos_nonpositive_set"] == sp.EmptySet
    y, D = sp.symbols("y Delta_a", real=True)
    assert sp.simplify(h["deviation_max"] - sp.Abs(y * D) / 2) == 0
    y_max = sp.lambdify(list(h["y_max"].free_symbols), h["y_max"])
    for spread in (0.5, 1.0, 7.0):
        a = [0.0, spread / 3, spread]
        assert radius_lower_bound([0.0, 0.0, 0.0], a, "pi") == pytest.approx(y_max(spread), rel=1e-14)
    # tight in the binary case: the nearest zero sits at |Im t| = pi / Delta
    res = radius_exact([2.0, 0.0], [0.0, 3.0])
    assert abs(res.zero.imag) == pytest.approx(float(y_max(3.0)), rel=1e-9)


def test_symbolic_log_odds_concave_and_lipschitz(rng):
    lem = log_odds_lemma(3)
    assert lem["d1_residual"] == 0 and lem["d2_residual"] == 0
    u, z, a = lem["symbols"]
    d1 = sp.lambdify((u, *z, *a), lem["d1"])
    d2 = sp.lambdify((u, *z, *a), lem["d2"])
    for _ in range(50):
        zv, av, uv = rng.normal(size=3) * 3, rng.normal(size=3) * 2, rng.normal() * 3
        s = np.max(np.abs(av[1:] - av[0]))
        assert abs(d1(uv, *zv, *av)) <= s + 1e-12
        assert d2(uv, *zv, *av) <= 1e-12
        # the root bound's log-odds root: class 0 top at u = 0 reaches p = 1/2 no nearer than L0/s
        l0 = zv[0] - np.log(np.exp(zv[1:]).sum())
        if l0 > 0 and np.argmax(zv) == 0:
            closed = radius_lower_bound(zv, av, "closed")
            assert closed >= math.pi / np.ptp(av) * (1 - 1e-12)


def test_pi_radius_batch_matches_and_float32(rng):
    from softcert.analysis.ghosts import pi_radius_batch

    a = torch.tensor(rng.normal(size=(20, 7)))
    assert torch.equal(pi_radius_batch(a), radius_lower_bound_batch(torch.zeros(20, 7), a, "pi"))
    a32 = a.float()
    exact = [math.pi / float(np.ptp(a32[i].double().numpy())) for i in range(20)]
    got = pi_radius_batch(a32)
    assert all(float(g) <= e and float(g) == pytest.approx(e, rel=1e-12) for g, e in zip(got, exact))
    with pytest.raises(ValueError, match="a"):
        pi_radius_batch(torch.tensor([[0.0, float("nan")]]))
