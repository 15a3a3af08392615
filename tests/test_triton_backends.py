"""Triton backends in interpreter mode (TRITON_INTERPRET=1 on CPU; small sizes): sound against
float64/mpmath oracles and within the proven rounding error of the Numba/torch paths, never
compared bit for bit. Nothing imports triton unless backend="triton" is asked for."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton
pytest.importorskip("triton")  # the optional `triton` extra (make test installs it)

from analysis import fp  # noqa: E402


def reference64(q, k, v):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_nothing_imports_triton_unless_asked():
    code = ("import sys, numpy as np, bounds, kernels, analysis, analysis.fp as fp, analysis.topk;"
            "import softcert_cli.commands.bench;"
            "q = np.ones((2, 4), np.float32); fp.attention(q, q, q, block=2);"
            "bounds.vertex_softmax([1.0, 2.0], [0.0, 0.0], [1.0, 1.0]);"
            "print('triton' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_interpreter_exp_is_within_the_assumed_ulps():
    """tl.exp is numpy's float32 exp in the interpreter: measure it on a dense grid of the
    arguments attention uses (t <= 0, down to the underflow threshold) against float64."""
    t = np.linspace(-104.0, 0.0, 2_000_001).astype(np.float32)
    y = np.exp(t).astype(np.float64)
    ex = np.exp(t.astype(np.float64))  # float64 exp: 2^-29 of a float32 ulp
    e = np.floor(np.log2(np.maximum(ex, 2.0 ** -126)))
    ulp = np.exp2(np.maximum(e, -126) - 23)
    assert float(np.max(np.abs(y - ex) / ulp)) <= fp.TRITON_EXP_ULPS - 0.01


@pytest.mark.parametrize("kind", ["random", "equal_scores", "wide_range", "ascending"])
@pytest.mark.parametrize("block", [8, 20])
def test_attention_sound_and_within_the_proven_error_of_numba(kind, block):
    rng = np.random.default_rng(block)
    q, k, v = fp.attention_stress_inputs(kind, 60, 8, rng)
    t = fp.attention(q, k, v, block=block, backend="triton")
    nb = fp.attention(q, k, v, block=block, backend="numba")
    ref = reference64(q, k, v)
    slack = 1e-12 * np.abs(v).max()
    assert (np.abs(t.out - ref) <= t.bound + slack).all()
    # both are within their bounds of the same exact value, so of each other
    assert (np.abs(t.out.astype(np.float64) - nb.out) <= t.bound + nb.bound).all()
    assert (t.rescales == nb.rescales).all()  # max comparisons are exact in both


def test_attention_torch_tensors_and_shapes():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 5)
    res = fp.attention(q, k, v, block=4, backend="triton")
    assert res.out.shape == (2, 3, 4, 5) and res.backend == "triton"
    ref = torch.from_numpy(reference64(q.numpy(), k.numpy(), v.numpy()))
    assert ((res.out.double() - ref).abs() <= res.bound + 1e-12).all()
