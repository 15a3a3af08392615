"""Numba backend of the top-k truncation certificates (``analysis.topk`` with backend="numba").

Array in, array out: score rows (..., n) as float64 arrays or CPU tensors, already validated by
``analysis.topk`` (no NaN, no +inf, no fully masked row, integer k >= 0). The error model and
its constants live here and in ``kernels.floating``; the torch path of ``analysis.topk``
imports them, so both backends prove the same enclosure. They may differ in the last bits
(different exp implementations and summation orders), never in soundness.

Error model (Higham 2002, §2.2, with gradual underflow). A weight w = exp(s - m) is computed
as fl(exp(fl(s - m))) with |ŵ - w| <= RHO_WEIGHT·w + EXP_ABS: the absolute part covers
results below the normal range. Tail sums carry γ_n, products count·weight a relative u or
an absolute SUBNORMAL_ULP/2, quotients likewise. In a block bound a weight stands for a whole block,
so its absolute error is multiplied by the block size: the slack is EXP_ABS·Σ|B| + nb·SUBNORMAL_ULP.

- ``certified_k_numba(scores, eps)`` -> (k, tail_upper) per row (full sort per row);
  ``certify_rows_numba`` also returns the lower bound of τ_{k-1} and n_valid.
- ``tail_mass_numba(scores, k, rounding)`` -> τ_k per row ("nearest", "up", "down").
- ``gap_bound_numba(scores, k)`` -> single-gap bound; two order statistics by selection
  (np.partition, O(n)) instead of a sort.
- ``multi_gap_bound_numba(scores, k, levels)`` -> rank-group bound (sorted rows).
- ``blockwise_bound_numba(head_lower, head_sizes, tail_upper, tail_sizes)`` -> block bound.
No fastmath (it would license reassociation and void the error model); rows run in parallel.
"""
from __future__ import annotations

import math

import numba
import numpy as np
import torch

from softcert.kernels.floating import EXP_ABS, RHO_WEIGHT, SUBNORMAL_ULP, U64, gamma
from softcert.kernels.threads import caller_threads

ROUNDING_MODES = {"nearest": 0, "up": 1, "down": 2}


def tail_constants(n: int) -> tuple[float, float]:
    """(c, A) of the outward rounding of τ = T/Z for rows of length n.

    T <= (T̃/(1-γ_n) + n·EXP_ABS)/(1-ρ) and Z >= (Z̃/(1+γ_n) - n·EXP_ABS)/(1+ρ) with Z̃ >= 1
    (the maximum's weight is exp(0) = 1), and T̃/Z̃ <= q̃/(1-u) + SUBNORMAL_ULP/2 (a subnormal quotient).
    So τ <= q̃·c + A with c = 1 + 2.001(γ_{n+1} + ρ) + 5u and A = 2(n·EXP_ABS + SUBNORMAL_ULP); the
    final nextafter covers the roundings of q̃·c + A. τ >= q̃/c - A mirrors it.
    """
    eta = 2.001 * (gamma(n + 1) + RHO_WEIGHT) + U64
    return 1.0 + (eta + 4 * U64), 2.0 * (n * EXP_ABS + SUBNORMAL_ULP)


def block_constants(nb: int) -> tuple[float, float, float, float]:
    """(c_sum, c_den, c_ratio, c_abs) of the block bound with nb blocks (see _blockwise)."""
    eta = RHO_WEIGHT + gamma(nb + 2) + 2 * U64  # exp + argument, size product, sum
    return (1.0 + ((eta + 2 * U64) + 4 * U64), 1.0 + 4 * U64, 1.0 + 6 * U64,
            1.0 + gamma(nb + 2) + 4 * U64)


