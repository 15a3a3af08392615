"""Products of two perturbed tensors, ``mul`` and ``matmul``, with optimisable McCormick planes.

For x in [x_l, x_u], y in [y_l, y_u] the McCormick planes (McCormick 1976; Shi et al. 2020)
  L1 = y_l x + x_l y - x_l y_l,  L2 = y_u x + x_u y - x_u y_u   (x·y >= both),
  U1 = y_u x + x_l y - x_l y_u,  U2 = y_l x + x_u y - x_u y_l   (x·y <= both)
give the families x·y >= alpha L1 + (1 - alpha) L2 and x·y <= alpha U1 + (1 - alpha) U2,
alpha in [0, 1] (every convex combination of valid planes is valid). A coefficient of one
sign uses one side only, so one alpha per output element serves both: the lower family
where the coefficient is >= 0, the upper one where it is < 0. alpha = 1 is the CROWN
choice (L1 and U1, the planes used before alpha existed). For ``matmul`` an alpha of the
coefficient's shape (B, S, ..., n, m) is shared by the k products X_ik Y_kj of output element
(i, j); an alpha of shape (B, S, ..., n, k, m) gives each product its own (``alpha_init``'s
default: k times the memory, and on mnist-vit1 alpha-CROWN's lowest margin on image 18 at
eps 0.01 moved from -0.288 to -0.261; docs/certify/bab.notes.md).

Soundness under rounding (the contract of ``certify.ops.core``): the returned (new, bias)
satisfy A·(x∘y) >= Σ new·in + bias for every real input in the boxes.
- ``mul``: per element the slopes a = alpha y_l + (1 - alpha) y_u, b = alpha x_l + (1 -
  alpha) x_u are any floats; x y - a x - b y is bilinear, so its min (max) over the box is
  at one of the 4 corners: the intercept is that corner value rounded outward. The step's
  own products and sums are charged as γ_{N+3} Σ|A|(|a| max|x| + |b| max|y| + |c|).
- ``matmul``: the planes are the exact real combinations; the float error of the whole step
  (the coefficient matmuls, fl(1 - alpha), the bias) is at most
  (γ_{m+4} + γ_{n+4} + γ_{k+N+8}) Σ|A| (max|X| @ max|Y|) (Higham, Thm 3.5, for each
  matmul; the coefficient errors are weighted by max|in| over the box), charged into the
  bias. (Per-product corners would need the (n, k, m) tensor this avoids.)
Intervals: corner products rounded outward (mul); centre-radius with the centre's rounding
folded into the radius and the matmul errors charged (matmul).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from softcert.certify.ops.core import Bilinear, all_finite, down, per_spec, register, sum_rest, up
from softcert.kernels.floating import SUBNORMAL_ULP, U64, gamma

U = U64
#: absolute allowance per unit of Σ max|in| for products that underflow (each off by at most
#: SUBNORMAL_ULP ~ 4.9e-324; any count below 1e20 of them stays far below this)
ABS = 1e-300


@dataclass(frozen=True, kw_only=True)
class OptimisableBilinear(Bilinear):
    """A ``Bilinear`` whose ``relax(A, xb, yb, x_shape, y_shape, alpha)`` takes the McCormick
    interpolation ``alpha``, range ``alpha_range``; ``alpha_init(batch, shape, in_shapes)``
    is the CROWN choice (ones) of shape (batch, *shape) on ``device``, or, with ``per_product``,
    one per product of a matrix product: (batch, ..., n, k, m) for inputs (.., n, k) and (.., k, m)."""

    alpha_range: tuple = (0.0, 1.0)
    per_product: bool = False

    def backward(self, node, A, ins, shapes, const=None, alpha=None):
        return self.relax(A, ins[0], ins[1], shapes[0], shapes[1], alpha)

    def alpha_init(self, batch, shape, in_shapes=None, device=None):
        if self.per_product and in_shapes is not None:
            shape = (*shape[:-1], in_shapes[0][-1], shape[-1])
        return torch.ones(batch, *shape, dtype=torch.float64, device=device)

    @property
    def optimisable(self):
        return True

    def initial_params(self, node, ins, shapes, specs, per_product=True):
        init = self.alpha_init(ins[0][0].shape[0], node.shape, shapes if per_product else None, ins[0][0].device)
        return per_spec(init, specs, *self.alpha_range)


def _sum_to(t, shape):
    """Sum the broadcast dims of t (B, S, *bshape) down to (B, S, *shape)."""
    extra = t.dim() - 2 - len(shape)
    if extra:
        t = t.sum(dim=tuple(range(2, 2 + extra)))
    dims = tuple(i + 2 for i, s in enumerate(shape) if s == 1 and t.shape[i + 2] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def _absmax(b):
    lo, hi = b
    return torch.maximum(lo.abs(), hi.abs())


def _times(a, b):
    # 0·inf = 0: a zero coefficient takes nothing from an unbounded input
    return torch.where(a == 0, 0.0, a * b)


def _corner(x, y, a, b):
    """(float, error bound) of x y - a x - b y at float x, y."""
    xy, ax, by = x * y, a * x, b * y
    return xy - ax - by, 3 * U * (xy.abs() + ax.abs() + by.abs()) + 3 * SUBNORMAL_ULP


def mul_planes(xb, yb, alpha=None):
    """Per element ((a_lo, b, c_lo), (a_hi, b, c_hi)): a x + b y + c is below (above) x·y on
    the box, c certified at the corners. Shapes broadcast (boxes (B, 1, ...), alpha (B, S, ...))."""
    (xl, xu), (yl, yu) = xb, yb
    if alpha is None:
        alpha = torch.ones((), dtype=xl.dtype, device=xl.device)
    beta = 1 - alpha
    a_lo, a_hi = alpha * yl + beta * yu, alpha * yu + beta * yl
    b = alpha * xl + beta * xu
    c_lo = c_hi = None
    for x in (xl, xu):
        for y in (yl, yu):
            v, e = _corner(x, y, a_lo, b)
            lo = v - (e * (1 + 4 * U) + 4 * U * v.abs())
            c_lo = lo if c_lo is None else torch.minimum(c_lo, lo)
            v, e = _corner(x, y, a_hi, b)
            hi = v + (e * (1 + 4 * U) + 4 * U * v.abs())
            c_hi = hi if c_hi is None else torch.maximum(c_hi, hi)
    return (a_lo, b, c_lo), (a_hi, b, c_hi)


def mccormick_mul(A, xb, yb, x_shape, y_shape, alpha=None):
    """Lower-bound step for z = x ⊙ y (broadcasting): returns ([A_x, A_y], bias)."""
    xb = tuple(t.unsqueeze(1) for t in xb)
    yb = tuple(t.unsqueeze(1) for t in yb)
    (a_lo, b, c_lo), (a_hi, _, c_hi) = mul_planes(xb, yb, alpha)
    pos = A >= 0
    a, c = torch.where(pos, a_lo, a_hi), torch.where(pos, c_lo, c_hi)
    ax = _sum_to(A * a, x_shape)
    ay = _sum_to(A * b, y_shape)
    W = A.abs()
    size = W[0, 0].numel()
    xm, ym = _absmax(xb), _absmax(yb)
    load = sum_rest(_times(W, a.abs() * xm + b.abs() * ym + c.abs()))
    g = gamma(size + 3)
    floor = ABS * (1 + sum_rest(_times(W, 1 + xm + ym)))
    charge = load * (g * (1 + 2 * g)) + floor
    return [ax, ay], sum_rest(A * c) - charge


def mccormick_matmul(A, xb, yb, x_shape, y_shape, alpha=None):
    """Lower-bound step for Z = X @ Y (X (.., n, k), Y (.., k, m)) with the planes of the
    module docstring: alpha None (1: L1 / U1), one per output element (A's shape) or one per
    product (A's shape with k inserted before the last axis)."""
    (xl, xu), (yl, yu) = (tuple(t.unsqueeze(1) for t in b) for b in (xb, yb))
    ap, an = A.clamp(min=0), A.clamp(max=0)
    ylt, yut = yl.transpose(-1, -2), yu.transpose(-1, -2)
    if alpha is not None and alpha.dim() == A.dim() + 1:
        # per product (i, k, j): the same sums as below with k kept apart, so the charge holds
        beta = 1 - alpha
        p, q = ap.unsqueeze(-2), an.unsqueeze(-2)  # (.., n, 1, m)
        yl3, yu3 = yl.unsqueeze(-3), yu.unsqueeze(-3)  # (.., 1, k, m)
        xl3, xu3 = xl.unsqueeze(-1), xu.unsqueeze(-1)  # (.., n, k, 1)
        ax = (p * (alpha * yl3 + beta * yu3) + q * (alpha * yu3 + beta * yl3)).sum(-1)
        ay = (A.unsqueeze(-2) * (alpha * xl3 + beta * xu3)).sum(-3)
        per = p * (alpha * (xl3 * yl3) + beta * (xu3 * yu3)) + q * (alpha * (xl3 * yu3) + beta * (xu3 * yl3))
        bias = -sum_rest(per.sum(-2))
    elif alpha is None:
        ax = ap @ ylt + an @ yut
        ay = xl.transpose(-1, -2) @ A
        bias = -sum_rest(ap * (xl @ yl) + an * (xl @ yu))
    else:
        beta = 1 - alpha
        pa, pb, na, nb = ap * alpha, ap * beta, an * alpha, an * beta
        ax = (pa + nb) @ ylt + (pb + na) @ yut
        ay = xl.transpose(-1, -2) @ (A * alpha) + xu.transpose(-1, -2) @ (A * beta)
        bias = -sum_rest(pa * (xl @ yl) + pb * (xu @ yu) + na * (xl @ yu) + nb * (xu @ yl))
    n, k, m = xl.shape[-2], xl.shape[-1], yl.shape[-1]
    size = A[0, 0].numel()
    xm, ym = _absmax((xl, xu)), _absmax((yl, yu))
    xym = xm @ ym
    load = sum_rest(_times(A.abs(), xym))
    g = gamma(m + 4) + gamma(n + 4) + gamma(k + size + 8)
    floor = ABS * (1 + sum_rest(xm) + sum_rest(ym) + sum_rest(xym))
    charge = load * (g * (1 + 2 * gamma(k + size + 2))) + floor
    return [ax, ay], bias - charge


def interval_mul(xb, yb):
    """The four corner products (each correctly rounded), one ulp outward."""
    (xl, xu), (yl, yu) = xb, yb
    c = torch.stack([xl * yl, xl * yu, xu * yl, xu * yu])
    if not all_finite(c):  # skipped where it is the identity (values and gradients alike)
        c = torch.nan_to_num(c, nan=0.0, posinf=torch.inf, neginf=-torch.inf)  # 0·inf: the 0 factor wins
    lo, hi = c.min(0).values, c.max(0).values
    return down(lo), up(hi)


def interval_matmul(xb, yb):
    """Centre-radius: X Y in Xc Yc ± (|Xc| Yr + Xr |Yc| + Xr Yr) with Xr >= max(Xu - Xc,
    Xc - Xl) rounded up (so the box is enclosed whatever Xc's rounding), and the float error
    of the four matmuls and two sums, γ_{k+4} of (|Xc| + Xr)(|Yc| + Yr), charged outward."""
    (xl, xu), (yl, yu) = xb, yb

    def centre_radius(lo, hi):
        c = (lo + hi) / 2
        r = torch.maximum(hi - c, c - lo)
        return c, up(r)
    xc, xr = centre_radius(xl, xu)
    yc, yr = centre_radius(yl, yu)
    mid = xc @ yc
    rad = xr @ yc.abs() + xc.abs() @ yr + xr @ yr
    k = xl.shape[-1]
    scale = (xc.abs() + xr) @ (yc.abs() + yr)
    err = scale * (gamma(k + 4) * (1 + 2 * gamma(k + 2))) + ABS * (1 + k)
    lo, hi = mid - rad - err, mid + rad + err
    # the last two sums: 2u relative
    lo, hi = lo - 2 * U * lo.abs(), hi + 2 * U * hi.abs()
    return down(lo), up(hi)


register(OptimisableBilinear(name="mul", description="x ⊙ y (broadcasting)", fn=lambda x, y: x * y,
                             image=interval_mul, relax=mccormick_mul))
register(OptimisableBilinear(name="matmul", description="X @ Y over the last two axes",
                             fn=lambda x, y: x @ y, image=interval_matmul, relax=mccormick_matmul,
                             per_product=True))
