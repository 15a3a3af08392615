"""Branch-and-bound on nonlinear neurons (GenBaB-style), with falsification alongside.

Domain: one input box. Intermediate bounds are computed once (``crown.propagate``; with
``intermediate="auto"``, the default of ``verify``, a root left open after the first attacks
gets the most sensitive of them optimised by alpha-CROWN, ``_Engine._sensitive``). A leaf
is a set of split constraints z_k in [lo, hi] on neurons k that feed an elementwise
nonlinearity (ReLU, GELU, exp, -log, sigmoid, tanh, ..., and the shifted attention scores,
which feed exp). In a leaf the constrained node's bounds are tightened to the constraint,
the nodes downstream of it re-bounded by IBP intersected with the root bounds, and the
specification is bounded by ``crown.backward`` with alpha-CROWN slopes warm-started from the
parent (``_bound``: the one place the bound is computed). A split of [lo, hi] at p gives the
children [lo, p] and [p, hi], whose union is the parent (``split_interval`` asserts it), so
the leaves always cover the box. A group of rows (a target class, or a VNN-LIB disjunct) is
proved on a leaf when some row's lower bound exceeds its threshold; the property is proved
only when every leaf of every group is proved. What to split: the candidate with the largest
first-order estimate of the bound gain (a BBPS-like shortcut, Shi et al. TACAS 2025): the
gradient of the leaf's bound with respect to the neuron's interval end points times the
amount the split moves them, plus, for neurons with an optimised slope, |d bound / d alpha|.
With ``vertex=True`` (off by default), Vertex-Softmax intervals enter the root bounds and
(``vertex_pv``) bound P·V in a leaf whenever they beat McCormick (the max of both is kept);
on mnist-vit1 no leaf had Vertex win and its root took 17 s per sample against 2 s
(docs/certify/bab.notes.md). Falsification: PGD with restarts, and PGD started at each
leaf's worst point (the minimiser over the box of the leaf's linear lower bound), both
projected onto the ball's points of the model's dtype (``spec.inner_box``; the bounds use the
outward ``input_box``); a counterexample counts only once ``attack.confirm`` holds: in the
ball as written (exact rationals) and z_j > z_y from the model itself in its own dtype.
"""
from __future__ import annotations

import copy
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import torch

from softcert.certify import crown
from softcert.certify.attack import confirm, margins, model_dtype, pgd
from softcert.certify.graph_cache import classes_of, graph_of
from softcert.certify.spec import (
    DOMAIN,
    check_domain,
    check_eps,
    check_images,
    check_labels,
    check_progress,
    inner_box,
    input_box,
    margin_spec,
)

#: the root's intermediate bounds: those of ``crown.propagate``, or "auto" ("full", then
#: "alpha" once the root is left open and the first attacks fail)
ROOT_INTERMEDIATE = (*crown.INTERMEDIATE, "auto")
#: the fraction of each splittable node's elements whose intermediate bounds the "auto" root
#: optimises (``_Engine._sensitive``): on mnist-vit1 image 4 at eps 0.02 optimising 25 %
#: certified at the root in 30 s, all of them in 70 s, 10 % left -0.12
#: (docs/certify/bab.notes.md)
ROOT_OPTIMISED = 0.25
#: the share of a sample's remaining budget the "auto" root may spend optimising intermediate
#: bounds; the rest is left to branching. Without a cap, on mnist-vit2 (two blocks) the
#: optimisation took the whole 60 s and ran over it by up to 15 s, so no leaf was split
#: (docs/certify/bab.notes.md)
ROOT_SHARE = 0.5
STATUSES = ("certified", "falsified", "unknown")
ASSUMPTIONS = ("certified: every BaB leaf proved by certify.crown bounds (the arithmetic of "
               "certify.crown.ARITHMETIC) on the float64 real-arithmetic traced graph; leaves cover the input "
               "box by construction (split [lo, hi] at p into [lo, p] and [p, hi]). falsified: a point of the "
               "model's dtype in the ball as written (exact rationals; x and eps the given floats) where the "
               "model itself, in its own dtype, gives some z_j > z_y. unknown: neither within the time budget.")


@dataclass(frozen=True)
class BabVerdict:
    """One sample's verdict. ``status`` in STATUSES; ``counterexample``: the input (model
    input shape) where the model, in its own dtype, has a margin < 0 (falsified only); ``lower_margin``
    (K,): certified lower bounds of z_y - z_j over the whole box (min over the final leaves;
    0 at j = y); ``leaves``: leaves bounded; ``vertex_leaves``: of those, leaves where the
    Vertex-Softmax P·V bound beat McCormick."""

    status: str
    counterexample: torch.Tensor | None
    lower_margin: torch.Tensor
    seconds: float
    leaves: int
    method: str = "bab"
    assumptions: str = field(default=ASSUMPTIONS, repr=False)
    vertex_leaves: int = 0


