"""The traced graph of a model, cached while the model provably has not changed.

``graph_of(model, example)`` traces ``model`` (``certify.trace``) at inputs shaped like
``example`` and keeps the graph for the next call; ``classes_of(graph)`` reads the number of
logits. Below ``certify.api`` and ``certify.bab``, which both look graphs up here.
"""
from __future__ import annotations

import enum
import functools
import math
import types
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from softcert.certify.graph import Graph, GraphModule
from softcert.certify.lowering import current_softmax_form
from softcert.certify.ops import tensor_of
from softcert.certify.trace import Logits, trace

# A traced graph is reused only while the model is provably the one traced: the same object
# (held by a weak reference, so a new model at a recycled id() never matches) whose state,
# everything its forward can read from the module tree, equals a copy taken at trace time:
# per module its class, training flag, hooks and plain attributes, per parameter and buffer
# its values (``torch.equal`` against its own copy; in-place edits through ``.data`` do not
# bump ``_version``). State outside the tree (globals, class attributes) cannot be copied;
# for it the model is re-run at the traced example and must reproduce its output bit for
# bit. A state with a value that cannot be copied and compared exactly is never cached.
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 8
_STATE_BUDGET = 200_000  # values walked per model; past it the model is not cached


class _Uncopyable(Exception):
    """A value of the model's state that ``_freeze`` cannot copy and compare exactly."""


class _TensorCopy:
    """A tensor compared by dtype, shape, device and exact values (NaN never equal)."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t

    def __eq__(self, other):
        a, b = self.t, other.t if isinstance(other, _TensorCopy) else None
        if b is None or (a.dtype, a.shape, a.device, a.layout) != (b.dtype, b.shape, b.device, b.layout):
            return False
        try:
            return bool(torch.equal(a, b))
        except (RuntimeError, TypeError):  # layouts torch.equal does not compare
            return False

    __hash__ = None


# values compared as themselves: exact builtin types (a subclass may carry attributes) and
# torch's and enum's immutable values; classes by identity
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, type(Ellipsis)})
_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format, enum.Enum, type)
# C callables: by identity, with the object a bound one belongs to (``tensor.mul``)
_CALLABLES = (types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType,
              types.MethodDescriptorType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def _freeze(x, copy, seen, budget):
    """A comparable picture of ``x``: atoms as themselves, tensors as ``_TensorCopy`` (a
    copy when ``copy``), containers, modules and plain objects by type and frozen contents, an
    object met twice as ("ref", k). Raises _Uncopyable for anything else."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Uncopyable("state too large")
    if type(x) in _PLAIN or isinstance(x, _ATOMS):
        return (type(x), x)
    if isinstance(x, _CALLABLES):
        owner = getattr(x, "__self__", None)
        if owner is None or isinstance(owner, (types.ModuleType, type)):
            return (type(x), x)
        return (type(x), getattr(x, "__name__", ""), _freeze(owner, copy, seen, budget))
    if id(x) in seen:
        return ("ref", seen[id(x)])
    seen[id(x)] = len(seen)
    if isinstance(x, torch.Tensor):
        return _TensorCopy(x.detach().clone() if copy else x.detach())
    return _freeze_container(x, copy, seen, budget)


def _freeze_container(x, copy, seen, budget):
    def f(y):
        return _freeze(y, copy, seen, budget)

    if isinstance(x, (tuple, list)):
        return (type(x), tuple(f(y) for y in x))
    if isinstance(x, dict):
        return (type(x), tuple((f(k), f(y)) for k, y in x.items()))
    if isinstance(x, (set, frozenset)):
        return (type(x), frozenset(x)) if all(type(y) in _PLAIN for y in x) else _uncopyable(x)
    if isinstance(x, types.FunctionType):
        cells = tuple(f(c.cell_contents) for c in x.__closure__ or ())
        return (types.FunctionType, x, x.__code__, f(x.__defaults__), f(x.__kwdefaults__), cells)
    if isinstance(x, types.MethodType):
        return (types.MethodType, f(x.__func__), f(x.__self__))
    if isinstance(x, functools.partial):
        return (functools.partial, f(x.func), f(x.args), f(x.keywords))
    if hasattr(x, "__dict__") and not any(getattr(c, "__slots__", ()) for c in type(x).__mro__[:-1]):
        return (type(x), f(vars(x)))  # modules, configs, plain objects: their attributes
    return _uncopyable(x)


def _uncopyable(x):
    raise _Uncopyable(type(x).__name__)


def _state(model, copy):
    """The frozen state of ``model`` (see ``_freeze``) and torch's global module hooks; None
    when some value cannot be copied and compared exactly."""
    hooks = [getattr(torch.nn.modules.module, h, {}) for h in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_forward_hooks_always_called",
        "_global_forward_hooks_with_kwargs")]
    try:
        return _freeze((model, hooks), copy, {}, [_STATE_BUDGET])
    except _Uncopyable:
        return None


def _output_at(model, call, example):
    """The model's own logits at ``example`` (its dtype), as ``trace`` runs it; None on error."""
    try:
        with torch.no_grad():
            return _TensorCopy(Logits(model, call)(example.to(next(iter(model.parameters()), example).dtype)))
    except Exception:  # any failure only means: do not reuse  # noqa: BLE001
        return None


@dataclass
class _Entry:
    model: weakref.ref
    state: object
    example: torch.Tensor
    output: _TensorCopy
    graph: Graph


def _forget(k, ref):
    """Drop the entry of a model that no longer exists (its copies of state and the graph)."""
    entry = _CACHE.get(k)
    if entry is not None and entry.model is ref:
        del _CACHE[k]


def _fresh(entry, model, call):
    """Whether ``entry`` still describes ``model``: same object, same state, same output."""
    if entry.model() is not model or entry.state != _state(model, copy=False):
        return False
    out = _output_at(model, call, entry.example)
    return out is not None and out == entry.output


def graph_of(model, example, call=None, key="") -> Graph:
    """The traced graph of ``model`` at inputs shaped like ``example`` (cached while the model
    is unchanged; see the notes above ``_CACHE``)."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, GraphModule) and call is None:
        return model.graph
    # the device too: a model without parameters or buffers traced on one device is not on another
    k = (id(model), key, tuple(example.shape[1:]), current_softmax_form(), example.device)
    entry = _CACHE.get(k)
    if entry is not None and _fresh(entry, model, call):
        _CACHE.move_to_end(k)
        return entry.graph
    _CACHE.pop(k, None)
    state = _state(model, copy=True)  # before tracing: a forward that changes the state is never reused
    g = trace(Logits(model, call), example)
    first = example[:1].detach().clone()
    out = _output_at(model, call, first) if state is not None else None
    if out is not None:
        _CACHE[k] = _Entry(weakref.ref(model, functools.partial(_forget, k)), state, first, out, g)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return g


def check_supported(model, x) -> Graph:
    """Trace ``model`` at ``x`` (B, ...) and return the verifier's graph; ValueError naming
    the unsupported operator and the module path otherwise."""
    x = tensor_of(x)
    if not torch.is_floating_point(x):
        raise ValueError(f"x: expected a floating tensor, got dtype {x.dtype}")
    return graph_of(model, x.to(torch.float64))


def classes_of(graph) -> int:
    out = graph.nodes[graph.output].shape
    if len(out) < 1 or out[0] != 1:
        raise ValueError(f"model: expected logits with a batch axis first, got output shape {out} at batch 1")
    return math.prod(out[1:]) if len(out) > 1 else 1
