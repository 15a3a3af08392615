"""The operator registry: one verifier operator is one registered, frozen object.

An operator carries everything the propagation in ``certify.crown`` needs, so that the
algorithm there has no per-operator cases (jax_verify keeps an activation's traits with its
relaxation in the same way):
- ``forward(node, xs, const)``: the map on concrete batched inputs;
- ``interval(node, ins, const)``: a sound image interval of the input intervals ``ins``;
- ``backward(node, A, ins, shapes, const, alpha)``: one step of linear bound propagation,
  coefficients A (B, S, *out) on the output -> ([A per input], bias (B, S)) such that, for
  every real input in the boxes ``ins``, A·out >= Σ A_k·in_k + bias in exact real arithmetic
  with the float64 values returned: the step charges its own rounding error into ``bias``
  (the soundness contract; ``arithmetic("plain")`` turns the charges off, for comparison);
- traits as data: ``kind`` (input / affine / elementwise / bilinear), ``arity`` (-1: any >= 1),
  ``monotone`` (the image of an interval is the interval of its end points, so IBP is exact
  and CROWN bounds of the output cannot be tighter), ``value_range`` (the output always
  lies in it; bounds are clipped to it), ``anchor`` (when not None, the map takes a
  constant ``const`` chosen once per box from the inputs' values at the anchor point:
  const = anchor(*inputs at the anchor)).
A new operator is one ``register(...)`` call in the module of its family (``affine``,
``elementwise``, ``bilinear``). Node-specific facts (e.g. "this product is a softmax
probability, so it lies in [0, 1]") are recorded on the graph node, not tested by name.
"""
from __future__ import annotations

import contextvars
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import torch

from softcert.certify.ops import host
from softcert.certify.ops.context import context_setting
from softcert.kernels.floating import SUBNORMAL_ULP, gamma

KINDS = ("input", "affine", "elementwise", "bilinear")

# ---------------------------------------------------------------- the rounding-error model
#: "sound": every step charges its float64 rounding error (see ``charge``); "plain": the old
#: unsound arithmetic, kept only to measure what soundness costs
MODES = ("sound", "plain")
_MODE = contextvars.ContextVar("certify_arithmetic", default="sound")
#: an error term is a sum of products of nonnegative floats, computed by at most 2^32
#: roundings along any path (no tensor here has 2^32 elements): its real value is at most
#: (1 - u)^-(2^32) <= 1 + γ_(2^32) < GROW times the computed one (Higham §3.1), where the
#: result is normal; subnormal results are covered by one spacing per term (``charge``)
GROW = 1.0 + 2.0 ** -20
_LIMITS: dict = {}  # (sign, dtype, device) -> the 0-d tensor ±inf that nextafter steps towards


def tensor_of(value, dtype=None, device=None):
    """``value`` as a tensor. A tensor keeps its device (``torch.as_tensor`` would move it to
    the default device of ``torch.set_default_device`` or a ``with torch.device(...)``
    block) and is converted to ``dtype`` when given; anything else (a number, a list, an
    array) is created on ``device`` (None: torch's default)."""
    if isinstance(value, torch.Tensor):
        return value if dtype is None else value.to(dtype)
    return torch.as_tensor(value, dtype=dtype, device=device)


def _limit(sign, t):
    """±inf as a 0-d tensor of t's dtype on t's device (made once per dtype and device)."""
    key = (sign, t.dtype, t.device)
    if key not in _LIMITS:
        _LIMITS[key] = torch.full((), sign * math.inf, dtype=t.dtype, device=t.device)
    return _LIMITS[key]


def arithmetic(mode):
    """Within the block, operators and ``certify.crown`` use ``mode`` ("sound" or "plain")."""
    if mode not in MODES:
        raise ValueError(f"arithmetic: expected one of {MODES}, got {mode!r}")
    return context_setting(_MODE, mode)


def is_sound():
    """True unless inside ``arithmetic("plain")``."""
    return _MODE.get() == "sound"


def _step(t, sign):
    # nextafter(t) written as t + (exact spacing) so that autograd sees the identity
    # (alpha-CROWN differentiates through bounds, and torch before 2.13 has no derivative of
    # nextafter); an infinite t takes nextafter's own value (down(+inf) is the largest float,
    # -inf stays -inf), NaN stays NaN
    n = torch.nextafter(t.detach(), _limit(sign, t))
    if all_finite(t):
        return t + (n - t.detach())
    return torch.where(torch.isfinite(t), t + (n - t.detach()), n)


