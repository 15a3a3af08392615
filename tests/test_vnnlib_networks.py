"""Several networks in one VNN-LIB 2.0 query (issue 33; the standard's "Multiple networks",
``equal-to`` and ``isomorphic-to``): one product graph whose X holds every network's inputs
(inputs equated across networks by a top-level ``(== A[i] X[i])`` share one position) and
whose Y is the networks' outputs in order.

Models: f(x) = Relu(x W + b) and g(x) = Relu(x W + b + 0.001), x [1,2] -> [1,2], with W, b
positive, so on the box x in [0.5, 1]^2 every ReLU is active and the answers are exact:
f(x) - f(x) = 0 (equal-to: an equivalence check of a network with itself is unsat),
g(x) - f(x) = 0.001 (isomorphic-to: within 0.01 is unsat, at least 0.0005 is sat). A sat
assignment names every variable of every network, equated inputs with equal values, and
onnxruntime reproduces each network's outputs."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from softcert.certify import solver_interface as si
from softcert.certify.onnx_graph import forward, read_product
from softcert.certify.vnnlib import parse_vnnlib
from softcert.certify.vnnlib_binding import model_files, parts
from softcert.cli import main

W = np.array([[1.0, 0.5], [0.25, 2.0]], np.float32)
B = np.array([0.1, 0.2], np.float32)


def relu_model(path, shift=0.0):
    """x [1,2] -> Relu(x W + b + shift) [1,2] (float32, opset 13)."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                          [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B + np.float32(shift), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def ort_run(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": np.asarray(x, np.float32).reshape(1, 2)})[0].astype(np.float64)


def query(relation, formula, equate=True):
    text = ("(vnnlib-version <2.0>)\n(declare-network f\n  (declare-input X real [1,2])\n"
            "  (declare-output Y real [1,2]))\n"
            f"(declare-network g ({relation} f)\n  (declare-input A real [1,2])\n  (declare-output C real [1,2]))\n"
            "(assert (and (>= X[0,0] 0.5) (<= X[0,0] 1.0) (>= X[0,1] 0.5) (<= X[0,1] 1.0)))\n")
    if equate:
        text += "(assert (== A[0,0] X[0,0]))\n(assert (== A[0,1] X[0,1]))\n"
    else:
        text += "(assert (and (>= A[0,0] 0.5) (<= A[0,0] 1.0) (>= A[0,1] 0.5) (<= A[0,1] 1.0)))\n"
    return text + f"(assert {formula})\n"


@pytest.fixture
def models(tmp_path):
    return relu_model(tmp_path / "f.onnx"), relu_model(tmp_path / "g.onnx", 0.001)


def verify(tmp_path, capsys, text, *networks):
    q = tmp_path / "q.vnnlib"
    q.write_text(text)
    argv = ["vnnlib", "verify", str(q), "--timeout", "60"]
    for n in networks:
        argv += ["--network", n]
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


APART = "(or (> (- Y[0,0] C[0,0]) 0.01) (< (- Y[0,0] C[0,0]) -0.01) (> (- Y[0,1] C[0,1]) 0.01) " \
        "(< (- Y[0,1] C[0,1]) -0.01))"


def test_equated_inputs_share_their_position(models):
    prop = parse_vnnlib(query("equal-to", APART))
    assert prop.networks == (("f", None, None), ("g", "equal-to", "f"))
    assert prop.n_inputs == 2 and prop.n_outputs == 4
    assert {t.name: t.indices() for t in prop.tensors} == {"X": (0, 1), "Y": (0, 1), "A": (0, 1), "C": (2, 3)}
    files = model_files(prop, [("f", models[0])])
    assert files == {"f": models[0], "g": models[0]}
    net = read_product(parts(prop, files), prop.n_inputs)
    x = np.array([[0.6, 0.9]])
    y = forward(net, x).detach().numpy().reshape(-1)
    np.testing.assert_allclose(y, np.concatenate([ort_run(models[0], x)] * 2).reshape(-1), rtol=1e-6)


def test_equal_to_equivalence_is_unsat(tmp_path, capsys, models):
    rc, out, err = verify(tmp_path, capsys, query("equal-to", APART), f"f={models[0]}")
    assert (rc, out) == (0, "unsat\n"), err


def test_isomorphic_within_tolerance_is_unsat(tmp_path, capsys, models):
    rc, out, err = verify(tmp_path, capsys, query("isomorphic-to", APART), f"f={models[0]}", f"g={models[1]}")
    assert (rc, out) == (0, "unsat\n"), err


