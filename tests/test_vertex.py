"""Vertex-Softmax against brute force (mpmath, 50 digits), sampling and exact checks."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import bounds
from conftest import brute_force_extrema, mp_softmax_value

NINF = float("-inf")
BACKENDS = ["torch", "numba"]
ORACLE_SLACK = mpmath.mpf(10) ** -40


def _assert_encloses(res, lo_true, hi_true, rel=1e-9, c=None):
    """Outward (never inside the true range) and tight to ``rel`` of the scale.

    The scale is max(|optimum|, max_i |c_i|): the float64 evaluation of c·softmax carries
    an error relative to the coefficients, so an optimum far below max |c| (cancellation)
    is guaranteed to 1e-9 of max |c|, not of itself (README, "Tightness").
    """
    lower, upper = res.lower.item(), res.upper.item()
    # the oracle itself is exact to ~1e-50; 1e-40 absorbs its rounding, not ours (~1e-16)
    assert mpmath.mpf(upper) >= hi_true - ORACLE_SLACK * (1 + abs(hi_true)), (upper, hi_true)
    assert mpmath.mpf(lower) <= lo_true + ORACLE_SLACK * (1 + abs(lo_true)), (lower, lo_true)
    cmax = float(np.max(np.abs(np.asarray(c, dtype=float)))) if c is not None else 0.0
    scale = max(abs(float(hi_true)), abs(float(lo_true)), cmax, 1e-300)
    assert upper - float(hi_true) <= rel * scale
    assert float(lo_true) - lower <= rel * scale


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 2, 5, 9, 12])
def test_brute_force_random(n, backend):
    rng = np.random.default_rng(n)
    trials = 6 if n == 12 else 25
    for _ in range(trials):
        c = rng.normal(size=n) * 3
        lo = rng.normal(size=n) * 4
        hi = lo + rng.exponential(size=n) * 10.0 ** rng.integers(-3, 2)
        res = bounds.vertex_softmax(c, lo, hi, backend=backend)
        worst, best = brute_force_extrema(c, lo, hi)
        _assert_encloses(res, worst, best, c=c)
        # the reported vertices attain the optimum
        assert mp_softmax_value(c, res.upper_vertex.numpy()) >= best - mpmath.mpf(1e-12) * (1 + abs(best))
        assert mp_softmax_value(c, res.lower_vertex.numpy()) <= worst + mpmath.mpf(1e-12) * (1 + abs(worst))


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_entries_take_no_mass(backend):
    c = np.array([5.0, 1.0, -1.0, 0.5])
    lo = np.array([NINF, 0.0, -0.5, -0.2])
    hi = np.array([NINF, 0.3, 0.5, 0.1])
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(c[1:], lo[1:], hi[1:])
    _assert_encloses(res, worst, best, c=c[1:])
    assert res.upper.item() < 5.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_lower_minus_infinity_lets_mass_vanish(backend):
    # entry 0 may vanish: the sup of c·p is then the best over the remaining entries
    c = np.array([-3.0, 1.0, 2.0])
    lo = np.array([NINF, 0.0, -1.0])
    hi = np.array([0.0, 0.0, -1.0])
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    expected_sup = (1.0 * math.exp(0) + 2.0 * math.exp(-1)) / (math.exp(0) + math.exp(-1))
    assert res.upper.item() >= expected_sup
    assert res.upper.item() - expected_sup < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offset,width", [(3000.0, 0.0), (-2500.0, 1e3), (1e4, 800.0), (0.0, 1e3)])
def test_extreme_scores_and_widths(backend, offset, width):
    rng = np.random.default_rng(7)
    n = 8
    c = rng.normal(size=n)
    lo = offset + rng.normal(size=n) * 300
    hi = lo + width * rng.random(size=n)
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(c, lo, hi)
    _assert_encloses(res, worst, best, c=c)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_weights_far_below_the_maximum(backend):
    # a shift by max(upper) alone underflows every weight of the optimal vertex
    c = np.array([0.0, 1.0])
    lo = np.array([-1000.0, -1000.0])
    hi = np.array([0.0, -999.0])
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(c, lo, hi)
    _assert_encloses(res, worst, best, c=c)
    assert abs(res.upper.item() - 1 / (1 + math.exp(-1))) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_degenerate_box_is_the_softmax_value(backend):
    rng = np.random.default_rng(3)
    s = rng.normal(size=(4, 7)) * 5
    c = rng.normal(size=(4, 7))
    res = bounds.vertex_softmax(c, s, s, backend=backend)
    exact = torch.tensor([float(mp_softmax_value(c[i], s[i])) for i in range(4)], dtype=torch.float64)
    assert (res.lower <= exact).all() and (res.upper >= exact).all()
    assert ((res.upper - res.lower) <= 1e-13 * (1 + exact.abs())).all()


def test_batching_and_broadcasting_match_rowwise():
    rng = np.random.default_rng(5)
    c = torch.tensor(rng.normal(size=(3, 1, 6)))
    lo = torch.tensor(rng.normal(size=(1, 4, 6)))
    hi = lo + torch.tensor(rng.random(size=(1, 4, 6)))
    res = bounds.vertex_softmax(c, lo, hi)
    assert res.upper.shape == (3, 4) and res.upper_vertex.shape == (3, 4, 6)
    for i in range(3):
        for j in range(4):
            row = bounds.vertex_softmax(c[i, 0], lo[0, j], hi[0, j])
            assert row.upper.item() == res.upper[i, j].item()
            assert row.lower.item() == res.lower[i, j].item()


def test_float32_inputs_are_widened_exactly():
    rng = np.random.default_rng(11)
    c = rng.normal(size=6).astype(np.float32)
    lo = rng.normal(size=6).astype(np.float32)
    hi = lo + np.float32(0.5)
    r32 = bounds.vertex_softmax(c, lo, hi)
    r64 = bounds.vertex_softmax(c.astype(np.float64), lo.astype(np.float64), hi.astype(np.float64))
    assert r32.upper.dtype == torch.float64
    assert r32.upper.item() == r64.upper.item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_rows_against_sampling_and_exact_check(backend):
    rng = np.random.default_rng(2)
    n = 100_000
    c = rng.normal(size=n)
    lo = rng.normal(size=n) * 3
    hi = lo + rng.random(size=n)
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    # value at the reported vertices, in float64 with a generous rounding allowance
    for s, bound, sign in ((res.upper_vertex.numpy(), res.upper.item(), 1), (res.lower_vertex.numpy(), res.lower.item(), -1)):
        w = np.exp(s - s.max())
        val = float((c * w).sum() / w.sum())
        assert sign * (bound - val) >= -1e-10
        assert abs(bound - val) <= 1e-9 * max(1.0, abs(val))


@given(
    st.integers(1, 7).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-50, 50), min_size=n, max_size=n),
            st.lists(st.floats(-60, 60), min_size=n, max_size=n),
            st.lists(st.floats(0, 30), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    )
)
def test_property_samples_never_escape(data):
    c, lo, width, mask = (np.array(x, dtype=float) for x in data)
    hi = lo + width
    mask = mask.astype(bool)
    if mask.all():
        mask[0] = False
    lo[mask] = NINF
    hi[mask] = NINF
    res = bounds.vertex_softmax(c, lo, hi)
    worst, best = brute_force_extrema(c, lo, hi)
    _assert_encloses(res, worst, best, c=c)
    rng = np.random.default_rng(0)
    finite_lo = np.where(mask, 0.0, lo)
    s = finite_lo + (np.where(mask, 0.0, hi) - finite_lo) * rng.random(size=(20, len(c)))
    s[:, mask] = NINF
    for row in s:
        v = mp_softmax_value(c, row)
        slack = ORACLE_SLACK * (1 + abs(v))
        assert res.lower.item() - slack <= v <= res.upper.item() + slack


@pytest.mark.parametrize(
    "args,match",
    [
        (([1.0, float("nan")], [0.0, 0.0], [1.0, 1.0]), "c: contains NaN"),
        (([1.0, 2.0], [0.0, float("nan")], [1.0, 1.0]), "lower: contains NaN"),
        (([1.0, 2.0], [0.0, 0.0], [1.0, float("inf")]), r"upper: contains \+inf"),
        (([1.0, 2.0], [0.0, 2.0], [1.0, 1.0]), "lower > upper"),
        (([1.0, 2.0, 3.0], [0.0, 0.0], [1.0, 1.0]), "c: shape"),
        (([1.0, 2.0], [[0.0, 0.0]], [[1.0, 1.0, 1.0]]), "lower and upper: shapes"),
        (([1.0, 2.0], [NINF, NINF], [NINF, NINF]), "every entry masked"),
        (([float("inf"), 2.0], [0.0, 0.0], [1.0, 1.0]), "c: contains"),
        (([], [], []), "empty"),
        ((1.0, 0.0, 1.0), "scalar"),
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        bounds.vertex_softmax(*args)


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        bounds.vertex_softmax([1.0], [0.0], [1.0], backend="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
def test_ten_thousand_samples_stay_inside(backend):
    rng = np.random.default_rng(21)
    n = 32
    c = torch.tensor(rng.normal(size=n))
    lo = torch.tensor(rng.normal(size=n) * 2)
    hi = lo + torch.tensor(rng.random(size=n))
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    s = lo + (hi - lo) * torch.rand(10_000, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    s = torch.cat([s, res.upper_vertex[None], res.lower_vertex[None]])
    f = torch.softmax(s, -1) @ c
    # float64 evaluation of a sample is itself off by at most ~n u |c|max
    slack = 64 * n * 2.0**-53 * c.abs().max()
    assert (f <= res.upper + slack).all() and (f >= res.lower - slack).all()
    # and the bound is attained: the vertices come within the same slack
    assert f.max() >= res.upper - slack and f.min() <= res.lower + slack


def test_candidate_values_are_unimodal():
    """The threshold theorem's sequence V_t (t = number of top coefficients at upper) is unimodal."""
    rng = np.random.default_rng(8)
    for _ in range(50):
        n = 10
        c = np.sort(rng.normal(size=n))[::-1]
        lo = rng.normal(size=n)
        hi = lo + rng.random(size=n) * 3
        a, b = np.exp(lo), np.exp(hi)
        v = []
        for t in range(n + 1):
            y = np.concatenate([b[:t], a[t:]])
            v.append(float((c * y).sum() / y.sum()))
        peak = int(np.argmax(v))
        assert all(v[i] <= v[i + 1] + 1e-12 for i in range(peak))
        assert all(v[i] >= v[i + 1] - 1e-12 for i in range(peak, n))
        assert bounds.vertex_softmax(c, lo, hi).upper.item() >= max(v)
