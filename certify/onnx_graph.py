"""The ONNX front end: an ONNX model -> the verifier's graph (``certify.graph.Graph``).

``read_onnx(path_or_model)`` loads the model with ``onnx`` itself (``onnx.load``; ``.onnx.gz``
is decompressed first), runs ``onnx.shape_inference`` and walks the nodes in their
(topological) order. Initializers, ``Constant``, ``ConstantOfShape`` and everything computed
from constants only (e.g. ``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape`` chains) are
constants: such a node is evaluated on the spot by onnx's reference evaluator
(``onnx.reference``, the ONNX semantics of every operator and dtype) at the model's opset
(BatchNormalization by our own eval-mode formula). Random draws (RandomNormal, Bernoulli, ...)
and Dropout/BatchNormalization in training mode are refused, never folded. A node with a perturbed
input is lowered by ``certify.lowering.Builder`` through the table ``RULES``, one entry per
operator of ``ONNX_OPERATORS``; any other operator raises ValueError naming its op type and
node name, so is a node whose inputs do not fit it. Erf is read only inside the exporters' GELU
pattern s · x · (1 + erf(c x)) (s = 0.5, c = 1/√2 as the model rounds it), lowered exactly as
(2s/k) · gelu(k x), k = √2 c. The perturbed path must be float32/float64; a Cast on it that
loses precision (float16, bfloat16, float64 -> float32) is refused: the graph is the model in
real arithmetic, and a dropped rounding could turn a false property into `unsat`. A Cast of a
float to an integer type truncates (``trunc``) and to bool tests x != 0 (``nonzero``), both
piecewise constant; integers then only move (``_MOVES_INTEGERS``) or are cast again.
Comparisons (Greater, Less, ..., Equal) of perturbed values are 0/1 steps of their difference
(``_compare``), read by Where (``_where``: the bilinear product), Cast, Not, And, Or, Xor and the
moves; bool values are made only by ``_MAKES_BOOLS``, never by arithmetic.
Batch: the model is read at batch 1 (a symbolic first axis counts as 1). By default every graph
input that is not an initializer is perturbed (one: the graph's input itself; several: slices of
one flat input) and the first graph output is the output; ``read_onnx`` binds several outputs
and hidden values (internal node outputs) as one flat output, their concatenation.
"""
from __future__ import annotations

import copy
import gzip
import math
import os
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper, reference, shape_inference

from softcert.certify import ops
from softcert.certify.graph import Graph
from softcert.certify.lowering import F64, Builder, const


@dataclass(frozen=True)
class OnnxNetwork:
    """An ONNX model lowered to the verifier's graph. ``input_shape``/``output_shape``: the
    model's own shapes at batch 1 (the graph's node 0 has ``input_shape``); VNN-LIB's X_i / Y_j
    are their row-major flattenings. ``model``: the (shape-inferred) ONNX model itself
    (``with_outputs`` gives it with the hidden values as graph outputs).

    ``inputs`` / ``outputs``: ((ONNX name, shape), ...) of the values bound to X and Y, in
    order. With one of each (and no hidden value) the graph is the model's own; otherwise
    node 0 is the flat concatenation X (``input_shape`` = (n,), ``input_name`` None), cut
    into the model's inputs by exact reshapes, and the graph's output is the flat
    concatenation Y of the outputs and then the hidden values (``output_shape`` = (m,),
    ``output_name`` None)."""

    graph: Graph = field(repr=False)
    input_name: str | None
    input_shape: tuple
    output_name: str | None
    output_shape: tuple
    opset: int
    model: onnx.ModelProto = field(repr=False, compare=False, default=None)
    inputs: tuple = ()
    outputs: tuple = ()
    #: the names of the hidden values among ``outputs`` (its last entries)
    hidden: tuple = ()
    #: the ONNX models in the graph (``Part``; several for a product graph, ``read_product``);
    #: ``model``, ``inputs``, ``outputs`` and ``hidden`` are the first one's
    parts: tuple = ()

    @property
    def n_inputs(self) -> int:
        return math.prod(self.input_shape)

    @property
    def n_outputs(self) -> int:
        return math.prod(self.output_shape)

    def to(self, device) -> OnnxNetwork:
        """This network with its graph's constants on ``device`` (``Graph.to``: self when they
        are there already); the ONNX models, which onnxruntime runs on the CPU, are the same."""
        graph = self.graph.to(device)
        return self if graph is self.graph else replace(self, graph=graph)


def forward(network: OnnxNetwork, x) -> torch.Tensor:
    """The graph evaluated in float64 (no bounds): x of shape (B, *input_shape) or
    (B, n_inputs) -> (B, *output_shape). Differentiable (used by the attack)."""
    x = torch.as_tensor(x, dtype=F64)
    if x.dim() == 1:
        x = x.unsqueeze(0)
    x = x.reshape(x.shape[0], *network.input_shape)
    return network.graph.values(x, lifted=True)[-1]  # x has the model's own first axis already


# ---------------------------------------------------------------- loading
def _load(path_or_model) -> onnx.ModelProto:
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise ValueError(f"path_or_model: no such file {path!r}")
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return onnx.load_from_string(f.read())
        return onnx.load(path)
    except Exception as exc:  # protobuf decode errors have many types
        raise ValueError(f"path_or_model: {path!r} is not a readable ONNX model ({exc})") from exc


def _opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ValueError("model: no default-domain (ai.onnx) opset import")


def _dims(type_proto, what, batch_axis=True) -> tuple:
    t = type_proto.tensor_type
    if not t.HasField("shape"):
        raise ValueError(f"{what}: the ONNX model declares no shape")
    out = []
    for i, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif i == 0 and batch_axis:
            out.append(1)  # a symbolic (or 0) batch axis: read at batch 1
        else:
            raise ValueError(f"{what}: symbolic dimension {d.dim_param or d.dim_value!r} at axis {i} "
                             f"(only the batch axis may be symbolic)")
    return tuple(out)


def read_onnx(path_or_model, *, inputs=None, outputs=None, hidden=(), positions=None) -> OnnxNetwork:
    """Load an ONNX model (path, ``.onnx.gz`` path or ``onnx.ModelProto``) and lower it.

    ``inputs``: the graph inputs bound to X, by name (a sequence) or by order (None or an
    int: all of them, in the graph's order; every non-initializer input must be bound).
    ``outputs``: the graph outputs bound to Y, by name, or by order (an int k: the first k;
    None: the first). ``hidden``: names of internal values (node outputs) appended to Y.
    ``positions``: per bound input, the flat indices of X its elements are read from
    (row-major; default: consecutive). Raises ValueError naming the file, the ONNX op type
    and node of the first operation that is unsupported, malformed (shapes that do not fit,
    an output no node produces) or that the verifier cannot model (random draws, training
    mode, precision-losing casts)."""
    return read_product([dict(model=path_or_model, inputs=inputs, outputs=outputs, hidden=hidden,
                              positions=positions)])


def read_product(parts, n_inputs=None) -> OnnxNetwork:
    """Several ONNX models as one graph (a product graph, e.g. for VNN-LIB queries that
    declare several networks): every model's inputs are read from one flat X (each part's
    ``positions``, default consecutive after the previous part's; ``n_inputs``: the size of X,
    default the total), its Y is the parts' outputs and hidden values in order. ``parts``:
    dicts with ``model`` and the keywords of ``read_onnx``."""
    specs = []
    for part in parts:
        model = _load(part["model"])
        src = "ONNX model" if isinstance(part["model"], onnx.ModelProto) else os.fspath(part["model"])
        outputs = part.get("outputs")
        specs.append((src, model, part.get("inputs"), 1 if outputs is None else outputs, tuple(part.get("hidden", ())),
                      part.get("positions")))
    if not specs:
        raise ValueError("parts: no ONNX model")
    try:
        return _read(specs, n_inputs)
    except ValueError as exc:
        raise ValueError(f"{specs[0][0]}: {exc}" if len(specs) == 1 else str(exc)) from exc
    except Exception as exc:  # a malformed file can break onnx itself in many ways
        raise ValueError(f"{specs[0][0] if len(specs) == 1 else 'ONNX models'}: malformed ONNX model "
                         f"({type(exc).__name__}: {exc})") from exc


