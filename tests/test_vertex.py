"""Vertex-Softmax against brute force (mpmath, 50 digits), sampling and exact checks."""
from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
import torch
from conftest import brute_force_extrema, mp_softmax_value
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert import bounds

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


# --- the edges of the error model (issue 10): subnormal products, float64 limits, huge n ---

REL_ORACLE = mpmath.mpf(10) ** -45  # relative: the oracle runs at 50 digits, at any magnitude


def _assert_sound_tight(res, worst, best, c, rel=1e-9):
    """Outward against the oracle at every magnitude (relative slack, not absolute), and
    within ``rel`` of max(|optimum|, max |c_i|) plus one spacing of the subnormal grid, 2^-1074
    (README, "Tightness": an optimum of 5e-316 cannot be rounded outward by less)."""
    upper, lower = mpmath.mpf(res.upper.item()), mpmath.mpf(res.lower.item())
    assert upper >= best - REL_ORACLE * abs(best), (res.upper.item(), best)
    assert lower <= worst + REL_ORACLE * abs(worst), (res.lower.item(), worst)
    scale = max(abs(best), abs(worst), mpmath.mpf(float(np.max(np.abs(c)))))
    allowed = rel * scale + mpmath.ldexp(1, -1074)
    assert upper - best <= allowed and worst - lower <= allowed, (upper - best, worst - lower)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("c", [[0.0, 5e-25], [0.0, 1.0502147743114552e-14]])
def test_reported_subnormal_products(backend, c):
    """Issue 10: the numba backend returned 1.19e-37 (true 2.5e-25) and 5.251073871049582e-15
    (true 5.251073871557276e-15): products d·w below the normal range were not charged."""
    lo, hi = [-690.0, -690.0], [0.0, -690.0]
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(c, lo, hi, dps=60)
    _assert_sound_tight(res, worst, best, c, rel=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reported_huge_n_subnormal_terms(backend):
    """Issue 10: torch returned 8.095e-320 against 2.2233e-319 (1e5 products of 0.45·2^-1074
    each rounded to zero)."""
    k = 100_000
    x = float(mpmath.log(mpmath.mpf(0.45) * mpmath.mpf(2) ** -1074 / mpmath.mpf(1e-300)))
    c = np.array([0.0] + [1e-300] * k)
    s = np.array([0.0] + [x] * k)
    res = bounds.vertex_softmax(c, s, s, backend=backend)
    w = mpmath.exp(mpmath.mpf(x))
    exact = k * mpmath.mpf(1e-300) * w / (1 + k * w)
    assert mpmath.mpf(res.upper.item()) >= exact and mpmath.mpf(res.lower.item()) <= exact
    assert res.upper.item() - float(exact) <= 1e-9 * 1e-300


def _grouped_extrema(cs, los, his, counts):
    """(min, max) over vertices for groups of identical entries (same c and box), at 60 digits.

    Identical entries sit on the same side at an optimum (threshold theorem), so the 2^m
    group choices with multiplicities cover every candidate vertex."""
    with mpmath.workdps(60):
        top = max(his)
        ends = [(mpmath.exp(mpmath.mpf(lo) - top), mpmath.exp(mpmath.mpf(hi) - top))
                for lo, hi in zip(los, his)]
        vals = []
        for choice in itertools.product((0, 1), repeat=len(cs)):
            y = [ends[j][k] * counts[j] for j, k in enumerate(choice)]
            vals.append(mpmath.fsum(mpmath.mpf(c) * yj for c, yj in zip(cs, y)) / mpmath.fsum(y))
        return min(vals), max(vals)


def _scaled(mantissa, exponent):
    return float(mpmath.mpf(mantissa) * mpmath.mpf(10) ** exponent)


tiny_c = st.tuples(st.floats(-1, 1), st.integers(-323, 0)).map(lambda t: _scaled(*t))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40)
@given(data=st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(tiny_c, min_size=n, max_size=n),
    st.lists(st.floats(-745, -600), min_size=n, max_size=n),
    st.lists(st.sampled_from([0.0, 1e-3, 50.0, 600.0]), min_size=n, max_size=n),
)))
def test_property_subnormal_products_and_tiny_c(backend, data):
    """c from 1e-323 to 1, scores where e^s and c·e^s leave the normal range."""
    c, lo, width = (np.array(x, dtype=float) for x in data)
    hi = lo + width
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(c, lo, hi, dps=60)
    _assert_sound_tight(res, worst, best, c)


