"""Smooth activations (certify/ops/activations.py): planes and images enclose f, checked
against mpmath at 50 digits where float64 cannot decide (corners, touching points), the
error model of every float64 value, and the constants the code relies on."""
import math

import mpmath
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from softcert.certify import ops
from softcert.certify.ops import activations as act

NAMES = ("gelu", "gelu_tanh", "tanh", "sigmoid", "sqrt")
KAPPA = mpmath.mpf("0.044715")


def _mp(x):
    # a float64 (or tensor element) exactly; an mpf as it is
    return x if isinstance(x, mpmath.mpf) else mpmath.mpf(float(x))


def mp_f(name, x):
    """f at x (a float64, exactly, or an mpf), in mpmath (50 digits: conftest)."""
    x = _mp(x)
    if name == "gelu":
        return x * mpmath.ncdf(x)
    if name == "gelu_tanh":  # 0.5 (1 + tanh T) = σ(2T), without the cancellation of 1 + tanh
        return x / (1 + mpmath.exp(-2 * mpmath.sqrt(2 / mpmath.pi) * (x + KAPPA * x**3)))
    if name == "tanh":
        return mpmath.tanh(x)
    if name == "sigmoid":
        return 1 / (1 + mpmath.exp(-x))
    return mpmath.sqrt(x)


def mp_df(name, x, order=1):
    """f' or f'' at x in mpmath (analytic forms)."""
    x = _mp(x)
    if name == "gelu":
        return mpmath.ncdf(x) + x * mpmath.npdf(x) if order == 1 else mpmath.npdf(x) * (2 - x * x)
    if name == "gelu_tanh":  # f = x σ(t), t = 2√(2/π)(x + κx³)
        k = 2 * mpmath.sqrt(2 / mpmath.pi)
        t, t1, t2 = k * (x + KAPPA * x**3), k * (1 + 3 * KAPPA * x**2), 6 * k * KAPPA * x
        sp, sn = 1 / (1 + mpmath.exp(-t)), 1 / (1 + mpmath.exp(t))
        h1, h2 = sp * sn * t1, sp * sn * (sn - sp) * t1**2 + sp * sn * t2
        return sp + x * h1 if order == 1 else 2 * h1 + x * h2
    if name == "tanh":
        th = mpmath.tanh(x)
        return 1 / mpmath.cosh(x) ** 2 if order == 1 else -2 * th / mpmath.cosh(x) ** 2
    if name == "sigmoid":
        sp, sn = 1 / (1 + mpmath.exp(-x)), 1 / (1 + mpmath.exp(x))
        return sp * sn if order == 1 else sp * sn * (sn - sp)
    return 1 / (2 * mpmath.sqrt(x)) if order == 1 else -1 / (4 * x * mpmath.sqrt(x))


TORCH_F = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "tanh": torch.tanh,
           "sigmoid": torch.sigmoid, "sqrt": torch.sqrt}