@dataclass(frozen=True)
class Part:
    """One ONNX model inside a graph: ``inputs`` ((name, shape, positions), ...) with the
    flat indices of X each input's elements are read from; ``outputs`` ((name, shape), ...)
    in the order their flattenings follow each other in Y, the ``hidden`` values last."""

    model: onnx.ModelProto = field(repr=False, compare=False)
    inputs: tuple
    outputs: tuple
    hidden: tuple = ()


def _bind(values, chosen, what, every=False) -> list:
    """The value infos of ``values`` named by ``chosen`` (names in order, or an int k: the
    first k); ``every``: all of ``values`` must be bound."""
    names = [v.name for v in values]
    if chosen is None:
        chosen = len(values)
    if isinstance(chosen, int):
        if chosen < 1 or chosen > len(values) or (every and chosen != len(values)):
            raise ValueError(f"model: the property binds {chosen} {what}(s) by order, the model has {len(values)} "
                             f"{names}")
        return list(values[:chosen])
    chosen = list(chosen)
    missing = [n for n in chosen if n not in names]
    if missing or len(set(chosen)) != len(chosen) or not chosen:
        raise ValueError(f"model: the property binds {what}s {chosen}, the model's are {names}")
    if every and sorted(chosen) != sorted(names):
        raise ValueError(f"model: the property binds {what}s {chosen}, every one of {names} needs a value")
    return [values[names.index(n)] for n in chosen]


def _prepared(src, model, inputs, outputs, hidden, positions):
    """(shape-inferred model, opset, initializers, bound inputs, their shapes, bound outputs)."""
    try:
        model = shape_inference.infer_shapes(model)
    except Exception as exc:  # onnx raises InferenceError and others
        raise ValueError(f"ONNX shape inference failed ({exc})") from exc
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    if not g.output:
        raise ValueError("model: the ONNX graph has no output")
    ins = _bind([i for i in g.input if i.name not in inits], inputs, "input", every=True)
    shapes = [_dims(i.type, f"input {i.name!r}") for i in ins]
    return model, _opset(model), inits, ins, shapes, _bind(list(g.output), outputs, "output")


def _read(specs, n_inputs=None) -> OnnxNetwork:
    prepared = []
    for spec in specs:
        try:
            prepared.append(_prepared(*spec))
        except ValueError as exc:
            raise ValueError(f"{spec[0]}: {exc}" if len(specs) > 1 else str(exc)) from exc
    b = Builder()
    (_, _, _, _, hidden, positions), (model, opset, inits, ins, in_shapes, outs) = specs[0], prepared[0]
    if len(specs) == 1 and len(ins) == 1 and len(outs) == 1 and not hidden and positions is None:
        return _read_single(b, model, opset, inits, ins[0], in_shapes[0], outs[0])
    sizes = [sum(math.prod(s) for s in p[4]) for p in prepared]
    x = b.input((n_inputs if n_inputs is not None else sum(sizes),), "X")
    parts, pieces, start = [], [], 0
    for spec, prep, size in zip(specs, prepared, sizes):
        try:
            part, values = _lower_part(b, x, spec, prep, start)
        except ValueError as exc:
            raise ValueError(f"{spec[0]}: {exc}" if len(specs) > 1 else str(exc)) from exc
        parts.append(part)
        pieces += [(v, name) for v, (name, _) in zip(values, part.outputs)]
        start += size
    flat = b.cat([b.reshape(_v(v), (math.prod(b.shape(_v(v))),), f"Y:{n}") for v, n in pieces], 0, "Y")
    if not isinstance(flat, int):
        raise ValueError(f"model: the outputs {[n for _, n in pieces]} do not depend on the inputs")
    graph = b.finish(flat)
    p0 = parts[0]
    return OnnxNetwork(graph, None, (graph.nodes[0].shape[0],), None, graph.nodes[graph.output].shape, opset, p0.model,
                       tuple((n, s) for n, s, _ in p0.inputs), p0.outputs, p0.hidden, tuple(parts))


def _read_single(b, model, opset, inits, inp, in_shape, out):
    """One input, one output: the graph's input node is the model's input itself."""
    lw = _Lowering(opset, _elem_types(model.graph), b)
    lw.check_float(inp.name, f"input {inp.name!r}")
    env = dict(inits)
    env[inp.name] = b.input(in_shape, inp.name)
    for k, node in enumerate(model.graph.node):
        lw.lower(node, k, env)
    value = _output_value(env, out.name, False)
    if not isinstance(value, int):
        raise ValueError(f"model: output {out.name!r} does not depend on the input {inp.name!r}")
    graph = b.finish(value)
    out_shape = graph.nodes[graph.output].shape
    _check_declared(out, out_shape)
    part = Part(model, ((inp.name, in_shape, tuple(range(math.prod(in_shape)))),), ((out.name, out_shape),))
    return OnnxNetwork(graph, inp.name, in_shape, out.name, out_shape, opset, model, ((inp.name, in_shape),),
                       ((out.name, out_shape),), (), (part,))


def _lower_part(b, x, spec, prepared, start):
    """Lower one model into ``b``, its inputs read from the flat input node ``x`` (at
    ``positions``, default consecutive from ``start``). Returns (Part, output values)."""
    _, _, _, _, hidden, positions = spec
    model, opset, inits, ins, in_shapes, outs = prepared
    lw = _Lowering(opset, _elem_types(model.graph), b)
    env = dict(inits)
    if positions is None:
        bounds = np.cumsum([start] + [math.prod(s) for s in in_shapes])
        positions = [range(int(a), int(c)) for a, c in zip(bounds[:-1], bounds[1:])]
    if len(positions) != len(ins):
        raise ValueError(f"positions: {len(positions)} index lists for {len(ins)} inputs")
    bound_ins = []
    for i, shape, pos in zip(ins, in_shapes, positions):
        lw.check_float(i.name, f"input {i.name!r}")
        pos = tuple(int(p) for p in pos)
        if len(pos) != math.prod(shape) or any(not 0 <= p < b.shape(x)[0] for p in pos):
            raise ValueError(f"positions: input {i.name!r} {list(shape)} needs {math.prod(shape)} indices of X "
                             f"(of {b.shape(x)[0]}), got {len(pos)}")
        idx = torch.tensor(pos, dtype=torch.int64)
        env[i.name] = b.rearrange(x, lambda t, idx=idx, shape=shape: t[idx].reshape(shape), i.name)
        bound_ins.append((i.name, shape, pos))
    for k, node in enumerate(model.graph.node):
        lw.lower(node, k, env)
    names = [o.name for o in outs] + list(hidden)
    values = [_output_value(env, n, k >= len(outs)) for k, n in enumerate(names)]
    shapes = [lw.shape(_v(v)) for v in values]
    for o, shape in zip(outs, shapes):
        _check_declared(o, shape)
    with_outputs(model, hidden)  # every hidden value is typed (onnxruntime can return it)
    return Part(model, tuple(bound_ins), tuple(zip(names, shapes)), tuple(hidden)), values