def test_isomorphic_difference_is_found(tmp_path, capsys, models):
    rc, out, err = verify(tmp_path, capsys, query("isomorphic-to", "(>= (- C[0,0] Y[0,0]) 0.0005)"),
                          f"f={models[0]}", f"g={models[1]}")
    assert rc == 0, err
    word, values = si.parse_assignment(out)
    assert word == "sat" and list(values) == ["X", "Y", "A", "C"]
    assert all(values[k][:2] == ("real", (1, 2)) for k in values)
    x, a = values["X"][2], values["A"][2]
    assert np.array_equal(x, a) and 0.5 <= x.min() and x.max() <= 1.0
    y, c = ort_run(models[0], x), ort_run(models[1], a)
    assert np.array_equal(y, values["Y"][2]) and np.array_equal(c, values["C"][2])
    assert c[0, 0] - y[0, 0] >= 0.0005


def test_networks_with_their_own_inputs(tmp_path, capsys, models):
    """No equality: X and A are independent, so Y0 - C0 reaches f(1,·)0 - g(0.5,·)0 < 0.8."""
    text = query("isomorphic-to", "(>= (- Y[0,0] C[0,0]) 0.5)", equate=False)
    prop = parse_vnnlib(text)
    assert prop.n_inputs == 4 and {t.name: t.indices() for t in prop.tensors if t.role == "X"} == \
        {"X": (0, 1), "A": (2, 3)}
    rc, out, err = verify(tmp_path, capsys, text, f"f={models[0]}", f"g={models[1]}")
    word, values = si.parse_assignment(out)
    assert word == "sat" and not np.array_equal(values["X"][2], values["A"][2])
    # the largest difference: x = (1, 1), a = (0.5, 0.5): 1.35 - 0.725 - 0.001
    text = query("isomorphic-to", "(>= (- Y[0,0] C[0,0]) 0.63)", equate=False)
    assert verify(tmp_path, capsys, text, f"f={models[0]}", f"g={models[1]}")[1] == "unsat\n"


def test_network_refusals(tmp_path, capsys, models):
    # files: one for each network not marked equal-to, no more, no fewer
    for networks in ([f"f={models[0]}"], [f"f={models[0]}", f"g={models[1]}", f"h={models[1]}"]):
        rc, out, err = verify(tmp_path, capsys, query("isomorphic-to", APART), *networks)
        assert rc == 2 and not out and "declares networks 'f', 'g'" in err
    rc, out, err = verify(tmp_path, capsys, query("equal-to", APART), f"f={models[0]}", f"g={models[1]}")
    assert rc == 2 and "one file for each of ['f']" in err
    with pytest.raises(ValueError, match=r"q\.vnnlib:5: declare-network g \(equal-to f\): its inputs have shapes"):
        parse_vnnlib(query("equal-to", APART).replace("A real [1,2]", "A real [1,3]"), "q.vnnlib")
    with pytest.raises(ValueError, match=r"q\.vnnlib:5: equal-to h: no network 'h' is declared before it"):
        parse_vnnlib(query("equal-to", APART).replace("(equal-to f)", "(equal-to h)"), "q.vnnlib")
    with pytest.raises(ValueError, match=r"network f is declared twice"):
        parse_vnnlib(query("equal-to", APART).replace("declare-network g", "declare-network f"), "q.vnnlib")
    # an equality inside a disjunction bounds A in that disjunct only: in the first, A[0,1]
    # has no bounds (tests/test_vnnlib_equalities.py)
    text = query("equal-to", APART, equate=False).replace(
        "(assert (and (>= A[0,0] 0.5) (<= A[0,0] 1.0) (>= A[0,1] 0.5) (<= A[0,1] 1.0)))",
        "(assert (or (== A[0,0] X[0,0]) (== A[0,1] X[0,1])))")
    with pytest.raises(ValueError, match=r"input A\[0,1\] has no lower bound"):
        parse_vnnlib(text, "q.vnnlib")


def test_serialised_assignment_of_several_networks(tmp_path, capsys, models):
    out = tmp_path / "assign"
    q = tmp_path / "q.vnnlib"
    q.write_text(query("isomorphic-to", "(>= (- C[0,0] Y[0,0]) 0.0005)"))
    assert main(["vnnlib", "verify", str(q), "--network", f"f={models[0]}", "--network", f"g={models[1]}",
                 "--timeout", "60", "--serialise-assignments", str(out)]) == 0
    assert capsys.readouterr().out == "sat\n"
    tensors = {}
    for name in ("X", "Y", "A", "C"):
        t = onnx.TensorProto()
        t.ParseFromString((out / f"{name}.pb").read_bytes())
        assert t.data_type == TensorProto.FLOAT
        tensors[name] = numpy_helper.to_array(t)
    assert np.array_equal(tensors["X"], tensors["A"]) and tensors["C"].shape == (1, 2)
    assert np.array_equal(ort_run(models[1], tensors["A"]), tensors["C"])