def random_boxes(name, n, seed):
    """Widths 10^U(-12, 3), centres U(-20, 20) (sqrt: |centre|, clipped at 0)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.rand(n, generator=g, dtype=torch.float64) * 40 - 20
    w = 10 ** (torch.rand(n, generator=g, dtype=torch.float64) * 15 - 12)
    if name == "sqrt":
        c = c.abs()
    l, u = c - w / 2, c + w / 2
    if name == "sqrt":
        l = l.clamp(min=0)
    return l, u


def assert_plane_mp(name, x, lw, lb, uw, ub):
    fx = mp_f(name, x)
    x = mpmath.mpf(float(x))
    assert fx - (mpmath.mpf(float(lw)) * x + mpmath.mpf(float(lb))) >= 0, (name, float(x), "lower")
    assert mpmath.mpf(float(uw)) * x + mpmath.mpf(float(ub)) - fx >= 0, (name, float(x), "upper")


# ---------------------------------------------------------------- the error model
def test_libm_accuracy_assumption():
    """torch's float64 erfc, exp, tanh, sigmoid, sqrt are within LIBM_REL relative error."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(300, generator=g, dtype=torch.float64) * 60 - 30,
                   torch.randn(100, generator=g, dtype=torch.float64) * 1e-3,
                   torch.tensor([1e-300, 5e-324, 700.0, -700.0, 26.0, -740.0, 740.0], dtype=torch.float64)])
    cases = [(torch.special.erfc, mpmath.erfc), (torch.exp, mpmath.exp), (torch.tanh, mpmath.tanh),
             (torch.sigmoid, lambda t: 1 / (1 + mpmath.exp(-t))), (lambda t: torch.sqrt(t.abs()),
                                                                 lambda t: mpmath.sqrt(abs(t)))]
    for fn, ref in cases:
        for xv, v in zip(x.tolist(), fn(x).tolist()):
            r = ref(mpmath.mpf(xv))
            if abs(r) < 1e-300:  # near or below the subnormal range: absolute error (act.ABS)
                assert abs(v - r) <= act.ABS
                continue
            if abs(r) > 1.79e308:  # overflow: inf, used by no bound
                assert math.isinf(v)
                continue
            assert abs(v - r) <= act.LIBM_REL * abs(r), (fn, xv)


@pytest.mark.parametrize("name", NAMES)
def test_value_and_slope_error_bounds(name):
    """|float value - f(x)| <= the claimed error, and the same for f', against mpmath."""
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.rand(200, generator=g, dtype=torch.float64) * 80 - 40,
                   10 ** (torch.rand(60, generator=g, dtype=torch.float64) * 8 - 4),
                   -(10 ** (torch.rand(60, generator=g, dtype=torch.float64) * 8 - 4)),
                   torch.tensor([0.0, 1e4, -1e4, -38.0, -27.0, 1.4142135623730951, -21.3, -21.2, -709.9,
                                 -745.5, 709.9], dtype=torch.float64)])
    if name == "sqrt":
        x = x.abs()[x.abs() > 0]
    curve = act.CURVES[name]
    v, e = curve.value(x)
    d, ed = curve.slope(x)
    for xi, vi, ei, di, edi in zip(x.tolist(), v.tolist(), e.tolist(), d.tolist(), ed.tolist()):
        assert abs(mpmath.mpf(vi) - mp_f(name, xi)) <= ei, (name, xi, "value")
        assert abs(mpmath.mpf(di) - mp_df(name, xi)) <= edi, (name, xi, "slope")


# ---------------------------------------------------------------- constants
@pytest.mark.parametrize("name,consts", [("gelu", act.GELU_ERF), ("gelu_tanh", act.GELU_TANH)])
def test_gelu_constants(name, consts):
    lo, hi = consts.argmin
    assert mp_df(name, lo) < 0 < mp_df(name, hi)  # the minimiser lies in [lo, hi]
    xs = mpmath.findroot(lambda t: mp_df(name, t), mpmath.mpf(lo))
    fmin = mp_f(name, xs)
    assert consts.minimum[0] <= fmin <= consts.minimum[1]
    # f decreasing before x*, increasing after (unimodal): f' signs on a grid
    for t in [-30, -10, -3, -1.5, -0.9, -0.76]:
        assert mp_df(name, t) < 0 or abs(mp_f(name, t)) < 1e-100
    for t in [-0.75, -0.5, 0, 1, 3, 30]:
        assert mp_df(name, t) > 0
    r_lo, r_hi = consts.inflection
    assert mp_df(name, r_lo, 2) > 0 > mp_df(name, r_hi, 2)
    assert mp_df(name, -r_lo, 2) > 0 > mp_df(name, -r_hi, 2)
    # convex inside, concave outside, |f''| <= GELU_CURVATURE (max √(2/π) at 0)
    for i in range(121):
        t = -12 + 0.2 * i
        second = mp_df(name, t, 2)
        assert abs(second) <= act.GELU_CURVATURE
        if abs(t) < r_lo:
            assert second >= 0
        elif abs(t) > r_hi:
            assert second <= 0
    assert abs(mp_df(name, 0.0, 2) - mpmath.sqrt(2 / mpmath.pi)) < 1e-40


