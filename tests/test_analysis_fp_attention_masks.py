"""Masks, causal rows and half-precision inputs of analysis.fp.attention (issue 32), and the
a-priori bound's edge cases. Oracles: the masked attention of the (lifted) inputs in float64
and in 50-digit mpmath, and torch's scaled_dot_product_attention in float64; every comparison
is |out - reference| <= bound, never bit equality (docs/fp/attention.md, sections 6-8)."""
from __future__ import annotations

import json
import math
import os

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_reference import reference64, slack64
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert.analysis import fp

BACKENDS = ["numba", "triton"]


def check(res, ref, v):
    """Asserts |out - ref| <= bound elementwise; returns the worst error / bound."""
    out, bound = (np.asarray(x, dtype=np.float64) for x in (res.out, res.bound))
    err = np.abs(out - ref)
    n, d = np.shape(v)[-2], 64
    assert (err <= bound + slack64(v, n, d)).all(), float(np.max(err - bound))
    return float(np.max(np.where(bound > 0, err / np.where(bound > 0, bound, 1.0), 0.0)))


def random_mask(rng, shape, density):
    """A random mask with a row of one attended key and a row of none."""
    m = rng.random(shape) < density
    m[..., 0, :] = False
    m[..., 0, rng.integers(shape[-1])] = True
    if shape[-2] > 2:
        m[..., 1, :] = False
    return m


def causal_inputs(kind, n, d, rng):
    """(q (2, n, d), k (2, n, d), v (2, n, 6)) float32 for causal rows: "random", ties
    ("equal_scores": every score 0), "ascending" (a rescale in every tile), "large_scores"
    (spreads ~hundreds), "wide_range" (exps below the float32 normal range)."""
    q, k = rng.normal(size=(2, n, d)), rng.normal(size=(2, n, d))
    v = rng.normal(size=(2, n, 6))
    if kind == "equal_scores":
        q[:] = 0.0
    elif kind == "ascending":
        q[:] = 0.0
        q[..., 0] = 1.0
        k[..., 0] = np.linspace(0.0, 40.0, n)
    elif kind == "large_scores":
        q, k = q * 6.0, k * 6.0
    elif kind == "wide_range":
        k[..., 0] = rng.uniform(-1, 1, size=(2, n)) * 60.0
        q[..., 0] = 20.0
    return tuple(np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("density", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("block", [1, 7, 32])
def test_mask_bound_holds_against_the_float64_reference(backend, density, block):
    rng = np.random.default_rng(int(density * 100) + block)
    lead, n = ((2, 3), 90) if backend == "numba" else ((1, 2), 40)  # the interpreter is slow
    q = (rng.normal(size=lead + (12, 16)) * 3).astype(np.float32)
    k = (rng.normal(size=lead + (n, 16)) * 3).astype(np.float32)
    v = rng.normal(size=lead + (n, 5)).astype(np.float32)
    mask = random_mask(rng, lead + (12, n), density)
    res = fp.attention(q, k, v, block=block, backend=backend, mask=mask)
    check(res, reference64(q, k, v, mask), v)
    assert (res.out[..., 1, :] == 0).all() and (res.bound[..., 1, :] == 0).all()  # no key
    assert res.masked == "mask" and "attended keys only" in res.assumptions


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the unmasked run overflows
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_keys_contribute_exactly_nothing(backend):
    """Masked keys whose scores would overflow float32 and whose values are 1e30: skipped,
    so the run neither overflows nor moves the output off the attended keys' attention."""
    rng = np.random.default_rng(5)
    q = np.abs(rng.normal(size=(4, 8))).astype(np.float32)  # masked scores: +inf
    k = rng.normal(size=(20, 8)).astype(np.float32)
    v = rng.normal(size=(20, 3)).astype(np.float32)
    mask = np.ones((4, 20), bool)
    mask[:, 5:9] = False
    k[5:9] = 3e38
    v[5:9] = 1e30
    res = fp.attention(q, k, v, block=4, backend=backend, mask=mask)
    check(res, reference64(q, k, v, mask), v[mask[0]])
    with pytest.raises(ValueError, match="overflowed"):
        fp.attention(q, k, v, block=4, backend=backend)


def test_the_masked_oracle_can_fail():
    """The comparison has teeth: ignoring the mask, or a bound 30x smaller than the proven
    one, is caught by the same references."""
    rng = np.random.default_rng(6)
    q, k, v = fp.attention_stress_inputs("equal_scores", 600, 16, rng)
    mask = rng.random((4, 600)) < 0.7
    res = fp.attention(q, k, v, block=64, mask=mask)
    err = np.abs(res.out.astype(np.float64) - reference64(q, k, v, mask))
    assert (err <= res.bound).all() and (err > res.bound / 30).any()
    q, k, v = fp.attention_stress_inputs("random", 600, 16, rng)
    unmasked = fp.attention(q, k, v, block=64)
    assert (np.abs(unmasked.out - reference64(q, k, v, mask)) > unmasked.bound).any()


def test_mpmath_reference_with_one_key_rows_and_ties():
    """50-digit masked attention (no float64 anywhere): spreads ~100, a one-key row, ties."""
    rng = np.random.default_rng(7)
    q = (rng.normal(size=(1, 4, 4)) * 5).astype(np.float32)
    k = (rng.normal(size=(1, 11, 4)) * 5).astype(np.float32)
    k[0, 6] = k[0, 2]  # a tie
    v = rng.normal(size=(1, 11, 3)).astype(np.float32)
    mask = rng.random((4, 11)) < 0.6
    mask[0] = False
    mask[0, 9] = True
    mask[1, [2, 6]] = True
    for block in (1, 3, 11):
        res = fp.attention(q, k, v, block=block, mask=mask)
        with mpmath.workdps(50):
            for i in range(4):
                s = {j: mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b))
                                    for a, b in zip(q[0, i], k[0, j])) / 2 for j in range(11)
                     if mask[i, j]}
                w = {j: mpmath.exp(x - max(s.values())) for j, x in s.items()}
                for c in range(3):
                    o = mpmath.fsum(w[j] * mpmath.mpf(float(v[0, j, c])) for j in w) / mpmath.fsum(w.values())
                    assert abs(mpmath.mpf(float(res.out[0, i, c])) - o) <= mpmath.mpf(float(res.bound[0, i, c]))


