"""Hidden-node constraints (``declare-hidden``, issue 33; the standard's "Hidden output
declarations": a variable bound to an internal ONNX value, named by a string).

The model: x [1,2] -> h = Relu(x - 0.5) (the hidden value "h") -> y = h0 - h1 [1,1]. On the
box x in [0,1]^2: h in [0, 0.5]^2, so the exact answers are known. Sound semantics: a
counterexample must satisfy the hidden constraints too, and ``unsat`` means no input of the
box meets hidden and output constraints together (the hidden value is an extra output of the
graph, its constraints extra rows of the conjunction). A constraint that makes an otherwise
sat property unsat is proved; a sat answer carries H, which onnxruntime reproduces."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from softcert.certify import solver_interface as si
from softcert.certify.onnx_graph import forward, read_onnx, with_outputs
from softcert.certify.vnnlib import parse_vnnlib, read_vnnlib
from softcert.certify.vnnlib_binding import read_options
from softcert.cli import main


def hidden_model(path):
    """x [1,2] -> h = Relu(x - 0.5) -> y = h @ [1,-1]^T [1,1] (float32, opset 13)."""
    nodes = [helper.make_node("Sub", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["h"]),
             helper.make_node("MatMul", ["h", "d"], ["y"])]
    g = helper.make_graph(nodes, "hid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                          [numpy_helper.from_array(np.float32(0.5), "c"),
                           numpy_helper.from_array(np.array([[1.0], [-1.0]], np.float32), "d")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


HEAD = ('(vnnlib-version <2.0>)\n(declare-network N\n  (declare-input X real [1,2])\n'
        '  (declare-hidden H real [1,2] "h")\n  (declare-output Y real [1,1]))\n'
        "(assert (>= X[0,0] 0.0))\n(assert (<= X[0,0] 1.0))\n(assert (>= X[0,1] 0.0))\n(assert (<= X[0,1] 1.0))\n")


@pytest.fixture
def model_path(tmp_path):
    return hidden_model(tmp_path / "hid.onnx")


def verify(tmp_path, capsys, formula, model_path, head=HEAD):
    q = tmp_path / "q.vnnlib"
    q.write_text(head + f"(assert {formula})\n")
    rc = main(["vnnlib", "verify", str(q), "--network", f"N={model_path}", "--timeout", "60"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_hidden_values_extend_the_output_vector(model_path):
    prop = parse_vnnlib(HEAD + "(assert (>= H[0,1] 0.25))\n")
    assert prop.n_outputs == 3 and [(t.name, t.role, t.offset, t.onnx_name) for t in prop.of("H")] == \
        [("H", "H", 1, "h")]
    assert read_options(prop) == {"inputs": 1, "outputs": 1, "hidden": ["h"]}
    net = read_onnx(model_path, **read_options(prop))
    assert net.hidden == ("h",) and net.n_outputs == 3
    session = ort.InferenceSession(with_outputs(net.model, net.hidden).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for x in np.random.default_rng(1).random((20, 2)).astype(np.float32):
        y, h = session.run(["y", "h"], {"x": x.reshape(1, 2)})
        got = forward(net, x.astype(np.float64)[None]).detach().numpy().reshape(-1)
        np.testing.assert_allclose(got, np.concatenate([y.ravel(), h.ravel()]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("formula", [
    "(>= H[0,0] 0.6)",  # h <= 0.5
    "(and (>= H[0,0] 0.4) (<= Y[0,0] -0.2))",  # y = h0 - h1 >= 0.4 - 0.5
    "(>= H[0,0] (+ Y[0,0] 0.6))",  # h0 >= h0 - h1 + 0.6 means h1 >= 0.6
])
def test_unsat_where_hidden_constraints_make_it_infeasible(tmp_path, capsys, model_path, formula):
    assert verify(tmp_path, capsys, formula, model_path)[1] == "unsat\n"


def test_without_the_hidden_constraint_the_same_output_property_is_sat(tmp_path, capsys, model_path):
    assert verify(tmp_path, capsys, "(<= Y[0,0] -0.2)", model_path)[1].startswith("sat\n")


def test_sat_assignment_carries_the_hidden_value(tmp_path, capsys, model_path):
    rc, out, err = verify(tmp_path, capsys, "(and (>= H[0,1] 0.3) (<= Y[0,0] -0.1))", model_path)
    assert rc == 0, err
    word, values = si.parse_assignment(out)
    assert word == "sat" and list(values) == ["X", "H", "Y"]
    assert values["H"][:2] == ("real", (1, 2)) and values["Y"][:2] == ("real", (1, 1))
    x = values["X"][2]
    assert np.array_equal(x.astype(np.float32).astype(np.float64), x) and 0 <= x.min() and x.max() <= 1
    model = onnx.load(str(model_path))
    y = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(
        ["y"], {"x": x.astype(np.float32)})[0]
    h = ort.InferenceSession(with_outputs(model, ["h"]).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["h"], {"x": x.astype(np.float32)})[0]
    assert np.array_equal(y.astype(np.float64), values["Y"][2]) and np.array_equal(h.astype(np.float64), values["H"][2])
    assert h[0, 1] >= 0.3 and y[0, 0] <= -0.1
    prop = read_vnnlib(tmp_path / "q.vnnlib")
    assert any(r.contains(x.ravel()) and r.satisfied_exactly(np.concatenate([y.ravel(), h.ravel()]))
               for r in prop.regions)


def test_hidden_refusals(tmp_path, capsys, model_path):
    rc, out, err = verify(tmp_path, capsys, "(>= H[0,0] 0.1)", model_path, HEAD.replace('"h"', '"nope"'))
    assert rc == 2 and not out and "hidden value 'nope' is produced by no node" in err
    rc, out, err = verify(tmp_path, capsys, "(>= H[0] 0.1)", model_path, HEAD.replace("H real [1,2]", "H real [3]"))
    assert rc == 2 and not out and "H [3] is bound to the ONNX hidden value 'h'" in err
    with pytest.raises(ValueError, match=r"f\.vnnlib:4: declare-hidden H without the ONNX value"):
        parse_vnnlib(HEAD.replace(' "h"', "") + "(assert (>= H[0,0] 0.1))\n", "f.vnnlib")
    with pytest.raises(ValueError, match=r"f\.vnnlib:\d+: unsupported constraint mixing inputs and outputs"):
        parse_vnnlib(HEAD + "(assert (>= H[0,0] X[0,0]))\n", "f.vnnlib")
