"""The graph builder and the torch front end: every affine operator's adjoint is its exact
transpose, its interval encloses sampled images, and traced graphs compute what the model
computes (float64, to rounding)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from softcert import certify
from softcert.certify import crown, ops
from softcert.certify.lowering import Builder, normed_bound
from softcert.certify.options import AttackOptions

F64 = torch.float64


def _check_affine(g, i, B=2, S=3, seed=0):
    """<A, f(x) - f(0)> = Σ_k <adj_k(A), x_k> and bias = <A, f(0)>; interval encloses f."""
    node = g.nodes[i]
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, *g.nodes[j].shape, generator=gen, dtype=F64) for j in node.inputs]
    zeros = [torch.zeros_like(x) for x in xs]
    A = torch.randn(B, S, *node.shape, generator=gen, dtype=F64)
    f0 = ops.forward(node, zeros)
    lin = ops.forward(node, xs) - f0
    adj, bias = ops.adjoint(node, A)
    lhs = ops.sum_rest(A * lin.unsqueeze(1))
    rhs = sum(ops.sum_rest(a * x.unsqueeze(1)) for a, x in zip(adj, xs))
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12, msg=node.name)
    torch.testing.assert_close(bias, ops.sum_rest(A * f0.unsqueeze(1)), rtol=1e-12, atol=1e-12, msg=node.name)
    ins = [(x - 0.5, x + 0.5) for x in xs]
    lo, hi = node.operator.interval(node, ins)
    for _ in range(20):
        pts = [l + (u - l) * torch.rand(l.shape, generator=gen, dtype=F64) for l, u in ins]
        y = ops.forward(node, pts)
        assert (y >= lo - 1e-12).all() and (y <= hi + 1e-12).all(), node.name


CASES = {
    "reshape": lambda b, x: b.reshape(x, (1, 6, 2)),
    "permute": lambda b, x: b.permute(x, (0, 2, 1)),
    "slice": lambda b, x: b.rearrange(x, lambda t: t[:, 1:, ::2]),
    "select": lambda b, x: b.rearrange(x, lambda t: t[:, 2]),
    "expand": lambda b, x: b.rearrange(x, lambda t: t.unsqueeze(1).expand(1, 2, 3, 4)),
    "unfold": lambda b, x: b.rearrange(x, lambda t: t.unfold(2, 2, 1)),
    "pad": lambda b, x: b.rearrange(x, lambda t: torch.nn.functional.pad(t, (1, 2))),
    "index": lambda b, x: b.rearrange(x, lambda t: t[:, torch.tensor([2, 0, 2])]),
    "mul_const": lambda b, x: b.mul(x, torch.randn(3, 1, dtype=F64)),
    "add_const": lambda b, x: b.add(x, torch.randn(4, dtype=F64)),
    "matmul_right": lambda b, x: b.matmul(x, torch.randn(2, 4, 5, dtype=F64)),
    "matmul_left": lambda b, x: b.matmul(torch.randn(5, 3, dtype=F64), x),
    "sum": lambda b, x: b.reduce(x, (1,), False, False),
    "mean_keep": lambda b, x: b.reduce(x, (1, 2), True, True),
    "cat_const": lambda b, x: b.cat([torch.randn(1, 1, 4, dtype=F64), x, torch.randn(1, 2, 4, dtype=F64)], 1),
    "cat_self": lambda b, x: b.cat([x, b.mul(x, torch.tensor(2.0, dtype=F64))], 2),
    "sub_broadcast": lambda b, x: b.sub(x, b.reduce(x, (2,), True, True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_affine_lowering_is_exact(case):
    torch.manual_seed(0)
    b = Builder()
    x = b.input((1, 3, 4))
    out = CASES[case](b, x)
    g = b.finish(out)
    for i in range(1, len(g.nodes)):
        _check_affine(g, i)
    # the composed graph equals the torch operation
    xv = torch.randn(2, 1, 3, 4, dtype=F64)
    assert certify.forward(g, xv).shape == (2, *g.nodes[-1].shape)


@settings(max_examples=30, deadline=None)
@given(st.permutations([0, 1, 2, 3]), st.integers(0, 3), st.integers(1, 3))
def test_rearrangements_match_torch(perm, dim, step):
    b = Builder()
    x = b.input((2, 3, 4, 5))
    fn = lambda t: t.permute(*perm).narrow(dim, 0, 2).flip(0)[..., ::step]  # noqa: E731
    g = b.finish(b.rearrange(x, fn))
    xv = torch.randn(3, 2, 3, 4, 5, dtype=F64)
    ref = torch.stack([fn(t) for t in xv])
    torch.testing.assert_close(certify.forward(g, xv), ref, rtol=0, atol=0)
    for i in range(1, len(g.nodes)):
        _check_affine(g, i)


class _Everything(nn.Module):
    """Operators of the issue's list in one model: einsum, chunk, cat with a class token, slicing,
    indexing, unfold, sdpa with masks, batch norm, tanh/sigmoid-free (those come with their relaxations)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.pos = nn.Parameter(torch.randn(1, 5, 8))
        self.bn = nn.BatchNorm1d(5)
        self.qkv = nn.Linear(8, 24)
        self.head = nn.Linear(8, 3)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        t = x.flatten(1).unfold(1, 4, 4)                         # (B, 4, 4) patches
        t = self.embed(t)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
        t = self.bn(t)
        q, k, v = self.qkv(t).chunk(3, dim=-1)
        q, k, v = (u.reshape(u.shape[0], 5, 2, 4).transpose(1, 2) for u in (q, k, v))
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(4)
        b2 = torch.softmax(s - 0.5, dim=-1) @ v
        o = (a + b2).transpose(1, 2).reshape(t.shape[0], 5, 8)
        o = torch.relu(o[:, 0] - o[:, 1:].mean(1)) * 2.0
        return self.head(o)[:, torch.tensor([2, 0, 1])]