@pytest.mark.parametrize("mask_shape", [(12, 30), (1, 30), (2, 1, 1, 30), (3, 12, 1), (30,)])
def test_broadcast_masks(mask_shape):
    """Padding masks (..., 1, n), one mask for every head (nq, n), per-row all-or-nothing."""
    rng = np.random.default_rng(sum(mask_shape))
    q = rng.normal(size=(2, 3, 12, 8)).astype(np.float32)
    k = rng.normal(size=(2, 3, 30, 8)).astype(np.float32)
    v = rng.normal(size=(2, 3, 30, 4)).astype(np.float32)
    mask = rng.random(mask_shape) < 0.6
    full = np.broadcast_to(mask, (2, 3, 12, 30))
    for backend in BACKENDS:
        check(fp.attention(q, k, v, block=8, backend=backend, mask=mask),
              reference64(q, k, v, full), v)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200), st.integers(1, 20), st.sampled_from([1, 5, 16, 128]),
       st.floats(0.01, 8.0), st.floats(0.0, 1.0), st.booleans(), st.integers(0, 2**31 - 1))
def test_property_masked_and_causal_rows(n, d, block, qk_scale, density, causal, seed):
    """Any n, d, block, score scale (spreads up to ~thousands), mask density or causal."""
    rng = np.random.default_rng(seed)
    q = (rng.normal(size=(2, 7, d)) * qk_scale).astype(np.float32)
    k = (rng.normal(size=(2, n, d)) * qk_scale).astype(np.float32)
    v = rng.normal(size=(2, n, 3)).astype(np.float32)
    mask = np.tril(np.ones((7, n), bool)) if causal else rng.random((2, 7, n)) < density
    res = fp.attention(q, k, v, block=block, causal=causal, mask=None if causal else mask)
    check(res, reference64(q, k, v, mask), v)


