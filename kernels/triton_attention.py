"""Triton FlashAttention-style FP32 forward, tiled: the algorithm of ``kernels.attention``.

Imported only when ``backend="triton"`` is asked for. Without a CUDA device Triton runs in
interpreter mode (TRITON_INTERPRET=1, set by ``kernels.triton_math``) on CPU tensors.

One program per tile of ``BLOCK_M`` query rows of one head (grid (cdiv(nq, BLOCK_M), G)); it
walks the keys in tiles of exactly ``block`` keys (cut at multiples of ``block`` of the key
index, as the bound's T and b assume), padded to BLOCK_N = next power of two >= max(16, block)
keys (tl.dot needs tile dimensions >= 16; padded keys are masked out). Per row, in
FlashAttention-2 order (docs/fp/attention.md, sections 1-2):

    s_j = fl(fl(q·k_j) ĉ)                 tl.dot(q, kᵀ, input_precision="ieee") times ĉ
    m'  = max(m, max_tile s)              on m' > m with m finite: α = exp(m - m'), R += 1
    p_j = exp(s_j - m')                   masked keys: s = -inf, p = 0 exactly
    l_t = Σ p_j, W_t = tl.dot(p, v, ieee) computed separately, then
    ell = ell α + l_t, acc = acc α + W_t   (the carry is never fed into the dot: the proof
                                           counts K = b + 2T - 1 roundings per term)
    out = acc / ell (IEEE division, tl.math.div_rn); 0 on a row with no attended key.

Any summation order inside a tile (the dot's, tl.sum's) is covered by the bound, FMAs
included; adding an exact zero (a padded or masked key, zero-padded head dimensions) is
exact. TF32 is not: ``input_precision="ieee"`` keeps the dots in float32. The kernel is
compiled with ``enable_fp_fusion=False`` so that the compiler cannot contract fl(dot · ĉ)
into the exponent's subtraction (fma(dot, ĉ, -m')): the bound is computed from the scores
the kernel stores, which must be the ones it exponentiated. Its ``exp`` is
``kernels.triton_math.exp``: libdevice's expf when compiled (tl.exp's ex2.approx is 62 ulp
off there), numpy's in the interpreter; the caller passes the assumed accuracy of the one
that runs (``kernels.floating.triton_exp32_ulps``).

The kernel writes out, its float32 scores (G, nq, n) (-inf where masked; left unwritten in
the key tiles a causal program skips, which hold no attended key), the final running max and
the rescale count per row; the bound is evaluated from them on the same device by
``kernels.attention_torch.attention_bound_torch`` (the formula of ``kernels.attention``).
"""
from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():  # read when triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from softcert.kernels.attention_torch import attention_bound_torch  # noqa: E402
from softcert.kernels.triton_math import exp, interpreted, kernel_device, libdevice_exp  # noqa: E402

#: query rows per program, compiled, for key tiles up to 128 (the default ``block``): each
#: K/V tile read from memory serves 64 rows (the old kernel read it once per row), while a
#: 64 x 128 float32 score tile, its exps and a 64 x dv accumulator fit the registers of 8
#: warps and two stages of K/V tiles fit the shared memory (the ieee float32 dot runs on the
#: CUDA cores' FMAs, not on tensor cores: larger tiles only add register and shared-memory
#: pressure). Wider key tiles get fewer rows (``_configs``). Not yet timed on a GPU.
BLOCK_M_COMPILED = 64
#: in the interpreter every program is a Python loop of numpy calls: few, large programs are
#: faster, and 16 still pads the dot's smallest dimension
BLOCK_M_INTERPRETED = 32