def _output_value(env, name, is_hidden):
    """The lowered value of an output or hidden value ``name`` (a node id or a constant)."""
    what = "hidden value" if is_hidden else "output"
    if name not in env:
        raise ValueError(f"model: {what} {name!r} is produced by no node (and is no input or initializer)")
    out = env[name]
    if isinstance(out, _Erf):
        raise ValueError(f"unsupported ONNX operator Erf (only inside the GELU pattern "
                         f"x · 0.5 · (1 + erf(x / √2))) before {what} {name!r}")
    if out is None:
        raise ValueError(f"model: {what} {name!r} has no value")
    return out


def _check_declared(out, shape):
    declared = out.type
    if declared.tensor_type.HasField("shape") and len(declared.tensor_type.shape.dim):
        want = _dims(declared, f"output {out.name!r}")
        if want != tuple(shape):
            raise ValueError(f"model: output {out.name!r} lowered to shape {tuple(shape)}, the model declares {want}")


def with_outputs(model, hidden):
    """The model with the ``hidden`` values (names of internal values) as extra graph
    outputs, typed and shaped by shape inference, so that onnxruntime returns them."""
    if not hidden:
        return model
    g = model.graph
    if not set(hidden) <= {v.name for v in (*g.value_info, *g.input, *g.output)}:
        model = shape_inference.infer_shapes(model)  # a model not inferred yet
    model = copy.deepcopy(model)
    g = model.graph
    known = {v.name: v for v in (*g.value_info, *g.input, *g.output)}
    for name in hidden:
        if name in {o.name for o in g.output}:
            continue
        if name not in known or not known[name].type.tensor_type.elem_type:
            raise ValueError(f"model: hidden value {name!r} has no type from shape inference")
        g.output.append(copy.deepcopy(known[name]))
    return model