@dataclass(frozen=True)
class BabResult:
    """``certify.verify(..., method="bab")``: one ``BabVerdict`` per sample."""

    verdicts: tuple
    eps: float
    method: str = "bab"
    domain: tuple | None = DOMAIN
    assumptions: str = field(default=ASSUMPTIONS, repr=False)

    @property
    def status(self):
        return tuple(v.status for v in self.verdicts)

    @property
    def certified(self):
        return torch.tensor([v.status == "certified" for v in self.verdicts])

    @property
    def falsified(self):
        return torch.tensor([v.status == "falsified" for v in self.verdicts])

    def counts(self) -> dict:
        """{status: number of samples} for every status."""
        return {s: sum(v.status == s for v in self.verdicts) for s in STATUSES}


@dataclass(frozen=True)
class Outcome:
    """What ``branch_and_bound`` found on one box. ``proved[g]``: group g proved on every
    leaf; ``lower[g]``: min over the final leaves of max_row (lower bound - rhs) (a lower bound
    over the whole box, > 0 when proved); ``counterexample``: what ``falsify`` returned, or None;
    ``timed_out``; ``bounded``: leaves bounded; ``leaves``: the final leaves as (group,
    constraints, proved) with constraints a tuple of (node, flat index, lo, hi): z_node[index]
    in [lo, hi] (index into the node's value without the batch axis)."""

    proved: tuple
    lower: tuple
    counterexample: object
    timed_out: bool
    bounded: int
    vertex_leaves: int
    leaves: tuple


def split_interval(lo, hi, p):
    """The two children [lo, p] and [p, hi] of a split of [lo, hi] at p; asserts that p lies
    strictly inside, so that both children are proper and their union is [lo, hi]."""
    lo, hi, p = float(lo), float(hi), float(p)
    if not lo < p < hi:
        raise AssertionError(f"split point {p!r} outside ({lo!r}, {hi!r}): the children would not cover")
    left, right = (lo, p), (p, hi)
    assert left[0] == lo and right[1] == hi and left[1] == right[0]  # [lo, p] ∪ [p, hi] = [lo, hi]
    return left, right


class _Leaf:
    __slots__ = ("group", "cons", "value", "lb", "alpha", "split")

    def __init__(self, group, cons, value, lb, alpha, split):
        self.group, self.cons, self.value, self.lb, self.alpha, self.split = group, cons, value, lb, alpha, split


def _splittable(graph):
    """Input node id -> name of the elementwise operator it feeds (the neurons we split),
    and consumer id -> input id for operators with optimisable slopes."""
    feeds, slopes = {}, {}
    for i, n in enumerate(graph.nodes):
        if n.operator.kind == "elementwise":
            feeds.setdefault(n.inputs[0], n.op)
            if getattr(n.operator, "slope_init", None) is not None:
                slopes[i] = n.inputs[0]
    return feeds, slopes


def _split_points(op, l, u):
    """Split point per neuron (NaN where no split helps): ReLU at 0 on crossing intervals
    (the relaxation becomes exact), every other nonlinearity at the midpoint."""
    finite = torch.isfinite(l) & torch.isfinite(u)
    if op == "relu":
        return torch.where((l < 0) & (u > 0), torch.zeros_like(l), torch.nan)
    mid = l + (u - l) / 2
    ok = finite & (u - l > 1e-9 * (1 + l.abs() + u.abs())) & (mid > l) & (mid < u)
    return torch.where(ok, mid, torch.nan)


def split_gain(op, l, u, p, gl, gu):
    """Estimated gain of the bound from splitting [l, u] at p, summed over the two children,
    given gl, gu = d bound / d l, d bound / d u: the first-order change from moving u to p in
    [l, p] and l to p in [p, u], (-gu)⁺ (u - p) + gl⁺ (p - l). For a ReLU split at 0 each term
    is scaled to the exact change of the upper line's intercept c = -ul / (u - l), which the
    split removes outright: c(l, u) - c(l, 0) = (-dc/du) u (u - l) / |l| and
    c(l, u) - c(0, u) = (dc/dl) |l| (u - l) / u. The unscaled estimate ranks ReLU splits
    too low: on mnist-vit1 image 18 at eps 0.01, 60 s, -0.124 against -0.072 with it
    (docs/certify/bab.notes.md)."""
    left, right = (-gu).clamp(min=0) * (u - p), gl.clamp(min=0) * (p - l)
    if op == "relu":
        left, right = left * ((u - l) / (p - l)), right * ((u - l) / (u - p))
    return left + right


