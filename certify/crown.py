"""Linear bound propagation over a ``Graph``: IBP, CROWN and alpha-CROWN.

The algorithm is generic; what each node contributes (its interval, its backward step, its
traits) comes from its registered operator (``certify.ops``).
CROWN (Zhang et al. 2018, Shi et al. 2020 for attention): for a target node t and
coefficients A, A·x_t >= bias + A_in·x_in is built backward through the nodes, each
nonlinear node replaced by the plane on the safe side of the sign of its coefficient, then
concretised over the input box. Intermediate bounds are computed node by node in
topological order (CROWN for every input of a nonlinear node, intersected with IBP), then
the final specification. Upper bounds are lower bounds of -A (specs are batched [I; -I]).

Arithmetic: see ``ARITHMETIC`` (carried as data by the method registry, ``certify.methods``).
"""
from __future__ import annotations

import torch

from bounds import vertex_softmax
from certify import ops

ARITHMETIC = ("float64 without directed rounding; every concretised bound is widened by a "
              "relative 1e-9 (SLACK), far above the accumulated float64 error of these small sums "
              "but not a proof of it. Vertex-Softmax terms (bounds.vertex_softmax) are rounded outward.")
SLACK = 1e-9
ELEMENT_BUDGET = 2**23  # elements of one coefficient tensor: bounds the spec chunk size


def _widen_lower(v):
    v = torch.nan_to_num(v, nan=-torch.inf)  # NaN from overflowed bounds: no information
    return v - SLACK * (1 + v.abs())


class BoundState:
    """Bounds (l, u) of every node for one batch of input boxes, plus softmax shifts."""

    def __init__(self, graph, xl, xu):
        self.g = graph
        self.bounds = {0: (xl, xu)}
        self.consts = {}
        self.planes = {}  # elementwise node id -> default planes (see _planes)
        self.batch = xl.shape[0]


# ---------------------------------------------------------------- interval propagation
def ibp_node(state, i):
    node = state.g.nodes[i]
    return node.operator.interval(node, [state.bounds[j] for j in node.inputs], state.consts.get(i))


# ---------------------------------------------------------------- backward propagation
def backward(state, target, A, *, alphas=None, vertex_pv=()):
    """Lower bound (B, S) of A·x_target over the input box. ``A``: (B, S, *shape).

    ``alphas``: node id -> ReLU lower slopes (B, S, *shape). ``vertex_pv``: ids of P·V
    nodes whose term is bounded by Vertex-Softmax instead of McCormick planes."""
    g = state.g
    coef = {target: A}
    bias = A.new_zeros(A.shape[:2])
    for i in range(target, -1, -1):
        if i not in coef:
            continue
        Ai, node = coef.pop(i), g.nodes[i]
        op = node.operator
        if op.kind == "input":
            xl, xu = state.bounds[i]
            lo = bias + ops.sum_rest(Ai.clamp(min=0) * xl.unsqueeze(1) + Ai.clamp(max=0) * xu.unsqueeze(1))
            return _widen_lower(lo)
        if i in vertex_pv:
            bias = bias + vertex_pv_term(state, i, Ai)
            continue
        alpha = None if alphas is None else alphas.get(i)
        if op.kind == "elementwise" and alpha is None:
            new, b = op.step(Ai, _planes(state, i))
        else:
            new, b = op.backward(node, Ai, [state.bounds[j] for j in node.inputs],
                                 [g.nodes[j].shape for j in node.inputs], state.consts.get(i), alpha)
        bias = bias + b
        for j, a in zip(node.inputs, new):
            coef[j] = coef[j] + a if j in coef else a
    # no coefficient reached the input (e.g. Vertex-Softmax bounded every path through P·V):
    # the bound is the constant collected so far
    return _widen_lower(bias)


def _planes(state, i):
    """The default planes of elementwise node i, computed once per input box: they depend
    only on the bounds of the node's input, fixed once that node is bounded."""
    if i not in state.planes:
        l, u = state.bounds[state.g.nodes[i].inputs[0]]
        state.planes[i] = state.g.nodes[i].operator.planes(l.unsqueeze(1), u.unsqueeze(1), None)
    return state.planes[i]


