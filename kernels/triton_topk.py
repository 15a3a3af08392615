"""Triton kernel of the top-k tail sums (``analysis.topk`` with backend="triton").

Imported only when that backend is asked for; without a CUDA device Triton runs in
interpreter mode (TRITON_INTERPRET=1, set by ``kernels.triton_math``). One
program per row, padded with -inf to a power of two: the row is sorted ascending, weights
w = exp(v - max) (padding and masked keys weigh exactly 0) are summed by a prefix scan from
the smallest, and the scan is stored reversed, so T[k] = Σ of all but the k largest weights:
each T[k] is a sum of non-negative terms in some order, which is all the error model of
``analysis.topk`` (γ_n for the sum, RHO_WEIGHT/EXP_ABS for each float64 exp) assumes. The
outward rounding of τ = T[k]/T[0] is done by ``analysis.topk``, as for the torch path.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # read when triton is first imported (kernels.triton_math)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from softcert.kernels.triton_math import exp, kernel_device, libdevice_exp  # noqa: E402


@triton.jit
def _tail_kernel(s_ptr, t_ptr, nv_ptr, n, N_P: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    idx = tl.arange(0, N_P)
    x = tl.load(s_ptr + row * n + idx, mask=idx < n, other=float("-inf"))
    nv = tl.sum((x > float("-inf")).to(tl.int64), axis=0)
    # sort without -inf (triton 3.2's tl.sort multiplies by a 0/1 mask: -inf * 0 = NaN); the
    # N_P - nv smallest slots are the masked keys and padding, and weigh exactly 0
    v = tl.sort(tl.where(x > float("-inf"), x, -1.7976931348623157e308), 0)
    w = tl.where(idx < N_P - nv, 0.0, exp(v - tl.max(v, axis=0), LIBDEVICE))
    c = tl.cumsum(w, 0)
    dest = N_P - 1 - idx  # the scan from the smallest, read from the largest: T[k]
    tl.store(t_ptr + row * (n + 1) + dest, c, mask=dest < n)
    tl.store(nv_ptr + row, nv)


def tail_sums_triton(s: torch.Tensor):
    """(T (B, n+1) float64, n_valid (B,) int64) for validated score rows s (B, n) float64:
    T[:, k] = fl-sum of all but the k largest weights exp(s - max), T[:, n] = 0."""
    rows, n = s.shape
    device, home = kernel_device(), s.device
    s = s.to(device=device, dtype=torch.float64).contiguous()
    t = torch.zeros((rows, n + 1), dtype=torch.float64, device=device)
    nv = torch.empty(rows, dtype=torch.int64, device=device)
    _tail_kernel[(rows,)](s, t, nv, n, N_P=triton.next_power_of_2(n), LIBDEVICE=libdevice_exp())
    return t.to(home), nv.to(home)  # back where the scores came from
