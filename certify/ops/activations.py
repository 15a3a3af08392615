"""Smooth activations as verifier operators: GELU (erf and tanh forms), tanh, sigmoid, sqrt.

Each is one registered ``Elementwise``: ``fn``, an outward-rounded image interval, linear
planes and traits. Planes are built in two steps:
1. a slope s per side, by the CROWN rules (Zhang et al. 2018): on a convex region the
   tangent at the midpoint below and the chord above (mirrored on a concave region); on an
   S-shape crossing its inflection point, the tangent through an end point when the chord
   would cut f. GELU (convex on [-√2, √2], concave outside) takes, of the candidates
   {chord, f'(l), f'(m), f'(u)}, the one with the smallest area between plane and f;
2. the intercept *certified* for that slope: b = inf (lower) or sup (upper) over [l, u] of
   g(x) = f(x) - s·x, computed on the pieces where f has one curvature (``_sup``): on a
   piece where ±g is convex its max is at the piece's ends; where it is concave,
   g(x) <= g(p) + g'(p)(x - p) for any p (p = the critical point, found by safeguarded
   Newton: any p is sound, a good one is tight); on a sliver [a, b] bracketing an
   inflection point whose float64 value is inexact, max g <= max(g(a), g(b)) + M (b - a)²/8
   with M >= max|f''|.
So any slope is sound; the slope only decides tightness. This also gives alpha-CROWN its
family (``_with_alpha``): lower slope smin + alpha (smax - smin) over the range of f' on
[l, u], the intercept certified, for gelu, gelu_tanh, tanh and sigmoid (sqrt is concave:
its chord is already the best lower plane). Every float64 value of f and f'
carries a proven error bound (the ``_*_value`` and ``_*_slope`` functions), added on the
safe side, so lw·x + lb <= f(x) <= uw·x + ub holds in real arithmetic for the float64
coefficients returned. Infinite end points give constant planes from the image (slope 1
for GELU on [l, inf)), or no information (0·x ± inf); never NaN.

Assumption: float64 ``erfc``, ``exp``, ``tanh``, ``sigmoid`` and ``sqrt`` of torch are
accurate to LIBM_ULPS units in the last place (measured below 1 ulp; checked against mpmath
in tests/test_certify_activations.py). The constants below (minimiser x* and minimum of
GELU, inflection points, max|f''|) were computed with mpmath at 60 digits and are
re-derived in the same tests.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from softcert.certify.ops import host
from softcert.certify.ops.core import Elementwise, register, tensor_of
from softcert.kernels.floating import TINY, U64

U = U64
LIBM_ULPS = 4
#: relative error of one libm call: LIBM_ULPS ulp, one ulp being at most 2u relative
LIBM_REL = 2 * LIBM_ULPS * U
#: steps of the safeguarded Newton search for critical and tangent points (any point is
#: sound: the search only decides tightness)
SEARCH_STEPS = 64
#: off the CPU (``host`` "defer") the search reads which elements still move (one host read,
#: which also compacts them) only after these numbers of steps in all (``_solve_masked``);
#: the last is SEARCH_STEPS. Measured on mnist-vit1 (alpha-CROWN, 113 searches): 99 ended
#: within 16 steps, the rest within 27 (most elements converge in the first step)
SEARCH_READS = (16, 32, SEARCH_STEPS)
#: absolute error floor per unit |x| of every value and slope: covers results in or near the
#: subnormal range (torch.sigmoid(t) is 0 for t < -709.78 where σ(t) < 5.6e-309; exp(-x²/2)
#: underflows), far below any value that matters
ABS = 1e-300
#: below this width the chord's difference quotient is noise: use the midpoint slope
TINY_WIDTH = 1e-7

SQRT_HALF = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
#: the tanh form: 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³))) = x σ(T1 x + T3 x³)
T1 = 2.0 * math.sqrt(2.0 / math.pi)
T3 = T1 * 0.044715
#: max |f''| of both GELU forms: √(2/π) = 2φ(0), attained at 0 (erf form: f'' = φ(x)(2 - x²);
#: tanh form: f''(0) = √(2/π) as well, the maximum on a 60-digit grid), rounded up
GELU_CURVATURE = 0.8


def _bracket(text):
    """Two float64 values enclosing the real number written in ``text``."""
    x = float(text)  # within half an ulp
    return math.nextafter(x, -math.inf), math.nextafter(x, math.inf)


@dataclass(frozen=True)
class GeluConstants:
    """Minimiser x*, minimum f(x*) and inflection point r (f is convex on [-r, r], concave
    outside) of one GELU form, as float64 brackets (lo, hi) of the real numbers."""

    argmin: tuple
    minimum: tuple
    inflection: tuple


GELU_ERF = GeluConstants(argmin=_bracket("-0.75179152469356445745790494678"),
                         minimum=_bracket("-0.169971207479903661693868470982"),
                         inflection=_bracket("1.41421356237309504880168872421"))  # √2: f'' = φ(x)(2 - x²)
GELU_TANH = GeluConstants(argmin=_bracket("-0.752461422071016258487954443289"),
                          minimum=_bracket("-0.170040750571254050639067427988"),
                          inflection=_bracket("1.4185040087908283555480335456"))


def _finite_err(v, err):
    # f(±inf) is a limit, not a rounded value
    return torch.where(torch.isinf(v), 0.0, err)


# ---------------------------------------------------------------- values with error bounds
def _gelu_value(x):
    """0.5 x erfc(-x/√2) (no cancellation, unlike 1 + erf). Error: libm, the argument's 2u
    times |d ln erfc(z)/dz|·z <= x² + |x| for x <= 0 (erfc(z) > 2e^{-z²}/(√π(z + √(z²+2)))),
    <= 1/2 for x > 0, and u for the product."""
    v = 0.5 * x * torch.special.erfc(-x * SQRT_HALF)
    v = torch.where(x == -torch.inf, 0.0, v)
    xn = x.clamp(max=0).clamp(min=-1e10)
    rel = LIBM_REL + 4 * U + 2.1 * U * (xn * xn - xn)
    return v, _finite_err(v, v.abs() * rel + ABS * (1 + x.abs().clamp(max=1e300)))


def _gelu_slope(x):
    """f' = Φ(x) + x φ(x); Φ to (2 LIBM_ULPS + 5)u absolute, x φ(x) to (2 LIBM_ULPS + 4 + x²)u
    relative (rounding x²/2 moves exp by x² u)."""
    xs = x.clamp(-1e10, 1e10)
    phi = xs * torch.exp(-0.5 * xs * xs) * INV_SQRT_2PI
    d = 0.5 * torch.special.erfc(-xs * SQRT_HALF) + phi
    err = (LIBM_REL + 6 * U) + phi.abs() * (LIBM_REL + 6 * U + 1.01 * U * xs * xs) + ABS * (1 + xs.abs())
    return d, err


def _gelu_tanh_arg(x):
    # T1 x + T3 x³: both terms carry the sign of x, so no cancellation; 10u relative
    # (T1, T3 and 0.044715 themselves rounded, three products, one sum)
    return x * (T1 + T3 * (x * x))


def _gelu_tanh_value(x):
    """x σ(t); σ's relative sensitivity to t is σ(-t) |t| <= |t| (t < 0), <= 0.28 (t >= 0)."""
    xs = x.clamp(-1e10, 1e10)
    t = _gelu_tanh_arg(xs)
    v = x * torch.sigmoid(t)
    v = torch.where(x == -torch.inf, 0.0, v)
    rel = LIBM_REL + 6 * U + 10.1 * U * (-t.clamp(max=0))
    return v, _finite_err(v, v.abs() * rel + ABS * (1 + x.abs().clamp(max=1e300)))


