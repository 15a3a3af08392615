"""The model as a list of registered operators (``certify.ops``), built module by module.

Each ``ViT`` submodule is lowered to a few nodes in topological order: affine maps (Linear,
positional and class-token constants, head split/merge, transpose, scaling, sums, means,
pooling), elementwise nonlinearities (relu, exp, reciprocal, square, rsqrt) and bilinear
products (elementwise ``mul``, ``matmul``); every node names a registered operator. Softmax is
exp(y) · 1/Σexp(y) with y_j = s_j - s_j* for a per-row key j* (the argmax at the
box centre; softmax is shift invariant, so any j* is exact, and y_j* = 0 keeps Σexp(y) >= 1); LayerNorm is centring, square, mean,
rsqrt and a product. Shapes exclude the batch dimension.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from certify import ops
from certify.models import ViT, check_supported


@dataclass
class Node:
    """One operator application. ``value_range`` (lo, hi): a fact about this node's value
    known from the structure of the graph (e.g. a softmax probability lies in [0, 1]);
    bounds are clipped to it, as to the operator's own ``value_range``."""

    op: str
    inputs: tuple
    shape: tuple
    params: dict = field(default_factory=dict)
    name: str = ""
    value_range: tuple = (None, None)

    @property
    def operator(self) -> ops.Operator:
        return ops.get(self.op)


class Graph:
    """Nodes in topological order; node 0 is the input (flattened patches (N, C·p·p))."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.attention: list[dict] = []  # per block: ids of scores, probabilities, values, P·V

    def add(self, op, inputs, shape, name="", value_range=(None, None), **params):
        """Append a node applying the registered operator ``op``; returns its id."""
        arity = ops.get(op).arity  # -1: any number >= 1
        if (len(inputs) != arity if arity >= 0 else not inputs) or any(not 0 <= j < len(self.nodes) for j in inputs):
            raise ValueError(f"inputs: operator {op!r} at {name!r} takes {arity} earlier node(s), got {tuple(inputs)}")
        self.nodes.append(Node(op, tuple(inputs), tuple(shape), params, name, tuple(value_range)))
        return len(self.nodes) - 1

    @property
    def output(self):
        return len(self.nodes) - 1


def _f64(t):
    return t.detach().to(torch.float64)


def _linear(g, x, lin: nn.Linear, name):
    shape = g.nodes[x].shape[:-1] + (lin.out_features,)
    b = None if lin.bias is None else _f64(lin.bias)
    return g.add("linear", [x], shape, name, W=_f64(lin.weight), b=b)


def _layer_norm(g, x, ln, name):
    if isinstance(ln, nn.Identity):
        return x
    shape = g.nodes[x].shape
    c = g.add("center", [x], shape, f"{name}.center")
    sq = g.add("square", [c], shape, f"{name}.square")
    # mean of squares + eps >= eps > 0: keeps rsqrt defined when the squares overflow
    var = g.add("mean_last", [sq], shape[:-1] + (1,), f"{name}.var", value_range=(float(ln.eps), None),
                add=float(ln.eps), n=shape[-1])
    rs = g.add("rsqrt", [var], shape[:-1] + (1,), f"{name}.rsqrt")
    nrm = g.add("mul", [c, rs], shape, f"{name}.normed")
    return g.add("linear", [nrm], shape, name, W=torch.diag(_f64(ln.weight)), b=_f64(ln.bias))


def _attention(g, x, att, name):
    n, d = g.nodes[x].shape
    h, dh = att.heads, att.dim // att.heads
    q = g.add("split_heads", [_linear(g, x, att.q, f"{name}.q")], (h, n, dh), f"{name}.qh", heads=h)
    k = g.add("split_heads", [_linear(g, x, att.k, f"{name}.k")], (h, n, dh), f"{name}.kh", heads=h)
    v = g.add("split_heads", [_linear(g, x, att.v, f"{name}.v")], (h, n, dh), f"{name}.vh", heads=h)
    kt = g.add("transpose", [k], (h, dh, n), f"{name}.kT")
    s0 = g.add("matmul", [q, kt], (h, n, n), f"{name}.qk")
    s = g.add("scale", [s0], (h, n, n), f"{name}.scores", factor=1.0 / math.sqrt(dh))
    y = g.add("softmax_shift", [s], (h, n, n), f"{name}.shifted")
    e = g.add("exp", [y], (h, n, n), f"{name}.exp")
    # y_j* = 0, so Σ exp(y) = 1 + (terms >= 0) >= 1: keeps 1/Σ defined when exp overflows
    z = g.add("sum_last", [e], (h, n, 1), f"{name}.sum", value_range=(1.0, None), n=n)
    r = g.add("reciprocal", [z], (h, n, 1), f"{name}.recip")
    p = g.add("mul", [e, r], (h, n, n), f"{name}.probs", value_range=(0.0, 1.0))
    o = g.add("matmul", [p, v], (h, n, dh), f"{name}.pv")
    g.attention.append(dict(scores=s, shifted=y, probs=p, values=v, pv=o))
    m = g.add("merge_heads", [o], (n, d), f"{name}.merged", heads=h)
    return _linear(g, m, att.o, f"{name}.out")


def build_graph(model: ViT) -> Graph:
    """Lower a supported ``ViT`` to primitive nodes (float64 parameters)."""
    check_supported(model)
    g = Graph()
    c = model.image[0] * model.patch ** 2
    t = g.add("input", [], (model.tokens, c), "patches")
    t = _linear(g, t, model.embed, "embed")
    if model.cls is not None:
        t = g.add("prepend", [t], (model.tokens + 1, g.nodes[t].shape[-1]), "cls", token=_f64(model.cls))
    t = g.add("bias", [t], g.nodes[t].shape, "pos", value=_f64(model.pos))
    for i, blk in enumerate(model.blocks):
        a = _attention(g, _layer_norm(g, t, blk.norm1, f"blocks.{i}.norm1"), blk.attn, f"blocks.{i}.attn")
        t = g.add("add", [t, a], g.nodes[t].shape, f"blocks.{i}.res1")
        f = _linear(g, _layer_norm(g, t, blk.norm2, f"blocks.{i}.norm2"), blk.fc1, f"blocks.{i}.fc1")
        f = g.add("relu", [f], g.nodes[f].shape, f"blocks.{i}.relu")
        f = _linear(g, f, blk.fc2, f"blocks.{i}.fc2")
        t = g.add("add", [t, f], g.nodes[t].shape, f"blocks.{i}.res2")
    t = _layer_norm(g, t, model.norm, "norm")
    n, d = g.nodes[t].shape
    if model.pool == "mean":
        t = g.add("mean_tokens", [t], (d,), "pool", n=n)
    else:
        t = g.add("select_token", [t], (d,), "pool", index=0, n=n)
    _linear(g, t, model.head, "head")
    return g
