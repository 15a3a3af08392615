"""The a-posteriori attention bound of ``kernels.attention``, evaluated by torch float64 tensor
ops on the device the tensors are on (the Triton kernel's scores never leave the GPU).

The formula is ``_row_bound`` in kernels/attention.py (derivation: docs/fp/attention.md,
sections 2-5 and 7), per query row over its attended keys J (n = |J|, T tiles of ``block``
keys holding one, b the most attended keys in one tile, R rescales, K = b + 2T - 1):

    x_j = M - ŝ_j, w_j = e^{-x_j}, ρ_j = (1 + u_e)^{1+R} (1 + u)^K e^{u x_j} - 1,
    Z = Σ w_j ρ_j, L = max(1, Σ w_j), N_c = Σ w_j ρ_j |v_jc|, A_c = Σ w_j |v_jc| / L,
    e_j = |ŝ_j - s64_j| (1 + 2^-50) + a_j (d + 4) u64 1.01 / sqrt d + (d + 2) q,
    φ = Σ w_j (e^{e_j} - 1) / L, S_c = Σ w_j (e^{e_j} - 1) |v_jc| / L,
    |out_c - O_c| <= D_c + u (A_c + D_c) + q + (S_c + φ A_c) / (1 - φ),
    D_c = (N_c + a + A_c (Z + a)) / (L (1 - ζ)), ζ = (Z + a) / L,

with the underflow term a, the float64 underflow charge n 2^-1060 per unit |v| for w_j = 0
(x_j > 745) in Z and N_c, e^{e_j - x_j} for w_j (e^{e_j} - 1) where w_j is below the normal range and every sum inflated by ``SUM_MARGIN`` exactly as there; ζ or φ >= 1/2 gives
inf, a row with no attended key gives 0 (its out is 0).

How the float64 evaluation differs from Numba's, and why the same margins cover it:

- The reference scores are GEMMs: s64 = (q64 @ k64ᵀ) fl64(1/sqrt d), a = |q64| @ |k64|ᵀ.
  Products of float32 numbers are exact in float64, so any summation order, FMAs included,
  leaves |fl64(q·k) - q·k| <= γ_d |q|·|k| (Higham, Thm 3.5): with the three roundings of
  1/sqrt d and the product, ref_rel = (d + 4) u64 · 1.01 covers every order.
- The sums over keys (Z, L, φ, N_c = wr @ |v|, A_c, S_c) are float64 reductions and GEMMs of
  any order: γ64_n <= n u64 <= 2^-33 for n <= ``MAX_KEYS`` = 2^20, plus each term's own error
  (below 800 u64), far inside ``SUM_MARGIN`` = 2^-30.

Assumed of the device: float64 arithmetic and GEMMs IEEE with round to nearest in any order
(no emulated or reduced-precision float64 GEMM: ``softcert gpu-check`` tests it), float64
exp/expm1 within 2 ulp (CUDA documents 1). Rows run in chunks of at most ``CHUNK_ELEMENTS``
(rows x keys) float64 entries per temporary; nothing is copied to the host.
"""
from __future__ import annotations

import math

import torch

from softcert.kernels.attention import FLOAT64_TINY, MAX_KEYS, SUM_MARGIN

#: float64 entries (rows x keys) per temporary of one chunk (512 MiB; a chunk keeps ~5 alive)
CHUNK_ELEMENTS = 2 ** 26
#: relative rounding of the score-error terms themselves (as in ``_row_bound``)
_SLACK = 1.0 + 2.0 ** -50