def _gelu_tanh_slope(x):
    """f' = σ(t) + x σ(t) σ(-t) t', t' = T1 + 3 T3 x²."""
    xs = x.clamp(-1e10, 1e10)
    t = _gelu_tanh_arg(xs)
    sp, sn = torch.sigmoid(t), torch.sigmoid(-t)
    second = xs * sp * sn * (T1 + 3 * T3 * (xs * xs))
    err = (LIBM_REL + 7 * U) + second.abs() * (2 * LIBM_REL + 16 * U + 10.1 * U * t.abs()) + ABS * (1 + xs.abs())
    return sp + second, err


def _gelu_second(x):
    return torch.exp(-0.5 * x * x) * INV_SQRT_2PI * (2 - x * x)


def _gelu_tanh_second(x):
    # f = x σ(t): f'' = 2 σσ' t' + x (σσ'(1 - 2σ) t'² + σσ' t''), σσ' = σ(t)σ(-t)
    xs = x.clamp(-1e10, 1e10)
    t = _gelu_tanh_arg(xs)
    sp, sn = torch.sigmoid(t), torch.sigmoid(-t)
    q, t1 = sp * sn, T1 + 3 * T3 * (xs * xs)
    return 2 * q * t1 + xs * (q * (sn - sp) * t1 * t1 + q * 6 * T3 * xs)


def _tanh_value(x):
    v = torch.tanh(x)
    return v, v.abs() * LIBM_REL + ABS


def _tanh_slope(x):
    v = torch.tanh(x)
    return 1 - v * v, torch.full_like(v, 2 * LIBM_REL + 4 * U + ABS)


def _sigmoid_value(x):
    v = torch.sigmoid(x)
    return v, v.abs() * LIBM_REL + ABS


def _sigmoid_slope(x):
    d = torch.sigmoid(x) * torch.sigmoid(-x)
    return d, d * (2 * LIBM_REL + 2 * U) + ABS


