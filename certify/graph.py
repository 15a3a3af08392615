"""The verifier's graph: nodes of registered operators (``certify.ops``) in topological order.

Front ends build it through ``certify.lowering.Builder`` (``certify.trace`` for torch
modules, ``certify.onnx_graph`` for ONNX files); ``certify.crown`` propagates bounds over it.
Node shapes are the full traced shapes (the model's own batch axis, size 1, included); at run
time every value carries one more leading axis, the batch of input boxes.
"""
from __future__ import annotations

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
        # a parameter-free module still needs a dtype for callers that ask for one
        self.register_buffer("dtype_marker", torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        return self.graph.values(x)[-1].squeeze(1)
