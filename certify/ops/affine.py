"""Affine operators: forward map, exact adjoint (transpose) and interval radius |M| r.

For y = M x + b the backward step maps coefficients A on y (shape (B, S, *y.shape)) to A M
on x and adds A·b to the bias (B, S). Every adjoint is the exact transpose of its map
(tests/test_certify_operators.py checks <A, M x> = <adjoint(A), x> on random tensors).
The interval of y is M·centre ± |M|·radius, except where an operator gives its own rule.
Sound arithmetic (``certify.ops.core.Affine``): the backward step charges its rounding error
through the interval of the symmetric box, so every ``radius`` here must be |M| r exactly
(or an upper bound) and every ``exact`` rule must round outward; ``exact_adjoint`` marks the
pure data movements (reshape, transpose, copies), whose adjoint rounds nothing.
"""
from __future__ import annotations

import torch

from softcert.certify.ops.core import Affine, Input, down, is_sound, register, sum_rest, up

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
    lo, hi = ins[0][0] + ins[1][0], ins[0][1] + ins[1][1]
    return (down(lo), up(hi)) if is_sound() else (lo, hi)


register(Affine(name="add", description="x + y (residual connection)", inputs=2,
                apply=lambda p, xs, c: xs[0] + xs[1], adjoint=lambda p, A, c: ([A, A], _zero(A)),
                exact=_add_interval, exact_adjoint=True))

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
                adjoint=lambda p, A, c: ([_merge(A)], _zero(A)), exact_adjoint=True))

register(Affine(name="merge_heads", description="(h, N, d/h) -> (N, d)",
                apply=lambda p, xs, c: _merge(xs[0]),
                adjoint=lambda p, A, c: ([_split(A, p["heads"])], _zero(A)), exact_adjoint=True))

register(Affine(name="transpose", description="swap the last two axes",
                apply=lambda p, xs, c: xs[0].transpose(-1, -2),
                adjoint=lambda p, A, c: ([A.transpose(-1, -2)], _zero(A)), exact_adjoint=True))

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
    if is_sound():
        lo, hi = down(lo), up(hi)
    zero = torch.zeros_like(const, dtype=l.dtype)
    return lo.scatter(-1, const, zero), hi.scatter(-1, const, zero)


register(Affine(name="softmax_shift",
                description="y_j = x_j - x_j* for a per-row key j* (const; default the argmax); softmax(y) = softmax(x)",
                apply=_shift, adjoint=_shift_adjoint, exact=_shift_interval,
                anchor=lambda x: x.argmax(-1, keepdim=True)))

register(Affine(name="sum_last", description="sum over the last axis (keepdim)",
                apply=lambda p, xs, c: xs[0].sum(-1, keepdim=True),
                adjoint=lambda p, A, c: ([A.expand(*A.shape[:-1], p["n"])], _zero(A)), exact_adjoint=True))

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
                apply=lambda p, xs, c: xs[0][:, p["index"]], adjoint=_select_adjoint, exact_adjoint=True))


# ---------------------------------------------------------------- generic operators of traced graphs
# Node shapes are full traced shapes; run-time tensors carry one more leading (batch) axis
# and coefficients A two more (batch, specification).