def vertex_pv_term(state, pv, A):
    """min over the score and value boxes of A·(P V), decoupled through the simplex:
    Σ_i Σ_k p_ik (Σ_d A_id v_kd) >= Σ_i min_{s_i in box} Σ_k softmax(s_i)_k c_ik with
    c_ik = min_{v in box} Σ_d A_id v_kd (p >= 0), each row solved exactly (Vertex-Softmax)."""
    att = next(a for a in state.g.attention if a["pv"] == pv)
    vl, vu = (t.unsqueeze(1) for t in state.bounds[att["values"]])
    yl, yu = (t.unsqueeze(1) for t in state.bounds[att["shifted"]])
    ap, an = A.clamp(min=0), A.clamp(max=0)
    c = ap @ vl.transpose(-1, -2) + an @ vu.transpose(-1, -2)
    c = _widen_lower(c)
    low = vertex_softmax(c, yl.expand_as(c), yu.expand_as(c)).lower
    return ops.sum_rest(low)


def crown_node(state, i, select=None):
    """CROWN bounds (l, u) of node i, each (B, *shape): one lower row e_k and one upper row
    -e_k per element k where ``select`` (bool (B, *shape); default all) holds, in chunks of
    about CHUNK_ELEMENTS coefficients (cache-sized: the backward pass is memory bound; see
    CHUNK_ELEMENTS). Unselected elements get (-inf, inf). Images of a batch with fewer selected elements are
    padded with rows whose result is discarded."""
    shape = state.g.nodes[i].shape
    m, b = _numel(shape), state.batch
    widest = max(_numel(n.shape) for n in state.g.nodes[: i + 1])
    half = max(1, CHUNK_ELEMENTS // (2 * b * widest))
    lo = torch.full((b, m), -torch.inf, dtype=torch.float64)
    hi = torch.full((b, m), torch.inf, dtype=torch.float64)
    if select is None:
        idx, valid = torch.arange(m).expand(b, m), torch.ones(b, m, dtype=torch.bool)
    else:
        sel = select.reshape(b, m)
        k = int(sel.sum(1).max())
        # selected indices first, in order; the tail of shorter rows is padding
        idx = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)[:, :k]
        valid = torch.gather(sel, 1, idx)
    for s in range(0, idx.shape[1], half):
        cidx, cval = idx[:, s: s + half], valid[:, s: s + half]
        c = cidx.shape[1]
        A = torch.zeros(b, 2 * c, m, dtype=torch.float64)
        A[:, :c].scatter_(2, cidx.unsqueeze(-1), 1.0)
        A[:, c:].scatter_(2, cidx.unsqueeze(-1), -1.0)
        out = backward(state, i, A.reshape(b, 2 * c, *shape))
        del A
        lo.scatter_reduce_(1, cidx, torch.where(cval, out[:, :c], -torch.inf), "amax")
        hi.scatter_reduce_(1, cidx, torch.where(cval, -out[:, c:], torch.inf), "amin")
    return lo.reshape(b, *shape), hi.reshape(b, *shape)


NONLINEAR = ("elementwise", "bilinear")


def _needs_bounds(graph):
    """Inputs of nonlinear nodes get CROWN bounds, except outputs of monotone elementwise
    maps: there the image of the input's bounds (IBP) is exact and CROWN cannot beat it."""
    need = set()
    for n in graph.nodes:
        if n.operator.kind in NONLINEAR:
            need.update(j for j in n.inputs if not graph.nodes[j].operator.monotone)
    return need


def _clip(l, u, value_range):
    lo, hi = value_range
    if lo is None and hi is None:
        return l, u
    return l.clamp(min=lo, max=hi), u.clamp(min=lo, max=hi)


def _domain(node, l, u):
    # NaN only arises from overflowed interval arithmetic (inf - inf, 0·inf): no information
    l, u = torch.nan_to_num(l, nan=-torch.inf), torch.nan_to_num(u, nan=torch.inf)
    l, u = _clip(l, u, node.operator.value_range)
    l, u = _clip(l, u, node.value_range)
    return l, torch.maximum(l, u)


