"""The theories ``softcert vnnlib supports`` claims are truthful (issue 33): every theory of
``THEORIES`` has at least one query of it that ``softcert vnnlib verify`` accepts and answers
correctly here (known answers, derived below), and a constraint relating an input and an
output or hidden value (MNC, not claimed) is refused as unsupported by name, within one
network and across two.

Models: f(x) = Relu(x W + b) with pre-activation "a", x [1,2] in [0.5, 1]^2, where every
ReLU is active: f0 = x0 + x1/4 + 0.1 in [0.725, 1.35], f1 = x0/2 + 2 x1 + 0.2 in [1.45, 2.7];
g = f + 0.001 (isomorphic to f); h(z) = Relu(z), z [1,1] in [-1, 1]; and s, t = p + q, p - q
of two inputs p, q [1,1] in [0, 1]."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_vnnlib_networks import relu_model

from softcert.cli import main
from softcert.cli.commands.vnnlib import THEORIES

V2 = "(vnnlib-version <2.0>)\n"
F = "(declare-network f (declare-input X real [1,2]) (declare-output Y real [1,2]))\n"
F_HIDDEN = '(declare-network f (declare-input X real [1,2]) (declare-hidden H real [1,2] "a") ' \
           '(declare-output Y real [1,2]))\n'
G = "(declare-network g (isomorphic-to f) (declare-input A real [1,2]) (declare-output C real [1,2]))\n"
G_EQUAL = G.replace("isomorphic-to", "equal-to")
H = "(declare-network h (declare-input Z real [1,1]) (declare-output R real [1,1]))\n"
PQ = ("(declare-network m (declare-input P real [1,1]) (declare-input Q real [1,1]) "
      "(declare-output S real [1,1]) (declare-output T real [1,1]))\n")
X_BOX = "(assert (and (>= X[0,0] 0.5) (<= X[0,0] 1.0) (>= X[0,1] 0.5) (<= X[0,1] 1.0)))\n"
Z_BOX = "(assert (and (>= Z[0,0] -1.0) (<= Z[0,0] 1.0)))\n"
PQ_BOX = "(assert (and (>= P[0,0] 0.0) (<= P[0,0] 1.0) (>= Q[0,0] 0.0) (<= Q[0,0] 1.0)))\n"
EQUATE = "(assert (== A[0,0] X[0,0]))\n(assert (== A[0,1] X[0,1]))\n"

#: name -> (query, networks it needs, the known answer)
QUERIES = {
    # bounds of single variables only: f0 >= 0.725
    "bounds": (V2 + F + X_BOX + "(assert (<= Y[0,0] 0.7))\n", ("f",), "unsat"),
    # the corner x = (1, 1): f0 = 1.35
    "bounds-sat": (V2 + F + X_BOX + "(assert (>= Y[0,0] 1.3))\n", ("f",), "sat"),
    # a comparison of two outputs: f1 - f0 = -x0/2 + 7 x1/4 + 0.1 >= 0.475
    "outputs": (V2 + F + X_BOX + "(assert (>= Y[0,0] Y[0,1]))\n", ("f",), "unsat"),
    # a linear constraint over inputs: x0 + x1 <= 1.2 leaves x0 <= 0.7, so f0 <= 0.925 (1.35 on the box)
    "input-polytope": (V2 + F + X_BOX + "(assert (<= (+ X[0,0] X[0,1]) 1.2))\n(assert (>= Y[0,0] 1.0))\n", ("f",),
                       "unsat"),
    # a hidden value: a0 = f0 >= 0.725
    "hidden": (V2 + F_HIDDEN + X_BOX + "(assert (<= H[0,0] 0.7))\n", ("f",), "unsat"),
    # a hidden value against an output: a0 - f1 = x0/2 - 7 x1/4 - 0.1 <= -0.475
    "hidden-vs-output": (V2 + F_HIDDEN + X_BOX + "(assert (>= H[0,0] Y[0,1]))\n", ("f",), "unsat"),
    # two inputs, two outputs: s + t = 2 p <= 2
    "inputs-outputs": (V2 + PQ + PQ_BOX + "(assert (>= (+ S[0,0] T[0,0]) 2.5))\n", ("m",), "unsat"),
    # equal networks, inputs equated: f - f = 0
    "equal-networks": (V2 + F + G_EQUAL + X_BOX + EQUATE + "(assert (or (> (- Y[0,0] C[0,0]) 0.0001) "
                       "(< (- Y[0,0] C[0,0]) -0.0001) (> (- Y[0,1] C[0,1]) 0.0001) (< (- Y[0,1] C[0,1]) -0.0001)))\n",
                       ("f",), "unsat"),
    # isomorphic networks, inputs equated: g - f = 0.001
    "isomorphic-networks": (V2 + F + G + X_BOX + EQUATE + "(assert (>= (- C[0,0] Y[0,0]) 0.0005))\n", ("f", "g"),
                            "sat"),
    # two unrelated networks of different interfaces: f0 + h <= 1.35 + 1
    "networks": (V2 + F + H + X_BOX + Z_BOX + "(assert (>= (+ Y[0,0] R[0,0]) 3.0))\n", ("f", "h"), "unsat"),
    "networks-sat": (V2 + F + H + X_BOX + Z_BOX + "(assert (>= (+ Y[0,0] R[0,0]) 2.3))\n", ("f", "h"), "sat"),
}
#: each claimed theory -> the queries of it (the standard's chapter "Theories and Logics")
COVERS = {
    "NH": ("bounds", "outputs"), "H": ("hidden", "hidden-vs-output"),
    "SIO": ("bounds", "bounds-sat"), "MIO": ("inputs-outputs",),
    "SNET": ("bounds", "input-polytope"), "MENET": ("equal-networks",), "MINET": ("isomorphic-networks",),
    "MNET": ("networks", "networks-sat"),
    "SNC": ("outputs", "hidden-vs-output", "equal-networks"),
    "BND": ("bounds", "bounds-sat", "hidden"), "OUTC": ("outputs", "equal-networks"), "LIN": ("input-polytope",),
}


def _model(path, nodes, inputs, outputs):
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, k])
                                             for n, k in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, k]) for n, k in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("theories")
    return {"f": relu_model(d / "f.onnx"), "g": relu_model(d / "g.onnx", 0.001),
            "h": _model(d / "h.onnx", [helper.make_node("Relu", ["z"], ["r"])], [("z", 1)], [("r", 1)]),
            "m": _model(d / "m.onnx", [helper.make_node("Add", ["p", "q"], ["s"]),
                                       helper.make_node("Sub", ["p", "q"], ["t"])], [("p", 1), ("q", 1)],
                        [("s", 1), ("t", 1)])}


def verify(tmp_path, capsys, text, files, networks):
    q = tmp_path / "q.vnnlib"
    q.write_text(text)
    argv = ["vnnlib", "verify", str(q), "--timeout", "60"]
    for n in networks:
        argv += ["--network", f"{n}={files[n]}"]
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_claimed_theory_has_a_correctly_answered_query():
    claimed = {t for theories in THEORIES.values() for t in theories}
    assert set(COVERS) == claimed, "a claimed theory without a query here, or a query of a theory not claimed"
    assert all(set(names) <= set(QUERIES) for names in COVERS.values())


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_is_accepted_and_answered(tmp_path, capsys, files, name):
    text, networks, want = QUERIES[name]
    rc, out, err = verify(tmp_path, capsys, text, files, networks)
    assert rc == 0 and out.splitlines()[0] == want, (out, err)


MNC = {
    "one network": (V2 + F + X_BOX + "(assert (<= X[0,0] Y[0,0]))\n", ("f",), "X[0,0], Y[0,0]"),
    "an input and a hidden value": (V2 + F_HIDDEN + X_BOX + "(assert (<= (+ X[0,1] H[0,0]) 2.0))\n", ("f",),
                                    "X[0,1], H[0,0]"),
    "equated inputs of one network, the other's output": (
        V2 + F + G + X_BOX + EQUATE + "(assert (<= A[0,0] Y[0,0]))\n", ("f", "g"),
        "X[0,0] = A[0,0], Y[0,0]"),
    "inputs of one network, outputs of another": (
        V2 + F + H + X_BOX + Z_BOX + "(assert (>= (- R[0,0] X[0,1]) 0.5))\n", ("f", "h"), "X[0,1], R[0,0]"),
}


@pytest.mark.parametrize("case", sorted(MNC))
def test_input_output_comparisons_are_refused_as_mnc(tmp_path, capsys, files, case):
    text, networks, names = MNC[case]
    rc, out, err = verify(tmp_path, capsys, text, files, networks)
    assert rc == 2 and not out and "Traceback" not in err
    assert "q.vnnlib:" in err and f"unsupported constraint mixing inputs and outputs ({names}" in err
    assert "theory MNC, which softcert does not support" in err


def test_mnc_is_not_claimed():
    assert THEORIES["multiple-node-comparison-theories"] == ("SNC",)
    assert np.all([t != "MNC" for ts in THEORIES.values() for t in ts])
