"""FlashAttention-style FP32 attention (blocked online softmax with the value accumulation)
and its a-posteriori forward-error bound, per output element. Numba; array in, array out.

Per query row (FlashAttention-2 order): for each tile of ``block`` keys, scores
s_j = fl(fl(q·k_j) ĉ) in float32 (ĉ = float32(1/sqrt(d))), m' = max(m, max_tile s),
on a max increase the carry is rescaled by α = exp(m - m') (l <- l α, W <- W α), then the
tile sums l_t = Σ p_j, W_t = Σ p_j v_j with p_j = exp(s_j - m') are added to the carry;
out = W / l. Every operation is float32 (expf through Numba's ``math.exp`` on float32).

The bound (derivation in docs/fp/attention.md; ``analysis.fp.attention`` documents the API):
with M = max_j ŝ_j, x_j = M - ŝ_j, w_j = e^{-x_j}, L = Σ w_j >= 1, R the rescale count,
T tiles, K = min(block, n) + 2T - 1 roundings per term and
ρ_j = (1 + u_e)^{1+R} (1 + u)^K e^{u x_j} - 1,

    Z = Σ w_j ρ_j,  N_c = Σ w_j ρ_j |v_jc|,  A_c = Σ w_j |v_jc| / L,  ζ = (Z + a)/L,
    D_c = (N_c + a + A_c (Z + a)) / (L (1 - ζ)),
    |out_c - O_c| <= D_c + u (A_c + D_c) + q + (S_c + φ A_c) / (1 - φ),

S_c = Σ w_j (e^{e_j} - 1) |v_jc| / L and φ = Σ w_j (e^{e_j} - 1) / L, where e_j bounds the
score error |ŝ_j - q·k_j/sqrt(d)|: measured against a float64 reference s64_j (exact
products, so |s64_j - s_j| <= (d + 4) u64 |q|·|k_j| / sqrt(d)) plus (d + 2) q for underflow;
a the absolute underflow terms. The sums run in float64 and are inflated by 2^-30 (their own
relative error is below 800 u64 + γ64_n, far less, for n <= 2^20). No fastmath anywhere.

Masks (docs/fp/attention.md, section 7): a masked key is skipped (never scored, never added),
so a row is the unmasked algorithm over its n_row attended keys, with tiles still cut at
multiples of ``block`` of the key index. Every n above is then n_row, T the number of tiles
holding an attended key and min(block, n) the largest number b of attended keys in one tile:
K = b + 2T - 1. Causal rows (key j <= query i, torch's top-left convention) are the prefix
j < min(i + 1, n). A row with no attended key returns out = 0, bound = 0 (torch's convention).
"""
from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads, njit, prange

from softcert.kernels.threads import caller_threads

#: the smallest normal float64: below it exp's result has no relative error bound
FLOAT64_TINY = 2.0 ** -1022
#: float64 sums of the bound are inflated by this relative margin (see the module docstring)
SUM_MARGIN = 2.0 ** -30
#: the float64 margins above are proved for rows of at most this many keys
MAX_KEYS = 2 ** 20


@njit(cache=True)
def _attends(mrow, j):
    """Key j takes part: ``mrow`` is a uint8 row of the mask, empty for no mask."""
    return mrow.shape[0] == 0 or mrow[j] != 0


@njit(cache=True)
def _mask_row(mask, g, i):
    """Row (g, i) of a (1 or G, 1 or nq, n or 0) uint8 mask (size-1 axes broadcast)."""
    return mask[g if mask.shape[0] > 1 else 0, i if mask.shape[1] > 1 else 0]


@njit(cache=True)
def _tile_scores(q, k, mrow, t0, t1, scale, s_buf, m):
    """Scores of the attended keys of one tile into s_buf; returns (tile max with m, count)."""
    d = k.shape[1]
    mt = m
    count = 0
    for j in range(t0, t1):
        if not _attends(mrow, j):
            continue
        dot = np.float32(0.0)
        for i in range(d):
            dot = dot + q[i] * k[j, i]
        s = dot * scale
        s_buf[j] = s
        count += 1
        if s > mt:
            mt = s
    return mt, count


