"""Forward evaluation and adjoints (transposes) of the affine primitives.

For an affine node y = M x + b the backward step of linear bound propagation maps the
coefficients A on y (shape (B, S, *y.shape)) to A M on x and adds A·b to the bias (B, S).
Every adjoint here is the exact transpose of its forward map: tests check
<A, M x> = <Aᵀ-map(A), x> on random tensors.
"""
from __future__ import annotations

import torch


def sum_rest(t, keep=2):
    """Sum over every dim after the first ``keep`` ones."""
    return t.flatten(keep).sum(-1) if t.dim() > keep else t


def _split(x, h):
    *lead, n, d = x.shape
    return x.reshape(*lead, n, h, d // h).transpose(-3, -2)


def _merge(x):
    *lead, h, n, dh = x.shape
    return x.transpose(-3, -2).reshape(*lead, n, h * dh)


def forward(node, xs, const=None):
    """Evaluate ``node`` on concrete inputs ``xs`` (batch first). ``const``: softmax shift."""
    op, p = node.op, node.params
    x = xs[0] if xs else None
    if op == "linear":
        y = x @ p["W"].T
        return y if p["b"] is None else y + p["b"]
    if op == "add":
        return xs[0] + xs[1]
    if op == "bias":
        return x + p["value"]
    if op == "prepend":
        tok = p["token"].expand(x.shape[0], 1, -1)
        return torch.cat([tok, x], dim=1)
    if op == "split_heads":
        return _split(x, p["heads"])
    if op == "merge_heads":
        return _merge(x)
    if op == "transpose":
        return x.transpose(-1, -2)
    if op == "scale":
        return x * p["factor"]
    if op == "softmax_shift":
        idx = x.argmax(-1, keepdim=True) if const is None else const
        return x - x.gather(-1, idx)
    if op == "sum_last":
        return x.sum(-1, keepdim=True)
    if op == "mean_last":
        return x.mean(-1, keepdim=True) + p["add"]
    if op == "center":
        return x - x.mean(-1, keepdim=True)
    if op == "mean_tokens":
        return x.mean(-2)
    if op == "select_token":
        return x[:, p["index"]]
    if op == "relu":
        return torch.relu(x)
    if op == "exp":
        return torch.exp(x)
    if op == "reciprocal":
        return 1.0 / x
    if op == "square":
        return x * x
    if op == "rsqrt":
        return torch.rsqrt(x)
    if op == "mul":
        return xs[0] * xs[1]
    if op == "matmul":
        return xs[0] @ xs[1]
    raise ValueError(f"op: no forward for {op!r}")


def adjoint(node, A, const=None):
    """Backward step through an affine node: returns ([A per input], bias (B, S))."""
    op, p = node.op, node.params
    zero = A.new_zeros(A.shape[:2])
    if op == "linear":
        bias = zero if p["b"] is None else A @ p["b"]
        return [A @ p["W"]], sum_rest(bias)
    if op == "add":
        return [A, A], zero
    if op == "bias":
        return [A], sum_rest(A * p["value"])
    if op == "prepend":
        return [A[..., 1:, :]], sum_rest(A[..., 0, :] * p["token"])
    if op == "split_heads":
        return [_merge(A)], zero
    if op == "merge_heads":
        return [_split(A, p["heads"])], zero
    if op == "transpose":
        return [A.transpose(-1, -2)], zero
    if op == "scale":
        return [A * p["factor"]], zero
    if op == "softmax_shift":
        # y_j = x_j - x_j*: A·y = A·x - (Σ_j A_j) x_j*
        idx = const.unsqueeze(1).expand(*A.shape[:-1], 1)
        return [A.scatter_add(-1, idx, -A.sum(-1, keepdim=True))], zero
    if op == "sum_last":
        n = node.params["n"]
        return [A.expand(*A.shape[:-1], n)], zero
    if op == "mean_last":
        n = node.params["n"]
        return [A.expand(*A.shape[:-1], n) / n], sum_rest(A * p["add"])
    if op == "center":
        return [A - A.mean(-1, keepdim=True)], zero
    if op == "mean_tokens":
        n = node.params["n"]
        return [A.unsqueeze(-2).expand(*A.shape[:-1], n, A.shape[-1]) / n], zero
    if op == "select_token":
        n = node.params["n"]
        out = A.new_zeros(*A.shape[:-1], n, A.shape[-1])
        out[..., p["index"], :] = A
        return [out], zero
    raise ValueError(f"op: {op!r} is not affine")