@triton.jit
def _tile_attended(mask_ptr, g, rows, live, offs, inside, mask_g, mask_i,
                   HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """(BLOCK_M, BLOCK_N) attended keys: a row < nq (``live``), a key inside the tile and
    the key range, True in the mask (row stride ``mask_i``, head stride ``mask_g``; 0 along
    broadcast axes), j <= i when causal."""
    att = live[:, None] & inside[None, :]
    if HAS_MASK:
        mk = tl.load(mask_ptr + g * mask_g + rows[:, None] * mask_i + offs[None, :],
                     mask=att, other=0)
        att = att & (mk != 0)
    if CAUSAL:
        att = att & (offs[None, :] <= rows[:, None])
    return att


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, s_ptr, m_ptr, r_ptr, nq, n, d,
                      dv, mask_g, mask_i, scale, block, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, D_P: tl.constexpr, DV_P: tl.constexpr,
                      HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, LIBDEVICE: tl.constexpr):
    g = tl.program_id(1).to(tl.int64)  # int64 offsets: G nq n may exceed 2^31
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < nq
    dims = tl.arange(0, D_P)
    vdims = tl.arange(0, DV_P)
    keys = tl.arange(0, BLOCK_N)
    # padded head dimensions are 0 in q and k: exact zero products
    qt = tl.load(q_ptr + (g * nq + rows[:, None]) * d + dims[None, :],
                 mask=live[:, None] & (dims[None, :] < d), other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    ell = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, DV_P), tl.float32)
    rescales = tl.zeros((BLOCK_M,), tl.int32)
    hi = n
    if CAUSAL:  # later tiles hold no key j <= i for these rows: they would add exact zeros
        hi = tl.minimum(n, tl.program_id(0) * BLOCK_M + BLOCK_M)
    for t0 in range(0, hi, block):
        offs = t0 + keys
        inside = (keys < block) & (offs < n)  # the tile is exactly `block` keys
        kt = tl.load(k_ptr + (g * n + offs[:, None]) * d + dims[None, :],
                     mask=inside[:, None] & (dims[None, :] < d), other=0.0)
        s = tl.dot(qt, tl.trans(kt), input_precision="ieee") * scale
        att = _tile_attended(mask_ptr, g, rows, live, offs, inside, mask_g, mask_i, HAS_MASK, CAUSAL)
        s = tl.where(att, s, float("-inf"))
        tl.store(s_ptr + (g * nq + rows[:, None]) * n + offs[None, :], s,
                 mask=live[:, None] & inside[None, :])
        mt = tl.maximum(m, tl.max(s, axis=1))
        # a rescale of an earlier tile's sums: m is finite once a tile held an attended key
        grow = (mt > m) & (m > float("-inf"))
        # -inf - -inf never reaches exp: the running max is read as 0 until a key is attended
        mt_f = tl.where(mt > float("-inf"), mt, 0.0)
        alpha = tl.where(grow, exp(tl.where(grow, m, mt_f) - mt_f, LIBDEVICE), 1.0)
        rescales += grow.to(tl.int32)
        p = tl.where(att, exp(s - mt_f[:, None], LIBDEVICE), 0.0)  # masked keys: exactly 0
        vt = tl.load(v_ptr + (g * n + offs[:, None]) * dv + vdims[None, :],
                     mask=inside[:, None] & (vdims[None, :] < dv), other=0.0)
        lt = tl.sum(p, axis=1)
        wt = tl.dot(p, vt, input_precision="ieee")  # not tl.dot(p, vt, acc): see docstring
        ell = ell * alpha + lt  # alpha = 1, lt = 0 on a tile without an attended key: exact
        acc = acc * alpha[:, None] + wt
        m = mt
    # ell >= 1 (or NaN: overflow, caught by the caller) once a key is attended, else 0
    seen = ell != 0.0
    res = tl.where(seen[:, None],
                   tl.math.div_rn(acc, tl.where(seen, ell, 1.0)[:, None]), 0.0)
    tl.store(out_ptr + (g * nq + rows[:, None]) * dv + vdims[None, :], res,
             mask=live[:, None] & (vdims[None, :] < dv))
    tl.store(m_ptr + g * nq + rows, m, mask=live)
    tl.store(r_ptr + g * nq + rows, rescales, mask=live)


def _mask_args(mask, n: int, device):
    """(tensor, head stride, row stride): the uint8 mask (1 or G, 1 or nq, n) on ``device``,
    broadcast axes read with stride 0; a one-element dummy without a mask."""
    if mask is None:
        return torch.zeros(1, dtype=torch.uint8, device=device), 0, 0
    m = torch.as_tensor(mask).to(device=device, dtype=torch.uint8).contiguous()
    rows = m.shape[1]
    return m, rows * n if m.shape[0] > 1 else 0, n if rows > 1 else 0


def _padded(x: int) -> int:
    """A tile dimension for tl.dot: a power of two, at least 16."""
    return max(16, triton.next_power_of_2(int(x)))