def _elem_types(g) -> dict:
    """ONNX element type of every named value shape inference (or the file) declares."""
    types = {t.name: t.data_type for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


# ---------------------------------------------------------------- lowering
def _t(a):
    """A numpy constant as a builder constant (float64 when floating)."""
    return const(torch.from_numpy(np.array(a, copy=True)))


def _ints(a) -> list:
    return [int(v) for v in np.asarray(a).reshape(-1)]


#: operators that draw random numbers: folding one would freeze a single draw into the graph
RANDOM_OPERATORS = ("Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform",
                    "RandomUniformLike")
_FLOAT_TYPES = {onnx.TensorProto.FLOAT: 32, onnx.TensorProto.DOUBLE: 64}  # type -> bits
_BOOL = onnx.TensorProto.BOOL
#: type -> (lo, hi): the integers the type holds, all of them exactly (floats: up to 2^p)
_INTEGERS = {_BOOL: (0, 1), onnx.TensorProto.FLOAT: (-2**24, 2**24), onnx.TensorProto.DOUBLE: (-2**53, 2**53),
             **{t: (int(np.iinfo(helper.tensor_dtype_to_np_dtype(t)).min),
                    int(np.iinfo(helper.tensor_dtype_to_np_dtype(t)).max))
                for t in (onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                          onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
                          onnx.TensorProto.UINT64)}}
#: operators that read an integer (or bool) perturbed value: they only move its elements, or
#: cast it; integer arithmetic wraps around (and Div truncates), so it is not read
_MOVES_INTEGERS = ("Cast", "Concat", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Slice", "Split",
                   "Squeeze", "Transpose", "Unsqueeze", "Where")
#: operators with a bool output computed exactly from their inputs' real values (0/1 in the graph)
_MAKES_BOOLS = ("And", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "Or", "Xor")


def _type_name(t) -> str:
    return onnx.TensorProto.DataType.Name(t) if t else "an unknown type"


class _Lowering:
    def __init__(self, opset, types=None, builder=None):
        self.opset = opset
        self.b = builder if builder is not None else Builder()
        self.types = dict(types or {})  # value name -> ONNX element type
        self.node = None  # the node being lowered (Cast reads its input's type)

    def lower(self, node, k, env):
        name = node.name or f"{node.op_type}#{k}"
        where = f"ONNX operator {node.op_type} at node {name!r}"
        missing = [n for n in node.input if n and n not in env]
        if missing:
            raise ValueError(f"{where}: unknown input(s) {missing}")
        ins = [env[n] if n else None for n in node.input]
        if node.domain not in ("", "ai.onnx"):
            raise ValueError(f"unsupported {where} (domain {node.domain!r})")
        attrs = {a.name: _attr(a) for a in node.attribute}
        reason = _not_inference(node, ins, attrs, self.opset)
        if reason:
            raise ValueError(f"{where}: {reason}; the verifier reads inference graphs only (export in eval "
                             f"mode, or replace the node by a constant)")
        self.node = node
        if any(isinstance(v, _Erf) for v in ins):
            outs = _gelu_step(self, node, name, ins, where)
        elif not any(isinstance(v, int) for v in ins):
            outs = self._fold(node, ins, attrs, where)
        else:
            outs = self._rule(node, name, attrs, ins, where)
        if not isinstance(outs, tuple):
            outs = (outs,)
        for n, v in zip(node.output, outs):
            if n:
                env[n] = _as_np(v)
                if isinstance(env[n], int):
                    self._perturbed_type(n, node, attrs, where)

    def _rule(self, node, name, attrs, ins, where):
        rule = RULES.get(node.op_type)
        if rule is None:
            raise ValueError(f"unsupported {where}; supported: certify.onnx_graph.ONNX_OPERATORS")
        try:
            return rule(self, name, attrs, *ins)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        except Exception as exc:  # inputs that do not fit the operator (a malformed file)
            raise ValueError(f"{where}: the node does not fit its inputs {self._shapes(ins)} "
                             f"({type(exc).__name__}: {exc})") from exc

    def _shapes(self, ins):
        return [None if v is None or isinstance(v, _Erf) else self.shape(v) for v in ins]

    def _perturbed_type(self, out, node, attrs, where):
        """Record the element type of a perturbed output (inferred, else that of the first
        typed input: ONNX arithmetic keeps its operands' type) and refuse non-float ones."""
        if out not in self.types:
            src = next((n for n in node.input if n in self.types), None)
            self.types[out] = int(attrs["to"]) if node.op_type == "Cast" else self.types.get(src, 0)
        t = self.types[out]
        if t in _INTEGERS and t not in _FLOAT_TYPES:  # bool or an integer type
            if node.op_type not in _MOVES_INTEGERS and not (t == _BOOL and node.op_type in _MAKES_BOOLS):
                raise ValueError(f"{where}: output {out!r} is {_type_name(t)} on the perturbed path: integer "
                                 f"arithmetic wraps around (and Div truncates), so only {', '.join(_MOVES_INTEGERS)} "
                                 f"read integers or bools, and only {', '.join(_MAKES_BOOLS)} make bools "
                                 f"(cast them back to float32 first)")
            return
        self.check_float(out, f"{where}: output {out!r}")

    def check_float(self, value, what):
        t = self.types.get(value, 0)
        if t and t not in _FLOAT_TYPES:
            raise ValueError(f"{what} is {_type_name(t)} on the perturbed path: the verifier computes in real "
                             f"arithmetic and reads float32/float64 models only (export in float32)")

    def _fold(self, node, ins, attrs, where):
        feeds = {n: v for n, v in zip(node.input, ins) if n}
        try:
            if node.op_type == "BatchNormalization":
                # onnx's reference evaluator mixes opset-9 batch norm with batch statistics
                return _fold_batch_norm(ins, attrs)
            # a one-node function carries the model's opset (a bare node is run at the newest)
            fn = helper.make_function("softcert.fold", "fold", list(feeds), [o for o in node.output if o], [node],
                                      [helper.make_opsetid("", self.opset)])
            outs = reference.ReferenceEvaluator(fn).run(None, feeds, attributes={})
        except Exception as exc:  # the evaluator raises many types
            raise ValueError(f"{where}: constant folding failed ({exc})") from exc
        it = iter(outs)
        return tuple(next(it) if o else None for o in node.output)

    # shapes and helpers used by the rules
    def shape(self, v):
        return tuple(np.shape(v)) if isinstance(v, np.ndarray) else self.b.shape(v)


def _not_inference(node, ins, attrs, opset):
    """Why ``node`` is not a deterministic inference operation (None when it is): a random
    draw, Dropout or BatchNormalization in training mode (by the rules of ``opset``)."""
    op = node.op_type
    if op in RANDOM_OPERATORS:
        return "it draws random numbers"
    old_training = opset < 7 and not attrs.get("is_test", 0)  # opset 1-6: is_test (default 0)
    if op == "Dropout":
        flag = ins[2] if len(ins) > 2 and opset >= 12 else None
        if old_training or isinstance(flag, int) or (flag is not None and bool(np.asarray(flag).any())):
            return "dropout in training mode draws random numbers"
    if op == "BatchNormalization":
        outputs = sum(1 for o in node.output if o)  # opset 7-13: extra outputs mean training mode
        if old_training or (7 <= opset < 14 and outputs > 1) or attrs.get("training_mode", 0):
            return "batch normalization in training mode uses batch statistics"
        if not attrs.get("spatial", 1):
            return "batch normalization with spatial=0 (per-activation statistics) is not supported"
    return None


def _fold_batch_norm(ins, attrs):
    """Eval-mode batch norm of constants in the input's dtype: y = s (x - m) / √(v + ε) + b,
    per channel (axis 1)."""
    x, scale, bias, mean, var = (np.asarray(v) for v in ins[:5])
    view = (-1,) + (1,) * (x.ndim - 2)
    eps = float(attrs.get("epsilon", 1e-5))
    s, b, m, v = (a.astype(x.dtype).reshape(view) for a in (scale, bias, mean, var))
    return ((s * (x - m) / np.sqrt(v + x.dtype.type(eps)) + b).astype(x.dtype),)


def _attr(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    return v


def _as_np(v):
    """Builder values back into the environment: node ids stay ints, constants become numpy."""
    if isinstance(v, torch.Tensor):
        return v.detach().numpy()
    if isinstance(v, (np.ndarray, int, _Erf)) or v is None:
        return v
    return np.asarray(v)


def _v(v):
    """An environment value as a builder operand."""
    return v if isinstance(v, int) else _t(v)


def _need_const(v, what):
    if isinstance(v, int):
        raise ValueError(f"{what} must be a constant (it depends on the input)")
    return v


def _axis(a, rank):
    a = int(a)
    if not -rank <= a < rank:
        raise ValueError(f"axis {a} out of range for rank {rank}")
    return a % rank


# ---------------------------------------------------------------- rules
def _gemm(lw, name, at, A, B, C=None):
    """Y = alpha · A' B' + beta · C, A' = Aᵀ if transA, B' = Bᵀ if transB; C (a constant or a
    perturbed value) broadcasts to Y's shape (M, N)."""
    b = lw.b
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    out = _gemm_shape(lw, A, B, C, bool(at.get("transA", 0)), bool(at.get("transB", 0)))
    a = _v(A)
    if at.get("transA", 0):
        a = b.transpose(a, 0, 1, name)
    bb = _v(B)
    if at.get("transB", 0):
        bb = b.transpose(bb, 0, 1, name)
    bias = None
    if isinstance(a, int) and not isinstance(bb, int):
        if C is not None and not isinstance(C, int):
            # a constant C with equal rows is the linear node's bias
            cb = torch.broadcast_to(_t(C).to(F64) * beta, out)
            if bool((cb == cb[:1]).all()):
                bias, C = cb[0].clone(), None
        y = b.linear(a, (bb * alpha).T, bias, name)  # (N, K) weight: y = a Wᵀ
    else:
        y = b.matmul(a, bb, name)
        if alpha != 1:
            y = b.mul(y, const(alpha), name)
    if C is not None:
        y = b.add(y, b.mul(_f(C), const(beta), name), name)
    return y


def _gemm_shape(lw, A, B, C, ta, tb) -> tuple:
    """(M, N) of Gemm's output; ValueError when A, B, C do not fit."""
    sa, sb = lw.shape(A), lw.shape(B)
    if len(sa) != 2 or len(sb) != 2:
        raise ValueError(f"A {sa} and B {sb} must be matrices")
    (m, k), (k2, n) = (sa[::-1] if ta else sa), (sb[::-1] if tb else sb)
    if k != k2:
        raise ValueError(f"A {sa} (transA={int(ta)}) and B {sb} (transB={int(tb)}) do not fit: {k} != {k2} columns/rows")
    sc = lw.shape(C) if C is not None else ()
    if len(sc) > 2 or any(c not in (1, o) for c, o in zip(sc[::-1], (n, m))):
        raise ValueError(f"C {sc} does not broadcast to the output shape {(m, n)}")
    return (m, n)


def _f(v):
    """An arithmetic operand: node ids as they are, constants in float64."""
    return v if isinstance(v, int) else _t(v).to(F64)


def _broadcast_shape(lw, x, y) -> tuple:
    sx, sy = lw.shape(x), lw.shape(y)
    try:
        return tuple(torch.broadcast_shapes(sx, sy))
    except RuntimeError:
        raise ValueError(f"operand shapes {sx} and {sy} do not broadcast") from None


def _binary(method):
    def rule(lw, name, at, x, y):
        _broadcast_shape(lw, x, y)
        return getattr(lw.b, method)(_f(x), _f(y), name)
    return rule


def _matmul(lw, name, at, x, y):
    """numpy matmul: vectors are lifted to matrices; the inner sizes must agree and the batch
    axes broadcast."""
    sx, sy = lw.shape(x), lw.shape(y)
    if not sx or not sy:
        raise ValueError(f"MatMul of a scalar (shapes {sx}, {sy})")
    kx, ky = sx[-1], (sy[-2] if len(sy) > 1 else sy[0])
    if kx != ky:
        raise ValueError(f"shapes {sx} and {sy} do not fit: inner sizes {kx} != {ky}")
    try:
        torch.broadcast_shapes(sx[:-2], sy[:-2])
    except RuntimeError:
        raise ValueError(f"batch axes of {sx} and {sy} do not broadcast") from None
    return lw.b.matmul(_f(x), _f(y), name)


def _unary(op):
    def rule(lw, name, at, x):
        return lw.b.unary(op, x, name)
    return rule


def _sqrt_of(b, x, name):
    return b.unary("sqrt", x, name)


def _pow(lw, name, at, x, e):
    """x ** e for a constant scalar e: the registered operators where they are exact (square,
    sqrt, reciprocal, rsqrt), products of squares for integers |e| <= 64 (x³ = x · x², a
    bilinear relaxation; negative integers through reciprocal, on bounds that exclude 0),
    1 for e = 0 (ONNX: 0⁰ = 1), and exp(-e · neg_log x) for any other e (real only for x > 0;
    neg_log refuses bounds that reach below 0, naming itself)."""
    e = np.asarray(_need_const(e, "the exponent (an input-dependent exponent is not read)"))
    if e.size != 1:
        raise ValueError(f"only a scalar exponent is supported, got shape {e.shape}")
    e = float(e.reshape(-1)[0])
    b = lw.b
    if not math.isfinite(e):
        raise ValueError(f"exponent {e!r} is not finite")
    named = {1.0: lambda: x, 2.0: lambda: b.unary("square", x, name), 0.5: lambda: _sqrt_of(b, x, name),
             -1.0: lambda: b.unary("reciprocal", x, name), -0.5: lambda: b.unary("rsqrt", x, name),
             0.0: lambda: np.ones(lw.shape(x), dtype=np.float64)}
    if e in named:
        return named[e]()
    if e == int(e) and abs(e) <= 64:
        power = _integer_power(b, x, int(abs(e)), name)
        return power if e > 0 else b.unary("reciprocal", power, name)
    return b.unary("exp", b.mul(b.unary("neg_log", x, name), const(-e), name), name)


def _integer_power(b, x, k, name):
    """x ** k (k >= 1) by squaring: x^(2m) = (x^m)², x^(2m+1) = x · x^(2m)."""
    if k == 1:
        return x
    half = _integer_power(b, x, k // 2, name)
    even = b.unary("square", half, name)
    return b.mul(x, even, name) if k % 2 else even


def _identity(lw, name, at, x, *rest):
    return x


def _dropout(lw, name, at, x, ratio=None, training=None):
    """Inference dropout is the identity (training mode never reaches here: ``_not_inference``)."""
    return x, None


def _cast(lw, name, at, x):
    """ONNX Cast of a perturbed value. Float to a float type at least as wide: the identity
    (narrower float types round, and are refused). Float to an integer type: trunc (toward
    0), its image [trunc l, trunc u], refused where it leaves the type's range (undefined in
    ONNX). To bool: x != 0 (``nonzero``). An integer or bool to a type that holds all its
    values: the identity; else trunc (the identity on integers) limited to the integers the
    target holds exactly (outside, ONNX wraps an integer or rounds it into a float). As for
    the whole graph, the value cast is the real one: a float32 rounding before the cast that
    crosses an integer (or 0) is not modelled, and there it moves the result by a step."""
    src, to = lw.types.get(lw.node.input[0], 0), int(at["to"])
    floats = src in _FLOAT_TYPES and to in _FLOAT_TYPES
    if floats and _FLOAT_TYPES[to] >= _FLOAT_TYPES[src]:
        return x
    if floats or src not in _INTEGERS or to not in _INTEGERS:  # float16, bfloat16, unknown types
        raise ValueError(f"cast of a perturbed value from {_type_name(src)} to {_type_name(to)} loses precision; "
                         f"the verifier computes in real arithmetic and does not bound that rounding "
                         f"(remove the cast, or export the model in float32)")
    if to == _BOOL:
        return x if src == _BOOL else lw.b.unary("nonzero", x, name)
    lo, hi = _INTEGERS[to]
    if src not in _FLOAT_TYPES and lo <= _INTEGERS[src][0] and _INTEGERS[src][1] <= hi:
        return x
    return lw.b.node("trunc", [x], lw.shape(x), name, limits=_float_limits(lo, hi))


def _float_limits(lo, hi):
    """[lo, hi] (ints) as float64 limits for values that are integers: the least float >= lo
    and the greatest float <= hi (2^63 - 1 is no float64: it rounds up to 2^63)."""
    flo, fhi = float(lo), float(hi)
    return (flo if flo >= lo else math.nextafter(flo, math.inf), fhi if fhi <= hi else math.nextafter(fhi, -math.inf))


def _softmax(lw, name, at, x):
    shape = lw.shape(x)
    r = len(shape)
    if lw.opset >= 13:
        return lw.b.softmax(x, _axis(at.get("axis", -1), r), name)
    # opset < 13: softmax of the input flattened to 2-D at `axis` (default 1)
    a = _axis(at.get("axis", 1), r)
    flat = lw.b.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])), name)
    return lw.b.reshape(lw.b.softmax(flat, -1, name), shape, name)


