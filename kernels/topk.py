"""Numba kernels for top-k truncation certificates over (..., keys) score tensors.

Same arithmetic, operation for operation, as the torch reference ``analysis.topk`` (see its
docstring for the error analysis), so the results agree bit for bit: rows sorted descending,
w = exp(s - max) with the C library's exp (numpy's float64 ``exp`` calls the same function),
tail sums accumulated from the smallest weight, the same outward-rounding constants. No
fastmath (it would license reassociation and break the bound); rows run in parallel.

- ``certified_k_numba(scores, eps)`` -> (k, tail_upper) per row (full sort per row).
- ``tail_mass_numba(scores, k, rounding)`` -> τ_k per row ("nearest", "up", "down").
- ``gap_bound_numba(scores, k)`` -> single-gap bound; needs only two order statistics, found
  by selection (np.partition, O(n)) instead of a sort.
- ``multi_gap_bound_numba(scores, k, levels)`` -> rank-group bound (sorted rows).
"""
from __future__ import annotations

import math

import numba
import numpy as np
import torch

from bounds._box import validate_scores
from kernels.floating import EXP_REL, TINY, U64, gamma

RHO_WEIGHT = EXP_REL + 747 * U64 * 1.001  # must equal analysis.topk.RHO_WEIGHT (tested)


def tail_constants(n: int) -> tuple[float, float]:
    """(c, A) of the tail-mass rounding for rows of length n (as analysis.topk._TailModel)."""
    eta = 2.001 * (gamma(n + 1) + RHO_WEIGHT) + U64
    return 1.0 + (eta + 4 * U64), 4.0 * n * TINY


def block_constants(nb: int) -> tuple[float, float, float, float]:
    """(c_sum, c_den, c_ratio, abs) of blockwise_bound for nb blocks."""
    eta = RHO_WEIGHT + gamma(nb + 2) + 2 * U64
    return (1.0 + ((eta + 2 * U64) + 4 * U64), 1.0 + (0.0 + 4 * U64),
            1.0 + (2 * U64 + 4 * U64), nb * TINY)


# --------------------------------------------------------------------------- validation
def _rows(scores, name="scores") -> tuple[np.ndarray, tuple]:
    s = validate_scores(scores, name)
    batch = tuple(s.shape[:-1])
    return np.ascontiguousarray(s.reshape(-1, s.shape[-1]).numpy()), batch


def _ks(k, batch) -> np.ndarray:
    kt = torch.as_tensor(k)
    if kt.is_floating_point() or kt.is_complex() or kt.dtype == torch.bool:
        raise ValueError(f"k: expected integer key counts, got dtype {kt.dtype}")
    if (kt < 0).any():
        raise ValueError("k: must be >= 0")
    try:
        kt = kt.to(torch.int64).expand(batch)
    except RuntimeError:
        raise ValueError(f"k: shape {tuple(kt.shape)} does not broadcast to {batch}") from None
    return np.ascontiguousarray(kt.reshape(-1).numpy())


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
    """mode 0 nearest, 1 up, 2 down (the formulas of analysis.topk._tail_from_sums)."""
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
def _certified_k_rows(S, eps, c, A, k_out, up_out):
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
        up_out[b] = _tau(T[k], Z, k, nv, c, A, 1)


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
def _blockwise(L, nh, U, nt, cs, cd, cr, ab):
    """The arithmetic of analysis.topk.blockwise_bound for one row (sizes 0 = absent)."""
    M = -np.inf
    for i in range(L.shape[0]):
        if nh[i] > 0 and L[i] > M:
            M = L[i]
    for i in range(U.shape[0]):
        if nt[i] > 0 and U[i] > M:
            M = U[i]
    ST = 0.0
    for i in range(U.shape[0]):
        x = U[i] if nt[i] > 0 else -np.inf
        ST = ST + nt[i] * math.exp(x - M)
    SH = 0.0
    for i in range(L.shape[0]):
        x = L[i] if nh[i] > 0 else -np.inf
        SH = SH + nh[i] * math.exp(x - M)
    ST = np.nextafter((ST + ab) * cs, np.inf)
    SH = SH - ab
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
def _gap_rows(S, K, cs, cd, cr, ab, out):
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
        out[b] = _blockwise(L, nh, U, nt, cs, cd, cr, ab)


@numba.njit(parallel=True, cache=True)
def _multi_gap_rows(S, K, levels, cs, cd, cr, ab, out):
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
        out[b] = _blockwise(L, nh, U, nt, cs, cd, cr, ab)


# --------------------------------------------------------------------------- public API
def certified_k_numba(scores, eps):
    """(k, tail_upper) per row: the least k with outward-rounded τ⁺_k <= ε (int64, float64)."""
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps: expected a number in (0, 1), got {eps!r}") from None
    if not (0.0 < e < 1.0):
        raise ValueError(f"eps: must lie strictly inside (0, 1), got {eps!r}")
    S, batch = _rows(scores)
    c, A = tail_constants(S.shape[1])
    k = np.empty(S.shape[0], dtype=np.int64)
    up = np.empty(S.shape[0])
    _certified_k_rows(S, e, c, A, k, up)
    return torch.from_numpy(k).reshape(batch), torch.from_numpy(up).reshape(batch)


def tail_mass_numba(scores, k, rounding: str = "nearest") -> torch.Tensor:
    """τ_k per row; ``rounding`` "nearest", "up" (proved >= τ) or "down" (proved <= τ)."""
    modes = {"nearest": 0, "up": 1, "down": 2}
    if rounding not in modes:
        raise ValueError(f"rounding: expected 'up', 'down' or 'nearest', got {rounding!r}")
    S, batch = _rows(scores)
    K = _ks(k, batch)
    c, A = tail_constants(S.shape[1])
    out = np.empty(S.shape[0])
    _tail_mass_rows(S, K, c, A, modes[rounding], out)
    return torch.from_numpy(out).reshape(batch)


def gap_bound_numba(scores, k) -> torch.Tensor:
    """Single-gap bound on τ_k by O(n) selection of s_(k), s_(k+1) (rounded up)."""
    S, batch = _rows(scores)
    K = _ks(k, batch)
    out = np.empty(S.shape[0])
    _gap_rows(S, K, *block_constants(2), out)
    return torch.from_numpy(out).reshape(batch)


def multi_gap_bound_numba(scores, k, levels: int = 4) -> torch.Tensor:
    """Rank-group bound with ``levels`` groups on each side (rounded up)."""
    if int(levels) != levels or levels < 1:
        raise ValueError(f"levels: expected a positive integer, got {levels!r}")
    S, batch = _rows(scores)
    K = _ks(k, batch)
    out = np.empty(S.shape[0])
    _multi_gap_rows(S, K, int(levels), *block_constants(2 * int(levels)), out)
    return torch.from_numpy(out).reshape(batch)
