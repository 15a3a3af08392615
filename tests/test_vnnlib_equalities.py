"""Equalities of inputs inside a disjunction (issue 33): ``(or (and (== A[0,0] X[0,0]) ...)
...)`` makes the two inputs one variable of that disjunct's region (``Region.representatives``,
``Region.merged``): its box is the intersection of theirs (so an input equated with a bounded
one needs no bounds of its own), the graph of that region reads both from one position
(``vnnlib_binding.merged_network``) and a counterexample gives both the same value. An input
left without bounds in some disjunct is refused, naming it, the lines and what to write.

Models: f(x) = Relu(x W + b), g = f + 0.001 (tests/test_vnnlib_networks.py), every ReLU
active on the boxes used, so C - Y = 0.001 wherever A = X; and d(x) = x0 - x1, 0 exactly
where x0 = x1 (float32 too). Boxes of X and A have different centres, so no attack point
meets the equality by chance (the centre start of both boxes differs)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_vnnlib_networks import ort_run, relu_model

from softcert.certify import solver_interface as si
from softcert.certify.onnx_graph import read_onnx
from softcert.certify.vnnlib import parse_vnnlib
from softcert.certify.vnnlib_binding import merged_network, solve
from softcert.cli import main

HEAD = ("(vnnlib-version <2.0>)\n(declare-network f\n  (declare-input X real [1,2])\n  (declare-output Y real [1,2]))\n"
        "(declare-network g (isomorphic-to f)\n  (declare-input A real [1,2])\n  (declare-output C real [1,2]))\n"
        "(assert (and (>= X[0,0] 0.5) (<= X[0,0] 1.0) (>= X[0,1] 0.5) (<= X[0,1] 1.0)))\n")
A_BOX = "(assert (and (>= A[0,0] 0.3) (<= A[0,0] 0.8) (>= A[0,1] 0.6) (<= A[0,1] 1.0)))\n"
SAME = "(== A[0,0] X[0,0]) (== A[0,1] X[0,1])"
#: a second disjunct that no input satisfies: Y0 - C0 <= f(1, 1)0 - g(0.3, 0.6)0 < 0.81
FAR = "(>= (- Y[0,0] C[0,0]) 5.0)"


@pytest.fixture
def models(tmp_path):
    return relu_model(tmp_path / "f.onnx"), relu_model(tmp_path / "g.onnx", 0.001)


def verify(tmp_path, capsys, text, models):
    (tmp_path / "q.vnnlib").write_text(text)
    rc = main(["vnnlib", "verify", str(tmp_path / "q.vnnlib"), "--network", f"f={models[0]}",
               "--network", f"g={models[1]}", "--timeout", "60"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_an_equality_in_a_disjunct_merges_that_region_only():
    prop = parse_vnnlib(HEAD + A_BOX + f"(assert (or (and {SAME} (>= (- C[0,0] Y[0,0]) 0.0005)) {FAR}))\n")
    equal, apart = sorted(prop.regions, key=lambda r: len(r.input_rows), reverse=True)
    assert equal.representatives() == (0, 1, 0, 1) and apart.representatives() == (0, 1, 2, 3)
    # the box of X and A in the disjunct that equates them: the intersection of theirs
    assert equal.exact_box()[2] == equal.exact_box()[0] == (Fraction(1, 2), False, Fraction(4, 5), False)
    assert equal.exact_box()[3] == (Fraction(3, 5), False, Fraction(1), False)
    m = equal.merged()
    assert m.lower.size == 2 and m.input_rows == () and m.exact_box() == equal.exact_box()[:2]
    assert equal.contains(equal.expand([0.6, 0.7])) and not equal.contains([0.6, 0.7, 0.6, 0.71])
    assert apart.merged().lower.size == 4  # nothing equated: the region as it is


def test_other_input_rows_follow_the_merge_and_a_failing_one_empties_the_region():
    head = ("(declare-const X_0 Real)(declare-const X_1 Real)(declare-const X_2 Real)(declare-const Y_0 Real)\n"
            "(assert (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1) (>= X_2 0) (<= X_2 1) (<= Y_0 0)))\n")
    (r,) = parse_vnnlib(head + "(assert (and (= X_0 X_2) (<= (+ X_1 X_2) 0.5) (<= (- X_2 X_0) 0.25)))").regions
    m = r.merged()
    assert r.representatives() == (0, 1, 0) and m.input_rows == (((((0, 1), (1, 1))), Fraction(1, 2), False),)
    assert r.expand([0.2, 0.3]).tolist() == [0.2, 0.3, 0.2]
    (r,) = parse_vnnlib(head + "(assert (and (= X_0 X_2) (<= (- X_2 X_0) -0.25)))").regions
    assert r.merged() is None  # X_2 - X_0 = 0 > -0.25: no input
    # an equality with an offset, or of a scaled input, is a row of the polytope, not a merge
    for eq in ("(= X_0 (+ X_2 0.25))", "(= X_0 (* 2 X_2))"):
        (r,) = parse_vnnlib(head + f"(assert {eq})").regions
        assert r.representatives() == (0, 1, 2) and len(r.input_rows) == 2


def test_sat_counterexample_meets_the_equality_exactly(tmp_path, capsys, models):
    """g - f = 0.001 where A = X, and Y0 = X0 + X1 / 4 + 0.1 >= 1.1 near the corner (0.8, 1) of
    the boxes' intersection (not at its centre, where X = A too): the first disjunct is sat,
    and its counterexample has A = X exactly (in both boxes), with onnxruntime's outputs of
    both models. (Bounded and attacked apart, X moves to the corner and A does not.)"""
    out = verify(tmp_path, capsys, HEAD + A_BOX + f"(assert (or (and {SAME} (>= (- C[0,0] Y[0,0]) 0.0005) "
                 f"(>= Y[0,0] 1.1)) {FAR}))\n", models)
    word, values = si.parse_assignment(out)
    assert word == "sat", out
    x, a = values["X"][2], values["A"][2]
    assert np.array_equal(x, a)
    assert 0.5 <= x[0, 0] <= 0.8 and 0.6 <= x[0, 1] <= 1.0
    y, c = ort_run(models[0], x), ort_run(models[1], a)
    assert np.array_equal(y, values["Y"][2]) and np.array_equal(c, values["C"][2])
    assert c[0, 0] - y[0, 0] >= 0.0005 and y[0, 0] >= 1.1


def test_unsat_that_needs_the_equality(tmp_path, capsys, models):
    """C0 - Y0 >= 0.01 is infeasible where A = X (it is 0.001) but not on the boxes apart
    (A0 = 0.8, X0 = 0.5 gives 0.3): unsat is proved on the merged graph; without the
    equality the same disjunct is sat."""
    far = f"(assert (or (and {SAME} (>= (- C[0,0] Y[0,0]) 0.01)) {FAR}))\n"
    assert verify(tmp_path, capsys, HEAD + A_BOX + far, models) == "unsat\n"
    apart = f"(assert (or (>= (- C[0,0] Y[0,0]) 0.01) {FAR}))\n"
    assert verify(tmp_path, capsys, HEAD + A_BOX + apart, models).startswith("sat\n")


def test_an_input_equated_in_every_disjunct_needs_no_bounds_of_its_own(tmp_path, capsys, models):
    text = HEAD + (f"(assert (or (and {SAME} (>= (- C[0,0] Y[0,0]) 0.0005)) "
                   f"(and {SAME} (>= (- Y[0,0] C[0,0]) 0.0005))))\n")
    word, values = si.parse_assignment(verify(tmp_path, capsys, text, models))
    assert word == "sat" and np.array_equal(values["X"][2], values["A"][2])
    text = text.replace("(>= (- C[0,0] Y[0,0]) 0.0005)", "(>= (- C[0,0] Y[0,0]) 0.01)")
    assert verify(tmp_path, capsys, text, models) == "unsat\n"


def test_an_input_without_bounds_in_a_disjunct_is_refused(tmp_path, capsys, models):
    text = HEAD + f"(assert (or (and {SAME} (>= C[0,0] 0.0))\n  (>= Y[0,0] 0.0)))\n"
    with pytest.raises(ValueError) as e:
        parse_vnnlib(text, "q.vnnlib")
    msg = str(e.value)
    # the declaration of A, the lines of the disjunct without it, and what to write
    assert msg.startswith("q.vnnlib:6: input A[0,0] has no lower bound in the conjunction of the constraints on "
                          "lines 8, 10"), msg
    assert "(>= A[0,0] LO) (<= A[0,0] HI)" in msg and "(== A[0,0] OTHER)" in msg
    (tmp_path / "q.vnnlib").write_text(text)
    assert main(["vnnlib", "verify", str(tmp_path / "q.vnnlib"), "--network", f"f={models[0]}",
                 "--network", f"g={models[1]}"]) == 2
    out = capsys.readouterr()
    assert not out.out and "input A[0,0] has no lower bound" in out.err and "Traceback" not in out.err


# ---------------------------------------------------------------- one network, VNN-LIB 1.0
def difference_model(path):
    """x [1,2] -> x0 - x1 [1,1] (float32)."""
    w = numpy_helper.from_array(np.array([[1.0], [-1.0]], np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "d",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.save(m, str(path))
    return path


ONE = ("(declare-const X_0 Real)(declare-const X_1 Real)(declare-const Y_0 Real)\n"
       "(assert (and (>= X_0 0.0) (<= X_0 1.0) (>= X_1 0.2) (<= X_1 1.0)))\n")


def test_vnncomp_with_an_equality_of_one_networks_inputs(tmp_path):
    """x0 - x1 >= 0.001 where x0 = x1 is infeasible (the other disjunct too: x0 - x1 >= -0.1
    when x0 >= 0.9): unsat; x0 - x1 >= 0 where x0 = x1 is sat with x0 = x1 exactly."""
    path = difference_model(tmp_path / "d.onnx")
    cases = {"(or (and (= X_0 X_1) (>= Y_0 0.001)) (and (>= X_0 0.9) (<= Y_0 -0.95)))": "unsat",
             "(or (and (= X_0 X_1) (>= Y_0 0.0)) (and (>= X_0 0.9) (<= Y_0 -0.95)))": "sat"}
    for k, (formula, want) in enumerate(cases.items()):
        (tmp_path / f"p{k}.vnnlib").write_text(ONE + f"(assert {formula})\n")
        out = tmp_path / f"r{k}.txt"
        assert main(["vnncomp", str(path), str(tmp_path / f"p{k}.vnnlib"), "--timeout", "60", "--out", str(out)]) == 0
        assert out.read_text().splitlines()[0] == want
    v = solve(read_onnx(path), parse_vnnlib(ONE + f"(assert {next(iter(reversed(cases)))})"), 60)
    x, y = v.counterexample
    assert v.result == "sat" and x[0] == x[1] and 0.2 <= x[0] <= 1.0
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert s.run(None, {"x": np.array([x], np.float32)})[0][0, 0] == y[0] == 0.0


def test_the_merged_graph_reads_equated_inputs_from_one_position(tmp_path):
    net = merged_network(read_onnx(difference_model(tmp_path / "d.onnx")), (0, 0))
    assert net.n_inputs == 1 and net.parts[0].inputs[0][2] == (0, 0)