def _check(q, k, v, scores, big_m, rescales, block, mask):
    """ValueError naming the first argument whose shape, dtype or device does not fit."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"q, k, v: expected 3-D (G, rows, dim), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    g_count, nq, d = q.shape
    n = k.shape[1]
    want = {"k": (g_count, n, d), "v": (g_count, n, v.shape[2]), "scores": (g_count, nq, n),
            "big_m": (g_count, nq), "rescales": (g_count, nq)}
    for name, x in (("q", q), ("k", k), ("v", v), ("scores", scores), ("big_m", big_m),
                    ("rescales", rescales)):
        if name in want and tuple(x.shape) != want[name]:
            raise ValueError(f"{name}: expected shape {want[name]}, got {tuple(x.shape)}")
        if name != "rescales" and x.dtype != torch.float32:  # float32 products: exact in float64
            raise ValueError(f"{name}: expected float32, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, q on {q.device}")
    if not 1 <= n <= MAX_KEYS:
        raise ValueError(f"k: {n} keys, 1 to {MAX_KEYS} are supported (the bound's margins)")
    if int(block) != block or block < 1:
        raise ValueError(f"block: must be a positive integer, got {block}")
    if mask is not None and (mask.dtype != torch.bool or mask.ndim != 3 or mask.shape[2] != n
                             or mask.shape[0] not in (1, g_count) or mask.shape[1] not in (1, nq)):
        raise ValueError(f"mask: expected bool (1 or {g_count}, 1 or {nq}, {n}), got "
                         f"{mask.dtype} {tuple(mask.shape)}")


def _chunks(g_count: int, nq: int, n: int, budget: int = CHUNK_ELEMENTS):
    """(head slice, row slice) pairs covering (G, nq), each at most ``CHUNK_ELEMENTS`` rows
    x n entries (at least one row): whole heads when one fits, else row ranges of one head."""
    if nq * n <= budget:
        step = max(1, budget // (nq * n))
        for g0 in range(0, g_count, step):
            yield slice(g0, min(g0 + step, g_count)), slice(0, nq)
        return
    step = max(1, budget // n)
    for g in range(g_count):
        for i0 in range(0, nq, step):
            yield slice(g, g + 1), slice(i0, min(i0 + step, nq))


def _attended(mask, causal: bool, heads: slice, rows: slice, n: int, device):
    """Bool (h or 1, r or 1, n) of the attended keys of the chunk, None when every key is."""
    if causal:  # key j <= query i (top-left)
        i = torch.arange(rows.start, rows.stop, device=device)
        return (torch.arange(n, device=device)[None, :] <= i[:, None])[None]
    if mask is None:
        return None
    return mask[heads if mask.shape[0] > 1 else slice(0, 1),
                rows if mask.shape[1] > 1 else slice(0, 1)]


def row_counts(att, n: int, block: int, device):
    """(n_row, T, b) float64, broadcastable to the chunk's (heads, rows): attended keys,
    tiles of ``block`` keys (cut at multiples of ``block`` of the key index) holding one,
    the most attended keys in one tile; ``kernels.attention._row_counts`` for every row."""
    if att is None:
        full = [float(n), float(-(-n // block)), float(min(block, n))]
        return tuple(torch.full((1, 1), x, dtype=torch.float64, device=device) for x in full)
    tiles = -(-n // block)
    padded = torch.nn.functional.pad(att.to(torch.int32), (0, tiles * block - n))
    counts = padded.reshape(att.shape[:-1] + (tiles, block)).sum(-1)
    return (counts.sum(-1).double(), (counts > 0).sum(-1).double(),
            counts.amax(-1).double())


def _only(x, att):
    """x where the key is attended, 0 elsewhere (masked entries may hold inf or NaN)."""
    return x if att is None else torch.where(att, x, 0.0)


def _score_error_factor(q, k, s, w, x, att, q32: float):
    """w_j (e^{e_j} - 1) over the attended keys (e_j: the module docstring); where float64
    w_j is below the normal range (x_j > 708) the upper bound e^(e_j - x_j) instead, the
    rounding of e_j - x_j charged in the exponent (``kernels.attention._beyond_normal``)."""
    d = q.shape[-1]
    q64, k64 = q.double(), k.double()
    inv_sqrt_d = 1.0 / math.sqrt(d)
    ref_rel = (d + 4) * 2.0 ** -53 * 1.01  # any order and FMAs: γ_d plus 1/sqrt d's roundings
    e = (s - (q64 @ k64.transpose(-1, -2)) * inv_sqrt_d).abs() * _SLACK
    e += (q64.abs() @ k64.abs().transpose(-1, -2)) * inv_sqrt_d * ref_rel + (d + 2) * q32
    beyond = torch.exp(e - x + 2.0 ** -50 * (e + x)) * _SLACK
    return _only(torch.where(w >= FLOAT64_TINY, w * (torch.expm1(e) * _SLACK), beyond), att)


def _finish(sums, vmax, n_row, tiles, u: float, ue: float, q32: float):
    """The bound from the chunk's float64 sums (``_row_bound``'s last lines)."""
    zsum, lsum, phi, nsum, asum, ssum = sums
    up = 1.0 + SUM_MARGIN
    tiny = n_row * 2.0 ** -1060  # n terms of w = 0 in float64, each below 2^-1060
    zsum = zsum * up + tiny
    ell = torch.clamp(lsum * (1.0 - SUM_MARGIN), min=1.0)  # the max entry has weight 1
    under = 1.02 * (3 * n_row + 4 * tiles) * (ue / (2 * u) + 1) * q32 * n_row  # float32 underflow
    zeta = (zsum + under) / ell
    phi = (phi * up + tiny) / ell
    ok = (zeta < 0.5) & (phi < 0.5)  # False on NaN too: inf
    zsum, ell, under, zeta, phi, tiny, vmax = (x[..., None] for x in (zsum, ell, under, zeta,
                                                                       phi, tiny, vmax))
    a_c = (asum * up + tiny * vmax) / ell
    n_c = nsum * up + tiny * vmax + under * torch.clamp(vmax, min=1.0)
    d_c = (n_c + a_c * (zsum + under)) / (ell * (1.0 - zeta))
    s_c = (ssum * up + tiny * vmax) / ell
    b = (d_c + u * (a_c + d_c) + q32 + (s_c + phi * a_c) / (1.0 - phi)) * up
    b = torch.where(ok[..., None], b, math.inf)
    return torch.where(n_row[..., None] > 0, b, 0.0)  # no attended key: out = O = 0


def _chunk_bound(q, k, v, s, big_m, rescales, att, block: int, u: float, ue: float, q32: float):
    """(h, r, dv) bound of one chunk: q (h, r, d), k (h, n, d), v (h, n, dv), s (h, r, n)."""
    n = k.shape[1]
    n_row, tiles, most = row_counts(att, n, block, q.device)
    s = s.double()
    x = big_m.double()[..., None] - s  # NaN or inf on masked keys: never read (_only)
    w = _only(torch.exp(-x), att)
    c1 = (1 + rescales.double()) * math.log1p(ue) + (most + 2 * tiles - 1) * math.log1p(u)
    # w = 0 (x > 745): w ρ <= e^{-(1-u) x} P is below 2^-1060, charged by ``tiny``
    wr = torch.where(w > 0, w * torch.expm1(c1[..., None] + u * x), 0.0)
    we = _score_error_factor(q, k, s, w, x, att, q32)
    del x
    vabs = v.double().abs()
    vrow = vabs.amax(-1)[:, None, :]  # (h, 1, n)
    vmax = vrow.amax(-1) if att is None else torch.where(att, vrow, 0.0).amax(-1)
    sums = (wr.sum(-1), w.sum(-1), we.sum(-1), wr @ vabs, w @ vabs, we @ vabs)
    return _finish(sums, vmax, n_row, tiles, u, ue, q32)


def attention_bound_torch(q, k, v, scores, big_m, rescales, block: int, u: float, ue: float,
                          q32: float, mask=None, causal: bool = False,
                          chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """float64 (G, nq, dv) bound on q's device for a forward pass run elsewhere (the Triton
    kernel): q (G, nq, d), k (G, n, d), v (G, n, dv) float32 torch tensors, its float32
    ``scores`` (G, nq, n) (masked keys are not read), final running max ``big_m`` (G, nq) and
    rescale counts ``rescales`` (G, nq), keys in tiles of ``block``; ``mask`` None or bool
    (1 or G, 1 or nq, n), True = attend; ``causal``: keys j <= i. ``u``, ``ue``, ``q32``: unit
    roundoff, exp relative error and smallest subnormal of float32. The same bound as
    ``kernels.attention.attention_bound`` (module docstring), valid for any kernel of that
    algorithm's structure. ``chunk_elements``: rows x keys per chunk (memory, not the value)."""
    _check(q, k, v, scores, big_m, rescales, block, mask)
    g_count, nq, _ = q.shape
    n, dv = k.shape[1], v.shape[2]
    bound = torch.empty((g_count, nq, dv), dtype=torch.float64, device=q.device)
    for heads, rows in _chunks(g_count, nq, n, chunk_elements):
        att = _attended(mask, bool(causal), heads, rows, n, q.device)
        bound[heads, rows] = _chunk_bound(q[heads, rows], k[heads], v[heads], scores[heads, rows],
                                          big_m[heads, rows], rescales[heads, rows], att,
                                          int(block), u, ue, q32)
    return bound