def all_finite(t):
    """True only if every entry of ``t`` is finite; tested where host reads cost nothing (the
    CPU, ``host.deferring``), False elsewhere. One sum instead of isfinite(t).all(), ~10x
    cheaper on the CPU (2026-12-08): an inf or NaN entry makes the sum inf or NaN, and a sum
    that overflows answers False, never wrongly True."""
    return not host.deferring(t) and bool(torch.isfinite(t.detach().sum()))


def down(t):
    """The float64 below t: for t = fl(x op y) (round to nearest), down(t) <= x op y exactly."""
    return _step(t, -1)


def up(t):
    """The float64 above t: for t = fl(x op y), up(t) >= x op y exactly."""
    return _step(t, 1)


def add_down(a, b):
    """A float64 <= a + b (real sum of the floats)."""
    return down(a + b)


def sub_down(a, b):
    """A float64 <= a - b."""
    return down(a - b)


def magnitude(l, u):
    """max(|l|, |u|): the largest |x| over the box [l, u] (exact)."""
    return torch.maximum(l.abs(), u.abs())


def weighted_sum(W, v):
    """Σ_rest W·v (B, S) for W (B, S, *shape) and v (B, 1, *shape) (or broadcastable, or a
    number): one batched matrix product when v is shared by the S rows. Where v is ±inf and W
    is 0 the term is 0 (a zero coefficient contributes exactly nothing, whatever the bound):
    then a masked sum. The test for ±inf is ``host.infinite`` (inside ``host.read_once`` it
    is read once at the block's end, not here)."""
    if isinstance(v, (int, float)):
        # a number: the test on the host, and no copy of it to the device
        return sum_rest(torch.where(W == 0, 0.0, W * v) if math.isinf(v) else W * v)
    v = tensor_of(v, W.dtype, W.device)
    if host.infinite(v):
        return sum_rest(torch.where(W == 0, 0.0, W * v))
    b, s = W.shape[:2]
    if W.dim() > 2 and v.dim() == W.dim() and v.shape[0] == b and v.shape[1] == 1 and v.shape[2:] == W.shape[2:]:
        return torch.bmm(W.reshape(b, s, -1), v.reshape(b, -1, 1)).squeeze(-1)
    return sum_rest(W * v)


def scale_charge(total, n, terms):
    """A float64 >= γ_n T for the real T of a computed ``total`` = Σ of ``terms`` rounded
    nonnegative products (any order; BLAS may fuse): T <= total·GROW + terms·2^-1074 (the
    second term only matters when total is subnormal), then one ulp up after the product
    with γ_n·GROW (``gamma`` rounded, GROW covers it)."""
    return up((total * GROW + terms * SUBNORMAL_ULP) * (gamma(n) * GROW))


def charge(W, mag, n):
    """A float64 >= γ_n Σ_rest |W|·mag in real arithmetic (sum over every dim after the
    first two; ``mag`` >= 0 is an upper bound, broadcasting against W (B, S, ...))."""
    return scale_charge(weighted_sum(W.abs(), mag), n, math.prod(W.shape[2:]))


def gamma_charge(q, n):
    """Elementwise float64 >= γ_n·Q + 3n·2^-1074 for a computed q (n roundings) of a
    nonnegative Q: Q <= q·GROW + n·2^-1074, so γ_n Q <= q·γ_n·GROW² + n·2^-1074 (γ_n < 1);
    the last product and sum are covered by the spare GROW and one ulp up."""
    return up(q * (gamma(n) * GROW * GROW) + 3 * n * SUBNORMAL_ULP)


def floor_charge(n, mass, device=None):
    """A float64 >= n·2^-1074·mass: the absolute error of n rounded products that land in the
    subnormal range, each multiplied by at most ``mass`` (e.g. 1 + Σ max|x|; a number is made
    a 0-d tensor on ``device`` by a fill, not a copy from the host)."""
    if isinstance(mass, (int, float)):
        mass = torch.full((), mass, dtype=torch.float64, device=device)
    return up(tensor_of(mass, torch.float64, device) * (n * SUBNORMAL_ULP * GROW))


def sum_rest(t, keep=2):
    """Sum over every dim after the first ``keep`` ones."""
    return t.flatten(keep).sum(-1) if t.dim() > keep else t


