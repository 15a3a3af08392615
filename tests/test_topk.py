"""Oracles for analysis.topk: mpmath tail masses, brute-force minimal k, KL identity, gap bounds."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from softcert.analysis import topk

NINF = float("-inf")


def mp_probs(row, dps=50):
    """softmax of one row in mpmath; masked keys (-inf) get exactly 0."""
    with mpmath.workdps(dps):
        ys = [mpmath.mpf(0) if x == NINF else mpmath.exp(mpmath.mpf(float(x))) for x in row]
        z = mpmath.fsum(ys)
        return [y / z for y in ys]


def mp_tail(row, k, dps=50):
    """τ_k in mpmath: 1 - mass of the k largest unmasked scores (ties: any choice, same τ)."""
    if k == 0:
        return mpmath.mpf(1)  # exactly: nothing is kept
    with mpmath.workdps(dps):
        p = mp_probs(row, dps)
        order = sorted(range(len(row)), key=lambda i: -float(row[i]))
        head = [i for i in order if row[i] != NINF][:k]
        return mpmath.fsum(p[i] for i in range(len(row)) if i not in head)


def mp_minimal_k(row, eps):
    n_valid = sum(1 for x in row if x != NINF)
    for k in range(0, n_valid + 1):
        if mp_tail(row, k) <= eps:
            return k
    raise AssertionError("unreachable: τ_{n_valid} = 0")


# rows with ties (values from a small grid), masked keys, and wide ranges
tie_values = st.sampled_from([NINF, -30.0, -3.0, -1.0, 0.0, 0.0, 0.5, 1.0, 2.0, 7.5])
rows = st.lists(st.one_of(tie_values, st.floats(-40, 40)), min_size=1, max_size=12).filter(
    lambda r: any(x != NINF for x in r)
)
eps_values = st.sampled_from([1e-9, 1e-3, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9])


@given(rows, eps_values)
def test_certified_k_is_brute_force_minimum(row, eps):
    cert = topk.certify_topk(torch.tensor(row, dtype=torch.float64), eps)
    k = int(cert.k)
    true_k = mp_minimal_k(row, eps)
    # certified: the real tail mass at k is within ε, and the proved bound encloses it
    assert mp_tail(row, k) <= eps
    assert mp_tail(row, k) <= float(cert.tail_upper) + 0.0
    assert k >= true_k
    # minimality: proved rows are exactly the real minimum
    if bool(cert.minimal_proved):
        assert k == true_k
        assert float(cert.tail_lower_prev) <= mp_tail(row, k - 1)
    assert k == int(topk.certified_k(torch.tensor(row, dtype=torch.float64), eps))


def test_minimality_flag_on_exact_tie_with_eps():
    # 4 equal scores: τ_3 = 1/4 exactly, so ε = 0.25 admits k = 3 in real arithmetic, but no
    # float bound can prove τ_3 <= 0.25: k = 4 is certified and flagged as not provably minimal
    cert = topk.certify_topk(torch.zeros(4), 0.25)
    assert int(cert.k) == 4 and not bool(cert.minimal_proved)
    # just above, the real minimum is certified and proved
    cert = topk.certify_topk(torch.zeros(4), 0.25 + 1e-9)
    assert int(cert.k) == 3 and bool(cert.minimal_proved)


def test_minimal_proved_on_random_rows(rng):
    s = torch.from_numpy(rng.standard_normal((400, 64)) * 3)
    s[:50, 40:] = NINF
    cert = topk.certify_topk(s, 0.01)
    assert bool(cert.minimal_proved.all())
    assert bool((cert.tail_upper <= 0.01).all())
    prev = topk.tail_mass(s, cert.k - 1, rounding="down")
    assert bool((prev > 0.01).all())
    assert bool((cert.k <= cert.n_valid).all())


@given(rows, st.integers(0, 13))
def test_tail_mass_mpmath_oracle(row, k):
    s = torch.tensor(row, dtype=torch.float64)
    exact = mp_tail(row, k)
    lo = float(topk.tail_mass(s, k, rounding="down"))
    up = float(topk.tail_mass(s, k, rounding="up"))
    est = float(topk.tail_mass(s, k))
    assert lo <= exact <= up
    assert abs(est - exact) <= 1e-12 * exact + 1e-300
    assert up - lo <= 1e-12 * exact + 1e-290


def test_tail_mass_tiny_tails_are_relatively_accurate():
    # a tail of 1e-200 relative mass: summing the tail (not 1 - head) keeps it exact-ish
    row = [0.0, -460.0, -470.0, float("-inf")]
    exact = mp_tail(row, 1)
    est = float(topk.tail_mass(torch.tensor(row, dtype=torch.float64), 1))
    assert abs(est - exact) <= 1e-13 * exact
    assert exact < 1e-199


@given(rows, st.integers(0, 12))
def test_tv_equals_one_minus_exp_minus_kl(row, k):
    n_valid = sum(1 for x in row if x != NINF)
    k = min(k, n_valid)
    if k == 0:
        return  # KL(P̂‖P) undefined (P̂ empty); τ_0 = 1 is tested elsewhere
    with mpmath.workdps(50):
        p = mp_probs(row)
        order = [i for i in sorted(range(len(row)), key=lambda i: -row[i]) if row[i] != NINF]
        head = order[:k]
        mass = mpmath.fsum(p[i] for i in head)
        kl = mpmath.fsum((p[i] / mass) * mpmath.log((p[i] / mass) / p[i]) for i in head)
        tv_identity = 1 - mpmath.exp(-kl)
        # TV computed as a distance, not as a tail sum
        phat = [p[i] / mass if i in head else mpmath.mpf(0) for i in range(len(row))]
        tv = mpmath.fsum(abs(a - b) for a, b in zip(p, phat)) / 2
        assert abs(tv - tv_identity) < mpmath.mpf(10) ** -40
    s = torch.tensor(row, dtype=torch.float64)
    # the mpmath sums carry ~1e-50 absolute noise (k = n_valid: exactly 0 in reals)
    assert abs(float(topk.tail_mass(s, k)) - float(tv)) <= 1e-12 * float(tv) + 1e-45
    kl_f = float(topk.truncation_kl(s, k))
    assert abs(kl_f - float(kl)) <= 1e-11 * float(kl) + 1e-45


@given(rows, st.integers(0, 12))
def test_gap_bounds_dominate_exact_tail(row, k):
    s = torch.tensor(row, dtype=torch.float64)
    exact = mp_tail(row, k)
    single = float(topk.gap_bound(s, k))
    l2 = float(topk.multi_gap_bound(s, k, levels=2))
    l4 = float(topk.multi_gap_bound(s, k, levels=4))
    fine = float(topk.multi_gap_bound(s, k, levels=16))
    assert exact <= fine and max(fine, l4, l2, single) <= 1.0
    # nested rank groups refine the bound (up to the margins, which grow with the block count)
    slack = 1 + 1e-12
    assert fine <= l4 * slack and l4 <= l2 * slack and l2 <= single * slack
    # with singleton rank groups the blockwise bound is the exact tail mass (up to rounding)
    assert fine <= exact * (1 + 1e-12) + 1e-290


def test_single_gap_formula_value():
    # s = (2, 2, 0, 0, 0): k = 2, g = 2, n = 5 → 3e^{-2}/(2 + 3e^{-2})
    s = torch.tensor([2.0, 0.0, 2.0, 0.0, 0.0, NINF])
    expect = 3 * math.exp(-2) / (2 + 3 * math.exp(-2))
    got = float(topk.gap_bound(s, 2))
    assert expect <= got <= expect * (1 + 1e-12)
    # here every head score equals s_(k) and every tail score s_(k+1): the bound is exact
    assert abs(got - float(topk.tail_mass(s, 2))) <= 1e-12


def test_blockwise_from_key_blocks_dominates_exact(rng):
    # 8 blocks of 16 keys; block score bounds [min, max] widened; head = 3 best blocks by upper
    for _ in range(20):
        s = rng.standard_normal(128) * 2 + np.repeat(rng.standard_normal(8) * 3, 16)
        blocks = s.reshape(8, 16)
        lo = blocks.min(1) - rng.random(8) * 0.1
        hi = blocks.max(1) + rng.random(8) * 0.1
        head = np.argsort(-hi)[:3]
        tail = np.setdiff1d(np.arange(8), head)
        bound = float(topk.blockwise_bound(lo[head], 16.0, hi[tail], 16.0))
        with mpmath.workdps(50):
            w = [mpmath.exp(mpmath.mpf(float(x))) for x in s]
            tail_w = mpmath.fsum(w[b * 16 + i] for b in tail for i in range(16))
            exact = tail_w / mpmath.fsum(w)
        assert exact <= bound <= 1.0


def test_key_block_bounds_enclose_scores_and_certify(rng):
    d, n, bs = 16, 64, 8
    for _ in range(10):
        centres = np.repeat(rng.standard_normal((n // bs, d)) * 2, bs, axis=0)
        K = centres + rng.standard_normal((n, d)) * 0.2
        q = rng.standard_normal(d)
        lo, up, sizes = topk.key_block_score_bounds(q, K, bs, scale=0.25)
        with mpmath.workdps(50):
            exact = [mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b))
                                 for a, b in zip(q, row)) * mpmath.mpf(0.25) for row in K]
        for i, v in enumerate(exact):
            assert float(lo[i // bs]) <= v <= float(up[i // bs])
        head = np.argsort(-up.numpy())[:3]
        tail = np.setdiff1d(np.arange(n // bs), head)
        bound = float(topk.blockwise_bound(lo[head], sizes[head], up[tail], sizes[tail]))
        with mpmath.workdps(50):
            w = [mpmath.exp(v) for v in exact]
            tail_mass = mpmath.fsum(w[b * bs + i] for b in tail for i in range(bs)) / mpmath.fsum(w)
        assert tail_mass <= bound <= 1.0


def test_blockwise_rejects_empty_rows():
    with pytest.raises(ValueError, match="no finite"):
        topk.blockwise_bound([0.0], [0.0], [1.0], [0.0])


def mp_attention_error(row, V, k):
    if k >= sum(1 for x in row if x != NINF):
        return mpmath.mpf(0)  # nothing truncated
    with mpmath.workdps(50):
        p = mp_probs(row)
        order = [i for i in sorted(range(len(row)), key=lambda i: -row[i]) if row[i] != NINF]
        head = order[:k]
        mass = mpmath.fsum(p[i] for i in head)
        d = len(V[0])
        full = [mpmath.fsum(p[i] * mpmath.mpf(float(V[i][j])) for i in range(len(row)))
                for j in range(d)]
        trunc = [mpmath.fsum(p[i] * mpmath.mpf(float(V[i][j])) for i in head) / mass
                 for j in range(d)]
        return mpmath.sqrt(mpmath.fsum((a - b) ** 2 for a, b in zip(full, trunc)))


@given(rows, st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_output_error_identity_and_bounds(row, k, seed):
    r = np.random.default_rng(seed)
    n = len(row)
    V = r.standard_normal((n, 3)) * r.choice([0.1, 1.0, 10.0])
    res = topk.output_error_bound(torch.tensor(row, dtype=torch.float64), torch.from_numpy(V), k)
    exact = float(mp_attention_error(row, V.tolist(), min(k, sum(x != NINF for x in row))))
    assert abs(float(res.exact) - exact) <= 1e-9 * exact + 1e-12 * np.abs(V).max()
    for b in (res.diameter, res.variance, res.norm):
        assert exact <= float(b)


def test_output_error_takes_attention_shaped_values_as_they_are(rng):
    """extract_attention's per-sequence scores (L, H, T, T) and values (L, H, T, d) go in as
    they are (issue 32: they were refused), meaning P·V: the same as the singleton query axis."""
    s = torch.from_numpy(rng.standard_normal((2, 3, 6, 6)))
    V = torch.from_numpy(rng.standard_normal((2, 3, 6, 4)))
    res = topk.output_error_bound(s, V, 2)
    ref = topk.output_error_bound(s, V.unsqueeze(-3), 2)
    assert res.exact.shape == (2, 3, 6)
    for a, b in zip((res.exact, res.diameter, res.norm), (ref.exact, ref.diameter, ref.norm)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0.0)
    full = torch.softmax(s, -1) @ V  # the oracle: top-2 attention against full attention
    idx = s.topk(2, dim=-1).indices
    head = torch.zeros_like(s, dtype=torch.bool).scatter(-1, idx, True)
    p = torch.softmax(s.masked_fill(~head, float("-inf")), -1)
    exact = (full - p @ V).norm(dim=-1)
    assert torch.allclose(res.exact, exact, rtol=1e-12, atol=1e-14)
    assert (exact <= res.norm + 1e-15).all()


def test_output_error_batched_shared_values(rng):
    s = torch.from_numpy(rng.standard_normal((2, 3, 5, 7)))
    s[..., 5:] = NINF
    V = torch.from_numpy(rng.standard_normal((2, 3, 1, 7, 4)))
    res = topk.output_error_bound(s, V, 3)
    assert res.exact.shape == (2, 3, 5)
    V = V.squeeze(-3)
    full = torch.softmax(s, -1) @ V
    idx = s.topk(3, dim=-1).indices
    sk = torch.full_like(s, NINF).scatter(-1, idx, s.gather(-1, idx))
    trunc = torch.softmax(sk, -1) @ V
    direct = torch.linalg.vector_norm(full - trunc, dim=-1)
    torch.testing.assert_close(res.exact, direct, rtol=1e-9, atol=1e-12)
    assert bool((res.diameter >= direct).all() and (res.variance >= direct).all())


def test_gaussian_rule_design_values():
    for (sigma, eps), expect in {
        (1, 0.1): 0.6109, (2, 0.01): 0.6279, (3, 0.01): 0.2503, (4, 0.01): 0.0471,
    }.items():
        assert abs(topk.gaussian_k_fraction(sigma, eps) - expect) < 5e-5


def test_gaussian_rule_matches_large_gaussian_rows(rng):
    # σ² << log n: the rule should describe certified k/n of Gaussian rows
    s = torch.from_numpy(rng.standard_normal((4, 20000)) * 1.0)
    chk = topk.gaussian_rule_check(s, 0.1)
    assert bool((abs(chk.measured_fraction - chk.predicted_fraction) < 0.01).all())
    assert bool((abs(chk.sigma - 1.0) < 0.02).all())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: topk.certified_k(torch.tensor([0.0, float("nan")]), 0.1), "NaN"),
        (lambda: topk.certified_k(torch.tensor([[0.0, 1.0], [NINF, NINF]]), 0.1), "masked"),
        (lambda: topk.certified_k(torch.tensor([0.0, float("inf")]), 0.1), r"\+inf"),
        (lambda: topk.certified_k(torch.zeros(3), 0.0), "eps"),
        (lambda: topk.certified_k(torch.zeros(3), 1.0), "eps"),
        (lambda: topk.certified_k(torch.zeros(3), float("nan")), "eps"),
        (lambda: topk.certified_k(torch.zeros(3), "x"), "eps"),
        (lambda: topk.certified_k(torch.zeros(3, 0), 0.1), "empty"),
        (lambda: topk.tail_mass(torch.zeros(3), -1), "k"),
        (lambda: topk.tail_mass(torch.zeros(3), 1.5), "k"),
        (lambda: topk.tail_mass(torch.zeros(2, 3), torch.tensor([1, 2, 3])), "k"),
        (lambda: topk.tail_mass(torch.zeros(3), 1, rounding="sideways"), "rounding"),
        (lambda: topk.gap_bound(torch.tensor([NINF]), 1), "masked"),
        (lambda: topk.multi_gap_bound(torch.zeros(3), 1, levels=0), "levels"),
        (lambda: topk.output_error_bound(torch.zeros(3), torch.zeros(4, 2), 1), "values"),
        (lambda: topk.output_error_bound(torch.zeros(3), torch.zeros(3), 1), "values"),
        (lambda: topk.gaussian_k_fraction(1.0, 1.5), "eps"),
        (lambda: topk.gaussian_k_fraction(-1.0, 0.1), "sigma"),
        (lambda: topk.key_block_score_bounds(torch.zeros(3), torch.zeros(8, 3), 3), "block_size"),
        (lambda: topk.key_block_score_bounds(torch.zeros(3), torch.zeros(8, 2), 4), "keys"),
        (lambda: topk.key_block_score_bounds(torch.zeros(3), torch.zeros(8, 3), 4, -1.0), "scale"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_exact_endpoints():
    s = torch.tensor([[1.0, 0.0, NINF], [5.0, 5.0, 5.0]])
    assert topk.tail_mass(s, 0).tolist() == [1.0, 1.0]
    assert topk.tail_mass(s, torch.tensor([2, 3]), rounding="up").tolist() == [0.0, 0.0]
    assert topk.gap_bound(s, 0).tolist() == [1.0, 1.0]
    assert topk.gap_bound(s, 7).tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- subnormal weights
# A weight below the normal range carries an absolute error (kernels.floating.EXP_ABS); in a
# block bound it stands for a whole block, so that error is multiplied by the block size.
BACKENDS = pytest.mark.parametrize("backend", ["torch", "numba"])


def mp_group_tail(groups, k):
    """τ_k of the row made of ``count`` copies of each ``score`` in ``groups``, in mpmath."""
    with mpmath.workdps(50):
        gs = sorted(((mpmath.exp(mpmath.mpf(s)), c) for s, c in groups), key=lambda g: -g[0])
        z = mpmath.fsum(w * c for w, c in gs)
        head, tail = k, mpmath.mpf(0)
        for w, c in gs:
            taken = min(head, c)
            head -= taken
            tail += w * (c - taken)
        return tail / z


def group_row(groups):
    return torch.tensor([s for s, c in groups for _ in range(c)], dtype=torch.float64)


def mp_block_formula(L, nh, U, nt):
    """Σ_T|B|e^{U_b} / (Σ_H|B|e^{L_b} + Σ_T|B|e^{U_b}) in mpmath (the quantity bounded)."""
    with mpmath.workdps(50):
        t = mpmath.fsum(mpmath.mpf(c) * mpmath.exp(mpmath.mpf(u)) for u, c in zip(U, nt))
        h = mpmath.fsum(mpmath.mpf(c) * mpmath.exp(mpmath.mpf(x)) for x, c in zip(L, nh))
        return t / (h + t)


@BACKENDS
def test_gap_bound_covers_a_subnormal_tail_of_many_keys(backend):
    # reported: 1.150037e-318 against the exact 1.3883725e-318 (n*TINY slack, not n*exp error)
    groups = [(0.0, 1), (-744.1, 200000)]
    s, exact = group_row(groups), mp_group_tail(groups, 1)
    assert exact > 1.38e-318
    assert float(topk.gap_bound(s, 1, backend=backend)) >= exact
    assert float(topk.multi_gap_bound(s, 1, 3, backend=backend)) >= exact
    assert float(topk.tail_mass(s, 1, rounding="down", backend=backend)) <= exact
    assert exact <= float(topk.tail_mass(s, 1, rounding="up", backend=backend)) <= 1e-316


@BACKENDS
@pytest.mark.parametrize("U, nt", [(-744.1, 1e6), (-746.0, 2.0 ** 40)])
def test_blockwise_covers_a_subnormal_block_weight_times_its_size(backend, U, nt):
    # reported: 5.10e-318 against 6.94e-318, and 1.6e-319 against 1.14e-312
    exact = mp_block_formula([0.0], [1.0], [U], [nt])
    bound = float(topk.blockwise_bound([0.0], [1.0], [U], [nt], backend=backend))
    assert exact <= bound <= 100 * exact


subnormal_scores = st.one_of(
    st.floats(-760.0, -700.0),
    st.floats(-2.0, 0.0),
    st.sampled_from([0.0, -708.4, -744.1, -744.44, -745.13, -745.2, -746.0, -800.0, NINF]),
)


@BACKENDS
@given(st.lists(st.tuples(subnormal_scores, st.integers(1, 3000)), min_size=1, max_size=4),
       st.integers(0, 13000), st.sampled_from([1e-320, 1e-310, 1e-300, 1e-12, 0.01]))
def test_tail_bounds_enclose_subnormal_tails(backend, groups, k, eps):
    groups = [(0.0, 1)] + groups  # the maximum is 0: the other weights may be subnormal
    s = group_row(groups)
    n_valid = int(torch.isfinite(s).sum())
    k = min(k, n_valid)
    exact = mp_group_tail([g for g in groups if g[0] != NINF], k)
    assert float(topk.tail_mass(s, k, rounding="down", backend=backend)) <= exact
    assert exact <= float(topk.tail_mass(s, k, rounding="up", backend=backend))
    for levels in (1, 2, 5):
        assert exact <= float(topk.multi_gap_bound(s, k, levels, backend=backend))
    assert exact <= float(topk.gap_bound(s, k, backend=backend))
    cert = topk.certify_topk(s, eps, backend=backend)
    kc = int(cert.k)
    tail_k = mp_group_tail([g for g in groups if g[0] != NINF], kc)
    assert tail_k <= float(cert.tail_upper) <= eps
    if kc > 0:
        assert float(cert.tail_lower_prev) <= mp_group_tail(
            [g for g in groups if g[0] != NINF], kc - 1)


block_sizes = st.one_of(st.integers(1, 2 ** 50).map(float), st.floats(0.5, 2.0 ** 45))


@BACKENDS
@given(st.lists(st.tuples(st.floats(-3.0, 0.0), block_sizes), min_size=1, max_size=3),
       st.lists(st.tuples(st.one_of(st.floats(-790.0, -700.0), st.floats(-40.0, 0.0)),
                          block_sizes), min_size=1, max_size=4))
def test_blockwise_encloses_the_block_formula_with_huge_blocks(backend, head, tail):
    L, nh = zip(*head)
    U, nt = zip(*tail)
    exact = mp_block_formula(L, nh, U, nt)
    bound = float(topk.blockwise_bound(list(L), list(nh), list(U), list(nt), backend=backend))
    assert exact <= bound <= 1.0


@BACKENDS
@given(st.floats(-760.0, -700.0), st.integers(1, 40), st.integers(1, 3),
       st.floats(1.0, 1e100))
def test_output_error_bounds_cover_subnormal_tail_probabilities(backend, x, m, h, B):
    # h head keys at 0 with value 0, m tail keys at x with value B: err = τ·B exactly
    s = torch.tensor([0.0] * h + [x] * m, dtype=torch.float64)
    V = torch.tensor([[0.0]] * h + [[B]] * m, dtype=torch.float64)
    with mpmath.workdps(50):
        tau = m * mpmath.exp(mpmath.mpf(x)) / (h + m * mpmath.exp(mpmath.mpf(x)))
        exact = tau * mpmath.mpf(B)
    res = topk.output_error_bound(s, V, h, backend=backend)
    for b in (res.diameter, res.variance, res.norm):
        assert exact <= float(b)


@pytest.mark.parametrize("backend", ["torch", "numba", "triton", "auto"])
def test_tail_mass_and_certificates_are_computed_where_the_scores_are(backend):
    """Inside ``with torch.device("meta")`` a tensor made without an explicit device has no
    values and cannot mix with CPU tensors: a run on CPU scores there fails wherever the
    certificate creates a tensor that does not follow its scores (what would break on a
    GPU); outside it, the same numbers, on the scores' device."""
    if backend == "triton":
        pytest.importorskip("triton")
    s = torch.randn(5, 9, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3
    s[1, :4] = float("-inf")
    plain = (topk.tail_mass(s, 3, rounding="up", backend=backend), topk.certify_topk(s, 0.05, backend=backend))
    with torch.device("meta"):
        here = (topk.tail_mass(s, 3, rounding="up", backend=backend), topk.certify_topk(s, 0.05, backend=backend))
    assert here[0].device.type == "cpu" and torch.equal(here[0], plain[0])
    for f in ("k", "tail_upper", "tail_lower_prev", "minimal_proved"):
        a, b = getattr(here[1], f), getattr(plain[1], f)
        assert a.device.type == "cpu" and torch.equal(a, b), f


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["torch", "numba", "triton", "auto"])
def test_cuda_scores_give_cuda_certificates_equal_in_k_to_the_cpu(backend):
    s = torch.randn(64, 128, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 4
    cpu = topk.certify_topk(s, 0.01, backend="numba")
    gpu = topk.certify_topk(s.cuda(), 0.01, backend=backend)
    assert gpu.k.device.type == "cuda" and gpu.tail_upper.device.type == "cuda"
    # proved bounds from another summation order: k may differ only where a tail sits at eps
    assert (gpu.tail_upper.cpu() <= 0.01).all() and ((gpu.k.cpu() - cpu.k).abs() <= 1).all()
