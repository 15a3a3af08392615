"""certify.onnx_graph: ONNX models (torch exports at opsets 9/11/13/17 and hand-built graphs)
lowered to the verifier's graph. Oracles: onnxruntime's output (float32 tolerance) and, for the
bounds, onnxruntime and the float64 graph on points sampled in the box.

Exports use ``torch.onnx.export(model, (x,), path, dynamo=False, opset_version=k)``: the
TorchScript exporter, which needs no network (the dynamo exporter does not run here)."""
from __future__ import annotations

import gzip
import shutil
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from softcert.certify.onnx_graph import ONNX_OPERATORS, forward, read_onnx
from softcert.certify.vnncomp import lower_bounds


def export(model, x, path, opset, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x,), str(path), dynamo=False, opset_version=opset, **kw)
    return path


def ort_run(path_or_model, x):
    src = path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto) else str(path_or_model)
    s = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: np.asarray(x, dtype=np.float32)})[0]


def op_types(path):
    return {n.op_type for n in onnx.load(str(path)).graph.node}


class Tabular(nn.Module):
    """Gemm, BatchNormalization on (N, C), Sigmoid, Tanh, Relu, Softmax with an axis."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2, self.fc3 = nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x):
        h = torch.sigmoid(self.bn(self.fc1(x)))
        h = torch.relu(torch.tanh(self.fc2(h)) * 2.0 - 0.1)
        return torch.softmax(self.fc3(h), dim=1)


class Conv(nn.Module):
    """Conv (2-D, padding, stride, groups), Relu, Flatten, Gemm."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 4, 2, groups=2)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.c2(torch.relu(self.c1(x)))), 1))