def _tanh_second(x):
    v = torch.tanh(x)
    return -2 * v * (1 - v * v)


def _sigmoid_second(x):
    sp, sn = torch.sigmoid(x), torch.sigmoid(-x)
    return sp * sn * (sn - sp)


def _sqrt_second(x):
    return -0.25 / (x * torch.sqrt(x))


def _sqrt_value(x):
    v = torch.sqrt(x)
    return v, _finite_err(v, v * LIBM_REL + ABS)


def _sqrt_slope(x):
    d = 0.5 / torch.sqrt(x)
    return d, _finite_err(d, d * (LIBM_REL + 4 * U) + ABS)


# ---------------------------------------------------------------- certified intercepts
@dataclass(frozen=True)
class Curvature:
    """f with proven errors and its curvature pieces.

    ``value(x)``, ``slope(x)``: (float64 value, bound on its error) of f and f';
    ``second(x)``: f'' (no error bound: it only steers the search); ``pieces``: (lo, hi, c)
    with f convex (c = 1), concave (c = -1) or neither (c = 0, then |f''| <= ``bound``) on
    [lo, hi]; together they cover the domain."""

    value: Callable
    slope: Callable
    second: Callable
    pieces: tuple
    bound: float = 0.0


def _gelu_pieces(r):
    lo, hi = r
    return ((-math.inf, -hi, -1), (-hi, -lo, 0), (-lo, lo, 1), (lo, hi, 0), (hi, math.inf, -1))


S_PIECES = ((-math.inf, 0.0, 1), (0.0, math.inf, -1))
CURVES = {
    "gelu": Curvature(_gelu_value, _gelu_slope, _gelu_second, _gelu_pieces(GELU_ERF.inflection),
                      GELU_CURVATURE),
    "gelu_tanh": Curvature(_gelu_tanh_value, _gelu_tanh_slope, _gelu_tanh_second,
                           _gelu_pieces(GELU_TANH.inflection), GELU_CURVATURE),
    "tanh": Curvature(_tanh_value, _tanh_slope, _tanh_second, S_PIECES),
    "sigmoid": Curvature(_sigmoid_value, _sigmoid_slope, _sigmoid_second, S_PIECES),
    "sqrt": Curvature(_sqrt_value, _sqrt_slope, _sqrt_second, ((0.0, math.inf, -1),)),
}


def _times(a, d):
    # a·d with 0·inf = 0: a zero-width factor contributes nothing
    return torch.where(d == 0, 0.0, a * d)


def _g_upper(curve, sign, s, x):
    """An upper bound of sign·(f(x) - s x) at the float points x."""
    v, e = curve.value(x)
    sx = s * x
    return sign * (v - sx) + (e * (1 + 8 * U) + 4 * U * (sx.abs() + v.abs()) + TINY)


def _solve(fun, lo, hi, p, tol, done):
    """A point of [lo, hi] (1-D tensors) where the decreasing ``fun`` is within ``tol`` of 0:
    Newton steps kept inside the bracket, bisection otherwise (rtsafe). ``fun(x, idx)`` ->
    (value, derivative) at the points x of the elements idx (an index tensor, or
    ``slice(None)``: all). Elements already ``done`` keep ``p``; an element keeps its point
    once it has converged (|value| <= tol, or a bracket of rounding width). Under the "read"
    policy (``host``; the CPU's) converged elements leave the working set after every step;
    else ``_solve_masked``: the same iterates, with a read only every few steps."""
    if host.deferring(p):
        return _solve_masked(fun, lo, hi, p, tol, ~done)
    p = p.clone()
    idx = (~done).nonzero().squeeze(1)
    lo, hi, x, tol = lo[idx], hi[idx], p[idx], tol[idx]
    for _ in range(SEARCH_STEPS):
        if idx.numel() == 0:
            break
        lo, hi, x, fin = _newton_step(fun, idx, lo, hi, x, tol)
        p[idx] = x
        keep = (~fin).nonzero().squeeze(1)
        idx, lo, hi, x, tol = idx[keep], lo[keep], hi[keep], x[keep], tol[keep]
    return p


def _solve_masked(fun, lo, hi, p, tol, moving):
    """``_solve`` on every element, those not ``moving`` (done or converged) kept in place by
    a mask; the elements still moving are read (one ``nonzero``, which also compacts them)
    only after SEARCH_READS steps in all. Each element takes the iterates it takes in
    ``_solve``, and stops where it stops there (at convergence or after SEARCH_STEPS)."""
    idx, x, steps = slice(None), p, 0
    for reads in SEARCH_READS:
        for _ in range(reads - steps):
            lo, hi, new, fin = _newton_step(fun, idx, lo, hi, x, tol, moving)
            x, moving = torch.where(moving, new, x), moving & ~fin
        steps = reads
        p = x if isinstance(idx, slice) else p.index_put((idx,), x)
        keep = moving.nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        idx = keep if isinstance(idx, slice) else idx[keep]
        lo, hi, x, tol, moving = lo[keep], hi[keep], x[keep], tol[keep], moving[keep]
    return p


