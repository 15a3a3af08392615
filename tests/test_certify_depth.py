"""Intermediate bounds for deep models (``PropagationOptions.intermediate`` of certify.crown.propagate), the
peak-memory probe of certify.evaluation, and the ``softcert depth`` benchmark's plumbing.

Oracles: the previous dense algorithm (``intermediate="dense"``: the new bounds must be
within 1e-9 relative of it or tighter), sampling (every node's value at random points of
the box lies in its bounds) and per-element comparison of selected CROWN rows."""
import dataclasses
import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert import certify
from softcert.certify import crown, ops, zoo
from softcert.certify.evaluation import PeakMemory
from softcert.certify.models import ViT
from softcert.certify.options import AttackOptions, PropagationOptions
from softcert.certify.spec import input_box, margin_spec
from softcert.cli.commands import depth as depth_cmd

EPS = 0.005
REL = 1e-9


def _setup(model, x, y, eps=EPS):
    g = certify.graph_of(model, x[:1])
    lo, hi = input_box(x, eps)
    C = margin_spec(y, 10 if g.nodes[g.output].shape[-1] == 10 else g.nodes[g.output].shape[-1])
    C = C.reshape(x.shape[0], C.shape[1], *g.nodes[g.output].shape)
    return g, lo.unsqueeze(1), hi.unsqueeze(1), x.unsqueeze(1), C


def _run(g, xl, xu, x0, C, mode):
    state = crown.propagate(g, xl, xu, centre=x0, options=PropagationOptions(intermediate=mode))
    return state, crown.backward(state, g.output, C)


def _no_looser(new, old, where=None):
    """new (l, u) within REL relative of old (l, u) or tighter, on the elements ``where``."""
    (ln, un), (lo, uo) = new, old
    tol = REL * (1 + torch.maximum(lo.abs(), uo.abs()).nan_to_num(posinf=0.0))
    bad = (ln < lo - tol) | (un > uo + tol)
    if where is not None:
        bad &= where
    return not bool(bad.any())


@pytest.fixture(scope="module", params=[("mnist-vit1", 2), ("mnist-vit2", 2)], ids=["vit1", "vit2"])
def runs(request):
    name, n = request.param
    model, X, Y = zoo.load(name)
    x, y = X[:n].to(torch.float64), Y[:n]
    g, xl, xu, x0, C = _setup(model, x, y)
    return g, (xl, xu), {mode: _run(g, xl, xu, x0, C, mode) for mode in ("dense", "full", "sparse")}


def test_full_bounds_are_no_looser_than_dense(runs):
    g, _, res = runs
    (sd, fd), (sf, ff) = res["dense"], res["full"]
    for i in range(1, len(g.nodes)):
        assert _no_looser(sf.bounds[i], sd.bounds[i]), f"node {i} ({g.nodes[i].name}) looser than dense"
    assert (ff >= fd - REL * (1 + fd.abs())).all()


def test_sparse_keeps_every_relaxation_and_the_final_bound(runs):
    g, _, res = runs
    (sd, fd), (ss, fs) = res["dense"], res["sparse"]
    assert (fs >= fd - REL * (1 + fd.abs())).all()
    users = crown._consumers(g)
    skipped = 0
    for i in crown._needs_bounds(g):
        # elements the sparse pass skipped are those decided by their own (looser) bounds
        l, u = ss.bounds[i]
        decided = crown._decided(g, users[i], l, u)
        skipped += int(decided.sum())
        assert _no_looser(ss.bounds[i], sd.bounds[i], where=~decided), f"node {i} looser where it matters"
        for c in users[i]:
            op = g.nodes[c].operator
            if op.kind == "elementwise":
                # the planes that backward uses are the dense ones wherever the element was skipped
                dense_planes = op.planes(*sd.bounds[i], None)
                sparse_planes = op.planes(l, u, None)
                for a, b in zip(dense_planes, sparse_planes):
                    assert torch.equal(a[decided], b[decided])
    assert skipped > 0  # the test exercised the skip


