"""Every optimisable relaxation family is sound for every parameter in its range.

Oracles: sampling (10k points per family, box ends included), mpmath at 50 digits at the
tangent points and box ends (the plane's float coefficients taken as exact reals), exact
Fraction arithmetic at every vertex of tiny product boxes (the residual of a McCormick
step is multilinear, so its minimum over the box is at a vertex), hypothesis over boxes of
tiny and huge widths on both sides of 0, and on zoo models PGD and sampled margins against
the alpha-CROWN bound.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert.certify import crown, ops, zoo
from softcert.certify.attack import pgd
from softcert.certify.graph_cache import graph_of
from softcert.certify.ops.bilinear import mul_planes
from softcert.certify.options import AttackOptions
from softcert.certify.spec import input_box, margin_spec

mpmath.mp.dps = 50
F64 = torch.float64

MP = {"relu": lambda x: max(x, 0), "exp": mpmath.exp, "reciprocal": lambda x: 1 / x,
      "square": lambda x: x * x, "rsqrt": lambda x: 1 / mpmath.sqrt(x),
      "gelu": lambda x: x * mpmath.ncdf(x),
      "gelu_tanh": lambda x: x / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf("0.044715") * x**3))),
      "tanh": mpmath.tanh, "sigmoid": lambda x: 1 / (1 + mpmath.exp(-x)), "neg_log": lambda x: -mpmath.log(x)}
TORCH = {"relu": torch.relu, "exp": torch.exp, "reciprocal": lambda t: 1 / t, "square": lambda t: t * t,
         "rsqrt": torch.rsqrt, "gelu": torch.nn.functional.gelu,
         "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"), "tanh": torch.tanh,
         "sigmoid": torch.sigmoid, "neg_log": lambda t: -torch.log(t)}
FAMILIES = sorted(MP)
CONVEX = ("exp", "reciprocal", "square", "rsqrt", "neg_log")
# the maps defined for x >= 0 only, as their operators declare (the registry is the one list)
POSITIVE = tuple(n for n in FAMILIES if getattr(ops.get(n), "domain", (None, None))[0] == 0.0)
DOMAINS = {"relu": (-3, 3), "exp": (-8, 4), "reciprocal": (0.02, 6), "square": (-4, 4), "rsqrt": (0.01, 5),
           "gelu": (-6, 6), "gelu_tanh": (-6, 6), "tanh": (-5, 5), "sigmoid": (-10, 10),
           "neg_log": (1e-4, 60)}


def test_every_family_declares_its_parameter():
    for name in FAMILIES:
        op = ops.get(name)
        assert op.slope_init is not None, name
        l, u = torch.tensor([-0.5, 0.1]), torch.tensor([0.5, 2.0])
        if name in POSITIVE:
            l = l.abs() + 0.1
        a = op.slope_init(l, u)
        assert a.shape == l.shape and ((a >= 0) & (a <= 1)).all(), name
        # the default alpha reproduces the default (CROWN) planes
        torch.testing.assert_close(op.planes(l, u, a)[0], op.planes(l, u)[0], rtol=1e-9, atol=1e-12)
    for name in ("mul", "matmul"):
        op = ops.get(name)
        assert op.alpha_range == (0.0, 1.0) and op.alpha_init(2, (3, 4)).eq(1).all()
        assert op.alpha_init(2, (3, 4), [(3, 5), (5, 4)]).eq(1).all()


def _boxes(name, n, gen):
    lo, hi = DOMAINS[name]
    a = lo + (hi - lo) * torch.rand(n, generator=gen, dtype=F64)
    b = lo + (hi - lo) * torch.rand(n, generator=gen, dtype=F64)
    l, u = torch.minimum(a, b), torch.maximum(a, b)
    u[: n // 8] = l[: n // 8] + 1e-9  # near-degenerate
    return l, u


@pytest.mark.parametrize("name", FAMILIES)
def test_family_sampling(name):
    """10k points per family (both ends of every box included), random alpha in [0, 1]."""
    gen = torch.Generator().manual_seed(11)
    l, u = _boxes(name, 100, gen)
    alpha = torch.rand(100, generator=gen, dtype=F64)
    alpha[:10], alpha[10:20] = 0.0, 1.0
    lw, lb, uw, ub = ops.get(name).planes(l, u, alpha)
    il, iu = ops.get(name).image(l, u)
    t = torch.rand(98, 1, generator=gen, dtype=F64)
    x = torch.cat([l[None], u[None], l + (u - l) * t])  # 100 x 100 points
    fx = TORCH[name](x)
    # the float f(x) is within a few ulp of the real one (torch's GELU, 0.5 x (1 + erf), to a
    # few ulp of |x|: it cancels for x << 0); the exact checks are the mpmath tests below
    tol = 8 * 2.0**-53 * (fx.abs() + x.abs()) + 1e-300
    assert (lw * x + lb <= fx + tol + 4 * 2.0**-53 * (lw * x).abs()).all()
    assert (fx <= uw * x + ub + tol + 4 * 2.0**-53 * (uw * x).abs()).all()
    assert (il <= fx + tol).all() and (fx <= iu + tol).all()


def _tangent_points(name, l, u, alpha):
    if name in CONVEX:
        return [min(max(l + alpha * (u - l), l), u)]
    return [l + (u - l) * k / 16 for k in range(1, 16)]


def _check_exact(name, l, u, alpha):
    """mpmath, 50 digits: lw·x + lb <= f(x) <= uw·x + ub at the ends and tangent points,
    with the float coefficients taken as exact, and the image encloses f at the ends."""
    lw, lb, uw, ub = (float(t) for t in ops.get(name).planes(torch.tensor([l], dtype=F64),
                                                             torch.tensor([u], dtype=F64),
                                                             torch.tensor([alpha], dtype=F64)))
    il, iu = (float(t) for t in ops.get(name).image(torch.tensor([l], dtype=F64), torch.tensor([u], dtype=F64)))
    f = MP[name]
    for x in [l, u, *_tangent_points(name, l, u, alpha)]:
        fx, X = f(mpmath.mpf(x)), mpmath.mpf(x)
        assert mpmath.mpf(lw) * X + mpmath.mpf(lb) <= fx, (name, l, u, alpha, x)
        assert fx <= mpmath.mpf(uw) * X + mpmath.mpf(ub), (name, l, u, alpha, x)
        if name != "square":  # monotone on the box: the ends enclose it
            assert mpmath.mpf(il) <= fx <= mpmath.mpf(iu), (name, l, u, x)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_mpmath_random_alpha(name):
    gen = torch.Generator().manual_seed(12)
    l, u = _boxes(name, 12, gen)
    alpha = torch.rand(12, generator=gen, dtype=F64)
    for li, ui, ai in zip(l.tolist(), u.tolist(), alpha.tolist()):
        _check_exact(name, li, ui, ai)


def test_tangent_plane_touches_in_real_arithmetic():
    """Defect (before this module certified intercepts): the exp tangent's intercept
    fl(e^m) - fl(s m) could put the plane above e^m at the tangent point by an ulp. The
    certified intercept keeps it below in exact arithmetic, and within a few ulp of it."""
    gen = torch.Generator().manual_seed(5)
    m = -5 + 10 * torch.rand(400, generator=gen, dtype=F64)
    l, u = m - 0.5, m + 0.5
    lw, lb, _, _ = ops.get("exp").planes(l, u, torch.full_like(l, 0.5))
    for mi, s, b in zip(((l + u) / 2).tolist(), lw.tolist(), lb.tolist()):
        gap = mpmath.exp(mpmath.mpf(mi)) - (mpmath.mpf(s) * mpmath.mpf(mi) + mpmath.mpf(b))
        assert 0 <= gap <= 64 * 2.0**-53 * (1 + abs(mpmath.exp(mi)) + abs(s * mi))


WIDTHS = st.one_of(st.floats(1e-14, 1e-6), st.floats(1e-6, 10.0), st.floats(10.0, 200.0))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FAMILIES), st.floats(-60.0, 60.0), WIDTHS, st.floats(0.0, 1.0))
def test_family_hypothesis(name, centre, width, alpha):
    l, u = centre - width / 2, centre + width / 2
    if name in POSITIVE:
        l, u = abs(centre) / 8 + 1e-3, abs(centre) / 8 + 1e-3 + width
    if name == "exp":
        u = min(u, 700.0)
        l = min(l, u)
    _check_exact(name, l, u, alpha)


def test_planes_broadcast_the_spec_axis_and_carry_gradients():
    l, u = torch.tensor([[[-1.0, 0.2]]], dtype=F64), torch.tensor([[[1.0, 3.0]]], dtype=F64)  # (B, 1, 2)
    for name in ("exp", "square", "gelu", "tanh", "relu"):
        alpha = torch.rand(1, 3, 2, dtype=F64, requires_grad=True)  # (B, S, 2)
        lw, lb, uw, ub = ops.get(name).planes(l, u, alpha)
        assert torch.broadcast_shapes(lw.shape, lb.shape, uw.shape, ub.shape) == (1, 3, 2)
        (lw.sum() + lb.sum()).backward()
        assert alpha.grad is not None and torch.isfinite(alpha.grad).all(), name


def test_overflowing_boxes_fall_back_to_the_image():
    lw, lb, uw, ub = ops.get("exp").planes(torch.tensor([-1.0, 700.0, -torch.inf]),
                                           torch.tensor([800.0, 750.0, 0.0]))
    assert not torch.isnan(torch.stack([lw, lb, uw, ub])).any()
    assert (ub[:2] == torch.inf).all() and lb[2] == 0 and ub[2] >= 1


def test_positive_domain_is_checked():
    for name in POSITIVE:
        with pytest.raises(ValueError, match=name):
            ops.get(name).planes(torch.tensor([-1.0]), torch.tensor([1.0]), torch.tensor([0.5]))


# ---------------------------------------------------------------- products
def _fr(t):
    return [Fraction(v) for v in t.reshape(-1).tolist()]


def _exact_step_check(op, A, xb, yb, x_shape, y_shape, alpha):
    """A·(x∘y) >= Σ ax·x + Σ ay·y + bias at every vertex of the boxes, exactly (Fractions)."""
    (ax, ay), bias = ops.get(op).relax(A, xb, yb, x_shape, y_shape, alpha)
    nx, ny = xb[0].numel(), yb[0].numel()
    xl, xu, yl, yu = (_fr(t) for t in (*xb, *yb))
    Af, axf, ayf = _fr(A), _fr(ax), _fr(ay)
    b = Fraction(float(bias.reshape(-1)[0]))
    for bits in itertools.product((0, 1), repeat=nx + ny):
        x = [xu[i] if bits[i] else xl[i] for i in range(nx)]
        y = [yu[j] if bits[nx + j] else yl[j] for j in range(ny)]
        if op == "mul":
            z = [x[i] * y[i % ny] for i in range(nx)] if nx >= ny else [x[0] * yj for yj in y]
        else:  # X (n, k) @ Y (k, m)
            (n, k), m = x_shape[-2:], y_shape[-1]
            z = [sum(x[i * k + q] * y[q * m + j] for q in range(k)) for i in range(n) for j in range(m)]
        lhs = sum(a * v for a, v in zip(Af, z))
        rhs = sum(a * v for a, v in zip(axf, x)) + sum(a * v for a, v in zip(ayf, y)) + b
        assert lhs >= rhs


@pytest.mark.parametrize("op", ["mul", "matmul"])
def test_product_step_exact_at_every_vertex(op):
    gen = torch.Generator().manual_seed(21)
    x_shape, y_shape, z_shape = ((1, 3), (1, 1), (1, 3)) if op == "mul" else ((1, 2, 2), (1, 2, 2), (1, 2, 2))
    r = lambda s: torch.randn(1, *s, generator=gen, dtype=F64) * 3  # noqa: E731
    for trial in range(20):
        xl, yl = r(x_shape), r(y_shape)
        xu, yu = xl + r(x_shape).abs(), yl + r(y_shape).abs()
        if trial % 4 == 0:
            xu = xl + 1e-12 * r(x_shape).abs()  # a nearly degenerate box
        A = torch.randn(1, 1, *z_shape, generator=gen, dtype=F64)
        alpha = None if trial % 5 == 0 else torch.rand(1, 1, *z_shape, generator=gen, dtype=F64)
        _exact_step_check(op, A, (xl, xu), (yl, yu), x_shape, y_shape, alpha)


@pytest.mark.parametrize("op", ["mul", "matmul"])
def test_product_step_sampling_random_alpha(op):
    gen = torch.Generator().manual_seed(22)
    shp_x, shp_y = ((2, 3, 4), (2, 3, 1)) if op == "mul" else ((2, 3, 4), (2, 4, 5))
    B, S = 2, 5
    c = lambda s: torch.randn(B, *s, generator=gen, dtype=F64)  # noqa: E731
    xl, yl = c(shp_x), c(shp_y)
    xu, yu = xl + c(shp_x).abs(), yl + c(shp_y).abs()
    zshape = (xl * yl).shape[1:] if op == "mul" else (xl @ yl).shape[1:]
    A = torch.randn(B, S, *zshape, generator=gen, dtype=F64)
    alpha = torch.rand(B, S, *zshape, generator=gen, dtype=F64)
    (ax, ay), bias = ops.get(op).relax(A, (xl, xu), (yl, yu), shp_x, shp_y, alpha)
    zl, zu = ops.get(op).image((xl, xu), (yl, yu))
    for k in range(500):
        if k < 16:  # corners of the boxes first
            gx = torch.rand(xl.shape, generator=gen) < 0.5
            gy = torch.rand(yl.shape, generator=gen) < 0.5
            x, y = torch.where(gx, xl, xu), torch.where(gy, yl, yu)
        else:
            x = xl + (xu - xl) * torch.rand(xl.shape, generator=gen, dtype=F64)
            y = yl + (yu - yl) * torch.rand(yl.shape, generator=gen, dtype=F64)
        z = x * y if op == "mul" else x @ y
        true = ops.sum_rest(A * z.unsqueeze(1))
        plane = bias + ops.sum_rest(ax * x.unsqueeze(1)) + ops.sum_rest(ay * y.unsqueeze(1))
        assert (plane <= true + 1e-12 * (1 + true.abs())).all()
        assert (zl <= z).all() and (z <= zu).all()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([1e-9, 1.0, 1e4]), st.sampled_from([1e-9, 1.0, 1e4]),
       st.sampled_from(["random", "zeros", "ones", "corners"]))
def test_matmul_per_product_alpha_exact_at_every_vertex(seed, centre, width, kind):
    """One alpha per product X_ik Y_kj (shape (B, S, n, k, m)): the step holds at every vertex
    of the boxes, exactly (Fractions), for alphas anywhere in [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda s: torch.randn(1, *s, generator=gen, dtype=F64)  # noqa: E731
    xl, yl = r((2, 3)) * centre, r((3, 2)) * centre
    xu, yu = xl + r((2, 3)).abs() * width, yl + r((3, 2)).abs() * width
    A = torch.randn(1, 1, 2, 2, generator=gen, dtype=F64)
    alpha = {"random": torch.rand(1, 1, 2, 3, 2, generator=gen, dtype=F64),
             "zeros": torch.zeros(1, 1, 2, 3, 2, dtype=F64), "ones": torch.ones(1, 1, 2, 3, 2, dtype=F64),
             "corners": (torch.rand(1, 1, 2, 3, 2, generator=gen) < 0.5).to(F64)}[kind]
    _exact_step_check("matmul", A, (xl, xu), (yl, yu), (2, 3), (3, 2), alpha)


def test_matmul_per_product_alpha_generalises_the_shared_one():
    """Per-product alphas equal along k give the shared-alpha step (within rounding), and the
    default ``alpha_init`` has the per-product shape."""
    gen = torch.Generator().manual_seed(23)
    c = lambda s: torch.randn(2, *s, generator=gen, dtype=F64)  # noqa: E731
    xl, yl = c((3, 4)), c((4, 5))
    xu, yu = xl + c((3, 4)).abs(), yl + c((4, 5)).abs()
    A = torch.randn(2, 6, 3, 5, generator=gen, dtype=F64)
    shared = torch.rand(2, 6, 3, 5, generator=gen, dtype=F64)
    per = shared.unsqueeze(-2).expand(2, 6, 3, 4, 5)
    op = ops.get("matmul")
    (ax1, ay1), b1 = op.relax(A, (xl, xu), (yl, yu), (3, 4), (4, 5), shared)
    (ax2, ay2), b2 = op.relax(A, (xl, xu), (yl, yu), (3, 4), (4, 5), per)
    for a, b in ((ax1, ax2), (ay1, ay2), (b1, b2)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert op.alpha_init(2, (3, 5), [(3, 4), (4, 5)]).shape == (2, 3, 4, 5)
    assert op.alpha_init(2, (3, 5)).shape == (2, 3, 5)


@settings(max_examples=40, deadline=None)
@given(st.floats(-1e3, 1e3), WIDTHS, st.floats(-1e3, 1e3), WIDTHS, st.floats(0.0, 1.0))
def test_mul_planes_hypothesis(xc, xw, yc, yw, alpha):
    """Per element: both planes of the family hold at the 4 corners, exactly (Fractions)."""
    xl, xu, yl, yu = (torch.tensor([v], dtype=F64) for v in (xc, xc + xw, yc, yc + yw))
    (alo, b, clo), (ahi, _, chi) = mul_planes((xl, xu), (yl, yu), torch.tensor([alpha], dtype=F64))
    alo, b, clo, ahi, chi = (Fraction(float(t)) for t in (alo, b, clo, ahi, chi))
    for x in (Fraction(float(xl)), Fraction(float(xu))):
        for y in (Fraction(float(yl)), Fraction(float(yu))):
            assert alo * x + b * y + clo <= x * y <= ahi * x + b * y + chi


SCALES = st.sampled_from([1e-12, 1e-6, 1.0, 1e3, 1e6])


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["mul", "matmul"]), st.integers(0, 2**31), SCALES, SCALES, st.booleans())
def test_product_step_hypothesis(op, seed, centre, width, with_alpha):
    """The exact vertex check over boxes of tiny to huge widths on both sides of 0."""
    gen = torch.Generator().manual_seed(seed)
    x_shape, y_shape, z_shape = ((1, 2), (1, 2), (1, 2)) if op == "mul" else ((1, 2, 2), (1, 2, 1), (1, 2, 1))
    r = lambda s: torch.randn(1, *s, generator=gen, dtype=F64)  # noqa: E731
    xl, yl = r(x_shape) * centre, r(y_shape) * centre
    xu, yu = xl + r(x_shape).abs() * width, yl + r(y_shape).abs() * width
    A = torch.randn(1, 1, *z_shape, generator=gen, dtype=F64)
    alpha = torch.rand(1, 1, *z_shape, generator=gen, dtype=F64) if with_alpha else None
    _exact_step_check(op, A, (xl, xu), (yl, yu), x_shape, y_shape, alpha)


