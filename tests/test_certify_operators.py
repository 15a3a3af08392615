"""Adjoints are exact transposes; relaxations enclose their functions."""
import pytest
import torch

from softcert.certify import ops, trace
from softcert.certify.models import ViT


def test_adjoints_are_transposes():
    torch.manual_seed(1)
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=1,
            layer_norm=True, pool="cls").double()
    g = trace(m, torch.rand(1, 1, 4, 4, dtype=torch.float64))
    B, S = 2, 3
    for node in g.nodes:
        if node.operator.kind != "affine" or node.operator.arity != 1:  # input, add, nonlinear
            continue
        x = torch.randn(B, *g.nodes[node.inputs[0]].shape, dtype=torch.float64)
        const = None
        if node.op == "softmax_shift":
            const = torch.randint(0, x.shape[-1], (*x.shape[:-1], 1))
        zero = torch.zeros_like(x)
        A = torch.randn(B, S, *node.shape, dtype=torch.float64)
        f0 = ops.forward(node, [zero], const)
        lin = ops.forward(node, [x], const) - f0
        (Ax,), bias = ops.adjoint(node, A, const)
        lhs = ops.sum_rest(A * lin.unsqueeze(1))
        rhs = ops.sum_rest(Ax * x.unsqueeze(1))
        torch.testing.assert_close(lhs, rhs, msg=node.name)
        torch.testing.assert_close(bias, ops.sum_rest(A * f0.unsqueeze(1)), msg=node.name)


DOMAINS = {"relu": (-3, 3), "exp": (-6, 2), "reciprocal": (0.05, 5), "square": (-3, 3), "rsqrt": (0.01, 4),
           "gelu": (-6, 6), "gelu_tanh": (-6, 6), "tanh": (-5, 5), "sigmoid": (-10, 10), "sqrt": (0.0, 9),
           "neg_log": (1e-3, 40), "trunc": (-3, 3), "nonzero": (-1, 1)}


@pytest.mark.parametrize("op", sorted(ops.names("elementwise")))
def test_unary_planes_enclose(op):
    g = torch.Generator().manual_seed(3)
    lo, hi = DOMAINS[op]
    a = lo + (hi - lo) * torch.rand(400, generator=g, dtype=torch.float64)
    b = lo + (hi - lo) * torch.rand(400, generator=g, dtype=torch.float64)
    l, u = torch.minimum(a, b), torch.maximum(a, b)
    u[:50] = l[:50] + 1e-9  # near-degenerate intervals
    f = {"relu": torch.relu, "exp": torch.exp, "reciprocal": lambda t: 1 / t,
         "square": lambda t: t * t, "rsqrt": torch.rsqrt, "gelu": torch.nn.functional.gelu,
         "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"), "tanh": torch.tanh,
         "sigmoid": torch.sigmoid, "sqrt": torch.sqrt, "neg_log": lambda t: -torch.log(t), "trunc": torch.trunc,
         "nonzero": lambda t: (t != 0).to(t.dtype)}[op]
    lw, lb, uw, ub = ops.get(op).planes(l, u)
    il, iu = ops.get(op).image(l, u)
    t = torch.rand(200, 1, generator=g, dtype=torch.float64)
    x = torch.cat([l[None], u[None], l + (u - l) * t])
    fx = f(x)
    tol = 1e-12 * (1 + fx.abs())
    assert (lw * x + lb <= fx + tol).all() and (fx <= uw * x + ub + tol).all()
    assert (il <= fx + tol).all() and (fx <= iu + tol).all()


@pytest.mark.parametrize("op", ["mul", "matmul"])
def test_mccormick_planes_lower_bound(op):
    g = torch.Generator().manual_seed(4)
    shp_x, shp_y = ((2, 3, 4), (2, 3, 1)) if op == "mul" else ((2, 3, 4), (2, 4, 5))
    B, S = 2, 6
    c = lambda s: torch.randn(B, *s, generator=g, dtype=torch.float64)  # noqa: E731
    xl, yl = c(shp_x), c(shp_y)
    xu, yu = xl + c(shp_x).abs(), yl + c(shp_y).abs()
    zshape = (xl * yl).shape[1:] if op == "mul" else (xl @ yl).shape[1:]
    A = torch.randn(B, S, *zshape, generator=g, dtype=torch.float64)
    (ax, ay), bias = ops.get(op).relax(A, (xl, xu), (yl, yu), shp_x, shp_y)
    for _ in range(200):
        x = xl + (xu - xl) * torch.rand(xl.shape, generator=g, dtype=torch.float64)
        y = yl + (yu - yl) * torch.rand(yl.shape, generator=g, dtype=torch.float64)
        z = x * y if op == "mul" else x @ y
        true = ops.sum_rest(A * z.unsqueeze(1))
        plane = bias + ops.sum_rest(ax * x.unsqueeze(1)) + ops.sum_rest(ay * y.unsqueeze(1))
        assert (plane <= true + 1e-10).all()
        zl, zu = ops.get(op).image((xl, xu), (yl, yu))
        assert (zl <= z + 1e-12).all() and (z <= zu + 1e-12).all()
