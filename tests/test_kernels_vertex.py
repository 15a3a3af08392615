"""The Numba kernel and the torch reference pick the same vertex and agree to rounding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bounds
from kernels import floating as rounding
from kernels import vertex as kv


def test_error_model_constants_match():
    assert kv.EXP_REL == rounding.EXP_REL and kv.U == rounding.U64 and kv.TINY == rounding.TINY


@pytest.mark.parametrize("rows,n", [(300, 1), (200, 7), (64, 33), (8, 1000)])
def test_numba_matches_torch(rows, n):
    rng = np.random.default_rng(rows + n)
    c = torch.tensor(rng.normal(size=(rows, n)))
    lo = torch.tensor(rng.normal(size=(rows, n)) * 4)
    hi = lo + torch.tensor(rng.exponential(size=(rows, n)))
    lo[::5, 0] = float("-inf")  # some vanishing entries
    if n > 1:
        lo[::7, -1] = hi[::7, -1] = float("-inf")  # some masked keys
    a = bounds.vertex_softmax(c, lo, hi, backend="torch")
    b = bounds.vertex_softmax(c, lo, hi, backend="numba")
    scale = 1 + c.abs().amax(-1)
    assert ((a.upper - b.upper).abs() <= 1e-12 * scale).all()
    assert ((a.lower - b.lower).abs() <= 1e-12 * scale).all()
    # ties between candidates make the vertex ambiguous; its value is not
    for va, vb in ((a.upper_vertex, b.upper_vertex), (a.lower_vertex, b.lower_vertex)):
        fa = (c * torch.softmax(va, -1)).sum(-1)
        fb = (c * torch.softmax(vb, -1)).sum(-1)
        assert ((fa - fb).abs() <= 1e-12 * scale).all()



def test_robust_path_matches_torch():
    rng = np.random.default_rng(4)
    c = torch.tensor(rng.normal(size=(50, 12)))
    lo = torch.tensor(rng.normal(size=(50, 12)) * 600)
    hi = lo + torch.tensor(rng.random(size=(50, 12)) * 900)
    a = bounds.vertex_softmax(c, lo, hi, backend="torch")
    b = bounds.vertex_softmax(c, lo, hi, backend="numba")
    assert ((a.upper - b.upper).abs() <= 1e-12 * (1 + c.abs().amax(-1))).all()
    assert ((a.lower - b.lower).abs() <= 1e-12 * (1 + c.abs().amax(-1))).all()
    fa = (c * torch.softmax(a.upper_vertex, -1)).sum(-1)
    fb = (c * torch.softmax(b.upper_vertex, -1)).sum(-1)
    assert ((fa - fb).abs() <= 1e-12 * (1 + c.abs().amax(-1))).all()
