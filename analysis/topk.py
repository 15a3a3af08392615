"""Top-k truncation certificates: tail mass, minimal certified k, gap and output-error bounds.

P = softmax(s) over the keys of a row, H = the k largest scores, P̂ = P restricted to H and
renormalised. Then (docs/mathematics.md §3, checked in tests/test_topk.py)

- TV(P, P̂) = τ_k = 1 - Σ_{i∈H} P_i (the tail mass), and τ_k = 1 - exp(-KL(P̂‖P));
- Attn - Attn_k = τ(μ_T - μ_H) exactly (μ = P-weighted value means over tail / head), so
  ‖err‖ <= τ·max_{i∈H, j∈T}‖v_i - v_j‖ and ‖err‖ <= sqrt(τ/(1-τ)·Var_P(V));
- from ordered logits only: τ <= (n-k)e^{-g}/(k + (n-k)e^{-g}), g = s_(k) - s_(k+1); more
  generally, with blocks of keys whose scores are bounded (L_b below on head blocks, U_b
  above on tail blocks), τ <= Σ_T|B|e^{U_b} / (Σ_H|B|e^{L_b} + Σ_T|B|e^{U_b});
- Gaussian scores s = μ + σZ: k_ε/n ≈ Φ_c(σ + Φ^{-1}(ε)).

Conventions: scores are pre-softmax logits, last axis = keys, leading axes batch; -inf marks
a masked key (it is never counted in k and takes no mass). NaN, +inf, empty rows and fully
masked rows raise ValueError. n_valid = number of unmasked keys of a row.

Backends. ``certify_topk``, ``certified_k``, ``tail_mass``, ``gap_bound``, ``multi_gap_bound``,
``blockwise_bound`` and ``output_error_bound`` take ``backend="auto" | "torch" | "numba"``
("auto" = numba, ``kernels.topk``); ``tail_mass``, ``certify_topk``, ``certified_k`` and
``output_error_bound`` also take "triton" (``kernels.triton_topk`` computes the tail sums,
rounded outward here as on the torch path). Input is validated here, before dispatch. Both backends
prove the same enclosure with the same constants (``kernels.topk``, ``kernels.floating``);
their floats may differ in the last bits (exp implementations, summation order).

Soundness (the k certificate). Rows are sorted descending, shifted by their maximum and
exponentiated (torch path: numpy's float64 ``exp``). Tail sums T_k = Σ_{i>k} w_(i) are
accumulated from the smallest weight up (small terms first, so T_k is accurate relative to
itself, even far below ε). In the standard model (kernels.floating) each weight carries a
relative error RHO_WEIGHT (exp, plus the rounding of its argument |s - max| <= 746) and an
absolute error EXP_ABS (a weight below the normal range), each sum γ_n, the quotient u or
SUBNORMAL_ULP/2. ``kernels.topk.tail_constants`` turns that into τ⁺ >= τ and τ⁻ <= τ. In block
bounds one weight stands for a whole block, so its absolute error is multiplied by the
block size (``kernels.topk.block_abs``).

Minimality and ties. τ_k depends only on the sorted multiset of scores, so ties at the
boundary do not matter: every tie-break gives the same τ_k. The certified k is the least k
with τ⁺_k <= ε (τ⁺ is non-increasing in k, so it is found by counting). It is *proved* to be
the real-arithmetic minimum when additionally τ⁻_{k-1} > ε; only if the true τ_{k-1} lies
within a relative ~2e-13 of ε can this fail, and ``TopKCertificate.minimal_proved`` says so
row by row (then the real minimum is k or k-1; truncation to k is still certified).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.special import ndtr, ndtri

from softcert.bounds.box import as_float64, validate_scores
from softcert.kernels import topk as ktopk
from softcert.kernels.floating import EXP_ABS, RHO_WEIGHT, SUBNORMAL_ULP, U64, gamma
from softcert.kernels.placement import auto_backend

BACKENDS = ("auto", "torch", "numba", "triton")
METHOD = "sorted tail sums, outward rounded"

ASSUMPTIONS = (
    "real-arithmetic tail mass of softmax over unmasked keys; float64, outward rounding in the "
    "standard model with gradual underflow (no flush-to-zero); C-library exp accurate to 2 ulp "
    "(tested in tests/test_floating.py); -inf = masked key"
)


# ----------------------------------------------------------------------------- validation
def _backend(backend, triton: bool = False, device: torch.device | None = None) -> str:
    """The backend to run: "auto" is where the data is, the Triton kernel for CUDA scores (when
    triton is installed and the function has one), Numba otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "triton" and not triton:
        raise ValueError("backend: 'triton' serves tail_mass, certify_topk, certified_k and "
                         "output_error_bound only; use 'numba' or 'torch' here")
    if backend != "auto":
        return backend
    return auto_backend(device) if triton else "numba"


