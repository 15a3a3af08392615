"""certify.vnncomp: a "sat" is a counterexample of the property as written. Its x lies in the
box as typed (exact rationals of the decimal literals, strict bounds honoured) and is a value
of the model's input dtype; onnxruntime, run here independently on the ONNX bytes, gives
exactly the reported y, which satisfies the rows as typed (exact rationals, strict rows
strict). "unsat" on a linear model is checked against its exact minimum over the box
(rationals). Strict properties may be proved with their closure (lb >= rhs)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from softcert.certify import vnncomp
from softcert.certify.onnx_graph import read_onnx
from softcert.certify.vnncomp import solve
from softcert.certify.vnnlib import parse_vnnlib

NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}


def onnx_model(nodes, inits, n_in, n_out, elem=TensorProto.FLOAT):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", elem, (1, n_in))],
                          [helper.make_tensor_value_info("y", elem, (1, n_out))],
                          [numpy_helper.from_array(np.asarray(v, NP[elem]), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    return m


def identity(elem=TensorProto.FLOAT):
    return onnx_model([helper.make_node("Identity", ["x"], ["y"])], {}, 1, 1, elem)


def softmax2():
    return onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {}, 2, 2)


def ort_run(model, x):
    """onnxruntime's output at x (in the model's input dtype), as computed."""
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    dtype = np.float64 if inp.type == "tensor(double)" else np.float32
    return s.run(None, {inp.name: np.asarray(x, dtype).reshape(1, -1)})[0].reshape(-1)


def vnnlib_text(box, rows, n_out):
    """box: [(lo, hi, lo_strict, hi_strict)] decimal strings; rows: disjuncts of
    ([(j, coef)], op, rhs) with op '<' or '<='."""
    s = "".join(f"(declare-const X_{i} Real)\n" for i in range(len(box)))
    s += "".join(f"(declare-const Y_{j} Real)\n" for j in range(n_out))
    for i, (lo, hi, ls, hs) in enumerate(box):
        s += f"(assert ({'>' if ls else '>='} X_{i} {lo}))\n(assert ({'<' if hs else '<='} X_{i} {hi}))\n"
    terms = []
    for d in rows:
        atoms = [f"({op} (+ {' '.join(f'(* {c} Y_{j})' for j, c in coefs)}) {rhs})" for coefs, op, rhs in d]
        terms.append("(and " + " ".join(atoms) + ")")
    return s + "(assert (or " + " ".join(terms) + "))\n"


def check_sat(model, box, rows, cex):
    """The oracle: x in the box as typed and of the input dtype, onnxruntime gives y, and y
    satisfies some disjunct as typed."""
    x, y = cex
    dtype = np.float64 if model.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE else np.float32
    assert all(float(dtype(v)) == v for v in x), "x is not a value of the model's input dtype"
    for v, (lo, hi, ls, hs) in zip(x, box):
        q = Fraction(v)
        assert (q > Fraction(lo) if ls else q >= Fraction(lo)) and (q < Fraction(hi) if hs else q <= Fraction(hi))
    y_ort = ort_run(model, x)
    assert [float(v) for v in y_ort] == list(y), "the reported y is not onnxruntime's"
    q = [Fraction(float(v)) for v in y_ort]
    ok = [all((sum(Fraction(c) * q[j] for j, c in coefs) < Fraction(r)) if op == "<" else
              (sum(Fraction(c) * q[j] for j, c in coefs) <= Fraction(r)) for coefs, op, r in d) for d in rows]
    assert any(ok), "onnxruntime's output does not satisfy the property as written"


# ---------------------------------------------------------------- the cases
@pytest.mark.parametrize("method", ["crown", "vertex", "bab"])
def test_strict_softmax_is_not_sat(method):
    """Softmax on [-1000, 1000]^2, Y_0 < 0 or Y_0 > 1: unsat (Y_0 in (0, 1) exactly; in float32
    it can round to 0.0 or 1.0, and 0.0 < 0.0 is false). It was "sat" at Y = (0, 1)."""
    box = [("-1000.0", "1000.0", False, False)] * 2
    rows = [[([(0, "1")], "<", "0.0")], [([(0, "-1")], "<", "-1.0")]]
    v = solve(read_onnx(softmax2()), parse_vnnlib(vnnlib_text(box, rows, 2)), 4, method, max_boxes=4)
    assert v.result != "sat" and v.counterexample is None
    if method == "vertex":
        assert v.result == "unsat"  # the closure proves it: 0 <= Y_0 <= 1 (lb >= rhs for a strict row)


def test_strict_identity_is_not_sat_at_the_boundary():
    """Y = X on [0.5, 1], Y_0 < 0.5: it was "sat" at X = 0.5. With < 0.75: sat below 0.75."""
    net = read_onnx(identity())
    box = [("0.5", "1", False, False)]
    v = solve(net, parse_vnnlib(vnnlib_text(box, [[([(0, "1")], "<", "0.5")]], 1)), 5, max_boxes=4)
    assert v.result != "sat"
    rows = [[([(0, "1")], "<", "0.75")]]
    v = solve(net, parse_vnnlib(vnnlib_text(box, rows, 1)), 5, max_boxes=4)
    assert v.result == "sat"
    check_sat(identity(), box, rows, v.counterexample)


def test_counterexample_lies_in_the_box_as_written():
    """Y = X (float64) on X_0 in [0.1, 0.2], Y_0 <= 0.0999...9 (30 nines): unsat (the least
    float64 >= 0.1 is above it). It was "sat" at X_0 = 0.09999999999999999 < 0.1 (inside the
    outward-rounded box only)."""
    model = identity(TensorProto.DOUBLE)
    box = [("0.1", "0.2", False, False)]
    rows = [[([(0, "1")], "<=", "0." + "0" + "9" * 30)]]
    v = solve(read_onnx(model), parse_vnnlib(vnnlib_text(box, rows, 1)), 5, max_boxes=4)
    assert v.result != "sat"
    rows = [[([(0, "1")], "<=", "0.1000000000000000055511151231257827021181583404541015625")]]  # float64(0.1)
    v = solve(read_onnx(model), parse_vnnlib(vnnlib_text(box, rows, 1)), 5, max_boxes=4)
    assert v.result == "sat" and v.counterexample[0] == (0.1,)
    check_sat(model, box, rows, v.counterexample)


def test_sat_needs_onnxruntime(monkeypatch):
    """Without an onnxruntime confirmation (here: it cannot run) there is no "sat"."""
    box = [("0.5", "1", False, False)]
    prop = parse_vnnlib(vnnlib_text(box, [[([(0, "1")], "<=", "0.75")]], 1))
    net = read_onnx(identity())
    assert solve(net, prop, 5, max_boxes=2).result == "sat"
    monkeypatch.setattr(vnncomp._Runtime, "run", lambda self, x: None)
    for method in ("crown", "bab"):
        assert solve(net, prop, 5, method, max_boxes=2).result == "unknown"


def test_no_point_of_the_input_dtype_in_the_box():
    """X_0 in [0.1, 0.1] holds no float32: Y_0 <= 1 is true there in reals but no float32
    input exists, so no counterexample can be confirmed; nothing crashes."""
    prop = parse_vnnlib(vnnlib_text([("0.1", "0.1", False, False)], [[([(0, "1")], "<=", "1")]], 1))
    v = solve(read_onnx(identity()), prop, 5, max_boxes=2)
    assert v.result == "unknown"


# ---------------------------------------------------------------- fuzz over near ties
def to_decimal(q: Fraction) -> str:
    """The exact decimal of a rational whose denominator is 2^a 5^b."""
    sign, q = ("-" if q < 0 else ""), abs(q)
    k = 0
    while (q * 10 ** k).denominator != 1:
        k += 1
    digits = str((q * 10 ** k).numerator).rjust(k + 1, "0")
    return sign + (digits[:-k] + "." + digits[-k:] if k else digits)


def near_tie_case(rng):
    """A linear or ReLU network (float32 or float64), a decimal box, and c·Y (<|<=) t with t at
    the linear model's exact minimum over the box plus a tiny offset."""
    elem = [TensorProto.FLOAT, TensorProto.DOUBLE][rng.integers(2)]
    dt = NP[elem]
    n_in, n_out = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    W = rng.integers(-4, 5, (n_out, n_in)) / 4 + rng.normal(0, 1e-3, (n_out, n_in))
    b = rng.normal(0, 1, n_out)
    W, b = W.astype(dt), b.astype(dt)
    relu = bool(rng.integers(2))
    nodes = [helper.make_node("MatMul", ["x", "Wt"], ["h"]), helper.make_node("Add", ["h", "b"], ["y" if not relu else "a"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    model = onnx_model(nodes, {"Wt": W.T, "b": b}, n_in, n_out, elem)
    centre = rng.uniform(-1, 1, n_in).round(int(rng.integers(1, 4)))
    width = rng.choice([0.1, 0.25, 0.3, 0.001], n_in)
    box = [(to_decimal(Fraction(str(c)) - Fraction(str(w))), to_decimal(Fraction(str(c)) + Fraction(str(w))),
            bool(rng.integers(2)), bool(rng.integers(2))) for c, w in zip(centre, width)]
    c = [Fraction(int(v)) for v in rng.integers(-2, 3, n_out)]
    c[int(rng.integers(n_out))] = Fraction(1)
    g = [sum(c[j] * Fraction(float(W[j, i])) for j in range(n_out)) for i in range(n_in)]
    lo, hi = [Fraction(a) for a, _, _, _ in box], [Fraction(h) for _, h, _, _ in box]
    exact = sum(min(gi * a, gi * h) for gi, a, h in zip(g, lo, hi)) + sum(c[j] * Fraction(float(b[j])) for j in range(n_out))
    delta = [Fraction(0), Fraction(1, 2 ** 60), -Fraction(1, 2 ** 60), Fraction(1, 2 ** 30), -Fraction(1, 2 ** 30),
             Fraction(1, 100)][rng.integers(6)]
    op = ["<", "<="][rng.integers(2)]
    rows = [[([(j, to_decimal(c[j])) for j in range(n_out) if c[j]], op, to_decimal(exact + delta))]]
    return model, box, rows, exact if not relu else None


@pytest.mark.parametrize("seed", range(6))
def test_near_tie_fuzz(seed):
    """Every "sat" passes the oracle; every "unsat" of a linear model is true in exact real
    arithmetic over the box as written (the bound's claim)."""
    rng = np.random.default_rng(seed)
    counts = {}
    for k in range(10):
        model, box, rows, exact = near_tie_case(rng)
        method = ["crown", "vertex", "bab"][k % 3]
        v = solve(read_onnx(model), parse_vnnlib(vnnlib_text(box, rows, model.graph.output[0].type.tensor_type.shape
                                                               .dim[1].dim_value)), 4, method, max_boxes=4)
        counts[v.result] = counts.get(v.result, 0) + 1
        if v.result == "sat":
            check_sat(model, box, rows, v.counterexample)
        elif v.result == "unsat" and exact is not None:
            (coefs, op, t), = rows[0]
            assert exact > Fraction(t) or (op == "<" and exact == Fraction(t))
    assert set(counts) <= {"sat", "unsat", "unknown", "timeout"} and counts.get("sat", 0) >= 1


def test_verdict_assumptions_are_the_verifiers_own_arithmetic():
    """The assumption text is generated from certify.crown.ARITHMETIC (issue 32: it still
    described the retired 1e-9 widening) and says what unsat is about: real arithmetic."""
    from softcert.certify import crown, vnncomp

    assert crown.ARITHMETIC in vnncomp.ASSUMPTIONS
    assert "1e-9" not in vnncomp.ASSUMPTIONS and "real arithmetic" in vnncomp.ASSUMPTIONS
