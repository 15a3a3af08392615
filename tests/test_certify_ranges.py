"""Operator traits are data that hold; node value ranges keep the relaxations defined when
interval arithmetic overflows (a large eps made exp overflow, the softmax denominator's
interval reached -inf and verify raised "reciprocal: input interval must be positive")."""
import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softcert import certify
from softcert.certify import ops
from softcert.certify.graph import Graph
from softcert.certify.models import ViT
from softcert.certify.spec import input_box

SAMPLE = {"relu": (-3, 3), "exp": (-6, 2), "reciprocal": (0.05, 5), "square": (-3, 3), "rsqrt": (0.01, 4),
          "gelu": (-4, 4), "gelu_tanh": (-4, 4), "tanh": (-3, 3), "sigmoid": (-6, 6), "sqrt": (0.01, 4),
          "neg_log": (0.01, 20), "trunc": (-3, 3), "nonzero": (-1, 1)}


@pytest.mark.parametrize("name", sorted(ops.names("elementwise")))
def test_elementwise_traits_hold(name):
    op = ops.get(name)
    g = torch.Generator().manual_seed(0)
    lo, hi = SAMPLE[name]
    a = lo + (hi - lo) * torch.rand(500, generator=g, dtype=torch.float64)
    b = lo + (hi - lo) * torch.rand(500, generator=g, dtype=torch.float64)
    fa, fb, fm = op.fn(a), op.fn(b), op.fn((a + b) / 2)
    vlo, vhi = op.value_range
    assert vlo is None or (torch.cat([fa, fb]) >= vlo).all()
    assert vhi is None or (torch.cat([fa, fb]) <= vhi).all()
    if op.monotone:  # same order for every pair, or reversed for every pair
        s = torch.sign(fa - fb) * torch.sign(a - b)
        assert (s >= 0).all() or (s <= 0).all()
    if op.convex:
        assert (fm <= (fa + fb) / 2 + 1e-12 * (1 + fm.abs())).all()
    dlo = op.domain[0]
    if dlo is not None:
        with pytest.raises(ValueError, match=name):
            op.planes(torch.tensor([dlo - 1.0]), torch.tensor([dlo + 1.0]))


def test_registry_names_operators_and_rejects_duplicates():
    assert set(ops.names()) == set(ops.OPERATORS)
    assert set(ops.names("bilinear")) == {"mul", "matmul"}
    with pytest.raises(ValueError, match="already registered"):
        ops.register(ops.get("exp"))
    with pytest.raises(ValueError, match="operator: 'sort' is not registered"):
        ops.get("sort")
    g = Graph()
    g.add("input", [], (2,))
    with pytest.raises(ValueError, match="operator: 'erf' is not registered"):
        g.add("erf", [0], (2,))
    with pytest.raises(ValueError, match="inputs: operator 'mul'"):
        g.add("mul", [0], (2,))


def _sampled_worst(m, x, y, eps, n=400, seed=0):
    gen = torch.Generator().manual_seed(seed)
    m64 = copy.deepcopy(m).double()
    lo, hi = input_box(x.double(), eps)
    t = torch.rand(n, *x.shape, generator=gen, dtype=torch.float64)
    t[: n // 4] = (t[: n // 4] > 0.5).double()
    with torch.no_grad():
        z = m64((lo + (hi - lo) * t).reshape(-1, *x.shape[1:])).reshape(n, x.shape[0], -1)
    return (z.gather(2, y.view(1, -1, 1).expand(n, -1, 1)) - z).min(0).values


def _sharp(seed, scale, layer_norm, depth):
    torch.manual_seed(seed)
    m = ViT(image=(1, 4, 4), patch=2, dim=4, heads=1, mlp=4, classes=3, depth=depth, layer_norm=layer_norm,
            pool="cls").eval()
    with torch.no_grad():
        for blk in m.blocks:  # large score weights: exp of the score bounds overflows
            for lin in (blk.attn.q, blk.attn.k, blk.fc1, blk.fc2):
                lin.weight.mul_(scale)
    x = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        y = m(x).argmax(1)
    return m, x, y


def test_overflowing_softmax_bounds_regression():
    torch.manual_seed(5)
    m = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=3, depth=2, layer_norm=True, pool="cls").eval()
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))[:3]
    with torch.no_grad():
        y = m(x).argmax(1)
    r = certify.verify(m, x, y, 0.05, method="crown")  # raised ValueError before
    assert (_sampled_worst(m, x, y, 0.05) >= r.lower_margin - 1e-7).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 30.0, 1e3, 1e6]),
       eps=st.sampled_from([0.01, 0.1, 0.5, 1.0]), layer_norm=st.booleans(), depth=st.integers(1, 2),
       method=st.sampled_from(["ibp", "crown", "vertex"]))
