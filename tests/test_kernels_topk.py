"""The numba and torch backends of analysis.topk: each sound against an mpmath oracle, and the
two within the proven rounding width of each other (they sum in different orders and call
different exps, so their floats may differ in the last bits on some CPUs)."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from softcert.analysis import topk
from softcert.kernels import topk as ktopk
from softcert.kernels.floating import U64

NINF = float("-inf")
BACKENDS = ("torch", "numba")


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


def exact_tails(row):
    """[τ_0, ..., τ_n] of one row in mpmath (50 digits): suffix sums of the sorted weights."""
    vals = sorted((float(x) for x in row if x != NINF), reverse=True)
    w = [mpmath.exp(mpmath.mpf(x)) for x in vals]
    z = mpmath.fsum(w)
    tails, acc = [], mpmath.mpf(0)
    for x in reversed(w):
        tails.append(acc)
        acc += x
    tails.append(acc)
    tails = [t / z for t in reversed(tails)]  # tails[k] = Σ_{i>=k} w_i / z
    tails[0] = mpmath.mpf(1)
    return tails + [mpmath.mpf(0)] * (len(row) + 2 - len(tails))


def rows_of(t):
    return t.reshape(-1, t.shape[-1]).tolist()


def proven_upper(tau, n):
    """Largest value an outward-rounded τ⁺ may take: τ⁻ <= τ gives q̃ <= c(τ + A), and
    τ⁺ = next↑(q̃c + A), so τ⁺ <= c²(τ + A) + A up to two roundings."""
    c, A = ktopk.tail_constants(n)
    return (c * c * (tau + A) + A) * (1 + 4 * U64) + 2 * ktopk.SUBNORMAL_ULP if tau else 2 * A


def test_analysis_uses_the_kernel_constants():
    for n in (1, 17, 128, 4096):
        m = topk._TailModel.for_length(n)
        assert (m.c, m.A) == ktopk.tail_constants(n)
    assert topk.RHO_WEIGHT is ktopk.RHO_WEIGHT


@pytest.mark.parametrize("eps", [1e-3, 0.01, 0.05, 0.1, 0.5])
def test_certified_k_backends_sound_and_within_proven_error(tensor4, eps):
    n = tensor4.shape[-1]
    certs = {b: topk.certify_topk(tensor4, eps, backend=b) for b in BACKENDS}
    assert certs["torch"].k.shape == certs["numba"].k.shape == tensor4.shape[:-1]
    ks = {b: c.k.reshape(-1).tolist() for b, c in certs.items()}
    ups = {b: c.tail_upper.reshape(-1).tolist() for b, c in certs.items()}
    proved = {b: c.minimal_proved.reshape(-1).tolist() for b, c in certs.items()}
    for r, row in enumerate(rows_of(tensor4)):
        tails = exact_tails(row)
        k_star = next(k for k, t in enumerate(tails) if t <= eps)
        for b in BACKENDS:
            k = ks[b][r]
            assert tails[k] <= eps and tails[k] <= ups[b][r] <= eps  # certified, enclosed
            assert ups[b][r] <= proven_upper(tails[k], n)  # within the proven width
            assert k >= k_star
            if proved[b][r]:
                assert k == k_star
        # two proofs of minimality prove the same k; otherwise both are certified above
        if proved["torch"][r] and proved["numba"][r]:
            assert ks["torch"][r] == ks["numba"][r]
    assert torch.equal(certs["numba"].n_valid, torch.isfinite(tensor4).sum(-1))


@pytest.mark.parametrize("rounding", ["nearest", "up", "down"])
def test_tail_mass_backends_enclose_the_oracle(tensor4, rounding, rng):
    n = tensor4.shape[-1]
    k = torch.from_numpy(rng.integers(0, n + 2, size=tensor4.shape[:-1]))
    got = {b: topk.tail_mass(tensor4, k, rounding=rounding, backend=b) for b in BACKENDS}
    lo = {b: topk.tail_mass(tensor4, k, rounding="down", backend=b) for b in BACKENDS}
    up = {b: topk.tail_mass(tensor4, k, rounding="up", backend=b) for b in BACKENDS}
    for r, (row, kr) in enumerate(zip(rows_of(tensor4), k.reshape(-1).tolist())):
        tau = exact_tails(row)[min(kr, n + 1)]
        for b in BACKENDS:
            lo_b, up_b = lo[b].reshape(-1)[r].item(), up[b].reshape(-1)[r].item()
            assert lo_b <= tau <= up_b
            assert lo_b <= got[b].reshape(-1)[r].item() <= up_b
            assert up_b <= proven_upper(tau, n)
        # both results lie in their own proven enclosure of the same τ
        width = sum(up[b].reshape(-1)[r].item() - lo[b].reshape(-1)[r].item() for b in BACKENDS)
        a, c = (got[b].reshape(-1)[r].item() for b in BACKENDS)
        assert abs(a - c) <= width


def test_gap_bounds_backends_sound_and_within_proven_error(tensor4, rng):
    n = tensor4.shape[-1]
    k = torch.from_numpy(rng.integers(0, n + 2, size=tensor4.shape[:-1]))
    tails = [exact_tails(row) for row in rows_of(tensor4)]
    exact = [t[min(kr, n + 1)] for t, kr in zip(tails, k.reshape(-1).tolist())]
    for levels in (1, 2, 4, 7):
        nb = 2 * levels
        cs, cd, cr, ca = ktopk.block_constants(nb)
        # each backend lies in [B, B·C + A'] for the same real block formula B
        C = cs * cs * cd * cr * (1 + 8 * U64)
        A = 4 * float(ktopk.block_abs(float(n), nb, ca))
        if levels == 1:
            res = {b: topk.gap_bound(tensor4, k, backend=b) for b in BACKENDS}
        else:
            res = {b: topk.multi_gap_bound(tensor4, k, levels, backend=b) for b in BACKENDS}
        flat = {b: r.reshape(-1).tolist() for b, r in res.items()}
        for i, ex in enumerate(exact):
            a, c = flat["torch"][i], flat["numba"][i]
            assert min(a, c) >= ex and max(a, c) <= 1.0
            assert abs(a - c) <= (C - 1) * max(a, c) + A


def test_float32_input_is_read_exactly(rng):
    s = torch.from_numpy(rng.standard_normal((3, 5, 64)).astype(np.float32) * 4)
    for b in BACKENDS:
        c32 = topk.certify_topk(s, 0.01, backend=b)
        c64 = topk.certify_topk(s.double(), 0.01, backend=b)
        assert torch.equal(c32.k, c64.k)  # same float64 input, same backend, same code


def test_kernel_entry_points_keep_their_names(rng):
    s = torch.from_numpy(rng.standard_normal((4, 32)) * 3)
    k, up = ktopk.certified_k_numba(s, 0.05)
    assert k.dtype == torch.int64 and bool((up <= 0.05).all())
    kk = torch.full((4,), 5)
    for f in (ktopk.gap_bound_numba, ktopk.multi_gap_bound_numba):
        assert bool((f(s, kk) >= ktopk.tail_mass_numba(s, kk, "up") * (1 - 1e-12)).all())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: topk.certified_k(torch.tensor([0.0, float("nan")]), 0.1, backend="numba"),
         "NaN"),
        (lambda: topk.certified_k(torch.tensor([[NINF, NINF]]), 0.1, backend="numba"), "masked"),
        (lambda: topk.certified_k(torch.zeros(3), 1.0, backend="numba"), "eps"),
        (lambda: topk.certified_k(torch.zeros(3), 0.1, backend="cuda"), "backend"),
        (lambda: topk.tail_mass(torch.zeros(3), -2, backend="numba"), "k"),
        (lambda: topk.tail_mass(torch.zeros(3), 1, rounding="x", backend="numba"), "rounding"),
        (lambda: topk.multi_gap_bound(torch.zeros(3), 1, 0, backend="numba"), "levels"),
        (lambda: topk.gap_bound(torch.zeros(3), 1.5, backend="numba"), "k"),
        (lambda: topk.blockwise_bound([0.0], [0.0], [1.0], [0.0], backend="numba"), "no finite"),
        (lambda: ktopk.tail_mass_numba(torch.zeros(3), 1, "x"), "rounding"),
        (lambda: ktopk.multi_gap_bound_numba(torch.zeros(3), 1, 0), "levels"),
    ],
)
def test_bad_input_raises_before_dispatch(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_kernels_layer_imports_nothing_above_it():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(ktopk))
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in names if m and m.split(".")[0] in ("bounds", "analysis", "certify")}
    assert math.isfinite(ktopk.tail_constants(10)[0])
