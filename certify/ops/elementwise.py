"""Elementwise operators with optimisable, rounding-sound linear relaxations.

``planes(l, u, alpha)`` returns float64 (lw, lb, uw, ub) with lw·x + lb <= f(x) <= uw·x + ub
for every real x in [l, u], in exact real arithmetic; ``image(l, u)`` encloses the real
image, rounded outward. Sources: CROWN (Zhang et al. 2018) for ReLU, exp and reciprocal, as
used for attention by Shi et al. 2020; alpha-CROWN (Xu et al. 2021) for the free tangent point.

Families (``alpha`` broadcasts with l, u, e.g. (B, S, *shape) in alpha-CROWN; range [0, 1]):
- relu: lower slope alpha on crossing intervals (default 1 if u > -l else 0, CROWN);
- exp, reciprocal, square, rsqrt, neg_log (convex): lower plane = tangent at
  m = l + alpha (u - l); default alpha: exp min(1/2, 0.99/(u - l)) (Shi et al. 2020), neg_log
  the tangent parallel to the chord, the others 1/2 (the midpoint); the chord stays above.
  Reciprocal also takes boxes below 0, where 1/x = -(1/(-x)) is concave: there the chord is
  the lower plane and the tangent at m the upper one (``reciprocal_planes``);
- trunc, nonzero (piecewise constant, the casts of a float to an integer or to bool): the
  only sound planes are the constant ones of the exact image.
  The softmax of our graphs is lowered to softmax_shift and a sum (affine), exp, neg_log and
  sigmoid (``certify.lowering``; masked rows: exp, sum, reciprocal and mul), so these
  families with the S-shaped and bilinear ones (``certify.ops.activations``,
  ``certify.ops.bilinear``) make every piece of it optimisable.
Soundness under rounding: the slope is any float (chosen freely), the intercept certified.
For a convex f, g(x) = f(x) - s x is convex, so (a) its max on [l, u] is at an end point and
(b) g(x) >= g(m) + g'(m)(x - m) with |g'(m)| = |f'(m) - s| <= the slope's error bound:
lb = g(m) - err_s·max(m - l, u - m), ub = max(g(l), g(u)), each value of f and f' carrying a
proven error (``Convex``) and every float operation charged (``_round_down``). Boxes where
this is not finite (overflow, infinite ends) fall back to the constant planes of the image.
Assumption: float64 exp within EXP_ULPS ulp, log within LOG_ULPS ulp (``kernels.floating``);
sqrt and division are correctly rounded (IEEE 754).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from softcert.certify.ops import host
from softcert.certify.ops.core import Elementwise, SplitRule, down, register, tensor_of, up
from softcert.kernels.floating import EXP_ABS, EXP_REL, LOG_REL, SUBNORMAL_ULP, U64

U = U64
#: absolute error floor of one value or slope near the subnormal range (e.g. 1/x² for
#: x > 1e154 rounds to 0 while the true value is below 1e-308)
ABS = 1e-300


def _round_down(v, err):
    """A float <= every real within ``err`` of the float v (err >= the error of v itself):
    v - err(1 + 4u) - 4u|v| covers the rounding of the subtraction."""
    return v - (err * (1 + 4 * U) + 4 * U * v.abs() + SUBNORMAL_ULP)


def _round_up(v, err):
    return v + (err * (1 + 4 * U) + 4 * U * v.abs() + SUBNORMAL_ULP)


@dataclass(frozen=True)
class Convex:
    """A convex f with proven float64 errors: ``value(x)``, ``slope(x)`` -> (float, error
    bound) of f(x) and f'(x) at float x; ``default(l, u)``: the CROWN tangent parameter."""

    value: Callable
    slope: Callable
    default: Callable


def _exp_value(x):
    v = torch.exp(x)
    return v, v * EXP_REL + EXP_ABS


def _recip_value(x):
    v = 1 / x
    return v, v.abs() * U + SUBNORMAL_ULP


def _recip_slope(x):
    # -1/(x·x): two correctly rounded operations
    d = -1 / (x * x)
    return d, d.abs() * 3 * U + ABS


def _square_value(x):
    v = x * x
    return v, v * U + SUBNORMAL_ULP


def _square_slope(x):
    return 2 * x, torch.zeros_like(x)  # exact (a power-of-two scaling)


def _rsqrt_value(x):
    # 1/sqrt(x): sqrt and division correctly rounded, (1 + u)/(1 - u) - 1 < 2.01u
    v = 1 / torch.sqrt(x)
    return v, v * 3 * U + SUBNORMAL_ULP