@numba.njit(cache=True)
def block_abs(total_size, nb, c_abs):
    """A >= EXP_ABS·N + nb·SUBNORMAL_ULP/2, N = the real Σ of block sizes (total_size = its fl-sum).

    Each block weight is off by EXP_ABS absolutely, times its size; each product
    size·weight that lands below the normal range is off by SUBNORMAL_ULP/2. c_abs covers the sum of
    the sizes (γ_nb) and this formula's own roundings (the extra SUBNORMAL_ULP: a subnormal product).
    Works on floats and on arrays of row totals.
    """
    N = np.nextafter(total_size * c_abs, np.inf)
    return np.nextafter((EXP_ABS * N + (nb + 1) * SUBNORMAL_ULP) * c_abs, np.inf)


# --------------------------------------------------------------------------- conversion
def _rows(scores) -> tuple[np.ndarray, tuple]:
    s = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    s = np.asarray(s, dtype=np.float64)
    batch = tuple(s.shape[:-1])
    return np.ascontiguousarray(s.reshape(-1, s.shape[-1])), batch


def _ks(k, batch) -> np.ndarray:
    kt = k.detach().cpu().numpy() if isinstance(k, torch.Tensor) else np.asarray(k)
    return np.ascontiguousarray(np.broadcast_to(kt.astype(np.int64), batch).reshape(-1))


def _blocks(x, batch) -> np.ndarray:
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    a = np.broadcast_to(np.asarray(a, dtype=np.float64), batch + a.shape[-1:])
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]))


# --------------------------------------------------------------------------- row helpers
@numba.njit(cache=True)
def _sorted_tail(row, v, w, T):
    """Fill v (descending), w = exp(v - v0), T[k] = Σ_{i>=k} w_i from the smallest; n_valid."""
    n = row.shape[0]
    asc = np.sort(row)
    for i in range(n):
        v[i] = asc[n - 1 - i]
    m = v[0]
    nv = 0
    for i in range(n):
        w[i] = math.exp(v[i] - m)
        if v[i] > -np.inf:
            nv += 1
    acc = 0.0
    T[n] = 0.0
    for i in range(n - 1, -1, -1):
        acc = acc + w[i]
        T[i] = acc
    return nv


@numba.njit(cache=True)
def _tau(Tk, Z, k, nv, c, A, mode):
    """mode 0 nearest, 1 up, 2 down: q̃ = T̃_k/Z̃, q̃·c + A rounded up, q̃/c - A rounded down."""
    if k <= 0:
        return 1.0
    if k >= nv:
        return 0.0
    q = Tk / Z
    if mode == 1:
        r = np.nextafter(q * c + A, np.inf)
        return 1.0 if r > 1.0 else r
    if mode == 2:
        r = np.nextafter(q / c - A, -np.inf)
        return 0.0 if r < 0.0 else r
    return q


@numba.njit(parallel=True, cache=True)
def _certified_k_rows(S, eps, c, A, k_out, up_out, lo_prev_out, nv_out):
    B, n = S.shape
    for b in numba.prange(B):
        v = np.empty(n)
        w = np.empty(n)
        T = np.empty(n + 1)
        nv = _sorted_tail(S[b], v, w, T)
        Z = T[0]
        k = 0
        for j in range(n + 1):
            if _tau(T[j], Z, j, nv, c, A, 1) > eps:
                k += 1
            else:
                break  # τ⁺ is non-increasing in k
        k_out[b] = k
        nv_out[b] = nv
        up_out[b] = _tau(T[k], Z, k, nv, c, A, 1)
        lo_prev_out[b] = _tau(T[k - 1], Z, k - 1, nv, c, A, 2) if k >= 1 else 1.0


@numba.njit(parallel=True, cache=True)
def _tail_mass_rows(S, K, c, A, mode, out):
    B, n = S.shape
    for b in numba.prange(B):
        v = np.empty(n)
        w = np.empty(n)
        T = np.empty(n + 1)
        nv = _sorted_tail(S[b], v, w, T)
        k = K[b]
        out[b] = _tau(T[min(k, n)], T[0], k, nv, c, A, mode)