def _newton_step(fun, idx, lo, hi, x, tol, moving=None):
    """One rtsafe step at x: returns (lo, hi, x', fin), the bracket [lo, hi] shrunk to the
    side of the root (fun decreases), x' = x where converged (``fin``), else the Newton point
    x - v/v' where it falls inside the bracket, else the bracket's midpoint. ``moving``: the
    elements whose step is used (the others' v/v' may be 0/0, which would make their unused
    zero gradients NaN: it is taken as 0/1 there)."""
    v, dv = fun(x, idx)
    pos = v > 0
    lo, hi = torch.where(pos, x, lo), torch.where(pos, hi, x)
    fin = (v.abs() <= tol) | (hi - lo <= 4 * U * (lo.abs() + hi.abs()) + TINY)
    if moving is not None:
        v, dv = torch.where(moving, v, 0.0), torch.where(moving, dv, 1.0)
    step = x - v / dv
    inside = (step > lo) & (step < hi)  # False for NaN
    return lo, hi, torch.where(fin, x, torch.where(inside, step, lo + (hi - lo) * 0.5)), fin


def _critical(curve, sign, s, a, b, skip):
    """A point of [a, b] near the maximiser of the concave g = sign·(f - s x): an end when
    g' does not change sign, else the root of the decreasing g'; no search where ``skip``
    (None: everywhere; elsewhere any point will do). No gradient: by the envelope theorem
    d max g / ds = -sign·p, which the caller's g(p) carries."""
    return _critical_point(curve, sign, s.detach(), a.detach(), b.detach(), skip)


@torch.no_grad()
def _critical_point(curve, sign, s, a, b, skip):
    ga = sign * (curve.slope(a)[0] - s)
    gb = sign * (curve.slope(b)[0] - s)
    at_a, at_b = ~(ga > 0), gb >= 0
    # stop when |g'(p)| (b - a) is below the rounding noise of the intercept
    tol = 2.0 ** -40 * (1 + s.abs() * (a.abs() + b.abs())) / (1 + (b - a))
    p = _solve(lambda x, i: (sign * (curve.slope(x)[0] - s[i]), sign * curve.second(x)),
               a, b, a + (b - a) * 0.5, tol, at_a | at_b if skip is None else at_a | at_b | skip)
    return torch.where(at_a, a, torch.where(at_b, b, p))


def _tangent_bound(curve, sign, s, a, b, p):
    """max over [a, b] of a concave g = sign·(f - s x) <= g(p) + max(g'(p)(a - p), g'(p)(b - p))."""
    v, e = curve.value(p)
    gp = sign * (v - s * p)
    ep = e * (1 + 8 * U) + 4 * U * ((s * p).abs() + v.abs()) + TINY
    d, ed = curve.slope(p)
    gd = sign * (d - s)
    egd = ed + 2 * U * (d.abs() + s.abs())
    da, db = a - p, b - p
    lin = torch.maximum(_times(gd, da), _times(gd, db))
    spread = torch.maximum(-da, db)
    slack = 8 * U * (gp.abs() + ep + _times(gd.abs() + egd, db - da)) + TINY
    return gp + ep + lin + _times(egd, spread) + slack


def _sup(curve, sign, s, l, u):
    """Upper bound of max over [l, u] of sign·(f(x) - s x), for 1-D l <= u finite and slopes
    s: the max over the curvature pieces [a, b] = [l, u] ∩ piece that the box meets (a <= b)
    of the piece's bound (``_piece_sup``), each piece on the elements that meet it (``host``
    "read"), or on every element, masked by a <= b (else: no read to select them; on the
    others a > b and the value, finite, is unused)."""
    best = torch.full_like(l, -torch.inf)
    masked = host.deferring(l)
    for lo, hi, c in curve.pieces:
        a, b = l.clamp(min=lo), u.clamp(max=hi)
        if masked:
            # s.clone(): each piece's gradients are summed apart and then added to s's, as
            # the indexed s[idx] does (Adam in alpha-CROWN turns another rounding into another path)
            meets = a <= b
            v = _piece_sup(curve, sign, c * sign, s.clone(), a, b, ~meets)
            best = torch.where(meets, torch.maximum(best, v), best)
            continue
        idx = (a <= b).nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        a, b, s_ = a[idx], b[idx], s[idx]
        v = _piece_sup(curve, sign, c * sign, s_, a, b, None)
        best[idx] = torch.maximum(best[idx], v)
    # an empty box (l > u) or NaN ends: no information, never a plane "f >= +inf"
    return torch.where(l <= u, best, torch.inf)


