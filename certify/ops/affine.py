"""Affine operators: forward map, exact adjoint (transpose) and interval radius |M| r.

For y = M x + b the backward step maps coefficients A on y (shape (B, S, *y.shape)) to A M
on x and adds A·b to the bias (B, S). Every adjoint is the exact transpose of its map
(tests/test_certify_operators.py checks <A, M x> = <adjoint(A), x> on random tensors).
The interval of y is M·centre ± |M|·radius, except where an operator gives its own rule.
"""
from __future__ import annotations

import torch

from certify.ops.core import Affine, Input, register, sum_rest

register(Input(name="input", description="the perturbed input (its box is given)"))


def _zero(A):
    return A.new_zeros(A.shape[:2])


def _split(x, h):
    *lead, n, d = x.shape
    return x.reshape(*lead, n, h, d // h).transpose(-3, -2)


def _merge(x):
    *lead, h, n, dh = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, h * dh)


def _linear(p, xs, const):
    y = xs[0] @ p["W"].T
    return y if p["b"] is None else y + p["b"]


def _linear_adjoint(p, A, const):
    bias = _zero(A) if p["b"] is None else A @ p["b"]
    return [A @ p["W"]], sum_rest(bias)


register(Affine(name="linear", description="x Wᵀ + b over the last axis",
                apply=_linear, adjoint=_linear_adjoint, radius=lambda p, r: r @ p["W"].abs().T))


def _add_interval(p, ins, const):
    return ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]


register(Affine(name="add", description="x + y (residual connection)", inputs=2,
                apply=lambda p, xs, c: xs[0] + xs[1], adjoint=lambda p, A, c: ([A, A], _zero(A)),
                exact=_add_interval))

register(Affine(name="bias", description="x + a constant tensor (positional embedding)",
                apply=lambda p, xs, c: xs[0] + p["value"],
                adjoint=lambda p, A, c: ([A], sum_rest(A * p["value"])),
                radius=lambda p, r: r))


def _prepend(p, xs, const):
    x = xs[0]
    tok = p["token"].expand(x.shape[0], 1, -1)
    return torch.cat([tok, x], dim=1)


register(Affine(name="prepend", description="a constant token prepended on the token axis (class token)",
                apply=_prepend,
                adjoint=lambda p, A, c: ([A[..., 1:, :]], sum_rest(A[..., 0, :] * p["token"])),
                radius=lambda p, r: torch.cat([torch.zeros_like(r[:, :1]), r], dim=1)))

register(Affine(name="split_heads", description="(N, d) -> (h, N, d/h)",
                apply=lambda p, xs, c: _split(xs[0], p["heads"]),
                adjoint=lambda p, A, c: ([_merge(A)], _zero(A))))

register(Affine(name="merge_heads", description="(h, N, d/h) -> (N, d)",
                apply=lambda p, xs, c: _merge(xs[0]),
                adjoint=lambda p, A, c: ([_split(A, p["heads"])], _zero(A))))

register(Affine(name="transpose", description="swap the last two axes",
                apply=lambda p, xs, c: xs[0].transpose(-1, -2),
                adjoint=lambda p, A, c: ([A.transpose(-1, -2)], _zero(A))))

register(Affine(name="scale", description="x · factor (a Python float)",
                apply=lambda p, xs, c: xs[0] * p["factor"],
                adjoint=lambda p, A, c: ([A * p["factor"]], _zero(A)),
                radius=lambda p, r: r * abs(p["factor"])))


def _shift(p, xs, const):
    x = xs[0]
    idx = x.argmax(-1, keepdim=True) if const is None else const
    return x - x.gather(-1, idx)


def _shift_adjoint(p, A, const):
    # y_j = x_j - x_j*: A·y = A·x - (Σ_j A_j) x_j*
    idx = const.unsqueeze(1).expand(*A.shape[:-1], 1)
    return [A.scatter_add(-1, idx, -A.sum(-1, keepdim=True))], _zero(A)


def _shift_interval(p, ins, const):
    # y_j* = 0 exactly; y_j in [l_j - u_j*, u_j - l_j*]
    (l, u), = ins
    lo, hi = l - u.gather(-1, const), u - l.gather(-1, const)
    zero = torch.zeros_like(const, dtype=l.dtype)
    return lo.scatter(-1, const, zero), hi.scatter(-1, const, zero)


register(Affine(name="softmax_shift",
                description="y_j = x_j - x_j* for a per-row key j* (const; default the argmax); softmax(y) = softmax(x)",
                apply=_shift, adjoint=_shift_adjoint, exact=_shift_interval,
                anchor=lambda x: x.argmax(-1, keepdim=True)))

register(Affine(name="sum_last", description="sum over the last axis (keepdim)",
                apply=lambda p, xs, c: xs[0].sum(-1, keepdim=True),
                adjoint=lambda p, A, c: ([A.expand(*A.shape[:-1], p["n"])], _zero(A))))

register(Affine(name="mean_last", description="mean over the last axis (keepdim) + a constant `add`",
                apply=lambda p, xs, c: xs[0].mean(-1, keepdim=True) + p["add"],
                adjoint=lambda p, A, c: ([A.expand(*A.shape[:-1], p["n"]) / p["n"]], sum_rest(A * p["add"])),
                radius=lambda p, r: r.mean(-1, keepdim=True)))

register(Affine(name="center", description="x - mean(x) over the last axis",
                apply=lambda p, xs, c: xs[0] - xs[0].mean(-1, keepdim=True),
                adjoint=lambda p, A, c: ([A - A.mean(-1, keepdim=True)], _zero(A)),
                # x_i - mean(x): |coefficients| sum to r_i (1 - 2/n) + mean(r)
                radius=lambda p, r: r * (1 - 2 / r.shape[-1]) + r.mean(-1, keepdim=True)))

register(Affine(name="mean_tokens", description="mean over the token axis (mean pooling)",
                apply=lambda p, xs, c: xs[0].mean(-2),
                adjoint=lambda p, A, c: ([A.unsqueeze(-2).expand(*A.shape[:-1], p["n"], A.shape[-1]) / p["n"]],
                                         _zero(A))))


def _select_adjoint(p, A, const):
    out = A.new_zeros(*A.shape[:-1], p["n"], A.shape[-1])
    out[..., p["index"], :] = A
    return [out], _zero(A)


register(Affine(name="select_token", description="one token of the token axis (class-token pooling)",
                apply=lambda p, xs, c: xs[0][:, p["index"]], adjoint=_select_adjoint))
