"""Sound floating point in certify (issue 14, item 1): every bound encloses the real-arithmetic
value of the float64 graph. Oracles: mpmath at 60 digits and exact Fractions, evaluated from
the float weights themselves (the real function the certificate is about).

- the red-team case: digits-vit1 with the head scaled by 1e6 / 1e12 at near-tie points, where
  ``arithmetic("plain")`` (the old float64 + 1e-9 widening) certifies points whose exact
  margin is negative and the sound arithmetic never does (ibp, crown, alpha-crown, vertex);
- exact re-evaluation of the final bounds of tiny models (ReLU MLP, attention) at box corners
  and samples; float32 models lifted exactly;
- hypothesis: affine chains with weights of magnitude 1e-8..1e8 at eps 0;
- the operator contract of ``certify.ops.core`` for every registered operator, by sampling.
"""
import copy
import math
from fractions import Fraction

import mpmath
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert import certify
from softcert.certify import ops, zoo
from softcert.certify.graph import Graph, Node
from softcert.certify.models import ViT

mpmath.mp.dps = 60
MPF = mpmath.mpf


# ---------------------------------------------------------------- exact forward passes
def _rows(t):
    return [[MPF(v) for v in row] for row in t.detach().double().tolist()]


def _lin(rows, layer):
    W, b = _rows(layer.weight), [MPF(v) for v in layer.bias.detach().double().tolist()]
    return [[mpmath.fsum(w_i * r_i for w_i, r_i in zip(w, r)) + bb for w, bb in zip(W, b)] for r in rows]


def vit_features(model, x):
    """Pooled features (before the head) of a ``certify.ViT`` without layer norm, mean
    pooling, at image x (C, H, W), in mpmath at 60 digits from the float weights; the
    attention scale is the float64 constant the graph carries."""
    assert not model.config["layer_norm"] and model.config["pool"] == "mean"
    z = model.patchify(x.double().unsqueeze(0))[0]
    t = _lin(_rows(z), model.embed)
    t = [[a + b for a, b in zip(r, p)] for r, p in zip(t, _rows(model.pos))]
    for blk in model.blocks:
        at = blk.attn
        q, k, v = _lin(t, at.q), _lin(t, at.k), _lin(t, at.v)
        d = at.dim // at.heads
        scale = MPF(1.0 / math.sqrt(d))
        o = [[MPF(0)] * at.dim for _ in t]
        for h in range(at.heads):
            sl = slice(h * d, (h + 1) * d)
            for i in range(len(t)):
                s = [mpmath.fsum(a * b for a, b in zip(q[i][sl], k[j][sl])) * scale for j in range(len(t))]
                top = max(s)
                e = [mpmath.exp(si - top) for si in s]
                tot = mpmath.fsum(e)
                for c in range(d):
                    o[i][h * d + c] = mpmath.fsum(e[j] * v[j][h * d + c] for j in range(len(t))) / tot
        t = [[a + b for a, b in zip(r, p)] for r, p in zip(t, _lin(o, at.o))]
        hid = [[max(val, MPF(0)) for val in r] for r in _lin(t, blk.fc1)]
        t = [[a + b for a, b in zip(r, p)] for r, p in zip(t, _lin(hid, blk.fc2))]
    return [mpmath.fsum(r[c] for r in t) / len(t) for c in range(len(t[0]))]


def vit_logits(model, x):
    return _lin([vit_features(model, x)], model.head)[0]


def mlp_logits(layers, x):
    """Exact (Fraction) logits of Linear/ReLU layers at x (1-D), from the float weights."""
    h = [Fraction(float(v)) for v in x]
    for layer in layers:
        if isinstance(layer, torch.nn.ReLU):
            h = [max(v, Fraction(0)) for v in h]
            continue
        W, b = layer.weight.detach().double().tolist(), layer.bias.detach().double().tolist()
        h = [sum((Fraction(w) * v for w, v in zip(row, h)), Fraction(0)) + Fraction(bb) for row, bb in zip(W, b)]
    return h


def _margins(logits, label):
    return [logits[label] - z for z in logits]


# ---------------------------------------------------------------- the red-team case (issue 14)
PAIRS = 2  # segments between a class-4 and a class-6 test image
NEIGHBOURS = range(-6, 7)  # points at t* + k ulp around the float64 tie
METHODS = ("ibp", "crown", "alpha-crown", "vertex")
#: the exact re-evaluation on tiny models also covers the optimised intermediate bounds
EXACT_METHODS = METHODS + ("alpha-crown-intermediate",)