class _Engine:
    def __init__(self, graph, xl, xu, C, rhs, groups, anchor, vertex, alpha_steps, lr, refine, beta=True,
                 intermediate="full"):
        self.g = graph
        self.beta = beta
        # inputs of nonlinear nodes small enough to re-bound by CROWN in every leaf
        self.refine = {j for n in graph.nodes if n.operator.kind in ("elementwise", "bilinear") for j in n.inputs
                       if not graph.nodes[j].operator.monotone and math.prod(graph.nodes[j].shape) <= refine}
        self.C, self.rhs, self.groups = C, rhs, groups
        self.feeds, self.slopes = _splittable(graph)
        # products with an optimisable McCormick interpolation (certify/ops/bilinear.py)
        self.products = [i for i, n in enumerate(graph.nodes)
                         if n.operator.kind == "bilinear" and callable(getattr(n.operator, "alpha_init", None))]
        self.vertex = vertex
        self.pvs = {a["pv"] for a in graph.attention if a["pv"] is not None} if vertex else set()
        self.alpha_steps, self.lr = alpha_steps, lr
        # "auto": the root starts from "full" bounds and is optimised only if left open (run)
        self.intermediate = intermediate
        self.box = (xl, xu, anchor)
        with torch.no_grad():
            self.root = crown.propagate(graph, xl, xu, vertex=vertex, anchor=anchor,
                                        intermediate="full" if intermediate == "auto" else intermediate)
        ng = int(groups.max()) + 1
        self.rows = [torch.nonzero(groups == k).flatten() for k in range(ng)]
        self.width = max(len(r) for r in self.rows)
        self.bounded = 0
        self.vertex_wins = 0
        self.done = []  # proved leaves: (group, constraints)

    # ------------------------------------------------------------ one batch of leaves
    def _state(self, cons):
        """The leaf states stacked on the batch axis: root bounds, the constrained neurons
        tightened, nodes downstream of them re-bounded by IBP (and, for inputs of nonlinear
        nodes of at most ``refine`` neurons, by CROWN) intersected with the parent bounds.
        Bounds of splittable nodes and of the input are then fresh tensors requiring grad (for
        the split scores and the worst points). Returns (state, grad leaves, infeasible (B,))."""
        root, B = self.root, len(cons)
        st = crown.BoundState(self.g, *(t.expand(B, *t.shape[1:]) for t in root.bounds[0]))
        st.consts = {i: c.expand(B, *c.shape[1:]) if c.dim() and c.shape[0] == 1 else c
                     for i, c in root.consts.items()}
        bounds = {i: (l.expand(B, *l.shape[1:]), u.expand(B, *u.shape[1:])) for i, (l, u) in root.bounds.items()}
        st.bounds = bounds
        tight = {}
        for b, cs in enumerate(cons):
            for (node, idx), (lo, hi) in cs.items():
                tight.setdefault(node, []).append((b, idx, lo, hi))
        infeasible = torch.zeros(B, dtype=torch.bool)
        with torch.no_grad():
            for i, items in tight.items():
                l, u = (t.clone() for t in bounds[i])
                bs, ix, los, his = (torch.tensor(v) for v in zip(*items))
                lf, uf = l.view(B, -1), u.view(B, -1)
                lf[bs, ix] = torch.maximum(lf[bs, ix], los.to(l.dtype))
                uf[bs, ix] = torch.minimum(uf[bs, ix], his.to(u.dtype))
                bounds[i] = (l, u)
            changed = set(tight)
            for i in range(1, len(self.g.nodes)):
                node = self.g.nodes[i]
                if not any(j in changed for j in node.inputs):
                    continue
                st.planes = {}
                l, u = bounds[i]
                il, iu = crown.ibp_node(st, i)
                l = torch.maximum(l, torch.nan_to_num(il, nan=-torch.inf))
                u = torch.minimum(u, torch.nan_to_num(iu, nan=torch.inf))
                if i in self.refine:
                    st.bounds[i] = (l, torch.maximum(l, u))
                    cl, cu = crown.crown_node(st, i)
                    l, u = torch.maximum(l, cl), torch.minimum(u, cu)
                # each encloses z_i on the leaf: disjoint means the leaf holds no input at all
                infeasible |= (l > u).flatten(1).any(1)
                bounds[i] = (l, torch.maximum(l, u))
                changed.add(i)
        leaves = {}
        for i in [0, *self.feeds]:
            leaves[i] = tuple(t.detach().clone().requires_grad_(True) for t in bounds[i])
            bounds[i] = leaves[i]
        st.planes = {}
        return st, leaves, infeasible

    def _backward(self, st, C, params, cbounds):
        """crown.backward with the slopes/interpolations (int keys of ``params``) and the split
        constraints' multipliers ((node, "lo"|"hi") keys) of the leaves."""
        alphas = {k: a for k, a in params.items() if isinstance(k, int)}
        return crown.backward(st, self.g.output, C, alphas=alphas or None,
                              constraints=self._constraints(params, cbounds))

    @staticmethod
    def _constraints(params, cbounds):
        """crown.backward's ``constraints``: each constrained node's (lo, hi, beta_lo, beta_hi)."""
        return {i: (lo, hi, params[(i, "lo")], params[(i, "hi")]) for i, (lo, hi) in cbounds.items()}

    def _constraint_bounds(self, cons, B):
        """node -> (lo, hi) (B, *shape), ±inf where a leaf has no constraint on the neuron."""
        out = {}
        for b, cs in enumerate(cons):
            for (node, idx), (lo, hi) in cs.items():
                if node not in out:
                    shape = self.g.nodes[node].shape
                    out[node] = (torch.full((B, *shape), -torch.inf, dtype=torch.float64),
                                 torch.full((B, *shape), torch.inf, dtype=torch.float64))
                out[node][0].view(B, -1)[b, idx] = lo
                out[node][1].view(B, -1)[b, idx] = hi
        return out

    def _spec(self, groups):
        """C (B, W, *output shape) and rhs (B, W) of the groups' rows, padded (rhs inf)."""
        B, W = len(groups), self.width
        C = self.C.new_zeros(B, W, *self.C.shape[1:])
        rhs = torch.full((B, W), torch.inf, dtype=torch.float64)
        for b, k in enumerate(groups):
            r = self.rows[k]
            C[b, : len(r)] = self.C[r]
            rhs[b, : len(r)] = self.rhs[r]
        return C, rhs

    def _sensitive(self, groups, alpha):
        """node -> bool (1, *shape): per splittable node, the ROOT_OPTIMISED fraction of its
        elements whose bounds the root bounds of ``groups`` (with their alphas ``alpha``) are
        most sensitive to (``crown.most_sensitive``; the groups' rows share the one box)."""
        C, _ = self._spec(groups)
        flat = lambda t: t.reshape(1, -1, *t.shape[2:])  # noqa: E731
        alphas = {k: flat(a) for k, a in (alpha or {}).items() if isinstance(k, int)}  # None: no slopes
        return crown.most_sensitive(self.root, self.g.output, flat(C), list(self.feeds), ROOT_OPTIMISED,
                                    alphas or None)

    def _bound(self, cons, groups, alpha0, parent_lb):
        """Bounds (B, W) of the leaves' rows (padded rows: -inf), their alphas, the chosen
        split per leaf and the worst input point per leaf."""
        B, W = len(cons), self.width
        C, rhs = self._spec(groups)
        st, leaves, infeasible = self._state(cons)
        # alpha-CROWN on the leaves, warm-started from the parents (a few Adam steps)
        alphas, ranges = {}, {}
        for k in [*self.slopes, *self.products]:
            # each family's declared range, where every value gives a sound relaxation
            ranges[k] = crown.ALPHA_RANGE if k in self.slopes else self.g.nodes[k].operator.alpha_range
            a = alpha0[k] if alpha0 is not None and k in alpha0 else None
            if a is None:
                # the CROWN choice on the root's bounds (batch 1), shared by the leaves
                start, _ = crown.alpha_start(self.root, k, W)
                a = start.expand(B, *start.shape[1:])
            alphas[k] = a.detach().clone().requires_grad_(True)
        cbounds = self._constraint_bounds(cons, B) if self.beta else {}
        for i in cbounds:
            for side in ("lo", "hi"):
                k = (i, side)
                a = alpha0.get(k) if alpha0 is not None else None
                if a is None:
                    a = torch.zeros(B, W, *self.g.nodes[i].shape, dtype=torch.float64)
                alphas[k] = a.detach().clone().requires_grad_(True)
                ranges[k] = (0.0, math.inf)  # any multiplier >= 0 is sound
        best = torch.full((B, W), -torch.inf, dtype=torch.float64)
        if alphas and self.alpha_steps:
            detached = crown.BoundState(self.g, *(t.detach() for t in st.bounds[0]))
            detached.bounds = {i: (l.detach(), u.detach()) for i, (l, u) in st.bounds.items()}
            detached.consts = st.consts
            opt = torch.optim.Adam(list(alphas.values()), lr=self.lr)
            # Adam's last iterate can sit below its best one: each row keeps the parameters of
            # its best bound, so the children start from the relaxation that gave the parent's
            kept = {k: a.detach().clone() for k, a in alphas.items()}
            # the root gets alpha-CROWN's full 20 steps; children are warm-started
            for _ in range(self.alpha_steps if alpha0 is not None else max(self.alpha_steps, 20)):
                lo = self._backward(detached, C, {k: a.clamp(*ranges[k]) for k, a in alphas.items()}, cbounds)
                with torch.no_grad():
                    better = lo > best
                    best = torch.maximum(best, lo)
                    for k, a in alphas.items():
                        w = better.view(B, W, *([1] * (a.dim() - 2)))
                        kept[k] = torch.where(w, a.clamp(*ranges[k]), kept[k])
                opt.zero_grad()
                (-lo[torch.isfinite(lo)].sum()).backward()
                opt.step()
                with torch.no_grad():
                    for k, a in alphas.items():
                        a.clamp_(*ranges[k])
            alphas = {k: a.requires_grad_(True) for k, a in kept.items()}
        lo = self._backward(st, C, alphas, cbounds)
        wrt = [t for lu in leaves.values() for t in lu] + list(alphas.values())
        fin = torch.isfinite(lo)
        grads = torch.autograd.grad(lo[fin].sum(), wrt, allow_unused=True) if fin.any() else [None] * len(wrt)
        with torch.no_grad():
            best = torch.maximum(best, lo.detach())
            if self.pvs:
                lv = crown.backward(st, self.g.output, C, vertex_pv=self.pvs,
                                    constraints=self._constraints(alphas, cbounds))
                self.vertex_wins += int((lv > best).any(1).sum())
                best = torch.maximum(best, lv)
            if parent_lb is not None:
                best = torch.maximum(best, parent_lb)  # a child's domain lies inside its parent's
            best = torch.where(rhs.isinf(), -torch.inf, best)
            best = torch.where(infeasible[:, None] & ~rhs.isinf(), torch.inf, best)
        self.bounded += B
        g = dict(zip(wrt, grads))
        # worst point of the summed linear lower bound: xl where its coefficient is > 0
        xl, xu = leaves[0]
        gxl, gxu = g.get(xl), g.get(xu)
        gxl = torch.zeros_like(xl) if gxl is None else gxl
        gxu = torch.zeros_like(xu) if gxu is None else gxu
        worst = torch.where(gxl > 0, xl, torch.where(gxu < 0, xu, (xl + xu) / 2)).detach()
        splits = self._choose(leaves, g, alphas, cons, B)
        return best, rhs, {k: a.detach() for k, a in alphas.items()}, splits, worst

    def _choose(self, leaves, g, alphas, cons, B):
        """Per leaf: (node, flat index, lo, hi, p) with the largest estimated gain, or None."""
        best_score = torch.full((B,), -torch.inf, dtype=torch.float64)
        best = [None] * B
        by_input = {}
        for k, i in self.slopes.items():
            ga = g.get(alphas.get(k))
            if ga is not None:
                by_input[i] = by_input.get(i, 0) + ga.abs().sum(1)
        with torch.no_grad():
            for i, op in self.feeds.items():
                l, u = leaves[i]
                l, u = l.detach(), u.detach()
                p = _split_points(op, l, u)
                gl = g.get(leaves[i][0])
                gu = g.get(leaves[i][1])
                gl = torch.zeros_like(l) if gl is None else gl
                gu = torch.zeros_like(u) if gu is None else gu
                score = split_gain(op, l, u, p, gl, gu)
                if i in by_input:
                    score = score + by_input[i]
                # a tie-break that prefers wide intervals when no gradient reaches a neuron
                score = score + 1e-12 * (u - l)
                score = torch.where(torch.isnan(p) | torch.isnan(score), -torch.inf, score).view(B, -1)
                s, ix = score.max(1)
                for b in torch.nonzero(s > best_score).flatten().tolist():
                    j = int(ix[b])
                    best_score[b] = s[b]
                    best[b] = (i, j, float(l.view(B, -1)[b, j]), float(u.view(B, -1)[b, j]),
                               float(p.view(B, -1)[b, j]))
        return best

    def _warm_start(self, params):
        """The children's starting parameters, stacked: the parents' (leaves without a
        multiplier for some constrained node, e.g. a sibling's new split, start it at 0)."""
        keys = list(dict.fromkeys(k for p in params for k in p))
        if not keys:
            return None
        out = {}
        for k in keys:
            like = next(p[k] for p in params if k in p)
            out[k] = torch.cat([p[k] if k in p else torch.zeros_like(like) for p in params])
        return out

    # ------------------------------------------------------------ the search
    def run(self, deadline, falsify, batch, max_leaves):
        ng = len(self.rows)
        proved = [False] * ng
        lower = [-math.inf] * ng
        final = {k: [] for k in range(ng)}  # proved leaves' values per group
        cex = None
        timed_out = time.monotonic() > deadline
        heap, tick = [], itertools.count()
        if timed_out:
            return self._outcome(proved, lower, None, True, heap, final)
        groups = list(range(ng))
        lb, rhs, alpha, splits, worst = self._bound([{}] * ng, groups, None, None)
        self._roots(groups, lb, rhs, alpha, splits, heap, tick, final)
        if heap and falsify is not None:
            cex = falsify(None)
            if cex is None:
                cex = falsify(worst[[lf.group for _, _, lf in heap]])
            if cex is not None:
                return self._outcome(proved, lower, cex, False, heap, final)
        if heap and self.intermediate == "auto" and self.feeds and time.monotonic() < deadline:
            # the root is open and no attack broke it (and some neuron can be split, so there are
            # intermediate bounds to optimise): optimise its intermediate bounds (each
            # within the "full" ones), then bound the open groups' roots again on them
            groups = [lf.group for _, _, lf in heap]
            chosen = self._sensitive(groups, self._warm_start([lf.alpha for _, _, lf in heap]))
            now = time.monotonic()
            with torch.no_grad():
                self.root = crown.propagate(self.g, *self.box[:2], vertex=self.vertex, anchor=self.box[2],
                                            intermediate="alpha", deadline=now + ROOT_SHARE * (deadline - now),
                                            optimise=chosen)
            parents = torch.cat([lf.lb for _, _, lf in heap])
            heap.clear()
            lb, rhs, alpha, splits, worst = self._bound([{}] * len(groups), groups, None, parents)
            self._roots(groups, lb, rhs, alpha, splits, heap, tick, final)
        rounds = 0
        while heap:
            if time.monotonic() > deadline:
                timed_out = True
                break
            if self.bounded >= max_leaves:
                break
            take = []
            while heap and len(take) < batch:
                item = heapq.heappop(heap)
                if item[2].split is None:
                    # nothing left to split in this leaf: it stays open
                    take.append(None)
                    heapq.heappush(heap, item)
                    break
                take.append(item[2])
            take = [t for t in take if t is not None]
            if not take:
                break
            cons, groups, alphas, parents = [], [], [], []
            for leaf in take:
                node, j, lo, hi, p = leaf.split
                for child in split_interval(lo, hi, p):
                    c = dict(leaf.cons)
                    c[(node, j)] = child
                    cons.append(c)
                    groups.append(leaf.group)
                    alphas.append(leaf.alpha)
                    parents.append(leaf.lb)
            alpha0 = self._warm_start(alphas)
            lb, rhs, alpha, splits, worst = self._bound(cons, groups, alpha0, torch.cat(parents))
            open_ = []
            for b in range(len(cons)):
                v = float((lb[b] - rhs[b]).max())
                if v > 0:
                    final[groups[b]].append(v)
                    self.done.append((groups[b], cons[b]))
                    continue
                leaf = _Leaf(groups[b], cons[b], v, lb[b:b + 1], {a: t[b:b + 1] for a, t in alpha.items()}, splits[b])
                heapq.heappush(heap, (v, next(tick), leaf))
                open_.append(b)
            rounds += 1
            if falsify is not None and open_ and rounds % 2 == 1:
                order = sorted(open_, key=lambda b: float((lb[b] - rhs[b]).max()))[:8]
                cex = falsify(worst[order])
                if cex is not None:
                    return self._outcome(proved, lower, cex, False, heap, final)
        return self._outcome(proved, lower, cex, timed_out, heap, final)

    def _roots(self, groups, lb, rhs, alpha, splits, heap, tick, final):
        """The root leaf of each group: proved, or pushed onto the heap."""
        for b, k in enumerate(groups):
            v = float((lb[b] - rhs[b]).max())
            leaf = _Leaf(k, {}, v, lb[b:b + 1], {a: t[b:b + 1] for a, t in alpha.items()}, splits[b])
            if v > 0:
                final[k].append(v)
                self.done.append((k, {}))
            else:
                heapq.heappush(heap, (v, next(tick), leaf))

    def _outcome(self, proved, lower, cex, timed_out, heap, final):
        ng = len(self.rows)
        open_by = {k: [v for v, _, lf in heap if lf.group == k] for k in range(ng)}
        proved = tuple(not open_by[k] and bool(final[k]) and cex is None for k in range(ng))
        lower = tuple(min(open_by[k] + final[k]) if (open_by[k] or final[k]) else -math.inf for k in range(ng))
        flat = lambda cs: tuple((n, j, lo, hi) for (n, j), (lo, hi) in cs.items())  # noqa: E731
        leaves = tuple((k, flat(cs), True) for k, cs in self.done) + \
            tuple((lf.group, flat(lf.cons), False) for _, _, lf in heap)
        return Outcome(proved, lower, cex, timed_out, self.bounded, self.vertex_wins, leaves)


