"""Branch-and-bound verdicts (certify.bab) against exhaustive gridding of a 2-input model.

The model has every kind of neuron BaB splits (attention scores feeding exp, the other keys'
exp sum feeding -log, the logit feeding the sigmoid, ReLU, GELU) on a 2-d input, so a 301 x 301 grid of its input box (plus the
corners) is a near-exhaustive oracle: a certified lower margin never exceeds the grid
minimum, a certified sample has a positive grid minimum and survives PGD, a falsified
sample's counterexample is real. The leaves of a run cover the box: every grid point
satisfies the constraints of some leaf.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert import certify
from softcert.certify import bab, ops
from softcert.certify.bab.engine import LeafBounder, Rows, splittable
from softcert.certify.graph_cache import graph_of
from softcert.certify.options import AttackOptions, BabOptions
from softcert.certify.result import STATUSES
from softcert.certify.spec import input_box, margin_spec


class Tiny(torch.nn.Module):
    """2-d input -> 2 tokens of width 4 -> one attention head -> ReLU -> GELU -> 3 logits."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Linear(2, 8)
        self.q, self.k, self.v = (torch.nn.Linear(4, 4) for _ in range(3))
        self.fc1, self.fc2, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0, 1)

    def forward(self, x):
        t = self.emb(x).reshape(x.shape[0], 2, 4)
        p = F.softmax(2.0 * (self.q(t) @ self.k(t).transpose(-1, -2)), dim=-1)
        h = F.relu(self.fc1((p @ self.v(t)).reshape(x.shape[0], 8)))
        return self.head(F.gelu(self.fc2(h)))


