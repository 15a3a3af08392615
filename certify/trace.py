"""The torch front end: any ``nn.Module`` -> the verifier's graph (``certify.graph.Graph``).

``trace(model, example)`` exports the model with ``torch.export`` at one example input (batch
1, static shapes), lowers ``einsum`` to batched matrix products with torch's own
decomposition, and walks the ATen graph: parameters and buffers become float64 constants,
every operation on constants only is evaluated (constant folding), and every operation on
the perturbed input is lowered by ``certify.lowering.Builder`` through the table ``ATEN``
(one entry per supported ATen operator). Anything else raises ValueError naming the
operator, the module path that produced it and the torch call, e.g.
``unsupported operator aten.sort at 'encoder.ranker' (torch.sort)``. Random operators
(randn, rand, bernoulli, dropout in training mode...) are refused whether or not they read
the input: folded, one draw would be verified as if it were the model. The export runs a
float64 copy, so a dtype conversion of a perturbed value is lowered as the identity only
when it keeps every value of the user's model (to its own dtype or wider); narrowing and
integer conversions are refused (``_check_conversion``).
The model's output may be a tensor, a tuple (its first element), a dict or a Hugging Face
``ModelOutput`` (its ``logits``).
"""
from __future__ import annotations

import copy
import math
import operator

import torch
from torch import nn

from softcert.certify.graph import Graph
from softcert.certify.lowering import F64, Builder, const, is_const, lowering_device
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


def _converted(b, name, x, *args, **kwargs):
    # x a constant, the target dtype read from a perturbed tensor (type_as): the float64 lift
    return v(x) if isinstance(x, Var) else const(x).to(F64)


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


def _constant_pad(b, name, x, pad, value=0.0):
    """constant_pad_nd(x, pad, value) = (x moved into place, 0 in the new slots) + value · slots.
    The move alone is not enough: applied to positions, a non-zero value would read as the
    position of an element of x."""
    x = v(x)
    if is_const(x):
        return aten.constant_pad_nd.default(x, pad, value)
    moved = b.rearrange(x, lambda t: aten.constant_pad_nd.default(t, pad, 0.0), name)
    if value == 0:
        return moved
    if not math.isfinite(value):
        raise ValueError(f"unsupported operator aten.constant_pad_nd with the non-finite value {value!r} at {name!r}")
    slots = aten.constant_pad_nd.default(torch.zeros(b.shape(x), dtype=F64, device=b.device), pad, 1.0)
    return b.add(moved, slots * const(float(value)), name)


def _pad(b, name, x, pad, mode="constant", value=None):
    """F.pad: constant padding as ``_constant_pad``; reflect, replicate and circular padding
    only move elements."""
    if mode == "constant":
        return _constant_pad(b, name, x, pad, 0.0 if value is None else value)
    return _moves(aten.pad.default)(b, name, x, pad, mode, value)


def _index(b, name, x, indices):
    if any(isinstance(i, Var) for i in indices):
        raise ValueError(f"unsupported operator aten.index with perturbed indices at {name!r}")
    return b.rearrange(v(x), lambda t: aten.index.Tensor(t, indices), name)


def _like(fn):
    """zeros_like, new_ones, full_like...: a constant that reads only the shape of x."""
    def lower(b, name, x, *args, **kwargs):
        return fn(torch.zeros(b.shape(v(x)), dtype=F64, device=b.device), *args, **kwargs)
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
         aten.diagonal.default, aten.movedim.int, aten.alias.default)


# operators that convert the dtype of their first argument (target: ``_conversion_target``)
CONVERSIONS = (aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.to.other, aten._to_copy.default,
               aten.type_as.default)


def _transpose(b, name, x, d0=0, d1=1):
    return b.transpose(v(x), d0, d1, name)