def _sum_to(t, shape, lead):
    """Sum t (*lead dims, *bshape) down to (*lead dims, *shape) over broadcast axes."""
    extra = t.dim() - lead - len(shape)
    if extra:
        t = t.sum(dim=tuple(range(lead, lead + extra)))
    dims = tuple(i + lead for i, s in enumerate(shape) if s == 1 and t.shape[i + lead] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


register(Affine(name="reshape", description="x viewed with another shape (same elements, same order)",
                apply=lambda p, xs, c: xs[0].reshape(xs[0].shape[0], *p["to"]),
                adjoint=lambda p, A, c: ([A.reshape(*A.shape[:2], *p["in_shape"])], _zero(A)),
                exact_adjoint=True))


def _gather(p, xs, const):
    x = xs[0].flatten(1)
    idx = p["index"]
    if p["padded"]:
        x = torch.cat([x, x.new_zeros(x.shape[0], 1)], 1)
    return x[:, idx.flatten()].reshape(x.shape[0], *idx.shape)


def _gather_adjoint(p, A, const):
    n = p["numel"] + bool(p["padded"])
    flat = A.new_zeros(*A.shape[:2], n)
    flat.index_add_(2, p["index"].flatten(), A.flatten(2))
    if p["padded"]:
        flat = flat[..., :-1]
    return [flat.reshape(*A.shape[:2], *p["in_shape"])], _zero(A)


register(Affine(name="gather", description="y.flat[i] = x.flat[index[i]] (index -1: the constant 0); every "
                "slice, select, permute, expand, unfold or im2col of a tensor is one",
                apply=_gather, adjoint=_gather_adjoint))


def _mul_const(p, xs, const):
    return xs[0] * p["value"]


register(Affine(name="mul_const", description="x · c, c a constant tensor broadcastable to x's shape",
                apply=_mul_const,
                adjoint=lambda p, A, c: ([A * p["value"]], _zero(A)),
                radius=lambda p, r: r * p["value"].abs()))

register(Affine(name="add_const", description="x + c, c a constant tensor broadcastable to x's shape",
                apply=lambda p, xs, c: xs[0] + p["value"],
                adjoint=lambda p, A, c: ([A], sum_rest(A * p["value"].expand(A.shape[2:]))),
                radius=lambda p, r: r))


def _matmul_const(p, xs, const):
    return xs[0] @ p["M"] if p["right"] else p["M"] @ xs[0]


def _matmul_const_adjoint(p, A, const):
    M = p["M"]
    a = A @ M.transpose(-1, -2) if p["right"] else M.transpose(-1, -2) @ A
    return [_sum_to(a, p["in_shape"], 2)], _zero(A)


register(Affine(name="matmul_const", description="x @ M (right) or M @ x (left), M a constant matrix or stack",
                apply=_matmul_const, adjoint=_matmul_const_adjoint,
                radius=lambda p, r: r @ p["M"].abs() if p["right"] else p["M"].abs() @ r))


def _reduce_dims(p, x):
    dims = tuple(d + 1 for d in p["dims"])
    y = x.sum(dim=dims, keepdim=p["keepdim"])
    return y / p["count"] if p["mean"] else y


def _reduce_adjoint(p, A, const):
    a = A
    if not p["keepdim"]:
        for d in sorted(p["dims"]):
            a = a.unsqueeze(d + 2)
    a = a.expand(*A.shape[:2], *p["in_shape"])
    return [a / p["count"] if p["mean"] else a], _zero(A)


register(Affine(name="reduce", description="sum or mean over the axes `dims` (keepdim or not)",
                apply=lambda p, xs, c: _reduce_dims(p, xs[0]), adjoint=_reduce_adjoint))


def _cat(p, xs, const):
    parts, it = [], iter(xs)
    for piece in p["pieces"]:
        parts.append(next(it) if piece is None else piece.expand(xs[0].shape[0], *piece.shape))
    return torch.cat(parts, dim=p["dim"] + 1)


def _cat_adjoint(p, A, const):
    out, bias, start = [], _zero(A), 0
    for piece, size in zip(p["pieces"], p["sizes"]):
        part = A.narrow(p["dim"] + 2, start, size)
        start += size
        if piece is None:
            out.append(part)
        else:
            bias = bias + sum_rest(part * piece)
    return out, bias


def _cat_interval(p, ins, const):
    lo, hi, it = [], [], iter(ins)
    b = ins[0][0].shape[0]
    for piece in p["pieces"]:
        if piece is None:
            l, u = next(it)
        else:
            l = u = piece.expand(b, *piece.shape)
        lo.append(l)
        hi.append(u)
    return torch.cat(lo, dim=p["dim"] + 1), torch.cat(hi, dim=p["dim"] + 1)


register(Affine(name="cat", description="concatenation along `dim` of the inputs and constant pieces (a "
                "class token, padding) in the order of `pieces` (None: the next input)",
                apply=_cat, adjoint=_cat_adjoint, exact=_cat_interval, inputs=-1))


def _inverse(dims):
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d] = i
    return inv


register(Affine(name="permute", description="the axes of x reordered as `dims`",
                apply=lambda p, xs, c: xs[0].permute(0, *(d + 1 for d in p["dims"])),
                adjoint=lambda p, A, c: ([A.permute(0, 1, *(d + 2 for d in _inverse(p["dims"])))], _zero(A)),
                exact_adjoint=True))