MODEL = Tiny(3).double().eval()
X = torch.rand(6, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
with torch.no_grad():
    Y = MODEL(X).argmax(1)
EPS = 0.1
GRID = 301


def _grid(lo, hi):
    """GRID x GRID points of the box [lo, hi] (2,), corners included."""
    t = torch.linspace(0, 1, GRID, dtype=torch.float64)
    a, b = torch.meshgrid(lo[0] + (hi[0] - lo[0]) * t, lo[1] + (hi[1] - lo[1]) * t, indexing="ij")
    return torch.stack([a.flatten(), b.flatten()], 1)


def _grid_margins(x, y, eps):
    """min over the grid of the ball of z_y - z_j (K,)."""
    lo, hi = input_box(x[None], eps, None)
    pts = _grid(lo[0], hi[0])
    with torch.no_grad():
        z = MODEL(pts)
    return (z[:, y:y + 1] - z).min(0).values


def _bab(x, y, eps, method="bab", **options):
    """certify.verify by branch and bound with ``BabOptions(**options)`` (domain unclipped)."""
    return certify.verify(MODEL, x, y, eps, method, domain=None, options=BabOptions(**options))


@pytest.fixture(scope="module", params=[("bab", dict()), ("bab-vertex", dict(refine=128)),
                                        ("bab", dict(intermediate="alpha")), ("bab", dict(intermediate="auto"))],
                ids=["default", "crown-vertex", "alpha-root", "auto-root"])
def result(request):
    # the default, and the options off by default: leaves re-bound small nonlinear inputs by
    # CROWN (refine) and use Vertex-Softmax intervals and P·V bounds (bab-vertex); the root's
    # intermediate bounds optimised by alpha-CROWN (intermediate)
    method, opts = request.param
    return _bab(X[:4], Y[:4], EPS, method, timeout=20, max_leaves=20, batch=8, **opts)


def test_bab_against_exhaustive_grid(result):
    assert {v.status for v in result.verdicts} >= {"certified"}  # the oracle is exercised
    crown = certify.verify(MODEL, X[:4], Y[:4], EPS, method="crown", domain=None)
    for b, v in enumerate(result.verdicts):
        grid = _grid_margins(X[b], int(Y[b]), EPS)
        lm = result.lower_margin[b]
        # the lower margins are bounds over the whole box, whatever the verdict
        assert (lm <= grid + 1e-12).all(), (b, lm, grid)
        assert v.status in STATUSES
        if v.status == "certified":
            others = torch.arange(3) != Y[b]
            assert (lm[others] > 0).all() and (grid[others] > 0).all()
            # BaB never ends below what CROWN alone proves
            assert (lm[others] >= crown.lower_margin[b][others] - 1e-9).all()
        if v.status == "falsified":
            cex = v.counterexample
            lo, hi = input_box(X[b:b + 1], EPS, None)
            assert ((cex >= lo[0]) & (cex <= hi[0])).all()
            with torch.no_grad():
                z = MODEL(cex[None])[0]
            assert int(z.argmax()) != int(Y[b]) or (z[Y[b]] - z).min() < 0
            assert v.counterexample is not None and lm.min() < 0


def _near_boundary(n):
    """n points whose top-two logits are closest (of a fixed random draw): easy to falsify."""
    pts = 4 * torch.rand(4000, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64) - 2
    with torch.no_grad():
        top = MODEL(pts).topk(2, 1).values
    x = pts[(top[:, 0] - top[:, 1]).argsort()[:n]]
    with torch.no_grad():
        return x, MODEL(x).argmax(1)


def test_falsified_counterexamples_are_real():
    eps = 0.05
    xs, ys = _near_boundary(2)
    r = _bab(xs, ys, eps, timeout=20, max_leaves=20)
    assert r.status == ("falsified", "falsified")
    lo, hi = input_box(xs, eps, None)
    for b, v in enumerate(r.verdicts):
        if v.status != "falsified":
            continue
        cex = v.counterexample
        assert cex.shape == xs.shape[1:] and ((cex >= lo[b]) & (cex <= hi[b])).all()
        with torch.no_grad():
            z = MODEL(cex[None])[0]
        assert (z[ys[b]] - z).min() < 0
        assert (r.lower_margin[b] <= _grid_margins(xs[b], int(ys[b]), eps) + 1e-12).all()


def test_bab_proves_what_relu_only_alpha_crown_cannot():
    # alpha-CROWN with ReLU slopes only leaves this sample open; BaB (without Vertex leaves)
    # proves it. Since every relaxation became optimisable (certify/ops/bilinear.py,
    # elementwise.py) its root alpha-CROWN alone already does here: on this model splitting
    # adds no certificate at eps <= 0.033 (measured while merging; the split machinery is
    # covered by the leaf-coverage tests)
    x, y = X[2:3], Y[2:3]
    eps = 0.028
    assert not certify.verify(MODEL, x, y, eps, method="alpha-crown-relu", domain=None).certified.item()
    r = _bab(x, y, eps, timeout=60, max_leaves=200)
    lm = r.lower_margin[0]
    assert r.status == ("certified",) and r.method == "bab"
    grid = _grid_margins(x[0], int(y), eps)
    others = torch.arange(3) != y
    assert (lm[others] > 0).all() and (lm <= grid + 1e-12).all()


def test_certified_samples_survive_pgd(result):
    cert = result.certified
    assert cert.any()
    att = certify.attack(MODEL, X[:4][cert], Y[:4][cert], EPS, options=AttackOptions(steps=50, restarts=5),
                         domain=None)
    assert (att.min_margin > 0).all()
    assert not att.falsified.any()


def test_leaves_cover_the_box():
    # stop early (max_leaves) so that open and proved leaves both remain; every grid point
    # of the box satisfies every split constraint of some leaf of each group
    x, y = X[5:6], Y[5:6]
    g = graph_of(MODEL, x)
    lo, hi = input_box(x, 0.2, None)
    C = margin_spec(y, 3).reshape(3, 1, 3)[[j for j in range(3) if j != int(y)]]
    out = bab.branch_and_bound(g, lo.unsqueeze(1), hi.unsqueeze(1), Rows(C, torch.zeros(2), torch.arange(2)),
                               deadline=math.inf, options=BabOptions(batch=4, max_leaves=60, intermediate="full"),
                               centre=x.unsqueeze(1))
    assert any(len(cons) > 0 for _, cons, _ in out.leaves)
    pts = _grid(lo[0], hi[0])[::7]
    with torch.no_grad():
        vals = g.values(pts)
    for group in range(2):
        inside = torch.zeros(len(pts), dtype=torch.bool)
        for k, cons, _ in out.leaves:
            if k != group:
                continue
            ok = torch.ones(len(pts), dtype=torch.bool)
            for node, j, a, b in cons:
                z = vals[node].reshape(len(pts), -1)[:, j]
                ok &= (z >= a) & (z <= b)
            inside |= ok
        assert inside.all(), f"group {group}: {(~inside).sum()} grid points in no leaf"
    # proved leaves carry sound bounds: no grid point of a proved leaf has a margin <= 0
    with torch.no_grad():
        z = MODEL(pts)
    marg = (z[:, int(y):int(y) + 1] - z)[:, [j for j in range(3) if j != int(y)]]
    for k, cons, proved in out.leaves:
        if not proved:
            continue
        ok = torch.ones(len(pts), dtype=torch.bool)
        for node, j, a, b in cons:
            z_ = vals[node].reshape(len(pts), -1)[:, j]
            ok &= (z_ >= a) & (z_ <= b)
        assert (marg[ok, k] > 0).all()


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e6, 1e6), st.floats(1e-9, 1e6), st.floats(0.0, 1.0))
def test_split_interval_children_cover_the_parent(lo, width, t):
    hi = lo + width
    p = lo + t * (hi - lo)
    if not lo < p < hi:
        with pytest.raises(AssertionError):
            bab.split_interval(lo, hi, p)
        return
    (a, b), (c, d) = bab.split_interval(lo, hi, p)
    assert a == lo and d == hi and b == c == p
    for q in (lo, p, hi, lo + (hi - lo) * 0.3):
        if lo <= q <= hi:
            assert a <= q <= b or c <= q <= d


