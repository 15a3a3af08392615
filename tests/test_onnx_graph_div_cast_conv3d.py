"""certify.onnx_graph's Div by a negative perturbed divisor, negative powers on negative bases,
Cast of perturbed floats to integer and bool types, and 3-D Conv (issue 33).

Oracles: onnxruntime's outputs at sampled points of the box (its corners included) lie inside
the interval (IBP) and CROWN bounds; the verifier's forward pass matches onnxruntime (float32
tolerance); mpmath at 50 digits for the negative reciprocal planes."""
from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from test_onnx_graph_reliability import model, ort_run, ours

from softcert.certify import ops
from softcert.certify.onnx_graph import read_onnx
from softcert.certify.vnncomp import lower_bounds

F64 = torch.float64


def _bounds(net, xl, xu, method):
    """Lower and upper bounds of every output over the box [xl, xu] by ``method``."""
    k = net.n_outputs
    eye = torch.eye(k, dtype=F64)
    C = torch.cat([eye, -eye]).reshape(1, 2 * k, *net.output_shape)
    lo = lower_bounds(net.graph, torch.as_tensor(xl, dtype=F64)[None], torch.as_tensor(xu, dtype=F64)[None], C,
                      method)[0].numpy()
    return lo[:k], -lo[k:]


def _points(xl, xu, n, seed=0):
    """Every corner of the box (up to 64 of them), then n uniform points."""
    lo, hi = xl.reshape(-1), xu.reshape(-1)
    corners = [np.where(np.array(bits, bool), hi, lo)
               for bits in itertools.islice(itertools.product((0, 1), repeat=lo.size), 64)]
    inner = lo + (hi - lo) * np.random.default_rng(seed).random((n, lo.size))
    return np.concatenate([np.stack(corners), inner]).reshape(-1, *xl.shape[1:])


def _encloses(m, xl, xu, n=200):
    """onnxruntime at the box's points lies inside the IBP and CROWN bounds; ours matches it.
    Returns the CROWN bounds."""
    net = read_onnx(m)
    xs = _points(xl, xu, n)
    ys = np.stack([ort_run(m, x[None]).reshape(-1) for x in xs]).astype(np.float64)
    slack = 1e-6 * np.maximum(1.0, np.abs(ys))  # onnxruntime computes in float32
    for method in ("ibp", "crown"):
        lo, hi = _bounds(net, xl, xu, method)
        assert (ys >= lo - slack).all() and (ys <= hi + slack).all(), method
    got = np.stack([ours(net, x[None]).reshape(-1) for x in xs[:16]])
    np.testing.assert_allclose(got, ys[:16], rtol=1e-6, atol=1e-6)
    return lo, hi


# ---------------------------------------------------------------- Div, Reciprocal, Pow on x < 0
XL, XU = np.array([[0.5, 1.0, 1.5]]), np.array([[0.8, 2.0, 3.0]])


def _div_model():
    """y = x / (x - 4): the divisor lies in [-3.5, -1] on the box XL..XU."""
    return model([helper.make_node("Sub", ["x", "four"], ["d"]), helper.make_node("Div", ["x", "d"], ["y"], name="ratio")],
                 [1, 3], [1, 3], inits=[("four", np.float32(4.0))])


def test_div_by_a_negative_perturbed_divisor():
    lo, hi = _encloses(_div_model(), XL, XU)
    assert (hi < 0).all() and np.isfinite(lo).all()


@pytest.mark.parametrize("e", [-1.0, -2.0, -3.0])
def test_negative_integer_powers_of_a_negative_base(e):
    m = model([helper.make_node("Pow", ["x", "e"], ["y"])], [1, 3], [1, 3], inits=[("e", np.float32(e))])
    lo, hi = _encloses(m, -XU, -XL)
    assert np.isfinite(lo).all() and np.isfinite(hi).all()
    assert (hi < 0).all() if e != -2.0 else (lo > 0).all()


def test_reciprocal_on_a_box_below_zero():
    _encloses(model([helper.make_node("Reciprocal", ["x"], ["y"])], [1, 3], [1, 3]), -XU, -XL)


def test_a_divisor_interval_containing_zero_is_refused_naming_the_node():
    net = read_onnx(_div_model())
    for method in ("ibp", "crown"):
        with pytest.raises(ValueError, match=r"reciprocal at node 'ratio': the input interval .* contains 0"):
            _bounds(net, XL, XU + 2.0, method)
    m = model([helper.make_node("Pow", ["x", "e"], ["y"], name="inv")], [1, 3], [1, 3],
              inits=[("e", np.float32(-3.0))])
    with pytest.raises(ValueError, match="reciprocal at node 'inv'"):
        _bounds(read_onnx(m), -XU, XL, "crown")