def test_large_scores_and_radii_never_raise_and_stay_sound(seed, scale, eps, layer_norm, depth, method):
    m, x, y = _sharp(seed, scale, layer_norm, depth)
    r = certify.verify(m, x, y, eps, method=method)
    assert not torch.isnan(r.lower_margin).any()
    assert (_sampled_worst(m, x, y, eps) >= r.lower_margin - 1e-7 * (1 + r.lower_margin.abs())).all()


def _enclosure_violations(m, x, eps, crown_on, n=200):
    from softcert.certify import crown

    m64 = copy.deepcopy(m).double()
    g = certify.trace(m64, x.double())
    lo, hi = input_box(x.double(), eps)
    state = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), algorithm="crown" if crown_on else "ibp",
                            centre=x.double().unsqueeze(1))
    t = torch.rand(n, *x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pts = (lo + (hi - lo) * t).reshape(-1, *x.shape[1:])
    vals = [pts.unsqueeze(1)]
    for i, node in enumerate(g.nodes[1:], 1):
        const = state.consts.get(i)
        if const is not None:
            const = const.repeat(n, *[1] * (const.dim() - 1))
        vals.append(ops.forward(node, [vals[j] for j in node.inputs], const))
    bad = []
    for i, v in enumerate(vals):
        l, u = state.bounds[i]
        v = v.reshape(n, *l.shape)
        # float64 without outward rounding (crown.ARITHMETIC): centre ± radius loses about
        # u·(|l| + |u|) to cancellation; the tolerance covers that, not a wrong interval
        size = torch.nan_to_num(l.abs(), posinf=0.0) + torch.nan_to_num(u.abs(), posinf=0.0)
        tol = 1e-9 * (1 + v.abs() + size)
        ok = torch.isnan(v) | ((v >= l - tol) & (v <= u + tol))
        if not ok.all():
            bad.append(g.nodes[i].name)
    return bad


def test_ibp_encloses_activations_when_exp_overflows():
    # before: the exp-sum's interval became NaN -> -inf, 1/x of it gave [0, -0] and the
    # attention probabilities the interval [0, 0]
    m, x, y = _sharp(1, 1e3, False, 2)
    assert _enclosure_violations(m, x, 0.5, crown_on=False) == []


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 30.0, 1e3, 1e6]),
       eps=st.sampled_from([0.01, 0.1, 0.5]), layer_norm=st.booleans(), crown_on=st.booleans())
def test_every_node_bound_encloses_activations_in_the_overflow_regime(seed, scale, eps, layer_norm, crown_on):
    m, x, _ = _sharp(seed, scale, layer_norm, 2)
    assert _enclosure_violations(m, x, eps, crown_on) == []


def test_elementwise_interval_outside_the_domain_is_unbounded():
    box = [(torch.tensor([-1.0, 0.0, 0.5]), torch.tensor([2.0, 1.0, 1.0]))]
    lo, hi = ops.get("rsqrt").interval(None, box)
    assert torch.isinf(lo[:2]).all() and torch.isinf(hi[:2]).all() and torch.isfinite(lo[2])
    # 1/x: a box across 0 is unbounded both ways; one touching 0 from above is [1/u, inf]
    lo, hi = ops.get("reciprocal").interval(None, box)
    assert lo[0] == -torch.inf and hi[0] == torch.inf and 0.9999 < lo[1] <= 1.0 and hi[1] == torch.inf
    assert torch.isfinite(lo[2]) and torch.isfinite(hi[2])
    lo, hi = ops.get("reciprocal").interval(None, [(torch.tensor([-2.0, 0.0]), torch.tensor([0.0, 0.0]))])
    assert -0.5 <= hi[0] < -0.4999 and lo[0] == -torch.inf and lo[1] == -torch.inf and hi[1] == torch.inf