def test_split_points_inside_the_interval():
    l = torch.tensor([-1.0, 0.5, -3.0, 2.0, -2.0], dtype=torch.float64)
    u = torch.tensor([2.0, 0.5 + 1e-14, -1.0, 2.0, 0.0], dtype=torch.float64)
    p = ops.get("relu").split.point(l, u)
    assert p[0] == 0 and torch.isnan(p[1:]).all()  # only the crossing ReLU is split
    p = ops.get("exp").split.point(l, u)
    ok = ~torch.isnan(p)
    assert ok.tolist() == [True, False, True, False, True]
    assert ((l[ok] < p[ok]) & (p[ok] < u[ok])).all()


def test_zero_budget_is_unknown():
    r = _bab(X[:2], Y[:2], EPS, timeout=1e-9)
    assert r.status == ("unknown", "unknown")
    assert all(v.counterexample is None and v.leaves == 0 for v in r.verdicts)


def test_api_verify_bab_path():
    r = certify.verify(MODEL, X[:1], Y[:1], 0.01, method="bab", domain=None, options=BabOptions(timeout=10))
    assert isinstance(r, certify.CertResult) and r.status == ("certified",) and r.certified.tolist() == [True]
    assert r.counts() == {"certified": 1, "falsified": 0, "unknown": 0}
    # the same result type as the bound-only methods, verdicts included
    c = certify.verify(MODEL, X[:1], Y[:1], 0.01, method="crown", domain=None)
    assert type(c) is type(r) and c.status in (("certified",), ("unknown",)) and c.counts()["falsified"] == 0
    with pytest.raises(ValueError, match="timeout"):
        certify.verify(MODEL, X[:1], Y[:1], 0.01, method="bab", domain=None)
    with pytest.raises(ValueError, match="options: method 'crown' takes a BoundOptions"):
        certify.verify(MODEL, X[:1], Y[:1], 0.01, method="crown", domain=None, options=BabOptions(timeout=5))
    with pytest.raises(ValueError, match="bab-vertex"):
        certify.verify(MODEL, X[:1], Y[:1], 0.01, method="bab", domain=None, options=BabOptions(timeout=5, vertex=True))


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_bad_timeout_named(timeout):
    with pytest.raises(ValueError, match="timeout"):
        _bab(X[:1], Y[:1], EPS, timeout=timeout)


def test_auto_root_optimises_only_open_roots(monkeypatch):
    """intermediate="auto": samples proved at the root never pay for optimised intermediate
    bounds; an open root is re-bounded on them (and the verdict stays sound: the grid)."""
    from softcert.certify import crown

    calls = []
    propagate = crown.propagate
    monkeypatch.setattr(crown, "propagate",
                        lambda *a, **k: calls.append(k["options"].intermediate) or propagate(*a, **k))
    seen = set()
    for b in range(6):
        calls.clear()
        r = _bab(X[b:b + 1], Y[b:b + 1], EPS, timeout=20, max_leaves=20, batch=8, intermediate="auto",
                 attack=AttackOptions(enabled=False))
        # the roots alone are one leaf per target class (2 here): more means a root was open
        assert calls == (["full"] if r.verdicts[0].leaves == 2 else ["full", "alpha"])
        seen.add(tuple(calls))
        assert (r.lower_margin[0] <= _grid_margins(X[b], int(Y[b]), EPS) + 1e-9).all()
    assert seen == {("full",), ("full", "alpha")}


