"""Binding a VNN-LIB 2.0 property's declared tensors to the values of ONNX models.

The standard (VNNLIB-Standard, ``document/chapters/query_language.tex``, "Multiple input and
output declarations", "Hidden output declarations", "Multiple networks"; the command line in
``cli_solver.tex``): a network's declared inputs and outputs are matched to the ONNX graph's
inputs and outputs by order, or by the ONNX names written after their shapes (then every input
and output of the network names one); a hidden tensor names an internal value (a node output).
Each network without ``equal-to`` gets its own ONNX file (``--network NAME=FILE``); one
``(equal-to N)`` is N's model again, one ``(isomorphic-to N)`` a model of N's interface.

``parts(prop, files)`` gives the arguments of ``certify.onnx_graph.read_product`` that build
the graph of exactly the property's layout (X: the inputs in order, inputs equated across
networks at one position, ``Tensor.indices``; Y: per network its outputs, then its hidden
values); ``check_bound(prop, network)`` refuses models whose values do not have the declared
sizes, naming the variable; ``model_dtypes`` gives the ONNX element type bound to each one.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from softcert.certify.onnx_graph import OnnxNetwork
from softcert.certify.vnnlib import Property


def _in_layout(prop: Property, roles, network=None) -> list:
    """The declared tensors of ``roles`` (of ``network``, default all) in the order of their
    vector (by offset)."""
    return sorted((t for t in prop.tensors if t.role in roles and network in (None, t.network)),
                  key=lambda t: t.offset)


def _names(prop) -> list:
    return [n for n, _, _ in prop.networks] or [None]


def read_options(prop: Property, network=None) -> dict:
    """``read_onnx`` keywords for ``network`` of ``prop`` (default: the only one):
    ``inputs`` / ``outputs`` by name when the file names them, else their number (by order);
    ``hidden``: the hidden tensors' ONNX values. A 1.0 property (no tensors): {} (every
    graph input, the first output)."""
    if not prop.tensors:
        return {}
    xs, ys = _in_layout(prop, ("X",), network), _in_layout(prop, ("Y",), network)
    named = all(t.onnx_name is not None for t in xs + ys)
    return {"inputs": [t.onnx_name for t in xs] if named else len(xs),
            "outputs": [t.onnx_name for t in ys] if named else len(ys),
            "hidden": [t.onnx_name for t in _in_layout(prop, ("H",), network)]}


def model_files(prop: Property, given, where: str = "--network") -> dict:
    """network name -> ONNX file for every declared network, from ``given`` ((name, path),
    ...): exactly one for each network not marked ``equal-to`` (the standard's first error
    otherwise), an ``equal-to`` network takes its target's. A 1.0 property: one pair, any
    name (key None)."""
    given = list(given)
    if not prop.networks:
        if len(given) != 1:
            raise ValueError(f"{where}: a VNN-LIB 1.0 property has one network, got {len(given)} files")
        return {None: given[0][1]}
    need = [n for n, rel, _ in prop.networks if rel != "equal-to"]
    names = [n for n, _ in given]
    if sorted(names) != sorted(need):
        declared = [n for n, _, _ in prop.networks]
        raise ValueError(f"{where}: the property declares network{'s' if len(declared) > 1 else ''} "
                         f"{', '.join(repr(n) for n in declared)}: one file for each of {need} (not for those marked "
                         f"equal-to), got {names}")
    files = dict(given)
    for n, rel, target in prop.networks:  # in order: a target is declared before
        if rel == "equal-to":
            files[n] = files[target]
    return files


def parts(prop: Property, files: dict) -> list:
    """``read_product`` parts: per declared network, its file and ``read_options``; with
    several networks each input's ``positions`` in X (inputs equated across networks share
    theirs)."""
    out = []
    for name in _names(prop):
        part = {"model": files[name], **read_options(prop, name)}
        if len(prop.networks) > 1:
            part["positions"] = [t.indices() for t in _in_layout(prop, ("X",), name)]
        out.append(part)
    return out


def check_bound(prop: Property, network: OnnxNetwork, where: str = "property") -> None:
    """ValueError when a declared tensor and the ONNX value bound to it differ in size (the
    flat X and Y would then be cut wrongly)."""
    for name, part in zip(_names(prop), network.parts):
        pairs = list(zip(_in_layout(prop, ("X",), name), part.inputs)) + \
            list(zip(_in_layout(prop, ("Y", "H"), name), part.outputs))
        for t, (value, shape, *_) in pairs:
            if t.size != math.prod(shape):
                kind = {"X": "input", "Y": "output", "H": "hidden value"}[t.role]
                raise ValueError(f"{where}:{t.line}: {t.name} {list(t.shape)} is bound to the ONNX {kind} {value!r} "
                                 f"of shape {list(shape)} ({t.size} != {math.prod(shape)} elements)")


def model_dtypes(prop: Property, network: OnnxNetwork) -> dict:
    """numpy dtype of the ONNX value bound to each declared tensor (by name), and per role
    ("X", "Y") that of the first input and output (a 1.0 property's scalars)."""
    out = {}
    for name, part in zip(_names(prop), network.parts):
        g = part.model.graph
        elem = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)}

        def dtype(value, elem=elem):
            return np.dtype(helper.tensor_dtype_to_np_dtype(elem[value]))

        out.setdefault("X", dtype(part.inputs[0][0]))
        out.setdefault("Y", dtype(part.outputs[0][0]))
        for t, (value, *_) in zip(_in_layout(prop, ("X",), name), part.inputs):
            out[t.name] = dtype(value)
        for t, (value, *_) in zip(_in_layout(prop, ("Y", "H"), name), part.outputs):
            out[t.name] = dtype(value)
    return out


def positions(prop: Property) -> dict:
    """name -> ("X" | "Y", indices) of every declared tensor: where its values are in a
    counterexample's x and y (``certify.solver_interface``)."""
    return {t.name: ("X" if t.role == "X" else "Y", t.indices()) for t in prop.tensors}