def test_every_mode_encloses_sampled_values(runs):
    g, (xl, xu), res = runs
    gen = torch.Generator().manual_seed(0)
    pts = xl + (xu - xl) * torch.rand(16, *xl.shape, generator=gen, dtype=torch.float64)
    consts = res["dense"][0].consts  # the softmax shifts, chosen at the anchor: the same in every mode
    for p in pts:
        vals = [p]
        for i, node in enumerate(g.nodes[1:], 1):
            vals.append(ops.forward(node, [vals[j] for j in node.inputs], consts.get(i)))
        for mode, (state, _) in res.items():
            for i, v in enumerate(vals):
                l, u = state.bounds[i]
                assert (l <= v + 1e-9 * (1 + v.abs())).all() and (v <= u + 1e-9 * (1 + v.abs())).all(), (mode, i)


# ----------------------------------------------------------------------------- crown_node
def _tiny():
    torch.manual_seed(3)
    m = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=3, depth=2).eval()
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    g = certify.graph_of(m, x[:1])
    lo, hi = input_box(x, 0.05)
    return crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), options=PropagationOptions(intermediate="dense"))


TINY = _tiny()
TARGETS = sorted(crown._needs_bounds(TINY.g))


def _with_chunk(state, chunk):
    """``state``'s bounds and shifts under options with ``chunk_elements=chunk``."""
    out = crown.BoundState(state.g, *state.bounds[0], dataclasses.replace(state.options, chunk_elements=chunk))
    out.bounds, out.consts = dict(state.bounds), state.consts
    return out


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(TARGETS), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.sampled_from([1, 7, 2**16]))
def test_selected_rows_match_all_rows(target, seed, density, chunk):
    """Any selection (per image, padded to the longest) and any chunk size: selected elements
    get the bounds of the all-rows pass, unselected ones (-inf, inf)."""
    state = _with_chunk(TINY, chunk)
    shape = (TINY.batch, *TINY.g.nodes[target].shape)
    sel = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < density
    l, u = crown.crown_node(state, target, sel)
    la, ua = crown.crown_node(state, target)
    ld, ud = crown._crown_dense(TINY, target)
    assert torch.allclose(la, ld, rtol=REL, atol=REL) and torch.allclose(ua, ud, rtol=REL, atol=REL)
    assert torch.allclose(l[sel], la[sel], rtol=REL, atol=REL) and torch.allclose(u[sel], ua[sel], rtol=REL, atol=REL)
    assert (l[~sel] == -torch.inf).all() and (u[~sel] == torch.inf).all()


def test_decided_only_for_exact_planes():
    g = TINY.g
    users = crown._consumers(g)
    relu_in = next(i for i in TARGETS if users[i] and g.nodes[users[i][0]].op == "relu")
    l = torch.tensor([-2.0, 0.0, -1.0, 0.5, -torch.inf])
    u = torch.tensor([-1.0, 3.0, 1.0, 0.5, 1.0])
    assert crown._decided(g, users[relu_in], l, u).tolist() == [True, True, False, True, False]
    bilinear_in = next(i for i in TARGETS if any(g.nodes[c].operator.kind == "bilinear" for c in users[i]))
    assert not crown._decided(g, users[bilinear_in], l, u).any()


def test_intermediate_mode_is_checked():
    g = TINY.g
    xl, xu = TINY.bounds[0]
    with pytest.raises(ValueError, match="PropagationOptions.intermediate: expected one of"):
        crown.propagate(g, xl, xu, options=PropagationOptions(intermediate="fast"))


# ----------------------------------------------------------------------------- optimised intermediate bounds
@pytest.fixture(scope="module")
def alpha_runs():
    g = TINY.g
    xl, xu = TINY.bounds[0]
    x0 = (xl + xu) / 2
    with torch.no_grad():  # as branch and bound calls it: the optimisation turns gradients on itself
        return {mode: crown.propagate(g, xl, xu, centre=x0, options=PropagationOptions(intermediate=mode))
                for mode in ("full", "alpha")}


def test_alpha_intermediate_encloses_corners_and_samples(alpha_runs):
    g, state = TINY.g, alpha_runs["alpha"]
    xl, xu = state.bounds[0]
    gen = torch.Generator().manual_seed(5)
    corners = torch.where(torch.rand(32, *xl.shape, generator=gen) < 0.5, xl, xu)
    inside = xl + (xu - xl) * torch.rand(32, *xl.shape, generator=gen, dtype=torch.float64)
    for p in torch.cat([corners, inside]):
        vals = [p]
        for i, node in enumerate(g.nodes[1:], 1):
            vals.append(ops.forward(node, [vals[j] for j in node.inputs], state.consts.get(i)))
        for i, v in enumerate(vals):
            l, u = state.bounds[i]
            assert (l <= v + 1e-9 * (1 + v.abs())).all() and (v <= u + 1e-9 * (1 + v.abs())).all(), i