def _piece_sup(curve, sign, kind, s, a, b, skip):
    """Upper bound of max over [a, b] of g = sign·(f - s x) on a piece where g is convex
    (``kind`` > 0: the larger end value), concave (< 0: the tangent at the critical point,
    searched except where ``skip``, None: everywhere) or neither (0, a sliver [a, b] around
    an inflection point: the ends plus M (b - a)²/8, M >= max|f''|)."""
    if kind < 0:
        return _tangent_bound(curve, sign, s, a, b, _critical(curve, sign, s, a, b, skip))
    v = torch.maximum(_g_upper(curve, sign, s, a), _g_upper(curve, sign, s, b))
    if kind > 0:
        return v
    h = b - a
    term = curve.bound * h * h * (0.125 + U)
    return v + term + 2 * U * (v.abs() + term)


def intercepts(name, l, u, lw, uw):
    """Certified intercepts (lb, ub) for slopes (lw, uw) of the activation ``name`` on the
    finite boxes [l, u]: lb = inf (f - lw·x), ub = sup (f - uw·x) over [l, u], each bounded
    outward (see the module docstring)."""
    curve = CURVES[name]
    return -_sup(curve, -1, lw, l, u), _sup(curve, 1, uw, l, u)


# ---------------------------------------------------------------- slopes
def _chord(curve, l, u):
    fl, fu = curve.value(l)[0], curve.value(u)[0]
    w = u - l
    wide = w > TINY_WIDTH
    mid = curve.slope(l + w * 0.5)[0]
    return torch.where(wide, (fu - fl) / torch.where(wide, w, 1.0), mid), mid


def _tangent_through(curve, x0, lo, hi, skip):
    """Slope of the tangent at d in [lo, hi] that passes through (x0, f(x0)): the root of
    h(d) = f(d) + f'(d)(x0 - d) - f(x0), increasing on [lo, hi] (the caller checks the sign
    change; ``skip``: elements without a root). Precision only matters for tightness: the
    intercept is certified afterwards."""
    f0 = curve.value(x0)[0]

    def minus_h(d, i):
        return (f0[i] - curve.value(d)[0] - curve.slope(d)[0] * (x0[i] - d),
                -curve.second(d) * (x0[i] - d))
    tol = 2.0 ** -40 * (1 + f0.abs())
    with torch.no_grad():
        d = _solve(minus_h, lo, hi, lo + (hi - lo) * 0.5, tol, skip)
    return curve.slope(_implicit(minus_h, d, skip))[0]


def _implicit(fun, d, skip):
    """The root d of ``fun`` (found without gradients) carrying its implicit derivative: d -
    (v - v̄)/v' with v = fun(d) recorded, v̄ its detached value: the same value as d, and
    dd/dθ = -(∂v/∂θ)/v' (the implicit function theorem) where ``skip`` is False and v' is
    finite and nonzero, else no gradient. Autograd through the Newton iterations instead kept
    every step of the search (17 GB for CROWN-IBP on mnist-vit4-ln at batch 128)."""
    if not torch.is_grad_enabled():
        return d
    v, dv = fun(d, slice(None))
    if not v.requires_grad:
        return d
    dv = dv.detach()
    ok = ~skip & torch.isfinite(dv) & (dv != 0)
    return d - torch.where(ok, (v - v.detach()) / torch.where(ok, dv, 1.0), 0.0)


def _s_slopes(curve, l, u):
    """CROWN's S-shape rules (convex on x <= 0, concave on x >= 0): (lower, upper) slopes.
    On a box crossing 0 the upper slope is the tangent at d in [0, u] through (l, f(l)) when
    that d exists (h_u = f(u) + f'(u)(l - u) - f(l) > 0), the lower one the tangent at d in
    [l, 0] through (u, f(u)) when h_l = f(l) + f'(l)(u - l) - f(u) < 0; else the chord.
    Whether any box crosses 0 is read only under the "read" policy (``host.maybe``)."""
    k, mid = _chord(curve, l, u)
    lower = torch.where(u <= 0, mid, k)
    upper = torch.where(l >= 0, mid, k)
    cross = (l < 0) & (u > 0)
    if host.maybe(cross.any()):
        zero = torch.zeros_like(l)
        fl, fu = curve.value(l)[0], curve.value(u)[0]
        # upper: the tangent at d in [0, u] through (l, f(l)), if that d exists (else the chord)
        hu = fu + curve.slope(u)[0] * (l - u) - fl
        tangent = cross & (hu > 0)
        upper = torch.where(tangent, _tangent_through(curve, l, zero, u.clamp(min=0), ~tangent), upper)
        # lower: the tangent at d in [l, 0] through (u, f(u)), if that d exists
        hl = fl + curve.slope(l)[0] * (u - l) - fu
        tangent = cross & (hl < 0)
        lower = torch.where(tangent, _tangent_through(curve, u, l.clamp(max=0), zero, ~tangent), lower)
    return lower, upper


