"""certify.onnx_graph's MaxPool (nested maxima through ReLU) and Conv with every auto_pad
mode and in 1-D (issue 33).

Oracles: onnxruntime's outputs on sampled points of the box lie inside the CROWN bounds; the
verifier's forward pass matches onnxruntime (float32 tolerance); at a point box the bounds
pinch onto onnxruntime's output."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_onnx_graph_reliability import crown_box, model, ort_run, ours

from softcert.certify.onnx_graph import read_onnx


def _check(m, shape, eps=0.1, n=100):
    net = read_onnx(m)
    rng = np.random.default_rng(0)
    x0 = rng.uniform(-1, 1, shape)
    lo, hi = crown_box(net, (x0 - eps)[None], (x0 + eps)[None])
    xs = x0 + rng.uniform(-eps, eps, (n, *shape))
    ys = np.stack([ort_run(m, x[None]).reshape(-1) for x in xs])
    slack = 1e-6 * np.maximum(1.0, np.abs(ys))
    assert (ys >= lo - slack).all() and (ys <= hi + slack).all()
    got = np.stack([ours(net, x[None]).reshape(-1) for x in xs[:5]])
    np.testing.assert_allclose(got, ys[:5], rtol=1e-5, atol=1e-6)
    plo, phi = crown_box(net, x0[None], x0[None])
    y0 = ort_run(m, x0[None]).reshape(-1)
    np.testing.assert_allclose(plo, y0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(phi, y0, rtol=1e-5, atol=1e-6)
    return lo, hi


def _shape_out(m, shape):
    return ort_run(m, np.zeros((1, *shape))).shape


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 0, 1], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[2, 2], dilations=[2, 2]),
])
def test_max_pool_2d(attrs):
    shape = (2, 5, 5)
    probe = model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [1, *shape], None, opset=13, check=False)
    out = _shape_out(probe, shape)
    m = model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [1, *shape], list(out), opset=13)
    _check(m, shape)


@pytest.mark.parametrize("shape,kernel", [((2, 7), [3]), ((1, 3, 4, 4), [2, 2, 2])])
def test_max_pool_1d_and_3d(shape, kernel):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=[1] * len(kernel))
    out = _shape_out(model([node], [1, *shape], None, opset=13, check=False), shape)
    _check(model([node], [1, *shape], list(out), opset=13), shape)


def test_max_pool_indices_output_is_refused():
    m = model([helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], name="pool")],
              [1, 1, 4, 4], [1, 1, 2, 2], opset=13, check=False)
    with pytest.raises(ValueError, match="MaxPool at node 'pool': the Indices output is not read"):
        read_onnx(m)


@pytest.mark.parametrize("auto_pad,strides", [("SAME_UPPER", [1, 1]), ("SAME_LOWER", [2, 2]), ("VALID", [1, 1]),
                                              ("SAME_UPPER", [2, 1])])
def test_conv_auto_pad(auto_pad, strides):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 2, 3, 2)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, strides=strides)
    shape = (2, 5, 6)
    out = _shape_out(model([node], [1, *shape], None, opset=13, inits=[("w", w)], check=False), shape)
    _check(model([node], [1, *shape], list(out), opset=13, inits=[("w", w)]), shape)


@pytest.mark.parametrize("attrs", [dict(), dict(pads=[1, 2], strides=[2]), dict(dilations=[2], group=2),
                                   dict(auto_pad="SAME_UPPER")])
def test_conv_1d(attrs):
    rng = np.random.default_rng(2)
    groups = attrs.get("group", 1)
    w = rng.normal(size=(4, 4 // groups, 3)).astype(np.float32)
    bias = rng.normal(size=4).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    shape = (4, 9)
    inits = [("w", w), ("b", bias)]
    out = _shape_out(model([node], [1, *shape], None, opset=13, inits=inits, check=False), shape)
    _check(model([node], [1, *shape], list(out), opset=13, inits=inits), shape)
