"""Lowering tensor programs onto the verifier's graph of registered operators.

``Builder`` is the one place where a front end (``certify.trace`` for torch.export graphs,
the ONNX reader) turns a tensor operation into nodes of ``certify.graph.Graph``. A value is
either a node id (``int``: it depends on the perturbed input) or a ``torch.Tensor`` (a
constant). An operation whose operands are all constants is evaluated on the spot (constant
folding), so masks, position ids and class tokens never reach the verifier.

Shapes are the full traced shapes (the model's own batch axis included, size 1 in a trace);
at run time every node value carries one more leading axis, the batch of input boxes.
Compound operations are lowered to primitives whose relaxations are known:
- softmax(x)_k = σ(y_k - log Σ_{j≠k} exp(y_j)), y = x - x_j* for a per-row key j*
  (``softmax_shift``; softmax is shift invariant, so the lowering is exact); masked rows,
  and ``softmax_form("product")``, keep exp(y) · 1/Σ exp(y) (Σ exp(y) >= 1);
- LayerNorm(x) = (x - mean x) · rsqrt(mean (x - mean x)² + eps) · w + b; the normalised
  values lie in [-sqrt(n - 1), sqrt(n - 1)] (``normed_bound``), a value range of their node;
- BatchNorm in eval: a per-channel x · s + t with s, t computed from the running statistics;
- attention (scaled_dot_product_attention, MultiheadAttention): softmax(Q Kᵀ · scale + mask) V,
  recorded in ``Graph.attention`` so Vertex-Softmax can bound the P·V term exactly.
Anything that only moves elements (view, permute, slice, select, expand, unfold, im2col,
flip...) becomes one ``reshape`` or ``gather`` node whose index map is computed by applying
the operation itself to the tensor of element positions, so it is exact by construction.
Constants live on one device: the model's weights where the model is, and every constant made
here (index maps, masks, numbers) on the lowering device (``lowering_device``, the traced
input's; ``Builder.device``), so folding never mixes devices and the graph runs where its input is.
"""
from __future__ import annotations

import contextvars
import dataclasses
import math
from collections.abc import Callable

import torch

from softcert.certify.graph import AttentionSite, Graph
from softcert.certify.ops.context import context_setting

F64 = torch.float64
# a finite stand-in for the -inf of an attention mask before exp; the masked probabilities
# are then multiplied by an exact 0, so the value never matters (and Vertex is not used there)
MASK_PENALTY = -1e30

#: how an unmasked softmax is lowered (``softmax_form``): "sigmoid" (default) or "product"
SOFTMAX_FORMS = ("sigmoid", "product")
_SOFTMAX_FORM = contextvars.ContextVar("certify_softmax_form", default="sigmoid")
_DEVICE = contextvars.ContextVar("certify_lowering_device", default="cpu")


def lowering_device(device):
    """Within the block, constants made by the lowering (``const`` of a number, index maps,
    masks) are created on ``device`` (default: the CPU); ``certify.trace`` sets the traced
    input's."""
    return context_setting(_DEVICE, torch.device(device))


def softmax_form(form):
    """Within the block, graphs are built with the softmax lowering ``form`` (see
    ``Builder.softmax``); "product" was the default before session 7 (2026-12-03), kept to measure what
    the default buys. Graphs already traced (``certify.graph_cache.graph_of`` caches by form) keep theirs."""
    if form not in SOFTMAX_FORMS:
        raise ValueError(f"softmax_form: expected one of {', '.join(SOFTMAX_FORMS)}, got {form!r}")
    return context_setting(_SOFTMAX_FORM, form)


def current_softmax_form() -> str:
    return _SOFTMAX_FORM.get()


def is_const(v) -> bool:
    return isinstance(v, torch.Tensor)


def const(t):
    """A constant operand as a tensor (float64 when floating); a tensor keeps its device, a
    number is created on the lowering device (``lowering_device``)."""
    if isinstance(t, float):
        return torch.tensor(t, dtype=F64, device=_DEVICE.get())  # not via float32, torch's default dtype
    # parameters: the graph holds values, not autograd history
    t = t.detach() if isinstance(t, torch.Tensor) else torch.as_tensor(t, device=_DEVICE.get())
    return t.to(F64) if t.is_floating_point() else t