@pytest.fixture(scope="module")
def near_ties():
    """Points on segments between test images of classes 4 and 6 where digits-vit1's logits
    of 4 and 6 tie in float64 (bisection), their exact pooled features (the head is the only
    scaled layer, so one exact evaluation serves every scale), and the traced graph."""
    m, X, y = zoo.load("digits-vit1")
    m = m.double()
    i4 = [i for i in range(len(y)) if y[i] == 4][:PAIRS]
    i6 = [i for i in range(len(y)) if y[i] == 6][:PAIRS]

    def gap(x):
        with torch.no_grad():
            z = m(x.unsqueeze(0))[0]
        return (z[6] - z[4]).item()

    pts = []
    for a, b in zip(i4, i6):
        xa, xb = X[a].double(), X[b].double()
        assert gap(xa) < 0 < gap(xb)
        lo, hi = 0.0, 1.0
        for _ in range(70):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if gap(xa + mid * (xb - xa)) < 0 else (lo, mid)
        for k in NEIGHBOURS:
            t = lo + k * math.ulp(lo)
            pts.append((xa + t * (xb - xa)).clamp(0, 1))
    feats = [vit_features(m, p) for p in pts]
    return m, torch.stack(pts), feats, certify.check_supported(m, pts[0].unsqueeze(0))


def _scaled(graph, s):
    """The graph with the head (its output node, a linear layer) scaled by s in float64."""
    g = copy.copy(graph)
    g.nodes = list(graph.nodes)
    head = g.nodes[g.output]
    assert head.op == "linear"
    g.nodes[g.output] = Node(head.op, head.inputs, head.shape,
                             {"W": head.params["W"] * s, "b": head.params["b"] * s}, head.name, head.value_range)
    return g


def _exact_logits_of_head(g, feats):
    """Exact logits of the (scaled, float64) head at the exact features."""
    p = g.nodes[g.output].params
    W, b = _rows(p["W"]), [MPF(v) for v in p["b"].tolist()]
    return [[mpmath.fsum(w * f for w, f in zip(row, feat)) + bb for row, bb in zip(W, b)] for feat in feats]


def _bounds(g, pts, C, meth):
    x = pts.unsqueeze(1)  # the traced batch axis
    return certify.linear_bounds(g, x, x, C.expand(len(pts), *C.shape[1:]), method=meth)


def _gap_spec(g):
    C = torch.zeros(1, 1, *g.nodes[g.output].shape, dtype=torch.float64)
    C[..., 6], C[..., 4] = 1.0, -1.0
    return C


@pytest.mark.parametrize("scale", [1e6, 1e12])
def test_sound_never_certifies_a_near_tie_with_negative_exact_margin(near_ties, scale):
    """The red-team case of issue 14: with the head scaled by 1e6 (1e12), the old plain float64
    CROWN certified z6 - z4 > 0 at near-tie points whose exact margin is negative (measured on
    branch fp14 before the certified plane intercepts of certify/ops/elementwise.py and
    bilinear.py landed: crown at 1e6, IBP at 1e12). Since then even ``arithmetic("plain")``
    stays below these points (the plane charges exceed the arithmetic error; the plain
    arithmetic's own failure is shown by ``test_contract_check_can_fail``). The sound bounds of
    every method lie at or below the exact margin at the negative points."""
    m, pts, feats, graph = near_ties
    g = _scaled(graph, scale)
    exact = [z[6] - z[4] for z in _exact_logits_of_head(g, feats)]
    neg = sorted((i for i in range(len(exact)) if exact[i] < 0), key=lambda i: -exact[i])[:2]
    assert neg, "no near-tie point with a negative exact margin"
    C = _gap_spec(g)
    for meth in METHODS:
        low = _bounds(g, pts[neg], C, meth)[:, 0]
        for j, i in enumerate(neg):
            assert MPF(low[j].item()) <= exact[i] < 0, (meth, low[j].item(), exact[i])


