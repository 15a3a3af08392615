"""certify.ops.core.down / up: one float64 step outward, exactly nextafter's value, with the
identity as derivative, so that alpha-CROWN differentiates through sound bounds on torch
releases whose nextafter has no derivative (torch 2.11: shared/notes/gpu_h200.md)."""
import math
from fractions import Fraction

import torch

from softcert.certify.ops import bilinear, elementwise, host
from softcert.certify.ops.core import all_finite, down, up

EDGES = [0.0, -0.0, 1.0, -1.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
         -1.7976931348623157e308, math.inf, -math.inf, 0.1, 3.0e-300]


def _graph_ops(t):
    seen, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return {type(f).__name__ for f in seen}


def test_down_and_up_are_one_float_outward():
    t = torch.tensor(EDGES, dtype=torch.float64)
    lo, hi = down(t), up(t)
    for x, a, b in zip(EDGES, lo.tolist(), hi.tolist(), strict=True):
        # the exact float neighbours (math.nextafter is the oracle; both are exact operations)
        assert a == math.nextafter(x, -math.inf) or (x == -math.inf and a == x), (x, a)
        assert b == math.nextafter(x, math.inf) or (x == math.inf and b == x), (x, b)
        if all(map(math.isfinite, (a, x, b))):
            assert Fraction(a) < Fraction(x) < Fraction(b)
    assert down(torch.tensor([math.nan], dtype=torch.float64)).isnan().all()


def test_finite_tensors_step_outward_as_mixed_ones_do():
    """down/up skip the infinity mask when every entry is finite (one sum decides): the finite
    entries of EDGES alone step to the same neighbours as inside the mixed tensor."""
    finite = [x for x in EDGES if math.isfinite(x)]
    t = torch.tensor(finite, dtype=torch.float64)
    assert all_finite(t)
    mixed = torch.tensor(EDGES, dtype=torch.float64)
    keep = torch.isfinite(mixed)
    assert torch.equal(down(t), down(mixed)[keep]) and torch.equal(up(t), up(mixed)[keep])


def test_all_finite_is_never_wrongly_true():
    big = torch.full((4,), torch.finfo(torch.float32).max)  # finite entries whose sum overflows
    assert all_finite(torch.tensor([1.0, -2.0])) and all_finite(torch.zeros(0))
    for t in (torch.tensor([1.0, math.inf]), torch.tensor([-math.inf, math.inf]),
              torch.tensor([0.0, math.nan]), big):
        assert not all_finite(t), t
    with host.reads("defer"):  # where a read would stall a GPU it is not made
        assert not all_finite(torch.tensor([1.0]))


def test_outward_rounding_has_the_identity_derivative_without_nextafter_backward():
    x = torch.tensor([0.3, -2.0, 7.5], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.5, 0.25, -3.0], dtype=torch.float64, requires_grad=True)
    outs = [down(x), up(x), *bilinear.interval_mul((x, x + 1), (y, y + 1)),
            *elementwise.exp_image(x, x + 1)]
    for out in outs:
        assert not any("Nextafter" in name for name in _graph_ops(out)), _graph_ops(out)
    (g,) = torch.autograd.grad(down(x).sum() + up(x).sum(), x)
    assert torch.equal(g, torch.full_like(x, 2.0))
