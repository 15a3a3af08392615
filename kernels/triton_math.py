"""The exp of the Triton kernels, and where they run.

Compiled for an NVIDIA GPU, ``tl.exp`` on float32 is 2^(x·log2 e) with the approximate ex2:
measured up to 62.7 ulp on every float32 in [-104, 0] on an H200 (shared/notes/gpu_h200.md),
so no error model of ours may assume it. Kernels whose results a bound covers call ``exp``
below: CUDA's libdevice exp when compiled (expf: 2 ulp documented, 1.93 ulp measured on
the same sweep; exp on float64: 1 ulp documented), ``tl.exp`` in the interpreter, where
it is numpy's (measured by tests/test_triton_backends.py). ``softcert gpu-check`` re-measures
the compiled one on the GPU it runs on.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402


def interpreted() -> bool:
    """True when Triton runs on the CPU interpreter (no timing is meaningful then)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_device() -> str:
    """Where the kernels run: "cuda" when compiled, "cpu" in the interpreter."""
    return "cuda" if torch.cuda.is_available() and not interpreted() else "cpu"


def libdevice_exp() -> bool:
    """The LIBDEVICE flag the kernels take: libdevice's exp where it exists (compiled)."""
    return not interpreted()


@triton.jit
def exp(x, LIBDEVICE: tl.constexpr):
    """exp(x) with a stated accuracy: libdevice's when compiled, numpy's in the interpreter
    (whose libdevice functions have no implementation)."""
    if LIBDEVICE:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _exp_kernel(x_ptr, y_ptr, count, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < count
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, exp(x, LIBDEVICE), mask=mask)


def kernel_exp(x, libdevice: bool | None = None):
    """exp of a 1-D float32/float64 tensor by the kernels' own ``exp``, where they run.

    ``libdevice``: None for the kernels' choice (``libdevice_exp()``); False forces ``tl.exp``
    (on a GPU the approximate ex2, measured only to show why it is not used); True needs a
    compiled run. Returns a tensor on ``kernel_device()``."""
    if libdevice is None:
        libdevice = libdevice_exp()
    if libdevice and interpreted():
        raise ValueError("libdevice: the Triton interpreter has no libdevice exp (needs a GPU)")
    x = x.to(kernel_device()).contiguous()
    y = torch.empty_like(x)
    block = 1024
    _exp_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), LIBDEVICE=bool(libdevice), BLOCK=block)
    return y