@njit(cache=True)
def _row(q, k, v, mrow, nlim, block, scale, s_buf, acc, wt, out):
    """The float32 forward pass of one query row over its attended keys j < nlim (a tile
    without one is skipped); returns (M, rescales). No attended key: out = 0, M = -inf."""
    dv = v.shape[1]
    m = np.float32(-np.inf)
    ell = np.float32(0.0)
    zero = np.float32(0.0)
    rescales = 0
    for c in range(dv):
        acc[c] = zero
    for t0 in range(0, nlim, block):
        t1 = min(t0 + block, nlim)
        mt, count = _tile_scores(q, k, mrow, t0, t1, scale, s_buf, m)
        if count == 0:
            continue
        if m > -np.inf and mt > m:  # an earlier tile was added: rescale it
            alpha = math.exp(m - mt)
            ell = ell * alpha
            for c in range(dv):
                acc[c] = acc[c] * alpha
            rescales += 1
        lt = zero
        for c in range(dv):
            wt[c] = zero
        for j in range(t0, t1):
            if not _attends(mrow, j):
                continue
            p = math.exp(s_buf[j] - mt)
            lt = lt + p
            for c in range(dv):
                wt[c] = wt[c] + p * v[j, c]
        ell = ell + lt
        for c in range(dv):
            acc[c] = acc[c] + wt[c]
        m = mt
    for c in range(dv):  # ell >= 1 (or NaN: overflow, caught by the caller) once attended
        out[c] = acc[c] / ell if ell != zero else zero
    return m, rescales


@njit(cache=True)
def _row_counts(mrow, nlim, block):
    """(n_row, T, b): attended keys, tiles holding one, most attended keys in one tile."""
    n_row, tiles, most = 0, 0, 0
    for t0 in range(0, nlim, block):
        count = 0
        for j in range(t0, min(t0 + block, nlim)):
            if _attends(mrow, j):
                count += 1
        n_row += count
        tiles += 1 if count > 0 else 0
        most = max(most, count)
    return n_row, tiles, most


@njit(cache=True)
def _beyond_normal(e, x):
    """An upper bound of w (e^e - 1), w = e^{-x}, where float64 w is below the normal range
    (x > 708): w's relative error is unbounded there and e^e may exceed 1/w (a score error
    e_j of hundreds: cancellation in q·k_j), so the term is bounded by e^(e - x), the
    rounding of e - x charged in the exponent (docs/fp/attention.md, section 4)."""
    return math.exp(e - x + 2.0 ** -50 * (e + x)) * (1.0 + 2.0 ** -50)