def test_auto_root_leaves_branching_its_share_of_the_budget(monkeypatch):
    """The "auto" root optimises within root_share of the budget left when it starts, not up
    to the sample's deadline (on two blocks it used to take all of it: no leaf was split)."""
    import time

    from softcert.certify import crown

    seen = []
    propagate = crown.propagate

    def spy(*a, **k):
        if k["options"].intermediate == "alpha":
            seen.append((time.monotonic(), k["deadlines"].optimise))
        return propagate(*a, **k)

    monkeypatch.setattr(crown, "propagate", spy)
    timeout = 30.0
    for b in range(6):
        _bab(X[b:b + 1], Y[b:b + 1], EPS, timeout=timeout, max_leaves=20, batch=8, intermediate="auto",
             attack=AttackOptions(enabled=False))
        for now, deadline in seen:
            # the budget left when it starts is at most the timeout (1 ms: the spy's own clock read)
            assert 0 < deadline - now <= BabOptions().root_share * timeout + 1e-3
        if seen:
            break
    assert seen, "no open root among the first six samples"


def test_bad_input_named():
    bad = X[:1].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="x"):
        _bab(bad, Y[:1], EPS, timeout=5)
    with pytest.raises(ValueError, match="eps"):
        _bab(X[:1], Y[:1], float("nan"), timeout=5)
    with pytest.raises(ValueError, match="label"):
        _bab(X[:1], torch.tensor([7]), EPS, timeout=5)
    with pytest.raises(ValueError, match="intermediate"):
        _bab(X[:1], Y[:1], EPS, timeout=5, intermediate="fast")
    with pytest.raises(ValueError, match="branching"):
        _bab(X[:1], Y[:1], EPS, timeout=5, branching="random")


# ---------------------------------------------------------------- VNN-COMP on the same engine
def test_vnncomp_solve_with_bab(tmp_path):
    import numpy as np
    from test_vnncomp import check_counterexample, export, ort_out, robustness

    from softcert.certify.onnx_graph import read_onnx
    from softcert.certify.vnncomp import SOLVE_METHODS, solve
    from softcert.certify.vnnlib import parse_vnnlib

    assert "bab" in SOLVE_METHODS
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 12), torch.nn.ReLU(), torch.nn.Linear(12, 8), torch.nn.GELU(),
                                torch.nn.Linear(8, 4))
    path = export(model, torch.zeros(1, 3), tmp_path / "mlp.onnx", opset=14)
    net = read_onnx(path)
    x0 = np.array([0.3, -0.2, 0.5])
    label = int(np.argmax(ort_out(path, x0)))
    prop = parse_vnnlib(robustness(x0, 2.0, label, 4))
    v = solve(net, prop, 30, "bab")
    assert v.result == "sat" and v.method == "bab"
    check_counterexample(path, prop, v.counterexample)
    prop = parse_vnnlib(robustness(x0, 0.05, label, 4))
    v = solve(net, prop, 30, "bab")
    assert v.result == "unsat" and v.counterexample is None and v.boxes >= 1
    r = prop.regions[0]
    for x in r.lower + (r.upper - r.lower) * np.random.default_rng(0).random((50, 3)):
        assert not r.satisfied(ort_out(path, x))
    assert solve(net, prop, 1e-9, "bab").result == "timeout"


