"""Triton kernel proposing Vertex-Softmax optima by the sort-free Dinkelbach iteration.

Imported only when ``backend="triton"`` is asked for; without a CUDA device Triton runs in
interpreter mode (TRITON_INTERPRET=1, set by ``kernels.triton_math``). One
program per row (padded to a power of two and masked): weights a = e^{l-M}, b = e^{u-M}
(M the row's largest upper score), then for the max of (±c)·softmax the iteration of
``kernels.vertex._dinkelbach`` (start at the all-upper vertex, stop at a fixed point, a stall
or MAX_PASSES). The kernel only *proposes*: ``bounds.vertex_softmax(backend="triton")``
proves every returned bound with the certificate g(λ) <= 0 under the error model of
``kernels.floating`` and solves rows it cannot prove (or whose weights leave the normal range,
``robust``) by the sorted sweep.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # read when triton is first imported (kernels.triton_math)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from softcert.kernels.triton_math import exp, kernel_device, libdevice_exp  # noqa: E402
from softcert.kernels.vertex import FAST_PATH_MIN_WEIGHT, MAX_PASSES  # noqa: E402


@triton.jit
def _dinkelbach_kernel(c_ptr, lo_ptr, hi_ptr, lam_ptr, theta_ptr, passes_ptr, robust_ptr, n,
                       max_passes, min_weight, N_P: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N_P)
    msk = offs < n
    c = tl.load(c_ptr + row * n + offs, mask=msk, other=0.0)
    lo = tl.load(lo_ptr + row * n + offs, mask=msk, other=float("-inf"))
    hi = tl.load(hi_ptr + row * n + offs, mask=msk, other=float("-inf"))
    top = tl.max(hi, axis=0)
    b = exp(hi - top, LIBDEVICE)  # -inf (masked or padding) -> exactly 0
    a = exp(lo - top, LIBDEVICE)
    small = ((hi > float("-inf")) & (b < min_weight)) | ((lo > float("-inf")) & (a < min_weight))
    tl.store(robust_ptr + row, tl.sum(small.to(tl.int32), axis=0))
    num0 = tl.sum(c * b, axis=0)
    den0 = tl.sum(b, axis=0)
    for k in tl.static_range(2):
        sign = 1.0 - 2.0 * k
        sc = sign * c
        lam = sign * num0 / den0
        theta = tl.full((), float("-inf"), tl.float64)
        passes = 1
        live = 1
        while (live == 1) & (passes < max_passes):
            up = (sc > lam) & msk
            w = tl.where(up, b, a)
            num = tl.sum(sc * w, axis=0)
            den = tl.sum(w, axis=0)
            cmin_up = tl.min(tl.where(up, sc, float("inf")), axis=0)
            passes += 1
            new = num / tl.where(den > 0, den, 1.0)
            improve = (den > 0) & (new > lam)
            theta = tl.where(improve, lam, theta)
            lam = tl.where(improve, new, lam)
            # a fixed point when no coefficient of the upper set lies at or below the new λ
            live = (improve & (cmin_up <= new)).to(tl.int32)
        tl.store(lam_ptr + row * 2 + k, lam)
        tl.store(theta_ptr + row * 2 + k, theta)
        tl.store(passes_ptr + row * 2 + k, passes)


def dinkelbach_triton(c: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """Proposals for (R, n) float64 rows: (λ (R, 2), θ (R, 2), passes (R, 2), robust (R,)),
    on the rows' device.

    Column 0 is the max of c·softmax, column 1 the max of (-c)·softmax; the proposed vertex
    puts {i : ±c_i > θ} at the upper bound. ``robust`` rows have weights below the fast
    path's range and must be solved by the caller's sweep.
    """
    rows, n = c.shape
    device, home = kernel_device(), c.device
    c, lo, hi = (x.to(device=device, dtype=torch.float64).contiguous() for x in (c, lo, hi))
    lam = torch.empty((rows, 2), dtype=torch.float64, device=device)
    theta = torch.empty((rows, 2), dtype=torch.float64, device=device)
    passes = torch.empty((rows, 2), dtype=torch.int32, device=device)
    robust = torch.empty(rows, dtype=torch.int32, device=device)
    _dinkelbach_kernel[(rows,)](c, lo, hi, lam, theta, passes, robust, n, MAX_PASSES,
                                FAST_PATH_MIN_WEIGHT, N_P=triton.next_power_of_2(n), LIBDEVICE=libdevice_exp())
    return lam.to(home), theta.to(home), passes.to(home), robust.to(home) > 0  # back where the rows came from