def test_sound_bounds_below_exact_at_every_near_tie(near_ties):
    """Soundness at all the near-tie points (either sign), every margin: ibp everywhere,
    crown at three of them; and through the public ``verify`` on the scaled model."""
    m, pts, feats, graph = near_ties
    g = _scaled(graph, 1e12)
    exact = _exact_logits_of_head(g, feats)
    spec = -torch.eye(10, dtype=torch.float64)
    spec[:, 6] += 1.0  # rows j: z_6 - z_j
    C = spec.reshape(1, 10, *g.nodes[g.output].shape)
    for meth, sub in (("ibp", list(range(len(feats)))), ("crown", [0, len(feats) // 2, len(feats) - 1])):
        low = _bounds(g, pts[sub], C, meth)
        for r, i in enumerate(sub):
            for j, want in enumerate(_margins(exact[i], 6)):
                assert MPF(low[r, j].item()) <= want, (meth, i, j)
    ms = copy.deepcopy(m)
    with torch.no_grad():
        ms.head.weight.mul_(1e12)
        ms.head.bias.mul_(1e12)
    res = certify.verify(ms, pts[:2], torch.tensor([6, 6]), 0.0, method="ibp")
    for r in range(2):
        for j, want in enumerate(_margins(exact[r], 6)):
            assert MPF(res.lower_margin[r, j].item()) <= want


# ---------------------------------------------------------------- exact re-evaluation, tiny models
def _corners_and_samples(lo, hi, n_corners, n_samples, gen):
    d = lo.numel()
    flat_lo, flat_hi = lo.flatten(), hi.flatten()
    pts = []
    if 2 ** d <= n_corners:
        for k in range(2 ** d):
            bits = torch.tensor([(k >> i) & 1 for i in range(d)], dtype=torch.bool)
            pts.append(torch.where(bits, flat_hi, flat_lo))
    else:
        for _ in range(n_corners):
            bits = torch.rand(d, generator=gen) < 0.5
            pts.append(torch.where(bits, flat_hi, flat_lo))
    for _ in range(n_samples):
        pts.append(flat_lo + (flat_hi - flat_lo) * torch.rand(d, generator=gen, dtype=torch.float64))
    return [p.reshape(lo.shape) for p in pts]


def test_mlp_bounds_below_exact_margins_at_corners_and_samples():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)]
    model = torch.nn.Sequential(*layers).double().eval()
    with torch.no_grad():
        layers[2].weight.mul_(1e4)  # a large layer: rounding matters more
    x = torch.rand(2, 4, dtype=torch.float64)
    label = model(x).argmax(1)
    gen = torch.Generator().manual_seed(1)
    for meth in EXACT_METHODS:
        res = certify.verify(model, x, label, 0.05, method=meth)
        for b in range(2):
            lo, hi = (x[b] - 0.05).clamp(0, 1), (x[b] + 0.05).clamp(0, 1)
            for p in _corners_and_samples(lo, hi, 16, 48, gen):
                m = _margins(mlp_logits(layers, p), int(label[b]))
                assert all(Fraction(res.lower_margin[b, j].item()) <= m[j] for j in range(3)), meth


def test_attention_bounds_below_exact_margins():
    torch.manual_seed(2)
    model = ViT(image=(1, 4, 4), patch=2, dim=4, heads=2, mlp=4, classes=3, depth=1).double().eval()
    x = torch.rand(1, 1, 4, 4, dtype=torch.float64)
    label = model(x).argmax(1)
    gen = torch.Generator().manual_seed(3)
    pts = _corners_and_samples((x[0] - 0.02).clamp(0, 1), (x[0] + 0.02).clamp(0, 1), 12, 12, gen)
    exact = [_margins(vit_logits(model, p), int(label[0])) for p in pts]
    for meth in EXACT_METHODS:
        low = certify.verify(model, x, label, 0.02, method=meth).lower_margin[0]
        for m in exact:
            assert all(MPF(low[j].item()) <= m[j] for j in range(3)), meth


def test_float32_model_is_certified_for_its_own_weights():
    """A float32 model's graph carries its weights exactly (float32 -> float64 is exact) and
    the bounds hold for the real function of those float32 weights."""
    torch.manual_seed(4)
    layers = [torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2)]
    model = torch.nn.Sequential(*layers).eval()  # float32
    with torch.no_grad():
        layers[0].weight.mul_(3e3)
    x = torch.rand(2, 3)
    g = certify.check_supported(model, x)
    Ws = [n.params["W"] for n in g.nodes if n.op == "linear"]
    assert [w.dtype for w in Ws] == [torch.float64] * 2
    for w, layer in zip(Ws, (layers[0], layers[2])):
        assert w.tolist() == layer.weight.detach().double().tolist()  # the lift is exact
    label = model(x).argmax(1)
    gen = torch.Generator().manual_seed(5)
    for meth in ("ibp", "crown", "alpha-crown"):
        res = certify.verify(model, x, label, 0.03, method=meth)
        for b in range(2):
            lo, hi = (x[b].double() - 0.03).clamp(0, 1), (x[b].double() + 0.03).clamp(0, 1)
            for p in _corners_and_samples(lo, hi, 8, 24, gen):
                m = _margins(mlp_logits(layers, p), int(label[b]))
                assert all(Fraction(res.lower_margin[b, j].item()) <= m[j] for j in range(2)), meth


