"""kernels/attention_torch.py: the attention bound in torch float64 against the Numba
``kernels.attention.attention_bound`` on the same scores, running max and rescale counts
(random, masked, causal, broadcast masks, rows without a key, w = 0 entries, inf bounds).
The two sum in different orders: agreement within a relative 1e-9, never bit for bit."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from softcert.analysis import fp
from softcert.kernels import attention as nb_attention
from softcert.kernels import attention_torch

FMT = fp.FORMATS["float32"]
U, Q32 = FMT.u, FMT.q
UE = 2 * 4.0 * U  # the Triton interpreter's exp model; any value works for the comparison


def _kernel_like(q, k, mask, causal, rng):
    """float32 scores fl(fl(q·k) ĉ) as a kernel computes them, masked keys -inf, their row
    max M (-inf on a row with no key) and rescale counts R (any small counts: the formula
    takes them as given)."""
    scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
    s = (q @ np.swapaxes(k, -1, -2)).astype(np.float32) * scale
    g, nq, n = s.shape
    att = np.ones_like(s, dtype=bool)
    if causal:
        att &= np.tril(np.ones((nq, n), bool))
    elif mask is not None:
        att &= np.broadcast_to(mask, s.shape)
    s = np.where(att, s, np.float32(-np.inf)).astype(np.float32)
    big_m = s.max(-1).astype(np.float32)
    rescales = rng.integers(0, 4, size=(g, nq)).astype(np.int64)
    return s, big_m, rescales


def _both(q, k, v, s, big_m, rescales, block, mask=None, causal=False, **kw):
    ref = nb_attention.attention_bound(q, k, v, s, big_m, rescales, block, U, UE, Q32, mask=mask,
                                       causal=causal)
    t = attention_torch.attention_bound_torch(
        *(torch.from_numpy(x) for x in (q, k, v, s, big_m, rescales)), block, U, UE, Q32,
        mask=None if mask is None else torch.from_numpy(np.ascontiguousarray(mask)), causal=causal, **kw)
    assert t.dtype == torch.float64 and t.shape == ref.shape
    return t.numpy(), ref


def _inputs(rng, g, nq, n, d, dv, scale=1.0):
    return tuple((rng.normal(size=s) * sc).astype(np.float32)
                 for s, sc in (((g, nq, d), scale), ((g, n, d), scale), ((g, n, dv), 1.0)))


CASES = [  # (g, nq, n, d, dv, block, mask shape or "causal" or None, qk scale)
    (2, 7, 50, 8, 3, 16, None, 1.0),
    (3, 5, 129, 16, 4, 50, None, 4.0),
    (2, 9, 40, 8, 5, 7, (2, 9, 40), 2.0),
    (2, 6, 33, 12, 2, 8, (1, 6, 33), 1.0),
    (3, 6, 33, 12, 2, 8, (3, 1, 33), 1.0),
    (2, 11, 11, 4, 3, 4, "causal", 3.0),
    (1, 13, 5, 4, 3, 2, "causal", 1.0),  # nq > n: late rows attend every key
    (1, 4, 300, 32, 6, 32, None, 30.0),  # spreads ~thousands: w = 0 entries in float64
]


@pytest.mark.parametrize("case", CASES)
def test_matches_the_numba_bound_on_the_same_scores(case):
    g, nq, n, d, dv, block, kind, scale = case
    rng = np.random.default_rng(sum(case[:6]))
    q, k, v = _inputs(rng, g, nq, n, d, dv, scale)
    causal = kind == "causal"
    mask = rng.random(kind) < 0.5 if isinstance(kind, tuple) else None
    if mask is not None and mask.shape[1] > 2:
        mask[:, 1] = False  # a row without an attended key: bound 0
    s, big_m, rescales = _kernel_like(q, k, mask, causal, rng)
    t, ref = _both(q, k, v, s, big_m, rescales, block, mask, causal)
    np.testing.assert_allclose(t, ref, rtol=1e-9, atol=0)
    assert np.isfinite(ref).all() and (ref > 0).any()
    if mask is not None and mask.shape[1] > 2:
        assert (t[:, 1] == 0).all() and (ref[:, 1] == 0).all()
    if scale >= 30:  # the spreads reach past 745: some weights are 0 in float64
        x = big_m[..., None].astype(np.float64) - s
        assert (x > 745).any()


def test_inf_where_the_score_error_or_the_sums_are_too_large():
    """Scores off by ~1 (φ >= 1/2) give inf in both; unperturbed rows stay finite."""
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, 1, 6, 40, 8, 3)
    s, big_m, rescales = _kernel_like(q, k, None, False, rng)
    s[0, :3] += np.float32(1.0)
    big_m = s.max(-1).astype(np.float32)
    t, ref = _both(q, k, v, s, big_m, rescales, 16)
    assert np.isinf(ref[0, :3]).all() and np.isinf(t[0, :3]).all()
    assert np.isfinite(t[0, 3:]).all()
    np.testing.assert_allclose(t[0, 3:], ref[0, 3:], rtol=1e-9, atol=0)


@pytest.mark.parametrize("backend", ["numba", "triton"])
def test_cancelled_score_beyond_the_normal_range(backend):
    """A key whose float32 score lost 961 to cancellation (q·k_1 = (2^20 + 31)^2 - 2^20 (2^20 +
    62) = 961 exactly, 0 in float32) and lies 760 below the max key's: its float64 weight is
    0 while its exact weight times v_1 = 1e35 moves the output by 1.13. The bound charged
    2^-1060 for it until 2026-12-05 (8.7e-5: unsound); now e^{e_j - x_j} (docs/fp/attention.md,
    section 5). Oracle: mpmath at 60 digits."""
    import mpmath

    a = np.float32(2**20 + 31)
    q = np.array([[[a, 2**20]]], dtype=np.float32)
    s0 = np.float32(760 * math.sqrt(2) / float(a))
    k = np.array([[[s0, 0.0], [a, -(2**20 + 62)]]], dtype=np.float32)
    v = np.array([[[1.0], [1e35]]], dtype=np.float32)
    with mpmath.workdps(60):
        sc = [sum(mpmath.mpf(float(q[0, 0, i])) * mpmath.mpf(float(k[0, j, i])) for i in range(2))
              / mpmath.sqrt(2) for j in range(2)]
        w = [mpmath.exp(x - max(sc)) for x in sc]
        exact = (w[0] * 1 + w[1] * mpmath.mpf(float(v[0, 1, 0]))) / (w[0] + w[1])
        r = fp.attention(q, k, v, block=16, backend=backend)
        out, bound = float(np.asarray(r.out).ravel()[0]), float(np.asarray(r.bound).ravel()[0])
        err = abs(mpmath.mpf(out) - exact)
    assert err > 1.0  # the case is what it claims: float32 dropped the second key
    assert err <= bound < 2 * err


@pytest.mark.parametrize("budget", [1, 40, 10**6])
def test_chunks_of_rows_and_of_heads_give_the_same_bound(budget):
    """A budget below one head's rows x keys cuts heads into row ranges (down to one row),
    above it takes several heads per chunk: every row is covered once, the bound unchanged."""
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng, 3, 7, 20, 8, 3, 2.0)
    mask = rng.random((3, 7, 20)) < 0.6
    s, big_m, rescales = _kernel_like(q, k, mask, False, rng)
    chunks = list(attention_torch._chunks(3, 7, 20, budget))
    covered = np.zeros((3, 7), int)
    for heads, rows in chunks:
        covered[heads, rows] += 1
    assert (covered == 1).all() and (len(chunks) == 21 if budget == 1 else len(chunks) >= 1)
    t, ref = _both(q, k, v, s, big_m, rescales, 6, mask, chunk_elements=budget)
    np.testing.assert_allclose(t, ref, rtol=1e-9, atol=0)


def test_row_counts_are_the_numba_counts():
    """(n_row, T, b) per row, from random masks with empty tiles, against ``_row_counts``."""
    rng = np.random.default_rng(5)
    n, block = 37, 5
    mask = rng.random((2, 9, n)) < rng.random((2, 9, 1))
    counts = attention_torch.row_counts(torch.from_numpy(mask), n, block, "cpu")
    for g in range(2):
        for i in range(9):
            want = nb_attention._row_counts(mask[g, i].astype(np.uint8), n, block)
            assert tuple(int(c[g, i]) for c in counts) == want
    full = attention_torch.row_counts(None, n, block, "cpu")
    assert tuple(int(c.item()) for c in full) == (n, 8, 5)


@pytest.mark.parametrize("bad,match", [
    (dict(q=torch.zeros(2, 3, 4, dtype=torch.float64)), "q: expected float32"),
    (dict(k=torch.zeros(2, 6, 5)), "k: expected shape"),
    (dict(scores=torch.zeros(2, 3, 5)), "scores: expected shape"),
    (dict(rescales=torch.zeros(2, 4, dtype=torch.int64)), "rescales: expected shape"),
    (dict(block=0), "block"),
    (dict(mask=torch.ones(2, 3, 6)), "mask: expected bool"),
    (dict(mask=torch.ones(3, 3, 6, dtype=torch.bool)), "mask: expected bool"),
])
def test_bad_input_names_the_argument(bad, match):
    kw = dict(q=torch.zeros(2, 3, 4), k=torch.zeros(2, 6, 4), v=torch.zeros(2, 6, 2),
              scores=torch.zeros(2, 3, 6), big_m=torch.zeros(2, 3),
              rescales=torch.zeros(2, 3, dtype=torch.int64), block=2, mask=None)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        attention_torch.attention_bound_torch(kw.pop("q"), kw.pop("k"), kw.pop("v"), kw.pop("scores"),
                                              kw.pop("big_m"), kw.pop("rescales"), kw.pop("block"),
                                              U, UE, Q32, **kw)