def normed_bound(n: int) -> float:
    """r >= |c_i| / sqrt(mean c² + eps) for every c of n entries with sum 0 (c = x - mean x)
    and eps > 0: c_i² <= (n - 1)/n · Σ c² (Σ_{j≠i} c_j = -c_i and Cauchy-Schwarz give
    c_i² <= (n - 1) Σ_{j≠i} c_j²), so the ratio is below sqrt(n - 1). Real arithmetic; the
    factor 1 + 1e-6 leaves room for the rounding of a computed LayerNorm (ratios within a few
    ulps of the bound), which the IBP of the product (center · rsqrt) loses: its width grows
    with the input box without limit, this bound does not."""
    return math.sqrt(n - 1) * (1 + 1e-6)

class Builder:
    """Appends nodes to ``self.graph``; every method takes values (node id or constant
    tensor) and returns a value. ``name``: the module path that produced the operation,
    carried into nodes and error messages."""

    def __init__(self):
        self.graph = Graph()
        self.device = torch.device(_DEVICE.get())  # where the constants made here live (``lowering_device``)

    # ------------------------------------------------------------------ basics
    def input(self, shape, name="input") -> int:
        return self.graph.add("input", [], tuple(shape), name)

    def shape(self, v) -> tuple:
        return tuple(v.shape) if is_const(v) else self.graph.nodes[v].shape

    def node(self, op, inputs, shape, name, value_range=(None, None), **params) -> int:
        return self.graph.add(op, list(inputs), tuple(int(s) for s in shape), name, value_range, **params)

    # ------------------------------------------------------------------ element moves
    def rearrange(self, x, fn: Callable, name=""):
        """fn(x) for an operation that only moves or copies elements (zeros allowed as padding):
        its index map is fn applied to the element positions. Returns a value, or a tuple of
        values when fn returns several tensors (split, chunk, unbind)."""
        if is_const(x):
            return fn(x)
        shape = self.shape(x)
        n = math.prod(shape)
        # positions + 1 so that the zeros of padding (im2col, pad) read as "no element"
        pos = torch.arange(1, n + 1, dtype=F64, device=self.device).reshape(shape)
        out = fn(pos)
        if isinstance(out, (tuple, list)):
            return tuple(self._index_node(x, o, shape, n, name) for o in out)
        return self._index_node(x, out, shape, n, name)

    def _index_node(self, x, pos, in_shape, n, name):
        index = pos.to(torch.int64) - 1
        identity = torch.arange(n, device=index.device)
        if tuple(index.shape) == tuple(in_shape) and torch.equal(index.flatten(), identity):
            return x
        if index.numel() == n and torch.equal(index.flatten(), identity):
            return self.node("reshape", [x], index.shape, name, to=tuple(index.shape), in_shape=tuple(in_shape))
        padded = bool((index < 0).any())
        index = torch.where(index < 0, n, index)
        return self.node("gather", [x], index.shape, name, index=index, numel=n, padded=padded,
                         in_shape=tuple(in_shape))

    def reshape(self, x, shape, name=""):
        return self.rearrange(x, lambda t: t.reshape(shape), name)

    def permute(self, x, dims, name=""):
        if is_const(x):
            return x.permute(*dims)
        n = len(self.shape(x))
        dims = tuple(d % n for d in dims)
        if dims == tuple(range(n)):
            return x
        shape = tuple(self.shape(x)[d] for d in dims)
        return self.node("permute", [x], shape, name, dims=dims)

    def transpose(self, x, d0, d1, name=""):
        n = len(self.shape(x))
        dims = list(range(n))
        dims[d0 % n], dims[d1 % n] = dims[d1 % n], dims[d0 % n]
        return self.permute(x, dims, name)

    def expand(self, x, shape, name=""):
        shape = tuple(shape)
        if self.shape(x) == shape:
            return x
        return self.rearrange(x, lambda t: t.expand(shape), name)

    def cat(self, values, dim, name=""):
        values = list(values)
        if all(is_const(v) for v in values):
            return torch.cat(values, dim)
        ref = self.shape(next(v for v in values if not is_const(v)))
        dim = dim % len(ref)
        pieces = tuple(None if not is_const(v) else v.to(F64) for v in values)
        sizes = tuple(self.shape(v)[dim] for v in values)
        shape = list(ref)
        shape[dim] = sum(sizes)
        return self.node("cat", [v for v in values if not is_const(v)], shape, name,
                         dim=dim, pieces=pieces, sizes=sizes)

    # ------------------------------------------------------------------ arithmetic
    def _broadcast(self, a, b, name):
        shape = tuple(torch.broadcast_shapes(self.shape(a), self.shape(b)))
        a = a if is_const(a) else self.expand(a, shape, name)
        b = b if is_const(b) else self.expand(b, shape, name)
        return a, b, shape

    def add(self, a, b, name="", alpha=1):
        if is_const(a) and is_const(b):
            return a + alpha * b
        if alpha != 1:
            b = self.mul(b, const(alpha), name)
        a, b, shape = self._broadcast(a, b, name)
        if is_const(a):
            a, b = b, a
        if is_const(b):
            return a if not b.any() else self.node("add_const", [a], shape, name, value=const(b))
        return self.node("add", [a, b], shape, name)

    def neg(self, x, name=""):
        return self.mul(x, const(-1.0), name)

    def sub(self, a, b, name="", alpha=1):
        return self.add(a, b, name, alpha=-alpha)

    def mul(self, a, b, name=""):
        if is_const(a) and is_const(b):
            return a * b
        if is_const(a):
            a, b = b, a
        if is_const(b):
            shape = tuple(torch.broadcast_shapes(self.shape(a), tuple(b.shape)))
            a = self.expand(a, shape, name)
            if b.numel() == 1 and float(b) == 1.0:
                return a
            return self.node("mul_const", [a], shape, name, value=const(b))
        # the product relaxation sums its coefficients over broadcast axes itself
        shape = tuple(torch.broadcast_shapes(self.shape(a), self.shape(b)))
        return self.node("mul", [a, b], shape, name)

    def div(self, a, b, name=""):
        if is_const(b):
            # x / c lowered as x · fl(1/c): the verified model uses the rounded reciprocal
            return self.mul(a, 1.0 / const(b).to(F64), name) if not is_const(a) else a / b
        return self.mul(a, self.unary("reciprocal", b, name), name)

    def unary(self, op, x, name="", value_range=(None, None)):
        if is_const(x):
            raise ValueError(f"{name}: constant operand of {op!r} should have been folded")
        return self.node(op, [x], self.shape(x), name, value_range)

    def linear(self, x, W, b=None, name=""):
        """x Wᵀ + b over the last axis."""
        W = const(W)
        if is_const(x):
            y = x @ W.T
            return y if b is None else y + b
        shape = self.shape(x)[:-1] + (W.shape[0],)
        return self.node("linear", [x], shape, name, W=W, b=None if b is None else const(b))

    def matmul(self, a, b, name=""):
        if is_const(a) and is_const(b):
            return a @ b
        sa, sb = self.shape(a), self.shape(b)
        if len(sa) == 1 or len(sb) == 1:
            # vector operands: lift to matrices as torch.matmul does, then drop the axis
            a2 = self.reshape(a, (1,) + sa, name) if len(sa) == 1 else a
            b2 = self.reshape(b, sb + (1,), name) if len(sb) == 1 else b
            out = self.matmul(a2, b2, name)
            s = self.shape(out)
            s = s[:-2] + ((s[-2],) if len(sa) > 1 else ()) + ((s[-1],) if len(sb) > 1 else ())
            return self.reshape(out, s, name)
        batch = tuple(torch.broadcast_shapes(sa[:-2], sb[:-2]))
        shape = batch + (sa[-2], sb[-1])
        if is_const(b):
            if b.dim() == 2:
                return self.linear(a, b.T, None, name)
            a = self.expand(a, batch + sa[-2:], name)
            return self.node("matmul_const", [a], shape, name, M=const(b), right=True, in_shape=self.shape(a))
        if is_const(a):
            b = self.expand(b, batch + sb[-2:], name)
            return self.node("matmul_const", [b], shape, name, M=const(a), right=False, in_shape=self.shape(b))
        a, b = self.expand(a, batch + sa[-2:], name), self.expand(b, batch + sb[-2:], name)
        out = self.node("matmul", [a, b], shape, name)
        for k, att in enumerate(self.graph.attention):
            if att.probs == a and att.pv is None:
                self.graph.attention[k] = dataclasses.replace(att, values=b, pv=out)
        return out

    def reduce(self, x, dims, keepdim=False, mean=False, name=""):
        if is_const(x):
            return (x.mean if mean else x.sum)(dim=dims, keepdim=keepdim)
        shape = self.shape(x)
        dims = tuple(range(len(shape))) if dims is None or dims == [] else dims
        dims = tuple(sorted({d % len(shape) for d in ((dims,) if isinstance(dims, int) else dims)}))
        out = [1 if i in dims else s for i, s in enumerate(shape)] if keepdim else \
            [s for i, s in enumerate(shape) if i not in dims]
        count = math.prod(shape[d] for d in dims)
        return self.node("reduce", [x], out, name, dims=dims, keepdim=bool(keepdim), mean=bool(mean),
                         count=count, in_shape=shape)

    # ------------------------------------------------------------------ compound operations
    def softmax(self, x, dim=-1, name="", keep=None):
        """softmax over ``dim``; ``keep``: optional constant 0/1 mask of the entries that take
        part (masked entries get probability 0 exactly).

        Both forms start from y = x - x_j* (``softmax_shift``) and e = exp(y):
        - "sigmoid" (default, unmasked rows of two or more keys): p_k = σ(y_k - log R_k) with
          R_k = Σ_{j≠k} e_j (one affine node, e @ (J - I)), i.e. e_k / (e_k + R_k). e_k and R_k
          share no term, so no relaxation meets the same score twice: on mnist-vit1 the
          alpha-CROWN margins move from -0.75 to -0.47 (image 0, eps 0.01), see
          docs/certify/bab.notes.md;
        - "product": p = e · 1/Σ_j e_j, a McCormick product of two factors that both grow
          with e_k (the form for masked rows, and ``softmax_form("product")``)."""
        shape = self.shape(x)
        dim = dim % len(shape)
        last = len(shape) - 1
        if dim != last:
            x = self.transpose(x, dim, last, name)
            keep = None if keep is None else keep.transpose(dim, last)
        s = self.shape(x)
        if keep is not None:
            keep = torch.broadcast_to(keep.to(F64), s)
            x = self.add(x, torch.where(keep > 0, 0.0, MASK_PENALTY).to(F64), name)
        y = self.node("softmax_shift", [x], s, f"{name}.shifted")
        e = self.node("exp", [y], s, f"{name}.exp")
        if keep is None and s[-1] > 1 and current_softmax_form() == "sigmoid":
            others = torch.ones(s[-1], s[-1], dtype=F64, device=self.device) - \
                torch.eye(s[-1], dtype=F64, device=self.device)
            # R_k > 0 in real arithmetic; the range keeps -log R defined where exp underflows
            rest = self.node("matmul_const", [e], s, f"{name}.rest", value_range=(0.0, None),
                             M=others, right=True, in_shape=s)
            t = self.add(y, self.unary("neg_log", rest, f"{name}.neglog"), f"{name}.logit")
            p = self.unary("sigmoid", t, f"{name}.probs", value_range=(0.0, 1.0))
        else:
            if keep is not None:
                e = self.mul(e, keep, name)
            # y_j* = 0 (j* is a kept key), so Σ exp(y) >= 1: keeps 1/Σ defined when exp overflows
            z = self.node("reduce", [e], s[:-1] + (1,), f"{name}.sum", value_range=(1.0, None), dims=(last,),
                          keepdim=True, mean=False, count=s[-1], in_shape=s)
            r = self.node("reciprocal", [z], s[:-1] + (1,), f"{name}.recip")
            p = self.node("mul", [e, r], s, f"{name}.probs", value_range=(0.0, 1.0))
        if keep is None:
            self.graph.attention.append(AttentionSite(scores=x, shifted=y, probs=p, name=name))
        return p if dim == last else self.transpose(p, dim, last, name)

    def layer_norm(self, x, normalized_shape, weight=None, bias=None, eps=1e-5, name=""):
        shape = self.shape(x)
        if len(tuple(normalized_shape)) != 1:
            raise ValueError(f"{name}: LayerNorm over {len(tuple(normalized_shape))} axes is not supported "
                             f"(normalized_shape {tuple(normalized_shape)}; only the last axis)")
        n = shape[-1]
        c = self.node("center", [x], shape, f"{name}.center")
        sq = self.node("square", [c], shape, f"{name}.square")
        # mean of squares + eps >= eps > 0: keeps rsqrt defined when the squares overflow
        var = self.node("mean_last", [sq], shape[:-1] + (1,), f"{name}.var", value_range=(float(eps), None),
                        add=float(eps), n=n)
        rs = self.node("rsqrt", [var], shape[:-1] + (1,), f"{name}.rsqrt")
        r = normed_bound(n)
        y = self.node("mul", [c, rs], shape, f"{name}.normed", value_range=(-r, r))
        if weight is not None:
            y = self.mul(y, const(weight), name)
        if bias is not None:
            y = self.add(y, const(bias), name)
        return y

    def batch_norm(self, x, weight, bias, mean, var, eps, name=""):
        """Eval-mode batch norm over axis 1: x · s + t per channel."""
        shape = self.shape(x)
        view = (1, -1) + (1,) * (len(shape) - 2)
        s = 1.0 / torch.sqrt(const(var) + eps)
        if weight is not None:
            s = s * const(weight)
        t = -const(mean) * s
        if bias is not None:
            t = t + const(bias)
        return self.add(self.mul(x, s.reshape(view), name), t.reshape(view), name)

    def attention(self, q, k, v, mask=None, scale=None, causal=False, name=""):
        """softmax(Q Kᵀ · scale + mask) V (torch's scaled_dot_product_attention, dropout 0).
        ``mask``: constant, boolean (True = attend) or additive."""
        d = self.shape(q)[-1]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        s = self.mul(self.matmul(q, self.transpose(k, -2, -1, name), f"{name}.qk"), const(scale), f"{name}.scores")
        n, m = self.shape(s)[-2:]
        keep, add = None, None
        if causal:
            keep = torch.ones(n, m, dtype=torch.bool, device=self.device).tril()
        if mask is not None:
            mask = const(mask)
            if mask.dtype == torch.bool:
                keep = mask if keep is None else keep & mask
            else:
                keep = torch.isfinite(mask) if keep is None else keep & torch.isfinite(mask)
                add = torch.where(torch.isfinite(mask), mask, 0.0)
        if add is not None and add.any():
            s = self.add(s, add, name)
        if keep is not None and bool(keep.all()):
            keep = None
        if keep is not None and not bool(keep.any(-1).all()):
            raise ValueError(f"{name}: an attention mask row masks every key (the softmax is undefined)")
        p = self.softmax(s, -1, name, keep=keep)
        return self.matmul(p, v, f"{name}.pv")

    def finish(self, out) -> Graph:
        if is_const(out):
            raise ValueError("model: the output does not depend on the input")
        if out != self.graph.output:
            # the output must be the last node (crown propagates up to it)
            out = self.node("reshape", [out], self.shape(out), "output", to=self.shape(out),
                            in_shape=self.shape(out))
        return self.graph