# ---------------------------------------------------------------- hypothesis: affine chains
def _chain(weights, biases):
    g = Graph()
    v = g.add("input", (), (1, weights[0].shape[1]))
    for W, b in zip(weights, biases):
        v = g.add("linear", (v,), (1, W.shape[0]), W=W, b=b)
    return g


def _exact_chain(weights, biases, x):
    h = [Fraction(v) for v in x]
    for W, b in zip(weights, biases):
        h = [sum((Fraction(w) * v for w, v in zip(row, h)), Fraction(0)) + Fraction(bb)
             for row, bb in zip(W.tolist(), b.tolist())]
    return h


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), depth=st.integers(1, 4), width=st.integers(1, 5),
       log_scale=st.floats(-8, 8))
def test_affine_chain_sound_at_a_point(seed, depth, width, log_scale):
    gen = torch.Generator().manual_seed(seed)
    dims = [width + int(torch.randint(0, 3, (), generator=gen)) for _ in range(depth + 1)]
    weights, biases = [], []
    for i in range(depth):
        mag = 10.0 ** (log_scale * (2 * torch.rand(dims[i + 1], dims[i], generator=gen, dtype=torch.float64) - 1))
        weights.append(torch.randn(dims[i + 1], dims[i], generator=gen, dtype=torch.float64) * mag)
        biases.append(torch.randn(dims[i + 1], generator=gen, dtype=torch.float64) * 10.0 ** log_scale)
    g = _chain(weights, biases)
    x = torch.randn(1, 1, dims[0], generator=gen, dtype=torch.float64)
    C = torch.randn(1, 3, 1, dims[-1], generator=gen, dtype=torch.float64)
    exact = _exact_chain(weights, biases, x.flatten().tolist())
    for meth in ("ibp", "crown"):
        low = certify.linear_bounds(g, x, x, C, method=meth)[0]
        for s in range(3):
            val = sum((Fraction(c) * e for c, e in zip(C[0, s, 0].tolist(), exact)), Fraction(0))
            assert Fraction(low[s].item()) <= val, (meth, s)


# ---------------------------------------------------------------- the operator contract
def _dy(t, bits=3, lim=2.0):
    """Round to a multiple of 2^-bits in [-lim, lim]: values whose float64 products and short
    sums are exact, so the float64 forward pass is the real-arithmetic value."""
    return ((t * 2**bits).round() / 2**bits).clamp(-lim, lim)


def _node(op, shape, **params):
    return Node(op, (), tuple(shape), params)


