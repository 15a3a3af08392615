"""Vertex-Softmax: the exact optimum of c·softmax(s) over a score box, rounded outward.

max_{l <= s <= u} c·softmax(s). With y = exp(s) in [a, b] = [e^l, e^u] the objective c·y/1·y
is linear-fractional, so the optimum sits at a vertex of the box; at the optimal value λ*
every y_i with c_i > λ* is at b_i and every y_i with c_i < λ* at a_i (threshold theorem).
Sorting c descending, the candidates V_t put the t largest coefficients at their upper
bound, t = 0..n; the maximum is max_t V_t, found with prefix/suffix sums in O(n log n).
The minimum is -max with -c. Source: the Vertex-Softmax abstract (shared/seeds) and
docs/mathematics.md §1, where the threshold theorem is checked.

Soundness: the float sweep only *proposes* a value V. The returned upper bound λ >= V is
*proved* by the linear certificate g(λ) = Σ_i max((c_i - λ) a_i, (c_i - λ) b_i) <= 0 (which
says c·y <= λ·1·y on the whole box), evaluated with a rigorous error bound in the model of
``kernels.floating``. So the bound never lies on the wrong side of the real optimum.

Tiny coefficients: each row's c is first scaled by an exact power of two so that
max |c_i| lies in [1, 2) (only upwards, so no bit is lost); the bounds are scaled back and
rounded outward. The relative error model then holds for every term that matters, and an
optimum of 1e-300 is certified as tightly as one of 1 (tests/test_vertex.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from softcert.bounds.box import coefficient_box
from softcert.kernels.floating import (
    EXP_REL,
    EXP_ZERO_ARG,
    TINY,
    U64,
    a_priori_step,
    dot_error,
    first_step,
    gamma,
    term_rel,
)
from softcert.kernels.placement import auto_backend

ASSUMPTIONS = (
    "real-arithmetic optimum over the box lower <= s <= upper; float64 with outward rounding; "
    f"exp accurate to {EXP_REL / (2 * U64):.0f} ulp; -inf in upper = masked entry"
)


BACKENDS = ("auto", "numba", "torch", "triton")


@dataclass(frozen=True)
class VertexBounds:
    """Enclosure lower <= min c·softmax(s) and max c·softmax(s) <= upper over a score box.

    ``lower_vertex`` / ``upper_vertex`` are scores s (entries at their lower or upper bound)
    whose objective value attains the optimum up to rounding.
    """

    lower: torch.Tensor
    upper: torch.Tensor
    lower_vertex: torch.Tensor
    upper_vertex: torch.Tensor
    method: str = "vertex-softmax"
    assumptions: str = field(default=ASSUMPTIONS, repr=False)


def vertex_softmax(c, lower, upper, *, backend: str = "auto") -> VertexBounds:
    """Exact bounds of c·softmax(s) over lower <= s <= upper (last axis; leading axes batch).

    Inputs broadcast like torch. float16/float32/float64 and integer inputs are widened to
    float64 exactly; an integer that float64 cannot hold exactly (|v| > 2^53) raises
    ValueError naming the argument, as does a meta tensor. Results are float64 tensors on the
    inputs' device (tensors on two devices: ValueError naming them; lists follow the
    tensors). ``backend``: "torch" (vectorised reference, on the inputs' device), "numba"
    (``kernels.vertex``, parallel over rows, on the CPU), "triton" (``kernels.triton_vertex``
    proposes by the Dinkelbach iteration, this module proves, both on the inputs' device when
    compiled; interpreted on a CPU) or "auto" (triton for CUDA inputs where installed, else numba). All certify their bound with the error model of ``kernels.floating``;
    they agree to within its rounding margin (tests/test_kernels_vertex.py,
    tests/test_triton_backends.py).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    c, lo, hi = coefficient_box(c, lower, upper, keep_device=True)
    n = c.shape[-1]
    c2, lo2, hi2 = (t.reshape(-1, n) for t in (c, lo, hi))
    if backend == "auto":
        backend = auto_backend(c.device)
    if backend == "numba":  # the kernel scales each row itself (same _normalise)
        from softcert.kernels.vertex import vertex_bounds

        cpu = [t.cpu() for t in (c2, lo2, hi2)]
        vertices = (torch.empty_like(cpu[0]), torch.empty_like(cpu[0]))  # filled by the kernel
        low, up, _, _ = vertex_bounds(*(t.numpy() for t in cpu), vertices_out=tuple(v.numpy() for v in vertices))
        out = (torch.from_numpy(low), torch.from_numpy(up), *vertices)
        return _result(*(t.to(c.device) for t in out), c.shape)
    c2, k = _normalise(c2, hi2)
    if backend == "triton":
        from softcert.kernels.triton_vertex import dinkelbach_triton

        lam, theta, _, robust = dinkelbach_triton(c2, lo2, hi2)
        up, up_mask = _prove_proposal(c2, lo2, hi2, lam[:, 0], theta[:, 0], robust)
        neg_low, lo_mask = _prove_proposal(-c2, lo2, hi2, lam[:, 1], theta[:, 1], robust)
    else:
        up, up_mask = _max_with_vertex(c2, lo2, hi2)
        neg_low, lo_mask = _max_with_vertex(-c2, lo2, hi2)
    low, up = _denormalise(-neg_low, k, -1.0), _denormalise(up, k, 1.0)
    return _result(low, up, torch.where(lo_mask, hi2, lo2), torch.where(up_mask, hi2, lo2), c.shape)


def _result(low, up, lower_vertex, upper_vertex, shape) -> VertexBounds:
    """Rows (R,) and (R, n) back to the caller's batch shape."""
    return VertexBounds(lower=low.reshape(shape[:-1]), upper=up.reshape(shape[:-1]),
                        lower_vertex=lower_vertex.reshape(shape), upper_vertex=upper_vertex.reshape(shape))


def _normalise(c: torch.Tensor, hi: torch.Tensor):
    """Scale each row of c by 2^k, k >= 0, so that max |c_i| (unmasked) lies in [1, 2).

    Multiplying by a power of two upwards is exact, and c·softmax scales with c, so the
    problem is the same; it keeps the products c·w and (c - λ)·w out of the subnormal
    range, where the relative error model would not hold. Returns (c, None) when no row
    needs it, else (scaled c, k (R,) int64); computed on c's device.
    """
    scale = torch.where(torch.isneginf(hi), torch.zeros_like(c), c.abs()).amax(-1)
    _, e = torch.frexp(scale)  # scale = m 2^e, m in [0.5, 1)
    k = torch.where(scale > 0, (1 - e.to(torch.int64)).clamp(min=0), torch.zeros_like(e, dtype=torch.int64))
    if not bool(k.any()):
        return c, None
    return _times_power_of_two(c, k[:, None]), k


def _times_power_of_two(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x · 2^k (|k| <= 2046) as two products by exact powers of two (each half |k_i| <= 1023,
    so 2^k_i is a float64; torch.ldexp forms 2^k itself, which overflows beyond 1023): exact
    when the result and the first product are normal."""
    k1 = torch.div(k, 2, rounding_mode="trunc")
    two = torch.full_like(x, 2.0)
    return x * torch.pow(two, k1.to(x.dtype)) * torch.pow(two, (k - k1).to(x.dtype))


def _denormalise(bound: torch.Tensor, k, direction: float) -> torch.Tensor:
    """bound · 2^-k, rounded outward (``direction`` +1 up, -1 down) when it lands below the
    normal range and loses bits: one step when the rounding went inward. |bound| < 4 and
    k <= 1074 here, so the first product of ``_times_power_of_two`` (by 2^-k/2) stays normal
    and exact; only the second rounds, to within half a spacing, and one step outward
    encloses the exact value."""
    if k is None:
        return bound
    out = _times_power_of_two(bound, -k)
    back = _times_power_of_two(out, k)  # scaling back up is exact: compare to see where the rounding went
    inward = back < bound if direction > 0 else back > bound
    return torch.where(inward, torch.nextafter(out, torch.full_like(out, direction * float("inf"))), out)


def _prove_proposal(c, lo, hi, value, theta, robust, tries: int = 2):
    """(bound, vertex) for rows whose optimum value and vertex {c_i > θ} were proposed
    elsewhere (the Triton Dinkelbach kernel). Each row is proved by the certificate at
    value + h, h the a priori step of kernels.vertex._certify_fast (then 4h); rows not
    proved within ``tries``, and ``robust`` rows, are solved by the sweep here. A proposal at
    or above max c is replaced by max c, itself a bound."""
    active = ~torch.isneginf(hi)
    at_upper = (c > theta.unsqueeze(-1)) & active
    ninf = torch.full_like(c, float("-inf"))
    cmax = torch.where(active, c, ninf).amax(-1)
    cmin = -torch.where(active, -c, ninf).amax(-1)
    scale = torch.where(active, c.abs(), torch.zeros_like(c)).amax(-1)
    top = torch.where(active, hi, ninf).amax(-1, keepdim=True)
    spread = torch.where(torch.isneginf(lo), torch.zeros_like(lo), top - lo)
    rel_max = term_rel(spread.amax(-1).clamp(max=EXP_ZERO_ARG))
    step = a_priori_step(rel_max, gamma(c.shape[-1] + 1), cmax, cmin, value, scale)
    bound = cmax.clone()
    proved = value >= cmax
    for _ in range(tries):
        trial = torch.maximum(value + step, torch.nextafter(value, torch.full_like(value, 1e308)))
        g, err, _ = certificate_gap(c, lo, hi, trial)
        ok = (g <= -err) & ~proved
        bound = torch.where(ok, torch.minimum(trial, cmax), bound)
        proved |= ok
        step = 4 * step
    redo = (~proved) | robust
    if redo.any():
        b, m = _max_with_vertex(c[redo], lo[redo], hi[redo])
        bound[redo] = b
        at_upper[redo] = m
    return bound, at_upper


def _max_with_vertex(c, lo, hi):
    at_upper = threshold_sweep(c, lo, hi)
    value = vertex_value(c, lo, hi, at_upper)
    return certify_upper(c, lo, hi, value), at_upper


def threshold_sweep(c: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Rows (B, n) -> boolean (B, n): the maximising vertex (True = entry at its upper bound).

    Candidates t = 0..n over c sorted descending, evaluated in log space with prefix and
    suffix log-sum-exps, so no candidate underflows even when every weight is far below
    the row maximum.
    """
    B, n = c.shape
    order = torch.argsort(c, dim=-1, descending=True, stable=True)
    cs, ls, us = (t.gather(-1, order) for t in (c, lo, hi))
    shift = us.amax(dim=-1, keepdim=True)  # finite: validation rejects fully masked rows
    us, ls = us - shift, ls - shift
    log_pos = cs.clamp(min=0).log()
    log_neg = (-cs).clamp(min=0).log()
    ninf = torch.full((B, 1), float("-inf"), dtype=c.dtype, device=c.device)

    def candidates(log_up, log_low):
        # log Σ_{i<t} e^{log_up_i} + Σ_{i>=t} e^{log_low_i}, for t = 0..n
        prefix = torch.cat([ninf, torch.logcumsumexp(log_up, dim=-1)], dim=-1)
        suffix = torch.cat([torch.logcumsumexp(log_low.flip(-1), dim=-1).flip(-1), ninf], -1)
        return torch.logaddexp(prefix, suffix)

    log_d = candidates(us, ls)
    value = (candidates(us + log_pos, ls + log_pos) - log_d).exp() - (
        candidates(us + log_neg, ls + log_neg) - log_d
    ).exp()
    value = torch.where(torch.isfinite(log_d), value, torch.full_like(value, float("-inf")))
    best = value.argmax(dim=-1, keepdim=True)
    sorted_mask = torch.arange(n, device=c.device).expand(B, n) < best
    return torch.zeros_like(sorted_mask).scatter(-1, order, sorted_mask)


def vertex_value(c, lo, hi, at_upper) -> torch.Tensor:
    """c·softmax(s) at the vertex s = where(at_upper, hi, lo), shifted by its largest score."""
    s = torch.where(at_upper, hi, lo)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = (s - m).exp()
    total = w.sum(-1)
    # a vertex with no mass (all chosen scores -inf) is never optimal; fall back to max c
    cmax = torch.where(torch.isneginf(hi), torch.full_like(c, float("-inf")), c).amax(-1)
    return torch.where(total > 0, (c * w).sum(-1) / total, cmax)


def certificate_gap(c, lo, hi, lam):
    """Rigorous float evaluation of g(λ) = Σ_i max((c_i - λ) a_i, (c_i - λ) b_i).

    Returns (G, err, D) per row, all scaled by e^{-M} (M the largest chosen score), with
    |G - g e^{-M}| <= err and D = Σ chosen weights. g(λ) <= 0 is proved when G <= -err.
    """
    active = ~torch.isneginf(hi)
    d = c - lam.unsqueeze(-1)  # the sign of a float difference is exact
    chosen = torch.where(d > 0, hi, lo)
    chosen = torch.where(active, chosen, torch.full_like(chosen, float("-inf")))
    m = chosen.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    x = chosen - m
    w = x.exp()
    terms = d * w
    absx = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x))
    rel = term_rel(absx.clamp(max=EXP_ZERO_ARG))  # beyond it w = 0: absolute terms only
    n = c.shape[-1]
    abs_terms = terms.abs()
    d_abs = torch.where(active, d.abs(), torch.zeros_like(d))
    err = dot_error((abs_terms * rel).sum(-1), abs_terms.sum(-1), rel.amax(-1), d_abs.sum(-1),
                    active.sum(-1).to(d.dtype), n)
    return terms.sum(-1), err, w.sum(-1)