def _device(scores) -> torch.device:
    """Where results go: the scores' device (a tensor), else the CPU."""
    return scores.device if isinstance(scores, torch.Tensor) else torch.device("cpu")


def validate_eps(eps) -> float:
    """ε as a float strictly inside (0, 1)."""
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps: expected a number in (0, 1), got {eps!r}") from None
    if not (0.0 < e < 1.0):  # also rejects NaN
        raise ValueError(f"eps: must lie strictly inside (0, 1), got {eps!r}")
    return e


def _validate_k(k, batch_shape, name: str = "k", device=None) -> torch.Tensor:
    """k as int64 key counts broadcast to the rows, on ``device`` (default the CPU; a tensor
    k is moved there)."""
    kt = k.to(device or k.device) if isinstance(k, torch.Tensor) else torch.as_tensor(k, device=device or "cpu")
    if kt.is_floating_point() or kt.is_complex() or kt.dtype == torch.bool:
        if kt.is_floating_point() and torch.all(kt == kt.round()) and torch.isfinite(kt).all():
            kt = kt.to(torch.int64)
        else:
            raise ValueError(f"{name}: expected integer key counts, got dtype {kt.dtype}")
    kt = kt.to(torch.int64)
    if (kt < 0).any():
        raise ValueError(f"{name}: must be >= 0, got min {int(kt.min())}")
    try:
        return kt.expand(batch_shape)
    except RuntimeError:
        raise ValueError(
            f"{name}: shape {tuple(kt.shape)} does not broadcast to the rows {tuple(batch_shape)}"
        ) from None


# ----------------------------------------------------------------------------- rounding
def inflate(x: torch.Tensor, eta: float) -> torch.Tensor:
    """A float y >= x(1+η) for x >= 0 (rigorous: slack 4u absorbs the product's rounding,
    the final nextafter an underflow of up to half the smallest subnormal)."""
    c = 1.0 + (eta + 4 * U64)
    return torch.nextafter(x * c, torch.full_like(x, math.inf))


def deflate(x: torch.Tensor, eta: float) -> torch.Tensor:
    """A float y <= x/(1+η) for x >= 0, clamped at 0."""
    c = 1.0 + (eta + 4 * U64)
    return torch.nextafter(x / c, torch.full_like(x, -math.inf)).clamp(min=0.0)


@dataclass(frozen=True)
class _TailModel:
    """Constants (c, A) of the outward rounding of τ = T/Z for rows of length n:
    τ⁺ = next↑(q̃·c + A), τ⁻ = next↓(q̃/c - A) (derivation: ``kernels.topk.tail_constants``)."""

    n: int
    c: float
    A: float

    @classmethod
    def for_length(cls, n: int) -> "_TailModel":
        c, A = ktopk.tail_constants(n)
        return cls(n=n, c=c, A=A)


# ----------------------------------------------------------------------------- core sweep
def sorted_weights(s: torch.Tensor):
    """(v, w, n_valid): scores sorted descending, w = exp(v - max) via numpy's exp, counts."""
    v = torch.sort(s, dim=-1, descending=True).values
    d = v - v[..., :1]
    # numpy's exp on the CPU (the C library's, as the Numba kernels), torch's on a GPU (CUDA's
    # float64 exp, documented at 1 ulp): both within the 2 ulp assumed (ASSUMPTIONS)
    w = torch.from_numpy(np.exp(d.numpy())) if d.device.type == "cpu" else d.exp()
    n_valid = torch.isfinite(v).sum(-1)
    return v, w, n_valid