def _contract_cases():
    """op name -> (node, input shapes (without the run-time batch), const or None,
    positive inputs?). Shapes are small; last axes are powers of two (means are exact)."""
    g = torch.Generator().manual_seed(11)
    r = lambda *s: _dy(torch.randn(*s, generator=g, dtype=torch.float64))  # noqa: E731
    cases = {
        "linear": (_node("linear", (3, 2), W=r(2, 4), b=r(2)), [(3, 4)]),
        "add": (_node("add", (3, 4)), [(3, 4), (3, 4)]),
        "bias": (_node("bias", (3, 4), value=r(3, 4)), [(3, 4)]),
        "prepend": (_node("prepend", (4, 4), token=r(4)), [(3, 4)]),
        "split_heads": (_node("split_heads", (2, 3, 2), heads=2), [(3, 4)]),
        "merge_heads": (_node("merge_heads", (3, 4), heads=2), [(2, 3, 2)]),
        "transpose": (_node("transpose", (4, 3)), [(3, 4)]),
        "scale": (_node("scale", (3, 4), factor=0.375), [(3, 4)]),
        "softmax_shift": (_node("softmax_shift", (3, 4)), [(3, 4)]),
        "sum_last": (_node("sum_last", (3, 1), n=4), [(3, 4)]),
        "mean_last": (_node("mean_last", (3, 1), n=4, add=0.25), [(3, 4)]),
        "center": (_node("center", (3, 4)), [(3, 4)]),
        "mean_tokens": (_node("mean_tokens", (4,), n=4), [(4, 4)]),
        "select_token": (_node("select_token", (4,), n=3, index=1), [(3, 4)]),
        "reshape": (_node("reshape", (4, 3), to=(4, 3), in_shape=(3, 4)), [(3, 4)]),
        "gather": (_node("gather", (5,), index=torch.tensor([0, 3, 3, 8, 7]), padded=True, numel=8,
                         in_shape=(2, 4)), [(2, 4)]),
        "mul_const": (_node("mul_const", (3, 4), value=r(1, 4)), [(3, 4)]),
        "add_const": (_node("add_const", (3, 4), value=r(1, 4)), [(3, 4)]),
        "matmul_const": (_node("matmul_const", (3, 2), M=r(4, 2), right=True, in_shape=(3, 4)), [(3, 4)]),
        "reduce": (_node("reduce", (3,), dims=(1,), keepdim=False, mean=True, count=4, in_shape=(3, 4)), [(3, 4)]),
        "cat": (_node("cat", (3, 6), pieces=[None, r(3, 2)], sizes=[4, 2], dim=1), [(3, 4)]),
        "permute": (_node("permute", (4, 3), dims=(1, 0)), [(3, 4)]),
        "conv2d": (_node("conv2d", (2, 2, 2), **ops.conv2d_params(r(2, 1, 2, 2), r(2), stride=1, padding=0,
                                                               in_shape=(1, 3, 3))), [(1, 3, 3)]),
        "mul": (_node("mul", (3, 4)), [(3, 4), (3, 4)]),
        "matmul": (_node("matmul", (3, 2)), [(3, 4), (4, 2)]),
    }
    for name in ops.names("elementwise"):
        cases[name] = (_node(name, (3, 4)), [(3, 4)])
    return cases


CASES = _contract_cases()
MP_FUNCS = {"exp": mpmath.exp, "reciprocal": lambda t: 1 / t, "rsqrt": lambda t: 1 / mpmath.sqrt(t),
            "sqrt": mpmath.sqrt, "neg_log": lambda t: -mpmath.log(t), "tanh": mpmath.tanh, "sigmoid": lambda t: 1 / (1 + mpmath.exp(-t)),
            "gelu": lambda t: t * mpmath.ncdf(t),
            "gelu_tanh": lambda t: t / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (t + MPF("0.044715") * t**3)))}
# the maps defined for x >= 0 only, as their operators declare (the registry is the one list)
POSITIVE = {n for n in MP_FUNCS if getattr(ops.get(n), "domain", (None, None))[0] == 0.0}


def _params(names):
    return [pytest.param(name, id=name) for name in names]


def _exact_out(name, node, xs, const):
    """The real value of the operator at dyadic inputs, as mpf entries (B, *out)."""
    if name in MP_FUNCS:
        return [[MP_FUNCS[name](MPF(v)) for v in row] for row in xs[0].flatten(1).tolist()]
    if node.operator.kind == "affine":
        return _affine_exact(node, xs, const)
    y = ops.get(name).forward(node, xs, const)  # relu, square, mul, matmul: exact on dyadic data
    return [[MPF(v) for v in row] for row in y.flatten(1).tolist()]


