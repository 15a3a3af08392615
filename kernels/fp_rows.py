"""Per-row a-posteriori FP32 softmax error bounds over a tensor of score rows (..., n).

For each row (entries = -inf are masked keys and do not count): n = #finite entries, m = max,
R = m - min, E = E_p[m - x] (p = softmax of the row, float64). With the constants of
:func:`analysis.fp.error_bound` (u = U32 = 2^-24, exp accurate to k ulp, u_e = 2ku, K_u roundings
and K_e exps per normaliser term), the argument-rounding constant is

    L = min(ln n / (1 - u), R, E_up * exp(u (R + ln n / (1 - u))))

(the last form because the mean-value path p(t) differs from p by at most that factor), and

    max_i |p_hat_i - p_i| / max_i p_i <= rel(L) + B_hi g(min(R, d*)) + n floor,

g(d) = e^{-d}(e^{ud} - 1), increasing up to d* = -ln(1-u)/u ~ 1,

a normwise bound that uses only quantities a kernel already has. The measured error is the
FP32 three-pass softmax of the row (the same arithmetic as analysis.fp three_pass) against a
float64 reference (relative error <= ~(n + 4) 2^-53, far below u). E is rounded up in the
float64 model of kernels.floating: weights carry EXP_REL plus the rounding of d = m - x
(<= 746 U64 where the weight is nonzero), and EXP_ABS·d absolutely below the normal range.
No fastmath; bounds are evaluated in float64 and rounded up by a relative margin of 2^-40.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numba
import numpy as np

from softcert.kernels.floating import (
    EXP_ABS,
    EXP_ULPS,
    Q32,
    SUBNORMAL_ULP,
    TRITON_CPU_EXP32_ULPS,
    U32,
    U64,
)
from softcert.kernels.threads import caller_threads

ALGO_CODES = {"three_pass": 0, "online": 1, "tree": 2}


@numba.njit(cache=True)
def _row_bound(n, R, E, u, ue, q, algo):
    if n <= 1:
        return 0.0 if n == 1 else np.nan
    if algo == 0:
        K_u, K_e, steps, k_out = n - 1, 1, 0, 1
    elif algo == 1:
        K_u, K_e, steps, k_out = 2 * (n - 1), n, n - 1, 2
    else:
        depth = 0
        while (1 << depth) < n:
            depth += 1
        K_u, K_e, steps, k_out = 2 * depth, depth, 2 * (n - 1), 1
    if K_u * u >= 1.0 or K_e * ue >= 1.0:
        return np.inf
    lnn = math.log(n) / (1.0 - u)
    L = min(lnn, R)
    if E * math.exp(u * (R + lnn)) < L:
        L = E * math.exp(u * (R + lnn))
    P_hi = math.exp(K_u * math.log1p(u) + K_e * math.log1p(ue))
    P_lo = math.exp(K_u * math.log1p(-u) + K_e * math.log1p(-ue))
    k_ulp = ue / (2.0 * u)
    eta_e = k_ulp * q
    eta_S = P_hi * (n * eta_e + steps * (n * P_hi * eta_e + q))
    S_hi = math.exp(u * L) * P_hi + eta_S
    S_lo = math.exp(-u * L) * P_lo - eta_S
    if S_lo <= 0:
        return np.inf
    B_hi = (1.0 + ue) * (1.0 + u) ** k_out / S_lo
    B_lo = (1.0 - ue) * (1.0 - u) ** k_out / S_hi
    rel = max(B_hi - 1.0, 1.0 - B_lo)
    d = min(R, -math.log1p(-u) / u)  # g(d) = e^{-d}(e^{ud}-1) increases up to this d
    g = math.exp(-d) * math.expm1(u * d)
    # absolute underflow floor, relative to p_max = 1/Z >= 1/n
    floor = n * (eta_e * (1.0 + u) ** k_out / S_lo + k_out * q * (1.0 + ue) * 2.0)
    return (rel + B_hi * g + floor) * (1.0 + 2.0 ** -40)


@numba.njit(parallel=True, cache=True)
def rows_bound_and_error(x, u, ue, q, algo, measure):
    """x: float32 (rows, n). Returns (n, max, range, E_p[m-x], bound, measured) per row."""
    rows, ncol = x.shape
    nn = np.zeros(rows, np.int64)
    mm = np.empty(rows)
    rr = np.empty(rows)
    ee = np.empty(rows)
    bb = np.empty(rows)
    meas = np.full(rows, np.nan)
    for r in numba.prange(rows):
        m = -np.inf
        lo = np.inf
        cnt = 0
        for j in range(ncol):
            v = x[r, j]
            if v > -np.inf:
                cnt += 1
                if v > m:
                    m = v
                if v < lo:
                    lo = v
        nn[r] = cnt
        mm[r] = m
        R = np.float64(m) - np.float64(lo)
        rr[r] = R
        # float64 pass: Z and E_p[d]; the measured error needs the same exps
        z = 0.0
        zd = 0.0
        for j in range(ncol):
            v = x[r, j]
            if v > -np.inf:
                d = np.float64(m) - np.float64(v)
                e = math.exp(-d)
                z += e
                zd += e * d
        # z >= 1 (the maximum's weight is exp(0) = 1): absolute errors need no division
        E = zd / z * (1.0 + (4.0 * (cnt + 10) + 2.0 * (EXP_ULPS + 748)) * U64) \
            + cnt * (EXP_ABS * R + SUBNORMAL_ULP)
        ee[r] = E
        bb[r] = _row_bound(cnt, R, E, u, ue, q, algo)
        if measure:
            # FP32 three-pass softmax of the row, compared with the float64 reference
            s32 = np.float32(0.0)
            for j in range(ncol):
                v = x[r, j]
                if v > -np.inf:
                    s32 = s32 + np.float32(math.exp(v - m))
            worst = 0.0
            for j in range(ncol):
                v = x[r, j]
                if v > -np.inf:
                    y32 = np.float32(math.exp(v - m)) / s32
                    p = math.exp(np.float64(v) - np.float64(m)) / z
                    err = abs(np.float64(y32) - p)
                    if err > worst:
                        worst = err
            meas[r] = worst * z  # divided by p_max = 1/z
    return nn, mm, rr, ee, bb, meas


@numba.njit(cache=True)
def bounds_from_stats(nn, rr, z, zd, u, ue, q, algo):
    """(E_p[m-x] rounded up, bound) per row from the float64 sums z = Σ e^{-d} and
    zd = Σ d e^{-d} computed in any order elsewhere (the Triton kernel); the same inflation
    as ``rows_bound_and_error``."""
    rows = nn.shape[0]
    ee = np.empty(rows)
    bb = np.empty(rows)
    for r in range(rows):
        cnt = nn[r]
        R = rr[r]
        E = zd[r] / z[r] * (1.0 + (4.0 * (cnt + 10) + 2.0 * (EXP_ULPS + 748)) * U64) \
            + cnt * (EXP_ABS * R + SUBNORMAL_ULP)
        ee[r] = E
        bb[r] = _row_bound(cnt, R, E, u, ue, q, algo)
    return ee, bb


@dataclass(frozen=True)
class RowsReport:
    """Per-row a-posteriori bounds (normwise, relative to max p) and measured FP32 errors."""

    n: np.ndarray
    max: np.ndarray
    range: np.ndarray
    mean_gap: np.ndarray  # E_p[m - x]
    bound: np.ndarray
    measured: np.ndarray
    algorithm: str
    exp_ulps: float


def rows_report(scores, algorithm: str = "three_pass", exp_ulps: float = 1.0,
                measure: bool = True, backend: str = "numba") -> RowsReport:
    """Bounds and measured FP32 errors for every row of ``scores`` (..., n); -inf = masked.

    ``algorithm`` selects the constants of the bound; ``measured`` is always the FP32
    three-pass arithmetic (so compare it with the three_pass bound). ``backend``: "numba"
    or "triton" (``kernels.triton_fp_rows``; its FP32 exps are the interpreter's on a CPU,
    so ``exp_ulps`` is raised to at least TRITON_CPU_EXP32_ULPS there)."""
    if backend not in ("numba", "triton"):
        raise ValueError(f"backend: expected 'numba' or 'triton', got {backend!r}")
    if algorithm not in ALGO_CODES:
        raise ValueError(f"algorithm must be one of {tuple(ALGO_CODES)}, got {algorithm!r}")
    x = np.asarray(scores)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"scores must have shape (..., n) with n >= 1, got {x.shape}")
    x = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("scores must not contain NaN or +inf")
    if not np.all(np.isfinite(x).any(axis=1)):
        raise ValueError("scores: every row needs at least one finite (unmasked) entry")
    if backend == "triton":
        from softcert.kernels.triton_fp_rows import row_stats_triton

        exp_ulps = max(exp_ulps, TRITON_CPU_EXP32_ULPS)
        nn, mm, rr, z, zd, meas = row_stats_triton(x, measure)
        ee, bb = bounds_from_stats(nn, rr, z, zd, U32, 2 * exp_ulps * U32, Q32,
                                   ALGO_CODES[algorithm])
        out = (nn, mm.astype(np.float64), rr, ee, bb, meas)
    else:
        with caller_threads():
            out = rows_bound_and_error(x, U32, 2 * exp_ulps * U32, Q32, ALGO_CODES[algorithm],
                                       measure)
    shape = np.asarray(scores).shape[:-1]
    return RowsReport(*(a.reshape(shape) for a in out), algorithm, exp_ulps)


def throughput_ratio(scores, repeats: int = 3) -> dict:
    """Seconds of the bound kernel (with and without the measured error) per float32 softmax
    pass (torch, 1 thread) over the same tensor: the ratio is what the bound costs."""
    import torch

    x = np.ascontiguousarray(np.asarray(scores, dtype=np.float32).reshape(-1, np.shape(scores)[-1]))
    t = torch.from_numpy(x)
    rows_report(x[:2])  # compile
    u = U32

    def best(f):
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    with caller_threads():
        threads = numba.get_num_threads()
        numba.set_num_threads(1)  # same single thread as the torch baseline
    # outside the guards: the torch baseline runs with the caller's torch threads
    base = best(lambda: torch.softmax(t, dim=-1))
    with caller_threads():
        b_only = best(lambda: rows_bound_and_error(x, u, 2 * u, Q32, 0, False))
        b_meas = best(lambda: rows_bound_and_error(x, u, 2 * u, Q32, 0, True))
        numba.set_num_threads(threads)
    return {"softmax_s": base, "bound_s": b_only, "bound_and_measure_s": b_meas,
            "bound_ratio": b_only / base, "bound_and_measure_ratio": b_meas / base,
            "threads": 1}