def propagate(graph, xl, xu, *, crown=True, vertex=False, anchor=None, intermediate="full"):
    """Bounds of every node. crown=False: IBP only. vertex=True: softmax probabilities and
    attention outputs are also intersected with their exact Vertex-Softmax intervals.
    ``anchor``: the input point (default: the box centre) whose winning key j* per attention
    row is subtracted from the scores (any choice is exact; it only changes tightness).
    ``intermediate`` (how the nodes of ``_needs_bounds`` get CROWN bounds):
    - "full" (default): every element except those whose IBP interval has zero width (CROWN
      cannot tighten them), in cache-sized chunks: the same bounds as "dense";
    - "sparse": also skips elements on which IBP already decides every consumer's relaxation
      (``_decided``: e.g. a ReLU input with l >= 0 or u <= 0). The relaxations are then the
      same, but the skipped elements keep their IBP bounds, and later IBP intervals that
      start from them can be looser, so a later node where IBP beat CROWN can end looser;
    - "dense": the algorithm before, [I; -I] over every element in ELEMENT_BUDGET chunks
      (kept for the depth benchmark and the test that "full" is no looser)."""
    if intermediate not in INTERMEDIATE:
        raise ValueError(f"intermediate: expected one of {', '.join(INTERMEDIATE)}, got {intermediate!r}")
    state = BoundState(graph, xl, xu)
    need = _needs_bounds(graph) if crown else set()
    users = _consumers(graph)
    att_of = {a["probs"]: a for a in graph.attention} | {a["pv"]: a for a in graph.attention}
    centre = [(xl + xu) / 2 if anchor is None else anchor]
    for node in graph.nodes[1:]:
        centre.append(ops.forward(node, [centre[j] for j in node.inputs]))
    for i in range(1, len(graph.nodes)):
        node = graph.nodes[i]
        if node.operator.anchor is not None:
            # e.g. the softmax shift subtracts the score of the key that wins at the box
            # centre: differences of scores get tight CROWN bounds, and y_j* = 0 keeps the
            # exp-sum >= 1
            state.consts[i] = node.operator.anchor(*[centre[j] for j in node.inputs])
        l, u = ibp_node(state, i)
        if i in need:
            if intermediate == "dense":
                cl, cu = _crown_dense(state, i)
            else:
                select = ~(l == u)  # NaN (no information) stays selected
                if intermediate == "sparse":
                    select &= ~_decided(graph, users[i], l, u)
                cl, cu = crown_node(state, i, select)
            l, u = torch.maximum(l, cl), torch.minimum(u, cu)
            del cl, cu
        if vertex and i in att_of:
            vl, vu = _vertex_interval(state, att_of[i], i)
            l, u = torch.maximum(l, vl), torch.minimum(u, vu)
        state.bounds[i] = _domain(node, l, u)
    return state


INTERMEDIATE = ("full", "sparse", "dense")
#: coefficients per chunk of intermediate-bound rows (crown_node): 128 KB of float64, so that
#: a backward step's operands stay in a core's L2 cache. Measured on mnist-vit2 (CPU time of
#: propagate, one thread, on a machine loaded by other jobs): 2**14 took 2.6-3.4 s, 2**15
#: 21-22 s, 2**16 19-66 s, the dense ELEMENT_BUDGET chunks 6-8 s; on a lighter load 2**16
#: was about 1.3x faster than 2**14. Cache contention decides, so the small size is the default.
CHUNK_ELEMENTS = 2**14


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _consumers(graph):
    """node id -> ids of the nodes that take it as an input."""
    users = {i: [] for i in range(len(graph.nodes))}
    for i, n in enumerate(graph.nodes):
        for j in n.inputs:
            users[j].append(i)
    return users