def _configs(block_m: int | None, block_n: int):
    """(BLOCK_M, num_stages) to try in turn; the first whose shared memory fits the device is
    launched. Compiled: 64 rows (fewer beyond 128-key tiles: a score tile of at most 8192
    floats) with 2 stages of K/V prefetch, then 1 stage, then half the rows, down to 16
    (measured in PTX for sm_90, d = 64: 112 KB at 64 x 128 keys and 2 stages, 176 KB at 3).
    The interpreter: one config (``BLOCK_M_INTERPRETED``; stages mean nothing there)."""
    if block_m is not None:
        yield from ((block_m, s) for s in (2, 1))
        return
    if interpreted():
        yield BLOCK_M_INTERPRETED, 1
        return
    rows = max(16, min(BLOCK_M_COMPILED, 8192 // block_n))
    while rows >= 16:
        yield from ((rows, s) for s in (2, 1))
        rows //= 2


def _launch(args, nq: int, g_count: int, block: int, block_m: int | None, **consts):
    """Launches the kernel with the first config of ``_configs`` that fits; ValueError naming
    ``block`` when none does (a key tile too wide for the device's shared memory)."""
    block_n = consts["BLOCK_N"]
    for rows, stages in _configs(block_m, block_n):
        try:
            _attention_kernel[(triton.cdiv(nq, rows), g_count)](
                *args, BLOCK_M=rows, num_warps=8 if rows * block_n >= 8192 else 4,
                num_stages=stages, enable_fp_fusion=False, **consts)
            return
        except triton.OutOfResources as exc:  # raised when the binary loads, before the launch
            last = exc
    raise ValueError(f"block: tiles of {block} keys (padded to {block_n}) need more shared memory "
                     f"than this device has ({last}); use a smaller block") from last


def _on_device(x, device) -> torch.Tensor:
    return torch.as_tensor(x).to(device=device, dtype=torch.float32).contiguous()


def flash_attention_triton(q, k, v, block: int, u: float, ue: float, q32: float,
                           with_bound: bool = True, mask=None, causal: bool = False,
                           block_m: int | None = None):
    """(out float32 (G, nq, dv), bound float64 (G, nq, dv), rescales int64 (G, nq)), torch
    tensors on ``kernel_device()`` (cuda compiled, cpu in the interpreter); inputs are moved
    there. As ``kernels.attention.flash_attention``: q (G, nq, d), k (G, n, d), v (G, n, dv)
    float32 and finite, ``mask`` None or bool (1 or G, 1 or nq, n), True = attend,
    ``causal``: keys j <= i (validated by the caller, ``analysis.fp.attention``). ``block_m``:
    query rows per program (None: chosen by ``_configs``), a power of two >= 16. Without ``with_bound`` the bound is empty (the forward pass alone)."""
    device = kernel_device()
    q, k, v = (_on_device(x, device) for x in (q, k, v))
    g_count, nq, d = q.shape
    n, dv = k.shape[1], v.shape[2]
    if block_m is not None and (block_m < 16 or block_m & (block_m - 1)):
        raise ValueError(f"block_m: expected a power of two >= 16, got {block_m}")
    mask_t, mask_g, mask_i = _mask_args(mask, n, device)
    out = torch.empty((g_count, nq, dv), dtype=torch.float32, device=device)
    scores = torch.empty((g_count, nq, n), dtype=torch.float32, device=device)
    big_m = torch.empty((g_count, nq), dtype=torch.float32, device=device)
    rescales = torch.empty((g_count, nq), dtype=torch.int32, device=device)
    scale = float(torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32))  # ĉ, as Numba's
    _launch((q, k, v, mask_t, out, scores, big_m, rescales, nq, n, d, dv, mask_g, mask_i, scale,
             int(block)), nq, g_count, int(block), block_m, BLOCK_N=_padded(block), D_P=_padded(d),
            DV_P=_padded(dv), HAS_MASK=mask is not None, CAUSAL=bool(causal), LIBDEVICE=libdevice_exp())
    rescales = rescales.to(torch.int64)
    if not with_bound:
        return out, torch.empty((0, nq, dv), dtype=torch.float64, device=device), rescales
    bound = attention_bound_torch(q, k, v, scores, big_m, rescales, int(block), u, ue, q32,
                                  mask=None if mask is None else mask_t.bool(), causal=causal)
    return out, bound, rescales