def _gelu_slopes(name, l, u):
    """Per side, of the candidate slopes the one whose certified plane is closest to f at
    the midpoint (the smallest area between plane and f over [l, u]). Candidates: chord
    and f'(m) for both sides, f'(l) and f'(u) (the ReLU-like choices) below; on random
    boxes f'(l), f'(u) never won above."""
    curve = CURVES[name]
    k, mid = _chord(curve, l, u)
    m = l + (u - l) * 0.5

    def pick(cands, sign):
        best = None
        for s in cands:
            s = torch.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0)
            b = -sign * _sup(curve, -sign, s, l, u)
            at = sign * (s * m + b)  # the plane's distance from f at m, negated
            if best is None:
                best = (s, b, at)
            else:
                take = at > best[2]
                best = tuple(torch.where(take, new, old) for new, old in zip((s, b, at), best))
        return best[0], best[1]
    lw, lb = pick([k, mid, curve.slope(l)[0], curve.slope(u)[0]], 1)
    uw, ub = pick([k, mid], -1)
    return lw, lb, uw, ub


# ---------------------------------------------------------------- images
def _monotone_image(curve, value_range):
    def image(l, u):
        l, u = _as64(l), _as64(u)
        vl, el = curve.value(l)
        vu, eu = curve.value(u)
        lo, hi = vl - el, vu + eu
        return _clip_image(lo, hi, l, u, value_range)
    return image


def _gelu_image(name, consts):
    curve = CURVES[name]
    (xs_lo, xs_hi), fmin = consts.argmin, consts.minimum[0]

    def image(l, u):
        """[min, max] of GELU on [l, u], rounded outward: the max at an end point (f is
        decreasing below x* and increasing above), the min f(x*) when x* is in [l, u]."""
        l, u = _as64(l), _as64(u)
        vl, el = curve.value(l)
        vu, eu = curve.value(u)
        lo = torch.minimum(vl - el, vu - eu)
        lo = torch.where((l <= xs_hi) & (u >= xs_lo), fmin, lo)
        hi = torch.maximum(vl + el, vu + eu)
        return _clip_image(lo, hi, l, u, (fmin, None))
    return image


def _clip_image(lo, hi, l, u, value_range):
    vlo, vhi = value_range
    lo = lo if vlo is None else lo.clamp(min=vlo)
    hi = hi if vhi is None else hi.clamp(max=vhi)
    bad = torch.isnan(l) | torch.isnan(u) | torch.isnan(lo) | torch.isnan(hi)
    none_lo = -torch.inf if vlo is None else vlo
    none_hi = torch.inf if vhi is None else vhi
    return torch.where(bad, none_lo, lo), torch.where(bad, none_hi, hi)


# ---------------------------------------------------------------- planes
def _as64(t):
    return tensor_of(t, torch.float64)


def _planes(name, image, slopes, unbounded=None, lo_floor=None):
    """planes(l, u, alpha) for the activation ``name``: slopes from ``slopes(l, u)``
    (either (lw, uw) or (lw, lb, uw, ub) when the intercepts came with the choice), the
    intercepts certified; infinite ends get the image's constant planes, refined by
    ``unbounded(l, u, planes)`` when given; ``lo_floor``: a global lower bound of f. Whether
    any end is infinite is read only under the "read" policy (``host.maybe``)."""
    def planes(l, u, alpha=None):
        l, u = torch.broadcast_tensors(_as64(l), _as64(u))
        shape = l.shape
        l, u = l.reshape(-1), u.reshape(-1)
        fin = torch.isfinite(l) & torch.isfinite(u)
        lf, uf = torch.where(fin, l, 0.0), torch.where(fin, u, 0.0)
        out = slopes(lf, uf)
        if len(out) == 2:
            lw, uw = out
            lb, ub = intercepts(name, lf, uf, lw, uw)
        else:
            lw, lb, uw, ub = out
        if host.maybe(~fin.all()):
            ilo, ihi = image(l, u)
            # a box at +inf (or -inf) only comes from overflow: its plane must not claim
            # f >= +inf (or f <= -inf), which would "prove" anything downstream
            ilo = torch.where(ilo == torch.inf, -torch.inf if lo_floor is None else lo_floor, ilo)
            ihi = torch.where(ihi == -torch.inf, torch.inf, ihi)
            zero = torch.zeros_like(l)
            const = (zero, ilo, zero, ihi)
            if unbounded is not None:
                const = unbounded(l, u, const)
            lw, lb, uw, ub = (torch.where(fin, a, b) for a, b in zip((lw, lb, uw, ub), const))
        return tuple(t.reshape(shape) for t in _sanitize(lw, lb, uw, ub))
    return planes