def test_s_shapes_and_sqrt_curvature():
    """tanh, sigmoid: convex on x <= 0, concave on x >= 0; sqrt concave."""
    for i in range(1, 60):
        t = 0.25 * i
        for name in ("tanh", "sigmoid"):
            assert mp_df(name, -t, 2) > 0 > mp_df(name, t, 2)
        assert mp_df("sqrt", t, 2) < 0


# ---------------------------------------------------------------- planes on random boxes
@pytest.mark.parametrize("name", NAMES)
def test_planes_enclose_random_boxes(name):
    """10k points per box (both corners, the midpoint and the points where the planes come
    closest to f included): float64 with the rounding tolerance everywhere, mpmath at the
    corners and the closest points."""
    l, u = random_boxes(name, 40, seed=hash(name) % 1000)
    op = ops.get(name)
    lw, lb, uw, ub = op.planes(l, u)
    il, iu = op.image(l, u)
    assert not any(torch.isnan(t).any() for t in (lw, lb, uw, ub, il, iu))
    g = torch.Generator().manual_seed(5)
    t = torch.rand(9997, 1, generator=g, dtype=torch.float64)
    x = torch.cat([l[None], u[None], ((l + u) / 2)[None], l + (u - l) * t]).clamp(l, u)
    fx = TORCH_F[name](x)
    plo, pup = lw * x + lb, uw * x + ub
    tol = 4e-16 * (1 + fx.abs() + (lw * x).abs() + lb.abs() + (uw * x).abs() + ub.abs())
    assert (plo <= fx + tol).all() and (fx <= pup + tol).all()
    assert (il <= fx + tol).all() and (fx <= iu + tol).all()
    # tightness: no plane is further from f than a constant plane from the image would be
    lip = {"gelu": 1.13, "gelu_tanh": 1.13, "tanh": 1.0, "sigmoid": 0.25}.get(name)
    if lip is not None:
        gap = (pup - plo).max(0).values
        assert (gap <= 2 * lip * (u - l) + 1e-9 * (1 + fx.abs().max(0).values)).all()
    # exact check where the planes touch f: corners and the closest sampled points
    close = torch.cat([(fx - plo).argmin(0, keepdim=True), (pup - fx).argmin(0, keepdim=True)])
    for j in range(l.shape[0]):
        for i in {0, 1, 2, *close[:, j].tolist()}:
            assert_plane_mp(name, x[i, j], lw[j], lb[j], uw[j], ub[j])
            fv = mp_f(name, x[i, j])
            assert mpmath.mpf(float(il[j])) <= fv <= mpmath.mpf(float(iu[j]))