def _rsqrt_slope(x):
    # -0.5 r / x with r = 1/sqrt(x) (2.01u) and one division (u); the 0.5 is exact
    d = -0.5 * (1 / torch.sqrt(x)) / x
    return d, d.abs() * 5 * U + ABS


def _neg_log_value(x):
    v = -torch.log(x)
    return v, v.abs() * LOG_REL + SUBNORMAL_ULP


def _neg_log_slope(x):
    d = -1 / x
    return d, d.abs() * U + ABS


def _neg_log_default(l, u):
    """The tangent parallel to the chord: at the logarithmic mean m = (u - l) / log(u / l),
    where -1/m is the chord's slope (the point of f farthest below the chord). On the wide
    boxes of an exp-sum (u/l of several orders) the midpoint sits far from it."""
    l, u = tensor_of(l, torch.float64), tensor_of(u, torch.float64)
    w = u - l
    # off the boxes with 0 < l < u the quotients are NaN or inf: those take the midpoint
    a = (w / torch.log(u / l) - l) / w
    return torch.where((w > 0) & (l > 0) & torch.isfinite(a), a.clamp(0, 1), 0.5)


def _half(l, u):
    return torch.full_like(tensor_of(l + u), 0.5)


def _exp_default(l, u):
    """Shi et al. 2020: tangent at min((l+u)/2, l + 0.99), i.e. alpha = min(1/2, 0.99/(u-l))."""
    w = u - l
    return torch.where(w > 0, (0.99 / torch.where(w > 0, w, 1.0)).clamp(max=0.5), 0.5)


CONVEX = {
    "exp": Convex(_exp_value, _exp_value, _exp_default),
    "reciprocal": Convex(_recip_value, _recip_slope, _half),
    "square": Convex(_square_value, _square_slope, _half),
    "rsqrt": Convex(_rsqrt_value, _rsqrt_slope, _half),
    "neg_log": Convex(_neg_log_value, _neg_log_slope, _neg_log_default),
}


def _g(f, s, x):
    """(float, error bound) of g(x) = f(x) - s x at float x."""
    v, e = f.value(x)
    sx = s * x
    return v - sx, e + 2 * U * (v.abs() + sx.abs())


def tangent_plane(f, l, u, alpha):
    """Lower plane of the convex ``f`` touching at m = l + alpha (u - l): (s, certified lb)."""
    m = torch.minimum(torch.maximum(l + alpha.clamp(0, 1) * (u - l), l), u)
    s, es = f.slope(m)
    g, eg = _g(f, s, m)
    spread = torch.maximum(m - l, u - m) * (1 + 4 * U)
    # 0·inf (an exact slope over an infinite spread) is 0, not NaN
    drift = torch.where(es == 0, 0.0, es * spread)
    return s, _round_down(g, eg + drift)


def chord_plane(f, l, u):
    """Upper plane of the convex ``f`` on [l, u]: the chord slope (f'(l) below TINY_WIDTH,
    where the difference quotient is noise) and ub = max(g(l), g(u)) rounded up."""
    w = u - l
    wide = w > TINY_WIDTH
    fl, fu = f.value(l)[0], f.value(u)[0]
    s = torch.where(wide, (fu - fl) / torch.where(wide, w, 1.0), f.slope(l)[0])
    gl, el = _g(f, s, l)
    gu, eu = _g(f, s, u)
    return s, torch.maximum(_round_up(gl, el), _round_up(gu, eu))


TINY_WIDTH = 1e-7


def _fallback(lw, lb, uw, ub, image_lo, image_hi):
    """Where a plane is not finite (overflow, infinite ends), the image's constant plane."""
    bad_l = ~(torch.isfinite(lw) & torch.isfinite(lb))
    bad_u = ~(torch.isfinite(uw) & torch.isfinite(ub))
    # (nan_to_num's default would also turn ±inf into ±max float: f <= 1.8e308 is false)
    lo = torch.where(torch.isnan(image_lo), -torch.inf, image_lo)
    hi = torch.where(torch.isnan(image_hi), torch.inf, image_hi)
    return (torch.where(bad_l, 0.0, lw), torch.where(bad_l, lo, lb),
            torch.where(bad_u, 0.0, uw), torch.where(bad_u, hi, ub))


