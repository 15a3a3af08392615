"""Bounding a batch of leaves of one input box: the part of branch and bound that runs CROWN.

The root is bounded once (``certify.crown.propagate``). In a leaf the constrained neurons'
bounds are tightened to the constraints, the nodes downstream of them re-bounded by IBP (and,
for inputs of nonlinear nodes of at most ``BabOptions.refine`` neurons, by CROWN) intersected
with the root bounds, and the specification is bounded by ``crown.backward`` with alpha-CROWN
parameters and beta-CROWN multipliers warm-started from the parent (``LeafBounder.bound``:
the one place a leaf's bound is computed). A leaf whose tightened bounds are disjoint holds
no input at all and is proved (infeasible).

Host synchronisations: a batch of leaves is copied to the device once (``upload``: the groups
and the split constraints in one float64 tensor) and read back once (the leaves' values and
split decisions in one ``tolist``); everything between stays on the device, so the engine
makes one read and one copy per batch whatever its size. The relaxations it calls
(``certify.crown``, ``certify.ops``) make theirs per bounding pass, not per leaf
(tests/test_certify_bab_synchronisations.py; docs/certify/bab.notes.md).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from softcert.certify import crown
from softcert.certify.bab.branching import RULES, Candidate
from softcert.certify.bab.leaves import RelaxationParams
from softcert.certify.ops import Params, tensor_of


@dataclass(frozen=True)
class Rows:
    """The property on one box: for every group g, some row r of g has C_r·output > rhs_r.
    ``C`` (S, *output shape), ``rhs`` (S,), ``groups`` (S,) ints 0..G-1."""

    C: torch.Tensor
    rhs: torch.Tensor
    groups: torch.Tensor


def upload(values, dtype, device):
    """The host numbers ``values`` as one tensor on ``device``: a single copy, from pinned
    memory and without waiting for the device on CUDA (a pageable copy synchronises)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class Bounded:
    """A batch of B bounded leaves: ``lower`` (B, W) the rows' bounds (padding rows -inf,
    infeasible leaves +inf), ``rhs`` (B, W), ``params`` their ``RelaxationParams``,
    ``decisions`` the split each takes next, ``worst`` (B, *input) the minimiser of each
    leaf's summed linear lower bound over its box, ``host_values`` the leaves' values
    (``value``) read from the device with the decisions."""

    lower: torch.Tensor
    rhs: torch.Tensor
    params: RelaxationParams
    decisions: list
    worst: torch.Tensor
    host_values: tuple

    def value(self, b):
        """max over leaf b's rows of lower bound - rhs (> 0: proved)."""
        return self.host_values[b]

    def values(self):
        """``value(b)`` of every leaf (read from the device once, with the decisions)."""
        return list(self.host_values)


def splittable(graph):
    """Input node id -> the operator it feeds that has a split rule (the neurons we split;
    the first consumer's rule when several)."""
    feeds = {}
    for n in graph.nodes:
        if n.operator.split is not None:
            feeds.setdefault(n.inputs[0], n.operator)
    return feeds