@njit(cache=True)
def _row_bound(q, k, v, mrow, nlim, s_buf, big_m, rescales, block, u, ue, q32, nsum, asum,
               ssum, bound):
    """The a-posteriori bound of one row (float64; see the module docstring): n, T and the
    tile length are the row's own (``_row_counts``); no attended key: bound 0 (out is 0)."""
    d = k.shape[1]
    dv = v.shape[1]
    n, tiles, most = _row_counts(mrow, nlim, block)
    if n == 0:
        for c in range(dv):
            bound[c] = 0.0
        return
    kk = most + 2 * tiles - 1
    c1 = (1 + rescales) * math.log1p(ue) + kk * math.log1p(u)
    inv_sqrt_d = 1.0 / math.sqrt(d)
    # |fl64(fl64(q·k) fl64(1/sqrt d)) - q·k/sqrt d| <= (d + 4) u64 |q|·|k| / sqrt d (1.01)
    ref_rel = (d + 4) * 2.0 ** -53 * 1.01
    mm = np.float64(big_m)
    zsum, lsum, phi = 0.0, 0.0, 0.0
    vmax = 0.0
    for c in range(dv):
        nsum[c] = 0.0
        asum[c] = 0.0
        ssum[c] = 0.0
    for j in range(nlim):
        if not _attends(mrow, j):
            continue
        x = mm - np.float64(s_buf[j])
        w = math.exp(-x)
        # w = 0 (x > 745): w ρ <= e^{-(1-u) x} P is below 2^-1060, charged by ``tiny``
        wr = w * math.expm1(c1 + u * x) if w > 0.0 else 0.0
        zsum += wr
        lsum += w
        dot, a = 0.0, 0.0
        for i in range(d):
            t = np.float64(q[i]) * np.float64(k[j, i])  # exact: float32 products fit
            dot += t
            a += abs(t)
        # the score error, measured against a float64 reference whose own error is bounded
        e = abs(np.float64(s_buf[j]) - dot * inv_sqrt_d) * (1.0 + 2.0 ** -50)
        e += a * inv_sqrt_d * ref_rel + (d + 2) * q32
        if w >= FLOAT64_TINY:
            we = w * (math.expm1(e) * (1.0 + 2.0 ** -50))
        else:
            we = _beyond_normal(e, x)
        phi += we
        for c in range(dv):
            av = abs(np.float64(v[j, c]))
            nsum[c] += wr * av
            asum[c] += w * av
            ssum[c] += we * av
            vmax = max(vmax, av)
    up = 1.0 + SUM_MARGIN
    # float64 weights below the normal range: n terms of at most 2^-1060 each, per unit |v|
    tiny = n * 2.0 ** -1060
    zsum = zsum * up + tiny
    ell = max(1.0, lsum * (1.0 - SUM_MARGIN))  # the max entry has weight e^0 = 1
    # float32 underflow: every operation of the row may lose (k + 1) q (k = exp ulps)
    # instead of its relative error, amplified at most by n (the largest carry)
    n_ops = 3 * n + 4 * tiles
    under = 1.02 * n_ops * (ue / (2 * u) + 1) * q32 * n
    zeta = (zsum + under) / ell
    phi = (phi * up + tiny) / ell
    if not (zeta < 0.5 and phi < 0.5):
        for c in range(dv):
            bound[c] = np.inf
        return
    for c in range(dv):
        a_c = (asum[c] * up + tiny * vmax) / ell
        n_c = nsum[c] * up + tiny * vmax + under * max(vmax, 1.0)
        d_c = (n_c + a_c * (zsum + under)) / (ell * (1.0 - zeta))
        s_c = (ssum[c] * up + tiny * vmax) / ell
        b = d_c + u * (a_c + d_c) + q32 + (s_c + phi * a_c) / (1.0 - phi)
        bound[c] = b * up


