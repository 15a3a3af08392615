"""A property on a comparison's output decided by splitting across the comparison's boundary
(issue 33): y = Where(x > 0.5, x, 1 - x) on x in [0, 0.9] has y >= 0.5 everywhere (y = 0.5 at
x = 0.5, where x > 0.5 is false), so "y < 0.45" is unsat and "y < 0.55" is sat (x in
(0.45, 0.55)). Over the whole box the condition is undecided and the bound is y >= 0 (Where
as a·m + b·(1 - m), McCormick with m in [0, 1]), so only a split proves the unsat.

The default method (crown with input bisection) proves it: a box on x <= 0.5 decides the
condition (m = 0: y = 1 - x exactly) and boxes on [0.5, 0.5 + w] bound y >= 0.5 - w.
Branch and bound (``--method bab``) does not (``unknown``), for two reasons measured on its
leaves (``certify.bab.branch_and_bound``): it splits neurons, not the input, and a leaf's
split constraint on relu(x - 0.5) (or on the nonzero's input) does not narrow the input box
that its linear bound is concretised over; the Where's branches read x directly, so a leaf
where the condition is decided (m = 1, y = x) is still bounded over x in [0, 0.9] (y >= 0);
and the closed split at 0 leaves relu(x - 0.5) in [0, u] on one side, where nonzero (the
strict comparison) stays undecided however small u gets."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from softcert.certify import solver_interface as si
from softcert.certify.onnx_graph import read_onnx
from softcert.certify.vnncomp import solve
from softcert.certify.vnnlib import parse_vnnlib
from softcert.cli import main


def where_model(path):
    """x [1,1] -> Where(x > 0.5, x, 1 - x) [1,1] (float32, opset 13)."""
    nodes = [helper.make_node("Greater", ["x", "half"], ["c"]), helper.make_node("Sub", ["one", "x"], ["b"]),
             helper.make_node("Where", ["c", "x", "b"], ["y"])]
    g = helper.make_graph(nodes, "where", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                          [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                           numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def query(formula):
    return ("(vnnlib-version <2.0>)\n(declare-network n (declare-input X real [1,1]) (declare-output Y real [1,1]))\n"
            f"(assert (and (>= X[0,0] 0.0) (<= X[0,0] 0.9)))\n(assert {formula})\n")


@pytest.fixture
def model(tmp_path):
    return where_model(tmp_path / "where.onnx")


def verify(tmp_path, capsys, model, formula, *extra):
    (tmp_path / "q.vnnlib").write_text(query(formula))
    rc = main(["vnnlib", "verify", str(tmp_path / "q.vnnlib"), "--network", f"n={model}", "--timeout", "60", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_the_default_proves_it_by_splitting_across_the_boundary(tmp_path, capsys, model):
    assert verify(tmp_path, capsys, model, "(< Y[0,0] 0.45)") == "unsat\n"
    net, prop = read_onnx(model), parse_vnnlib(query("(< Y[0,0] 0.45)"))
    v = solve(net, prop, 60, "crown", max_boxes=1)
    assert v.result == "unknown"  # the whole box alone: the condition undecided, y >= 0


def test_the_sat_side_is_confirmed_by_onnxruntime(tmp_path, capsys, model):
    out = verify(tmp_path, capsys, model, "(< Y[0,0] 0.55)")
    assert out.startswith("sat\n"), out
    word, values = si.parse_assignment(out)
    x, y = float(values["X"][2].reshape(-1)[0]), float(values["Y"][2].reshape(-1)[0])
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    got = float(s.run(None, {"x": np.array([[x]], np.float32)})[0][0, 0])
    assert got == y < 0.55 and 0.45 < x < 0.55


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="bab bounds a leaf over the whole input box (module docstring)")
def test_branch_and_bound_proves_it(model):
    v = solve(read_onnx(model), parse_vnnlib(query("(< Y[0,0] 0.45)")), 10, "bab")
    assert v.result == "unsat", v.result
