"""kernels.fp_rows: the per-row a-posteriori bound covers the measured FP32 error, and the
kernel's measured error agrees with analysis.fp three_pass against an mpmath reference."""
from __future__ import annotations

import inspect

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from softcert.analysis import fp
from softcert.kernels import fp_rows


def _rows(rng):
    x = (rng.standard_normal((3, 4, 40, 64)) * np.array([0.5, 5, 50])[:, None, None, None])
    x = x.astype(np.float32)
    x[1, :, :, 50:] = -np.inf  # masked keys
    x[2, 0, 0, :] = 0.0
    x[2, 0, 0, 0] = 1.0  # constant-term stress row
    x[2, 0, 1, :] = np.sort(x[2, 0, 1, :])
    return x


def test_bound_covers_measured(rng):
    x = _rows(rng)
    rep = fp_rows.rows_report(x)
    assert rep.bound.shape == x.shape[:-1]
    assert np.all(rep.measured <= rep.bound)
    assert np.all(rep.n[1] == 50) and np.all(rep.n[0] == 64)
    # a posteriori never worse than the a priori normwise form of error_bound
    b = fp.error_bound(64, "three_pass", "float32")
    assert np.all(rep.bound[0] <= b.rel + b.abs_floor * 64)


def test_bound_covers_long_adversarial_rows(rng):
    n = 20_000
    xs = fp.stress_inputs(n, rng, ("const_stress", "equal", "ascending", "wide"))
    x = np.stack([fp.round_array(v, "float32") for v in xs.values()])
    bounds = {a: fp_rows.rows_report(x, algorithm=a).bound for a in fp_rows.ALGO_CODES}
    assert all(np.all(np.isfinite(b)) for b in bounds.values())
    assert np.all(bounds["tree"] < bounds["three_pass"]) and np.all(
        bounds["three_pass"] < bounds["online"])
    rep = fp_rows.rows_report(x)  # measured = FP32 three-pass arithmetic
    assert np.all(rep.measured <= rep.bound)
    assert rep.measured[0] > 0.05 * rep.bound[0]  # const_stress: the bound is not vacuous


def test_kernel_agrees_with_analysis_fp(rng):
    x = _rows(rng)
    rep = fp_rows.rows_report(x)
    for idx in [(0, 0, 0), (1, 2, 3), (2, 0, 0), (2, 0, 1), (2, 3, 39)]:
        row = x[idx]
        row = row[np.isfinite(row)]
        y = fp.softmax(row, "three_pass", "float32")
        p = fp.reference_softmax(row)
        expect = np.max(np.abs(y.astype(np.float64) - p)) / p.max()
        assert rep.measured[idx] == pytest.approx(expect, rel=1e-6, abs=1e-12)
        d = float(row.max()) - row.astype(np.float64)
        assert rep.mean_gap[idx] == pytest.approx(float(np.sum(p * d)), rel=1e-9, abs=1e-300)


def test_bad_rows():
    with pytest.raises(ValueError, match="scores"):
        fp_rows.rows_report(np.full((2, 3), -np.inf))
    with pytest.raises(ValueError, match="NaN"):
        fp_rows.rows_report(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="algorithm"):
        fp_rows.rows_report(np.zeros((1, 3)), algorithm="x")


@given(st.lists(st.one_of(st.floats(-760.0, -700.0, width=32), st.floats(-3.0, 0.0, width=32)),
                min_size=1, max_size=20))
def test_mean_gap_is_an_upper_bound_with_subnormal_weights(tail):
    # weights exp(x - m) below the normal range are off by up to EXP_ABS each (times m - x)
    row = np.array([0.0] + tail, dtype=np.float32)
    with mpmath.workdps(50):
        w = [mpmath.exp(mpmath.mpf(float(x))) for x in row]
        exact = mpmath.fsum(wi * (-mpmath.mpf(float(x))) for wi, x in zip(w, row)) / mpmath.fsum(w)
    rep = fp_rows.rows_report(row[None, :])
    assert exact <= rep.mean_gap[0] <= exact * (1 + 1e-12) + 1e-318


def test_mean_gap_reported_subnormal_case():
    # exp(-744.1) = 1.405 q (q = 2^-1074) rounds to q: E_p[m - x] was under-estimated by 29 %
    row = np.array([[0.0, -744.1]], dtype=np.float32)
    with mpmath.workdps(50):
        e = mpmath.exp(mpmath.mpf(float(row[0, 1])))
        exact = e * -mpmath.mpf(float(row[0, 1])) / (1 + e)
    assert exact <= fp_rows.rows_report(row).mean_gap[0]


def test_row_kernel_takes_its_format_constants_from_kernels_floating():
    from softcert.kernels import floating

    assert "2.0 ** -24" not in inspect.getsource(fp_rows)
    assert "2.0 ** -149" not in inspect.getsource(fp_rows)
    assert floating.U32 == 2.0 ** -24 and floating.Q32 == 2.0 ** -149