def tail_sums(w: torch.Tensor) -> torch.Tensor:
    """T (..., n+1), T[..., k] = fl-sum of w[..., k:], accumulated from the last (smallest)."""
    c = torch.cumsum(w.flip(-1), dim=-1).flip(-1)
    return torch.cat([c, torch.zeros_like(c[..., :1])], dim=-1)


def _tail_sums(s: torch.Tensor, backend: str):
    """(T, n_valid) by the torch path or, for "triton", by ``kernels.triton_topk`` (any
    summation order of the non-negative weights: the same error model)."""
    if backend == "triton":
        from softcert.kernels.triton_topk import tail_sums_triton

        batch, n = s.shape[:-1], s.shape[-1]
        T, n_valid = tail_sums_triton(s.reshape(-1, n))
        if not torch.isfinite(T).all():  # never a certificate from a broken kernel
            raise RuntimeError("the Triton tail sums are not finite (a kernel or Triton bug); use backend='numba'")
        return T.reshape(batch + (n + 1,)), n_valid.reshape(batch)
    _, w, n_valid = sorted_weights(s)
    return tail_sums(w), n_valid


def _tail_from_sums(Tk, Z, k, n_valid, model: _TailModel, rounding: str):
    q = Tk / Z
    if rounding == "up":
        val = torch.nextafter(q * model.c + model.A, torch.full_like(q, math.inf)).clamp(max=1.0)
    elif rounding == "down":
        val = torch.nextafter(q / model.c - model.A, torch.full_like(q, -math.inf)).clamp(min=0.0)
    elif rounding == "nearest":
        val = q
    else:
        raise ValueError(f"rounding: expected 'up', 'down' or 'nearest', got {rounding!r}")
    # exact cases: nothing kept -> 1; every unmasked key kept -> 0
    val = torch.where(k <= 0, torch.ones_like(val), val)
    return torch.where(k >= n_valid, torch.zeros_like(val), val)


def tail_mass(scores, k, *, rounding: str = "nearest", backend: str = "auto") -> torch.Tensor:
    """τ_k = TV(P, P̂_k) = 1 - Σ_{top k} softmax(s) per row (float64, shape scores.shape[:-1]).

    ``k`` is an int or an integer tensor broadcasting to the rows; k >= n_valid gives 0.
    ``rounding``: "nearest" (the float estimate), "up" (proved τ⁺ >= τ) or "down" (τ⁻ <= τ).
    """
    if rounding not in ktopk.ROUNDING_MODES:
        raise ValueError(f"rounding: expected 'up', 'down' or 'nearest', got {rounding!r}")
    dev = _device(scores)
    be = _backend(backend, triton=True, device=dev)
    s = validate_scores(scores, device=dev)
    kk = _validate_k(k, s.shape[:-1], device=dev)
    if be == "numba":  # a CPU kernel: the rows go there and the result comes back
        return ktopk.tail_mass_numba(s.cpu(), kk.cpu(), rounding).to(dev)
    n = s.shape[-1]
    T, n_valid = _tail_sums(s, be)
    Tk = T.gather(-1, kk.clamp(max=n).unsqueeze(-1)).squeeze(-1)
    return _tail_from_sums(Tk, T[..., 0], kk, n_valid, _TailModel.for_length(n), rounding)


def truncation_kl(scores, k, *, backend: str = "auto") -> torch.Tensor:
    """KL(P̂_k ‖ P) = -log(1 - τ_k) (float estimate; +inf for k = 0)."""
    return -torch.log1p(-tail_mass(scores, k, backend=backend))


@dataclass(frozen=True)
class TopKCertificate:
    """Per row: the certified k, the proved tail bound at k and whether k is provably minimal.

    ``tail_upper`` >= τ_k (so truncation to the top ``k`` keys moves at most ε of mass);
    ``tail_lower_prev`` <= τ_{k-1}; ``minimal_proved`` = tail_lower_prev > ε.
    """

    k: torch.Tensor
    n_valid: torch.Tensor
    tail_upper: torch.Tensor
    tail_lower_prev: torch.Tensor
    minimal_proved: torch.Tensor
    eps: float
    method: str = METHOD
    assumptions: str = field(default=ASSUMPTIONS, repr=False)


