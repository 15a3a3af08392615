"""The VNN-COMP interface: decide a VNN-LIB property on an ONNX network.

``solve(network, regions, timeout, method)`` answers, per the VNN-COMP result words:
- "unsat": for every region and every disjunct (mat, rhs), some row r is proved infeasible,
  i.e. a certified lower bound of mat_r·Y exceeds rhs_r over the box (also tried: the sum of
  the disjunct's rows, a nonnegative combination). Bounds: ``certify.linear_bounds`` with the
  chosen method; when the output is a softmax, the method "vertex" also bounds c·softmax(s)
  exactly over the score box (Vertex-Softmax, ``bounds.vertex_softmax``) and uses the
  output's interval intersected with its exact Vertex-Softmax interval. Boxes not proved are bisected on their
  widest input (at most ``max_boxes`` boxes per region).
  A strict row (mat_r·Y < rhs_r) is proved by a lower bound >= rhs_r.
- "sat": PGD (sign steps, random restarts; 8 x 40 steps on a region, 2 x 10 on each part of
  a split) on the float64 graph, inside the points of the model's input dtype that lie in
  the box as written (``Region.inner_box``), finds x whose forward satisfies a disjunct; x,
  rounded to that dtype and kept in that box, is confirmed only when the ONNX model itself,
  run by onnxruntime in its own dtype, gives y satisfying the property as written: exact
  rationals of x against the box (``Region.contains``) and of y against the rows, strict
  rows strict (``Region.satisfied_exactly``). The counterexample carries that x and y.
- "timeout" when the time budget runs out first, "unknown" otherwise. (The VNN-COMP result
  file writes these words; the VNN-LIB 2.0 solver interface prints "timed-out" for "timeout"
  and its own assignment format: ``certify.solver_interface``.)
Method "bab" decides each region with the branch-and-bound engine of ``certify.verify(...,
method="bab")`` (``certify.bab.branch_and_bound``: splits on nonlinear neurons instead of
input bisection, Vertex-Softmax leaves, the same attack from the leaves' worst points):
falsified = "sat", certified = "unsat", otherwise "unknown" or "timeout".
``write_result(verdict, path)`` writes the VNN-COMP result file.
Several inputs, outputs, hidden values or networks (``certify.vnnlib_binding``): the graph's
input and output are their flat concatenations (``OnnxNetwork.parts``), so everything above
runs unchanged; onnxruntime runs each model on its inputs' positions of x, the hidden values
from a copy of the model that exposes them, and y is the concatenation in the same order.
Device (``solve(..., device=)``, issue 30): the bounds, the branch and bound and the attack's
PGD run where the graph is moved (default: where its constants are, the CPU for a graph read
from a file); the random starts are drawn on the CPU (the same on every device), and a
counterexample is confirmed by onnxruntime on the CPU, in the model's own dtype, wherever
it was found.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from onnx import helper

from softcert.bounds import vertex_softmax
from softcert.certify import bab, crown
from softcert.certify.api import linear_bounds, vertex_bounds
from softcert.certify.lowering import F64
from softcert.certify.methods import METHODS
from softcert.certify.onnx_graph import OnnxNetwork, forward, with_outputs
from softcert.certify.options import BabOptions
from softcert.certify.vnnlib import Property, Region, float_up

RESULTS = ("sat", "unsat", "unknown", "timeout")
#: branch and bound for ``solve(..., method="bab")``: Vertex-Softmax in the leaves, the root's
#: intermediate bounds by CROWN ("full"; the deadline is the whole instance's, shared by its
#: regions)
BAB_OPTIONS = BabOptions(vertex=True, intermediate="full")
#: the methods of certify.METHODS that run on a graph (not the auto_LiRPA baselines)
BOUND_METHODS = tuple(name for name, m in METHODS.items() if not m.needs_model)
#: what ``solve`` takes: those, and "bab" (branch and bound on nonlinear neurons)
SOLVE_METHODS = ("auto",) + BOUND_METHODS + ("bab",)


def chosen_method(network, method: str) -> str:
    """``method``, with "auto" resolved: "vertex" (CROWN with Vertex-Softmax, the exact
    optimum of c·softmax over the score box) where the graph has a softmax over its last axis,
    else "crown" (the two agree on graphs without one). On the VNN-LIB 2.0 test suite's softmax
    cases, crown left 3 of 5 unknown after 10-19 s where vertex proved all in 5-7 s (issue 33)."""
    if method != "auto":
        return method
    return "vertex" if network.graph.attention else "crown"


@dataclass(frozen=True)
class Verdict:
    """``result`` in RESULTS; ``counterexample``: (x, y) flat tuples of floats for "sat"
    (x inside the box at the model's input precision, y the ONNX model's output), else None;
    ``boxes``: input boxes bounded (after splitting; for "bab": leaves bounded)."""

    result: str
    counterexample: tuple | None
    seconds: float
    method: str
    assumptions: str
    boxes: int = 0


#: what each verdict rests on; the arithmetic text is certify.crown's own (never restated by hand)
ASSUMPTIONS = ("unsat: the verifier's bounds on the ONNX model's graph in real arithmetic, over the "
               "property's float64 reading (box outward, strict rows closed). The model's own float32/float64 "
               "rounding is not enclosed; operators that lose precision (casts to float16, bfloat16, integers) "
               "are refused, never dropped. Arithmetic: " + crown.ARITHMETIC + " sat: a concrete input of the "
               "model's dtype inside the box as written, whose onnxruntime output satisfies the property as "
               "written (exact rationals, strictness kept).")


class _Timeout(Exception):
    pass


# ---------------------------------------------------------------- bounds
def _output_softmax(graph):
    """The attention site (``certify.graph.AttentionSite``) whose probabilities are the graph
    output (possibly through a reshape), or None."""
    out = graph.output
    node = graph.nodes[out]
    if node.op == "reshape":
        out = node.inputs[0]
    return next((a for a in graph.attention if a.probs == out), None)


def lower_bounds(graph, xl, xu, C, method="crown"):
    """Certified lower bounds (B, S) of C·output over the boxes [xl, xu] (B, *input shape);
    C: (B, S, *output shape). ``certify.linear_bounds`` with ``method``; for "vertex" also
    the Vertex-Softmax bound of a softmax output (see the module docstring)."""
    if method not in BOUND_METHODS:
        raise ValueError(f"method: expected one of {BOUND_METHODS}, got {method!r}")
    att = _output_softmax(graph)
    if method != "vertex" or att is None:
        return linear_bounds(graph, xl, xu, C, method)
    # one vertex propagation: its bound already keeps the output's own interval, intersected
    # with its exact Vertex-Softmax interval, where tighter
    lo, state = vertex_bounds(graph, xl, xu, C)
    with torch.no_grad():
        # c·softmax(s) exactly over the score box, row by row (a sum of row minima is a
        # lower bound of the minimum of the sum); both the raw and the shifted scores are
        # tried: the raw box is the exact one when the scores are (affine in) the input
        # box, the shifted one is often tighter deeper in a network
        shape = graph.nodes[att.probs].shape
        c = C.reshape(C.shape[0], C.shape[1], -1, shape[-1])
        for key in ("scores", "shifted"):
            sl, su = state.bounds[getattr(att, key)]
            if not (torch.isfinite(sl).all() and torch.isfinite(su).all()):
                continue  # an overflowed score bound: the other bounds stand
            sl = sl.reshape(sl.shape[0], 1, -1, shape[-1]).expand_as(c)
            su = su.reshape(su.shape[0], 1, -1, shape[-1]).expand_as(c)
            lo = torch.maximum(lo, vertex_softmax(c, sl, su).lower.sum(-1))
    return lo.detach()


# ---------------------------------------------------------------- attack
def _dtype_of(model, name):
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    return np.dtype(helper.tensor_dtype_to_np_dtype(types[name]))


def _np_dtype(dtypes):
    """The inputs' dtype (``dtypes``: every input's), or with several the narrowest float one:
    its values are exact in every input's own dtype (float16 in float32 in float64), so a
    point of it is an input."""
    if all(d.kind == "f" for d in dtypes):
        return min(dtypes, key=lambda d: d.itemsize)
    return dtypes[0]


class _Runtime:
    """The ONNX models themselves (``OnnxNetwork.parts``: one, or several in a product graph),
    run by onnxruntime in their own input dtypes (sessions made on first use, from the
    models' bytes), and each region's attack box: the points of ``dtype`` (``_np_dtype``)
    inside the box as written (``Region.inner_box``), or None when there are none. Each
    model's inputs are read from x at their positions, and the outputs (hidden values last,
    model after model) are concatenated, as in the graph. ``device``: where the attack
    evaluates the graph (``network``'s graph must be there; default the CPU)."""

    def __init__(self, network, device=None):
        self.device = torch.device("cpu" if device is None else device)
        #: per part, each input's dtype (read once: ``run`` casts to them on every call)
        self.input_dtypes = [[_dtype_of(p.model, name) for name, _, _ in p.inputs] for p in network.parts]
        flat = [d for ds in self.input_dtypes for d in ds]
        self.network, self.dtype, self.session, self.boxes = network, _np_dtype(flat), None, {}
        self.floating = all(d.kind == "f" and d.itemsize in (2, 4, 8) for d in flat)

    def box(self, region):
        if id(region) not in self.boxes:
            self.boxes[id(region)] = region.inner_box(self.dtype) if self.floating else None
        return self.boxes[id(region)]

    def _sessions(self):
        """Per part, onnxruntime sessions of the model itself (its outputs) and, with hidden
        values, of the model that also returns them (``with_outputs``): outputs come from the
        model as given, whose optimised graph exposing a value could change."""
        import onnxruntime as ort

        if self.session is None:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            self.session = []
            for p in self.network.parts:
                models = [p.model] + ([with_outputs(p.model, p.hidden)] if p.hidden else [])
                self.session.append([ort.InferenceSession(m.SerializeToString(), opts,
                                                          providers=["CPUExecutionProvider"]) for m in models])
        return self.session

    def run(self, x) -> np.ndarray | None:
        """The models' outputs at x (in ``dtype``), then their hidden values, flat,
        concatenated and exactly in float64, or None when onnxruntime cannot run a model or a
        value is not a float (then nothing is confirmed)."""
        x, outs = np.asarray(x).reshape(-1), []
        try:
            for p, sessions, dtypes in zip(self.network.parts, self._sessions(), self.input_dtypes):
                feeds = {name: x[list(pos)].astype(dtype).reshape(shape)
                         for (name, shape, pos), dtype in zip(p.inputs, dtypes)}
                names = [name for name, _ in p.outputs]
                k = len(names) - len(p.hidden)
                outs += sessions[0].run(names[:k], feeds)
                if k < len(names):
                    outs += sessions[1].run(names[k:], feeds)
        except Exception:  # noqa: BLE001 - onnxruntime's errors have many types: no confirmation
            return None
        outs = [np.asarray(o) for o in outs]
        if any(o.dtype.kind != "f" for o in outs):
            return None
        return np.concatenate([o.reshape(-1).astype(np.float64) for o in outs])


def onnx_output(network: OnnxNetwork, x) -> np.ndarray:
    """The ONNX model's own output at x (flat, cast to its input dtype), by onnxruntime,
    flattened and converted exactly to float64; ValueError when onnxruntime cannot run it."""
    rt = _Runtime(network)
    y = rt.run(np.asarray(x).astype(rt.dtype))
    if y is None:
        raise ValueError("network: onnxruntime cannot run the ONNX model (or an output is not a float)")
    return y


def _violation(y, region):
    """min over disjuncts of max_r (mat_r·y - rhs_r): <= 0 iff y satisfies the region (on y's device)."""
    out = []
    for mat, rhs in region.disjuncts:
        if len(rhs) == 0:
            out.append(torch.full((y.shape[0],), -torch.inf, dtype=F64, device=y.device))
            continue
        m, r = torch.as_tensor(mat, dtype=F64, device=y.device), torch.as_tensor(rhs, dtype=F64, device=y.device)
        out.append((y @ m.T - r).max(-1).values)
    return torch.stack(out, -1).min(-1).values


def _attack(rt, region, box, deadline, gen, restarts=8, steps=40, starts=None):
    """A counterexample (x, y) confirmed by ``_check``, or None. PGD on the float64 graph
    within ``box`` (lo, hi), a part of the region's input box, intersected with the region's
    attack box (points of the box as written). ``starts`` (P, n): start points (default: the
    centre and random points, drawn on the CPU by ``gen``). PGD runs on ``rt.device``."""
    inner = rt.box(region)
    if inner is None:
        return None  # no input of the model's dtype lies in the box as written
    lo, hi = np.maximum(box[0], inner[0].astype(np.float64)), np.minimum(box[1], inner[1].astype(np.float64))
    if np.any(lo > hi):
        return None
    n = lo.shape[0]
    lo_t, hi_t = torch.as_tensor(lo, dtype=F64, device=rt.device), torch.as_tensor(hi, dtype=F64, device=rt.device)
    width = hi_t - lo_t
    if starts is None:
        x = lo_t + width * torch.rand(restarts, n, dtype=F64, generator=gen, device=gen.device).to(rt.device)
        x[0] = lo_t + width / 2
    else:
        starts = torch.as_tensor(starts, dtype=F64).to(rt.device)
        x = torch.minimum(torch.maximum(starts.reshape(-1, n), lo_t), hi_t)
        restarts = x.shape[0]
    step = 2.5 * width / steps
    for k in range(steps + 1):
        if time.monotonic() > deadline:
            raise _Timeout
        x = x.detach().requires_grad_(True)
        v = _violation(forward(rt.network, x).reshape(restarts, -1), region)
        for i in torch.nonzero(v <= 0).flatten().tolist():
            found = _check(rt, region, x[i].detach().cpu().numpy())
            if found is not None:
                return found
        if k == steps:
            break
        (g,) = torch.autograd.grad(v[torch.isfinite(v)].sum(), x) if torch.isfinite(v).any() else (None,)
        if g is None:
            break
        with torch.no_grad():
            x = torch.minimum(torch.maximum(x - step * g.sign(), lo_t), hi_t)
    return None


def _check(rt, region, x):
    """(x, y) when x, rounded to the model's input dtype and moved into the region's attack
    box, lies in the box as written (exact rationals) and onnxruntime's output y there
    satisfies the region as written (exact rationals of y, strict rows strict); else None."""
    lo, hi = rt.box(region)
    xd = np.minimum(np.maximum(np.asarray(x).astype(rt.dtype), lo), hi)  # exact: one dtype
    y = rt.run(xd)
    if y is None or not region.satisfied_exactly(y) or not region.contains(xd):
        return None
    return tuple(float(v) for v in xd), tuple(float(v) for v in y)


# ---------------------------------------------------------------- solve
def _spec(region, n_out):
    """Rows of all disjuncts plus each multi-row disjunct's sum: (mat, rhs, owner). A row is
    proved infeasible when its lower bound is > rhs; for a strict row (mat·Y < r) >= r
    suffices, so its rhs is moved one float down (lb > prev(r) iff lb >= r)."""
    rows, rhs, owner = [], [], []
    for d, ((m, r), strict) in enumerate(zip(region.disjuncts, region.strict())):
        proof = np.where(strict & np.isfinite(r), np.nextafter(r, -np.inf), r)
        for i in range(len(r)):
            rows.append(m[i])
            rhs.append(proof[i])
            owner.append(d)
        if len(r) > 1 and np.all(np.isfinite(r)):
            # the sum of the rows, used only when its coefficients are exact in float64
            col = [sum((Fraction(float(v)) for v in m[:, j]), Fraction(0)) for j in range(m.shape[1])]
            if all(Fraction(float(c)) == c for c in col):
                # with the rows' own rhs (not moved): lb > Σ rhs means some row exceeds its rhs
                rows.append(np.array([float(c) for c in col]))
                rhs.append(float_up(sum((Fraction(float(v)) for v in r), Fraction(0))))
                owner.append(d)
    return (np.array(rows).reshape(len(rows), n_out), np.array(rhs, dtype=np.float64), np.array(owner, dtype=np.int64))


def _proved(network, region, boxes, method, device):
    """Per box: is every disjunct infeasible on it? Bounded on ``device`` (the graph's)."""
    mat, rhs, owner = _spec(region, network.n_outputs)
    nd = len(region.disjuncts)
    if any(len(r) == 0 for _, r in region.disjuncts):
        return [False] * len(boxes)
    shape = (len(boxes), *network.input_shape)
    xl = torch.as_tensor(np.stack([b[0] for b in boxes]), dtype=F64, device=device).reshape(shape)
    xu = torch.as_tensor(np.stack([b[1] for b in boxes]), dtype=F64, device=device).reshape(shape)
    C = torch.as_tensor(mat, dtype=F64, device=device).reshape(1, len(rhs), *network.output_shape).expand(
        len(boxes), -1, *network.output_shape)
    lo = lower_bounds(network.graph, xl, xu, C, method).cpu().numpy()
    infeasible = lo > rhs[None, :]  # (B, S)
    out = []
    for b in range(len(boxes)):
        dead = np.zeros(nd, dtype=bool)
        dead[owner[infeasible[b]]] = True
        out.append(bool(dead.all()))
    return out


def _bounding_device(network, device) -> torch.device:
    """``device`` as a torch.device (ValueError naming it when torch reads no device there),
    or for None the device of the graph's constants (the CPU for a graph without any)."""
    if device is None:
        return network.graph.device or torch.device("cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device: {device!r} is not a device (expected e.g. 'cpu', 'cuda' or 'cuda:0')") from None


def solve(network: OnnxNetwork, regions, timeout: float, method: str = "auto", *, max_boxes: int = 64,
          seed: int = 0, device=None) -> Verdict:
    """Decide the property (``regions``: a ``certify.vnnlib.Property`` or Regions) on
    ``network`` within ``timeout`` seconds. See the module docstring for the meaning.
    ``device``: where to bound and attack (the graph is moved there, ``OnnxNetwork.to``);
    None: where the graph's constants are (the CPU for a graph without any)."""
    start = time.monotonic()
    if isinstance(regions, Property):
        regions = regions.regions
    regions = tuple(regions)
    if method not in SOLVE_METHODS:
        raise ValueError(f"method: expected one of {SOLVE_METHODS}, got {method!r}")
    if not (isinstance(timeout, (int, float)) and np.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    if int(max_boxes) < 1:
        raise ValueError(f"max_boxes: expected >= 1, got {max_boxes!r}")
    for k, r in enumerate(regions):
        if not isinstance(r, Region):
            raise ValueError(f"regions: item {k} is a {type(r).__name__}, not a certify.vnnlib.Region")
        if r.lower.shape != (network.n_inputs,):
            raise ValueError(f"regions: region {k} has {r.lower.size} inputs, the network {network.n_inputs}")
        if any(m.shape[1] != network.n_outputs for m, _ in r.disjuncts):
            raise ValueError(f"regions: region {k} constrains outputs of size other than {network.n_outputs}")
        if not (np.all(np.isfinite(r.lower)) and np.all(np.isfinite(r.upper)) and np.all(r.lower <= r.upper)):
            raise ValueError(f"regions: region {k} has a non-finite or empty input box")
    deadline = start + float(timeout)
    method = chosen_method(network, method)
    device = _bounding_device(network, device)
    network = network.to(device)
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same starts on every device
    rt = _Runtime(network, device)

    def verdict(result, cex=None, boxes=0):
        return Verdict(result, cex, time.monotonic() - start, method, ASSUMPTIONS, boxes)

    nboxes = 0
    try:
        # a cheap attack on every region first: most "sat" instances fall here
        for r in regions:
            cex = _attack(rt, r, (r.lower, r.upper), deadline, gen, restarts=4, steps=10)
            if cex is not None:
                return verdict("sat", cex)
        if method == "bab":
            return _solve_bab(rt, regions, deadline, gen, verdict)
        unknown = False
        for r in regions:
            queue, budget, open_ = [(r.lower, r.upper)], int(max_boxes), False
            while queue and not open_:
                if time.monotonic() > deadline:
                    raise _Timeout
                batch, queue = queue[:8], queue[8:]
                # parts of the box outside the input polytope hold no input of the region
                batch = [b for b in batch if not r.excludes(*b)]
                if not batch:
                    continue
                nboxes += len(batch)
                budget -= len(batch)
                for (lo, hi), ok in zip(batch, _proved(network, r, batch, method, device)):
                    if ok:
                        continue
                    # the full attack on the whole box, a light one on its parts
                    root = lo is r.lower and hi is r.upper
                    cex = _attack(rt, r, (lo, hi), deadline, gen, *((8, 40) if root else (2, 10)))
                    if cex is not None:
                        return verdict("sat", cex, nboxes)
                    if budget - len(queue) < 2 or not np.any(hi > lo):
                        unknown = open_ = True
                        continue
                    d = int(np.argmax(hi - lo))
                    mid = lo[d] + (hi[d] - lo[d]) / 2
                    left_hi, right_lo = hi.copy(), lo.copy()
                    left_hi[d], right_lo[d] = mid, mid
                    queue += [(lo, left_hi), (right_lo, hi)]
        return verdict("unknown" if unknown else "unsat", None, nboxes)
    except _Timeout:
        return verdict("timeout", None, nboxes)


def _solve_bab(rt, regions, deadline, gen, verdict):
    """Each region by ``certify.bab.branch_and_bound``: one group of rows per disjunct (a
    disjunct is infeasible on a leaf when one of its rows, or their sum, is proved). On
    ``rt.device``, where ``rt.network``'s graph is."""
    network, device = rt.network, rt.device
    unknown, leaves = False, 0
    for r in regions:
        if any(len(rhs) == 0 for _, rhs in r.disjuncts):
            unknown = True  # an unconstrained disjunct is never infeasible
            continue
        mat, rhs, owner = _spec(r, network.n_outputs)
        shape = tuple(network.input_shape)
        xl = torch.as_tensor(r.lower, dtype=F64, device=device).reshape(1, *shape)
        xu = torch.as_tensor(r.upper, dtype=F64, device=device).reshape(1, *shape)
        C = torch.as_tensor(mat, dtype=F64, device=device).reshape(len(rhs), *network.output_shape)

        def falsify(starts, r=r):
            try:
                if starts is None:
                    return _attack(rt, r, (r.lower, r.upper), deadline, gen, 8, 40)
                return _attack(rt, r, (r.lower, r.upper), deadline, gen, steps=10,
                               starts=starts.reshape(starts.shape[0], -1))
            except _Timeout:
                return None

        out = bab.branch_and_bound(network.graph, xl, xu, bab.Rows(C, rhs, owner), deadline=deadline,
                                   options=BAB_OPTIONS, falsify=falsify, centre=(xl + xu) / 2)
        leaves += out.bounded
        if out.counterexample is not None:
            return verdict("sat", out.counterexample, leaves)
        if out.timed_out:
            raise _Timeout
        unknown |= not all(out.proved)
    return verdict("unknown" if unknown else "unsat", None, leaves)


def result_text(verdict: Verdict) -> str:
    """The VNN-COMP result file's text (the VNN-COMP 1.0 form, which VNN-COMP's scripts
    read): the word, then for "sat" the assignment ``((X_0 v) ... (Y_0 v) ...)`` with flat
    indices and repr-exact floats. The VNN-LIB 2.0 form: ``certify.solver_interface``."""
    if verdict.result not in RESULTS:
        raise ValueError(f"verdict: result {verdict.result!r} is not one of {RESULTS}")
    if verdict.result != "sat":
        return verdict.result + "\n"
    if verdict.counterexample is None:
        raise ValueError("verdict: 'sat' without a counterexample")
    x, y = verdict.counterexample
    pairs = [f"(X_{i} {float(v)!r})" for i, v in enumerate(x)] + [f"(Y_{j} {float(v)!r})" for j, v in enumerate(y)]
    return "sat\n(" + "\n ".join(pairs) + ")\n"


def write_result(verdict: Verdict, path) -> str:
    """Write the VNN-COMP result file (see ``result_text``); returns the path."""
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(result_text(verdict))
    return path