def _decided(graph, users, l, u):
    """(B, *shape) bool: every consumer is elementwise and its default planes on [l, u]
    coincide (lower = upper plane, so f is affine on [l, u], e.g. a stable ReLU). The planes
    on any tighter interval are then that same affine function: CROWN bounds of these
    elements cannot change any backward step."""
    exact = torch.isfinite(l) & torch.isfinite(u)
    if not users or any(graph.nodes[c].operator.kind != "elementwise" for c in users):
        return torch.zeros_like(exact)
    for c in users:
        try:
            lw, lb, uw, ub = graph.nodes[c].operator.planes(l, u, None)
        except ValueError:  # an interval outside the operator's domain: decide nothing
            return torch.zeros_like(exact)
        exact = exact & (lw == uw) & (lb == ub)
    return exact


def _crown_dense(state, i):
    """CROWN bounds of node i with specs [I; -I] over every element, chunked to stay within
    ELEMENT_BUDGET (the intermediate-bound algorithm before "full")."""
    shape = state.g.nodes[i].shape
    m = _numel(shape)
    widest = max(_numel(n.shape) for n in state.g.nodes[: i + 1])
    chunk = max(1, ELEMENT_BUDGET // (state.batch * widest))
    eye = torch.eye(m, dtype=torch.float64)
    spec = torch.cat([eye, -eye])
    out = []
    for s in range(0, 2 * m, chunk):
        A = spec[s: s + chunk].reshape(-1, *shape).unsqueeze(0).expand(state.batch, -1, *shape)
        out.append(backward(state, i, A))
    lo = torch.cat(out, 1)
    return lo[:, :m].reshape(-1, *shape), -lo[:, m:].reshape(-1, *shape)


def _vertex_interval(state, att, i):
    yl, yu = state.bounds[att["shifted"]]
    if i == att["probs"]:
        n = yl.shape[-1]
        c = torch.eye(n, dtype=yl.dtype)  # row i picks p_i: exact elementwise interval
        r = vertex_softmax(c, yl.unsqueeze(-2), yu.unsqueeze(-2))
        return r.lower, r.upper
    vl, vu = state.bounds[att["values"]]
    # o_id in [min_s Σ_k p_k vl_kd, max_s Σ_k p_k vu_kd], rows (i, d) over keys k
    lo = vertex_softmax(vl.transpose(-1, -2).unsqueeze(-3), yl.unsqueeze(-2), yu.unsqueeze(-2)).lower
    hi = vertex_softmax(vu.transpose(-1, -2).unsqueeze(-3), yl.unsqueeze(-2), yu.unsqueeze(-2)).upper
    return lo, hi


def ibp_lower(state, C):
    """IBP lower bound of C·z from the logit interval."""
    l, u = state.bounds[state.g.output]
    return _widen_lower(ops.sum_rest(C.clamp(min=0) * l.unsqueeze(1) + C.clamp(max=0) * u.unsqueeze(1)))


def alpha_crown(state, C, iterations=20, lr=0.1):
    """CROWN with the ReLU lower slopes of the final specification optimised by Adam
    (Xu et al. 2021); every slope in [0, 1] gives a sound bound, the best per row is kept."""
    nodes = state.g.nodes
    free = [i for i, n in enumerate(nodes) if getattr(n.operator, "slope_init", None) is not None]
    best = backward(state, state.g.output, C)
    if not free:
        return best
    alphas = {}
    for i in free:
        l, u = state.bounds[nodes[i].inputs[0]]
        init = nodes[i].operator.slope_init(l, u).unsqueeze(1).expand(-1, C.shape[1], *l.shape[1:])
        alphas[i] = init.clone().requires_grad_(True)
    opt = torch.optim.Adam(list(alphas.values()), lr=lr)
    for _ in range(iterations):
        lo = backward(state, state.g.output, C, alphas={k: a.clamp(0, 1) for k, a in alphas.items()})
        best = torch.maximum(best, lo.detach())
        opt.zero_grad()
        (-lo.sum()).backward()
        opt.step()
        with torch.no_grad():
            for a in alphas.values():
                a.clamp_(0, 1)
    with torch.no_grad():
        lo = backward(state, state.g.output, C, alphas=alphas)
    return torch.maximum(best, lo)