def _bisect(c, lo, hi, failed, bound, scale, steps: int = 64):
    """The smallest proved λ in (failed, bound] to 1e-12 (1 + scale), by bisection on the
    certificate; ``bound`` is proved on entry and every accepted λ is proved."""
    for _ in range(steps):
        open_ = bound - failed > 1e-12 * (1 + scale)
        if not open_.any():
            break
        mid = failed + (bound - failed) / 2
        g, err, _ = certificate_gap(c, lo, hi, mid)
        ok = (g <= -err) & open_
        bound = torch.where(ok, mid, bound)
        failed = torch.where(open_ & ~ok, mid, failed)
    return bound


def certify_upper(c, lo, hi, value, max_rounds: int = 64) -> torch.Tensor:
    """Smallest proved upper bound λ >= value (up to a rounding margin) on max c·softmax(s).

    Starts from the float optimum and widens only the rows whose certificate fails. A row
    that still fails after ``max_rounds`` gets max_i c_i, trivially sound.
    """
    active = ~torch.isneginf(hi)
    cmax = torch.where(active, c, torch.full_like(c, float("-inf"))).amax(-1)
    scale = torch.where(active, c.abs(), torch.zeros_like(c)).amax(-1)
    g, err, dsum = certificate_gap(c, lo, hi, value)
    step = first_step(g.clamp(min=0), err, dsum.clamp(min=TINY), value, scale)
    bound = value.clone()
    failed = value.clone()  # the largest trial not proved, per row
    proved = torch.zeros_like(value, dtype=torch.bool)
    for _ in range(max_rounds):
        trial = torch.maximum(value + step, torch.nextafter(value, torch.full_like(value, 1e308)))
        g, err, _ = certificate_gap(c, lo, hi, trial)
        ok = (g <= -err) & ~proved
        bound = torch.where(ok, trial, bound)
        failed = torch.where(~ok & ~proved, trial, failed)
        proved |= ok
        if proved.all():
            break
        step = torch.where(proved, step, 4 * step)
    bound = torch.where(proved, bound, cmax)
    # a row whose first trial failed had a proposal far from the optimum (e.g. the sweep's
    # log-sums absorbed scores ~1e290 apart): the geometric widening overshoots, so bisect
    # between its largest failed trial and the proved bound; every accepted λ is proved
    idx = (proved & (failed > value) & (bound - failed > 1e-12 * (1 + scale))).nonzero().flatten()
    if len(idx):
        bound[idx] = _bisect(c[idx], lo[idx], hi[idx], failed[idx], bound[idx], scale[idx])
    # max_i c_i is itself an upper bound (softmax is a convex combination): keep the smaller
    return torch.minimum(bound, cmax)