def branch_and_bound(graph, xl, xu, C, rhs, groups, *, deadline, anchor=None, vertex=False, falsify=None,
                     batch=16, alpha_steps=4, lr=0.1, max_leaves=1_000_000, refine=0, beta=True,
                     intermediate="full") -> Outcome:
    """Prove, for every group g, that on every input of the box [xl, xu] (1, *graph input
    shape) some row r of g has C_r·output > rhs_r. ``C`` (S, *output shape), ``rhs`` (S,),
    ``groups`` (S,) ints 0..G-1. ``deadline``: time.monotonic() value; ``falsify(points)``:
    called with None (a plain attack) or start points (P, *graph input shape); returns a
    confirmed counterexample or None. ``vertex``: Vertex-Softmax intervals and P·V bounds.
    ``refine``: in a leaf, inputs of nonlinear nodes downstream of a split with at most this
    many neurons are re-bounded by CROWN (larger ones by IBP only). Default 0 (IBP only):
    cheaper leaves outweigh the tighter ones (mnist-vit1, 60 s: image 11 at eps 0.005 is
    certified with 1429 leaves, against lower margin -0.0045 after 999 leaves at refine=128;
    docs/certify/bab.notes.md); ``batch``: leaves split
    per round (twice as many children bounded at once); ``alpha_steps``: Adam steps per leaf;
    ``beta``: the split constraints enter the bound with optimised multipliers (beta-CROWN);
    ``intermediate``: how the root's intermediate bounds are computed (``crown.propagate``;
    "alpha" optimises them, at about 30x the root's time on mnist-vit1; "auto": "full", then
    "alpha" within ``ROOT_SHARE`` of the remaining budget once the root is left open and the first
    attacks fail)."""
    groups = torch.as_tensor(groups, dtype=torch.int64)
    eng = _Engine(graph, xl, xu, C, torch.as_tensor(rhs, dtype=torch.float64), groups, anchor, vertex,
                  alpha_steps, lr, refine, beta, intermediate)
    return eng.run(deadline, falsify, batch, max_leaves)