def test_square_image_encloses_exactly():
    gen = torch.Generator().manual_seed(32)
    l = -3 + 6 * torch.rand(300, generator=gen, dtype=F64)
    u = l + 3 * torch.rand(300, generator=gen, dtype=F64)
    lo, hi = ops.get("square").image(l, u)
    for li, ui, a, b in zip(*(t.tolist() for t in (l, u, lo, hi))):
        ends = [Fraction(li) ** 2, Fraction(ui) ** 2]
        least = 0 if li <= 0 <= ui else min(ends)
        assert Fraction(a) <= least and max(ends) <= Fraction(b)


def test_matmul_interval_is_outward_exactly():
    gen = torch.Generator().manual_seed(23)
    xl = torch.randn(1, 2, 3, generator=gen, dtype=F64)
    yl = torch.randn(1, 3, 2, generator=gen, dtype=F64)
    xu, yu = xl + torch.rand(1, 2, 3, generator=gen, dtype=F64), yl
    zl, zu = ops.get("matmul").image((xl, xu), (yl, yu))  # Y is a point: Z is linear in X
    X, Y = _fr(xl), _fr(yl)
    Xu = _fr(xu)
    for i in range(2):
        for j in range(2):
            lo = sum(min(X[i * 3 + q] * Y[q * 2 + j], Xu[i * 3 + q] * Y[q * 2 + j]) for q in range(3))
            hi = sum(max(X[i * 3 + q] * Y[q * 2 + j], Xu[i * 3 + q] * Y[q * 2 + j]) for q in range(3))
            assert Fraction(float(zl[0, i, j])) <= lo and hi <= Fraction(float(zu[0, i, j]))