def convex_planes(name, image):
    """planes(l, u, alpha) of the convex family ``name`` (see the module docstring)."""
    f = CONVEX[name]

    def planes(l, u, alpha=None):
        l, u = tensor_of(l, torch.float64), tensor_of(u, torch.float64)
        l = torch.minimum(l, u)
        if alpha is None:
            alpha = f.default(l, u)
        alpha = tensor_of(alpha, torch.float64, l.device)
        # the spec axis of alpha broadcasts against the (B, 1, ...) boxes
        lw, lb = tangent_plane(f, l, u, alpha)
        uw, ub = chord_plane(f, l, u)
        ilo, ihi = image(l, u)
        lw, lb, uw, ub = torch.broadcast_tensors(lw, lb, uw, ub)
        ilo, ihi = ilo.expand(lw.shape), ihi.expand(lw.shape)
        return _fallback(lw, lb, uw, ub, ilo, ihi)
    return planes


def _positive(name, planes, strict=True):
    """``planes`` that raise for boxes reaching below 0 (or to 0 when ``strict``). -log x
    takes l = 0, an exp-sum that underflowed: its planes there fall back to the image's."""
    def checked(l, u, alpha=None):
        l = tensor_of(l)
        host.require(~((l <= 0) if strict else (l < 0)).any(),
                     lambda: ValueError(f"{name}: input interval must be {'positive' if strict else 'non-negative'}"))
        return planes(l, u, alpha)
    return checked


def relu_planes(l, u, alpha=None):
    """Upper: the chord on crossing intervals, its intercept max(uw·(-l), u - uw·u) rounded
    up; lower: slope alpha in [0, 1] through 0 (exact), default 1 if u > -l else 0 (CROWN)."""
    l = torch.minimum(l, u)
    active, dead = l >= 0, u <= 0
    cross = ~(active | dead)
    den = torch.where(cross, u - l, 1.0)
    uw = torch.where(active, 1.0, torch.where(cross, u / den, 0.0))
    at_l = -uw * l
    at_u = u - uw * u
    ub = torch.maximum(at_l + 2 * U * at_l.abs(), at_u + 4 * U * (u.abs() + at_u.abs())) + SUBNORMAL_ULP
    ub = torch.where(cross, ub, 0.0)
    if alpha is None:
        alpha = (u > -l).to(l.dtype)
    lw = torch.where(active, 1.0, torch.where(cross, alpha.clamp(0, 1), 0.0))
    return lw, torch.zeros_like(lw), uw, ub


def exp_image(l, u):
    """[exp(l), exp(u)] widened by EXP_REL (+ EXP_ABS below the normal range) and one ulp."""
    (vl, el), (vu, eu) = _exp_value(l), _exp_value(u)
    return down(vl - el).clamp(min=0), up(vu + eu)


def _positive_reciprocal_image(l, u):
    """[1/u, 1/l] for 0 < l <= u, each correctly rounded, one ulp outward."""
    return down(1 / u).clamp(min=0), up(1 / l)


def _reflect(l, u):
    """(below, a, b): where the box lies below 0 (u <= 0, l < 0), its mirror [a, b] = [-u, -l]
    >= 0; elsewhere [l, u] itself (negation is exact; + 0.0 turns -0.0 into +0.0, so 1/a is
    +inf at a = 0)."""
    below = (u < 0) | ((u == 0) & (l < 0))
    return below, torch.where(below, -u, l) + 0.0, torch.where(below, -l, u)


def reciprocal_image(l, u):
    """[1/u, 1/l] on a box of one sign (1/x decreases on each side of 0): below 0 the
    mirror of the positive image, 1/x = -(1/(-x)). Boxes containing 0: see ``Reciprocal``."""
    below, a, b = _reflect(l, u)
    lo, hi = _positive_reciprocal_image(a, b)
    return torch.where(below, -hi, lo), torch.where(below, -lo, hi)


def square_image(l, u):
    lo = torch.where((l <= 0) & (u >= 0), 0.0, down(torch.minimum(l * l, u * u)).clamp(min=0))
    return lo, up(torch.maximum(l * l, u * u))


def rsqrt_image(l, u):
    (vu, eu), (vl, el) = _rsqrt_value(u), _rsqrt_value(l)
    return down(vu - eu).clamp(min=0), up(vl + el)


def neg_log_image(l, u):
    """[-log u, -log l] widened by LOG_REL and one ulp; -log 0 = inf."""
    (vu, eu), (vl, el) = _neg_log_value(u), _neg_log_value(l)
    return down(vu - eu), up(vl + el)