limit_score = st.tuples(st.floats(-1, 1), st.integers(290, 308)).map(lambda t: _scaled(*t))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40)
@given(data=st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.floats(-1e3, 1e3), min_size=n, max_size=n),
    st.lists(limit_score | st.floats(-800, 800), min_size=n, max_size=n),
    st.lists(limit_score | st.floats(0, 800), min_size=n, max_size=n),
)))
def test_property_exponents_near_float64_limits(backend, data):
    """Scores up to ±1e308, so that differences of scores overflow to ±inf."""
    c, lo, other = (np.array(x, dtype=float) for x in data)
    lo, hi = np.minimum(lo, lo + np.abs(other)), np.maximum(lo, lo + np.abs(other))
    hi = np.where(np.isfinite(hi), hi, 1.7e308)
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(c, lo, hi, dps=60)
    _assert_sound_tight(res, worst, best, c)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=12)
@given(data=st.integers(1, 3).flatmap(lambda m: st.tuples(
    st.lists(tiny_c | st.floats(-5, 5), min_size=m, max_size=m),
    st.lists(st.floats(-760, 0), min_size=m, max_size=m),
    st.lists(st.sampled_from([0.0, 0.5, 30.0]), min_size=m, max_size=m),
    st.lists(st.integers(1, 40_000), min_size=m, max_size=m),
)))
def test_property_huge_n_few_distinct_values(backend, data):
    """Up to 120,000 keys in at most three groups of identical entries: sums of many
    underflowing terms, against a grouped oracle."""
    cs, los, widths, counts = data
    his = [lo + w for lo, w in zip(los, widths)]
    his[0] = max(his[0], 0.0)  # one group reaches the top, as after a max-shift
    c = np.repeat(cs, counts)
    lo = np.repeat(los, counts)
    hi = np.repeat(his, counts)
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = _grouped_extrema(cs, los, his, counts)
    _assert_sound_tight(res, worst, best, c)


@settings(max_examples=60)
@given(data=st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(tiny_c, min_size=n, max_size=n),
    st.lists(st.floats(-760, 0), min_size=n, max_size=n),
    st.lists(st.booleans(), min_size=n, max_size=n),
    st.floats(-1, 1),
)))
def test_property_certificate_gap_encloses_the_exact_sum(data):
    """The error model itself (kernels.floating.dot_error, through the torch evaluation of
    g): |G - g(λ) e^{-M}| <= err, with unnormalised tiny c so that products underflow."""
    from softcert.bounds.vertex import certificate_gap

    c, s, up, frac = data
    c = torch.tensor([c], dtype=torch.float64)
    s = torch.tensor([s], dtype=torch.float64)
    lam = c.amax(-1) * frac if frac >= 0 else c.amin(-1) * -frac
    up_mask = torch.tensor([up])
    lo, hi = torch.where(up_mask, s - 1.0, s), torch.where(up_mask, s, s + 1.0)
    g, err, _ = certificate_gap(c, lo, hi, lam)
    with mpmath.workdps(60):
        lam_mp = mpmath.mpf(lam.item())
        chosen = [hi[0, i].item() if c[0, i].item() > lam.item() else lo[0, i].item()
                  for i in range(c.shape[1])]
        m = max(chosen)
        exact = mpmath.fsum((mpmath.mpf(c[0, i].item()) - lam_mp) * mpmath.exp(mpmath.mpf(x) - m)
                            for i, x in enumerate(chosen))
        assert abs(mpmath.mpf(g.item()) - exact) <= mpmath.mpf(err.item()), (g, exact, err)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integers_beyond_2_53_are_refused_not_rounded(backend):
    """Issue 10: c = [2**53 + 1] gave 2**53, a bound for another c."""
    with pytest.raises(ValueError, match="c: the integer 9007199254740993"):
        bounds.vertex_softmax([2**53 + 1], [0.0], [0.0], backend=backend)
    with pytest.raises(ValueError, match="c: the integer"):
        bounds.vertex_softmax(torch.tensor([2**53 + 1, 0]), [0.0, 0.0], [0.0, 1.0], backend=backend)
    with pytest.raises(ValueError, match="c: the integer"):
        bounds.vertex_softmax([0.5, 2**53 + 1], [0.0, 0.0], [0.0, 1.0], backend=backend)
    with pytest.raises(ValueError, match="upper: the integer"):
        bounds.vertex_softmax([1.0], [0], [2**60 + 1], backend=backend)
    # exactly representable integers (even beyond 2^53) are exact inputs
    res = bounds.vertex_softmax([2**53 + 2, 2**70], [0, 0], [0, 0], backend=backend)
    assert res.upper.item() >= (2**53 + 2 + 2**70) / 2 >= res.lower.item()