def _with_alpha(default, given):
    """planes(l, u, alpha): ``default`` without alpha; with alpha in [0, 1] (any shape that
    broadcasts with l, u, e.g. (B, S, *shape) in alpha-CROWN) the lower plane of slope
    smin + alpha (smax - smin), [smin, smax] = the slope range of f' on [l, u] (which holds
    the slope of every best lower plane), with its certified intercept: sound for every
    alpha, differentiable in alpha (d lb / ds = -argmin); ``given``: those planes
    (``_alpha_planes``). The upper plane is the default's."""

    def planes(l, u, alpha=None):
        out = default(l, u)
        return out if alpha is None else given(l, u, alpha, out)
    return planes


def _alpha_planes(name, slope_range):
    """alpha_planes(l, u, alpha, out): ``_with_alpha``'s planes for ``alpha`` given the
    default planes ``out`` on the same boxes (a caller that keeps them, ``certify.crown``,
    saves computing them, and their Newton searches, again in every pass)."""
    curve = CURVES[name]

    def planes(l, u, alpha, out):
        lw0, lb0, uw, ub = out
        l, u, a = torch.broadcast_tensors(_as64(l), _as64(u), tensor_of(alpha, torch.float64, out[0].device))
        shape = l.shape
        l, u, a = l.reshape(-1), u.reshape(-1), a.reshape(-1)
        fin = torch.isfinite(l) & torch.isfinite(u)
        lf, uf = torch.where(fin, l, 0.0), torch.where(fin, u, 0.0)
        with torch.no_grad():
            smin, smax = slope_range(lf, uf)
        s = smin + a.clamp(0, 1) * (smax - smin)
        s = torch.where(torch.isfinite(s), s, 0.0)
        lb = -_sup(curve, -1, s, lf, uf)
        lw = torch.where(fin, s, lw0.expand(shape).reshape(-1))
        lb = torch.where(fin, lb, lb0.expand(shape).reshape(-1))
        bad = torch.isnan(lw) | torch.isnan(lb) | (lb == -torch.inf)
        lw, lb = torch.where(bad, 0.0, lw), torch.where(bad, -torch.inf, lb)
        return lw.reshape(shape), lb.reshape(shape), uw.expand(shape), ub.expand(shape)
    return planes


def _alpha_init(default, slope_range):
    """slope_init(l, u): the alpha whose slope is the default (CROWN-rule) lower slope."""
    @torch.no_grad()
    def init(l, u):
        l, u = torch.broadcast_tensors(_as64(l), _as64(u))
        lw = default(l, u)[0].reshape(-1)
        shape = l.shape
        l, u = l.reshape(-1), u.reshape(-1)
        fin = torch.isfinite(l) & torch.isfinite(u)
        smin, smax = slope_range(torch.where(fin, l, 0.0), torch.where(fin, u, 0.0))
        span = smax - smin
        a = ((lw - smin) / torch.where(span > 0, span, 1.0)).clamp(0, 1)
        return torch.where(fin & (span > 0) & torch.isfinite(a), a, 0.5).reshape(shape)
    return init


def _gelu_slope_range(name, r):
    """f' decreases on (-inf, -r], increases on [-r, r], decreases on [r, inf)."""
    curve = CURVES[name]

    def slope_range(l, u):
        def at(x):
            return curve.slope(x)[0]
        inside = lambda c: torch.maximum(torch.minimum(torch.full_like(l, c), u), l)  # noqa: E731
        dl, du = at(l), at(u)
        lo = torch.minimum(torch.minimum(dl, du), at(inside(-r)))
        hi = torch.maximum(torch.maximum(dl, du), at(inside(r)))
        return lo, hi
    return slope_range


def _s_slope_range(name):
    """f' increases on x <= 0, decreases on x >= 0."""
    curve = CURVES[name]

    def slope_range(l, u):
        lo = torch.minimum(curve.slope(l)[0], curve.slope(u)[0])
        hi = curve.slope(torch.maximum(torch.minimum(torch.zeros_like(l), u), l))[0]
        return lo, hi
    return slope_range


def _sanitize(lw, lb, uw, ub):
    # any NaN (overflow in s·x for huge slopes and ends) or infinite intercept becomes "no
    # information": 0·x ± inf
    bad_l = torch.isnan(lw) | torch.isnan(lb) | torch.isinf(lw) | (lb == -torch.inf)
    bad_u = torch.isnan(uw) | torch.isnan(ub) | torch.isinf(uw) | (ub == torch.inf)
    return (torch.where(bad_l, 0.0, lw), torch.where(bad_l, -torch.inf, lb),
            torch.where(bad_u, 0.0, uw), torch.where(bad_u, torch.inf, ub))


def _gelu_unbounded(l, u, const):
    """On [l, inf) with l finite: GELU(x) <= relu(x) <= x + max(-l, 0) (GELU = relu - |x|Φ(-|x|))."""
    lw, lb, uw, ub = const
    ray = (u == torch.inf) & torch.isfinite(l)
    return lw, lb, torch.where(ray, 1.0, uw), torch.where(ray, (-l).clamp(min=0), ub)