def test_traced_graph_computes_what_the_model_computes():
    torch.manual_seed(0)
    m = _Everything().eval().double()
    x = torch.rand(3, 1, 4, 4, dtype=F64)
    g = certify.trace(m, x)
    torch.testing.assert_close(certify.forward(g, x.unsqueeze(1)).squeeze(1), m(x), rtol=1e-10, atol=1e-10)
    ops_used = {n.op for n in g.nodes}
    assert {"gather", "cat", "softmax_shift", "matmul", "exp"} <= ops_used
    # the causal softmax is masked (no Vertex record); the einsum one is recorded
    assert sum(a.pv is not None for a in g.attention) == 1
    r = certify.verify(m, x, m(x).argmax(1), 0.01, method="crown")
    lo, hi = certify.spec.input_box(x, 0.01)
    pts = lo + (hi - lo) * torch.rand(256, *x.shape, dtype=F64)
    with torch.no_grad():
        z = m(pts.reshape(-1, 1, 4, 4)).reshape(256, 3, 3)
    y = m(x).argmax(1)
    sampled = (z.gather(2, y.view(1, -1, 1).expand(256, -1, 1)) - z).min(0).values
    assert (r.lower_margin <= sampled + 1e-9).all()


def test_training_mode_dropout_is_refused():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).train()
    with pytest.raises(ValueError, match="dropout in training mode"):
        certify.trace(m, torch.rand(1, 4))


@pytest.mark.parametrize("bn", [nn.BatchNorm1d, nn.BatchNorm2d])
def test_training_mode_batch_norm_is_refused_by_layer(bn):
    conv = nn.Conv2d(1, 2, 3) if bn is nn.BatchNorm2d else nn.Linear(4, 2)
    head = nn.Sequential(nn.Flatten(), nn.LazyLinear(2)) if bn is nn.BatchNorm2d else nn.Linear(2, 2)
    m = nn.Sequential(conv, bn(2), head).train()
    x = torch.rand(1, 1, 5, 5) if bn is nn.BatchNorm2d else torch.rand(1, 4)
    with pytest.raises(ValueError, match=r"^1: batch norm in training mode"):
        certify.trace(m, x)


def test_graph_cache_sees_parameter_updates():
    m = nn.Sequential(nn.Linear(4, 2)).double()
    x = torch.rand(2, 4, dtype=F64)
    r1 = certify.verify(m, x, 0, 0.0, domain=None)
    with torch.no_grad():
        m[0].bias[0] += 1.0  # moves the margin z_0 - z_1
    r2 = certify.verify(m, x, 0, 0.0, domain=None)
    z = m(x)
    torch.testing.assert_close(r2.lower_margin[:, 1], (z[:, 0] - z[:, 1]).detach(), rtol=1e-8, atol=1e-8)  # plain_slack widening
    assert not torch.allclose(r1.lower_margin, r2.lower_margin)


def test_graph_module_is_verified_on_its_own_graph():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double().eval()
    x = torch.rand(2, 4, dtype=F64)
    g = certify.trace(m, x)
    gm = certify.GraphModule(g)
    torch.testing.assert_close(gm(x), m(x), rtol=1e-12, atol=1e-12)
    y = m(x).argmax(1)
    a, b = certify.verify(m, x, y, 0.05), certify.verify(gm, x, y, 0.05)
    torch.testing.assert_close(a.lower_margin, b.lower_margin, rtol=1e-12, atol=1e-12)
    att = certify.attack(gm, x, y, 0.05, options=AttackOptions(steps=5))
    assert (att.min_margin >= b.worst_margin - 1e-9).all()