def _reshape_target(shape, target, allowzero=False):
    out = list(target)
    for i, t in enumerate(out):
        if t == 0 and not allowzero:
            out[i] = shape[i]
    if out.count(-1) > 1:
        raise ValueError(f"reshape target {tuple(target)} has more than one -1")
    if -1 in out:
        rest = math.prod(t for t in out if t != -1)
        out[out.index(-1)] = math.prod(shape) // rest if rest else 0
    if math.prod(out) != math.prod(shape):
        raise ValueError(f"cannot reshape {shape} to {tuple(target)}")
    return tuple(out)


def _reshape(lw, name, at, x, target=None):
    target = at["shape"] if target is None else _ints(_need_const(target, "the target shape"))
    shape = _reshape_target(lw.shape(x), target, bool(at.get("allowzero", 0)))
    return lw.b.reshape(x, shape, name)


def _flatten(lw, name, at, x):
    shape = lw.shape(x)
    a = int(at.get("axis", 1))
    a = a % len(shape) if a != len(shape) else a
    return lw.b.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])), name)


def _transpose(lw, name, at, x):
    r = len(lw.shape(x))
    perm = at.get("perm", list(range(r))[::-1])
    return lw.b.permute(x, tuple(int(p) for p in perm), name)


def _axes(lw, at, axes_input, what="axes"):
    if axes_input is not None:
        return _ints(_need_const(axes_input, what))
    return None if "axes" not in at else [int(a) for a in at["axes"]]


def _squeeze(lw, name, at, x, axes=None):
    shape = lw.shape(x)
    ax = _axes(lw, at, axes)
    ax = [i for i, s in enumerate(shape) if s == 1] if ax is None else [_axis(a, len(shape)) for a in ax]
    for a in ax:
        if shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of size {shape[a]}")
    return lw.b.reshape(x, tuple(s for i, s in enumerate(shape) if i not in ax), name)


def _unsqueeze(lw, name, at, x, axes=None):
    shape = lw.shape(x)
    ax = _axes(lw, at, axes)
    if ax is None:
        raise ValueError("Unsqueeze without axes")
    r = len(shape) + len(ax)
    ax = sorted(_axis(a, r) for a in ax)
    out = list(shape)
    for a in ax:
        out.insert(a, 1)
    return lw.b.reshape(x, tuple(out), name)