@njit(cache=True, parallel=True)
def attention_rows(q, k, v, mask, causal, block, scale, u, ue, q32, out, bound, rescale_out,
                   chunks):
    """out (G, nq, dv) float32 and bound (G, nq, dv) float64 for q (G, nq, d), k (G, n, d),
    v (G, n, dv) float32 and a uint8 ``mask`` (see ``_mask_row``); rows run in parallel."""
    g_count, nq, _ = q.shape
    n = k.shape[1]
    dv = v.shape[2]
    rows = g_count * nq
    for ch in prange(chunks):
        s_buf = np.empty(n, dtype=np.float32)
        acc = np.empty(dv, dtype=np.float32)
        wt = np.empty(dv, dtype=np.float32)
        nsum = np.empty(dv)
        asum = np.empty(dv)
        ssum = np.empty(dv)
        for r in range(ch * rows // chunks, (ch + 1) * rows // chunks):
            g = r // nq
            i = r - g * nq
            mrow = _mask_row(mask, g, i)
            nlim = min(i + 1, n) if causal else n
            big_m, rescales = _row(q[g, i], k[g], v[g], mrow, nlim, block, scale, s_buf, acc,
                                   wt, out[g, i])
            rescale_out[g, i] = rescales
            if bound.shape[0] > 0:
                _row_bound(q[g, i], k[g], v[g], mrow, nlim, s_buf, big_m, rescales, block, u,
                           ue, q32, nsum, asum, ssum, bound[g, i])


def kernel_mask(mask) -> np.ndarray:
    """The kernels' mask: uint8 (1 or G, 1 or nq, n) from a bool mask already broadcast to
    that shape by the caller; None gives (1, 1, 0), which attends every key."""
    if mask is None:
        return np.zeros((1, 1, 0), dtype=np.uint8)
    return np.ascontiguousarray(mask, dtype=np.uint8)


def flash_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block: int, u: float,
                    ue: float, q32: float, with_bound: bool = True, mask=None,
                    causal: bool = False):
    """(out float32 (G, nq, dv), bound float64 (G, nq, dv), rescales int64 (G, nq)).

    Inputs validated by the caller: float32, finite, q (G, nq, d), k (G, n, d), v (G, n, dv),
    1 <= n <= MAX_KEYS; ``mask`` None or bool (1 or G, 1 or nq, n), True = attend;
    ``causal``: row i attends keys j <= i. ``u``, ``ue``, ``q32``: unit roundoff, exp
    relative error and the smallest subnormal of the format.
    Without ``with_bound`` the bound array is empty (timing of the forward pass alone).
    """
    q, k, v = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))
    g_count, nq, d = q.shape
    scale = np.float32(1.0 / math.sqrt(d))
    out = np.empty((g_count, nq, v.shape[2]), dtype=np.float32)
    bound = np.empty(out.shape if with_bound else (0, nq, v.shape[2]), dtype=np.float64)
    rescales = np.zeros((g_count, nq), dtype=np.int64)
    with caller_threads():  # numba.get_num_threads() starts the threading layer too
        chunks = max(1, min(g_count * nq, 8 * get_num_threads()))
        attention_rows(q, k, v, kernel_mask(mask), bool(causal), int(block), scale, u, ue, q32,
                       out, bound, rescales, chunks)
    return out, bound, rescales


@njit(cache=True, parallel=True)
def _bound_rows(q, k, v, mask, causal, scores, big_m, rescales, block, u, ue, q32, bound,
                chunks):
    g_count, nq, _ = q.shape
    n = k.shape[1]
    dv = v.shape[2]
    rows = g_count * nq
    for ch in prange(chunks):
        nsum = np.empty(dv)
        asum = np.empty(dv)
        ssum = np.empty(dv)
        for r in range(ch * rows // chunks, (ch + 1) * rows // chunks):
            g = r // nq
            i = r - g * nq
            nlim = min(i + 1, n) if causal else n
            _row_bound(q[g, i], k[g], v[g], _mask_row(mask, g, i), nlim, scores[g, i],
                       big_m[g, i], rescales[g, i], block, u, ue, q32, nsum, asum, ssum,
                       bound[g, i])


def attention_bound(q, k, v, scores, big_m, rescales, block: int, u: float, ue: float,
                    q32: float, mask=None, causal: bool = False) -> np.ndarray:
    """The bound of the module docstring for a forward pass run elsewhere (the Triton kernel):
    its float32 scores (G, nq, n), final running max (G, nq) and rescale counts (G, nq), with
    the same ``mask``/``causal`` as ``flash_attention`` (scores of masked keys are not read).
    Valid for any kernel with this algorithm's structure (any order inside a tile, a tile
    without an attended key adds exact zeros)."""
    q, k, v, scores = (np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v, scores))
    big_m = np.ascontiguousarray(big_m, dtype=np.float32)
    rescales = np.ascontiguousarray(rescales, dtype=np.int64)
    bound = np.empty((q.shape[0], q.shape[1], v.shape[2]))
    with caller_threads():
        chunks = max(1, min(q.shape[0] * q.shape[1], 8 * get_num_threads()))
        _bound_rows(q, k, v, kernel_mask(mask), bool(causal), scores, big_m, rescales,
                    int(block), u, ue, q32, bound, chunks)
    return bound