def test_negative_reciprocal_planes_hold_in_exact_arithmetic():
    """mpmath, 50 digits: the planes of 1/x on boxes below 0 enclose it at the ends, the
    tangent point and a grid, for alpha across [0, 1], the float coefficients taken as exact;
    the image encloses it too."""
    gen = torch.Generator().manual_seed(3)
    u = -(10.0 ** (6 * torch.rand(40, generator=gen, dtype=F64) - 3))
    l = u - 10.0 ** (6 * torch.rand(40, generator=gen, dtype=F64) - 4)
    u[:5] = l[:5] + 1e-12 * l[:5].abs()  # near-degenerate
    alpha = torch.rand(40, generator=gen, dtype=F64)
    alpha[:4], alpha[4:8] = 0.0, 1.0
    op = ops.get("reciprocal")
    lw, lb, uw, ub = (t.tolist() for t in op.planes(l, u, alpha))
    il, iu = (t.tolist() for t in op.image(l, u))
    with mpmath.workdps(50):
        for k, (a, b, al) in enumerate(zip(l.tolist(), u.tolist(), alpha.tolist())):
            for x in [a, b, min(max(a + al * (b - a), a), b), *(a + (b - a) * j / 8 for j in range(1, 8))]:
                X = mpmath.mpf(x)
                fx = 1 / X
                assert mpmath.mpf(lw[k]) * X + mpmath.mpf(lb[k]) <= fx <= mpmath.mpf(uw[k]) * X + mpmath.mpf(ub[k])
                assert mpmath.mpf(il[k]) <= fx <= mpmath.mpf(iu[k])
    # concave below 0: the tangent is the upper plane (slope -1/m²), the chord the lower one
    lw, lb, uw, ub = op.planes(torch.tensor([-2.0], dtype=F64), torch.tensor([-1.0], dtype=F64))
    assert abs(lw.item() + 0.5) < 1e-15 and abs(uw.item() + 1 / 1.5**2) < 1e-15


def test_reciprocal_planes_of_both_signs_in_one_tensor_broadcast_the_spec_axis():
    op = ops.get("reciprocal")
    l, u = torch.tensor([[[-2.0, 0.5]]], dtype=F64), torch.tensor([[[-1.0, 3.0]]], dtype=F64)  # (B, 1, 2)
    alpha = torch.rand(1, 3, 2, dtype=F64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    planes = op.planes(l, u, alpha)
    assert all(p.shape == (1, 3, 2) for p in planes)
    (planes[0].sum() + planes[3].sum()).backward()  # the lower plane above 0, the upper below
    assert torch.isfinite(alpha.grad).all() and (alpha.grad != 0).all()
    for j in range(2):
        alone = op.planes(l[..., j], u[..., j], alpha[..., j].detach())
        for p, q in zip(planes, alone):
            torch.testing.assert_close(p[..., j].detach(), q, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["alpha-crown", "vertex"])
def test_div_by_a_negative_divisor_under_the_other_methods(method):
    m = _div_model()
    net = read_onnx(m)
    lo, hi = _bounds(net, XL, XU, method)
    ys = np.stack([ort_run(m, x[None]).reshape(-1) for x in _points(XL, XU, 100)])
    assert (ys >= lo - 1e-6).all() and (ys <= hi + 1e-6).all()


def test_reciprocal_planes_refuse_a_box_containing_zero():
    for l, u in ((-1.0, 1.0), (0.0, 1.0), (-1.0, 0.0)):
        with pytest.raises(ValueError, match="reciprocal: the input interval .* contains 0"):
            ops.get("reciprocal").planes(torch.tensor([l]), torch.tensor([u]))


# ---------------------------------------------------------------- Cast to integers and bool
CAST_BOX = (np.array([[-2.5, -1.0, -0.5, 0.0, 0.3, 1.999]]), np.array([[1.5, 1.0, 0.5, 0.0, 2.0, 2.0]]))


def _cast_model(to, back=True):
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=to, name="cast")]
    if back:
        nodes.append(helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT))
    else:
        nodes[0].output[0] = "y"
    return model(nodes, [1, 6], [1, 6], out_type=None if back else to)


@pytest.mark.parametrize("to", [TensorProto.INT64, TensorProto.INT32, TensorProto.INT8, TensorProto.BOOL])
@pytest.mark.parametrize("back", [True, False])
def test_cast_of_a_perturbed_float_to_an_integer_or_bool(to, back):
    """Boxes straddling integers and 0; exact bounds: trunc (toward 0) of the ends, and for
    bool 1 off 0, 0 on [0, 0], [0, 1] else."""
    xl, xu = CAST_BOX
    lo, hi = _encloses(_cast_model(to, back), xl, xu)
    if to == TensorProto.BOOL:
        want = ([0, 0, 0, 0, 1, 1], [1, 1, 1, 0, 1, 1])
    else:
        want = ([-2, -1, 0, 0, 0, 1], [1, 1, 0, 0, 2, 2])
    np.testing.assert_allclose(lo, want[0], atol=1e-300)
    np.testing.assert_allclose(hi, want[1], atol=1e-300)