@pytest.mark.parametrize("method", ["ibp", "crown", "alpha-crown", "vertex"])
def test_conv_batchnorm_and_smooth_activations_are_verified_soundly(method):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.GELU(),
                      nn.Conv2d(4, 4, 3, padding="same", groups=2), nn.Tanh(), nn.Flatten(), nn.Linear(64, 3),
                      nn.Sigmoid()).double().eval()
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2.0)
    x = torch.rand(2, 1, 8, 8, dtype=F64)
    g = certify.trace(m, x)
    assert [n.op for n in g.nodes].count("conv2d") == 2
    torch.testing.assert_close(certify.forward(g, x.unsqueeze(1)).squeeze(1), m(x), rtol=1e-12, atol=1e-12)
    y = m(x).argmax(1)
    r = certify.verify(m, x, y, 0.02, method=method)
    lo, hi = certify.spec.input_box(x, 0.02)
    t = torch.rand(512, *x.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    t[:128] = (t[:128] > 0.5).to(F64)  # corners
    with torch.no_grad():
        z = m((lo + (hi - lo) * t).reshape(-1, 1, 8, 8)).reshape(512, 2, 3)
    sampled = (z.gather(2, y.view(1, -1, 1).expand(512, -1, 1)) - z).min(0).values
    assert (r.lower_margin <= sampled + 1e-9).all()


@pytest.mark.parametrize("form", certify.SOFTMAX_FORMS)
def test_softmax_forms_compute_softmax_and_enclose_it_on_a_grid(form):
    """Both lowerings equal torch.softmax (to rounding, also where exp under- or overflows),
    and their CROWN bounds on the probabilities, and a random linear bound through them,
    hold at every point of a 9³ grid of the score box."""
    with certify.softmax_form(form):
        b = Builder()
        x = b.input((2, 3))
        g = b.finish(b.softmax(x))
    assert {"sigmoid": "neg_log", "product": "reciprocal"}[form] in {n.op for n in g.nodes}
    pts = torch.tensor([[[0.3, -1.0, 2.0], [0.0, -800.0, -900.0]],
                        [[5.0, 5.0, 5.0], [700.0, 0.0, -700.0]]], dtype=F64)
    torch.testing.assert_close(certify.forward(g, pts), torch.softmax(pts, -1),
                               rtol=1e-12, atol=1e-300)
    centre = torch.tensor([[[0.5, -1.0, 1.5], [2.0, 2.5, -3.0]]], dtype=F64)
    rad = torch.tensor([[[1.5, 2.0, 1.0], [3.0, 0.5, 4.0]]], dtype=F64)
    xl, xu = centre - rad, centre + rad
    state = crown.propagate(g, xl, xu)
    lo, hi = state.bounds[g.output]
    t = torch.linspace(0, 1, 9, dtype=F64)
    grid = torch.cartesian_prod(t, t, t)  # (729, 3)
    s = xl + (xu - xl) * grid.reshape(729, 1, 1, 3).expand(729, 1, 2, 3)
    p = torch.softmax(s, -1).squeeze(1)
    assert (lo - 1e-15 <= p).all() and (p <= hi + 1e-15).all()
    A = torch.randn(1, 4, 2, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    bound = crown.backward(state, g.output, A)
    val = (A.unsqueeze(0) * p.reshape(729, 1, 1, 2, 3)).sum((-1, -2)).squeeze(1)
    assert (bound <= val + 1e-13).all()


def test_softmax_form_is_checked_and_keys_the_graph_cache():
    with pytest.raises(ValueError, match="softmax_form: expected one of sigmoid, product"):
        with certify.softmax_form("lse"):
            pass
    torch.manual_seed(0)
    m = _Everything().eval().double()
    x = torch.rand(1, 1, 4, 4, dtype=F64)
    with certify.softmax_form("product"):
        product = {n.op for n in certify.graph_of(m, x).nodes}
    sigmoid = {n.op for n in certify.graph_of(m, x).nodes}
    # the causal (masked) softmax keeps the product form in both
    assert "neg_log" in sigmoid and "neg_log" not in product and "reciprocal" in sigmoid


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_layer_norm_values_stay_within_the_normed_bound_which_is_nearly_attained(n):
    """Oracle: LayerNorm's normalised values in float64 on random, spiky and extreme rows lie
    within normed_bound(n); the row (n - 1, -1, ..., -1) with eps -> 0 approaches it."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(200, n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 8, (200, 1), generator=g)]
    spike = torch.zeros(1, n, dtype=torch.float64)
    spike[0, 0] = 1e6
    rows.append(spike)
    x = torch.cat(rows)
    y = nn.functional.layer_norm(x, (n,), eps=1e-12)
    assert y.abs().max() <= normed_bound(n)
    if n > 1:
        assert y[-1, 0] >= math.sqrt(n - 1) * (1 - 1e-9)


def test_layer_norm_interval_is_finite_on_any_box():
    """IBP of (x - mean)·rsqrt(var + eps) alone grows without limit with the box; the value
    range of the normalised node keeps the LayerNorm's output within |w|·sqrt(n - 1) + |b|."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3)).double().eval()
    x = torch.rand(2, 4, dtype=torch.float64)
    r = certify.verify(model, x, torch.tensor([0, 1]), 100.0, method="ibp", domain=None)
    assert torch.isfinite(r.lower_margin).all()
    w, b = model[1].weight.abs(), model[1].bias.abs()
    bound = (model[2].weight.abs() @ (w * normed_bound(8) + b)).max() + model[2].bias.abs().max()
    assert r.lower_margin.min() >= -2 * bound - 1e-9