@numba.njit(cache=True)
def _blockwise(L, nh, U, nt, cs, cd, cr, ca):
    """τ <= Σ_T|B|e^{U_b} / (Σ_H|B|e^{L_b} + Σ_T|B|e^{U_b}) for one row, rounded up.

    With M the largest present bound, S̃ = fl-sums of fl(|B|·exp(x_b - M)) and A = block_abs:
    S_T <= (S̃_T + A)(1+η) and S_H >= (S̃_H - A)/(1+η), η = ρ + γ_{nb+2} + 2u (+ roundings);
    then the quotient is rounded up. Sizes 0 mark absent blocks.
    """
    M = -np.inf
    for i in range(L.shape[0]):
        if nh[i] > 0 and L[i] > M:
            M = L[i]
    for i in range(U.shape[0]):
        if nt[i] > 0 and U[i] > M:
            M = U[i]
    ST = 0.0
    total = 0.0
    for i in range(U.shape[0]):
        x = U[i] if nt[i] > 0 else -np.inf
        ST = ST + nt[i] * math.exp(x - M)
        total = total + nt[i]
    SH = 0.0
    for i in range(L.shape[0]):
        x = L[i] if nh[i] > 0 else -np.inf
        SH = SH + nh[i] * math.exp(x - M)
        total = total + nh[i]
    A = block_abs(total, L.shape[0] + U.shape[0], ca)
    ST = np.nextafter((ST + A) * cs, np.inf)
    SH = SH - A
    if SH < 0.0:
        SH = 0.0
    SH = np.nextafter(SH / cs, -np.inf)
    if SH < 0.0:
        SH = 0.0
    den = np.nextafter((SH + ST) / cd, -np.inf)
    if den < 0.0:
        den = 0.0
    r = np.nextafter((ST / den) * cr, np.inf)
    return 1.0 if r > 1.0 else r


@numba.njit(parallel=True, cache=True)
def _blockwise_rows(L, NH, U, NT, cs, cd, cr, ca, out):
    for b in numba.prange(L.shape[0]):
        out[b] = _blockwise(L[b], NH[b], U[b], NT[b], cs, cd, cr, ca)


@numba.njit(parallel=True, cache=True)
def _gap_rows(S, K, cs, cd, cr, ca, out):
    B, n = S.shape
    for b in numba.prange(B):
        row = S[b]
        nv = 0
        for i in range(n):
            if row[i] > -np.inf:
                nv += 1
        k = K[b]
        if k <= 0:
            out[b] = 1.0
            continue
        if k >= nv:
            out[b] = 0.0
            continue
        # s_(k) = element n-k of the ascending order; s_(k+1) = the largest below it
        part = np.partition(row, n - k)
        sk = part[n - k]
        sk1 = -np.inf
        for i in range(n - k):
            if part[i] > sk1:
                sk1 = part[i]
        L = np.empty(1)
        U = np.empty(1)
        nh = np.empty(1)
        nt = np.empty(1)
        L[0] = sk
        U[0] = sk1
        nh[0] = float(k)
        nt[0] = float(nv - k)
        out[b] = _blockwise(L, nh, U, nt, cs, cd, cr, ca)


@numba.njit(parallel=True, cache=True)
def _multi_gap_rows(S, K, levels, cs, cd, cr, ca, out):
    B, n = S.shape
    for b in numba.prange(B):
        asc = np.sort(S[b])
        nv = 0
        for i in range(n):
            if asc[i] > -np.inf:
                nv += 1
        k = min(K[b], nv)
        if k <= 0:
            out[b] = 1.0
            continue
        if k >= nv:
            out[b] = 0.0
            continue
        ntail = nv - k
        L = np.empty(levels)
        U = np.empty(levels)
        nh = np.empty(levels)
        nt = np.empty(levels)
        for j in range(levels):
            h0 = (k * j) // levels
            h1 = (k * (j + 1)) // levels
            t0 = k + (ntail * j) // levels
            t1 = k + (ntail * (j + 1)) // levels
            nh[j] = float(h1 - h0)
            nt[j] = float(t1 - t0)
            # descending rank r is asc[n - 1 - r]
            L[j] = asc[n - 1 - max(h1 - 1, 0)]
            U[j] = asc[n - 1 - min(t0, n - 1)]
        out[b] = _blockwise(L, nh, U, nt, cs, cd, cr, ca)