# ---------------------------------------------------------------- alpha-CROWN on zoo models
def _setup(name, n, eps):
    model, xte, yte = zoo.load(name)
    x, y = xte[:n].to(F64), yte[:n]
    g = graph_of(model, x)
    lo, hi = input_box(x, eps)
    state = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), centre=x.unsqueeze(1))
    classes = 10
    C = margin_spec(y, classes).reshape(n, classes, *g.nodes[g.output].shape)
    return model, x, y, g, state, C, (lo, hi)


@pytest.mark.parametrize("name,n,eps", [("digits-vit1", 2, 0.02), ("mnist-vit1", 1, 0.02)])
def test_alpha_crown_on_zoo_is_tighter_and_sound(name, n, eps):
    model, x, y, g, state, C, (lo, hi) = _setup(name, n, eps)
    base = crown.backward(state, g.output, C)
    opt = crown.alpha_crown(state, C, iterations=6)
    relu = crown.alpha_crown(state, C, iterations=6, operators=("relu",))
    other = torch.ones_like(base, dtype=torch.bool)
    other[torch.arange(n), y] = False
    assert (opt >= base).all() and (relu >= base).all()
    assert opt[other].sum() > base[other].sum()  # the new families do move the bound
    model64 = model.double().eval()
    _, worst = pgd(model64, x, y, eps, AttackOptions(steps=20, restarts=1))
    assert (opt[other] <= worst[other]).all()
    # sampled points of the box: no margin below the bound
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(4):
            pt = lo + (hi - lo) * torch.rand(lo.shape, generator=gen, dtype=F64)
            z = model64(pt).reshape(n, -1)
            margins = z[torch.arange(n), y].unsqueeze(1) - z
            assert (opt[other] <= margins[other]).all()


