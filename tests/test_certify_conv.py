"""conv2d (certify/ops/convolution.py): the map is F.conv2d, the adjoint its exact
transpose, the radius |M| r, checked against the explicit matrix on tiny inputs."""
import types

import pytest
import torch
import torch.nn.functional as F

from softcert.certify import ops

# (in_shape, out channels, kernel, stride, padding, dilation, groups)
SETTINGS = [
    ((3, 6, 7), 4, (3, 3), 1, 0, 1, 1),
    ((3, 6, 7), 4, (3, 2), 2, 1, 1, 1),          # stride leaves a remainder: output padding
    ((4, 7, 5), 6, (2, 3), (2, 1), (1, 2), (2, 1), 2),
    ((4, 5, 6), 4, (3, 3), 1, "same", 2, 4),     # depthwise, dilated 'same'
    ((2, 5, 6), 3, (2, 2), 1, "same", 1, 1),     # even kernel: asymmetric 'same' padding
    ((2, 8, 8), 2, (4, 4), 4, "valid", 1, 1),    # patch embedding
    ((2, 3, 2, 5, 5), 4, (3, 3), 2, 2, 1, 2),    # a leading axis flattened into the conv batch
]


def make(setting, seed=0, bias=True):
    in_shape, o, k, stride, padding, dilation, groups = setting
    g = torch.Generator().manual_seed(seed)
    c = in_shape[-3]
    w = torch.randn(o, c // groups, *k, generator=g, dtype=torch.float64)
    b = torch.randn(o, generator=g, dtype=torch.float64) if bias else None
    p = ops.conv2d_params(w, b, stride, padding, dilation, groups, in_shape=in_shape)
    return p, (w, b, stride, padding, dilation, groups)


def node(p):
    return types.SimpleNamespace(op="conv2d", params=p)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("setting", SETTINGS)
def test_apply_is_torch_conv2d(setting):
    p, (w, b, stride, padding, dilation, groups) = make(setting)
    x = torch.randn(3, *setting[0], dtype=torch.float64)
    y = ops.get("conv2d").apply(p, [x], None)
    ref = F.conv2d(x.reshape(-1, *x.shape[-3:]), w, b, stride, padding, dilation, groups)
    assert y.shape == (3, *p["out_shape"]) == (3, *ops.conv2d_shape(p))
    torch.testing.assert_close(y, ref.reshape(y.shape), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("setting", SETTINGS)
def test_adjoint_is_the_transpose(setting):
    """<A, M x> = <adjoint(A), x> for the linear part, and the bias term is A·b."""
    p, _ = make(setting, seed=1)
    op = ops.get("conv2d")
    B, S = 2, 3
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, *p["in_shape"], generator=g, dtype=torch.float64)
    A = torch.randn(B, S, *p["out_shape"], generator=g, dtype=torch.float64)
    f0 = op.apply(p, [torch.zeros_like(x)], None)
    lin = op.apply(p, [x], None) - f0
    (ax,), bias = op.adjoint(p, A, None)
    assert ax.shape == (B, S, *p["in_shape"]) and bias.shape == (B, S)
    lhs = ops.sum_rest(A * lin.unsqueeze(1))
    rhs = ops.sum_rest(ax * x.unsqueeze(1))
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(bias, ops.sum_rest(A * f0.unsqueeze(1)), rtol=1e-10, atol=1e-10)


def explicit_matrix(p):
    """M with y = M x + f(0), by applying the map to the basis vectors."""
    op = ops.get("conv2d")
    n = int(torch.tensor(p["in_shape"]).prod())
    eye = torch.eye(n, dtype=torch.float64).reshape(n, *p["in_shape"])
    f0 = op.apply(p, [torch.zeros(1, *p["in_shape"], dtype=torch.float64)], None)
    return (op.apply(p, [eye], None) - f0).reshape(n, -1).T, f0.reshape(-1)


@pytest.mark.parametrize("setting", SETTINGS)
def test_radius_and_adjoint_against_the_explicit_matrix(setting):
    p, _ = make(setting, seed=3)
    op = ops.get("conv2d")
    M, f0 = explicit_matrix(p)
    g = torch.Generator().manual_seed(4)
    r = torch.rand(2, *p["in_shape"], generator=g, dtype=torch.float64)
    rad = op.radius(p, r).reshape(2, -1)
    exact = r.reshape(2, -1) @ M.abs().T
    assert (rad >= exact - 1e-12 * (1 + exact)).all()
    torch.testing.assert_close(rad, exact, rtol=1e-12, atol=1e-12)
    A = torch.randn(2, 3, *p["out_shape"], generator=g, dtype=torch.float64)
    (ax,), _ = op.adjoint(p, A, None)
    torch.testing.assert_close(ax.reshape(2, 3, -1), A.reshape(2, 3, -1) @ M, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("setting", SETTINGS[:4])
def test_interval_encloses_samples(setting):
    p, _ = make(setting, seed=5)
    op = ops.get("conv2d")
    g = torch.Generator().manual_seed(6)
    lo = torch.randn(2, *p["in_shape"], generator=g, dtype=torch.float64)
    hi = lo + torch.rand(lo.shape, generator=g, dtype=torch.float64)
    yl, yu = op.interval(node(p), [(lo, hi)])
    for _ in range(100):
        x = lo + (hi - lo) * torch.rand(lo.shape, generator=g, dtype=torch.float64)
        y = op.apply(p, [x], None)
        assert (yl <= y + 1e-12).all() and (y <= yu + 1e-12).all()


def test_raw_params_are_normalised():
    """A node may carry the raw F.conv2d arguments; apply/adjoint normalise them."""
    _, (w, b, stride, padding, dilation, groups) = make(SETTINGS[2])
    raw = {"weight": w, "bias": b, "stride": stride, "padding": padding, "dilation": dilation,
           "groups": groups, "in_shape": SETTINGS[2][0]}
    x = torch.randn(2, *SETTINGS[2][0], dtype=torch.float64)
    ref = F.conv2d(x, w, b, stride, padding, dilation, groups)
    torch.testing.assert_close(ops.get("conv2d").apply(raw, [x], None), ref, rtol=1e-12, atol=1e-12)
    assert ops.conv2d_shape(raw) == tuple(ref.shape[1:])


def test_nn_conv2d_same_padding_matches():
    torch.manual_seed(0)
    m = torch.nn.Conv2d(3, 5, (4, 3), padding="same", dilation=(1, 2)).double()
    p = ops.conv2d_params(m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups, in_shape=(3, 7, 9))
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    torch.testing.assert_close(ops.get("conv2d").apply(p, [x], None), m(x).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs,match", [
    ({"weight": torch.zeros(4, 3, 3)}, "weight"),
    ({"weight": torch.full((4, 3, 3, 3), float("nan"))}, "weight"),
    ({"bias": torch.zeros(5)}, "bias"),
    ({"groups": 2}, "groups"),
    ({"groups": 0}, "groups"),
    ({"stride": 0}, "stride"),
    ({"stride": (1, 2, 3)}, "stride"),
    ({"dilation": -1}, "dilation"),
    ({"padding": -1}, "padding"),
    ({"padding": "full"}, "padding"),
    ({"padding": "same", "stride": 2}, "padding"),
    ({"in_shape": (3, 6)}, "in_shape"),
    ({"in_shape": (3, 2, 2)}, "in_shape"),
    ({"in_shape": (4, 6, 6)}, "groups"),
])
def test_bad_params_raise(kwargs, match):
    args = {"weight": torch.zeros(4, 3, 3, 3), "bias": torch.zeros(4), "stride": 1, "padding": 0,
            "dilation": 1, "groups": 1, "in_shape": (3, 6, 6)} | kwargs
    w, in_shape = args.pop("weight"), args.pop("in_shape")
    with pytest.raises(ValueError, match=f"conv2d: {match}"):
        ops.conv2d_params(w, in_shape=in_shape, **args)


def test_wrong_input_shape_raises():
    p, _ = make(SETTINGS[0])
    with pytest.raises(ValueError, match="conv2d: input"):
        ops.get("conv2d").apply(p, [torch.zeros(2, 3, 6, 8, dtype=torch.float64)], None)


def test_registered_as_affine():
    op = ops.get("conv2d")
    assert op.kind == "affine" and op.arity == 1 and "conv2d" in ops.names("affine")


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "tanh", "sigmoid"])
def test_crown_through_conv_and_activations(act):
    """input -> conv2d -> act -> conv2d (stride 2) -> sigmoid/tanh with the graph convention
    (node shapes carry the model's batch axis): CROWN bounds enclose sampled outputs and are
    tighter than IBP; alpha-CROWN over the activations' slopes is at least CROWN and sound."""
    from softcert.certify import crown
    from softcert.certify.graph import Graph

    torch.manual_seed(0)
    g = Graph()
    x = g.add("input", [], (1, 1, 6, 6), "x")
    p1 = ops.conv2d_params(torch.randn(3, 1, 3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64),
                           1, 1, in_shape=(1, 1, 6, 6))
    a = g.add(act, [g.add("conv2d", [x], p1["out_shape"], "c1", **p1)], p1["out_shape"], "a1")
    p2 = ops.conv2d_params(torch.randn(2, 3, 3, 3, dtype=torch.float64), None, 2, in_shape=p1["out_shape"])
    c2 = g.add("conv2d", [a], p2["out_shape"], "c2", **p2)
    out = g.add("tanh" if act == "sigmoid" else "sigmoid", [c2], p2["out_shape"], "a2")
    x0 = torch.rand(2, 1, 1, 6, 6, dtype=torch.float64)
    xl, xu = x0 - 0.1, x0 + 0.1
    state = crown.propagate(g, xl, xu, algorithm="crown")
    l, u = state.bounds[out]
    li, ui = crown.propagate(g, xl, xu, algorithm="ibp").bounds[out]
    assert (u - l).mean() < (ui - li).mean()
    # a specification through the whole graph: CROWN, then alpha-CROWN over the new slopes
    C = torch.randn(2, 3, *g.nodes[out].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    base = crown.backward(state, out, C)
    opt = crown.alpha_crown(state, C, iterations=5)
    assert (opt >= base).all() and torch.isfinite(opt).all()
    for _ in range(200):
        vals = [xl + (xu - xl) * torch.rand_like(xl)]
        for n in g.nodes[1:]:
            vals.append(ops.forward(n, [vals[j] for j in n.inputs]))
        assert (l <= vals[out]).all() and (vals[out] <= u).all()
        assert (opt <= ops.sum_rest(C * vals[out].unsqueeze(1)) + 1e-12).all()