def test_cli_bab_writes_table_json_and_cactus(tmp_path, capsys):
    import json

    from softcert.cli import main

    argv = ["bab", "--n", "1", "--eps", "0.001", "--timeout", "30", "--methods", "crown", "bab",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "certified" in capsys.readouterr().out
    data = json.loads((tmp_path / "bab.json").read_text())
    (row,) = data["rows"]
    assert set(row["methods"]) == {"crown", "bab"} and row["methods"]["bab"]["counts"]["certified"] <= row["n"]
    assert (tmp_path / "bab.md").read_text().startswith("# Branch and bound")
    assert (tmp_path / "bab_cactus.png").stat().st_size > 0
    assert main(["bab", "--methods", "nope", "--out", str(tmp_path)]) == 2
    assert "--methods" in capsys.readouterr().err
    assert main(["bab", "--timeout", "0", "--out", str(tmp_path)]) == 2
    assert "--timeout" in capsys.readouterr().err


# ---------------------------------------------------------------- split constraints (beta)
def _node_values(graph, pts, state):
    """Every node's value at the points (P, *input shape), float64."""
    from softcert.certify import ops

    vals = [pts]
    with torch.no_grad():
        for i, n in enumerate(graph.nodes[1:], 1):
            vals.append(ops.forward(n, [vals[j] for j in n.inputs], state.consts.get(i)))
    return vals


def test_multiplier_carries_the_split_into_the_bound():
    """out = z = x on [-1, 1] with the leaf constraint z >= 0.5: without a multiplier the
    constraint is lost (bound -1); beta_lo = 1 gives the exact leaf minimum 0.5, never more."""
    from softcert.certify import crown

    model = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)).double()
    with torch.no_grad():
        for lin in model:
            lin.weight.fill_(1.0)
            lin.bias.fill_(0.0)
    x = torch.zeros(1, 1, dtype=torch.float64)
    g = graph_of(model, x)
    z = next(i for i, n in enumerate(g.nodes) if n.op == "linear")
    st = crown.propagate(g, -torch.ones(1, 1, 1, dtype=torch.float64), torch.ones(1, 1, 1, dtype=torch.float64))
    C = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    lo, hi = torch.full((1, 1, 1), 0.5, dtype=torch.float64), torch.full((1, 1, 1), torch.inf, dtype=torch.float64)
    free = crown.backward(st, g.output, C)
    for beta, want in ((0.0, -1.0), (1.0, 0.5)):
        b = torch.full((1, 1, 1, 1), beta, dtype=torch.float64)
        got = float(crown.backward(st, g.output, C, constraints={z: (lo, hi, b, torch.zeros_like(b))}))
        assert want - 1e-12 <= got <= want, (beta, got)
    assert float(free) <= -1.0 + 1e-12


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]))
def test_split_constraint_bounds_hold_on_the_leaf(seed, scale):
    """For random split constraints on the ReLU and exp inputs of the tiny model and random
    multipliers beta >= 0, the bound never exceeds the grid minimum of C·out over the grid
    points of the box that satisfy the constraints (the leaf)."""
    from softcert.certify import crown

    gen = torch.Generator().manual_seed(seed)
    b = seed % 6
    x, y = X[b:b + 1], int(Y[b])
    g = graph_of(MODEL, x)
    lo, hi = input_box(x, EPS, None)
    st_ = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), centre=x.unsqueeze(1))
    C = margin_spec(torch.tensor([y]), 3).reshape(3, *g.nodes[g.output].shape)[None]
    pts = _grid(lo[0], hi[0])[::7].reshape(-1, 1, 2)
    vals = _node_values(g, pts, st_)
    inside = torch.ones(len(pts), dtype=torch.bool)
    cons = {}
    feeds = splittable(g)
    for i in feeds:
        l, u = st_.bounds[i]
        lo_c = torch.full_like(l, -torch.inf)
        hi_c = torch.full_like(u, torch.inf)
        flat_l, flat_u = l.flatten(), u.flatten()
        for k in torch.randperm(flat_l.numel(), generator=gen)[:2].tolist():
            if not (torch.isfinite(flat_l[k]) and torch.isfinite(flat_u[k]) and flat_u[k] > flat_l[k]):
                continue
            p = float(flat_l[k] + (flat_u[k] - flat_l[k]) * torch.rand(1, generator=gen, dtype=torch.float64))
            side = torch.rand(1, generator=gen).item() < 0.5
            if side:
                lo_c.view(-1)[k] = p
            else:
                hi_c.view(-1)[k] = p
            v = vals[i].reshape(len(pts), -1)[:, k]
            inside &= (v >= p) if side else (v <= p)
        shape = (1, C.shape[1], *l.shape[1:])
        cons[i] = (lo_c, hi_c, scale * torch.rand(shape, generator=gen, dtype=torch.float64),
                   scale * torch.rand(shape, generator=gen, dtype=torch.float64))
    if not inside.any():
        return  # an empty leaf: any bound holds
    bound = crown.backward(st_, g.output, C, constraints=cons)[0]
    out = vals[g.output].reshape(len(pts), -1)[inside]
    grid_min = (out @ C[0].reshape(C.shape[1], -1).T).min(0).values
    assert (bound <= grid_min).all(), (bound, grid_min)