ATEN = {
    **{op: _moves(op) for op in MOVES},
    aten.index.Tensor: _index,
    aten.constant_pad_nd.default: _constant_pad, aten.pad.default: _pad,
    **{op: _like(op) for op in (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                                aten.new_zeros.default, aten.new_ones.default, aten.new_full.default)},
    aten.permute.default: lambda b, name, x, dims: b.permute(v(x), dims, name),
    aten.transpose.int: _transpose, aten.t.default: _transpose,
    aten.clone.default: _identity, aten.contiguous.default: _identity, aten.detach.default: _identity,
    # dtype conversions: checked by ``_check_conversion`` before this rule runs
    **{op: _converted for op in CONVERSIONS},
    aten._assert_tensor_metadata.default: lambda b, name, *args, **kwargs: None,
    aten.lift_fresh_copy.default: _identity,
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


# ---------------------------------------------------------------- random operators
# composites that draw random numbers in training mode or with a dropout probability but do
# not carry torch's ``nondeterministic_seeded`` tag themselves
_MAYBE_RANDOM = (aten.feature_dropout.default, aten.feature_alpha_dropout.default, aten.rrelu.default,
                 aten.scaled_dot_product_attention.default)


def _bound_args(target, args, kwargs) -> dict:
    """The operator's arguments by their schema names, defaults filled in."""
    schema = getattr(target, "_schema", None)
    out = {}
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _random_draw(target, args, kwargs) -> str:
    """Why the operator draws random numbers here ("" if it does not): every operator torch
    tags ``nondeterministic_seeded`` (randn, rand, randint, normal, bernoulli, uniform_,
    dropout...), except dropout-like ones in eval mode (train False) or with dropout_p 0."""
    if torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()) and target not in _MAYBE_RANDOM:
        return ""
    a = _bound_args(target, args, kwargs)
    for flag in ("train", "training"):
        if flag in a:
            # None is native_dropout's "training"
            return "" if a[flag] is False else "dropout in training mode draws a random mask (call model.eval())"
    if "dropout_p" in a:
        return "" if not a["dropout_p"] else f"attention dropout {a['dropout_p']} draws a random mask " \
                                             f"(call model.eval())"
    return "its value is a random draw, not a function of the input (remove it to verify the model)"


# ---------------------------------------------------------------- dtype conversions
def _holds(wide, narrow) -> bool:
    """Every value of the floating dtype ``narrow`` is one of ``wide``."""
    if wide == narrow:
        return True
    w, n = torch.finfo(wide), torch.finfo(narrow)
    return w.eps <= n.eps and w.max >= n.max and w.smallest_normal <= n.smallest_normal


def _conversion_target(node, args, kwargs, original):
    """The dtype a conversion node converts to in the user's model: None (unchanged), a dtype,
    or "own" (that of a perturbed value). ``original``: fx name -> the dtype of that
    parameter, buffer or constant in the user's model (the export runs a float64 copy)."""
    a = _bound_args(node.target, args, kwargs)
    if "other" not in a:  # to.dtype, to.device, to.dtype_layout, _to_copy
        return a.get("dtype")
    fx = _bound_args(node.target, node.args, node.kwargs)["other"]
    if isinstance(fx, torch.fx.Node) and fx.name in original:
        return original[fx.name]
    # a perturbed tensor is in the model's own dtype; a folded tensor was lifted to float64 only
    # if it came from a parameter (then the model's own dtype, too)
    return "own" if isinstance(a["other"], Var) else a["other"].dtype


def _check_conversion(node, target, own):
    """A conversion of a perturbed value is the identity of the float64 lift only when it keeps
    every value: to a floating dtype that holds each of the model's own dtypes ``own``."""
    if target is None:
        return
    if target == "own":
        if len(own) == 1:
            return
        target = "the dtype of another activation"
    elif target.is_floating_point and all(_holds(target, d) for d in own):
        return
    dtypes = ", ".join(sorted(str(d) for d in own))
    raise ValueError(f"dtype conversion {_op_name(node.target)} to {target} at {_where(node)}: the model computes "
                     f"in {dtypes}, and only conversions that keep every value (to that dtype or a wider "
                     f"floating one) are supported, not to lower precision or integers; remove the cast, or "
                     f"convert the whole model to that floating dtype (e.g. model.half())")