def test_alpha_intermediate_tightens_the_first_optimisable_node(alpha_runs):
    """Up to the first node whose bounds differ, both modes saw the same upstream bounds: that
    node is one CROWN bounds, no looser than "full" and strictly tighter somewhere."""
    g, full, alpha = TINY.g, alpha_runs["full"], alpha_runs["alpha"]
    for i in range(1, len(g.nodes)):
        if all(torch.equal(a, b) for a, b in zip(full.bounds[i], alpha.bounds[i])):
            continue
        assert i in crown._needs_bounds(g)
        (lf, uf), (la, ua) = full.bounds[i], alpha.bounds[i]
        assert (la >= lf).all() and (ua <= uf).all()
        assert ((la > lf + 1e-6) | (ua < uf - 1e-6)).any()
        break
    else:
        pytest.fail("intermediate='alpha' changed no bound")


def test_most_sensitive_picks_a_fraction_and_leaves_the_state_alone():
    g = TINY.g
    C = torch.randn(TINY.batch, 4, *g.nodes[g.output].shape, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64)
    nodes = [i for i in TARGETS if any(g.nodes[c].operator.kind == "elementwise" for c in crown._consumers(g)[i])]
    before = {i: tuple(t.clone() for t in TINY.bounds[i]) for i in nodes}
    planes = dict(TINY.planes)
    chosen = crown.most_sensitive(TINY, g.output, C, nodes, 0.25)
    # the cached planes are restored: the same entries (most_sensitive restores a copy of the cache)
    assert TINY.planes.keys() == planes.keys() and all(TINY.planes[k] is v for k, v in planes.items())
    for i in nodes:
        assert all(torch.equal(a, b) for a, b in zip(TINY.bounds[i], before[i])) and not TINY.bounds[i][0].requires_grad
        m = chosen[i].reshape(TINY.batch, -1)
        assert m.shape[1] == crown._numel(g.nodes[i].shape) and (m.sum(1) <= max(1, int(0.25 * m.shape[1]))).all()
    assert any(chosen[i].any() for i in nodes)


def test_optimise_mask_limits_what_alpha_changes(alpha_runs):
    """With ``optimise=``, the first node whose bounds differ from "full" differs only where
    the mask holds."""
    g, full = TINY.g, alpha_runs["full"]
    xl, xu = full.bounds[0]
    need = [i for i in TARGETS if i > 0]
    mask = {i: torch.rand(TINY.batch, *g.nodes[i].shape, generator=torch.Generator().manual_seed(i)) < 0.3
            for i in need}
    with torch.no_grad():
        part = crown.propagate(g, xl, xu, centre=(xl + xu) / 2, options=PropagationOptions(intermediate="alpha"),
                               optimise=mask)
    for i in range(1, len(g.nodes)):
        (lf, uf), (lp, up) = full.bounds[i], part.bounds[i]
        if torch.equal(lf, lp) and torch.equal(uf, up):
            continue
        assert i in mask and not ((lf != lp) | (uf != up))[~mask[i]].any()
        break
    else:
        pytest.fail("optimise= changed no bound")


def test_a_passed_deadline_keeps_the_full_bounds(alpha_runs):
    """Past the deadline nothing is optimised: crown_node skips its chunks and "alpha" leaves
    every node with its "full" bounds."""
    g, full = TINY.g, alpha_runs["full"]
    xl, xu = full.bounds[0]
    l, u = crown.crown_node(TINY, TARGETS[-1], optimise=5, deadline=0.0)
    assert (l == -torch.inf).all() and (u == torch.inf).all()
    with torch.no_grad():
        late = crown.propagate(g, xl, xu, centre=(xl + xu) / 2, options=PropagationOptions(intermediate="alpha"),
                               deadlines=crown.Deadlines(optimise=0.0))
    for i in range(len(g.nodes)):
        assert all(torch.equal(a, b) for a, b in zip(full.bounds[i], late.bounds[i])), i