@pytest.mark.parametrize("name", ["tanh", "sigmoid"])
def test_s_shape_crown_rules(name):
    """Tightness of CROWN's rules: on a convex box the upper plane is the chord (touches both
    ends); on a crossing box with the tangent case, the upper plane passes through (l, f(l))
    and the lower one through (u, f(u))."""
    op, f = ops.get(name), TORCH_F[name]
    scale = 4.0 if name == "sigmoid" else 1.0
    l = torch.tensor([-3.0, -4.0, 0.5]) * scale
    u = torch.tensor([-1.0, 4.0, 2.0]) * scale
    l, u = l.double(), u.double()
    lw, lb, uw, ub = op.planes(l, u)
    # convex box: upper = chord; concave box: lower = chord
    assert abs(uw[0] * l[0] + ub[0] - f(l[0])) < 1e-12 and abs(uw[0] * u[0] + ub[0] - f(u[0])) < 1e-12
    assert abs(lw[2] * l[2] + lb[2] - f(l[2])) < 1e-12 and abs(lw[2] * u[2] + lb[2] - f(u[2])) < 1e-12
    # symmetric crossing box: tangents through the far ends
    assert abs(uw[1] * l[1] + ub[1] - f(l[1])) < 1e-10
    assert abs(lw[1] * u[1] + lb[1] - f(u[1])) < 1e-10
    assert 0 < lw[1] < op.planes(torch.zeros(1).double(), torch.zeros(1).double())[0][0] + 1e-12


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_tangent_slopes_carry_their_implicit_derivatives(name):
    """The tangent slopes of a crossing box depend on its ends through the tangent point (the
    root of h(d) = f(d) + f'(d)(l - d) - f(l)); their gradients (certified training
    differentiates the planes) match central differences of the planes themselves."""
    op = ops.get(name)
    l = torch.tensor([-3.0, -1.5, -0.7], dtype=torch.float64, requires_grad=True)
    u = torch.tensor([2.5, 4.0, 0.9], dtype=torch.float64, requires_grad=True)
    lw, _, uw, _ = op.planes(l, u)
    for slope, end, other in ((uw, l, u), (lw, u, l)):
        (g,) = torch.autograd.grad(slope.sum(), end, retain_graph=True)
        h = 1e-6
        with torch.no_grad():
            moved = [end.detach() + s * h for s in (1, -1)]
            planes = [op.planes(m, other.detach()) if end is l else op.planes(other.detach(), m) for m in moved]
            k = 2 if end is l else 0  # the upper slope moves with l, the lower with u
            fd = (planes[0][k] - planes[1][k]) / (2 * h)
        torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-8)


def test_gelu_planes_tight_on_small_boxes():
    """On a box of width w the planes are within O(w²) of f (curvature <= 0.8)."""
    c = torch.linspace(-6, 6, 101, dtype=torch.float64)
    for w in (1e-3, 1e-1):
        for name in ("gelu", "gelu_tanh"):
            l, u = c - w / 2, c + w / 2
            lw, lb, uw, ub = ops.get(name).planes(l, u)
            x = l + (u - l) * torch.linspace(0, 1, 201, dtype=torch.float64)[:, None]
            gap = (uw * x + ub) - (lw * x + lb)
            assert gap.max() <= 0.8 * w * w / 2 + 1e-13


# ---------------------------------------------------------------- property tests
finite = st.floats(min_value=-20, max_value=20, allow_nan=False)
log_width = st.floats(min_value=-12, max_value=3, allow_nan=False)
frac = st.floats(min_value=0, max_value=1, allow_nan=False)


@pytest.mark.parametrize("name", NAMES)
@given(c=finite, lw10=log_width, t=frac)
def test_planes_sound_property(name, c, lw10, t):
    w = 10.0**lw10
    l, u = c - w / 2, c + w / 2
    if name == "sqrt":
        l, u = max(abs(c) - w / 2, 0.0), abs(c) + w / 2
    lt, ut = torch.tensor([l], dtype=torch.float64), torch.tensor([u], dtype=torch.float64)
    lw_, lb, uw, ub = ops.get(name).planes(lt, ut)
    for x in {l, u, min(max(l + t * (u - l), l), u)}:
        assert_plane_mp(name, x, lw_[0], lb[0], uw[0], ub[0])


@pytest.mark.parametrize("name", NAMES)
@given(c=finite, lw10=log_width, t=frac)
def test_image_sound_property(name, c, lw10, t):
    w = 10.0**lw10
    l, u = c - w / 2, c + w / 2
    if name == "sqrt":
        l, u = max(abs(c) - w / 2, 0.0), abs(c) + w / 2
    lo, hi = ops.get(name).image(torch.tensor([l], dtype=torch.float64), torch.tensor([u], dtype=torch.float64))
    lo, hi = mpmath.mpf(float(lo[0])), mpmath.mpf(float(hi[0]))
    for x in {l, u, min(max(l + t * (u - l), l), u)}:
        assert lo <= mp_f(name, x) <= hi
    if name.startswith("gelu"):
        consts = act.GELU_ERF if name == "gelu" else act.GELU_TANH
        xs = mpmath.findroot(lambda v: mp_df(name, v), mpmath.mpf(consts.argmin[0]))
        if l <= xs <= u:
            assert lo <= mp_f(name, xs)


