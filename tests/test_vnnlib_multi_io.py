"""Several inputs and outputs in one VNN-LIB 2.0 network (issue 33; the standard's
"Multiple input and output declarations": bound to the ONNX graph's inputs and outputs by
order, or by the ONNX names written after the shapes).

The model: inputs x [1,2] and z [1,1]; outputs y = x + z [1,2] and w = x0 - x1 [1,1]. On the
box x in [0,1]^2, z in [0,1] the exact answers are known: max y0 = 2, max w = 1, and
y0 >= 1.9 with w <= -0.9 is infeasible (x0 >= 0.9 and x0 <= 0.1). A sat answer's assignment
names every variable with its own shape, and onnxruntime gives exactly its outputs there."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from softcert.certify import solver_interface as si
from softcert.certify.onnx_graph import forward, read_onnx
from softcert.certify.vnncomp import solve
from softcert.certify.vnnlib import parse_vnnlib, read_vnnlib
from softcert.certify.vnnlib_binding import read_options
from softcert.cli import main

BOX = {"X[0,0]": (0, 1), "X[0,1]": (0, 1), "Z[0,0]": (0, 1)}


def two_io_model(path=None):
    """x [1,2], z [1,1] -> y = x + z [1,2], w = x @ [1,-1]^T [1,1] (float32, opset 13)."""
    nodes = [helper.make_node("Add", ["x", "z"], ["y"]), helper.make_node("MatMul", ["x", "d"], ["w"])]
    g = helper.make_graph(nodes, "two_io",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 1])],
                          [numpy_helper.from_array(np.array([[1.0], [-1.0]], np.float32), "d")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    if path is not None:
        onnx.save(m, str(path))
    return m


def header(named=False):
    """The network declaration; ``named``: bound by ONNX names, declared in another order."""
    if named:
        return ('(vnnlib-version <2.0>)\n(declare-network N\n  (declare-input Z real [1,1] "z")\n'
                '  (declare-input X real [1,2] "x")\n  (declare-output W real [1,1] "w")\n'
                '  (declare-output Y real [1,2] "y"))\n')
    return ("(vnnlib-version <2.0>)\n(declare-network N\n  (declare-input X real [1,2])\n"
            "  (declare-input Z real [1,1])\n  (declare-output Y real [1,2])\n  (declare-output W real [1,1]))\n")


def box():
    return "".join(f"(assert (>= {v} {float(lo)!r}))\n(assert (<= {v} {float(hi)!r}))\n" for v, (lo, hi) in BOX.items())


def verify(tmp_path, capsys, text, model_path):
    q = tmp_path / "q.vnnlib"
    q.write_text(text)
    assert main(["vnnlib", "verify", str(q), "--network", f"N={model_path}", "--timeout", "60"]) == 0
    return capsys.readouterr().out


def ort_outputs(model_path, x, z):
    s = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    y, w = s.run(["y", "w"], {"x": np.asarray(x, np.float32).reshape(1, 2), "z": np.asarray(z, np.float32).reshape(1, 1)})
    return y.astype(np.float64), w.astype(np.float64)


@pytest.fixture
def model_path(tmp_path):
    two_io_model(tmp_path / "two_io.onnx")
    return tmp_path / "two_io.onnx"


def test_layout_of_several_inputs_and_outputs():
    prop = parse_vnnlib(header() + box() + "(assert (>= (+ Y[0,1] W[0,0]) 1.0))\n")
    assert (prop.n_inputs, prop.n_outputs) == (3, 3)
    assert [(t.name, t.offset) for t in prop.tensors] == [("X", 0), ("Z", 2), ("Y", 0), ("W", 2)]
    (m, rhs), = prop.regions[0].disjuncts
    np.testing.assert_array_equal(m, [[0, -1, -1]])  # Y[0,1] is Y_1, W[0,0] is Y_2
    assert read_options(prop) == {"inputs": 2, "outputs": 2, "hidden": []}
    named = parse_vnnlib(header(named=True) + box() + "(assert (>= Y[0,0] 1.0))\n")
    assert [(t.name, t.offset) for t in named.tensors] == [("Z", 0), ("X", 1), ("W", 0), ("Y", 1)]
    assert read_options(named) == {"inputs": ["z", "x"], "outputs": ["w", "y"], "hidden": []}


@pytest.mark.parametrize("named", [False, True])
def test_graph_of_several_inputs_matches_onnxruntime(model_path, named):
    prop = parse_vnnlib(header(named) + box() + "(assert (>= Y[0,0] 1.0))\n")
    net = read_onnx(model_path, **read_options(prop))
    assert net.n_inputs == 3 and net.n_outputs == 3 and net.input_name is None
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, z = rng.random(2).astype(np.float32), rng.random(1).astype(np.float32)
        y, w = ort_outputs(model_path, x, z)
        flat_in = np.concatenate([z, x] if named else [x, z]).astype(np.float64)
        want = np.concatenate([w.ravel(), y.ravel()] if named else [y.ravel(), w.ravel()])
        got = forward(net, flat_in[None]).detach().numpy().reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("named", [False, True])
@pytest.mark.parametrize("formula", ["(>= Y[0,0] 2.0001)", "(>= W[0,0] 1.0001)",
                                     "(and (>= Y[0,0] 1.9) (<= W[0,0] -0.9))"])
def test_unsat_where_exactly_infeasible(tmp_path, capsys, model_path, named, formula):
    assert verify(tmp_path, capsys, header(named) + box() + f"(assert {formula})\n", model_path) == "unsat\n"


@pytest.mark.parametrize("named", [False, True])
def test_sat_assignment_names_each_variable_with_its_shape(tmp_path, capsys, model_path, named):
    text = header(named) + box() + "(assert (and (>= Y[0,0] 1.5) (<= W[0,0] 0.0)))\n"
    out = verify(tmp_path, capsys, text, model_path)
    word, values = si.parse_assignment(out)
    assert word == "sat"
    order = ["Z", "X", "W", "Y"] if named else ["X", "Z", "Y", "W"]
    assert list(values) == order
    shapes = {"X": (1, 2), "Z": (1, 1), "Y": (1, 2), "W": (1, 1)}
    assert all(values[k][:2] == ("real", shapes[k]) for k in order)
    x, z = values["X"][2], values["Z"][2]
    y, w = ort_outputs(model_path, x, z)
    assert np.array_equal(y, values["Y"][2]) and np.array_equal(w, values["W"][2])
    assert 0 <= x.min() and x.max() <= 1 and 0 <= z[0, 0] <= 1
    assert y[0, 0] >= 1.5 and w[0, 0] <= 0.0
    # the same point read back through the property as written
    prop = read_vnnlib(tmp_path / "q.vnnlib")
    xs = np.concatenate([z.ravel(), x.ravel()] if named else [x.ravel(), z.ravel()])
    ys = np.concatenate([w.ravel(), y.ravel()] if named else [y.ravel(), w.ravel()])
    assert any(r.contains(xs) and r.satisfied_exactly(ys) for r in prop.regions)


def test_solve_on_the_flat_vectors(model_path):
    prop = parse_vnnlib(header() + box() + "(assert (>= Y[0,1] 1.99))\n")
    net = read_onnx(model_path, **read_options(prop))
    v = solve(net, prop, 60)
    assert v.result == "sat"
    x, y = v.counterexample
    assert len(x) == 3 and len(y) == 3 and y[1] >= 1.99


def test_refusals(tmp_path, capsys, model_path):
    q = tmp_path / "bad.vnnlib"
    cases = {
        # three inputs declared, the model has two
        header().replace("(declare-input Z real [1,1])", "(declare-input Z real [1,1]) (declare-input V real [1])")
        + box() + "(assert (>= V[0] 0.0))(assert (<= V[0] 1.0))(assert (>= Y[0,0] 1.0))\n": "binds 3 input",
        # a declared size that does not fit the bound ONNX value
        header().replace("(declare-output W real [1,1])", "(declare-output W real [2])") + box()
        + "(assert (>= Y[0,0] 1.0))\n": "W [2] is bound to the ONNX output 'w'",
        # a name that the model does not have
        header(named=True).replace('"w"', '"nope"') + box() + "(assert (>= Y[0,0] 1.0))\n": "binds outputs",
    }
    for text, match in cases.items():
        q.write_text(text)
        assert main(["vnnlib", "verify", str(q), "--network", f"N={model_path}", "--timeout", "60"]) == 2
        out = capsys.readouterr()
        assert not out.out and match in out.err, out.err
    # some inputs and outputs named, others not: the file, the line and the construct
    with pytest.raises(ValueError, match=r"f\.vnnlib:2: declare-network N names the ONNX values of some"):
        parse_vnnlib(header(named=True).replace(' "z"', "") + box() + "(assert (>= Y[0,0] 1.0))\n", "f.vnnlib")
    with pytest.raises(ValueError, match=r"f\.vnnlib:\d+: input Z\[0,0\] has no lower bound"):
        parse_vnnlib(header() + box().replace("(assert (>= Z[0,0] 0.0))", "") + "(assert (>= Y[0,0] 1.0))\n",
                     "f.vnnlib")
    with pytest.raises(ValueError, match="declared twice"):
        parse_vnnlib(header().replace("(declare-input Z real", "(declare-input X real") + "(assert (>= X[0,0] 0.0))\n")


def test_equality_words_of_2_0(tmp_path, capsys, model_path):
    """2.0 writes == and != (the vnnlib package rejects 1.0's =): a != b is a < b or a > b."""
    prop = parse_vnnlib(header() + box() + "(assert (!= W[0,0] 0.0))\n")
    assert [r.strict().__len__() for r in prop.regions] == [2]
    assert verify(tmp_path, capsys, header() + box() + "(assert (== W[0,0] 1.5))\n", model_path) == "unsat\n"
    word, values = si.parse_assignment(verify(tmp_path, capsys, header() + box() + "(assert (!= W[0,0] 0.0))\n",
                                              model_path))
    assert word == "sat" and values["W"][2][0, 0] != 0.0