class Sequence(nn.Module):
    """Tokens (1, 4, 3): BatchNormalization on (N, C, L), LayerNorm, Q Kᵀ and P V of perturbed
    tensors, Softmax over the last axis, Transpose, Slice, Gather, Concat, ReduceMean/Sum,
    Unsqueeze/Squeeze, Shape-driven Reshape, Expand, Pow, Sqrt, Div, Exp, Reciprocal."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.ln = nn.LayerNorm(3)
        self.q, self.k, self.v = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3)
        self.cls = nn.Parameter(torch.randn(1, 1, 3))
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        h = self.ln(self.bn(x))
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], 1)  # (1, 5, 3)
        s = self.q(h) @ self.k(h).transpose(1, 2) / 3 ** 0.5
        h = h + torch.softmax(s, -1) @ self.v(h)
        first = h[:, 0]                         # Gather
        rest = h[:, 1:4].mean(1)                # Slice, ReduceMean
        tail = h[:, 2:].sum(1, keepdim=True).squeeze(1)
        z = torch.cat([first, rest + 0.1 * tail], -1)  # (1, 6)
        z = z.view(z.shape[0], -1)              # Shape -> Gather -> Concat -> Reshape
        w = (z.pow(2) + 1.0).sqrt()
        z = z / w + torch.exp(-w) + 1.0 / (1.0 + z * z)
        return self.head(z).unsqueeze(1).squeeze(1)


def _init_bn(model):
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.uniform_(-0.5, 0.5, generator=g)
    return model.eval()


MODELS = {"tabular": (Tabular, (1, 4)), "conv": (Conv, (1, 2, 5, 5)), "sequence": (Sequence, (1, 4, 3))}


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_matches_onnxruntime(tmp_path, name, opset):
    torch.manual_seed(0)
    cls, shape = MODELS[name]
    model = _init_bn(cls())
    x = torch.rand(shape)
    path = export(model, x, tmp_path / f"{name}.onnx", opset)
    net = read_onnx(path)
    assert net.opset == opset and net.input_shape == shape
    for _ in range(3):
        xs = torch.rand(shape)
        ref = ort_run(path, xs)
        got = forward(net, xs).detach().numpy()
        assert got.shape == (1, *net.output_shape) and ref.shape == net.output_shape
        np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-5)


def test_exports_cover_the_operators(tmp_path):
    """The torch exports above exercise these ONNX operators (so the list is tested)."""
    seen = set()
    torch.manual_seed(0)
    for opset in (9, 13, 17):
        for name, (cls, shape) in MODELS.items():
            seen |= op_types(export(_init_bn(cls()), torch.rand(shape), tmp_path / f"{name}{opset}.onnx", opset))
    want = {"Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Softmax", "Reshape",
            "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather", "Concat", "ReduceMean",
            "ReduceSum", "BatchNormalization", "Conv", "Constant", "Pow", "Sqrt", "Exp",
            "LayerNormalization", "Expand"}
    assert want <= seen, want - seen
    # Shape, ConstantOfShape, Cast, Identity, Dropout, Reciprocal: the hand-built graphs below
    assert want | {"Identity", "Dropout", "ConstantOfShape", "Cast", "Reciprocal", "Shape"} <= set(ONNX_OPERATORS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bounds_enclose_sampled_outputs(tmp_path, name):
    """CROWN bounds of every output over a box hold at sampled points: exactly for the float64
    graph, within float32 rounding for onnxruntime."""
    torch.manual_seed(1)
    cls, shape = MODELS[name]
    model = _init_bn(cls())
    x0 = torch.rand(shape)
    net = read_onnx(export(model, x0, tmp_path / "m.onnx", 13))
    eps = 0.02
    xl, xu = (x0 - eps).double(), (x0 + eps).double()
    k = net.n_outputs
    eye = torch.eye(k, dtype=torch.float64)
    C = torch.cat([eye, -eye]).reshape(1, 2 * k, *net.output_shape)
    lo = lower_bounds(net.graph, xl.unsqueeze(0), xu.unsqueeze(0), C, "crown")[0]
    low, up = lo[:k].numpy(), -lo[k:].numpy()
    assert np.all(low <= up)
    pts = xl + (xu - xl) * torch.rand(64, *shape[1:], dtype=torch.float64).unsqueeze(1)
    pts[0], pts[1] = xl, xu
    y64 = forward(net, pts).reshape(64, -1).detach().numpy()
    assert np.all(y64 >= low) and np.all(y64 <= up)
    for p in pts[:16]:
        y = ort_run(tmp_path / "m.onnx", p.numpy()).reshape(-1)
        slack = 1e-5 * (1 + np.abs(y))
        assert np.all(y >= low - slack) and np.all(y <= up + slack)


# ---------------------------------------------------------------- hand-built graphs
def make_model(nodes, in_shape, out_shape, opset, inits=(), in_name="x", out_name="y"):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, in_shape)],
                          [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    return m


def i64(*v):
    return np.array(v, dtype=np.int64)


RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
HAND = {
    # old Slice (attributes), Squeeze/Unsqueeze attributes, ReduceSum attribute axes
    "slice-attr-9": (9, [helper.make_node("Slice", ["x"], ["a"], starts=[0, 1], ends=[1, 100], axes=[0, 1]),
                         helper.make_node("Unsqueeze", ["a"], ["b"], axes=[0]),
                         helper.make_node("ReduceSum", ["b"], ["c"], axes=[2], keepdims=1),
                         helper.make_node("Squeeze", ["c"], ["y"], axes=[0, 2])], (2, 6), (1,), []),
    # Slice inputs with negative step, Squeeze/Unsqueeze inputs (opset 13), ReduceSum input axes
    "slice-input-13": (13, [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["a"]),
                            helper.make_node("Unsqueeze", ["a", "u"], ["b"]),
                            helper.make_node("ReduceSum", ["b", "r"], ["c"], keepdims=0),
                            helper.make_node("Squeeze", ["c", "u"], ["y"])], (2, 6), (2,),
                       [("st", i64(-1)), ("en", i64(-100)), ("ax", i64(1)), ("sp", i64(-2)), ("u", i64(0)),
                        ("r", i64(2))]),
    # Softmax at opset 11 flattens from the axis; at 13 it is per axis
    "softmax-axis1-11": (11, [helper.make_node("Softmax", ["x"], ["y"], axis=1)], (1, 2, 3), (1, 2, 3), []),
    "softmax-axis1-13": (13, [helper.make_node("Softmax", ["x"], ["y"], axis=1)], (1, 2, 3), (1, 2, 3), []),
    # Gemm with transA/transB, alpha, beta and a row bias
    "gemm-trans": (11, [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
                        helper.make_node("Gemm", ["xt", "w", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
                   (1, 3), (1, 4), [("w", W), ("c", RNG.standard_normal((1, 4)).astype(np.float32))]),
    # ConstantOfShape, Shape, Cast, Expand, Gather with constant indices, Concat, Identity, Dropout
    "constants": (13, [helper.make_node("Shape", ["x"], ["s"]),
                       helper.make_node("ConstantOfShape", ["s"], ["z"],
                                        value=numpy_helper.from_array(np.array([0.25], np.float32))),
                       helper.make_node("Cast", ["x"], ["xc"], to=TensorProto.FLOAT),
                       helper.make_node("Add", ["xc", "z"], ["a"]),
                       helper.make_node("Gather", ["a", "gi"], ["g"], axis=1),
                       helper.make_node("Expand", ["g", "es"], ["e"]),
                       helper.make_node("Identity", ["e"], ["e2"]),
                       helper.make_node("Dropout", ["e2"], ["d"]),
                       helper.make_node("Concat", ["d", "x"], ["y"], axis=1)], (2, 3), (2, 7),
                  [("gi", i64(2)), ("es", i64(2, 4))]),
    # Pow 2 / 0.5 / -1 / -0.5, Sqrt, Reciprocal, Exp, Neg, ReduceMean, Mul/Div by a perturbed value
    "elementwise": (13, [helper.make_node("Pow", ["x", "two"], ["p"]),
                         helper.make_node("Add", ["p", "one"], ["q"]),
                         helper.make_node("Sqrt", ["q"], ["r"]),
                         helper.make_node("Pow", ["q", "half"], ["r2"]),
                         helper.make_node("Pow", ["q", "mhalf"], ["r3"]),
                         helper.make_node("Pow", ["q", "mone"], ["r4"]),
                         helper.make_node("Reciprocal", ["r"], ["s"]),
                         helper.make_node("Neg", ["x"], ["n"]),
                         helper.make_node("Exp", ["n"], ["e"]),
                         helper.make_node("Mul", ["s", "e"], ["m"]),
                         helper.make_node("Div", ["r2", "q"], ["dv"]),
                         helper.make_node("Add", ["m", "dv"], ["m2"]),
                         helper.make_node("Sub", ["m2", "r3"], ["m3"]),
                         helper.make_node("Add", ["m3", "r4"], ["m4"]),
                         helper.make_node("ReduceMean", ["m4"], ["y"], axes=[1], keepdims=0)], (2, 3), (2,),
                    [("two", np.float32(2)), ("one", np.float32(1)), ("half", np.float32(0.5)),
                     ("mhalf", np.float32(-0.5)), ("mone", np.float32(-1))]),
    # BatchNormalization on a 3-D input, LayerNormalization (opset 17), MatMul by a constant
    "norms-17": (17, [helper.make_node("BatchNormalization", ["x", "sc", "b", "mu", "var"], ["bn"], epsilon=1e-3),
                      helper.make_node("LayerNormalization", ["bn", "lw", "lb"], ["ln"], axis=-1, epsilon=1e-5),
                      helper.make_node("MatMul", ["ln", "w"], ["y"])], (1, 2, 4), (1, 2, 3),
                 [("sc", np.float32([1.5, 0.5])), ("b", np.float32([0.1, -0.2])), ("mu", np.float32([0.3, -0.1])),
                  ("var", np.float32([0.7, 1.3])), ("lw", RNG.standard_normal(4).astype(np.float32)),
                  ("lb", RNG.standard_normal(4).astype(np.float32)), ("w", W)]),
    # Reshape with 0 and -1, old Reshape target as input at opset 9 too
    "reshape-9": (9, [helper.make_node("Reshape", ["x", "shp"], ["r"]),
                      helper.make_node("Flatten", ["r"], ["y"], axis=2)], (2, 6), (4, 3),
                  [("shp", i64(0, -1, 3))]),
}


@pytest.mark.parametrize("case", sorted(HAND))
def test_hand_built_graphs_match_onnxruntime(case):
    opset, nodes, ins, outs, inits = HAND[case]
    m = make_model(nodes, ins, outs, opset, inits)
    net = read_onnx(m)
    assert net.output_shape == outs
    for _ in range(3):
        x = RNG.uniform(-1, 1, ins).astype(np.float32)
        np.testing.assert_allclose(forward(net, torch.from_numpy(x).unsqueeze(0)).detach().numpy()[0],
                                   ort_run(m, x), rtol=1e-5, atol=1e-6)


def test_softmax_flattens_from_the_axis_before_opset_13():
    """The two softmax cases above differ: opset 11 normalises over axes 1 and 2 together."""
    x = torch.from_numpy(RNG.uniform(-1, 1, (1, 1, 2, 3)))
    y11 = forward(read_onnx(make_model(*_args("softmax-axis1-11"))), x)
    y13 = forward(read_onnx(make_model(*_args("softmax-axis1-13"))), x)
    assert float(y11.sum()) == pytest.approx(1.0) and float(y13.sum()) == pytest.approx(3.0)


def _args(case):
    opset, nodes, ins, outs, inits = HAND[case]
    return nodes, ins, outs, opset, inits


def test_symbolic_batch_and_gzip(tmp_path):
    torch.manual_seed(0)
    model = _init_bn(Tabular())
    path = export(model, torch.rand(1, 4), tmp_path / "m.onnx", 13, input_names=["x"], output_names=["y"],
                  dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    with open(path, "rb") as f, gzip.open(tmp_path / "m.onnx.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    net = read_onnx(tmp_path / "m.onnx.gz")
    assert net.input_shape == (1, 4) and net.output_shape == (1, 3)
    assert (net.input_name, net.output_name) == ("x", "y")
    x = torch.rand(1, 4)
    np.testing.assert_allclose(forward(net, x).detach().numpy()[0], ort_run(path, x), rtol=1e-4, atol=1e-6)


def test_unsupported_operator_is_named():
    m = make_model([helper.make_node("Abs", ["x"], ["a"], name="my_abs"),
                    helper.make_node("Relu", ["a"], ["y"])], (1, 3), (1, 3), 13)
    with pytest.raises(ValueError, match=r"Abs at node 'my_abs'"):
        read_onnx(m)
    m = make_model([helper.make_node("TopK", ["x", "k"], ["y", "i"])], (1, 3), (1, 2), 13, [("k", i64(2))])
    with pytest.raises(ValueError, match=r"unsupported ONNX operator TopK at node 'TopK#0'"):
        read_onnx(m)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="no such file"):
        read_onnx("/nonexistent/model.onnx")
    # a perturbed shape for Reshape, a non-scalar exponent, a training dropout
    m = make_model([helper.make_node("Pow", ["x", "e"], ["y"])], (1, 3), (1, 3), 13, [("e", np.ones(3, np.float32))])
    with pytest.raises(ValueError, match=r"Pow at node 'Pow#0'.*only a scalar exponent"):
        read_onnx(m)
    m = make_model([helper.make_node("Mul", ["x", "x"], ["a"]),
                    helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT16)], (1, 3), (1, 3), 13)
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(ValueError, match="Cast"):
        read_onnx(m)
    const_out = make_model([helper.make_node("Constant", [], ["y"],
                                             value=numpy_helper.from_array(np.zeros((1, 3), np.float32)))],
                           (1, 3), (1, 3), 13)
    with pytest.raises(ValueError, match="does not depend on the input"):
        read_onnx(const_out)


@pytest.mark.parametrize("approximate,opset", [("none", 13), ("none", 20), ("tanh", 13), ("tanh", 20)])
def test_gelu_patterns(tmp_path, approximate, opset):
    """GELU as the exporter writes it: the erf pattern or the tanh formula (opset < 20), or the
    Gelu node (20)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.GELU(approximate=approximate), nn.Linear(4, 2))
    path = export(model, torch.zeros(1, 3), tmp_path / "g.onnx", opset)
    net = read_onnx(path)
    if approximate == "none":
        assert any(n.op == "gelu" for n in net.graph.nodes)
    assert not any(n.op == "erf" for n in net.graph.nodes)
    x = torch.rand(1, 3) * 4 - 2
    np.testing.assert_allclose(forward(net, x).detach().numpy()[0], ort_run(path, x), rtol=1e-4, atol=1e-5)


