"""The torch front end: any ``nn.Module`` -> the verifier's graph (``certify.graph.Graph``).

``trace(model, example)`` exports the model with ``torch.export`` at one example input (batch
1, static shapes), lowers ``einsum`` to batched matrix products with torch's own
decomposition, and walks the ATen graph: parameters and buffers become float64 constants,
every operation on constants only is evaluated (constant folding), and every operation on
the perturbed input is lowered by ``certify.lowering.Builder`` through the table ``ATEN``
(one entry per supported ATen operator). Anything else raises ValueError naming the
operator, the module path that produced it and the torch call, e.g.
``unsupported operator aten.sort at 'encoder.ranker' (torch.sort)``.
The model's output may be a tensor, a tuple (its first element), a dict or a Hugging Face
``ModelOutput`` (its ``logits``).
"""
from __future__ import annotations

import copy
import operator

import torch
from torch import nn

from softcert.certify.graph import Graph
from softcert.certify.lowering import F64, Builder, const
from softcert.certify.ops import conv2d_params

aten = torch.ops.aten


def logits_of(out):
    """The logits tensor of a model output: a tensor, a tuple's first element, or ``logits``
    of a dict / ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) or hasattr(out, "keys"):
        if "logits" in out:
            return out["logits"]
        raise ValueError(f"model: the output is a {type(out).__name__} without 'logits' "
                         f"(keys: {', '.join(map(str, out.keys()))}); wrap the model to return the logits")
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ValueError(f"model: expected a tensor, a tuple, or a dict / ModelOutput with 'logits' as output, "
                     f"got {type(out).__name__}")


class Logits(nn.Module):
    """``model`` with its output reduced to the logits tensor (see ``logits_of``)."""

    def __init__(self, model: nn.Module, call=None):
        super().__init__()
        self.model = model
        self.call = call

    def forward(self, x):
        return logits_of(self.model(x) if self.call is None else self.call(self.model, x))


# ---------------------------------------------------------------- the ATen table
# A rule gets the builder, the module path, then the operator's arguments with every
# perturbed value as a ``Var`` and constants as tensors or Python values.


class Var:
    """A value of the traced graph that depends on the perturbed input: node ``id``."""

    __slots__ = ("id",)

    def __init__(self, i):
        self.id = i


def v(x):
    """An operand for the builder: a node id, or a constant tensor (numbers included)."""
    if isinstance(x, Var):
        return x.id
    if isinstance(x, (list, tuple)):
        return type(x)(v(a) for a in x)
    return const(x)


def _identity(b, name, x, *args, **kwargs):
    return v(x)


def _dropout(b, name, x, p=0.5, train=False):
    if train:
        raise ValueError(f"{name}: dropout in training mode (call model.eval())")
    return v(x)


def _linear(b, name, x, w, bias=None):
    if isinstance(w, Var) or isinstance(bias, Var):
        raise ValueError(f"unsupported operator aten.linear with a perturbed weight at {name!r}")
    return b.linear(v(x), w, bias, name)


def _addmm(b, name, bias, x, w, beta=1, alpha=1):
    prod = b.mul(b.matmul(v(x), v(w), name), const(alpha), name)
    return b.add(prod, b.mul(v(bias), const(beta), name), name)


def _gelu(b, name, x, approximate="none"):
    return b.unary("gelu" if approximate == "none" else "gelu_tanh", v(x), name)


def _softmax(b, name, x, dim, half_to_float=None, dtype=None):
    return b.softmax(v(x), dim, name)


def _layer_norm(b, name, x, shape, w=None, bias=None, eps=1e-5, *args):
    return b.layer_norm(v(x), shape, w, bias, eps, name)


def _batch_norm(b, name, x, w, bias, mean, var, training, momentum, eps, *args):
    if training:
        raise ValueError(f"{name}: batch norm in training mode (call model.eval())")
    return b.batch_norm(v(x), w, bias, mean, var, eps, name)


def _bn_no_training(b, name, x, w, bias, mean, var, momentum, eps):
    return (b.batch_norm(v(x), w, bias, mean, var, eps, name), None, None)


def _sdpa(b, name, q, k, val, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise ValueError(f"{name}: attention dropout {dropout_p} (call model.eval())")
    if enable_gqa:
        raise ValueError(f"unsupported operator aten.scaled_dot_product_attention with enable_gqa at {name!r}")
    if isinstance(attn_mask, Var):
        raise ValueError(f"unsupported operator aten.scaled_dot_product_attention with a perturbed mask at {name!r}")
    return b.attention(v(q), v(k), v(val), attn_mask, scale, is_causal, name)


def _conv2d(b, name, x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(w, Var) or isinstance(bias, Var):
        raise ValueError(f"unsupported operator aten.conv2d with a perturbed weight at {name!r}")
    x = v(x)
    params = conv2d_params(const(w), None if bias is None else const(bias), stride, padding, dilation, groups,
                           in_shape=b.shape(x))
    return b.node("conv2d", [x], params["out_shape"], name, **params)


def _pow(b, name, x, e):
    ops = {2: "square", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}
    if e == 1:
        return v(x)
    if e not in ops:
        raise ValueError(f"unsupported operator aten.pow with exponent {e!r} at {name!r}")
    return b.unary(ops[e], v(x), name)


def _moves(fn):
    """An operation that only moves elements: lowered by applying it to element positions."""
    def lower(b, name, x, *args, **kwargs):
        if isinstance(x, (list, tuple)):  # e.g. stack-like moves of several tensors are not moves
            raise ValueError(f"unsupported operator {_op_name(fn)} on a list at {name!r}")
        return b.rearrange(v(x), lambda t: fn(t, *args, **kwargs), name)
    return lower


def _index(b, name, x, indices):
    if any(isinstance(i, Var) for i in indices):
        raise ValueError(f"unsupported operator aten.index with perturbed indices at {name!r}")
    return b.rearrange(v(x), lambda t: aten.index.Tensor(t, indices), name)


def _like(fn):
    """zeros_like, new_ones, full_like...: a constant that reads only the shape of x."""
    def lower(b, name, x, *args, **kwargs):
        return fn(torch.zeros(b.shape(v(x)), dtype=F64), *args, **kwargs)
    return lower


def _reduce(mean):
    def lower(b, name, x, dims=None, keepdim=False, dtype=None):
        return b.reduce(v(x), dims, keepdim, mean, name)
    return lower


def _unary(op):
    return lambda b, name, x: b.unary(op, v(x), name)


def _binary(method):
    return lambda b, name, x, y, **kw: getattr(b, method)(v(x), v(y), name, **kw)


MOVES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.select.int, aten.slice.Tensor, aten.squeeze.dim,
         aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.expand.default,
         aten.flatten.using_ints, aten.unflatten.int, aten.unfold.default, aten.im2col.default,
         aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int,
         aten.narrow.default, aten.flip.default, aten.repeat.default, aten.roll.default,
         aten.constant_pad_nd.default, aten.diagonal.default, aten.movedim.int, aten.alias.default)


def _transpose(b, name, x, d0=0, d1=1):
    return b.transpose(v(x), d0, d1, name)


ATEN = {
    **{op: _moves(op) for op in MOVES},
    aten.index.Tensor: _index,
    **{op: _like(op) for op in (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                                aten.new_zeros.default, aten.new_ones.default, aten.new_full.default)},
    aten.permute.default: lambda b, name, x, dims: b.permute(v(x), dims, name),
    aten.transpose.int: _transpose, aten.t.default: _transpose,
    aten.clone.default: _identity, aten.contiguous.default: _identity, aten.detach.default: _identity,
    aten.to.dtype: _identity, aten.to.dtype_layout: _identity, aten._to_copy.default: _identity,
    aten.type_as.default: _identity, aten.lift_fresh_copy.default: _identity,
    aten.dropout.default: _dropout, aten.feature_dropout.default: _dropout,
    aten.linear.default: _linear, aten.addmm.default: _addmm,
    aten.matmul.default: _binary("matmul"), aten.mm.default: _binary("matmul"), aten.bmm.default: _binary("matmul"),
    aten.conv2d.default: _conv2d, aten.conv2d.padding: _conv2d,
    aten.add.Tensor: _binary("add"), aten.sub.Tensor: _binary("sub"), aten.mul.Tensor: _binary("mul"),
    aten.div.Tensor: _binary("div"),
    aten.rsub.Scalar: lambda b, name, x, y, alpha=1: b.add(b.mul(v(x), const(-alpha), name), const(y), name),
    aten.neg.default: lambda b, name, x: b.neg(v(x), name),
    aten.mean.dim: _reduce(True), aten.sum.dim_IntList: _reduce(False),
    aten.mean.default: lambda b, name, x, dtype=None: b.reduce(v(x), None, False, True, name),
    aten.sum.default: lambda b, name, x, dtype=None: b.reduce(v(x), None, False, False, name),
    aten.cat.default: lambda b, name, xs, dim=0: b.cat(v(xs), dim, name),
    aten.relu.default: _unary("relu"), aten.gelu.default: _gelu, aten.tanh.default: _unary("tanh"),
    aten.sigmoid.default: _unary("sigmoid"), aten.exp.default: _unary("exp"), aten.sqrt.default: _unary("sqrt"),
    aten.rsqrt.default: _unary("rsqrt"), aten.reciprocal.default: _unary("reciprocal"),
    aten.square.default: _unary("square"), aten.pow.Tensor_Scalar: _pow,
    aten.softmax.int: _softmax, aten._softmax.default: _softmax,
    aten.layer_norm.default: _layer_norm, aten.batch_norm.default: _batch_norm,
    aten._native_batch_norm_legit_no_training.default: _bn_no_training,
    aten.scaled_dot_product_attention.default: _sdpa,
}
# decomposed by torch itself before lowering (into bmm, permute and view)
DECOMPOSE = (aten.einsum.default,)


def supported_operators() -> tuple:
    """Names of the ATen operators the torch front end lowers (plus einsum, decomposed)."""
    return tuple(sorted({_op_name(op) for op in (*ATEN, *DECOMPOSE)}))


def _module_path(node):
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path[len("model."):] if path.startswith("model.") else ("" if path == "model" else path)


def _torch_call(node):
    fn = node.meta.get("torch_fn")
    return "" if not fn else fn[1].split(".")[-1]


def _where(node):
    return f"{_module_path(node)!r}" + (f" ({_torch_call(node)})" if _torch_call(node) else "")


def export(model: nn.Module, example: torch.Tensor):
    """torch.export of ``model`` (float64, in its own train/eval mode: dropout or batch norm in
    training mode is refused when lowered) at ``example`` with einsum decomposed."""
    from torch._decomp import core_aten_decompositions

    m = copy.deepcopy(model).to(F64)
    try:
        ep = torch.export.export(m, (example.to(F64),), strict=False)
    except Exception as exc:  # torch raises many types; the message is what the user needs
        raise ValueError(f"model: torch.export could not trace it ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:300]})") from exc
    table = core_aten_decompositions()
    ops = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    decomp = {op: table[op] for op in DECOMPOSE if op in ops}
    return ep.run_decompositions(decomp) if decomp else ep


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _refuse_training_batch_norm(model):
    # checked before the first forward: at batch 1 torch's own error ("Expected more than 1
    # value per channel") names no layer
    for path, mod in model.named_modules():
        if isinstance(mod, _BATCH_NORMS) and mod.training:
            raise ValueError(f"{path or type(mod).__name__}: batch norm in training mode (call model.eval())")


def trace(model: nn.Module, example: torch.Tensor) -> Graph:
    """The verifier's graph of ``model`` (wrapped in ``Logits`` when needed) traced at
    ``example`` (one input, batch axis first; traced at batch 1). Node 0 is the input, of shape
    (1, *example.shape[1:]); the last node is the logits."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    example = example[:1]
    _refuse_training_batch_norm(model)
    wrapped = model if isinstance(model, Logits) else Logits(model)
    with torch.no_grad():
        logits_of(wrapped(example.to(next(iter(model.parameters()), example).dtype)))
    ep = export(wrapped, example)
    b = Builder()
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    sig = ep.graph_signature
    names = {}
    for spec in sig.input_specs:
        if spec.target is not None:
            names[spec.arg.name] = spec.target
    env = {}
    user_inputs = set(sig.user_inputs)

    def value(a):
        if isinstance(a, torch.fx.Node):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return a

    def perturbed(a):
        if isinstance(a, Var):
            return True
        return isinstance(a, (list, tuple)) and any(perturbed(x) for x in a)

    def wrap(out):
        if isinstance(out, (list, tuple)):
            return type(out)(wrap(x) for x in out)
        return Var(out) if isinstance(out, int) and not isinstance(out, bool) else out

    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in user_inputs:
                env[node.name] = Var(b.input((1, *example.shape[1:]), "input"))
            else:
                t = state[names[node.name]]
                env[node.name] = const(t) if isinstance(t, torch.Tensor) else t
        elif node.op == "call_function":
            args, kwargs = value(node.args), {k: value(a) for k, a in node.kwargs.items()}
            if node.target is operator.getitem:
                env[node.name] = args[0][args[1]]
                continue
            if not perturbed(args) and not perturbed(list(kwargs.values())):
                env[node.name] = node.target(*args, **kwargs)  # constant folding
                continue
            rule = ATEN.get(node.target)
            if rule is None:
                raise ValueError(f"unsupported operator {_op_name(node.target)} at {_where(node)}; "
                                 f"see certify.supported_operators()")
            name = _module_path(node) or node.name
            try:
                env[node.name] = wrap(rule(b, name, *args, **kwargs))
            except ValueError:
                raise
            except (RuntimeError, TypeError, IndexError) as exc:
                raise ValueError(f"operator {_op_name(node.target)} at {_where(node)}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200]}") from exc
        elif node.op == "output":
            outs = value(node.args[0])
            out = outs[0] if isinstance(outs, (list, tuple)) else outs
            if not isinstance(out, Var):
                raise ValueError("model: the output does not depend on the input")
            return b.finish(out.id)
        else:
            raise ValueError(f"unsupported graph node {node.op!r} ({node.name})")
    raise ValueError("model: the exported graph has no output")


def _op_name(target):
    s = str(target)
    return s[: -len(".default")] if s.endswith(".default") else s
