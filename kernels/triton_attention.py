"""Triton FlashAttention-style FP32 forward, same algorithm as ``kernels.attention``.

Imported only when ``backend="triton"`` is asked for. Without a CUDA device Triton runs in
interpreter mode (TRITON_INTERPRET=1, set by ``kernels.triton_math``). Its ``exp`` is
libdevice's when compiled, numpy's float32 exp in the interpreter; the caller passes the
assumed accuracy of the one that runs (``kernels.floating.triton_exp32_ulps``), and ``tl.sum``
sums in some order: any order is covered by the bound.
One program per query row; tiles of ``block`` keys, padded to a power of two and masked.
The kernel keeps its float32 scores, running max and rescale count, and the bound is
evaluated from them by ``kernels.attention.attention_bound`` (the same proof, section 2 of
docs/fp/attention.md: any summation order inside a tile, one rescale per max increase).
Masks (section 7 there): a masked key (the boolean ``mask``, or j > i when ``CAUSAL``) gets
score -inf and p = 0 exactly, so it adds exact zeros; a tile without an attended key leaves
the carry unchanged (alpha = 1, + 0); a row without one stores out = 0.
"""
from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():  # read when triton is first imported (kernels.triton_math)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from softcert.kernels.attention import attention_bound  # noqa: E402
from softcert.kernels.triton_math import exp, kernel_device, libdevice_exp  # noqa: E402


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, s_ptr, m_ptr, r_ptr, nq, n, d, dv,
                      mask_g, mask_i, scale, block, BLOCK_P: tl.constexpr, D_P: tl.constexpr,
                      DV_P: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                      LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    g = row // nq
    i = row - g * nq
    dims = tl.arange(0, D_P)
    vdims = tl.arange(0, DV_P)
    keys = tl.arange(0, BLOCK_P)
    qv = tl.load(q_ptr + row * d + dims, mask=dims < d, other=0.0)
    m = tl.full((), float("-inf"), tl.float32)
    ell = tl.zeros((), tl.float32)
    acc = tl.zeros((DV_P,), tl.float32)
    rescales = tl.zeros((), tl.int32)
    for t0 in range(0, n, block):
        offs = t0 + keys
        kmask = (keys < block) & (offs < n)
        att = kmask  # the attended keys of the tile
        if HAS_MASK:
            mk = tl.load(mask_ptr + g * mask_g + i * mask_i + offs, mask=kmask, other=0)
            att = att & (mk != 0)
        if CAUSAL:
            att = att & (offs <= i)
        kt = tl.load(k_ptr + g * n * d + offs[:, None] * d + dims[None, :],
                     mask=att[:, None] & (dims[None, :] < d), other=0.0)
        s = tl.sum(qv[None, :] * kt, axis=1) * scale
        s = tl.where(att, s, float("-inf"))
        tl.store(s_ptr + row * n + offs, s, mask=kmask)
        mt = tl.maximum(m, tl.max(s, axis=0))
        # a rescale of an earlier tile's sums: m is finite once a tile held an attended key
        # (a Python bool in triton 3.2's interpreter, which cannot combine it with a tensor)
        grow = (mt > m) & (m > float("-inf"))
        # -inf - -inf never reaches exp: the running max is read as 0 until a key is attended
        mt_f = tl.where(mt > float("-inf"), mt, 0.0)
        alpha = tl.where(grow, exp(tl.where(grow, m, mt_f) - mt_f, LIBDEVICE), 1.0)
        rescales += grow.to(tl.int32)
        p = tl.where(att, exp(s - mt_f, LIBDEVICE), 0.0)  # masked keys: exactly 0
        vt = tl.load(v_ptr + g * n * dv + offs[:, None] * dv + vdims[None, :],
                     mask=att[:, None] & (vdims[None, :] < dv), other=0.0)
        ell = ell * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        m = mt
    # ell >= 1 (or NaN: overflow, caught by the caller) once a key is attended, else 0
    res = tl.where(ell != 0.0, acc / tl.where(ell != 0.0, ell, 1.0), 0.0)
    tl.store(out_ptr + row * dv + vdims, res, mask=vdims < dv)
    tl.store(m_ptr + row, m)
    tl.store(r_ptr + row, rescales)


def _mask_args(mask, nq: int, n: int, device):
    """(tensor, g stride, row stride): the uint8 mask (1 or G, 1 or nq, n), broadcast axes
    read with stride 0; a one-element dummy without a mask."""
    if mask is None:
        return torch.zeros(1, dtype=torch.uint8, device=device), 0, 0
    m = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.uint8)).to(device)
    rows = m.shape[1]
    return m, rows * n if m.shape[0] > 1 else 0, n if rows > 1 else 0


def flash_attention_triton(q: np.ndarray, k: np.ndarray, v: np.ndarray, block: int, u: float,
                           ue: float, q32: float, with_bound: bool = True, mask=None,
                           causal: bool = False):
    """As ``kernels.attention.flash_attention``: (out, bound, rescales) for q (G, nq, d),
    k (G, n, d), v (G, n, dv) float32, ``mask`` None or bool (1 or G, 1 or nq, n), True =
    attend, ``causal``: keys j <= i (validated by the caller)."""
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)) for x in (q, k, v))
    g_count, nq, d = q.shape
    n, dv = k.shape[1], v.shape[2]
    device = kernel_device()
    q, k, v = (x.to(device) for x in (q, k, v))
    mask_t, mask_g, mask_i = _mask_args(mask, nq, n, device)
    out = torch.empty((g_count, nq, dv), dtype=torch.float32, device=device)
    scores = torch.empty((g_count, nq, n), dtype=torch.float32, device=device)
    big_m = torch.empty((g_count, nq), dtype=torch.float32, device=device)
    rescales = torch.empty((g_count, nq), dtype=torch.int32, device=device)
    scale = float(np.float32(1.0 / np.sqrt(d)))
    _attention_kernel[(g_count * nq,)](
        q, k, v, mask_t, out, scores, big_m, rescales, nq, n, d, dv, mask_g, mask_i, scale,
        int(block), BLOCK_P=triton.next_power_of_2(int(block)), D_P=triton.next_power_of_2(d),
        DV_P=triton.next_power_of_2(dv), HAS_MASK=mask is not None, CAUSAL=bool(causal),
        LIBDEVICE=libdevice_exp())
    out, scores, big_m = (x.cpu().numpy() for x in (out, scores, big_m))
    rescales = rescales.cpu().numpy().astype(np.int64)
    if not with_bound:
        return out, np.empty((0, nq, dv)), rescales
    bound = attention_bound(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), scores, big_m,
                            rescales, int(block), u, ue, q32, mask=mask, causal=causal)
    return out, bound, rescales