def test_erf_outside_the_gelu_pattern_is_refused():
    m = make_model([helper.make_node("Erf", ["x"], ["y"], name="lonely")], (1, 3), (1, 3), 13)
    with pytest.raises(ValueError, match="Erf at node 'lonely'.*GELU pattern"):
        read_onnx(m)
    m = make_model([helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["y"])],
                   (1, 3), (1, 3), 13, [("r2", np.float32(2 ** 0.5))])
    with pytest.raises(ValueError, match="Erf .*GELU pattern"):
        read_onnx(m)


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer (norm_first both ways) or nn.MultiheadAttention + a head."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "mha":
            self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        else:
            self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                  norm_first=kind == "pre-norm")
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        if self.kind == "mha":
            return self.head(self.att(x, x, x, need_weights=False)[0][:, 0])
        return self.head(self.enc(x).mean(1))


@pytest.mark.parametrize("opset", [14, 17])
@pytest.mark.parametrize("kind", ["post-norm", "pre-norm", "mha"])
def test_transformer_exports(tmp_path, kind, opset):
    """Torch's attention exports (opset >= 14: scaled_dot_product_attention has no earlier
    export): forward against onnxruntime; CROWN and Vertex bounds against sampled outputs."""
    torch.manual_seed(2)
    model = Encoder(kind).eval()
    x0 = torch.randn(1, 4, 8)
    path = export(model, x0, tmp_path / "enc.onnx", opset)
    net = read_onnx(path)
    assert len(net.graph.attention) == 1 and net.graph.attention[0].pv is not None
    np.testing.assert_allclose(forward(net, x0).detach().numpy()[0], ort_run(path, x0), rtol=1e-4, atol=1e-5)
    eps = 0.01
    xl, xu = (x0 - eps).double().unsqueeze(0), (x0 + eps).double().unsqueeze(0)
    eye = torch.eye(3, dtype=torch.float64)
    C = torch.cat([eye, -eye]).reshape(1, 6, 1, 3)
    pts = xl[0] + (xu[0] - xl[0]) * torch.rand(32, 4, 8, dtype=torch.float64).unsqueeze(1)
    y = forward(net, pts).reshape(32, 3).detach().numpy()
    for method in ("crown", "vertex"):
        lo = lower_bounds(net.graph, xl, xu, C, method)[0].numpy()
        assert np.all(y >= lo[:3]) and np.all(y <= -lo[3:])


def test_conv_asymmetric_pads_and_dilation():
    """Conv with pads (top, left, bottom, right) = (1, 0, 2, 1), dilation 2, stride (1, 2)."""
    w = RNG.standard_normal((3, 2, 2, 3)).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 2, 1], dilations=[2, 2],
                                     strides=[1, 2])], (1, 2, 5, 6), (1, 3, 6, 2), 13,
                   [("w", w), ("b", RNG.standard_normal(3).astype(np.float32))])
    net = read_onnx(m)
    x = RNG.uniform(-1, 1, (1, 2, 5, 6)).astype(np.float32)
    np.testing.assert_allclose(forward(net, torch.from_numpy(x).unsqueeze(0)).detach().numpy()[0], ort_run(m, x),
                               rtol=1e-5, atol=1e-5)