def test_a_passed_hard_deadline_keeps_the_ibp_bounds(alpha_runs):
    """Past the hard deadline (a wall-clock budget's end) no CROWN chunk starts: every node
    keeps its IBP interval, which encloses the full bounds (sound, looser)."""
    g = TINY.g
    xl, xu = alpha_runs["full"].bounds[0]
    with torch.no_grad():
        ibp = crown.propagate(g, xl, xu, algorithm="ibp", centre=(xl + xu) / 2)
        late = crown.propagate(g, xl, xu, centre=(xl + xu) / 2, deadlines=crown.Deadlines(hard=0.0))
    for i in range(len(g.nodes)):
        (li, ui), (ll, ul), (lf, uf) = ibp.bounds[i], late.bounds[i], alpha_runs["full"].bounds[i]
        assert torch.equal(li, ll) and torch.equal(ui, ul), i
        assert (ll <= lf).all() and (ul >= uf).all(), i


def test_optimised_lower_without_steps_is_crown():
    target = TARGETS[-1]
    shape = TINY.g.nodes[target].shape
    m = crown._numel(shape)
    A = torch.eye(m, dtype=torch.float64).reshape(1, m, *shape).expand(TINY.batch, -1, *shape)
    assert torch.equal(crown.optimised_lower(TINY, target, A, 0), crown.backward(TINY, target, A))
    better = crown.optimised_lower(TINY, target, A, 5)
    assert (better >= crown.backward(TINY, target, A)).all()


# ----------------------------------------------------------------------------- peak memory
def test_peak_memory_sees_an_allocation():
    psutil = pytest.importorskip("psutil")
    # freed memory the allocator kept is reused without growing RSS: allocate more than all of
    # RSS so that at least 128 MB must be new pages
    n = (psutil.Process().memory_info().rss + 2**27) // 8
    with PeakMemory() as mem:
        t = torch.ones(n, dtype=torch.float64)
    assert t[-1] == 1 and mem.mb is not None and mem.mb >= 100


def test_peak_memory_without_psutil_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    with PeakMemory() as mem:
        pass
    assert mem.mb is None


def test_records_and_certify_rows_carry_peak_memory():
    from softcert.cli.commands import certify as certify_cmd

    model, X, Y = zoo.load("digits-vit1")
    ev = certify.evaluate(model, X[:2], Y[:2], [0.01], ["ibp"], attack=AttackOptions(steps=1, restarts=1))
    assert all(r.peak_mb is None or r.peak_mb >= 0 for r in ev.records)
    row = certify_cmd._row("digits-vit1", ev, 0.01, "ibp", 0.9)
    assert "peak_mb" in row


# ----------------------------------------------------------------------------- softcert depth
def test_depth_subprocess_reports_results_and_timeouts(tmp_path):
    job = dict(model="mnist-vit1", method="crown", n=1, eps=EPS, batch=0, memory_gb=12.0)
    ok = depth_cmd._spawn(job, 300)
    assert ok["status"] == "ok" and len(ok["seconds"]) == 1 and ok["peak_mb"] >= ok["baseline_mb"] > 0
    assert ok["min_margin"][0] > -torch.inf
    late = depth_cmd._spawn(job, 0.01)
    assert late["status"] == "timeout"
    oom = dict(job, **depth_cmd.failure(1, "Traceback ...\nRuntimeError: DefaultCPUAllocator: can't allocate memory"))
    assert oom["status"] == "out of memory"
    assert depth_cmd.failure(-9, "")["status"] == "out of memory"  # SIGKILL: the OOM killer
    assert depth_cmd.failure(1, "ValueError: model: x")["status"] == "error"
    rows = [dict(ok, blocks=1), dict(late, blocks=1, method="lirpa-crown"), dict(oom, blocks=1, method="crown-dense")]
    depth_cmd._write(tmp_path, rows, "softcert depth --test")
    md = (tmp_path / "depth.md").read_text()
    assert "timeout" in md and "out of memory" in md and "softcert depth --test" in md
    assert (tmp_path / "depth.png").exists()
    json.dumps(rows)


def test_certifiably_trained_zoo_models_have_their_recipes_blocks():
    from softcert.cli.commands import depth

    assert depth.blocks_of("mnist-vit2-ct") == depth.blocks_of("mnist-vit2") == 2
    assert depth.blocks_of("mnist-vit1-ct") == 1
    with pytest.raises(ValueError, match="unknown zoo model 'mnist-vit3-ct'.*mnist-vit1-ct"):
        depth.blocks_of("mnist-vit3-ct")