# ----------------------------------------------------------------------------- causal


@pytest.mark.parametrize("kind", ["random", "equal_scores", "ascending", "large_scores",
                                  "wide_range"])
@pytest.mark.parametrize("n", [1, 37, 300])
def test_causal_bound_holds_on_stress_inputs(kind, n):
    rng = np.random.default_rng(n)
    q, k, v = causal_inputs(kind, n, 16, rng)
    tril = np.tril(np.ones((n, n), bool))
    for block in (1, 16, 128):
        res = fp.attention(q, k, v, block=block, causal=True)
        worst = check(res, reference64(q, k, v, tril), v)
        assert res.masked == "causal"
    assert n == 1 or worst > 0.0


def test_causal_rows_use_their_own_key_count():
    """Row i of a causal run is the unmasked algorithm on its i + 1 keys: the a-priori bound
    of min(i + 1, n) keys dominates its a-posteriori bound, and early rows get smaller bounds
    than the full row on the equal-weights input (the bound grows with n_row)."""
    rng = np.random.default_rng(8)
    n, d = 400, 16
    q, k, v = causal_inputs("large_scores", n, d, rng)
    res = fp.attention(q, k, v, block=32, causal=True)
    qk = np.abs(q.astype(np.float64))[..., :, None, :] * np.abs(k.astype(np.float64))[..., None, :, :]
    qk_abs = float(qk.sum(-1).max()) / 4.0
    vmax = np.abs(v.astype(np.float64)).max()
    for i in (0, 5, 31, 32, 200, 399):
        ap = fp.attention_error_bound(i + 1, d, 32, qk_abs=qk_abs)
        assert (res.bound[:, i] <= ap.coeff * vmax + ap.abs_floor).all()
    q0, k0, v0 = causal_inputs("equal_scores", n, d, rng)
    eq = fp.attention(q0, k0, np.abs(v0) + 1, block=400, causal=True)
    assert eq.bound[:, 10].max() < eq.bound[:, 399].min()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nq,n", [(9, 9), (5, 13), (13, 5)])
def test_agrees_with_torch_sdpa_in_float64(backend, nq, n):
    """torch.nn.functional.scaled_dot_product_attention in float64, is_causal (top-left, also
    for nq != n) and a boolean attn_mask with a fully masked row: within the bound."""
    rng = np.random.default_rng(nq * n)
    q = (rng.normal(size=(2, nq, 8)) * 2).astype(np.float32)
    k = (rng.normal(size=(2, n, 8)) * 2).astype(np.float32)
    v = rng.normal(size=(2, n, 3)).astype(np.float32)
    t64 = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    res = fp.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), block=4,
                       backend=backend, causal=True)
    check(res, F.scaled_dot_product_attention(*t64, is_causal=True).numpy(), v)
    mask = torch.from_numpy(random_mask(rng, (nq, n), 0.5))
    res = fp.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), block=4,
                       backend=backend, mask=mask)
    assert isinstance(res.out, torch.Tensor) and res.out.dtype == torch.float32
    ref = F.scaled_dot_product_attention(*t64, attn_mask=mask).numpy()
    if nq > 2:
        assert (ref[:, 1] == 0).all()  # torch's convention for a row without keys
    check(res, ref, v)


def test_triton_and_numba_agree_within_their_bounds_under_masks():
    rng = np.random.default_rng(9)
    q, k, v = causal_inputs("ascending", 48, 8, rng)
    mask = random_mask(rng, (2, 48, 48), 0.4)
    for kw in (dict(causal=True), dict(mask=mask)):
        t = fp.attention(q, k, v, block=8, backend="triton", **kw)
        nb = fp.attention(q, k, v, block=8, backend="numba", **kw)
        assert (np.abs(t.out.astype(np.float64) - nb.out) <= t.bound + nb.bound).all()
        # "ascending" scores are single exact products (q has one nonzero entry): the same in
        # any summation order, so both backends see the same maxima and rescale alike
        assert (t.rescales == nb.rescales).all()


