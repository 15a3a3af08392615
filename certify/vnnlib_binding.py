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
``solve(network, prop, ...)`` is ``certify.vnncomp.solve`` with the inputs that a region's
disjuncts equate read as one variable (``merged_network``, ``Region.merged``).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from onnx import helper

from softcert.certify import vnncomp
from softcert.certify.onnx_graph import OnnxNetwork, read_product
from softcert.certify.vnnlib import Property, class_positions


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


def merged_network(network: OnnxNetwork, reps) -> OnnxNetwork:
    """``network``'s models read again with input i taken from the position of its class in
    a shorter X (one per distinct ``reps[i]``, in order; ``Region.representatives``): the
    graph of a region whose disjuncts equate inputs, so that its bounds see them as one."""
    at = class_positions(reps)
    specs = [{"model": p.model, "inputs": [name for name, _, _ in p.inputs],
              "outputs": [name for name, _ in p.outputs[:len(p.outputs) - len(p.hidden)]], "hidden": list(p.hidden),
              "positions": [[at[i] for i in pos] for _, _, pos in p.inputs]} for p in network.parts]
    return read_product(specs, len(set(reps)))


def solve(network: OnnxNetwork, prop, timeout: float, method: str = "auto", **options):
    """``certify.vnncomp.solve`` of ``prop`` (a Property or Regions) on ``network``, with
    inputs that a region's disjuncts equate (``(== X[0] A[0])`` inside an ``or``:
    ``Region.representatives``) made one variable: the regions are grouped by what they
    equate, and each group with equalities is solved on ``merged_network`` over its
    ``Region.merged`` regions (bounding them apart over the box would ignore the equality, and
    no attack point would meet it). A counterexample is expanded back (``Region.expand``) and
    checked against the region as written. Groups share ``timeout``; the first ``sat`` ends
    the search, else ``timeout``, ``unknown`` or ``unsat`` over all groups."""
    start, regions = time.monotonic(), tuple(getattr(prop, "regions", prop))
    groups: dict = {}
    for r in regions:
        groups.setdefault(r.representatives(), []).append(r)
    done = []
    for reps, group in groups.items():
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            done.append(dataclasses.replace(done[-1], result="timeout") if done else
                        vnncomp.Verdict("timeout", None, 0.0, method, vnncomp.ASSUMPTIONS))
            break
        v = _solve_group(network, reps, group, left, method, options)
        if v.result == "sat":
            return dataclasses.replace(v, seconds=time.monotonic() - start)
        done.append(v)
    if not done:
        return vnncomp.solve(network, (), timeout, method, **options)
    word = next((w for w in ("timeout", "unknown") if any(v.result == w for v in done)), "unsat")
    return dataclasses.replace(done[0], result=word, seconds=time.monotonic() - start,
                               boxes=sum(v.boxes for v in done))


def _solve_group(network, reps, group, timeout, method, options):
    """One group of ``solve``: the regions as they are when they equate nothing, else merged
    (regions that hold no input dropped) with the counterexample expanded and checked."""
    if reps == tuple(range(len(reps))):
        return vnncomp.solve(network, group, timeout, method, **options)
    merged = [(r, m) for r, m in ((r, r.merged()) for r in group) if m is not None]
    v = vnncomp.solve(merged_network(network, reps), [m for _, m in merged], timeout, method, **options)
    if v.result != "sat":
        return v
    x, y = v.counterexample
    x = group[0].expand(x)
    if not any(r.contains(x) and r.satisfied_exactly(y) for r, _ in merged):  # never a wrong sat
        return dataclasses.replace(v, result="unknown", counterexample=None)
    return dataclasses.replace(v, counterexample=(tuple(float(q) for q in x), y))