def test_random_alphas_in_range_stay_sound_on_a_zoo_model():
    """Any alpha in range is sound: random parameters for every family at once, against
    the model's own margins at sampled points and box corners."""
    model, x, y, g, state, C, (lo, hi) = _setup("digits-vit1", 1, 0.03)
    gen = torch.Generator().manual_seed(1)
    alphas = {}
    for i in range(len(g.nodes)):
        params = crown.initial_params(state, i, C.shape[1])
        if params is not None:
            rlo, rhi = params.low, params.high
            alphas[i] = rlo + (rhi - rlo) * torch.rand(params.start.shape, generator=gen, dtype=F64)
    kinds = {g.nodes[i].op for i in alphas}
    assert {"exp", "neg_log", "sigmoid", "matmul"} <= kinds
    with torch.no_grad():
        bound = crown.backward(state, g.output, C, alphas=alphas)
        model64 = model.double().eval()
        for k in range(16):
            mask = torch.rand(lo.shape, generator=gen) < 0.5
            pt = torch.where(mask, lo, hi) if k < 8 else lo + (hi - lo) * torch.rand(lo.shape, generator=gen,
                                                                                      dtype=F64)
            z = model64(pt).reshape(1, -1)
            val = (C.reshape(1, C.shape[1], -1) * z.unsqueeze(1)).sum(-1)
            assert (bound <= val).all()


def test_square_and_rsqrt_families_are_exact_at_the_corners():
    """x² has rational planes: the certified intercepts checked with Fractions at the ends."""
    gen = torch.Generator().manual_seed(31)
    l = -3 + 6 * torch.rand(200, generator=gen, dtype=F64)
    u = l + torch.rand(200, generator=gen, dtype=F64) * 4
    alpha = torch.rand(200, generator=gen, dtype=F64)
    lw, lb, uw, ub = ops.get("square").planes(l, u, alpha)
    for li, ui, ai, a, b, c, d in zip(*(t.tolist() for t in (l, u, alpha, lw, lb, uw, ub))):
        m = min(max(li + ai * (ui - li), li), ui)
        for x in (li, ui, m, (li + ui) / 2):
            X = Fraction(x)
            assert Fraction(a) * X + Fraction(b) <= X * X <= Fraction(c) * X + Fraction(d)
    assert math.isfinite(float(lb.min()))