def _slice_index(dim, start, end, step):
    """The element positions ONNX's Slice selects on an axis of size ``dim``."""
    if step == 0:
        raise ValueError("Slice step 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return list(range(start, end, step))


def _slice(lw, name, at, x, starts=None, ends=None, axes=None, steps=None):
    shape = lw.shape(x)
    if starts is None:  # opset < 10: attributes
        starts, ends = list(at["starts"]), list(at["ends"])
        axes = list(at.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(_need_const(starts, "starts")), _ints(_need_const(ends, "ends"))
        axes = list(range(len(starts))) if axes is None else _ints(_need_const(axes, "axes"))
        steps = [1] * len(starts) if steps is None else _ints(_need_const(steps, "steps"))
    picks = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, len(shape))
        picks[a] = _slice_index(shape[a], int(s), int(e), int(st))

    def fn(t):
        for a, idx in picks.items():
            t = t.index_select(a, torch.tensor(idx, dtype=torch.int64))
        return t
    return lw.b.rearrange(x, fn, name)


def _gather(lw, name, at, x, idx):
    idx = np.asarray(_need_const(idx, "the indices")).astype(np.int64)
    shape = lw.shape(x)
    a = _axis(at.get("axis", 0), len(shape))
    if idx.size and (idx.min() < -shape[a] or idx.max() >= shape[a]):
        raise ValueError(f"index out of range for axis {a} of size {shape[a]}")
    flat = torch.from_numpy(np.where(idx < 0, idx + shape[a], idx).reshape(-1))
    out = shape[:a] + idx.shape + shape[a + 1:]
    return lw.b.rearrange(x, lambda t: t.index_select(a, flat).reshape(out), name)


def _split(lw, name, at, x, split=None):
    """ONNX Split: pieces of ``x`` along ``axis`` (default 0), sized by ``split`` (an input
    from opset 13, an attribute before), else equal pieces, one per output (from opset 18 the
    last may be smaller: ceil(dim / num_outputs) each)."""
    shape = lw.shape(x)
    a = _axis(at.get("axis", 0), len(shape))
    n_out = len(lw.node.output)
    sizes = at.get("split") if split is None else split
    if sizes is not None:
        sizes = _ints(_need_const(sizes, "split"))
    elif shape[a] % n_out == 0 or lw.opset >= 18:
        step = -(-shape[a] // n_out)
        sizes = [min(step, shape[a] - i * step) for i in range(n_out)]
    else:
        raise ValueError(f"axis {a} of size {shape[a]} does not split into {n_out} equal pieces")
    if len(sizes) != n_out or sum(sizes) != shape[a] or min(sizes) < 0:
        raise ValueError(f"split sizes {sizes} do not cut axis {a} of size {shape[a]} into {n_out} outputs")
    starts = np.cumsum([0, *sizes[:-1]])

    def piece(s, k):
        idx = torch.arange(int(s), int(s) + k, dtype=torch.int64)
        return lw.b.rearrange(x, lambda t: t.index_select(a, idx), name)
    return tuple(piece(s, k) for s, k in zip(starts, sizes))


def _where(lw, name, at, cond, a, b):
    """Where(cond, a, b) = a·m + b·(1 - m), m = cond as 0/1. A constant condition (e.g. a mask)
    is exact (two constant products). A perturbed condition (a comparison, a cast to bool,
    Not/And/Or of them: values 0/1 with bounds in [0, 1]) multiplies on the bilinear ``mul``
    (McCormick, sound for any bounds): a·m + b·(1 - m) rather than b + m·(a - b), so a
    condition decided on the box ({1} or {0}) gives exactly a or b in interval arithmetic too
    (and in CROWN). Non-finite constant branches (an additive -inf mask: 0·inf) are refused."""
    for what, v in (("first", a), ("second", b)):
        if not isinstance(v, int) and not np.all(np.isfinite(np.asarray(v, dtype=np.float64))):
            raise ValueError(f"the {what} branch is a constant with non-finite values (an -inf mask is not read)")
    if isinstance(cond, int):
        try:
            torch.broadcast_shapes(lw.shape(cond), lw.shape(a), lw.shape(b))
        except RuntimeError:
            raise ValueError(f"condition and branch shapes {lw.shape(cond)}, {lw.shape(a)}, {lw.shape(b)} "
                             f"do not broadcast") from None
        return lw.b.add(lw.b.mul(_f(a), cond, name), lw.b.mul(_f(b), lw.b.sub(const(1.0), cond, name), name), name)
    c = np.asarray(cond)
    shape = tuple(np.broadcast_shapes(c.shape, lw.shape(a), lw.shape(b)))
    m = np.broadcast_to(c.astype(bool), shape)
    keep, other = const(torch.from_numpy(m.astype(np.float64))), const(torch.from_numpy((~m).astype(np.float64)))
    return lw.b.add(lw.b.mul(_f(a), keep, name), lw.b.mul(_f(b), other, name), name)


def _step(lw, d, strict, name):
    """[d > 0] (strict) or [d >= 0] = 1 - [-d > 0] on a perturbed d, as nonzero(relu(d)): the
    image of each is exact, so the result's bounds are the exact image of the step ({1} where
    l > 0, {0} where u <= 0, else [0, 1]) and its planes the constant ones."""
    if strict:
        return lw.b.unary("nonzero", lw.b.unary("relu", d, name), name)
    return lw.b.sub(const(1.0), _step(lw, lw.b.neg(d, name), True, name), name)


def _compare(op):
    """ONNX Greater, Less, GreaterOrEqual, LessOrEqual, Equal of a perturbed value (and a
    constant or another perturbed value) as a 0/1 value: a step of the difference
    d = a - b (``_step``; Equal: 1 - nonzero(d), {1} only where l = u = 0). As for the whole
    graph, the values compared are the real ones: a float32 rounding of the operands that
    moves one across the other is not modelled. The bool result is read only by Where, Cast,
    Not, And, Or, Xor, Equal and the moves (``_MOVES_INTEGERS``)."""
    def rule(lw, name, at, a, b):
        _broadcast_shape(lw, a, b)
        d = lw.b.sub(_f(a), _f(b), name) if op in ("Greater", "GreaterOrEqual", "Equal") else lw.b.sub(_f(b), _f(a), name)
        if op == "Equal":
            return lw.b.sub(const(1.0), lw.b.unary("nonzero", d, name), name)
        return _step(lw, d, op in ("Greater", "Less"), name)
    return rule


def _not(lw, name, at, c):
    """Not of a 0/1 value: 1 - c (exact, affine)."""
    return lw.b.sub(const(1.0), c, name)


def _and(lw, name, at, p, q):
    """And of 0/1 values: [p + q > 1.5] (``_step``): exact on 0/1 values (p + q is 0, 1 or 2),
    its bounds the exact image in [0, 1], decided where both operands are."""
    _broadcast_shape(lw, p, q)
    return _step(lw, lw.b.add(lw.b.add(_f(p), _f(q), name), const(-1.5), name), True, name)


def _or(lw, name, at, p, q):
    """Or of 0/1 values: [p + q > 0.5] (``_step``; exact as for ``_and``)."""
    _broadcast_shape(lw, p, q)
    return _step(lw, lw.b.add(lw.b.add(_f(p), _f(q), name), const(-0.5), name), True, name)


def _xor(lw, name, at, p, q):
    """Xor of 0/1 values: [|p - q| > 0.5] with |p - q| = relu(p - q) + relu(q - p) (``_step``;
    exact on 0/1 values, where |p - q| is 0 or 1): bounds the exact image in [0, 1], decided
    where both operands are."""
    _broadcast_shape(lw, p, q)
    d = lw.b.sub(_f(p), _f(q), name)
    gap = lw.b.add(lw.b.unary("relu", d, name), lw.b.unary("relu", lw.b.neg(d, name), name), name)
    return _step(lw, lw.b.add(gap, const(-0.5), name), True, name)


def _concat(lw, name, at, *xs):
    xs = [x for x in xs if x is not None and (isinstance(x, int) or np.size(x) or np.ndim(x) != 1)]
    r = len(lw.shape(next(x for x in xs if isinstance(x, int))))
    return lw.b.cat([_v(x) for x in xs], _axis(at["axis"], r), name)


def _reduce(mean):
    def rule(lw, name, at, x, axes=None):
        shape = lw.shape(x)
        ax = _axes(lw, at, axes)
        if not ax:
            if at.get("noop_with_empty_axes", 0):
                return x
            ax = list(range(len(shape)))
        ax = [_axis(a, len(shape)) for a in ax]
        return lw.b.reduce(x, ax, keepdim=bool(at.get("keepdims", 1)), mean=mean, name=name)
    return rule


def _batch_norm(lw, name, at, x, *stats):
    """y = scale (x - input_mean) / √(input_var + ε) + B per channel; ``stats``: the constant
    inputs (scale, B, input_mean, input_var) after X (inputs past them are ignored)."""
    # training mode (attribute or extra outputs) was refused by ``_not_inference``
    if len(stats) < 4:
        raise ValueError(f"expected the inputs X, scale, B, input_mean, input_var; got {1 + len(stats)} input(s)")
    scale, bias, mean, var = stats[:4]
    for v, what in ((scale, "scale"), (bias, "B"), (mean, "input_mean"), (var, "input_var")):
        _need_const(v, what)
    if len(lw.shape(x)) < 2:
        raise ValueError(f"input of rank {len(lw.shape(x))} (expected (N, C, ...))")
    y = lw.b.batch_norm(x, _t(scale), _t(bias), _t(mean), _t(var), float(at.get("epsilon", 1e-5)), name)
    return (y,) + (None,) * 4


def _layer_norm(lw, name, at, x, scale, bias=None):
    shape = lw.shape(x)
    a = _axis(at.get("axis", -1), len(shape))
    if a != len(shape) - 1:
        raise ValueError(f"normalisation from axis {a} (only the last axis is supported)")
    y = lw.b.layer_norm(x, (shape[-1],), _t(_need_const(scale, "Scale")),
                        None if bias is None else _t(_need_const(bias, "B")), float(at.get("epsilon", 1e-5)),
                        name)
    return y, None, None


def _pads(at, spatial, kernel, stride, dil) -> tuple:
    """ONNX pads (begin..., end...) of a convolution or pooling: explicit ``pads``, or from
    ``auto_pad`` (VALID: none; SAME_UPPER / SAME_LOWER: output ceil(in / stride), the odd pad
    at the end / the beginning)."""
    mode = at.get("auto_pad", "NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    r = len(spatial)
    if mode in ("NOTSET", ""):
        return tuple(at.get("pads", (0,) * (2 * r)))
    if mode == "VALID":
        return (0,) * (2 * r)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"auto_pad={mode!r} is not an ONNX mode")
    total = [max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0) for n, k, s, d in zip(spatial, kernel, stride, dil)]
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    return tuple(small + big) if mode == "SAME_UPPER" else tuple(big + small)


def _conv(lw, name, at, x, w, bias=None):
    """N-D convolution for N = 1, 2, 3 on ``ops.conv2d_params``, every auto_pad: 1-D as 2-D
    over a unit axis, 3-D by ``_depth_taps``."""
    w = np.asarray(_need_const(w, "the weight"))
    shape = lw.shape(x)
    r = len(shape) - 2
    if r not in (1, 2, 3) or w.ndim != len(shape):
        raise ValueError(f"only 1-D, 2-D and 3-D convolutions are supported (input rank {len(shape)}, weight rank "
                         f"{w.ndim})")
    groups = int(at.get("group", 1))
    if w.shape[1] * groups != shape[1]:
        raise ValueError(f"weight {tuple(w.shape)} does not fit {shape[1]} input channels in {groups} groups")
    stride, dil = tuple(at.get("strides", (1,) * r)), tuple(at.get("dilations", (1,) * r))
    pads = _pads(at, shape[2:], tuple(w.shape[2:]), stride, dil)  # (begin..., end...)
    bias = None if bias is None else _t(_need_const(bias, "the bias"))
    b = lw.b
    if r == 1:  # (N, C, L) as (N, C, 1, L)
        x = b.rearrange(x, lambda t: t.unsqueeze(2), name)
        y = _conv2d(lw, name, x, np.expand_dims(w, 2), bias, ((1, *stride), (0, pads[0], 0, pads[1]), (1, *dil), groups))
        return b.rearrange(y, lambda t: t.squeeze(2), name)
    if r == 2:
        return _conv2d(lw, name, x, w, bias, (stride, pads, dil, groups))
    x = _depth_taps(lw, name, x, w.shape[2], stride[0], (pads[0], pads[3]), dil[0])
    o, cg, kd, kh, kw = w.shape
    y = _conv2d(lw, name, x, w.reshape(o, cg * kd, kh, kw), bias, (stride[1:], (*pads[1:3], *pads[4:]), dil[1:], groups))
    return b.permute(y, (0, 2, 1, 3, 4), name)  # (N, Do, O, Ho, Wo) -> (N, O, Do, Ho, Wo)


def _conv2d(lw, name, x, w, bias, geometry):
    """One ``conv2d`` node; ``geometry`` (stride, pads, dilations, groups), ``pads`` in ONNX's
    order (top, left, bottom, right), conv2d takes (top, bottom, left, right). Leading axes of
    x before (C, H, W) are batch axes."""
    stride, pads, dil, groups = geometry
    params = ops.conv2d_params(_t(w), bias, tuple(stride), (pads[0], pads[2], pads[1], pads[3]), tuple(dil), groups,
                               in_shape=lw.shape(x))
    return lw.b.node("conv2d", [x], params["out_shape"], name, **params)


def _depth_taps(lw, name, x, kd, stride, pads, dil):
    """x (N, C, D, H, W) -> X (N, Do, C·kd, H, W), X[n, o, c·kd + t] = x[n, c, o·stride - pads[0]
    + t·dil] (0 in the padding): one gather. A 3-D convolution with weight W (O, C/g, kd, kh,
    kw) is then the 2-D one of X with W reshaped to (O, C/g·kd, kh, kw), over the batch axes
    (N, Do): the same sums, so the same bounds (|W| ⋆ r is |W'| ⋆ r')."""
    n, c, d, h, w = lw.shape(x)
    do = (d + pads[0] + pads[1] - dil * (kd - 1) - 1) // stride + 1
    if do < 1:
        raise ValueError(f"input depth {d} (pads {pads}) is smaller than the dilated kernel depth {dil * (kd - 1) + 1}")
    depth = torch.tensor([[o * stride + t * dil for t in range(kd)] for o in range(do)]).reshape(-1)

    def taps(t):
        t = torch.nn.functional.pad(t, (0, 0, 0, 0, *pads))  # zeros: no element (``Builder.rearrange``)
        t = t.index_select(2, depth).reshape(n, c, do, kd, h, w)
        return t.permute(0, 2, 1, 3, 4, 5).reshape(n, do, c * kd, h, w)
    return lw.b.rearrange(x, taps, name)


def _max_pool(lw, name, at, x):
    """MaxPool over 1, 2 or 3 spatial axes as nested maxima max(a, b) = b + relu(a - b): exact,
    so every relaxation is ReLU's (and branch and bound splits there). A window's positions in
    the padding are replaced by one of its own input positions (max is idempotent)."""
    if len(lw.node.output) > 1 and lw.node.output[1]:
        raise ValueError("the Indices output is not read (an integer result)")
    shape = lw.shape(x)
    kernel = tuple(at["kernel_shape"])
    r = len(kernel)
    if len(shape) != r + 2:
        raise ValueError(f"kernel_shape {kernel} does not fit the input shape {shape}")
    stride = tuple(at.get("strides", (1,) * r))
    dil = tuple(at.get("dilations", (1,) * r))
    pads = _pads(at, shape[2:], kernel, stride, dil)
    windows = _pool_windows(shape[2:], kernel, stride, dil, pads, bool(at.get("ceil_mode", 0)))
    out_shape = shape[:2] + windows.shape[:r]
    b, m = lw.b, None
    for t in range(windows.shape[-1]):
        idx = torch.from_numpy(windows[..., t].reshape(-1))
        piece = b.rearrange(x, lambda v, i=idx: v.flatten(2).index_select(2, i).reshape(out_shape), name)
        m = piece if m is None else b.add(piece, b.unary("relu", b.sub(m, piece, name), name), name)
    return m


def _pool_windows(spatial, kernel, stride, dil, pads, ceil_mode) -> np.ndarray:
    """(*out spatial, prod(kernel)) flat input positions of every pooling window, a padding
    position replaced by the window's first input position."""
    import itertools

    r = len(spatial)
    rnd = math.ceil if ceil_mode else math.floor
    outs = [int(rnd((n + pads[i] + pads[i + r] - ((k - 1) * d + 1)) / s)) + 1
            for i, (n, k, s, d) in enumerate(zip(spatial, kernel, stride, dil))]
    if ceil_mode:  # ONNX/PyTorch: the last window must start inside the input or the left padding
        outs = [o - 1 if (o - 1) * s >= n + p else o for o, s, n, p in zip(outs, stride, spatial, pads[:r])]
    if min(outs) < 1:
        raise ValueError(f"the pooling window {kernel} does not fit the input {tuple(spatial)} with pads {pads}")
    win = np.empty((*outs, math.prod(kernel)), dtype=np.int64)
    for o in itertools.product(*map(range, outs)):
        coords = [[o[i] * stride[i] - pads[i] + t * dil[i] for t in range(kernel[i])] for i in range(r)]
        flat = [int(np.ravel_multi_index(c, spatial)) if all(0 <= c[i] < spatial[i] for i in range(r)) else -1
                for c in itertools.product(*coords)]
        inside = [f for f in flat if f >= 0]
        if not inside:
            raise ValueError(f"a pooling window at output {o} lies in the padding only")
        win[o] = [f if f >= 0 else inside[0] for f in flat]
    return win


def _shape(lw, name, at, x):
    s = np.array(lw.shape(x), dtype=np.int64)
    r = len(s)
    start, end = int(at.get("start", 0)), int(at.get("end", r))
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return s[start:end]


def _expand(lw, name, at, x, shape):
    target = tuple(torch.broadcast_shapes(lw.shape(x), tuple(_ints(_need_const(shape, "the shape")))))
    if len(target) > len(lw.shape(x)):
        x = lw.b.reshape(x, (1,) * (len(target) - len(lw.shape(x))) + lw.shape(x), name)
    return lw.b.expand(x, target, name)


# ---------------------------------------------------------------- GELU, erf form
class _Erf:
    """A partial match of GELU's erf form on the perturbed node ``x``: ``stage`` "erf" is
    erf(c x), "1+erf" is 1 + erf(c x), for the model's own scalar c > 0 (x / √2 as exported:
    c = fl(1/fl32(√2)), not 1/√2). ``shape``: the value's shape (a size-1 constant may add
    leading axes). Erf has no relaxation of its own: a match that does not complete to
    s · x · (1 + erf(c x)) is refused."""

    def __init__(self, stage, x, c, shape):
        self.stage, self.x, self.c, self.shape = stage, x, c, tuple(shape)


def _scalar(v):
    """The value of a size-1 constant, else None."""
    return float(v.reshape(-1)[0]) if isinstance(v, np.ndarray) and v.size == 1 else None


def _scale_of(lw, v):
    """(x, c) when the perturbed node ``v`` is x · c for a scalar constant c, else None."""
    if not isinstance(v, int):
        return None
    node = lw.b.graph.nodes[v]
    c = node.params.get("value") if node.op == "mul_const" else None
    if c is None or c.numel() != 1 or lw.b.shape(node.inputs[0]) != node.shape:
        return None
    return node.inputs[0], float(c)


def _erf(lw, name, at, x):
    # the exporters write erf(x / √2) or erf(x · 0.70710677); the builder made either a mul_const
    scaled = _scale_of(lw, x)
    if scaled is None or not (math.isfinite(scaled[1]) and scaled[1] > 0):
        raise ValueError("Erf outside the GELU pattern x · 0.5 · (1 + erf(x / √2))")
    return _Erf("erf", scaled[0], scaled[1], lw.shape(x))


def _gelu_step(lw, node, name, ins, where):
    """Advance a GELU match (see ``_Erf``) by one Add of exactly 1.0, then one Mul by x or by
    a scalar multiple s · x. The result is exact: with k = √2 c,
    s · x · (1 + erf(c x)) = (2 s / k) · gelu(k x), gelu(z) = 0.5 z (1 + erf(z / √2)),
    up to the float64 rounding of the constants k and 2 s / k (as for Div's 1/c)."""
    op = node.op_type
    pending = next(v for v in ins if isinstance(v, _Erf))
    other = [v for v in ins if v is not pending]
    if len(ins) == 2 and len(other) == 1:
        o, x, st = other[0], pending.x, pending.stage
        if op == "Add" and st == "erf" and _scalar(o) == 1.0:
            return _Erf("1+erf", x, pending.c, np.broadcast_shapes(pending.shape, np.shape(o)))
        scaled = (x, 1.0) if isinstance(o, int) and o == x else _scale_of(lw, o)
        if op == "Mul" and st == "1+erf" and scaled is not None and scaled[0] == x:
            return _scaled_gelu(lw, x, pending.c, scaled[1], pending.shape, name)
    raise ValueError(f"unsupported {where}: Erf is read only inside the GELU pattern x · 0.5 · (1 + erf(x / √2)) "
                     f"(with the constant 1 exactly)")


def _scaled_gelu(lw, x, c, s, shape, name):
    """s · x · (1 + erf(c x)) as (2 s / k) · gelu(k x), k = √2 c (see ``_gelu_step``)."""
    b = lw.b
    k = math.sqrt(2.0) * c
    y = b.mul(_gelu(lw, b.mul(x, const(k), name), name), const(2.0 * s / k), name)
    return y if b.shape(y) == tuple(shape) else b.reshape(y, tuple(shape), name)


def _gelu(lw, x, name, approximate="none"):
    return lw.b.unary("gelu" if approximate == "none" else "gelu_tanh", x, name)


def _gelu_rule(lw, name, at, x):
    return _gelu(lw, x, name, at.get("approximate", "none"))


def _neg(lw, name, at, x):
    return lw.b.neg(x, name)


RULES = {
    "Add": _binary("add"), "Sub": _binary("sub"), "Mul": _binary("mul"), "Div": _binary("div"),
    **{op: _compare(op) for op in ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")},
    "Not": _not, "And": _and, "Or": _or, "Xor": _xor,
    "BatchNormalization": _batch_norm, "Cast": _cast, "Concat": _concat, "Conv": _conv,
    "Dropout": _dropout, "Erf": _erf, "Exp": _unary("exp"), "Gelu": _gelu_rule, "Expand": _expand, "Flatten": _flatten, "Gather": _gather,
    "Gemm": _gemm, "Identity": _identity, "LayerNormalization": _layer_norm, "MatMul": _matmul,
    "Neg": _neg, "Pow": _pow, "Reciprocal": _unary("reciprocal"), "ReduceMean": _reduce(True),
    "ReduceSum": _reduce(False), "Relu": _unary("relu"), "Reshape": _reshape, "Shape": _shape,
    "Sigmoid": _unary("sigmoid"), "Slice": _slice, "Softmax": _softmax, "Split": _split, "MaxPool": _max_pool, "Where": _where, "Sqrt": _unary("sqrt"), "Squeeze": _squeeze,
    "Tanh": _unary("tanh"), "Transpose": _transpose, "Unsqueeze": _unsqueeze,
}

#: ONNX operators read by ``read_onnx`` (on the perturbed path; on constants every operator
#: the onnx reference evaluator knows is folded).
ONNX_OPERATORS = tuple(sorted({*RULES, "Constant", "ConstantOfShape"}))
