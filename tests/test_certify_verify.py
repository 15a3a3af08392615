"""Soundness of every verification method: sampled points (incl. box corners) and PGD never
fall below a certified lower margin; every node's bounds enclose sampled activations."""
import copy

import pytest
import torch

from softcert import certify
from softcert.certify import crown, ops
from softcert.certify.models import ViT
from softcert.certify.options import AttackOptions
from softcert.certify.spec import input_box

EPS = 0.03
N_SAMPLES = 10_000


def _tiny(depth, **kw):
    torch.manual_seed(7 + depth)
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=depth, **kw).eval()
    with torch.no_grad():  # sharper attention so the softmax relaxation matters
        for blk in m.blocks:
            blk.attn.q.weight.mul_(2.0)
            blk.attn.k.weight.mul_(2.0)
    x = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(depth))
    with torch.no_grad():
        y = m(x).argmax(1)
    return m, x, y


MODELS = {"one-block": _tiny(1), "two-block-ln-cls": _tiny(2, layer_norm=True, pool="cls")}


def _sample_margins(m, x, y, eps, n=N_SAMPLES, seed=0):
    """Minimum over n points of the ball (a fifth of them box corners) of z_y - z_j (B, K)."""
    g = torch.Generator().manual_seed(seed)
    m64 = copy.deepcopy(m).double()
    x = x.double()
    lo, hi = input_box(x, eps)
    worst = torch.full((x.shape[0], m.head.out_features), torch.inf, dtype=torch.float64)
    for s in range(0, n, 2000):
        t = torch.rand(2000, *x.shape, generator=g, dtype=torch.float64)
        if s < n // 5:
            t = (t > 0.5).double()  # corners
        pts = lo + (hi - lo) * t
        with torch.no_grad():
            z = m64(pts.reshape(-1, *x.shape[1:])).reshape(2000, *worst.shape)
        mar = z.gather(2, y.view(1, -1, 1).expand(2000, -1, 1)) - z
        worst = torch.minimum(worst, mar.min(0).values)
    return worst


OURS = ["ibp", "crown", "alpha-crown", "vertex"]
LIRPA = ["lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown"]


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, (m, x, y) in MODELS.items():
        for meth in OURS + (LIRPA if name == "one-block" else []):
            out[(name, meth)] = certify.verify(m, x, y, EPS, method=meth)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_sampled_margins_never_below_bounds(name, results):
    m, x, y = MODELS[name]
    worst = _sample_margins(m, x, y, EPS)
    for (n, meth), r in results.items():
        if n != name:
            continue
        assert r.lower_margin.shape == (3, 3) and r.certified.shape == (3,)
        assert (worst >= r.lower_margin - 1e-7).all(), meth
        assert r.method == meth and r.eps == EPS and r.seconds >= 0


@pytest.mark.parametrize("name", list(MODELS))
def test_pgd_never_falsifies_a_certificate(name, results):
    m, x, y = MODELS[name]
    for (n, meth), r in results.items():
        if n != name:
            continue
        att = certify.attack(m, x, y, EPS, certified=r.certified, options=AttackOptions(steps=20))
        assert (att.min_margin >= r.worst_margin - 1e-7).all(), meth
        for s, c in zip(att.status, r.certified.tolist()):
            assert (s == "unsat") == c


def test_not_vacuous_and_ordered(results):
    lo = {k: r.lower_margin for k, r in results.items()}
    for name in MODELS:
        assert results[(name, "crown")].certified.any(), name
        assert (lo[(name, "vertex")] >= lo[(name, "crown")] - 1e-12).all()
        assert (lo[(name, "alpha-crown")] >= lo[(name, "crown")] - 1e-12).all()
        assert (lo[(name, "crown")] >= lo[(name, "ibp")] - 1e-12).all()


def test_ours_at_least_as_tight_as_lirpa_crown(results):
    ours, theirs = results[("one-block", "crown")].lower_margin, results[("one-block", "lirpa-crown")].lower_margin
    assert (ours >= theirs - 1e-5).all()


@pytest.mark.parametrize("vertex", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_intermediate_bound_encloses_samples(name, vertex):
    m, x, y = MODELS[name]
    m64 = copy.deepcopy(m).double()
    g = certify.trace(m64, x.double())
    lo, hi = input_box(x.double(), EPS)
    state = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), algorithm="vertex" if vertex else "crown")
    gen = torch.Generator().manual_seed(5)
    for _ in range(5):
        t = torch.rand(400, *x.shape, generator=gen, dtype=torch.float64)
        t[:100] = (t[:100] > 0.5).double()
        pts = (lo + (hi - lo) * t).reshape(-1, *x.shape[1:])
        vals = [pts.unsqueeze(1)]
        for i, node in enumerate(g.nodes[1:], 1):
            const = state.consts.get(i)
            if const is not None:
                const = const.repeat(400, *[1] * (const.dim() - 1))
            vals.append(ops.forward(node, [vals[j] for j in node.inputs], const))
        for i, v in enumerate(vals):
            l, u = state.bounds[i]
            v = v.reshape(400, *l.shape)
            assert (v >= l - 1e-9).all() and (v <= u + 1e-9).all(), g.nodes[i].name


@pytest.mark.parametrize("bad", [
    dict(eps=-0.1), dict(eps=float("nan")), dict(x=torch.rand(2, 1, 5, 4)),
    dict(x=torch.full((1, 1, 4, 4), float("nan"))), dict(label=torch.tensor([5])),
    dict(method="deep-magic"),
])
def test_bad_input_raises(bad):
    m, x, y = MODELS["one-block"]
    kw = dict(x=x[:1], label=y[:1], eps=0.01, method="crown") | bad
    with pytest.raises(ValueError):
        certify.verify(m, kw["x"], kw["label"], kw["eps"], method=kw["method"])
    if "method" not in bad:
        with pytest.raises(ValueError):
            certify.attack(m, kw["x"], kw["label"], kw["eps"])


def test_an_infinite_bound_names_its_node_and_operator():
    """A -inf margin comes with a note naming the first node whose interval blew up (here
    exp of scores up to 1600: float64's largest value) and what to try (issue 32: crown on a
    tiny BERT gave worst_margin -inf with an empty note)."""
    import torch
    from torch import nn

    from softcert import certify

    class Blowup(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)
            with torch.no_grad():
                self.a.weight.fill_(400.0)

        def forward(self, x):
            return self.b(torch.exp(self.a(x)))

    m = Blowup().double().eval()
    x = torch.zeros(2, 4, dtype=torch.float64)
    y = m(x).argmax(1)
    for method in ("ibp", "crown"):
        r = certify.verify(m, x, y, 0.5, method=method)
        assert (r.worst_margin == -torch.inf).all()
        assert "operator exp" in r.note and "smaller eps" in r.note, r.note
    small = certify.verify(m, x, y, 1e-6, method="crown")  # finite: no note
    assert torch.isfinite(small.worst_margin).all() and small.note == ""