exp_planes = convex_planes("exp", exp_image)
_positive_reciprocal_planes = convex_planes("reciprocal", _positive_reciprocal_image)
square_planes = convex_planes("square", square_image)
rsqrt_planes = _positive("rsqrt", convex_planes("rsqrt", rsqrt_image))
neg_log_planes = _positive("neg_log", convex_planes("neg_log", neg_log_image), strict=False)


def _contains_zero(l, u):
    return (l <= 0) & (u >= 0)


def _straddles_zero(l, u):
    return ((l < 0) & (u > 0)) | ((l == 0) & (u == 0))


def _zero_message(where, l, u, bad):
    k = int(bad.flatten().nonzero()[0])
    return (f"{where}: the input interval [{float(l.flatten()[k]):.6g}, {float(u.flatten()[k]):.6g}] "
            f"(element {k} of {bad.numel()}, {int(bad.sum())} such) contains 0, where 1/x is unbounded "
            f"of both signs; bound the divisor away from 0 (a smaller input box, or a divisor of one sign)")


def reciprocal_planes(l, u, alpha=None):
    """Planes of 1/x on boxes of one sign. Below 0, with h(y) = 1/y on the mirror [-u, -l]
    (convex: tangent lw·y + lb below, chord uw·y + ub above) and 1/x = -h(-x):
    uw·x - ub <= 1/x <= lw·x - lb, so the chord is the lower plane and the tangent the upper
    one (1/x is concave there); the tangent point keeps m = l + alpha (u - l) (the mirror's
    alpha is 1 - alpha). Negations are exact, so the certified intercepts carry over.
    ValueError for a box containing 0."""
    l, u = tensor_of(l, torch.float64), tensor_of(u, torch.float64)
    bad = _contains_zero(l, u)
    host.require(~bad.any(), lambda: ValueError(_zero_message("reciprocal", l, u, bad)))
    below, a, b = _reflect(l, u)
    if alpha is not None:
        alpha = tensor_of(alpha, torch.float64, l.device)
        alpha = torch.where(below, 1 - alpha, alpha)
    lw, lb, uw, ub = _positive_reciprocal_planes(a, b, alpha)
    return (torch.where(below, uw, lw), torch.where(below, -ub, lb),
            torch.where(below, lw, uw), torch.where(below, -lb, ub))


@dataclass(frozen=True, kw_only=True)
class Reciprocal(Elementwise):
    """1/x on boxes of one sign. ``domain`` (0, None) is the convex branch, where ``convex``
    and the tangent family's reading (tangent below, chord above) hold; a box below 0 is its
    mirror (``reciprocal_planes``). A box touching 0 from one side has the half-infinite
    interval [1/u, inf] or [-inf, 1/l] (a sum of exps whose lower bound underflowed to 0) and
    no planes. A box with 0 inside has no bound: the interval of a graph node refuses it,
    naming the node (1/x is unbounded of both signs there); without a node (the map alone) it
    is (-inf, inf). No ``value_range``: below 0 the values are negative."""

    def interval(self, node, ins, const=None):
        l, u = ins[0]
        bad = _straddles_zero(l, u)
        if node is not None:
            host.require(~bad.any(), lambda: ValueError(_zero_message(f"{self.name} at node {node.name!r}", l, u, bad)))
        lo, hi = self.image(l, u)
        return torch.where(bad, -torch.inf, lo), torch.where(bad, torch.inf, hi)


def trunc_image(l, u):
    """[trunc l, trunc u]: trunc (rounding toward 0) is monotone and exact in float64."""
    return torch.trunc(l), torch.trunc(u)


def nonzero_image(l, u):
    """{1} on a box without 0, {0} on [0, 0], else [0, 1] (exact)."""
    return ((l > 0) | (u < 0)).to(l.dtype), ((l != 0) | (u != 0)).to(l.dtype)


def constant_planes(image):
    """planes(l, u, alpha) of a piecewise-constant map: 0·x + lo <= f(x) <= 0·x + hi with
    [lo, hi] its exact image (between its steps a plane of nonzero slope would cut it)."""
    def planes(l, u, alpha=None):
        lo, hi = image(tensor_of(l, torch.float64), tensor_of(u, torch.float64))
        zero = torch.zeros_like(lo)
        return zero, lo, zero, hi
    return planes


