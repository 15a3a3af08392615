"""analysis.ghosts at its edges (issue 10): tied, nearly tied and all-equal slopes, huge and
tiny scales, and verified exact radii. Every true value comes from an independent oracle:
the polynomial roots of F (integer slopes) in mpmath at 60+ digits, the binary closed form
in mpmath, or the report checker's own zero counter (softcert/cli/checker.py)."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from softcert.analysis.ghosts import (
    RadiusNotVerified,
    count_zeros,
    radius_exact,
    radius_lower_bound,
    radius_lower_bound_batch,
)
from softcert.cli import checker as check

METHODS = ("pi", "closed", "root")


def poly_radius_mp(z, m, h, dps=60):
    """Exact radius (mpf) for slopes a_k = a0 + m_k h, m_k integers (ties allowed).

    F = e^{(a0 + min m h) t} P(e^{h t}), P(w) = sum_k e^{z_k} w^{m_k - min m}; each root w of P
    gives zeros (Log w + 2 pi i j)/h, the nearest with j = 0. Roots by mpmath.polyroots (degree
    > 2) or the quadratic formula, at ``dps`` digits with e^{z_k} exact to that precision.
    """
    m = [int(v) - min(m) for v in m]
    with mpmath.workdps(dps):
        c = [mpmath.mpf(0)] * (max(m) + 1)
        for zk, mk in zip(z, m):
            c[mk] += mpmath.exp(mpmath.mpf(float(zk)))
        while c[-1] == 0:
            c.pop()
        if len(c) == 2:
            roots = [-c[0] / c[1]]
        elif len(c) == 3:
            disc = mpmath.sqrt(mpmath.mpc(c[1] ** 2 - 4 * c[0] * c[2]))
            # cancellation-free pair: q = -(b + sign(b) sqrt(disc)) / 2
            q = -(c[1] + (disc if c[1] >= 0 else -disc)) / 2
            roots = [q / c[2], c[0] / q]
        else:
            roots = mpmath.polyroots(c[::-1], maxsteps=400, extraprec=4 * dps)
        return min(abs(mpmath.log(mpmath.mpc(r))) for r in roots) / abs(mpmath.mpf(float(h)))


def binary_mp(z, a, dps=60):
    """The binary closed form sqrt(delta^2 + pi^2)/|Delta| at ``dps`` digits."""
    with mpmath.workdps(dps):
        delta = mpmath.mpf(float(z[0])) - mpmath.mpf(float(z[1]))
        Delta = mpmath.mpf(float(a[0])) - mpmath.mpf(float(a[1]))
        return mpmath.sqrt(delta ** 2 + mpmath.pi ** 2) / abs(Delta)


def assert_lower_bounds(z, a, exact):
    """Every scalar and batched lower bound is <= the exact radius (an mpf) and not inf."""
    for meth in METHODS:
        lb = radius_lower_bound(z, a, meth)
        assert 0 < lb < math.inf and mpmath.mpf(lb) <= exact, (meth, lb, exact)
        bb = float(radius_lower_bound_batch(torch.tensor([z], dtype=torch.float64),
                                            torch.tensor([a], dtype=torch.float64), meth)[0])
        assert 0 < bb < math.inf and mpmath.mpf(bb) <= exact, (meth, "batch", bb, exact)


# ---------------------------------------------------------------- defect 1: tied slopes


def test_tied_slopes_reported_case():
    z, a = [-0.3127, -0.6309, 0.3228], [-9.0, -18.0, -9.0]
    exact = poly_radius_mp(z, [1, 0, 1], 9.0)
    assert abs(exact - mpmath.mpf("0.38120")) < 1e-5
    res = radius_exact(z, a)
    assert abs(res.radius - exact) <= 1e-12 * exact
    assert res.bracket[0] <= exact <= res.bracket[1]
    assert_lower_bounds(z, a, exact)
    # merging makes it binary, where closed and root are exact
    assert radius_lower_bound(z, a, "root") == pytest.approx(float(exact), rel=1e-12)


@settings(max_examples=40)
@given(
    st.lists(st.tuples(st.floats(-6, 6), st.integers(0, 3)), min_size=3, max_size=7),
    st.integers(-12, 12),
    st.integers(1, 16),
)
def test_ties_match_polynomial_roots(pairs, a0, h):
    z = [p[0] for p in pairs]
    m = [p[1] for p in pairs]
    a0, h = a0 / 4, h / 4  # dyadic: the slopes a0 + m h are exact floats
    a = [a0 + mk * h for mk in m]
    assume(len(set(a)) < len(a))  # at least one exact tie
    if len(set(a)) == 1:
        assert radius_exact(z, a).radius == math.inf
        assert all(radius_lower_bound(z, a, meth) == math.inf for meth in METHODS)
        return
    exact = poly_radius_mp(z, m, h)
    res = radius_exact(z, a)
    assert abs(res.radius - exact) <= 1e-9 * exact
    assert mpmath.mpf(res.bracket[0]) <= exact * (1 + 1e-15) and exact <= res.bracket[1] * (1 + 1e-15)
    assert_lower_bounds(z, a, exact)


def test_all_equal_slopes():
    for n in (2, 3, 6):
        z = np.linspace(-3, 3, n)
        assert radius_exact(z, [0.25] * n).radius == math.inf
        assert all(radius_lower_bound(z, [0.25] * n, meth) == math.inf for meth in METHODS)
        assert torch.isinf(radius_lower_bound_batch(torch.tensor(z[None]), torch.full((1, n), 0.25), "root")).all()


@pytest.mark.parametrize("base", [1.0, 0.3, -7.5, 1e-3])
def test_near_ties_one_ulp(base):
    # slopes base, base + 1 ulp, base + 2 ulp: exactly base + m h (h = 1 ulp), a polynomial
    h = math.ulp(base)
    a = [base, base + h, base + 2 * h]
    assert a[1] - a[0] == h and a[2] - a[1] == h
    z = [0.3, -0.2, 0.1]
    exact = poly_radius_mp(z, [0, 1, 2], h)
    assert_lower_bounds(z, a, exact)
    res = radius_exact(z, a)
    assert abs(res.radius - exact) <= 1e-9 * exact


def test_near_tie_against_independent_zero_counter():
    # two slopes 1 ulp apart and a third far away: not merged, not commensurate with 1
    a = [1.0, float(np.nextafter(1.0, 2.0)), -0.7]
    z = [0.4, -0.1, 0.0]
    res = radius_exact(z, a)
    lb = radius_lower_bound(z, a, "root")
    assert check.zero_count(z, a, lb) == 0
    assert check.zero_count(z, a, res.radius * (1 - 1e-7)) == 0
    assert check.zero_count(z, a, res.radius * (1 + 1e-7)) >= 1


# ---------------------------------------------------------------- defect 2: the error model


def test_lse_error_never_negative_reported_case():
    D = 2251799813685252.0
    z, a = [0.0, -D, -D], [0.0, 1.0, -1.0]
    # F e^t = e^{-D} w^2 + w + e^{-D} with w = e^t
    exact = poly_radius_mp(z, [1, 2, 0], 1.0, dps=80)
    assert abs(exact - mpmath.mpf(D)) < 1
    assert_lower_bounds(z, a, exact)
    assert radius_lower_bound(z, a, "root") >= 0.999 * D  # still sharp
    with pytest.raises(RadiusNotVerified):  # |a| R ~ 1e15: float64 cannot resolve the circle
        radius_exact(z, a, time_limit=2.0)


def test_no_overflow_reported_case():
    z, a = [1e10, 0.0], [0.0, 1e-145]
    exact = binary_mp(z, a)
    assert abs(exact / mpmath.mpf("1e155") - 1) < 1e-15
    assert_lower_bounds(z, a, exact)
    for meth in ("closed", "root"):
        assert radius_lower_bound(z, a, meth) >= 0.999 * 1e155
    res = radius_exact(z, a)
    assert abs(res.radius - exact) <= 1e-14 * exact


def test_eta_one_reported_case():
    z = [1.1017534776951243, -7.198440764607533, -0.8863077623775574]
    a = [7.0, 1.0, 0.0]
    exact = poly_radius_mp(z, [7, 1, 0], 1.0)
    assert_lower_bounds(z, a, exact)
    res = radius_exact(z, a)
    assert abs(res.radius - exact) <= 1e-9 * exact


def test_beyond_float_range_is_largest_float_not_inf():
    # true radius pi / 5e-324 ~ 6e323: a lower bound may say 1.79e308, never inf
    z, a = [0.0, 0.0], [0.0, 5e-324]
    for meth in METHODS:
        assert radius_lower_bound(z, a, meth) == pytest.approx(1.7976931348623157e308, rel=1e-14)
    assert float(radius_lower_bound_batch(torch.tensor([z], dtype=torch.float64),
                                            torch.tensor([a], dtype=torch.float64), "root")[0]) < math.inf
    with pytest.raises(RadiusNotVerified):
        radius_exact(z, a)


@settings(max_examples=40)
@given(
    st.lists(st.tuples(st.floats(-1, 1), st.integers(0, 2)), min_size=2, max_size=5),
    st.integers(-300, 300),
    st.integers(-2, 16),
    st.booleans(),
)
def test_scales_sweep_against_quadratic_oracle(pairs, log_h, log_z, negate):
    """Slopes m h (m in 0..2, ties common), h = 10^log_h, logits up to 10^16: every lower
    bound, scalar and batched, is below the exact radius and finite."""
    h = 10.0 ** log_h * (-1 if negate else 1)
    z = [p[0] * 10.0 ** log_z for p in pairs]
    m = [p[1] for p in pairs]
    assume(len(set(m)) > 1)
    a = [mk * h for mk in m]
    exact = poly_radius_mp(z, m, h, dps=80)  # m h is exact for m in 0..2
    assume(exact < mpmath.mpf(1.7e308))
    assert_lower_bounds(z, a, exact)


# ---------------------------------------------------------------- defect 3: verified radii


def test_wrong_binary_radius_reported_case():
    z, a = [-0.0007179785548120664, 40.395265245681124], [1.5, 1.0]
    exact = binary_mp(z, a)
    assert abs(exact - mpmath.mpf("81.0359")) < 1e-4
    res = radius_exact(z, a)
    assert abs(res.radius - exact) <= 1e-14 * exact
    # independently: no zero inside, a conjugate pair just outside
    assert count_zeros(z, a, float(exact) * (1 - 1e-9)) == 0
    assert count_zeros(z, a, float(exact) * (1 + 1e-9)) == 2
    assert check.zero_count(z, a, float(exact) * (1 - 1e-7)) == 0


@pytest.mark.parametrize("seed", range(6))
def test_eight_terms_with_ties_never_hang_and_match_oracle(seed):
    # the slope pattern of the report that hung findroot (> 100 s), logits around 25.93
    rng = np.random.default_rng(seed)
    m = [1, 0, 1, 1, 3, 2, 2, 3]
    z = list(rng.normal(size=8) * 8)
    z[seed % 8] = 25.93
    a = [float(v) for v in m]
    exact = poly_radius_mp(z, m, 1.0)
    assert_lower_bounds(z, a, exact)
    try:
        res = radius_exact(z, a, time_limit=3.0)
    except RadiusNotVerified:
        return  # allowed: a clear error, never a wrong radius
    assert abs(res.radius - exact) <= 1e-9 * exact


@settings(max_examples=30)
@given(
    st.lists(st.tuples(st.floats(-5, 5), st.integers(0, 4)), min_size=3, max_size=6),
    st.integers(1, 12),
    st.floats(0.2, 3.0),
)
def test_count_zeros_matches_polynomial_roots(pairs, h, rel):
    h = h / 4  # dyadic: m h exact
    z = [p[0] for p in pairs]
    m = [p[1] for p in pairs]
    assume(len(set(m)) > 1)
    a = [mk * h for mk in m]
    with mpmath.workdps(60):
        mm = [mk - min(m) for mk in m]
        c = [mpmath.mpf(0)] * (max(mm) + 1)
        for zk, mk in zip(z, mm):
            c[mk] += mpmath.exp(mpmath.mpf(zk))
        roots = mpmath.polyroots(c[::-1], maxsteps=400, extraprec=200)
        # zeros of F: (Log w + 2 pi i j) / h for every root w and integer j
        R = mpmath.mpf(rel) * min(abs(mpmath.log(mpmath.mpc(w))) for w in roots) / mpmath.mpf(h)
        moduli = [abs((mpmath.log(mpmath.mpc(w)) + 2j * mpmath.pi * j) / mpmath.mpf(h))
                  for w in roots for j in range(-40, 41)]
        assume(all(abs(mod / R - 1) > 1e-6 for mod in moduli))
        expected = sum(1 for mod in moduli if mod < R)
    assert count_zeros(z, a, float(R)) == expected


def test_time_limit_gives_a_clear_error():
    z, a = [0.1, -0.3, 0.2, 0.0], [0.0, 1.0, 2.5, -1.3]
    with pytest.raises(RadiusNotVerified, match="z="):
        radius_exact(z, a, time_limit=1e-9)
    with pytest.raises(ValueError, match="time_limit"):
        radius_exact(z, a, time_limit=0)
    assert issubclass(RadiusNotVerified, ValueError)


FAR_CASES = [  # main's findroot gave up on these (radius ~400 and ~1300)
    ([-39.02588919911944, 21.874887103536196, -39.45289602484842, 7.0876736766835196,
      63.47347875152461, 8.14068074745394],
     [-0.038591138600206826, 0.11921080295463271, -0.02719106873575429, -0.010309824991843181,
      0.015218603011218185, -0.06712825987649508]),
    ([-27.73063375051273, 97.0170569933119, -25.800391863914392, 12.480696121792082,
      -46.5645110443284, -9.377044577598113, -17.73779257669838, -3.6490177982490235],
     [0.06472703185969508, -0.010413666947413832, -0.06250998127143757, 0.004173502216637259,
      -0.05019074629822239, -0.007647785279735458, 0.07865272647799175, 0.04651380221834023]),
]


def _independent_bracket(z, a, res):
    """The checker's own zero counter: none inside (1 - 1e-6) r, at least one inside (1 + 1e-6) r."""
    assert check.zero_count(z, a, res.radius * (1 - 1e-6)) == 0
    assert check.zero_count(z, a, res.radius * (1 + 1e-6)) >= 1


@pytest.mark.parametrize("z, a", FAR_CASES)
def test_far_zeros_reported_regime(z, a):
    res = radius_exact(z, a)
    _independent_bracket(z, a, res)
    assert res.bracket[0] <= res.radius <= res.bracket[1] * (1 + 1e-12)
    for meth in METHODS:
        assert radius_lower_bound(z, a, meth) <= res.bracket[0]


@settings(max_examples=6)
@given(st.integers(3, 8), st.integers(0, 2**32 - 1), st.sampled_from([0.02, 0.3, 3.0]),
       st.sampled_from([1.0, 10.0, 40.0]))
def test_exact_radius_against_independent_counter(n, seed, a_scale, z_scale):
    rng = np.random.default_rng(seed)
    z = list(rng.normal(size=n) * z_scale)
    a = list(rng.normal(size=n) * a_scale)
    try:
        res = radius_exact(z, a, time_limit=3.0)
    except RadiusNotVerified:
        return  # allowed: a clear error, never a wrong radius
    _independent_bracket(z, a, res)