def _own_dtypes(model, example) -> set:
    """The floating dtypes the user's model holds (its parameters and buffers; the example's
    dtype for a model without any)."""
    own = {t.dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()}
    return own or {example.dtype}


def _original_dtypes(wrapped, ep, state) -> dict:
    """fx placeholder name -> dtype of that parameter, buffer or constant in ``wrapped`` (the
    user's model before the float64 copy). A tensor created in forward (``lifted_tensor_0``)
    resolves to no attribute; the copy did not convert it, so its exported dtype is its own."""
    out = {}
    for spec in ep.graph_signature.input_specs:
        if spec.target is None:
            continue
        obj = wrapped
        for part in spec.target.split("."):
            obj = getattr(obj, part, None)
        exported = state.get(spec.target)
        if isinstance(obj, torch.Tensor):
            out[spec.arg.name] = obj.dtype
        elif isinstance(exported, torch.Tensor):
            out[spec.arg.name] = exported.dtype
    return out


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
    path = _module_path(node)
    place = repr(path) if path else "the model's own forward (no submodule)"  # '' read as a bug
    return place + (f" ({_torch_call(node)})" if _torch_call(node) else "")


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


def _same_bits(a, b) -> bool:
    """a and b are the same tensor value (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    return bool(torch.equal(a, b))


def _two_runs(wrapped, x):
    """The model's logits at ``x``, twice (a model whose output is a function of its input
    gives the same bits); ValueError when its own forward fails."""
    try:
        with torch.no_grad():
            return [logits_of(wrapped(x)).detach().clone() for _ in range(2)]
    except (RuntimeError, TypeError, IndexError) as exc:  # the model's own failure, before any export
        raise ValueError(f"model: its forward fails at an input of shape {tuple(x.shape)} "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]})") from exc


def trace(model: nn.Module, example: torch.Tensor) -> Graph:
    """The verifier's graph of ``model`` (wrapped in ``Logits`` when needed) traced at
    ``example`` (one input, batch axis first; traced at batch 1). Node 0 is the input, of shape
    (1, *example.shape[1:]); the last node is the logits. The graph's constants are on the
    example's device (the model's weights on the model's, the same one for ``certify.verify``)."""
    with lowering_device(getattr(example, "device", "cpu")):
        return _trace(model, example)


def _trace(model, example):
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    example = example[:1]
    _refuse_training_batch_norm(model)
    wrapped = model if isinstance(model, Logits) else Logits(model)
    runs = _two_runs(wrapped, example.to(next(iter(model.parameters()), example).dtype))
    own = _own_dtypes(model, example)
    ep = export(wrapped, example)
    b = Builder()
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    original = _original_dtypes(wrapped, ep, state)
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
            why = _random_draw(node.target, args, kwargs)
            if why:  # folded, one draw would be certified as if it were the model
                raise ValueError(f"random operator {_op_name(node.target)} at {_where(node)}: {why}")
            if not perturbed(args) and not perturbed(list(kwargs.values())):
                env[node.name] = node.target(*args, **kwargs)  # constant folding
                continue
            rule = ATEN.get(node.target)
            if rule is None:
                raise ValueError(f"unsupported operator {_op_name(node.target)} at {_where(node)}; "
                                 f"see certify.supported_operators()")
            if node.target in CONVERSIONS and isinstance(args[0], Var):
                _check_conversion(node, _conversion_target(node, args, kwargs, original), own)
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
            # after the walk, which names a torch random operator; this catches Python's, numpy's
            if not _same_bits(*runs):
                raise ValueError("model: two forward passes at the same input give different outputs (random "
                                 "numbers or state that forward changes); the verifier needs one function of "
                                 "the input")
            return b.finish(out.id)
        else:
            raise ValueError(f"unsupported graph node {node.op!r} ({node.name})")
    raise ValueError("model: the exported graph has no output")


def _op_name(target):
    s = str(target)
    return s[: -len(".default")] if s.endswith(".default") else s
