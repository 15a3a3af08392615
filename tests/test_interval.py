"""softmax_interval against the closed form in mpmath (50 digits)."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert import bounds

NINF = float("-inf")


def _oracle(lo, hi):
    n = len(lo)
    out = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        if hi[i] == NINF:
            out.append((mpmath.mpf(0), mpmath.mpf(0)))
            continue
        if all(hi[j] == NINF for j in others):
            out.append((mpmath.mpf(1), mpmath.mpf(1)))
            continue
        e = lambda x: mpmath.mpf(0) if x == NINF else mpmath.exp(mpmath.mpf(x))  # noqa: E731
        p_lo = e(lo[i]) / (e(lo[i]) + mpmath.fsum(e(hi[j]) for j in others))
        p_hi = e(hi[i]) / (e(hi[i]) + mpmath.fsum(e(lo[j]) for j in others))
        out.append((p_lo, p_hi))
    return out


def _check(lo, hi, rel=1e-9):
    res = bounds.softmax_interval(lo, hi)
    for i, (p_lo, p_hi) in enumerate(_oracle(list(lo), list(hi))):
        a, b = res.lower[i].item(), res.upper[i].item()
        assert a <= p_lo and b >= p_hi, (i, a, p_lo, b, p_hi)
        if p_lo > 1e-290:
            assert (p_lo - a) / p_lo <= rel
        if p_hi > 1e-290:
            assert (b - p_hi) / p_hi <= rel


@pytest.mark.parametrize("scale", [0.1, 1.0, 30.0, 1000.0])
def test_random_boxes(scale):
    rng = np.random.default_rng(int(scale * 10))
    for _ in range(40):
        n = int(rng.integers(1, 8))
        lo = rng.normal(size=n) * scale
        hi = lo + rng.random(size=n) * scale
        _check(lo, hi)


def test_masked_and_vanishing_entries():
    _check(np.array([NINF, 0.0, 1.0]), np.array([NINF, 0.5, 2.0]))
    _check(np.array([NINF, 0.0]), np.array([0.0, 0.5]))
    _check(np.array([NINF, NINF]), np.array([0.3, NINF]))


def test_matches_vertex_softmax_with_unit_coefficients():
    rng = np.random.default_rng(1)
    lo = rng.normal(size=6)
    hi = lo + rng.random(size=6) * 2
    res = bounds.softmax_interval(lo, hi)
    for i in range(6):
        v = bounds.vertex_softmax(np.eye(6)[i], lo, hi)
        assert abs(v.upper.item() - res.upper[i].item()) < 1e-12
        assert abs(v.lower.item() - res.lower[i].item()) < 1e-12


@given(
    st.integers(1, 6).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-800, 800), min_size=n, max_size=n),
            st.lists(st.floats(0, 900), min_size=n, max_size=n),
        )
    )
)
def test_property_encloses(data):
    lo = np.array(data[0])
    _check(lo, lo + np.array(data[1]))


def test_batched_shape_and_bad_input():
    res = bounds.softmax_interval(torch.zeros(2, 3, 4), torch.ones(2, 3, 4))
    assert res.lower.shape == (2, 3, 4)
    with pytest.raises(ValueError, match="lower > upper"):
        bounds.softmax_interval([1.0, 0.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="upper: contains NaN"):
        bounds.softmax_interval([0.0], [float("nan")])


def _exact_end(lo, hi, i, upper):
    """e^{u_i}/(e^{u_i} + Σ_{j≠i} e^{l_j}) (upper) or e^{l_i}/(e^{l_i} + Σ_{j≠i} e^{u_j}), in
    mpmath at 60 digits, shifted by the entry's own score (no overflow at ±1e308)."""
    with mpmath.workdps(60):
        s = hi[i] if upper else lo[i]
        if s == NINF:
            return mpmath.mpf(0)
        other = [lo[j] if upper else hi[j] for j in range(len(lo)) if j != i]
        tot = mpmath.fsum(mpmath.exp(mpmath.mpf(x) - mpmath.mpf(s)) for x in other if x != NINF)
        return 1 / (1 + tot)


edge_score = st.one_of(
    st.floats(-760, 0),
    st.tuples(st.sampled_from([-1.0, 1.0]), st.integers(290, 307), st.floats(1, 9)).map(
        lambda t: t[0] * t[2] * 10.0 ** t[1]),
)


@settings(max_examples=80)
@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(edge_score, min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 1e-3, 30.0, 745.0, 800.0]), min_size=n, max_size=n),
)))
def test_property_edges_of_the_float_range(data):
    """Scores from -760 (subnormal and zero exponentials) to ±1e308 (overflowing differences):
    the interval still encloses the exact ends (relative slack only: no absolute floor)."""
    lo = np.array(data[0])
    hi = np.minimum(lo + np.array(data[1]), 1.7e308)
    res = bounds.softmax_interval(lo, hi)
    slack = mpmath.mpf(10) ** -40
    for i in range(len(lo)):
        assert mpmath.mpf(res.upper[i].item()) >= _exact_end(lo, hi, i, True) * (1 - slack)
        assert mpmath.mpf(res.lower[i].item()) <= _exact_end(lo, hi, i, False) * (1 + slack)
