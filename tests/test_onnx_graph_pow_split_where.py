"""certify.onnx_graph's Pow (any constant exponent), Split and Where with a constant condition (issue 33).

Oracles: onnxruntime's outputs on sampled points of the box lie inside the CROWN bounds, and
the verifier's own forward pass matches onnxruntime (float32 tolerance)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_onnx_graph_reliability import crown_box, model, ort_run, ours

from softcert.certify.onnx_graph import read_onnx

XL, XU = np.array([[0.5, 1.0, 1.5]]), np.array([[0.8, 2.0, 1.6]])


def _encloses(m, xl, xu, n=200):
    net = read_onnx(m)
    lo, hi = crown_box(net, xl, xu)
    xs = xl[0] + (xu - xl)[0] * np.random.default_rng(0).random((n, xl.shape[1]))
    ys = np.stack([ort_run(m, x[None])[0] for x in xs])
    slack = 1e-6 * np.maximum(1.0, np.abs(ys))  # onnxruntime computes in float32
    assert (ys >= lo - slack).all() and (ys <= hi + slack).all()
    got = np.stack([ours(net, x[None])[0] for x in xs[:8]])
    np.testing.assert_allclose(got, ys[:8], rtol=1e-5, atol=1e-6)
    return lo, hi


@pytest.mark.parametrize("e", [3.0, 4.0, 5.0, -2.0, -3.0, 1.7, -0.3, 2.5, 0.25])
def test_pow_with_a_constant_exponent(e):
    m = model([helper.make_node("Pow", ["x", "e"], ["y"])], [1, 3], [1, 3], inits=[("e", np.float32(e))])
    lo, hi = _encloses(m, XL, XU)
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))


def test_pow_zero_is_one():
    m = model([helper.make_node("Pow", ["x", "e"], ["p"]), helper.make_node("Add", ["x", "p"], ["y"])],
              [1, 3], [1, 3], inits=[("e", np.float32(0.0))])
    lo, hi = _encloses(m, XL, XU)
    np.testing.assert_allclose(lo, XL[0] + 1, rtol=1e-12)


def test_pow_outside_its_real_domain_and_input_exponents_are_refused():
    m = model([helper.make_node("Pow", ["x", "e"], ["y"])], [1, 3], [1, 3], inits=[("e", np.float32(1.7))])
    with pytest.raises(ValueError, match="neg_log"):
        crown_box(read_onnx(m), XL - 1.0, XU)
    m = model([helper.make_node("Pow", ["x", "x"], ["y"])], [1, 3], [1, 3])
    with pytest.raises(ValueError, match="Pow.*input-dependent exponent"):
        read_onnx(m)
    m = model([helper.make_node("Pow", ["x", "e"], ["y"])], [1, 3], [1, 3], inits=[("e", np.ones(3, np.float32))])
    with pytest.raises(ValueError, match="only a scalar exponent"):
        read_onnx(m)


@pytest.mark.parametrize("opset,kind", [(13, "input"), (11, "attribute"), (13, "equal"), (18, "uneven")])
def test_split(opset, kind):
    if kind == "input":
        nodes = [helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)]
        inits, n_in = [("s", np.array([1, 3], np.int64))], 4
    elif kind == "attribute":
        nodes, inits, n_in = [helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[3, 1])], [], 4
    elif kind == "equal":
        nodes, inits, n_in = [helper.make_node("Split", ["x"], ["a", "b"], axis=-1)], [], 4
    else:
        nodes, inits, n_in = [helper.make_node("Split", ["x"], ["a", "b"], axis=1, num_outputs=2)], [], 5
    if opset >= 13:  # ReduceSum's axes: an input from opset 13, an attribute before
        nodes += [helper.make_node("ReduceSum", [v, "r"], [f"s{v}"], keepdims=1) for v in "ab"]
        inits = inits + [("r", np.array([1], np.int64))]
    else:
        nodes += [helper.make_node("ReduceSum", [v], [f"s{v}"], keepdims=1, axes=[1]) for v in "ab"]
    nodes.append(helper.make_node("Concat", ["sa", "sb"], ["y"], axis=1))
    m = model(nodes, [1, n_in], [1, 2], opset=opset, inits=inits)
    xl = np.arange(n_in, dtype=float)[None] / 10
    lo, hi = _encloses(m, xl, xl + 0.5)
    assert (lo <= hi).all()


def test_split_that_does_not_fit_is_named():
    m = model([helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1, name="cut"),
               helper.make_node("Sub", ["a", "b"], ["y"])], [1, 4], [1, 2], inits=[("s", np.array([1, 2], np.int64))],
              check=False)
    with pytest.raises(ValueError, match="Split at node 'cut': split sizes \\[1, 2\\] do not cut axis 1 of size 4"):
        read_onnx(m)


# ---------------------------------------------------------------- Where
MASK = np.array([[True, False, True]])


@pytest.mark.parametrize("other", ["const", "perturbed", "broadcast"])
def test_where_with_a_constant_condition(other):
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"])]
    inits = [("m", MASK), ("two", np.float32(2.0)), ("c", np.array([[5.0, -1.0, 0.5]], np.float32)),
             ("s", np.float32(-3.0))]
    b = {"const": "c", "perturbed": "x2", "broadcast": "s"}[other]
    nodes.append(helper.make_node("Where", ["m", "x", b], ["y"]))
    lo, hi = _encloses(model(nodes, [1, 3], [1, 3], inits=inits), XL, XU)
    if other == "const":  # the masked-out entry is the constant itself (up to the rounding charges)
        assert lo[1] <= -1.0 <= hi[1] and hi[1] - lo[1] < 1e-12


def test_where_refuses_what_it_cannot_read():
    inf = model([helper.make_node("Where", ["m", "x", "n"], ["y"], name="mask")], [1, 3], [1, 3],
                inits=[("m", MASK), ("n", np.full((1, 3), -np.inf, np.float32))])
    with pytest.raises(ValueError, match="Where at node 'mask': the second branch is a constant with non-finite"):
        read_onnx(inf)
