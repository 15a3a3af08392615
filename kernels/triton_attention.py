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
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, s_ptr, m_ptr, r_ptr, nq, n, d, dv,
                      scale, block, BLOCK_P: tl.constexpr, D_P: tl.constexpr,
                      DV_P: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    g = row // nq
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
        kt = tl.load(k_ptr + g * n * d + offs[:, None] * d + dims[None, :],
                     mask=kmask[:, None] & (dims[None, :] < d), other=0.0)
        s = tl.sum(qv[None, :] * kt, axis=1) * scale
        s = tl.where(kmask, s, float("-inf"))
        tl.store(s_ptr + row * n + offs, s, mask=kmask)
        mt = tl.maximum(m, tl.max(s, axis=0))
        # a rescale of an earlier tile's sums: m is finite from the first tile on (it holds a
        # finite score), so this is t0 > 0 (a Python bool in triton 3.2's interpreter, which
        # cannot combine it with a tensor)
        grow = (mt > m) & (m > float("-inf"))
        alpha = tl.where(grow, exp(m - mt, LIBDEVICE), 1.0)
        rescales += grow.to(tl.int32)
        p = exp(s - mt, LIBDEVICE)
        vt = tl.load(v_ptr + g * n * dv + offs[:, None] * dv + vdims[None, :],
                     mask=kmask[:, None] & (vdims[None, :] < dv), other=0.0)
        ell = ell * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        m = mt
    tl.store(out_ptr + row * dv + vdims, acc / ell, mask=vdims < dv)
    tl.store(m_ptr + row, m)
    tl.store(r_ptr + row, rescales)


def flash_attention_triton(q: np.ndarray, k: np.ndarray, v: np.ndarray, block: int, u: float,
                           ue: float, q32: float, with_bound: bool = True):
    """As ``kernels.attention.flash_attention``: (out, bound, rescales) for q (G, nq, d),
    k (G, n, d), v (G, n, dv) float32 (validated by the caller)."""
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)) for x in (q, k, v))
    g_count, nq, d = q.shape
    n, dv = k.shape[1], v.shape[2]
    device = kernel_device()
    q, k, v = (x.to(device) for x in (q, k, v))
    out = torch.empty((g_count, nq, dv), dtype=torch.float32, device=device)
    scores = torch.empty((g_count, nq, n), dtype=torch.float32, device=device)
    big_m = torch.empty((g_count, nq), dtype=torch.float32, device=device)
    rescales = torch.empty((g_count, nq), dtype=torch.int32, device=device)
    scale = float(np.float32(1.0 / np.sqrt(d)))
    _attention_kernel[(g_count * nq,)](
        q, k, v, out, scores, big_m, rescales, nq, n, d, dv, scale, int(block),
        BLOCK_P=triton.next_power_of_2(int(block)), D_P=triton.next_power_of_2(d),
        DV_P=triton.next_power_of_2(dv), LIBDEVICE=libdevice_exp())
    out, scores, big_m = (x.cpu().numpy() for x in (out, scores, big_m))
    rescales = rescales.cpu().numpy().astype(np.int64)
    if not with_bound:
        return out, np.empty((0, nq, dv)), rescales
    bound = attention_bound(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), scores, big_m,
                            rescales, int(block), u, ue, q32)
    return out, bound, rescales