def test_meta_tensors_are_refused_and_devices_documented():
    with pytest.raises(ValueError, match="c: a meta tensor"):
        bounds.vertex_softmax(torch.zeros(3, device="meta"), [0.0] * 3, [1.0] * 3)
    with pytest.raises(ValueError, match="lower: a meta tensor"):
        bounds.vertex_softmax([1.0] * 3, torch.zeros(3, device="meta"), [1.0] * 3)
    doc = bounds.vertex_softmax.__doc__
    assert "CPU" in doc and "meta" in doc


@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_1e290_apart_stay_tight(backend):
    """Found by the float64-limits sweep: the torch sweep's log-sums absorb scores 1e290 apart
    and propose the wrong vertex; the widened certificate then proved only max c = 1.0
    (true max 0.1522...). Bisection on the certificate restores the tight, proved bound."""
    c, lo, hi = [0.0, 1.0, -2.0], [0.0, 0.0, 0.0], [1e290, 1.0, 0.0]
    res = bounds.vertex_softmax(c, lo, hi, backend=backend)
    worst, best = brute_force_extrema(np.array(c), np.array(lo), np.array(hi), dps=60)
    _assert_sound_tight(res, worst, best, np.array(c))


@pytest.mark.parametrize("backend", BACKENDS + ["triton", "auto"])
def test_every_backend_computes_where_its_inputs_are(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    """Inside ``with torch.device("meta")`` a tensor made without an explicit device has no
    values and cannot mix with CPU tensors: a run on CPU inputs there fails wherever the
    bound creates a tensor that does not follow its inputs (what would break on a GPU), tiny
    coefficients (the power-of-two scaling) included; outside it, the same numbers."""
    g = torch.Generator().manual_seed(3)
    c = torch.randn(6, 5, generator=g, dtype=torch.float64) * torch.tensor([[1.0], [1e-300], [1.0], [1e-200], [1.0], [1.0]])
    lo = torch.randn(6, 5, generator=g, dtype=torch.float64)
    hi = lo + torch.rand(6, 5, generator=g, dtype=torch.float64)
    lo[0, 1] = hi[0, 1] = float("-inf")
    plain = bounds.vertex_softmax(c, lo, hi, backend=backend)
    with torch.device("meta"):
        here = bounds.vertex_softmax(c, lo, hi, backend=backend)
    for a, b in ((here.lower, plain.lower), (here.upper, plain.upper), (here.upper_vertex, plain.upper_vertex)):
        assert a.device.type == "cpu" and torch.equal(a, b)  # the same code on the same inputs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", BACKENDS + ["triton", "auto"])
def test_cuda_inputs_give_cuda_results_within_the_margin_of_the_cpu(backend):
    from test_kernels_vertex import margin

    g = torch.Generator().manual_seed(4)
    c, lo = (torch.randn(64, 16, generator=g, dtype=torch.float64) for _ in range(2))
    hi = lo + 1
    cpu = bounds.vertex_softmax(c, lo, hi, backend="torch")
    gpu = bounds.vertex_softmax(c.cuda(), lo.cuda(), hi.cuda(), backend=backend)
    assert gpu.lower.device.type == "cuda" and gpu.upper_vertex.device.type == "cuda"
    tol = margin(c, lo, hi)
    assert ((gpu.upper.cpu() - cpu.upper).abs() <= tol).all() and ((gpu.lower.cpu() - cpu.lower).abs() <= tol).all()
    with pytest.raises(ValueError, match="move them to one device"):
        bounds.vertex_softmax(c.cuda(), lo, hi, backend=backend)