# ---------------------------------------------------------------- edges
@pytest.mark.parametrize("name", NAMES)
def test_degenerate_and_wide_boxes(name):
    pts = [0.0, -0.7517915246935645, -0.752461422071016, 1.4142135623730951, -1.4142135623730951,
           1.4185040087908284, 1e4, -1e4, 3.0, -3.0, 1e-300, -39.0]
    wide = [(-1e4, 1e4), (-1e4, -1e3), (1e3, 1e4), (-1e3, 1.0), (-50.0, 50.0)]
    if name == "sqrt":
        pts = [abs(p) for p in pts]
        wide = [(0.0, 1e4), (1e3, 1e4), (0.0, 1.0), (0.0, 1e-300)]
    boxes = [(p, p) for p in pts] + [(p, math.nextafter(p, math.inf)) for p in pts] + wide
    l = torch.tensor([b[0] for b in boxes], dtype=torch.float64)
    u = torch.tensor([b[1] for b in boxes], dtype=torch.float64)
    lw, lb, uw, ub = ops.get(name).planes(l, u)
    il, iu = ops.get(name).image(l, u)
    assert torch.isfinite(torch.stack([lw, lb, uw, ub, il, iu])).all()
    for j, (a, b) in enumerate(boxes):
        for x in {a, b, a + (b - a) * 0.3, a + (b - a) * 0.77}:
            assert_plane_mp(name, x, lw[j], lb[j], uw[j], ub[j])
            assert mpmath.mpf(float(il[j])) <= mp_f(name, x) <= mpmath.mpf(float(iu[j]))
    # a point box is tight
    k = len(pts)
    assert ((uw[:k] * l[:k] + ub[:k]) - (lw[:k] * l[:k] + lb[:k]) <= 1e-12 * (1 + l[:k].abs())).all()


@pytest.mark.parametrize("name", NAMES)
def test_infinite_ends_give_no_nan(name):
    inf = math.inf
    boxes = [(-inf, 1.0), (-inf, -2.0), (0.5, inf), (-3.0, inf), (-inf, inf), (inf, inf), (-inf, -inf)]
    if name == "sqrt":
        boxes = [(0.5, inf), (0.0, inf), (inf, inf)]
    l = torch.tensor([b[0] for b in boxes], dtype=torch.float64)
    u = torch.tensor([b[1] for b in boxes], dtype=torch.float64)
    lw, lb, uw, ub = ops.get(name).planes(l, u)
    il, iu = ops.get(name).image(l, u)
    assert not torch.isnan(torch.stack([lw, lb, uw, ub, il, iu])).any()
    assert torch.isfinite(lw).all() and torch.isfinite(uw).all()
    for j, (a, b) in enumerate(boxes):
        lo, hi = max(a, -1e6), min(b, 1e6)
        for x in (lo, hi, (lo + hi) / 2, lo + 1.5, hi - 1.5):
            if not (lo <= x <= hi) or not math.isfinite(x):
                continue
            fx = mp_f(name, x)
            if math.isfinite(float(lb[j])):
                assert fx >= mpmath.mpf(float(lw[j])) * x + mpmath.mpf(float(lb[j]))
            if math.isfinite(float(ub[j])):
                assert fx <= mpmath.mpf(float(uw[j])) * x + mpmath.mpf(float(ub[j]))
            assert mpmath.mpf(float(il[j])) <= fx <= mpmath.mpf(float(iu[j]))
    if name in ("tanh", "sigmoid"):  # bounded: always some information
        assert torch.isfinite(lb).all() and torch.isfinite(ub).all()
    if name.startswith("gelu"):  # bounded below; above by relu on a left-bounded ray
        assert torch.isfinite(lb).all() and math.isfinite(float(ub[3])) and float(uw[3]) == 1.0