def test_cast_of_a_constant_is_folded_as_onnx_does():
    nodes = [helper.make_node("Cast", ["c"], ["i"], to=TensorProto.INT64),
             helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "f"], ["y"])]
    m = model(nodes, [1, 3], [1, 3], inits=[("c", np.array([[-1.7, 0.5, 2.9]], np.float32))])
    lo, hi = _encloses(m, XL, XU)
    np.testing.assert_allclose(lo, XL[0] + [-1, 0, 2], rtol=1e-12)


def test_integers_move_through_reshape_and_concat():
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["c", "s"], ["r"]), helper.make_node("Concat", ["r", "r"], ["k"], axis=0),
             helper.make_node("Cast", ["k"], ["y"], to=TensorProto.FLOAT)]
    m = model(nodes, [1, 6], [4, 3], inits=[("s", np.array([2, 3], np.int64))])
    _encloses(m, *CAST_BOX)


def test_casts_the_verifier_cannot_bound_are_refused():
    # integer arithmetic wraps around (and Div truncates)
    add = model([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT64),
                 helper.make_node("Add", ["c", "c"], ["a"], name="twice"),
                 helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT)], [1, 3], [1, 3])
    with pytest.raises(ValueError, match="Add at node 'twice': output 'a' is INT64 on the perturbed path"):
        read_onnx(add)
    # out of the integer type's range: undefined in ONNX
    net = read_onnx(_cast_model(TensorProto.INT8))
    with pytest.raises(ValueError, match=r"trunc at node 'cast': the output interval \[0, 200\].*\[-128, 127\]"):
        _bounds(net, np.zeros((1, 6)), np.full((1, 6), 200.0), "crown")
    # an int64 beyond 2^24 rounds into float32
    net = read_onnx(_cast_model(TensorProto.INT64))
    with pytest.raises(ValueError, match=r"trunc at node 'Cast#1'.*1\.67772e\+07"):
        _bounds(net, np.zeros((1, 6)), np.full((1, 6), 3e7), "ibp")


def test_the_integer_limits_are_exact_floats():
    net = read_onnx(_cast_model(TensorProto.INT64, back=False))
    lo, hi = net.graph.nodes[1].params["limits"]
    assert lo == -2.0**63 and hi == 2.0**63 - 1024  # 2^63 - 1 rounds up to 2^63, outside the type


# ---------------------------------------------------------------- Conv 3-D
@pytest.mark.parametrize("attrs", [dict(), dict(pads=[1, 0, 1, 0, 1, 1], strides=[2, 1, 2]),
                                   dict(auto_pad="SAME_UPPER", strides=[2, 2, 1]), dict(auto_pad="SAME_LOWER"),
                                   dict(dilations=[2, 1, 1], group=2)])
def test_conv_3d(attrs):
    rng = np.random.default_rng(4)
    groups = attrs.get("group", 1)
    w = rng.normal(size=(4, 2 // groups, 2, 3, 2)).astype(np.float32)
    bias = rng.normal(size=4).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    shape, inits = (2, 5, 4, 5), [("w", w), ("b", bias)]
    out = ort_run(model([node], [1, *shape], None, inits=inits, check=False), np.zeros((1, *shape))).shape
    m = model([node], [1, *shape], list(out), inits=inits)
    x0 = rng.uniform(-1, 1, (1, *shape))
    lo, hi = _encloses(m, x0 - 0.1, x0 + 0.1, n=60)
    # the interval of a convolution is exact: |W| ⋆ r about the centre
    net = read_onnx(m)
    ilo, ihi = _bounds(net, x0 - 0.1, x0 + 0.1, "ibp")
    np.testing.assert_allclose(ihi - ilo, hi - lo, rtol=1e-9)
    y0 = ort_run(m, x0).reshape(-1)
    plo, phi = _bounds(net, x0, x0, "crown")
    np.testing.assert_allclose(plo, y0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(phi, y0, rtol=1e-5, atol=1e-6)


def test_conv_of_four_spatial_axes_is_refused():
    w = np.ones((1, 1, 1, 1, 1, 1), np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="c4")], [1, 1, 2, 2, 2, 2], [1, 1, 2, 2, 2, 2],
              inits=[("w", w)], check=False)
    with pytest.raises(ValueError, match="Conv at node 'c4': only 1-D, 2-D and 3-D convolutions"):
        read_onnx(m)