@dataclass(frozen=True, kw_only=True)
class Limited(Elementwise):
    """An elementwise map whose node may carry ``limits`` (lo, hi): float64 bounds the output
    must stay in (ONNX's cast of a float to int8 is undefined outside [-128, 127]; an int64
    cast to float32 rounds beyond 2^24); ``interval`` raises ValueError naming the node where
    the image leaves them."""

    def interval(self, node, ins, const=None):
        lo, hi = super().interval(node, ins, const)
        limits = None if node is None else node.params.get("limits")
        if limits is not None:
            out = (lo < limits[0]) | (hi > limits[1])
            host.require(~out.any(), lambda: self._outside(node, lo, hi, out, limits))
        return lo, hi

    def _outside(self, node, lo, hi, out, limits):
        k = int(out.flatten().nonzero()[0])
        return ValueError(f"{self.name} at node {node.name!r}: the output interval [{float(lo.flatten()[k]):.6g}, "
                          f"{float(hi.flatten()[k]):.6g}] (element {k}) leaves [{limits[0]:.6g}, {limits[1]:.6g}], "
                          f"the integers the target type holds exactly (outside, the cast is undefined, "
                          f"wraps or rounds); use a smaller input box")


def _init(name):
    default = CONVEX[name].default

    @torch.no_grad()
    def init(l, u):
        return default(l, u).expand(torch.broadcast_shapes(l.shape, u.shape)).clone()
    return init


def relu_split_point(l, u):
    """ReLU splits at 0 on crossing intervals (both children are then exact), nowhere else."""
    return torch.where((l < 0) & (u > 0), torch.zeros_like(l), torch.nan)


def relu_split_gain(l, u, p, gl, gu):
    """The first-order gain (``certify.ops.core.first_order_gain``) with each term scaled to
    the exact change of the upper line's intercept c = -ul / (u - l), which the split at 0
    removes outright: c(l, u) - c(l, 0) = (-dc/du) u (u - l) / |l| and
    c(l, u) - c(0, u) = (dc/dl) |l| (u - l) / u. The unscaled estimate ranks ReLU splits too
    low: on mnist-vit1 image 18 at eps 0.01, 60 s, -0.124 against -0.072 with it
    (docs/certify/bab.notes.md)."""
    left, right = (-gu).clamp(min=0) * (u - p), gl.clamp(min=0) * (p - l)
    return left * ((u - l) / (p - l)) + right * ((u - l) / (u - p))


register(Elementwise(name="relu", description="max(x, 0)", fn=torch.relu,
                     image=lambda l, u: (torch.relu(l), torch.relu(u)), planes=relu_planes,
                     monotone=True, convex=True, value_range=(0.0, None),
                     slope_init=lambda l, u: (u > -l).to(l.dtype),
                     split=SplitRule(relu_split_point, relu_split_gain)))
register(Elementwise(name="exp", description="exp(x)", fn=torch.exp,
                     image=exp_image, planes=exp_planes, slope_init=_init("exp"),
                     monotone=True, convex=True, value_range=(0.0, None)))
register(Reciprocal(name="reciprocal", description="1/x on boxes of one sign (convex on x > 0)",
                    fn=lambda t: 1.0 / t, image=reciprocal_image, planes=reciprocal_planes,
                    slope_init=_init("reciprocal"), monotone=True, convex=True, domain=(0.0, None)))
register(Elementwise(name="square", description="x²", fn=lambda t: t * t,
                     image=square_image, planes=square_planes, slope_init=_init("square"),
                     convex=True, value_range=(0.0, None)))
register(Elementwise(name="rsqrt", description="x^(-1/2) on x > 0", fn=torch.rsqrt,
                     image=rsqrt_image, planes=rsqrt_planes, slope_init=_init("rsqrt"),
                     monotone=True, convex=True, domain=(0.0, None), value_range=(0.0, None)))
register(Elementwise(name="neg_log", description="-log x on x > 0 (convex, decreasing)", fn=lambda t: -torch.log(t),
                     image=neg_log_image, planes=neg_log_planes, slope_init=_init("neg_log"),
                     monotone=True, convex=True, domain=(0.0, None)))
register(Limited(name="trunc", description="x rounded toward 0 (a cast to an integer type)", fn=torch.trunc,
                 image=trunc_image, planes=constant_planes(trunc_image), monotone=True))
register(Elementwise(name="nonzero", description="1 where x != 0, else 0 (a cast to bool)",
                     fn=lambda t: (t != 0).to(t.dtype), image=nonzero_image, planes=constant_planes(nonzero_image),
                     value_range=(0.0, 1.0)))