def check_contract(name, trials=3, points=6, seed=0, A_spread=20):
    """Sample the soundness contract of ``certify.ops.core`` for operator ``name``: random
    coefficients A spread over 2^±A_spread (cancellation), random dyadic boxes; for dyadic
    points in the box (corners and interior) the real A·out(in) is >= Σ new·in + bias,
    decided in mpmath at 60 digits (exact for the rational operators). Returns the number
    of violations."""
    node, shapes = CASES[name]
    op = node.operator
    g = torch.Generator().manual_seed(seed)
    B, S = 2, 3
    bad = 0
    for _ in range(trials):
        ins = []
        for s in shapes:
            a, b = _dy(2 * torch.randn(B, *s, generator=g, dtype=torch.float64)), \
                _dy(2 * torch.randn(B, *s, generator=g, dtype=torch.float64))
            lo, hi = torch.minimum(a, b), torch.maximum(a, b)
            if name in POSITIVE:
                lo, hi = lo.abs() + 0.25, hi.abs() + 0.5
                lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)
            ins.append((lo, hi))
        const = None
        if op.anchor is not None:
            const = op.anchor((ins[0][0] + ins[0][1]) / 2)
        spread = 2.0 ** torch.randint(-A_spread, A_spread + 1, (B, S, *node.shape), generator=g)
        A = torch.randn(B, S, *node.shape, generator=g, dtype=torch.float64) * spread
        new, bias = op.backward(node, A, ins, shapes, const, None)
        for k in range(points):
            xs = []
            for lo, hi in ins:
                if k < 2:
                    x = lo if k == 0 else hi
                else:
                    x = lo + (hi - lo) * torch.randint(0, 9, lo.shape, generator=g) / 8
                xs.append(x)
            out = _exact_out(name, node, xs, const)
            for b in range(B):
                for s_ in range(S):
                    lhs = mpmath.fsum(MPF(a) * o for a, o in zip(A[b, s_].flatten().tolist(), out[b]))
                    rhs = MPF(bias[b, s_].item()) + mpmath.fsum(
                        MPF(c) * MPF(v) for nk, x in zip(new, xs)
                        for c, v in zip(nk[b, s_].flatten().tolist(), x[b].flatten().tolist()))
                    bad += bool(lhs < rhs)
    return bad


@pytest.mark.parametrize("name", _params(sorted(set(ops.names()) - {"input"})))
def test_operator_contract(name):
    assert name in CASES, f"operator {name!r} has no contract case: add one to _contract_cases"
    assert check_contract(name) == 0


def test_contract_check_can_fail():
    """The same check catches the unsound arithmetic: without the charges, fl(A W) rounds
    on the wrong side for some coefficients of the linear adjoint."""
    with ops.arithmetic("plain"):
        assert check_contract("linear", trials=6, points=4, A_spread=30) > 0
    assert check_contract("linear", trials=6, points=4, A_spread=30) == 0


def test_affine_intervals_enclose_the_real_image():
    """Affine.interval is outward: at dyadic points the exact value lies inside."""
    g = torch.Generator().manual_seed(7)
    for name in sorted(ops.names("affine")):
        node, shapes = CASES[name]
        op = node.operator
        ins = []
        for s in shapes:
            a = torch.randn(2, *s, generator=g, dtype=torch.float64) * 1e3
            b = torch.randn(2, *s, generator=g, dtype=torch.float64) * 1e3
            ins.append((torch.minimum(a, b), torch.maximum(a, b)))
        const = op.anchor((ins[0][0] + ins[0][1]) / 2) if op.anchor is not None else None
        lo, hi = op.interval(node, ins, const)
        for k in range(4):
            xs = [l + (u - l) * torch.rand(l.shape, generator=g, dtype=torch.float64) for l, u in ins]
            if k < 2:
                xs = [l if k == 0 else u for l, u in ins]
            y = _affine_exact(node, xs, const)
            for b in range(2):
                for j, v in enumerate(y[b]):
                    assert MPF(lo[b].flatten()[j].item()) <= v <= MPF(hi[b].flatten()[j].item()), (name, j)


def _affine_exact(node, xs, const):
    """Exact value (mpf, (B, out entries)) of an affine operator at float inputs: the rows of
    M and the constant c are read from the adjoint of unit coefficients (one product with 1
    and sums with zeros: exact, as the dyadic constants of the cases make the means exact),
    then y = c + M x is summed at 60 digits."""
    op = node.operator
    m = math.prod(node.shape)
    out = []
    for b in range(xs[0].shape[0]):
        eye = torch.eye(m, dtype=torch.float64).reshape(1, m, *node.shape)
        cb = None if const is None else const[b:b + 1]
        rows, c = op.adjoint(node.params, eye, cb)
        val = [MPF(v) for v in c[0].tolist()]
        for rk, x in zip(rows, xs):
            xv = [MPF(v) for v in x[b].flatten().tolist()]
            for o in range(m):
                val[o] += mpmath.fsum(MPF(w) * v for w, v in zip(rk[0, o].flatten().tolist(), xv) if w != 0)
        out.append(val)
    return out