def _sqrt_slopes(l, u):
    """Concave: the chord below, the tangent at the midpoint above."""
    _require_nonnegative(l)
    k, mid = _chord(CURVES["sqrt"], l, u)
    upper = torch.where(torch.isfinite(mid), mid, k)
    # f'(0) = inf: on [0, 0] any finite slope will do (the intercepts are certified)
    return torch.where(torch.isfinite(k), k, 0.0), torch.where(torch.isfinite(upper), upper, 0.0)


def _require_nonnegative(l):
    host.require(~(l < 0).any(), lambda: ValueError("sqrt: input interval must be non-negative (l >= 0)"))


def _checked_sqrt_planes(planes):
    def checked(l, u, alpha=None):
        _require_nonnegative(_as64(l))
        return planes(l, u, alpha)
    return checked


gelu_image = _gelu_image("gelu", GELU_ERF)
gelu_tanh_image = _gelu_image("gelu_tanh", GELU_TANH)
tanh_image = _monotone_image(CURVES["tanh"], (-1.0, 1.0))
sigmoid_image = _monotone_image(CURVES["sigmoid"], (0.0, 1.0))
sqrt_image = _monotone_image(CURVES["sqrt"], (0.0, None))

_gelu_default = _planes("gelu", gelu_image, lambda l, u: _gelu_slopes("gelu", l, u), _gelu_unbounded,
                        GELU_ERF.minimum[0])
_gelu_tanh_default = _planes("gelu_tanh", gelu_tanh_image, lambda l, u: _gelu_slopes("gelu_tanh", l, u),
                             _gelu_unbounded, GELU_TANH.minimum[0])
_tanh_default = _planes("tanh", tanh_image, lambda l, u: _s_slopes(CURVES["tanh"], l, u))
_sigmoid_default = _planes("sigmoid", sigmoid_image, lambda l, u: _s_slopes(CURVES["sigmoid"], l, u))
SLOPE_RANGES = {"gelu": _gelu_slope_range("gelu", GELU_ERF.inflection[0]),
                "gelu_tanh": _gelu_slope_range("gelu_tanh", GELU_TANH.inflection[0]),
                "tanh": _s_slope_range("tanh"), "sigmoid": _s_slope_range("sigmoid")}
ALPHA_PLANES = {name: _alpha_planes(name, slope_range) for name, slope_range in SLOPE_RANGES.items()}
gelu_planes = _with_alpha(_gelu_default, ALPHA_PLANES["gelu"])
gelu_tanh_planes = _with_alpha(_gelu_tanh_default, ALPHA_PLANES["gelu_tanh"])
tanh_planes = _with_alpha(_tanh_default, ALPHA_PLANES["tanh"])
sigmoid_planes = _with_alpha(_sigmoid_default, ALPHA_PLANES["sigmoid"])
sqrt_planes = _checked_sqrt_planes(_planes("sqrt", sqrt_image, _sqrt_slopes, lo_floor=0.0))

register(Elementwise(name="gelu", description="x Φ(x) = 0.5 x (1 + erf(x/√2)) (GELU, exact form)",
                     fn=F.gelu, image=gelu_image, planes=gelu_planes,
                     slope_init=_alpha_init(_gelu_default, SLOPE_RANGES["gelu"]),
                     alpha_planes=ALPHA_PLANES["gelu"],
                     value_range=(GELU_ERF.minimum[0], None)))
register(Elementwise(name="gelu_tanh", description="0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³))) (GELU, tanh form)",
                     fn=lambda t: F.gelu(t, approximate="tanh"), image=gelu_tanh_image, planes=gelu_tanh_planes,
                     slope_init=_alpha_init(_gelu_tanh_default, SLOPE_RANGES["gelu_tanh"]),
                     alpha_planes=ALPHA_PLANES["gelu_tanh"],
                     value_range=(GELU_TANH.minimum[0], None)))
register(Elementwise(name="tanh", description="tanh(x)", fn=torch.tanh, image=tanh_image, planes=tanh_planes,
                     slope_init=_alpha_init(_tanh_default, SLOPE_RANGES["tanh"]),
                     alpha_planes=ALPHA_PLANES["tanh"],
                     monotone=True, value_range=(-1.0, 1.0)))
register(Elementwise(name="sigmoid", description="1 / (1 + e^-x)", fn=torch.sigmoid, image=sigmoid_image,
                     planes=sigmoid_planes, slope_init=_alpha_init(_sigmoid_default, SLOPE_RANGES["sigmoid"]),
                     alpha_planes=ALPHA_PLANES["sigmoid"],
                     monotone=True, value_range=(0.0, 1.0)))
register(Elementwise(name="sqrt", description="√x on x >= 0 (concave)", fn=torch.sqrt, image=sqrt_image,
                     planes=sqrt_planes, monotone=True, domain=(0.0, None), value_range=(0.0, None)))
