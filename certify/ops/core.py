"""The operator registry: one verifier operator is one registered, frozen object.

An operator carries everything the propagation in ``certify.crown`` needs, so that the
algorithm there has no per-operator cases (jax_verify keeps an activation's traits with its
relaxation in the same way):
- ``forward(node, xs, const)``: the map on concrete batched inputs;
- ``interval(node, ins, const)``: a sound image interval of the input intervals ``ins``;
- ``backward(node, A, ins, shapes, const, alpha)``: one step of linear bound propagation,
  coefficients A (B, S, *out) on the output -> ([A per input], bias (B, S)) such that
  A·out >= Σ A_k·in_k + bias on the input box (exact for affine maps: the adjoint);
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

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import torch

KINDS = ("input", "affine", "elementwise", "bilinear")


def sum_rest(t, keep=2):
    """Sum over every dim after the first ``keep`` ones."""
    return t.flatten(keep).sum(-1) if t.dim() > keep else t


@dataclass(frozen=True, kw_only=True)
class Operator:
    """Common traits. ``value_range`` = (lo, hi), None meaning unbounded on that side."""

    name: str
    description: str = ""
    monotone: bool = False
    value_range: tuple = (None, None)
    anchor: Callable | None = None
    kind: ClassVar[str] = "input"
    arity: ClassVar[int] = 0

    def forward(self, node, xs, const=None):
        raise ValueError(f"operator: {self.name!r} has no forward map (kind {self.kind})")

    def interval(self, node, ins, const=None):
        raise ValueError(f"operator: {self.name!r} has no interval bound (kind {self.kind})")

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        raise ValueError(f"operator: {self.name!r} has no backward step (kind {self.kind})")


@dataclass(frozen=True, kw_only=True)
class Input(Operator):
    """The perturbed input: its box is given, the backward pass concretises over it."""


@dataclass(frozen=True, kw_only=True)
class Affine(Operator):
    """y = M(x_1, ..., x_k) + b, linear M.

    ``apply(p, xs, const)``: the map; ``adjoint(p, A, const)``: ([A M_k], A·b), the exact
    transpose; ``radius(p, r)``: |M| r for the centre-radius interval (default: ``apply``,
    right for maps whose coefficients are >= 0 and that add no constant); ``exact``:
    an interval rule of its own (p, ins, const) -> (l, u), used instead of centre-radius."""

    apply: Callable
    adjoint: Callable
    radius: Callable | None = None
    exact: Callable | None = None
    inputs: int = 1
    kind: ClassVar[str] = "affine"

    @property
    def arity(self):
        return self.inputs

    def forward(self, node, xs, const=None):
        return self.apply(node.params, xs, const)

    def interval(self, node, ins, const=None):
        if self.exact is not None:
            return self.exact(node.params, ins, const)
        (l, u), = ins
        mid = self.apply(node.params, [(l + u) / 2], const)
        r = (u - l) / 2
        rad = self.apply(node.params, [r], None) if self.radius is None else self.radius(node.params, r)
        return mid - rad, mid + rad

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        return self.adjoint(node.params, A, const)


@dataclass(frozen=True, kw_only=True)
class Elementwise(Operator):
    """y = f(x) elementwise, with its relaxation as data.

    ``fn``: f on tensors; ``image(l, u)``: the exact image interval; ``planes(l, u, alpha)``:
    (lw, lb, uw, ub) with lw·x + lb <= f(x) <= uw·x + ub on [l, u]; ``domain`` (lo, hi):
    f is defined for lo < x (planes raise ValueError, intervals are unbounded, outside it); ``convex``: f is
    convex on ``domain``; ``slope_init(l, u)``: when not None, ``alpha`` in [0, 1]
    parametrises a family of sound lower planes (alpha-CROWN optimises it) and this is
    its starting value."""

    fn: Callable
    image: Callable
    planes: Callable
    domain: tuple = (None, None)
    convex: bool = False
    slope_init: Callable | None = None
    kind: ClassVar[str] = "elementwise"
    arity: ClassVar[int] = 1

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
        return self.step(A, self.planes(l.unsqueeze(1), u.unsqueeze(1), alpha))

    @staticmethod
    def step(A, planes):
        """The backward step through given planes (lw, lb, uw, ub): the lower plane where the
        coefficient is >= 0, the upper one where it is < 0."""
        lw, lb, uw, ub = planes
        ap, an = A.clamp(min=0), A.clamp(max=0)
        return [ap * lw + an * uw], sum_rest(ap * lb + an * ub)


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