# ----------------------------------------------------------------------------- half inputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("as_torch", [False, True])
def test_half_precision_inputs_lift_exactly(dtype, as_torch):
    """float16/bfloat16 q, k, v: computed in float32, bounded against the exact attention of
    the given half-precision values; out is float32 and the result says what was lifted."""
    rng = np.random.default_rng(10)
    tdt = getattr(torch, dtype)
    halves = [torch.from_numpy(rng.normal(size=s)).to(tdt) for s in ((2, 6, 16), (2, 50, 16), (2, 50, 4))]
    exact = [x.float().numpy() for x in halves]  # the values themselves (the lift is exact)
    if as_torch:
        args = halves
    elif dtype == "float16":
        args = [x.astype(np.float16) for x in exact]
    else:  # numpy has no bfloat16: ml_dtypes' (installed with onnx)
        args = [x.astype(pytest.importorskip("ml_dtypes").bfloat16) for x in exact]
    assert as_torch or all((a.astype(np.float64) == e).all() for a, e in zip(args, exact))
    for kw in (dict(), dict(causal=True)):
        res = fp.attention(*args, block=8, **kw)
        mask = np.tril(np.ones((6, 50), bool)) if kw else None
        check(res, reference64(*exact, mask), exact[2])
        out = res.out.numpy() if as_torch else res.out
        assert out.dtype == np.float32 and res.input_dtypes == (dtype,) * 3
        assert f"q ({dtype})" in res.assumptions and "lifted exactly" in res.assumptions


def test_mixed_input_formats():
    rng = np.random.default_rng(11)
    q = rng.normal(size=(5, 8)).astype(np.float16)
    k = rng.normal(size=(9, 8)).astype(np.float32)
    v = torch.from_numpy(rng.normal(size=(9, 3))).to(torch.bfloat16)
    res = fp.attention(q, k, v, block=4)
    check(res, reference64(q, k, v.float().numpy()), v.float().numpy())
    assert res.input_dtypes == ("float16", "float32", "bfloat16")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args,match", [
    (dict(mask=np.ones((2, 3), np.float32)), "mask: expected a boolean"),
    (dict(mask=np.ones((2, 3), np.int64)), "mask: expected a boolean"),
    (dict(mask=torch.zeros(2, 3)), "mask: expected a boolean"),
    (dict(mask=np.ones((2, 4), bool)), "mask: shape"),
    (dict(mask=np.ones((3, 2, 3), bool)), "mask: shape"),
    (dict(mask=np.ones((2, 3), bool), causal=True), "mask, causal"),
    (dict(causal=1), "causal: expected a bool"),
    (dict(causal=np.ones((2, 3), bool)), "causal: expected a bool"),
    (dict(q=np.zeros((2, 4), np.float64)), "q: expected float32"),
    (dict(k=np.zeros((3, 4), np.int8)), "k: expected float32"),
    (dict(v=np.full((3, 4), np.inf, np.float16)), "v: contains NaN"),
])
def test_bad_input_names_the_argument(args, match):
    kw = dict(q=np.zeros((2, 4), np.float32), k=np.zeros((3, 4), np.float32),
              v=np.zeros((3, 4), np.float32), block=2)
    kw.update(args)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=match):
            fp.attention(backend=backend, **kw)


# ----------------------------------------------------------------------------- a priori


def _fields(b):
    return [val for val in b.__dict__.values() if isinstance(val, float)]


