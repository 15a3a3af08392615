"""Triton kernel of the per-row FP32 softmax statistics behind ``kernels.fp_rows``.

Imported only when ``rows_report(..., backend="triton")`` is asked for; without a CUDA
device Triton runs in interpreter mode (TRITON_INTERPRET=1, set by ``kernels.triton_math``). One program per row (padded with -inf to a power of two): the count n,
the max m, the range R and the float64 sums z = Σ e^{-d}, zd = Σ d e^{-d} (d = m - x) in the
summation order of ``tl.sum``, and, if asked, the measured error of the row's FP32
three-pass softmax (float32 exps and sum, against the float64 weights). The bound itself is
formed by ``kernels.fp_rows.bounds_from_stats`` with the same inflation as the Numba kernel
(any summation order is covered: γ-type factors on sums of non-negative terms).
"""
from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():  # read when triton is first imported (kernels.triton_math)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from softcert.kernels.triton_math import exp, kernel_device, libdevice_exp  # noqa: E402


@triton.jit
def _stats_kernel(x_ptr, n_ptr, m_ptr, r_ptr, z_ptr, zd_ptr, meas_ptr, ncol, measure,
                  N_P: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    idx = tl.arange(0, N_P)
    x = tl.load(x_ptr + row * ncol + idx, mask=idx < ncol, other=float("-inf"))
    valid = x > float("-inf")
    m = tl.max(x, axis=0)
    lo = tl.min(tl.where(valid, x, float("inf")), axis=0)
    x64 = x.to(tl.float64)
    d = tl.where(valid, m.to(tl.float64) - x64, 0.0)  # masked keys: d = 0, weight 0
    e = tl.where(valid, exp(-d, LIBDEVICE), 0.0)
    z = tl.sum(e, axis=0)
    zd = tl.sum(e * d, axis=0)
    tl.store(n_ptr + row, tl.sum(valid.to(tl.int64), axis=0))
    tl.store(m_ptr + row, m)
    tl.store(r_ptr + row, m.to(tl.float64) - lo.to(tl.float64))
    tl.store(z_ptr + row, z)
    tl.store(zd_ptr + row, zd)
    if measure:
        e32 = exp(x - m, LIBDEVICE)  # float32; -inf -> 0
        y32 = e32 / tl.sum(e32, axis=0)
        err = tl.where(valid, tl.abs(y32.to(tl.float64) - e / z), 0.0)
        tl.store(meas_ptr + row, tl.max(err, axis=0) * z)  # relative to p_max = 1/z


def row_stats_triton(x: np.ndarray, measure: bool):
    """(n, max, range, z, zd, measured) per row of a validated float32 (rows, ncol) array."""
    rows, ncol = x.shape
    device = kernel_device()
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)
    n = torch.empty(rows, dtype=torch.int64, device=device)
    m = torch.empty(rows, dtype=torch.float32, device=device)
    r, z, zd = (torch.empty(rows, dtype=torch.float64, device=device) for _ in range(3))
    meas = torch.full((rows,), float("nan"), dtype=torch.float64, device=device)
    _stats_kernel[(rows,)](xt, n, m, r, z, zd, meas, ncol, int(bool(measure)),
                           N_P=triton.next_power_of_2(ncol), LIBDEVICE=libdevice_exp())
    return tuple(t.cpu().numpy() for t in (n, m, r, z, zd, meas))