def test_nan_input_gives_no_information():
    l = torch.tensor([math.nan, 0.0], dtype=torch.float64)
    u = torch.tensor([1.0, 1.0], dtype=torch.float64)
    for name in NAMES:
        lw, lb, uw, ub = ops.get(name).planes(l, u)
        assert not torch.isnan(torch.stack([lw, lb, uw, ub])).any()
        assert lb[0] == -math.inf or lw[0] == 0


def test_sqrt_refuses_negative_inputs():
    with pytest.raises(ValueError, match="sqrt"):
        ops.get("sqrt").planes(torch.tensor([-0.5], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))
    lo, hi = ops.get("sqrt").interval(None, [(torch.tensor([-1.0, 1.0], dtype=torch.float64),
                                             torch.tensor([1.0, 4.0], dtype=torch.float64))])
    assert lo[0] == -math.inf and hi[0] == math.inf
    assert lo[1] <= 1.0 <= hi[1] and hi[1] >= 2.0


def test_traits_and_forward():
    x = torch.linspace(-5, 5, 41, dtype=torch.float64)
    for name in NAMES:
        op = ops.get(name)
        assert op.kind == "elementwise" and (op.slope_init is None) == (name == "sqrt")
        xx = x.abs() if name == "sqrt" else x
        torch.testing.assert_close(op.fn(xx), TORCH_F[name](xx))
        lo, hi = op.value_range
        y = op.fn(xx)
        assert lo is None or (y >= lo).all()
        assert hi is None or (y <= hi).all()
    assert [ops.get(n).monotone for n in NAMES] == [False, False, True, True, True]
    assert act.GELU_ERF.minimum[0] < -0.16997 and ops.get("gelu").value_range[0] == act.GELU_ERF.minimum[0]


def test_backward_step_is_sound():
    """Elementwise.backward with these planes: A·f(x) >= A_in·x + bias at sampled x, with
    the verifier's shapes (l, u (B, *shape); A (B, S, *shape))."""
    g = torch.Generator().manual_seed(7)
    B, S, shape = 2, 3, (4, 5)
    for name in NAMES:
        c = torch.randn(B, *shape, generator=g, dtype=torch.float64) * 3
        if name == "sqrt":
            c = c.abs() + 0.1
        w = torch.rand(B, *shape, generator=g, dtype=torch.float64)
        l, u = c - w * (0.0 if name == "sqrt" else 0.5), c + w
        A = torch.randn(B, S, *shape, generator=g, dtype=torch.float64)
        (a_in,), bias = ops.get(name).backward(None, A, [(l, u)], [shape])
        assert a_in.shape == A.shape and bias.shape == (B, S)
        for _ in range(50):
            x = l + (u - l) * torch.rand(l.shape, generator=g, dtype=torch.float64)
            lhs = ops.sum_rest(A * TORCH_F[name](x).unsqueeze(1))
            rhs = bias + ops.sum_rest(a_in * x.unsqueeze(1))
            assert (rhs <= lhs + 1e-12).all()


# ---------------------------------------------------------------- the alpha family
ALPHA_NAMES = ("gelu", "gelu_tanh", "tanh", "sigmoid")