@pytest.mark.parametrize("seed", range(4))
def test_optimised_multipliers_reach_the_leaf_minimum_of_a_linear_model(seed):
    """On a linear model CROWN is exact, so with the constraint a·x >= p (a hidden neuron
    split) the best multiplier gives the LP minimum over the leaf (strong duality): Adam on
    beta must come within 5e-3 of the grid minimum of the leaf, and never exceed it."""
    from softcert.certify import crown

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 3)).double()
    x = torch.rand(1, 2, dtype=torch.float64)
    g = graph_of(model, x)
    z = next(i for i, n in enumerate(g.nodes) if n.op == "linear")
    lo, hi = input_box(x, 0.3, None)
    s = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1))
    l, u = s.bounds[z]
    C = torch.tensor([[[1.0, -1.0, 0.5]]], dtype=torch.float64).reshape(1, 1, *g.nodes[g.output].shape)
    pts = _grid(lo[0], hi[0]).reshape(-1, 1, 2)
    vals = _node_values(g, pts, s)
    obj = vals[g.output].reshape(len(pts), -1) @ C.reshape(-1)
    z1 = vals[z].reshape(len(pts), -1)[:, 1]
    p = float((l + u).flatten()[1] / 2)  # split neuron 1 at its midpoint
    # keep the side without the box minimiser, so that the constraint is active
    keep_above = bool(z1[obj.argmin()] < p)
    lo_c, hi_c = torch.full_like(l, -torch.inf), torch.full_like(u, torch.inf)
    (lo_c if keep_above else hi_c).view(-1)[1] = p
    leaf = z1 >= p if keep_above else z1 <= p
    grid_min = float(obj[leaf].min())
    beta = torch.zeros(1, 1, *l.shape[1:], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([beta], lr=0.05)
    best = -math.inf
    for _ in range(300):
        zero = torch.zeros_like(beta)
        b = crown.backward(s, g.output, C, constraints={z: (lo_c, hi_c, beta, zero) if keep_above
                                                          else (lo_c, hi_c, zero, beta)})
        best = max(best, float(b))
        assert float(b) <= grid_min
        opt.zero_grad()
        (-b.sum()).backward()
        opt.step()
    free = float(crown.backward(s, g.output, C))
    # the constraint is active (the box minimum lies outside the leaf) and beta recovers it
    assert free < grid_min - 1e-2 and best >= grid_min - 5e-3, (best, grid_min, free)


def test_a_leaf_keeps_the_parameters_of_its_best_bound():
    """Adam at a large step oscillates, so its last iterate is not its best: the parameters a
    leaf hands to its children must reproduce the leaf's reported bound, not the last one."""
    x = X[:1]
    lo, hi = input_box(x, EPS, None)
    keep = [j for j in range(3) if j != int(Y[0])]
    C = margin_spec(Y[:1], 3).reshape(3, 1, 3)[keep]
    eng = LeafBounder(graph_of(MODEL, x), (lo.unsqueeze(1), hi.unsqueeze(1)), Rows(C, torch.zeros(2), torch.arange(2)),
                      x.unsqueeze(1), BabOptions(alpha_steps=4, lr=10.0, intermediate="full"))
    res = eng.bound([{}, {}], [0, 1], None, None)
    st, _, _ = eng._state(eng._by_node([{}, {}]), 2)
    with torch.no_grad():
        again = eng._backward(st, C.unsqueeze(1), res.params, {})
    torch.testing.assert_close(again, res.lower, rtol=0, atol=1e-12)


def test_relu_split_gain_is_the_intercept_it_removes():
    """The ReLU's split gain: with the gradients of a bound that pays lam times the upper
    line's intercept c(l, u) = -ul/(u - l), the estimate equals the exact gain of the two
    children, lam (c(l, u) - c(l, 0)) + lam (c(l, u) - c(0, u)) = 2 lam c(l, u). Any
    other nonlinearity keeps the plain first-order estimate."""
    gen = torch.Generator().manual_seed(0)
    l = -0.1 - 3 * torch.rand(50, generator=gen, dtype=torch.float64)
    u = 0.1 + 3 * torch.rand(50, generator=gen, dtype=torch.float64)
    lam = torch.rand(50, generator=gen, dtype=torch.float64)
    lt, ut = l.clone().requires_grad_(True), u.clone().requires_grad_(True)
    c = -ut * lt / (ut - lt)
    gl, gu = torch.autograd.grad((-lam * c).sum(), (lt, ut))
    p = torch.zeros_like(l)
    exact = 2 * lam * c.detach()  # each child ([l, 0] and [0, u]) has intercept 0
    assert torch.allclose(ops.get("relu").split.gain(l, u, p, gl, gu), exact, rtol=1e-12, atol=0)
    plain = (-gu).clamp(min=0) * (u - p) + gl.clamp(min=0) * (p - l)
    assert torch.equal(ops.get("sigmoid").split.gain(l, u, p, gl, gu), plain)
    assert (plain < exact).all()  # the first-order estimate alone ranks ReLU splits too low


def test_leaf_bounds_hold_the_split_point_exactly():
    """A split point that float32 cannot hold tightens the leaf to exactly that float64 value:
    rounded, a sliver of the parent between the two children's bounds would be in no leaf."""
    x = X[:1]
    lo, hi = input_box(x, EPS, None)
    keep = [j for j in range(3) if j != int(Y[0])]
    C = margin_spec(Y[:1], 3).reshape(3, 1, 3)[keep]
    eng = LeafBounder(graph_of(MODEL, x), (lo.unsqueeze(1), hi.unsqueeze(1)), Rows(C, torch.zeros(2), torch.arange(2)),
                      x.unsqueeze(1), BabOptions(intermediate="full"))
    node = next(iter(eng.feeds))
    l, u = (t.flatten() for t in eng.root.bounds[node])
    k = int(torch.nonzero(u > l)[0])
    p = float(l[k] + (u[k] - l[k]) / 3)
    assert float(torch.tensor(p, dtype=torch.float32)) != p
    st, _, _ = eng._state(eng._by_node([{(node, k): (float(l[k]), p)}, {(node, k): (p, float(u[k]))}]), 2)
    sl, su = (t.detach().reshape(2, -1) for t in st.bounds[node])
    assert float(su[0, k]) == p and float(sl[1, k]) == p


def test_a_batch_out_of_memory_is_split_in_half_and_the_search_goes_on(monkeypatch):
    """A round whose children do not fit (a fake OutOfMemoryError above 4 children) puts its
    leaves back and later rounds split fewer: the search reaches the same leaves, all of them
    covering the box, and no other error is swallowed."""
    x, y = X[5:6], Y[5:6]
    g = graph_of(MODEL, x)
    lo, hi = input_box(x, 0.2, None)
    C = margin_spec(y, 3).reshape(3, 1, 3)[[j for j in range(3) if j != int(y)]]
    rows = Rows(C, torch.zeros(2), torch.arange(2))
    opts = BabOptions(batch=8, max_leaves=40, intermediate="full")

    def run():
        return bab.branch_and_bound(g, lo.unsqueeze(1), hi.unsqueeze(1), rows, deadline=math.inf,
                                    options=opts, centre=x.unsqueeze(1))

    plain = run()
    real, sizes = LeafBounder.bound, []

    def small_memory(self, cons, *args, **kwargs):
        sizes.append(len(cons))
        if len(cons) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (a test)")
        return real(self, cons, *args, **kwargs)

    monkeypatch.setattr(LeafBounder, "bound", small_memory)
    shrunk = run()
    first = next(i for i, s in enumerate(sizes) if s > 4)
    assert all(s <= 4 for s in sizes[first + 1:]) and len(sizes) > first + 1  # halved, then on
    assert shrunk.bounded >= plain.bounded - 4 and len(shrunk.leaves) > 2
    pts = _grid(lo[0], hi[0])[::11]
    with torch.no_grad():
        vals = g.values(pts)
    for group in range(2):  # the leaves put back were split later: the box is still covered
        inside = torch.zeros(len(pts), dtype=torch.bool)
        for k, cons, _ in shrunk.leaves:
            if k == group:
                ok = torch.ones(len(pts), dtype=torch.bool)
                for node, j, a, b in cons:
                    z = vals[node].reshape(len(pts), -1)[:, j]
                    ok &= (z >= a) & (z <= b)
                inside |= ok
        assert inside.all()

    def broken(self, cons, *args, **kwargs):
        raise RuntimeError("a bug, not memory")

    monkeypatch.setattr(LeafBounder, "bound", lambda self, cons, *a, **k: real(self, cons, *a, **k)
                        if not cons[0] else broken(self, cons))
    with pytest.raises(RuntimeError, match="a bug"):
        run()