def certify_topk(scores, eps, *, backend: str = "auto") -> TopKCertificate:
    """Minimal k with τ⁺_k <= ε per row, with the evidence (see module doc on minimality)."""
    e = validate_eps(eps)
    dev = _device(scores)
    be = _backend(backend, triton=True, device=dev)
    s = validate_scores(scores, device=dev)
    if be == "numba":  # a CPU kernel: the rows go there and the results come back
        k, up_k, lo_prev, n_valid = (t.to(dev) for t in ktopk.certify_rows_numba(s.cpu(), e))
        return TopKCertificate(
            k=k, n_valid=n_valid, tail_upper=up_k, tail_lower_prev=lo_prev,
            minimal_proved=lo_prev > e, eps=e, method=f"{METHOD} (numba)",
        )
    n = s.shape[-1]
    model = _TailModel.for_length(n)
    T, n_valid = _tail_sums(s, be)
    ks = torch.arange(n + 1, device=T.device).expand(T.shape)
    tau_up = _tail_from_sums(T, T[..., :1], ks, n_valid.unsqueeze(-1), model, "up")
    # τ⁺ is non-increasing in k and τ⁺_0 = 1 > ε: the least passing k = number failing
    k = (tau_up > e).sum(-1)
    up_k = tau_up.gather(-1, k.unsqueeze(-1)).squeeze(-1)
    Tprev = T.gather(-1, (k - 1).unsqueeze(-1)).squeeze(-1)
    lo_prev = _tail_from_sums(Tprev, T[..., 0], k - 1, n_valid, model, "down")
    return TopKCertificate(
        k=k, n_valid=n_valid, tail_upper=up_k, tail_lower_prev=lo_prev,
        minimal_proved=lo_prev > e, eps=e, method=f"{METHOD} ({be})",
    )


def certified_k(scores, eps, *, backend: str = "auto") -> torch.Tensor:
    """Per row the minimal k whose top-k truncation has tail mass <= ε (int64 tensor)."""
    return certify_topk(scores, eps, backend=backend).k


# ----------------------------------------------------------------------------- gap bounds
def blockwise_bound(head_lower, head_sizes, tail_upper, tail_sizes, *,
                    backend: str = "auto") -> torch.Tensor:
    """τ <= Σ_T|B|e^{U_b} / (Σ_H|B|e^{L_b} + Σ_T|B|e^{U_b}), rounded up (per row, float64).

    head_lower (..., bh): lower bounds L_b on every score of head block b; tail_upper
    (..., bt): upper bounds U_b on every score of tail block b; sizes |B| broadcast to them
    (0 = absent block). Sound because x/(a+x) increases in x and decreases in a, and the
    true head / tail masses are >= Σ_H|B|e^{L_b} / <= Σ_T|B|e^{U_b}. Needs no individual score.
    Rounding: ``kernels.topk._blockwise`` (a block's weight error is multiplied by its size).
    """
    be = _backend(backend)
    L = as_float64(head_lower, "head_lower")
    U = as_float64(tail_upper, "tail_upper")
    nh = _sizes(head_sizes, "head_sizes")
    nt = _sizes(tail_sizes, "tail_sizes")
    if torch.isposinf(L).any() or torch.isposinf(U).any():
        raise ValueError("head_lower/tail_upper: contain +inf")
    if (nh < 0).any() or (nt < 0).any():
        raise ValueError("head_sizes/tail_sizes: must be >= 0")
    try:
        L, nh = torch.broadcast_tensors(L, nh)
        U, nt = torch.broadcast_tensors(U, nt)
        batch = torch.broadcast_shapes(L.shape[:-1], U.shape[:-1])
    except RuntimeError:
        raise ValueError("head/tail sizes: shapes do not broadcast with their bounds") from None
    L, nh = L.expand(batch + L.shape[-1:]), nh.expand(batch + nh.shape[-1:])
    U, nt = U.expand(batch + U.shape[-1:]), nt.expand(batch + nt.shape[-1:])
    present = torch.maximum(torch.where(nh > 0, L, -math.inf).amax(-1),
                            torch.where(nt > 0, U, -math.inf).amax(-1))
    if not torch.isfinite(present).all():
        raise ValueError("head_lower/tail_upper: a row has no finite, non-empty block")
    if be == "numba":
        return ktopk.blockwise_bound_numba(L, nh, U, nt)
    return _blockwise_torch(L, nh, U, nt)