# --------------------------------------------------------------------------- public API
def certify_rows_numba(scores, eps: float):
    """(k, tail_upper, tail_lower_prev, n_valid) per row: k = least k with τ⁺_k <= ε,
    tail_lower_prev <= τ_{k-1} (1 at k = 0). Inputs validated by the caller."""
    S, batch = _rows(scores)
    c, A = tail_constants(S.shape[1])
    B = S.shape[0]
    k, nv = np.empty(B, dtype=np.int64), np.empty(B, dtype=np.int64)
    up, lo = np.empty(B), np.empty(B)
    with caller_threads():
        _certified_k_rows(S, float(eps), c, A, k, up, lo, nv)
    return tuple(torch.from_numpy(a).reshape(batch) for a in (k, up, lo, nv))


def certified_k_numba(scores, eps: float):
    """(k, tail_upper) per row: the least k with outward-rounded τ⁺_k <= ε (int64, float64)."""
    k, up, _, _ = certify_rows_numba(scores, eps)
    return k, up


def tail_mass_numba(scores, k, rounding: str = "nearest") -> torch.Tensor:
    """τ_k per row; ``rounding`` "nearest", "up" (proved >= τ) or "down" (proved <= τ)."""
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding: expected 'up', 'down' or 'nearest', got {rounding!r}")
    S, batch = _rows(scores)
    K = _ks(k, batch)
    c, A = tail_constants(S.shape[1])
    out = np.empty(S.shape[0])
    with caller_threads():
        _tail_mass_rows(S, K, c, A, ROUNDING_MODES[rounding], out)
    return torch.from_numpy(out).reshape(batch)


def gap_bound_numba(scores, k) -> torch.Tensor:
    """Single-gap bound on τ_k by O(n) selection of s_(k), s_(k+1) (rounded up)."""
    S, batch = _rows(scores)
    K = _ks(k, batch)
    out = np.empty(S.shape[0])
    with caller_threads():
        _gap_rows(S, K, *block_constants(2), out)
    return torch.from_numpy(out).reshape(batch)


def multi_gap_bound_numba(scores, k, levels: int = 4) -> torch.Tensor:
    """Rank-group bound with ``levels`` groups on each side (rounded up)."""
    if int(levels) != levels or levels < 1:
        raise ValueError(f"levels: expected a positive integer, got {levels!r}")
    S, batch = _rows(scores)
    K = _ks(k, batch)
    out = np.empty(S.shape[0])
    with caller_threads():
        _multi_gap_rows(S, K, int(levels), *block_constants(2 * int(levels)), out)
    return torch.from_numpy(out).reshape(batch)


def blockwise_bound_numba(head_lower, head_sizes, tail_upper, tail_sizes) -> torch.Tensor:
    """Block bound per row; bounds and sizes broadcast to (..., bh) and (..., bt), the batch
    shapes of head and tail equal (validated by the caller). Sizes 0 mark absent blocks."""
    L, U = np.asarray(head_lower), np.asarray(tail_upper)
    batch = tuple(L.shape[:-1])
    Lr, NH = _blocks(head_lower, batch), _blocks(head_sizes, batch)
    Ur, NT = _blocks(tail_upper, batch), _blocks(tail_sizes, batch)
    out = np.empty(Lr.shape[0])
    with caller_threads():
        _blockwise_rows(Lr, NH, Ur, NT, *block_constants(L.shape[-1] + U.shape[-1]), out)
    return torch.from_numpy(out).reshape(batch)