@pytest.mark.parametrize("dtype", fp.DTYPES)
def test_apriori_never_nan_nor_raises_on_edge_inputs(dtype):
    """Edge inputs (n = 1, d = 1, d u >= 1, qk_abs = 0 or huge, huge n with block 1, zero
    spread): every field is a number or inf, never NaN, and no exception (issue 32)."""
    u = fp.FORMATS[dtype].u
    big_d = int(round(1 / u))
    for n, d, block in [(1, 1, 1), (1, 1, 128), (2, 1, 1), (10**6, 64, 1), (2**40, 64, 1),
                        (64, big_d - 1, 8), (64, big_d, 8), (64, 2 * big_d, 8)]:
        for score_range in (None, 0.0, 1e300):
            for qk_abs in (None, 0.0, 1.0, 1e300):
                b = fp.attention_error_bound(n, d, block, dtype, score_range=score_range,
                                             qk_abs=qk_abs)
                assert not any(math.isnan(x) for x in _fields(b)), (n, d, block, qk_abs)
                assert "NaN" not in json.dumps(b.__dict__)
                assert b.coeff >= b.fp_coeff > 0 and b.abs_floor > 0
                if d * u >= 1:
                    assert b.score_rel == math.inf
                    if qk_abs == 0.0:  # products are 0: no inf * 0
                        assert math.isfinite(b.score_coeff)
                    elif qk_abs is not None:
                        assert b.score_coeff == math.inf
                if n >= 2**40 and dtype != "float64":  # P = e^{2^40 (2k + 3) u}: inf
                    assert b.rho == b.coeff == math.inf
    tiny = fp.attention_error_bound(1, 1, 1, dtype, score_range=0.0, qk_abs=0.0)
    assert math.isfinite(tiny.coeff) and tiny.sum_roundings == 2


def test_apriori_n_row_dominates_masked_rows():
    """attention_error_bound(n, d, block, n_row=r) bounds every row attending r keys: it
    dominates the a-posteriori bound of masked rows (keys scattered over tiles)."""
    rng = np.random.default_rng(12)
    n, d, block = 512, 16, 32
    q = rng.normal(size=(6, d)).astype(np.float32)
    k = rng.normal(size=(n, d)).astype(np.float32)
    v = rng.normal(size=(n, 4)).astype(np.float32)
    mask = np.zeros((6, n), bool)
    for i, r in enumerate((1, 2, 16, 17, 100, 512)):
        mask[i, rng.choice(n, r, replace=False)] = True
    res = fp.attention(q, k, v, block=block, mask=mask)
    qk_abs = float((np.abs(q.astype(np.float64))[:, None] * np.abs(k)[None]).sum(-1).max()) / 4
    vmax = np.abs(v.astype(np.float64)).max(0)
    for i in range(6):
        r = int(mask[i].sum())
        ap = fp.attention_error_bound(n, d, block, qk_abs=qk_abs, n_row=r)
        assert (res.bound[i] <= ap.coeff * vmax + ap.abs_floor).all(), r
        assert ap.sum_roundings == min(block, r) + 2 * min(-(-n // block), r) - 1
    full = fp.attention_error_bound(n, d, block)
    assert fp.attention_error_bound(n, d, block, n_row=n).coeff == full.coeff
    assert fp.attention_error_bound(n, d, block, n_row=3).coeff < full.coeff
    for bad in (0, n + 1, 2.5):
        with pytest.raises(ValueError, match="n_row"):
            fp.attention_error_bound(n, d, block, n_row=bad)


@pytest.mark.skipif(os.environ.get("SOFTCERT_NO_MODEL") == "1", reason="model tests disabled")
def test_minilm_heads_with_a_padding_mask():
    """Real all-MiniLM-L6-v2 q/k/v with the last keys masked as padding, causal too."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("transformers")
    (q, k, v), = fp.minilm_qkv(["Attention heads read keys and values from every earlier token."])
    n = k.shape[-2]
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[0, n - 3:] = False
    for kw in (dict(mask=mask), dict(causal=True)):
        res = fp.attention(q, k, v, block=4, **kw)
        full = np.broadcast_to(mask.numpy(), q.shape[:-1] + (n,)) if "mask" in kw else np.tril(np.ones((n, n), bool))
        check(res, reference64(q.numpy(), k.numpy(), v.numpy(), full), v.numpy())