def _blockwise_torch(L, nh, U, nt) -> torch.Tensor:
    """The torch path of blockwise_bound on validated, broadcast blocks."""
    L = torch.where(nh > 0, L, torch.full_like(L, -math.inf))
    U = torch.where(nt > 0, U, torch.full_like(U, -math.inf))
    M = torch.maximum(L.amax(-1), U.amax(-1)).unsqueeze(-1)
    nb = L.shape[-1] + U.shape[-1]
    cs, cd, cr, ca = ktopk.block_constants(nb)
    ST, SH = block_sums(U - M, nt), block_sums(L - M, nh)
    total = torch.cat([nt, nh], dim=-1).cumsum(-1)[..., -1]
    A = torch.from_numpy(np.asarray(ktopk.block_abs(total.numpy(), nb, ca)))
    inf = torch.full_like(ST, math.inf)
    # a block's weight error (EXP_ABS) counts once per key of the block: A = block_abs
    ST = torch.nextafter((ST + A) * cs, inf)
    SH = torch.nextafter((SH - A).clamp(min=0.0) / cs, -inf).clamp(min=0.0)
    den = torch.nextafter((SH + ST) / cd, -inf).clamp(min=0.0)
    return torch.nextafter((ST / den) * cr, inf).clamp(max=1.0)


def _sizes(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x.detach() if isinstance(x, torch.Tensor) else x))
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64, torch.int16)):
        raise ValueError(f"{name}: expected numeric block sizes")
    t = t.to(torch.float64)
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: block sizes must be finite")
    return t


