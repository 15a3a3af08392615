"""The Numba top-k kernels agree bit for bit with the torch reference analysis.topk."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis import topk
from kernels import topk as ktopk

NINF = float("-inf")


def attention_like(rng, shape, n):
    """(…, n) scores: mixed scales, padded keys (-inf), exact ties, one-hot rows."""
    s = rng.standard_normal(shape + (n,)) * rng.choice([0.3, 2.0, 8.0], size=shape + (1,))
    s = torch.from_numpy(s)
    flat = s.reshape(-1, n)
    pad = rng.integers(0, n, size=flat.shape[0])
    for r in range(0, flat.shape[0], 3):
        flat[r, n - pad[r]:] = NINF  # padded keys at the end of some rows
        if n - pad[r] == 0:
            flat[r, 0] = 0.0
    flat[1::5] = torch.round(flat[1::5])  # many exact ties
    flat[2::7, :] = -50.0
    flat[2::7, 0] = 0.0  # near one-hot rows
    return s


@pytest.fixture(params=[(2, 3, 4, 17), (1, 2, 8, 128)])
def tensor4(request, rng):
    *shape, n = request.param
    return attention_like(rng, tuple(shape), n)


def test_constants_match_reference():
    assert ktopk.RHO_WEIGHT == topk.RHO_WEIGHT
    for n in (1, 17, 128, 4096):
        m = topk._TailModel.for_length(n)
        assert ktopk.tail_constants(n) == (m.c, m.A)


@pytest.mark.parametrize("eps", [1e-3, 0.01, 0.05, 0.1, 0.5])
def test_certified_k_agrees_exactly(tensor4, eps):
    ref = topk.certify_topk(tensor4, eps)
    k, up = ktopk.certified_k_numba(tensor4, eps)
    assert k.shape == ref.k.shape
    assert torch.equal(k, ref.k)
    assert torch.equal(up, ref.tail_upper)


@pytest.mark.parametrize("rounding", ["nearest", "up", "down"])
def test_tail_mass_agrees_exactly(tensor4, rounding, rng):
    n = tensor4.shape[-1]
    k = torch.from_numpy(rng.integers(0, n + 2, size=tensor4.shape[:-1]))
    ref = topk.tail_mass(tensor4, k, rounding=rounding)
    got = ktopk.tail_mass_numba(tensor4, k, rounding=rounding)
    assert torch.equal(got, ref)


def test_gap_bounds_agree_exactly(tensor4, rng):
    n = tensor4.shape[-1]
    k = torch.from_numpy(rng.integers(0, n + 2, size=tensor4.shape[:-1]))
    assert torch.equal(ktopk.gap_bound_numba(tensor4, k), topk.gap_bound(tensor4, k))
    for levels in (1, 2, 4, 7):
        assert torch.equal(
            ktopk.multi_gap_bound_numba(tensor4, k, levels),
            topk.multi_gap_bound(tensor4, k, levels=levels),
        )


def test_float32_input_is_exact(rng):
    s = torch.from_numpy(rng.standard_normal((3, 5, 64)).astype(np.float32) * 4)
    k, _ = ktopk.certified_k_numba(s, 0.01)
    assert torch.equal(k, topk.certified_k(s, 0.01))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ktopk.certified_k_numba(torch.tensor([0.0, float("nan")]), 0.1), "NaN"),
        (lambda: ktopk.certified_k_numba(torch.tensor([[NINF, NINF]]), 0.1), "masked"),
        (lambda: ktopk.certified_k_numba(torch.zeros(3), 1.0), "eps"),
        (lambda: ktopk.tail_mass_numba(torch.zeros(3), -2), "k"),
        (lambda: ktopk.tail_mass_numba(torch.zeros(3), 1, "x"), "rounding"),
        (lambda: ktopk.multi_gap_bound_numba(torch.zeros(3), 1, 0), "levels"),
    ],
)
def test_kernel_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
