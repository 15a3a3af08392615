"""Oracle tests for analysis.fp: mpmath references, adversarial inputs, real-dtype thresholds."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from softcert.analysis import fp

COMBOS = [(a, d) for a in fp.ALGORITHMS for d in fp.DTYPES]


@pytest.mark.parametrize("algorithm,dtype", COMBOS)
def test_bound_holds_against_mpmath_on_stress_inputs(algorithm, dtype, rng):
    for n in (1, 2, 7, 64, 300):
        for kind, x in fp.stress_inputs(n, rng).items():
            if dtype == "float16" and kind == "wide":
                x = x / 1e3  # keep the input finite in float16
            xr = fp.round_array(x, dtype)
            p = fp.reference_softmax(xr, dps=50)
            y = fp.softmax(x, algorithm, dtype, block=16)
            b = fp.error_bound(n, algorithm, dtype, block=16)
            assert y.dtype == (np.float16 if dtype == "float16" else
                               np.float64 if dtype == "float64" else np.float32)
            v = fp.bound_violation(y, p, b)
            assert v <= 1.0, (algorithm, dtype, n, kind, v)
            ve = fp.elementwise_violation(y, xr, p, b)
            assert ve <= 1.0, (algorithm, dtype, n, kind, ve)


@given(st.lists(st.floats(-200, 200, allow_nan=False, width=32), min_size=1, max_size=40),
       st.sampled_from(fp.ALGORITHMS), st.sampled_from(fp.DTYPES), st.integers(1, 9))
def test_bound_holds_for_arbitrary_inputs(xs, algorithm, dtype, block):
    x = np.array(xs)
    if dtype == "float16":
        x = np.clip(x, -60000, 60000)
    xr = fp.round_array(x, dtype)
    p = fp.reference_softmax(xr, dps=40)
    y = fp.softmax(x, algorithm, dtype, block=block)
    b = fp.error_bound(len(x), algorithm, dtype, block=block)
    assert fp.bound_violation(y, p, b) <= 1.0
    assert fp.elementwise_violation(y, xr, p, b) <= 1.0


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=2, max_size=12))
def test_bound_holds_for_extreme_float32_ranges(xs):
    x = np.array(xs, dtype=np.float32)
    p = fp.reference_softmax(x, dps=50)
    for a in fp.ALGORITHMS:
        b = fp.error_bound(len(x), a, "float32", block=3)
        assert fp.bound_violation(fp.softmax(x, a, "float32", block=3), p, b) <= 1.0


@pytest.mark.parametrize("algorithm", fp.ALGORITHMS)
def test_score_range_bound_is_purely_relative_and_holds(algorithm, rng):
    n, R = 200, 30.0
    for _ in range(5):
        x = rng.uniform(-R / 2, R / 2, n)
        x[0], x[1] = -R / 2, R / 2
        xr = fp.round_array(x, "float32")
        b = fp.error_bound(n, algorithm, "float32", block=32, score_range=float(xr.max() - xr.min()))
        assert b.abs_floor < 1e-40  # only the underflow floor remains
        p = fp.reference_softmax(xr)
        assert fp.bound_violation(fp.softmax(x, algorithm, "float32", block=32), p, b) <= 1.0


@pytest.mark.parametrize("algorithm", fp.ALGORITHMS)
def test_large_n_adversarial_float32(algorithm, rng):
    """n = 1e5 with an exactly summed float64 reference; the bound holds and is not vacuous."""
    n = 100_000
    worst = 0.0
    b = fp.error_bound(n, algorithm, "float32", block=128)
    for kind, x in fp.stress_inputs(n, rng, ("const_stress", "ramp", "equal", "ascending")).items():
        xr = fp.round_array(x, "float32")
        p = fp.reference_softmax_fast(xr)
        y = fp.softmax(x, algorithm, "float32", block=128)
        v = fp.bound_violation(y, p, b)
        assert v <= 1.0, (kind, v)
        assert fp.elementwise_violation(y, xr, p, b) <= 1.0
        worst = max(worst, fp.needed_rel(y, xr, p, b) / b.rel)
    # not vacuous: the adversarial inputs reach a sizeable part of the proven rel
    assert worst > {"three_pass": 0.1, "two_pass": 0.005, "online": 0.005, "blocked": 0.005,
                    "tree": 0.01}[algorithm], worst


def test_reference_fast_agrees_with_mpmath(rng):
    x = fp.round_array(rng.standard_normal(500) * 20, "float32")
    np.testing.assert_allclose(fp.reference_softmax_fast(x), fp.reference_softmax(x), rtol=1e-14,
                               atol=1e-300)


def test_growth_sequential_linear_tree_logarithmic():
    b3 = [fp.error_bound(n, "three_pass").rel_in_u for n in (10**3, 10**4)]
    bt = [fp.error_bound(n, "tree").rel_in_u for n in (10**3, 10**6)]
    assert 9 < b3[1] / b3[0] < 11
    assert bt[1] < 2.5 * bt[0]
    assert fp.error_bound(10**4, "three_pass", "float16").rel == math.inf  # n u > 1


def test_float32_is_really_float32():
    x = np.array([0.0, 1e-9], dtype=np.float64)  # equal in float32
    y = fp.softmax(x, "three_pass", "float32")
    assert y.dtype == np.float32 and y[0] == y[1] == np.float32(0.5)
    assert fp.softmax(x, "three_pass", "float64")[0] != 0.5


@pytest.mark.parametrize("dtype", fp.DTYPES)
def test_exp_accuracy_assumption(dtype):
    """The assumed exp ulps dominate the measured maximum (exhaustive for 16-bit formats)."""
    measured = fp.measure_exp_ulps(dtype, points=5_001)
    assert measured <= fp.EXP_ULPS[dtype]
    assert measured > 0.49  # the measurement sees real rounding errors


def test_bfloat16_rounding_matches_torch(rng):
    x = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-40, 38, 2000),
                        [3.3895313e38, 3.3961e38, 1e-40, -2.0 ** -133, 2.0 ** -134]])
    ours = fp.round_array(x, "bfloat16")
    ref = torch.tensor(x.astype(np.float32)).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ours, ref)
    t = fp.round_array(rng.uniform(-95, 90, 3000), "bfloat16")
    ours = fp._exp_vec(t, 3)
    theirs = torch.exp(torch.tensor(t).to(torch.bfloat16)).float().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=2 ** -7, atol=2 ** -133)


def _neighbours(t: float, dtype: str):
    """(largest representable <= t, smallest representable > t) in dtype, as float32/64."""
    grid = {"float64": None, "float32": np.float32, "float16": np.float16}
    if dtype == "bfloat16":
        bits = np.array([np.float32(t)], np.float32).view(np.uint32)[0] & 0xFFFF0000
        cand = np.array([bits - 0x10000, bits, bits + 0x10000, bits + 0x20000], np.uint32).view(np.float32)
        below = cand[cand <= t].max()
        above = cand[cand > t].min()
        return float(below), float(above)
    ty = grid[dtype] or np.float64
    v = ty(t)
    below = v if float(v) <= t else np.nextafter(v, ty(-np.inf))
    if dtype == "float64":  # t itself is a rounded threshold: decide with the exact value
        import mpmath

        fmt = fp.FORMATS["float64"]
        with mpmath.workdps(40):
            exact = {round(float(e), 6): e for e in (
                mpmath.log(mpmath.mpf(2) ** fmt.emax * (2 - mpmath.mpf(2) ** -fmt.p)),
                mpmath.log(mpmath.mpf(2) ** fmt.emin),
                mpmath.log(mpmath.mpf(2) ** (fmt.emin - fmt.p)))}[round(t, 6)]
            if mpmath.mpf(float(below)) > exact:
                below = np.nextafter(below, -np.inf)
    above = np.nextafter(below, ty(np.inf))
    return below, above


@pytest.mark.parametrize("dtype", fp.DTYPES)
def test_thresholds_match_real_dtype(dtype):
    th = fp.thresholds(dtype)
    fmt = fp.FORMATS[dtype]
    if dtype == "float64":
        real_exp = lambda t: np.exp(np.float64(t))  # noqa: E731
    elif dtype == "float32":
        real_exp = lambda t: np.exp(np.float32(t))  # noqa: E731
    elif dtype == "float16":
        real_exp = lambda t: np.exp(np.float16(t))  # noqa: E731
    else:
        real_exp = lambda t: torch.exp(torch.tensor(float(t)).to(torch.bfloat16)).item()  # noqa: E731
    with np.errstate(over="ignore", under="ignore"):
        b, a = _neighbours(th.exp_overflow, dtype)
        assert math.isfinite(float(real_exp(b))) and math.isinf(float(real_exp(a)))
        b, a = _neighbours(th.exp_subnormal, dtype)
        assert 0 < float(real_exp(b)) < fmt.tiny <= float(real_exp(a))
        b, a = _neighbours(th.exp_underflow_to_zero, dtype)
        assert float(real_exp(b)) == 0.0 and float(real_exp(a)) > 0.0
        # our emulated exp agrees at the same boundary values
        if dtype != "float64":
            for t in _neighbours(th.exp_overflow, dtype) + _neighbours(th.exp_underflow_to_zero, dtype):
                ours = float(fp._exp_vec(np.array([t], np.float32), fp._CODE[dtype])[0])
                assert ours == float(real_exp(t)) or (math.isinf(ours) and math.isinf(float(real_exp(t))))


def test_thresholds_known_values():
    th = fp.thresholds("float32")
    assert abs(th.exp_overflow - 88.72283908) < 1e-8
    assert abs(th.exp_subnormal + 87.33654475) < 1e-8
    assert abs(th.exp_underflow_to_zero + 103.9720771) < 1e-7
    assert th.n_sum_stagnates == 2 ** 24
    assert abs(fp.thresholds("float16").exp_overflow - 11.09011) < 1e-5
    assert abs(fp.thresholds("bfloat16").exp_underflow_to_zero + 92.88172) < 1e-5
    # a sequential float32 sum of ones really stagnates at 2^24; float16 at 2048
    s = np.float32(2 ** 24)
    assert s + np.float32(1) == s and np.float32(2 ** 24 - 1) + np.float32(1) == s
    h = np.float16(2048)
    assert h + np.float16(1) == h
    f16 = fp.thresholds("float16")
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float16(f16.n_sum_finite))
        assert np.isinf(np.float16(f16.n_sum_finite + 1))


def test_bad_input_raises():
    with pytest.raises(ValueError, match="algorithm"):
        fp.softmax([1.0], "nope")
    with pytest.raises(ValueError, match="dtype"):
        fp.error_bound(3, dtype="int8")
    with pytest.raises(ValueError, match="finite"):
        fp.softmax([1.0, np.nan])
    with pytest.raises(ValueError, match="n must"):
        fp.error_bound(0)
    with pytest.raises(ValueError, match="score_range"):
        fp.error_bound(3, score_range=-1.0)
    with pytest.raises(ValueError, match="overflows"):
        fp.softmax([1e6], dtype="float16")


def test_formats_use_the_constants_of_kernels_floating():
    from softcert.kernels import floating

    for name, u, q in (("float64", floating.U64, floating.SUBNORMAL_ULP),
                       ("float32", floating.U32, floating.Q32),
                       ("float16", floating.U16, floating.Q16),
                       ("bfloat16", floating.UBF16, floating.QBF16)):
        assert fp.FORMATS[name].u == u and fp.FORMATS[name].q == q
    assert fp.F16_MAX == 65504.0 and fp.BF16_MAX == float.fromhex("0x1.fep127")


def test_softmax_reads_a_tensor_on_any_device_and_refuses_a_meta_one():
    import torch

    from softcert.analysis import fp as fp_mod

    x = torch.tensor([0.5, -1.0, 2.0])
    np.testing.assert_array_equal(fp_mod.softmax(x), fp_mod.softmax(x.numpy()))  # the same emulation
    with pytest.raises(ValueError, match="meta"):
        fp_mod.softmax(torch.zeros(3, device="meta"))