@dataclass(frozen=True)
class Params:
    """A node's free relaxation parameters for S specifications: ``start`` (B, S, ...) and the
    range [low, high] in which every value gives a sound relaxation (so optimising them only
    changes tightness; jax_verify's ParameterizedNodeRelaxation: initial_params, project_params)."""

    start: torch.Tensor
    low: float
    high: float

    def project(self, a):
        """``a`` moved into the sound range (elementwise clamp)."""
        return a.clamp(self.low, self.high)


def per_spec(init, specs, low, high):
    """``Params`` with ``init`` (B, ...) copied for each of ``specs`` specifications."""
    init = init.to(torch.float64).unsqueeze(1)
    return Params(init.expand(-1, specs, *init.shape[2:]).clone(), low, high)


def midpoint_split(l, u):
    """Split point per neuron of [l, u]: the midpoint, NaN where it is not strictly inside
    a finite interval of some width (no split helps there)."""
    finite = torch.isfinite(l) & torch.isfinite(u)
    mid = l + (u - l) / 2
    ok = finite & (u - l > 1e-9 * (1 + l.abs() + u.abs())) & (mid > l) & (mid < u)
    return torch.where(ok, mid, torch.nan)


def first_order_gain(l, u, p, gl, gu):
    """Estimated gain of the bound from splitting [l, u] at p, summed over the two children,
    given gl, gu = d bound / d l, d bound / d u: the first-order change from moving u to p in
    [l, p] and l to p in [p, u], (-gu)⁺ (u - p) + gl⁺ (p - l) (a BBPS-like shortcut, Shi et al.
    TACAS 2025)."""
    return (-gu).clamp(min=0) * (u - p) + gl.clamp(min=0) * (p - l)


@dataclass(frozen=True)
class SplitRule:
    """Where branch and bound splits the input interval [l, u] of a neuron that feeds this
    operator (``point(l, u)``: p per neuron, NaN where no split helps) and how it estimates
    the gain of that split (``gain(l, u, p, gl, gu)``, gl, gu the bound's gradients with
    respect to l and u)."""

    point: Callable = midpoint_split
    gain: Callable = first_order_gain


MIDPOINT = SplitRule()


@dataclass(frozen=True, kw_only=True)
class Operator:
    """Common traits. ``value_range`` = (lo, hi), None meaning unbounded on that side.
    ``split``: how branch and bound splits this operator's input (None: it does not)."""

    name: str
    description: str = ""
    monotone: bool = False
    value_range: tuple = (None, None)
    anchor: Callable | None = None
    split: SplitRule | None = None
    kind: ClassVar[str] = "input"
    arity: ClassVar[int] = 0

    def forward(self, node, xs, const=None):
        raise ValueError(f"operator: {self.name!r} has no forward map (kind {self.kind})")

    def interval(self, node, ins, const=None):
        raise ValueError(f"operator: {self.name!r} has no interval bound (kind {self.kind})")

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        raise ValueError(f"operator: {self.name!r} has no backward step (kind {self.kind})")

    @property
    def optimisable(self):
        """Whether ``initial_params`` gives parameters (alpha-CROWN optimises them)."""
        return False

    def initial_params(self, node, ins, shapes, specs, per_product=True) -> Params | None:
        """The relaxation's free parameters at node ``node`` for ``specs`` specifications,
        started at the CROWN choice, given the inputs' bounds ``ins`` [(l, u)] (B, *shape) and
        shapes; None when the relaxation has none."""
        return None


@dataclass(frozen=True, kw_only=True)
class Input(Operator):
    """The perturbed input: its box is given, the backward pass concretises over it."""