class LeafBounder:
    """Bounds batches of leaves of the box [xl, xu] (1, *graph input shape) for ``rows``.
    ``centre``: the point anchoring the softmax shifts; ``options``: ``BabOptions``;
    ``deadline`` (a ``time.monotonic()`` value): the root's CROWN bounds stop there (IBP after)."""

    def __init__(self, graph, box, rows, centre, options, deadline=None):
        self.g, self.options, self.box, self.centre = graph, options, box, centre
        # inputs of nonlinear nodes small enough to re-bound by CROWN in every leaf
        self.rebound = {j for n in graph.nodes if n.operator.kind in crown.NONLINEAR for j in n.inputs
                        if not graph.nodes[j].operator.monotone and math.prod(graph.nodes[j].shape) <= options.refine}
        self.feeds = splittable(graph)
        self.optimised = [i for i, n in enumerate(graph.nodes) if n.operator.optimisable]
        # optimisable elementwise maps: their |d bound / d alpha| scores the neurons they take
        self.slopes = {i: graph.nodes[i].inputs[0] for i in self.optimised if graph.nodes[i].operator.arity == 1}
        self.pvs = {a.pv for a in graph.attention if a.pv is not None} if options.vertex else set()
        self.rule = RULES[options.branching]()
        self.device = box[0].device
        self.C = rows.C.to(self.device)
        self.rhs = tensor_of(rows.rhs, torch.float64, self.device).to(self.device)
        groups = tensor_of(rows.groups, torch.int64, self.device).to(self.device)
        self.rows = [torch.nonzero(groups == k).flatten() for k in range(int(groups.max()) + 1)]
        self.width = max(len(r) for r in self.rows)
        # each group's rows padded to the width (C 0, rhs inf): a batch's spec is one gather
        self.padded_C = self.C.new_zeros(len(self.rows), self.width, *self.C.shape[1:])
        self.padded_rhs = torch.full((len(self.rows), self.width), torch.inf, dtype=torch.float64, device=self.device)
        for k, r in enumerate(self.rows):
            self.padded_C[k, : len(r)] = self.C[r]
            self.padded_rhs[k, : len(r)] = self.rhs[r]
        self.bounded = 0
        self._vertex_wins = torch.zeros((), dtype=torch.int64, device=self.device)  # read once, at the end
        self._initial = (None, {})  # (root state, node -> its crown.initial_params): see _initial_params
        first = "full" if options.intermediate == "auto" else options.intermediate
        self.root = self.propagate(first, crown.Deadlines(hard=deadline))

    @property
    def vertex_wins(self):
        """Leaves (rows' bounds) where the Vertex-Softmax P·V bound beat McCormick so far."""
        return int(self._vertex_wins)

    def propagate(self, intermediate, deadlines=crown.Deadlines(), optimise=None):
        """The root's bounds with the given intermediate-bound algorithm (``crown.propagate``'s
        ``deadlines`` and ``optimise``)."""
        opts = dataclasses.replace(self.options.propagation, intermediate=intermediate)
        with torch.no_grad():
            return crown.propagate(self.g, *self.box, algorithm="vertex" if self.options.vertex else "crown",
                                   centre=self.centre, options=opts, deadlines=deadlines, optimise=optimise)

    def sensitive(self, groups, params):
        """node -> bool (1, *shape): per splittable node, the ``root_optimised`` fraction of its
        elements whose bounds the root bounds of ``groups`` (with ``params``) are most
        sensitive to (``crown.most_sensitive``; the groups' rows share the one box)."""
        C, _ = self._spec(groups)
        flat = lambda t: t.reshape(1, -1, *t.shape[2:])  # noqa: E731
        alphas = {k: flat(a) for k, a in params.alphas.items()} if params is not None else {}
        return crown.most_sensitive(self.root, self.g.output, flat(C), list(self.feeds),
                                    self.options.root_optimised, alphas or None)

    # ------------------------------------------------------------ one batch of leaves
    def _upload(self, cons, groups):
        """The batch on the device in one copy (``upload``): the ``groups`` (B,) int64 (None
        when ``groups`` is None) and the split constraints grouped by node, node -> (leaf,
        neuron index, lo, hi) (each (N,); (leaf, neuron) pairs are distinct). One float64
        tensor carries them all: the split points exactly as the children's constraints hold
        them (float32 would round them, and a sliver of the parent would lie in no child), the
        leaf, neuron and group numbers exactly below 2^53."""
        items = {}
        for b, cs in enumerate(cons):
            for (node, idx), (lo, hi) in cs.items():
                items.setdefault(node, []).append((b, idx, lo, hi))
        head = list(groups) if groups is not None else []
        if not head and not items:
            return None, {}
        flat = upload(head + [v for its in items.values() for it in its for v in it], torch.float64, self.device)
        out, at = {}, len(head)
        for node, its in items.items():
            t = flat[at: at + 4 * len(its)].view(-1, 4)
            at += 4 * len(its)
            out[node] = (t[:, 0].long(), t[:, 1].long(), t[:, 2], t[:, 3])
        return (flat[: len(head)].long() if groups is not None else None), out

    def _by_node(self, cons):
        """The leaves' split constraints grouped by node: node -> (leaf, neuron index, lo, hi)
        tensors on the device (``_upload``)."""
        return self._upload(cons, None)[1]

    def _state(self, grouped, B):
        """The states of B leaves with the constraints ``grouped`` (``_by_node``) stacked on the
        batch axis: root bounds, the constrained neurons tightened, nodes downstream of them
        re-bounded by IBP (and CROWN for ``rebound``) intersected with the parent bounds.
        Returns (state, tracked bounds of the input and the splittable nodes, infeasible (B,))."""
        st = self.root.expand(B)
        infeasible = torch.zeros(B, dtype=torch.bool, device=self.device)
        with torch.no_grad():
            for i, (bs, ix, los, his) in grouped.items():
                l, u = (t.clone() for t in st.bounds[i])
                lf, uf = l.view(B, -1), u.view(B, -1)
                lf[bs, ix] = torch.maximum(lf[bs, ix], los.to(l.dtype))
                uf[bs, ix] = torch.minimum(uf[bs, ix], his.to(u.dtype))
                st.tighten(i, l, u)
            changed = set(grouped)
            for i in range(1, len(self.g.nodes)):
                if any(j in changed for j in self.g.nodes[i].inputs):
                    infeasible |= self._rebound(st, i)
                    changed.add(i)
        return st, st.track([0, *self.feeds]), infeasible

    def _rebound(self, st, i):
        """Node i re-bounded in every leaf (IBP, and CROWN for ``rebound``) within its bounds;
        returns the leaves where they became disjoint (no input reaches them)."""
        l, u = st.bounds[i]
        il, iu = crown.ibp_node(st, i)
        l = torch.maximum(l, torch.nan_to_num(il, nan=-torch.inf))
        u = torch.minimum(u, torch.nan_to_num(iu, nan=torch.inf))
        if i in self.rebound:
            st.tighten(i, l, torch.maximum(l, u))
            cl, cu = crown.crown_node(st, i)
            l, u = torch.maximum(l, cl), torch.minimum(u, cu)
        # each encloses z_i on the leaf: disjoint means the leaf holds no input at all
        infeasible = (l > u).flatten(1).any(1)
        st.tighten(i, l, torch.maximum(l, u))
        return infeasible

    def _constraint_bounds(self, grouped, B):
        """node -> (lo, hi) (B, *shape) of the constraints ``grouped`` (``_by_node``), ±inf where
        a leaf has no constraint on the neuron."""
        out = {}
        for node, (bs, ix, los, his) in grouped.items():
            shape = self.g.nodes[node].shape
            lo = torch.full((B, *shape), -torch.inf, dtype=torch.float64, device=self.device)
            hi = torch.full((B, *shape), torch.inf, dtype=torch.float64, device=self.device)
            lo.view(B, -1)[bs, ix] = los
            hi.view(B, -1)[bs, ix] = his
            out[node] = (lo, hi)
        return out

    def _spec(self, groups):
        """C (B, W, *output shape) and rhs (B, W) of the groups' rows (a list, or (B,) int64 on
        the device), padded (C 0, rhs inf)."""
        if not isinstance(groups, torch.Tensor):
            groups = upload(list(groups), torch.int64, self.device)
        return self.padded_C[groups], self.padded_rhs[groups]

    def _backward(self, st, C, params, cbounds, vertex=False):
        """crown.backward with the leaves' alphas and the split constraints' multipliers; with
        ``vertex``, the P·V terms by Vertex-Softmax instead of the alphas."""
        constraints = {i: (lo, hi, *params.betas[i]) for i, (lo, hi) in cbounds.items()}
        if vertex:
            return crown.backward(st, self.g.output, C, vertex_pv=self.pvs, constraints=constraints)
        return crown.backward(st, self.g.output, C, alphas=params.alphas or None, constraints=constraints)

    def _start(self, start, cbounds, B):
        """The parameters to optimise, keyed ("alpha", node) and ("beta_lo"/"beta_hi", node):
        the parents' where given, else CROWN's choice (alphas) and 0 (multipliers)."""
        W, out = self.width, {}
        for k in self.optimised:
            a = start.alphas.get(k) if start is not None else None
            p = self._initial_params(k)
            out[("alpha", k)] = Params(p.start.expand(B, *p.start.shape[1:]) if a is None else a, p.low, p.high)
        for i in cbounds:
            pair = start.betas.get(i) if start is not None else None
            for side, a in zip(("beta_lo", "beta_hi"), pair or (None, None)):
                if a is None:
                    a = torch.zeros(B, W, *self.g.nodes[i].shape, dtype=torch.float64, device=self.device)
                out[(side, i)] = Params(a, 0.0, math.inf)  # any multiplier >= 0 is sound
        return out

    def _initial_params(self, k):
        """``crown.initial_params`` of node k on the root state for the rows' width, computed
        once per root state: every round takes its range, the root round its start (a GELU or
        sigmoid's default planes, with their Newton searches, were computed again each round)."""
        root, params = self._initial
        if root is not self.root:
            root, params = self.root, {}
            self._initial = (root, params)
        if k not in params:
            params[k] = crown.initial_params(root, k, self.width)
        return params[k]

    @staticmethod
    def _split(values):
        """{("alpha", k): a, ("beta_lo", i): b, ...} -> RelaxationParams."""
        alphas = {k: a for (tag, k), a in values.items() if tag == "alpha"}
        betas = {k: (a, values[("beta_hi", k)]) for (tag, k), a in values.items() if tag == "beta_lo"}
        return RelaxationParams(alphas, betas)

    def bound(self, cons, groups, start, parent_lower, deadline=None):
        """``Bounded`` for the leaves with constraints ``cons`` of ``groups``, parameters
        warm-started from ``start`` (None at the root) and bounds at least ``parent_lower``;
        the Adam steps stop at ``deadline`` (a ``time.monotonic()`` value)."""
        B, W = len(cons), self.width
        on_device, grouped = self._upload(cons, groups)
        C, rhs = self._spec(on_device)
        st, tracked, infeasible = self._state(grouped, B)
        cbounds = self._constraint_bounds(grouped, B) if self.options.beta else {}
        params = self._start(start, cbounds, B)
        best = torch.full((B, W), -torch.inf, dtype=torch.float64, device=self.device)
        values = {k: p.start.detach().clone() for k, p in params.items()}
        if params and self.options.alpha_steps:
            detached = st.detached()
            steps = self.options.alpha_steps if start is not None else \
                max(self.options.alpha_steps, self.options.root_alpha_steps)
            # Adam's last iterate can sit below its best one: each row keeps the parameters of
            # its best bound, so the children start from the relaxation that gave the parent's
            best, values, _ = crown.adam_ascent(lambda v: self._backward(detached, C, self._split(v), cbounds),
                                                params, steps, self.options.lr, best, deadline)
        values = {k: a.detach().requires_grad_(True) for k, a in values.items()}
        final = self._split(values)
        lo = self._backward(st, C, final, cbounds)
        wrt = [t for lu in tracked.values() for t in lu] + list(values.values())
        # the finite entries' sum, masked without reading the mask (lo[fin] would size it on the
        # host); its gradient is lo[fin].sum()'s: 1 on the finite entries, exactly 0 elsewhere.
        # Where no entry is finite no gradient reaches anything (zeros, as if none did; not the
        # NaN that 0·inf makes upstream), decided on the device
        fin = torch.isfinite(lo)
        grads = torch.autograd.grad(torch.where(fin, lo, 0.0).sum(), wrt, allow_unused=True) \
            if lo.requires_grad else [None] * len(wrt)
        some = fin.any()
        grads = [None if g is None else torch.where(some, g, 0.0) for g in grads]
        grad = dict(zip(map(id, wrt), grads))
        with torch.no_grad():
            best = torch.maximum(best, lo.detach())
            if self.pvs:
                lv = self._backward(st, C, final, cbounds, vertex=True)
                self._vertex_wins += (lv > best).any(1).sum()
                best = torch.maximum(best, lv)
            if parent_lower is not None:
                best = torch.maximum(best, parent_lower)  # a child's domain lies inside its parent's
            best = torch.where(rhs.isinf(), -torch.inf, best)
            best = torch.where(infeasible[:, None] & ~rhs.isinf(), torch.inf, best)
        self.bounded += B
        chosen = self.rule.choose(self._candidates(tracked, grad, final), B)
        with torch.no_grad():
            value = (best - rhs).max(1).values[:, None]
            # the one read from the device per batch: each leaf's value and split decision
            host = (value if chosen is None else torch.cat([value, chosen[1]], 1)).tolist()
        decisions = [None] * B if chosen is None else self.rule.decisions(chosen[0], [r[1:] for r in host])
        detached = RelaxationParams({k: a.detach() for k, a in final.alphas.items()},
                                    {k: (a.detach(), b.detach()) for k, (a, b) in final.betas.items()})
        return Bounded(best, rhs, detached, decisions, self._worst(tracked[0], grad), tuple(r[0] for r in host))

    @staticmethod
    def _worst(box, grad):
        """The minimiser over the box of the summed linear lower bound: xl where its
        coefficient (the gradient with respect to xl) is > 0, xu where it is < 0."""
        xl, xu = box
        gxl, gxu = grad.get(id(xl)), grad.get(id(xu))
        gxl = torch.zeros_like(xl) if gxl is None else gxl
        gxu = torch.zeros_like(xu) if gxu is None else gxu
        return torch.where(gxl > 0, xl, torch.where(gxu < 0, xu, (xl + xu) / 2)).detach()

    def _candidates(self, tracked, grad, params):
        """node -> ``Candidate`` for the branching rule."""
        by_input = {}
        for k, i in self.slopes.items():
            ga = grad.get(id(params.alphas.get(k)))
            if ga is not None:
                by_input[i] = by_input.get(i, 0) + ga.abs().sum(1)
        out = {}
        for i, op in self.feeds.items():
            l, u = (t.detach() for t in tracked[i])
            gl, gu = grad.get(id(tracked[i][0])), grad.get(id(tracked[i][1]))
            out[i] = Candidate(l, u, torch.zeros_like(l) if gl is None else gl, torch.zeros_like(u) if gu is None else gu,
                               op.split, by_input.get(i))
        return out