def block_sums(d: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Σ_b sizes_b·exp(d_b), summed left to right (cumsum: the order the kernels use)."""
    terms = sizes * torch.from_numpy(np.exp(d.numpy()))
    return torch.cumsum(terms, dim=-1)[..., -1]


def key_block_score_bounds(query, keys, block_size: int, scale: float = 1.0):
    """Per key block b: [L_b, U_b] enclosing scale·q·k_i for every key i of the block.

    Ball bound: k_i ∈ B(c_b, r_b) with c_b the block mean and r_b = max_i ‖k_i - c_b‖, so
    q·k_i ∈ q·c_b ± ‖q‖r_b (Cauchy-Schwarz). Rounded outward: |fl(q·c) - q·c| <=
    γ_{d+1}|q|·|c|, norms and radii inflated by γ_{d+4}, every sum/product then moved one ulp
    outward (round-to-nearest is within half an ulp). query (..., d), keys (n, d) with n a
    multiple of ``block_size``; ``scale`` > 0. Returns (lower, upper, sizes), shapes
    (..., n/block_size). These feed ``blockwise_bound`` to certify a head of whole blocks
    without scoring the keys of tail blocks.
    """
    q = as_float64(query, "query")
    K = as_float64(keys, "keys")
    if K.dim() != 2 or q.shape[-1] != K.shape[-1]:
        raise ValueError(f"keys: expected shape (n, {q.shape[-1]}), got {tuple(K.shape)}")
    if torch.isinf(q).any() or torch.isinf(K).any():
        raise ValueError("query/keys: contain +-inf")
    if int(block_size) != block_size or block_size < 1 or K.shape[0] % block_size:
        raise ValueError(f"block_size: must be a positive divisor of n = {K.shape[0]}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: must be a positive finite number, got {scale!r}")
    d = K.shape[-1]
    inf = torch.tensor(math.inf, dtype=torch.float64)
    blocks = K.reshape(-1, block_size, d)
    c = blocks.mean(1)  # any centre is valid: r_b is measured from the computed one
    r = inflate(torch.linalg.vector_norm(blocks - c.unsqueeze(1), dim=-1).amax(1), gamma(d + 4))
    qn = inflate(torch.linalg.vector_norm(q, dim=-1), gamma(d + 4))
    m = q @ c.T
    # γ_d·Σ|q_j c_j| bounds the dot product's rounding (any order, FMA or not)
    err = inflate(inflate(q.abs() @ c.abs().T, gamma(d + 2)) * gamma(d + 1), 0.0)
    e = torch.nextafter(torch.nextafter(qn.unsqueeze(-1) * r, inf) + err, inf)
    up = torch.nextafter(scale * torch.nextafter(m + e, inf), inf)
    lo = torch.nextafter(scale * torch.nextafter(m - e, -inf), -inf)
    return lo, up, torch.full(up.shape, float(block_size), dtype=torch.float64)


def _sorted_for_gaps(scores, k):
    s = validate_scores(scores)
    kk = _validate_k(k, s.shape[:-1])
    v = torch.sort(s, dim=-1, descending=True).values
    n_valid = torch.isfinite(v).sum(-1)
    return v, kk, n_valid


def gap_bound(scores, k, *, backend: str = "auto") -> torch.Tensor:
    """Single-gap bound τ_k <= (n-k)e^{-g}/(k + (n-k)e^{-g}), g = s_(k) - s_(k+1), n = n_valid.

    Uses two order statistics per row (the numba backend finds them by O(n) selection).
    Rounded up; exact 1 at k = 0, 0 at k >= n_valid.
    """
    be = _backend(backend)
    if be == "numba":
        s = validate_scores(scores)
        return ktopk.gap_bound_numba(s, _validate_k(k, s.shape[:-1]))
    return multi_gap_bound(scores, k, levels=1, backend="torch")


def multi_gap_bound(scores, k, levels: int = 4, *, backend: str = "auto") -> torch.Tensor:
    """Blockwise bound with head and tail each cut into ``levels`` rank groups.

    A rank group r..r' of the sorted row is bounded below by s_(r') and above by s_(r), so
    the bound needs 2·levels order statistics per row; levels = 1 is the single-gap bound,
    levels >= n tends to the exact tail mass.
    """
    if int(levels) != levels or levels < 1:
        raise ValueError(f"levels: expected a positive integer, got {levels!r}")
    be = _backend(backend)
    if be == "numba":
        s = validate_scores(scores)
        return ktopk.multi_gap_bound_numba(s, _validate_k(k, s.shape[:-1]), int(levels))
    v, kk, n_valid = _sorted_for_gaps(scores, k)
    n = v.shape[-1]
    kc = torch.minimum(kk, n_valid)
    ntail = n_valid - kc
    j = torch.arange(levels + 1, dtype=torch.int64)
    # head group b covers ranks [hb_b, hb_{b+1}) (0-based); lower bound = score at hb_{b+1}-1
    hb = (kc.unsqueeze(-1) * j) // levels
    tb = kc.unsqueeze(-1) + (ntail.unsqueeze(-1) * j) // levels
    h_size = (hb[..., 1:] - hb[..., :-1]).to(torch.float64)
    t_size = (tb[..., 1:] - tb[..., :-1]).to(torch.float64)
    L = v.gather(-1, (hb[..., 1:] - 1).clamp(0, n - 1))
    U = v.gather(-1, tb[..., :-1].clamp(0, n - 1))
    # rows with k = 0 or k >= n_valid are exact; give them a harmless finite block
    trivial = (kc <= 0) | (ntail <= 0)
    L = torch.where(trivial.unsqueeze(-1), torch.zeros_like(L), L)
    U = torch.where(trivial.unsqueeze(-1), torch.zeros_like(U), U)
    h_size = torch.where(trivial.unsqueeze(-1), torch.ones_like(h_size), h_size)
    b = _blockwise_torch(L, h_size, U, t_size)
    b = torch.where(kc <= 0, torch.ones_like(b), b)
    return torch.where(ntail <= 0, torch.zeros_like(b), b)


# ----------------------------------------------------------------------------- output error
@dataclass(frozen=True)
class OutputErrorBound:
    """‖Attn - Attn_k‖₂ per row: the exact value (float estimate) and three upper bounds.

    exact = τ‖μ_T - μ_H‖; diameter = τ⁺·max_{i∈H,j∈T}‖v_i - v_j‖; variance =
    sqrt(τ⁺/(1-τ⁺)·Σ_i P_i‖v_i - μ̂‖²) (any centre μ̂ gives >= Var_P(V)); norm = 2τ⁺·max‖v_i‖.
    The bounds are rounded up; ``exact`` is a float estimate of the real error. H is the
    top k under a stable descending sort (equal scores: lower key index first); τ does not
    depend on that tie-break, the error vector may.
    """

    exact: torch.Tensor
    diameter: torch.Tensor
    variance: torch.Tensor
    norm: torch.Tensor
    tail_upper: torch.Tensor
    method: str = "τ(μ_T - μ_H) identity; diameter, law of total variance and 2Cτ bounds"
    assumptions: str = field(default=ASSUMPTIONS, repr=False)


def _head_mask(s: torch.Tensor, kk: torch.Tensor) -> torch.Tensor:
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    rank_mask = torch.arange(s.shape[-1]).expand(s.shape) < kk.unsqueeze(-1)
    return torch.zeros_like(rank_mask).scatter(-1, order, rank_mask) & torch.isfinite(s)


def output_error_bound(scores, values, k, *, backend: str = "auto") -> OutputErrorBound:
    """Error of top-k attention for scores (..., n) and values (..., n, d) (batch broadcast).

    Values shared by every query, as attention uses them (P·V): scores (..., Q, n) with values
    (..., n, d) of the same rank, e.g. ``analysis.attention.extract_attention``'s (L, H, T, T)
    and (L, H, T, d) as they are; they are read as (..., 1, n, d) (issue 32). Per-query values
    have one axis more than the scores: (..., Q, n, d), or a singleton (..., 1, n, d); 1-D
    scores (n,) take values (n, d). Bounds and assumptions: :class:`OutputErrorBound`.
    Raises ValueError naming ``values`` when its key axis or batch shape does not fit.
    """
    s = validate_scores(scores)
    V = as_float64(values, "values")
    if V.dim() == s.dim() >= 2:  # shared across the query axis: P·V
        V = V.unsqueeze(-3)
    if V.dim() < 2 or V.shape[-2] != s.shape[-1]:
        raise ValueError(
            f"values: expected shape (..., {s.shape[-1]}, d), got {tuple(V.shape)}"
        )
    if torch.isinf(V).any():
        raise ValueError("values: contains +-inf")
    try:
        batch = torch.broadcast_shapes(s.shape[:-1], V.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"values: batch shape {tuple(V.shape[:-2])} does not broadcast with scores "
            f"{tuple(s.shape[:-1])}"
        ) from None
    s = s.expand(batch + s.shape[-1:])
    kk = _validate_k(k, batch)
    n, d = s.shape[-1], V.shape[-1]
    tau_up = tail_mass(s, kk, rounding="up", backend=backend)
    tau = tail_mass(s, kk, backend=backend)
    valid = torch.isfinite(s)
    head = _head_mask(s, kk)
    tail = valid & ~head
    p = torch.softmax(s, dim=-1)
    ph, pt = p * head, p * tail
    mu_h = (ph.unsqueeze(-2) @ V).squeeze(-2) / ph.sum(-1, keepdim=True).clamp(min=1e-300)
    mu_t = (pt.unsqueeze(-2) @ V).squeeze(-2) / pt.sum(-1, keepdim=True).clamp(min=1e-300)
    exact = tau * torch.linalg.vector_norm(mu_t - mu_h, dim=-1)
    exact = torch.where(tail.any(-1) & head.any(-1), exact, torch.zeros_like(exact))
    # pairwise distances (..., n, n); ‖v_i - v_j‖ computed with ≤ γ_{d+4} relative error
    D = inflate(torch.cdist(V, V, compute_mode="donot_use_mm_for_euclid_dist"), gamma(d + 4))
    neg = torch.full((), -math.inf, dtype=torch.float64)
    diam = torch.zeros(batch, dtype=torch.float64)
    # max_{i∈H} max_{j∈T} D_ij, chunked over flattened rows to keep memory at (chunk, n, n)
    # row r uses D[which[r]]: index D's own batch instead of materialising the broadcast
    vb = D.shape[:-2]
    which = torch.arange(max(1, math.prod(vb))).reshape(vb).expand(batch).reshape(-1)
    D2 = D.reshape(-1, n, n)
    hf, tf = head.reshape(-1, n), tail.reshape(-1, n)
    out = diam.reshape(-1)
    step = max(1, (1 << 20) // (n * n))
    for a in range(0, hf.shape[0], step):
        blk = torch.where(tf[a:a + step].unsqueeze(-2), D2[which[a:a + step]], neg).amax(-1)
        out[a:a + step] = torch.where(hf[a:a + step], blk, neg).amax(-1).clamp(min=0.0)
    diam = out.reshape(batch)
    diameter = inflate(tau_up * diam, 0.0)
    mu_hat = (p.unsqueeze(-2) @ V).squeeze(-2)
    sq = ((V - mu_hat.unsqueeze(-2)) ** 2).sum(-1)
    # each p_i is off by RHO_WEIGHT·p_i + γ_{n+2}·p_i + EXP_ABS + SUBNORMAL_ULP (a p_i below the
    # normal range); the absolute part is weighted by sq_i, each product p_i·sq_i by SUBNORMAL_ULP/2
    abs_p = inflate(sq.sum(-1) * (EXP_ABS + SUBNORMAL_ULP), gamma(n + d + 8)) + n * SUBNORMAL_ULP
    var_up = inflate((p * sq).sum(-1) + abs_p, 2 * (RHO_WEIGHT + gamma(n + d + 8)))
    ratio = inflate(tau_up / deflate(1.0 - tau_up, 0.0), 2 * U64)
    variance = inflate(torch.sqrt(inflate(ratio * var_up, 0.0)), 2 * U64)
    variance = torch.where(tau_up >= 1.0, torch.full_like(variance, math.inf), variance)
    vmax = inflate(torch.linalg.vector_norm(V, dim=-1).amax(-1), gamma(d + 2))
    norm = inflate(2.0 * tau_up * vmax.expand(batch), 0.0)
    return OutputErrorBound(
        exact=exact, diameter=diameter, variance=variance, norm=norm, tail_upper=tau_up
    )


# ----------------------------------------------------------------------------- Gaussian rule
def gaussian_k_fraction(sigma, eps):
    """k_ε/n ≈ Φ_c(σ + Φ^{-1}(ε)) for scores s = μ + σZ (n → ∞; docs/mathematics.md §3).

    Derivation: under P the tilted scores are N(μ + σ², σ²), so the P-mass below the
    threshold μ + σz is Φ(z - σ); setting it to ε gives z = σ + Φ^{-1}(ε), and the kept
    fraction is P(Z > z). It under-estimates k when σ² is comparable to log n.
    """
    e = np.asarray(eps, dtype=np.float64)
    sg = np.asarray(sigma, dtype=np.float64)
    if np.isnan(sg).any() or (sg < 0).any():
        raise ValueError(f"sigma: must be >= 0 and not NaN, got {sigma!r}")
    if np.isnan(e).any() or (e <= 0).any() or (e >= 1).any():
        raise ValueError(f"eps: must lie strictly inside (0, 1), got {eps!r}")
    out = 1.0 - ndtr(sg + ndtri(e))
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class GaussianRuleCheck:
    """Per row: σ of the unmasked scores, predicted k/n, measured certified k/n."""

    sigma: torch.Tensor
    predicted_fraction: torch.Tensor
    measured_fraction: torch.Tensor
    eps: float
    method: str = "Gaussian rule Φ_c(σ + Φ^{-1}(ε)) against certified k / n_valid"


def gaussian_rule_check(scores, eps) -> GaussianRuleCheck:
    """Compare the Gaussian rule (σ = population std of each row's unmasked scores)."""
    e = validate_eps(eps)
    s = validate_scores(scores)
    valid = torch.isfinite(s)
    nv = valid.sum(-1)
    z = torch.where(valid, s, torch.zeros_like(s))
    mean = z.sum(-1) / nv
    var = torch.where(valid, (s - mean.unsqueeze(-1)) ** 2, torch.zeros_like(s)).sum(-1) / nv
    sigma = var.sqrt()
    pred = torch.from_numpy(np.asarray(gaussian_k_fraction(sigma.numpy(), e), dtype=np.float64))
    cert = certify_topk(s, e)
    return GaussianRuleCheck(
        sigma=sigma, predicted_fraction=pred,
        measured_fraction=cert.k.to(torch.float64) / nv, eps=e,
    )