@dataclass(frozen=True, kw_only=True)
class Affine(Operator):
    """y = M(x_1, ..., x_k) + c, linear M.

    ``apply(p, xs, const)``: the map; ``adjoint(p, A, const)``: ([A M_k], A·c), the exact
    transpose; ``radius(p, r)``: |M| r for r >= 0 (default: ``apply``, right for maps whose
    coefficients are >= 0 and that add no constant); ``exact``: an interval rule of its own
    (p, ins, const) -> (l, u), used instead of centre-radius, which rounds outward itself
    when ``is_sound()``; ``exact_adjoint``: the adjoint only moves, copies or negates
    entries (no rounding), so the backward step charges nothing.

    Sound arithmetic (Higham, Accuracy and Stability, Thm 3.5 and §3.1): with n the number of
    output entries per specification (+2), |fl(A M) - A M| <= γ_n |A||M| + n·2^-1074 and
    |fl(A·c) - A·c| <= γ_n |A||c| + n·2^-1074 elementwise. For |x_k| <= m_k on the box,
    the step's real error is at most γ_n Σ |A|·(Σ_k |M_k| m_k + |c|) + n·2^-1074 (1 + Σ m),
    and Σ_k |M_k| m_k + |c| = max |y| over the symmetric box [-m, m], bounded by this
    operator's own outward interval: so every affine operator is covered by one rule."""

    apply: Callable
    adjoint: Callable
    radius: Callable | None = None
    exact: Callable | None = None
    exact_adjoint: bool = False
    inputs: int = 1
    kind: ClassVar[str] = "affine"

    @property
    def arity(self):
        return self.inputs

    def forward(self, node, xs, const=None):
        return self.apply(node.params, xs, const)

    def _radius(self, p, r):
        return self.apply(p, [r], None) if self.radius is None else self.radius(p, r)

    def interval(self, node, ins, const=None):
        """Centre-radius: for x in [l, u], |x - c| <= r with c = fl((l+u)/2) and r rounded up,
        so y lies in M c + c0 ± |M| r; evaluated in float64, each end carries the error
        γ_n (|M|(|c| + r) + |c0|) + 3n·2^-1074 (n: input entries + 2) and one more ulp."""
        if self.exact is not None:
            return self.exact(node.params, ins, const)
        (l, u), = ins
        p = node.params
        c = (l + u) / 2
        if not is_sound():
            mid, rad = self.apply(p, [c], const), self._radius(p, (u - l) / 2)
            return mid - rad, mid + rad
        r = torch.maximum(up(c - l), up(u - c))
        mid, rad = self.apply(p, [c], const), self._radius(p, r)
        q = self._radius(p, c.abs() + r) + self.apply(p, [torch.zeros_like(c)], const).abs()
        err = gamma_charge(q, math.prod(l.shape[1:]) + 2)
        return down(down(mid - rad) - err), up(up(mid + rad) + err)

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        new, bias = self.adjoint(node.params, A, const)
        if self.exact_adjoint or not is_sound():
            return new, bias
        ms = [magnitude(l, u) for l, u in ins]
        lo, hi = self.interval(node, [(-m, m) for m in ms], const)
        # NaN: an unbounded input; every nonzero coefficient then charges inf
        mag = magnitude(lo, hi).nan_to_num(nan=math.inf)
        n = math.prod(A.shape[2:]) + 2
        mass = 1 + sum(sum_rest(m, 1) for m in ms)
        err = charge(A, mag.unsqueeze(1), n) + floor_charge(n, mass).unsqueeze(1)
        return new, sub_down(bias, err)