@pytest.mark.parametrize("name", ALPHA_NAMES)
def test_alpha_lower_planes_sound(name):
    """Every alpha in [0, 1] gives a sound lower plane (alpha-CROWN may pick any): float64
    on 2000 points per box, mpmath at the ends and the closest points."""
    l, u = random_boxes(name, 30, seed=11)
    l, u = l[:, None], u[:, None]
    alpha = torch.cat([torch.zeros(30, 1), torch.ones(30, 1), torch.rand(30, 3, generator=torch.Generator().manual_seed(2))],
                      1).double()
    lw, lb, uw, ub = ops.get(name).planes(l, u, alpha)
    assert lw.shape == (30, 5) and uw.shape == (30, 5)
    assert not torch.isnan(torch.stack([lw, lb])).any()
    t = torch.rand(1998, 1, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x = torch.cat([l[None], u[None], l + (u - l) * t]).clamp(l, u).expand(-1, -1, 5)
    fx = TORCH_F[name](x)
    plo = lw * x + lb
    tol = 4e-16 * (1 + fx.abs() + (lw * x).abs() + lb.abs())
    assert (plo <= fx + tol).all()
    close = (fx - plo).argmin(0)
    for j in range(30):
        for k in range(5):
            for i in {0, 1, int(close[j, k])}:
                xv = x[i, j, k]
                fv = mp_f(name, xv)
                assert fv >= mpmath.mpf(float(lw[j, k])) * mpmath.mpf(float(xv)) + mpmath.mpf(float(lb[j, k]))


@pytest.mark.parametrize("name", ALPHA_NAMES)
@given(c=finite, lw10=log_width, a=frac, t=frac)
def test_alpha_planes_sound_property(name, c, lw10, a, t):
    w = 10.0**lw10
    l, u = c - w / 2, c + w / 2
    lt, ut = torch.tensor([l], dtype=torch.float64), torch.tensor([u], dtype=torch.float64)
    lw, lb, uw, ub = ops.get(name).planes(lt, ut, torch.tensor([a], dtype=torch.float64))
    for x in {l, u, min(max(l + t * (u - l), l), u)}:
        assert_plane_mp(name, x, lw[0], lb[0], uw[0], ub[0])


@pytest.mark.parametrize("name", ALPHA_NAMES)
def test_slope_init_gives_the_default_planes_and_gradients(name):
    op = ops.get(name)
    g = torch.Generator().manual_seed(4)
    l = torch.randn(2, 7, 3, generator=g, dtype=torch.float64) * 3
    u = l + torch.rand(2, 7, 3, generator=g, dtype=torch.float64) * 3
    a0 = op.slope_init(l, u)
    assert a0.shape == l.shape and ((a0 >= 0) & (a0 <= 1)).all()
    alpha = a0.unsqueeze(1).expand(2, 4, 7, 3).clone().requires_grad_(True)
    lw, lb, uw, ub = op.planes(l.unsqueeze(1), u.unsqueeze(1), alpha)
    dlw, dlb, duw, dub = op.planes(l.unsqueeze(1), u.unsqueeze(1))
    torch.testing.assert_close(lw, dlw.expand_as(lw), rtol=0, atol=1e-12)
    torch.testing.assert_close(lb, dlb.expand_as(lb), rtol=0, atol=1e-11)
    torch.testing.assert_close(ub, dub.expand_as(ub))
    (lw * (l + u).unsqueeze(1) / 2 + lb).sum().backward()
    assert torch.isfinite(alpha.grad).all() and alpha.grad.abs().sum() > 0


def test_alpha_with_infinite_ends_keeps_the_constant_planes():
    inf = math.inf
    l = torch.tensor([-inf, -1.0, 0.0], dtype=torch.float64)
    u = torch.tensor([1.0, inf, 2.0], dtype=torch.float64)
    for name in ALPHA_NAMES:
        lw, lb, _, _ = ops.get(name).planes(l, u, torch.full((3,), 0.3, dtype=torch.float64))
        d = ops.get(name).planes(l, u)
        assert not torch.isnan(torch.stack([lw, lb])).any()
        assert lw[0] == d[0][0] and lb[0] == d[1][0] and lw[1] == d[0][1] and lb[1] == d[1][1]


def test_empty_box_gives_no_information():
    """l > u (never from the verifier, possible from a caller): 0·x ± inf, never f >= +inf."""
    l, u = torch.tensor([2.0, 1.0], dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)
    for name in NAMES:
        lw, lb, uw, ub = ops.get(name).planes(l, u)
        assert (lw[0], lb[0], uw[0], ub[0]) == (0.0, -math.inf, 0.0, math.inf)
        assert torch.isfinite(torch.stack([lw[1], lb[1], uw[1], ub[1]])).all()
        if name != "sqrt":
            lw, lb, _, _ = ops.get(name).planes(l, u, torch.tensor([0.5, 0.5], dtype=torch.float64))
            assert (lw[0], lb[0]) == (0.0, -math.inf)
