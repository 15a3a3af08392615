"""Products of two perturbed tensors: elementwise ``mul`` and ``matmul``.

The backward step uses McCormick planes (Shi et al. 2020):
  x·y >= y_l x + x_l y - x_l y_l,   x·y <= y_u x + x_l y - x_l y_u,
choosing per coefficient sign the plane on the safe side. Intervals: the four corner
products (mul), centre-radius interval matrix product (matmul).
"""
from __future__ import annotations

import torch

from certify.ops.core import Bilinear, register, sum_rest


def _sum_to(t, shape):
    """Sum the broadcast dims of t (B, S, *bshape) down to (B, S, *shape)."""
    extra = t.dim() - 2 - len(shape)
    if extra:
        t = t.sum(dim=tuple(range(2, 2 + extra)))
    dims = tuple(i + 2 for i, s in enumerate(shape) if s == 1 and t.shape[i + 2] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def mccormick_mul(A, xb, yb, x_shape, y_shape):
    """Lower-bound step for z = x ⊙ y (broadcasting): returns ([A_x, A_y], bias)."""
    (xl, _), (yl, yu) = xb, yb
    xl, yl, yu = xl.unsqueeze(1), yl.unsqueeze(1), yu.unsqueeze(1)
    ap, an = A.clamp(min=0), A.clamp(max=0)
    ax = _sum_to(ap * yl + an * yu, x_shape)
    ay = _sum_to(A * xl, y_shape)
    bias = -sum_rest(ap * xl * yl + an * xl * yu)
    return [ax, ay], bias


def mccormick_matmul(A, xb, yb, x_shape, y_shape):
    """Lower-bound step for Z = X @ Y (X (.., n, k), Y (.., k, m)) with McCormick planes."""
    (xl, _), (yl, yu) = xb, yb
    xl, yl, yu = xl.unsqueeze(1), yl.unsqueeze(1), yu.unsqueeze(1)
    ap, an = A.clamp(min=0), A.clamp(max=0)
    ax = ap @ yl.transpose(-1, -2) + an @ yu.transpose(-1, -2)
    ay = xl.transpose(-1, -2) @ A
    bias = -sum_rest(ap * (xl @ yl) + an * (xl @ yu))
    return [ax, ay], bias


def interval_mul(xb, yb):
    (xl, xu), (yl, yu) = xb, yb
    c = torch.stack([xl * yl, xl * yu, xu * yl, xu * yu])
    c = torch.nan_to_num(c, nan=0.0, posinf=torch.inf, neginf=-torch.inf)  # 0·inf: the 0 factor wins
    return c.min(0).values, c.max(0).values


def interval_matmul(xb, yb):
    (xl, xu), (yl, yu) = xb, yb
    xc, xr = (xl + xu) / 2, (xu - xl) / 2
    yc, yr = (yl + yu) / 2, (yu - yl) / 2
    mid = xc @ yc
    rad = xr @ yc.abs() + xc.abs() @ yr + xr @ yr
    return mid - rad, mid + rad


register(Bilinear(name="mul", description="x ⊙ y (broadcasting)", fn=lambda x, y: x * y,
                  image=interval_mul, relax=mccormick_mul))
register(Bilinear(name="matmul", description="X @ Y over the last two axes", fn=lambda x, y: x @ y,
                  image=interval_matmul, relax=mccormick_matmul))