@dataclass(frozen=True, kw_only=True)
class Elementwise(Operator):
    """y = f(x) elementwise, with its relaxation as data.

    ``fn``: f on tensors; ``image(l, u)``: the exact image interval; ``planes(l, u, alpha)``:
    (lw, lb, uw, ub) with lw·x + lb <= f(x) <= uw·x + ub on [l, u]; ``domain`` (lo, hi):
    f is defined for lo < x (planes raise ValueError, intervals are unbounded, outside it); ``convex``: f is
    convex on ``domain``; ``slope_init(l, u)``: when not None, ``alpha`` in ``alpha_range``
    ([0, 1]) parametrises a family of sound lower planes (alpha-CROWN optimises it) and this
    is its starting value. ``alpha_planes(l, u, alpha, default)``: when not None, the planes
    for ``alpha`` given the default planes ``default`` = planes(l, u, None) on the same boxes
    (the family reuses part of them; ``certify.crown`` passes the ones it keeps). ``split``:
    branch and bound splits the input at the midpoint (``MIDPOINT``) unless the operator
    declares its own rule."""

    fn: Callable
    image: Callable
    planes: Callable
    domain: tuple = (None, None)
    convex: bool = False
    slope_init: Callable | None = None
    alpha_planes: Callable | None = None
    alpha_range: tuple = (0.0, 1.0)
    split: SplitRule | None = MIDPOINT
    kind: ClassVar[str] = "elementwise"
    arity: ClassVar[int] = 1

    @property
    def optimisable(self):
        return self.slope_init is not None

    def initial_params(self, node, ins, shapes, specs, per_product=True):
        if self.slope_init is None:
            return None
        with torch.no_grad():
            return per_spec(self.slope_init(*ins[0]), specs, *self.alpha_range)

    def forward(self, node, xs, const=None):
        return self.fn(xs[0])

    def interval(self, node, ins, const=None):
        l, u = ins[0]
        lo, hi = self.image(l, u)
        if self.domain[0] is not None:
            # an interval reaching outside the domain (e.g. 1/x over [-1, 2]): no information
            out = l <= self.domain[0]
            lo, hi = torch.where(out, -torch.inf, lo), torch.where(out, torch.inf, hi)
        return lo, hi

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        l, u = ins[0]
        return self.step(A, self.planes(l.unsqueeze(1), u.unsqueeze(1), alpha), (l, u))

    @staticmethod
    def step(A, planes, box):
        """The backward step through given planes (lw, lb, uw, ub): the lower plane where the
        coefficient is >= 0, the upper one where it is < 0. ``box`` (l, u): the input's bounds.

        Sound arithmetic: each coefficient is one rounded product (the other term is an exact
        0), off by <= u|A w| + 2^-1074, so against |x| <= m it costs u Σ |A||w| m; the bias, a
        sum of N products, is off by <= γ_(N+1) Σ |A||b| (Higham Thm 3.5) + N·2^-1074; both
        charged together as γ_(N+1) Σ |A| (|w| m + |b|) (w, b the plane chosen by the sign)."""
        lw, lb, uw, ub = planes
        ap, an = A.clamp(min=0), A.clamp(max=0)
        new, bias = ap * lw + an * uw, sum_rest(ap * lb + an * ub)
        if not is_sound():
            return [new], bias
        # Σ|new|·m + Σ|A b| = Σ ap (|lw| m + |lb|) + Σ |an| (|uw| m + |ub|): two products with
        # per-entry weights instead of two more passes over A-sized tensors
        m = magnitude(*box).unsqueeze(1)
        n = math.prod(A.shape[2:])
        total = weighted_sum(ap, lw.abs() * m + lb.abs()) - weighted_sum(an, uw.abs() * m + ub.abs())
        err = scale_charge(total, n + 1, 2 * n) + floor_charge(n, 1 + sum_rest(m.squeeze(1), 1)).unsqueeze(1)
        return [new], sub_down(bias, err)


@dataclass(frozen=True, kw_only=True)
class Bilinear(Operator):
    """z = x ∘ y, bilinear in two perturbed inputs.

    ``fn(x, y)``; ``image(xb, yb)``: a sound interval; ``relax(A, xb, yb, x_shape,
    y_shape)``: the lower backward step through linear planes (McCormick)."""

    fn: Callable
    image: Callable
    relax: Callable
    kind: ClassVar[str] = "bilinear"
    arity: ClassVar[int] = 2

    def forward(self, node, xs, const=None):
        return self.fn(xs[0], xs[1])

    def interval(self, node, ins, const=None):
        return self.image(ins[0], ins[1])

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        return self.relax(A, ins[0], ins[1], shapes[0], shapes[1])


_TABLE: dict[str, Operator] = {}
OPERATORS = MappingProxyType(_TABLE)  # name -> Operator, read-only view of the registry


def register(op: Operator) -> Operator:
    """Add ``op`` to the registry; a name is registered once."""
    if not isinstance(op, Operator):
        raise ValueError(f"op: expected an Operator, got {type(op).__name__}")
    if op.name in _TABLE:
        raise ValueError(f"op: operator {op.name!r} is already registered")
    _TABLE[op.name] = op
    return op


def get(name: str) -> Operator:
    """The registered operator ``name``; ValueError naming it otherwise."""
    try:
        return _TABLE[name]
    except KeyError:
        raise ValueError(f"operator: {name!r} is not registered (registered: {', '.join(_TABLE)})") from None


def names(kind: str | None = None) -> tuple:
    """Registered operator names, optionally of one ``kind``."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    return tuple(n for n, op in _TABLE.items() if kind is None or op.kind == kind)


def forward(node, xs, const=None):
    """Evaluate ``node`` on concrete inputs ``xs`` (batch first). ``const``: softmax shift."""
    return get(node.op).forward(node, xs, const)


def adjoint(node, A, const=None):
    """Backward step through an affine node: returns ([A per input], bias (B, S))."""
    op = get(node.op)
    if op.kind != "affine":
        raise ValueError(f"op: {node.op!r} is not affine")
    return op.adjoint(node.params, A, const)