# ---------------------------------------------------------------- classification margins
def _attack_from(model64, starts, label, lo, hi, eps, steps=20):
    """PGD on the worst margin from the given start points, projected onto [lo, hi]."""
    x = torch.minimum(torch.maximum(starts, lo), hi)
    lab = label.expand(len(x))
    step = eps / 4
    other = torch.ones(1, margins(model64, lo, label).shape[1], dtype=torch.bool)
    other[0, label] = False
    for _ in range(steps):
        x = x.detach().requires_grad_(True)
        m = margins(model64, x, lab)
        w = torch.where(other, m, torch.inf).min(1).values
        if (w < 0).any():
            return x[int(w.argmin())].detach()
        (grad,) = torch.autograd.grad(-w.sum(), x)
        x = torch.minimum(torch.maximum(x + step * grad.sign(), lo), hi)
    with torch.no_grad():
        m = margins(model64, x, lab)
    w = torch.where(other, m, torch.inf).min(1).values
    return x[int(w.argmin())].detach() if (w < 0).any() else None


def verify(model, x, label, eps, *, timeout, domain=DOMAIN, vertex=False, attack=True, batch=16, alpha_steps=4,
           restarts=2, steps=40, seed=0, max_leaves=1_000_000, refine=0, beta=True,
           intermediate="auto", progress=None) -> BabResult:
    """Three-valued verdicts for ``model`` at inputs ``x`` (B, ...) with labels ``label`` over
    the L∞ ball of radius ``eps`` clipped to ``domain``, each sample within ``timeout``
    seconds: certified (every margin z_y - z_j proved positive on every leaf), falsified
    (a counterexample in the ball confirmed on the model in its own dtype) or unknown; a model
    with one logit is certified (no other class). ``vertex``: Vertex-Softmax intervals
    at the root and P·V bounds in the leaves (method name "bab-vertex"; default off, "bab");
    ``attack``: falsification alongside (PGD with ``restarts`` x ``steps``, then
    from leaves' worst points); ``beta``: split constraints enter the leaves' bounds with
    optimised multipliers (beta-CROWN; False: only through the tightened neuron bounds);
    ``intermediate``: the root's intermediate bounds (``ROOT_INTERMEDIATE``; default "auto":
    "full", then, for samples whose root is left open and survives the first attacks, the
    ``ROOT_OPTIMISED`` most sensitive elements of each split node optimised by alpha-CROWN).
    ``progress``: called with 1 after each sample (e.g. a tqdm bar's ``update``)."""
    progress = check_progress(progress)

    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) \
            or timeout <= 0:
        raise ValueError(f"timeout: expected a positive finite number of seconds, got {timeout!r}")
    if intermediate not in ROOT_INTERMEDIATE:
        raise ValueError(f"intermediate: expected one of {', '.join(ROOT_INTERMEDIATE)}, got {intermediate!r}")
    domain = None if domain is None else check_domain(domain)
    eps = check_eps(eps)
    x = check_images(model, x, domain)
    graph = graph_of(model, x)
    model64 = copy.deepcopy(model).double().eval()
    own = copy.deepcopy(model).eval()  # the model in its own dtype: counterexamples are confirmed on it
    out = graph.nodes[graph.output].shape
    classes = classes_of(graph)  # logits with a batch axis first, as every other method needs
    label = check_labels(label, x.shape[0], classes)
    lo, hi = input_box(x, eps, domain)  # outward: for the bounds
    plo, phi = inner_box(x, eps, domain, model_dtype(own))  # the ball's points of the model's dtype: for attacks
    name = "bab-vertex" if vertex else "bab"
    verdicts = []
    for b in range(x.shape[0]):
        t0 = time.monotonic()
        deadline = t0 + float(timeout)
        lab = label[b:b + 1]
        if classes == 1:
            # no other class: the margin specification is empty, so it holds (as crown answers)
            verdicts.append(BabVerdict("certified", None, torch.zeros(1, dtype=torch.float64), 0.0, 0, name))
            if progress is not None:
                progress(1)
            continue
        C = margin_spec(lab, classes).reshape(classes, *out)
        keep = [j for j in range(classes) if j != int(lab)]
        gen_seed = seed + b

        def falsify(starts, b=b, lab=lab, deadline=deadline, gen_seed=gen_seed):
            if not attack or time.monotonic() > deadline:
                return None
            box = (plo[b:b + 1], phi[b:b + 1])
            if starts is None:
                xa, m = pgd(model64, x[b:b + 1], lab, eps, steps, restarts, seed=gen_seed, domain=domain, box=box)
                m[0, lab] = torch.inf
                found = xa if bool((m < 0).any()) else None
            else:
                found = _attack_from(model64, starts.squeeze(1), lab, *box, eps)
                found = None if found is None else found.unsqueeze(0)
            return None if found is None else confirm(own, found, x[b:b + 1], lab, eps, domain, box)

        res = branch_and_bound(graph, lo[b:b + 1].unsqueeze(1), hi[b:b + 1].unsqueeze(1), C[keep],
                               torch.zeros(len(keep)), torch.arange(len(keep)), deadline=deadline,
                               anchor=x[b:b + 1].unsqueeze(1), vertex=vertex, falsify=falsify, batch=batch,
                               alpha_steps=alpha_steps, max_leaves=max_leaves, refine=refine, beta=beta,
                               intermediate=intermediate)
        lm = torch.zeros(classes, dtype=torch.float64)
        lm[keep] = torch.tensor(res.lower, dtype=torch.float64)
        if res.counterexample is not None:
            status, cex = "falsified", res.counterexample.reshape(x.shape[1:])
        else:
            status, cex = ("certified" if all(res.proved) else "unknown"), None
        verdicts.append(BabVerdict(status, cex, lm, time.monotonic() - t0, res.bounded, name, ASSUMPTIONS,
                                   res.vertex_leaves))
        if progress is not None:
            progress(1)
    return BabResult(tuple(verdicts), eps, name, domain)
