"""The verifier's graph: nodes of registered operators (``certify.ops``) in topological order.

Front ends build it through ``certify.lowering.Builder`` (``certify.trace`` for torch
modules, ``certify.onnx_graph`` for ONNX files); ``certify.crown`` propagates bounds over it.
Node shapes are the full traced shapes (the model's own batch axis, size 1, included); at run
time every value carries one more leading axis, the batch of input boxes. The constants of the
nodes (weights, index maps, masks) live on one device, ``Graph.device`` (the traced model's);
inputs must be on it, and ``Graph.to`` gives the graph on another.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch

from softcert.certify import ops


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


@dataclass(frozen=True)
class AttentionSite:
    """One softmax over the last axis, by node ids: its ``scores``, the ``shifted`` scores
    (minus the anchor key's), the probabilities ``probs`` and, when they multiply a value
    matrix, the ``values`` and the product ``pv`` (else None): what Vertex-Softmax needs."""

    scores: int
    shifted: int
    probs: int
    values: int | None = None
    pv: int | None = None
    name: str = ""


class Graph:
    """Nodes in topological order; node 0 is the input, the last node the output.
    ``attention``: one ``AttentionSite`` per softmax over the last axis."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.attention: list[AttentionSite] = []

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

    @property
    def device(self):
        """The device of the nodes' constant tensors (None: the graph has none)."""
        for node in self.nodes:
            for t in _tensors(node.params.values()):
                return t.device
        return None

    def to(self, device) -> Graph:
        """This graph with every constant tensor on ``device`` (self when they all are there)."""
        device = torch.device(device)
        if all(t.device == device for node in self.nodes for t in _tensors(node.params.values())):
            return self
        out = copy.copy(self)
        out.nodes = [dataclasses.replace(n, params={k: _moved(v, device) for k, v in n.params.items()})
                     for n in self.nodes]
        out.attention = list(self.attention)
        return out

    def values(self, x, consts=None, *, lifted=False):
        """Every node's value, in node order, at inputs ``x`` (N, *input shape without the
        traced batch axis); each value is (N, *node shape). ``consts``: node id -> softmax
        shift index for one input box (a ``crown.BoundState``'s), used for all N inputs so
        that shifted scores match the bounds; without it each row shifts by its own argmax
        (the same softmax, other intermediate values). ``lifted``: ``x`` already has the
        traced batch axis (N, *input shape) and is evaluated in its own dtype."""
        vals = [x if lifted else x.to(torch.float64).unsqueeze(1)]
        for i, node in enumerate(self.nodes[1:], 1):
            c = None if consts is None else consts.get(i)
            if c is not None:
                c = c.expand(len(x), *c.shape[1:])
            vals.append(ops.forward(node, [vals[j] for j in node.inputs], c))
        return vals


def _tensors(values):
    """The tensors among ``values``, looking into tuples and lists (e.g. cat's pieces)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _tensors(v)


def _moved(v, device):
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (tuple, list)):
        return type(v)(_moved(x, device) for x in v)
    return v


class GraphModule(torch.nn.Module):
    """A verifier graph as a torch module (e.g. a model read from ONNX): forward(x) runs the
    graph on inputs (B, *input shape without the traced batch axis) and returns its output
    (B, *output shape without it). Differentiable, so PGD runs on it; ``certify.verify`` uses
    ``graph`` itself instead of tracing."""

    def __init__(self, graph: Graph):
        super().__init__()
        if not isinstance(graph, Graph):
            raise ValueError(f"graph: expected a certify Graph, got {type(graph).__name__}")
        self.graph = graph
        # a parameter-free module still needs a dtype for callers that ask for one, and a
        # device: the graph's (``.to(device)`` moves the graph with it, see ``_apply``)
        self.register_buffer("dtype_marker", torch.zeros((), dtype=torch.float64, device=graph.device or "cpu"))

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.graph = self.graph.to(self.dtype_marker.device)  # the graph's constants keep float64
        return out

    def forward(self, x):
        return self.graph.values(x)[-1].squeeze(1)
