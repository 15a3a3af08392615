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
Every bound encloses the real-arithmetic value: each step charges its float64 rounding
error into the bias by the soundness contract of ``certify.ops.core`` (the operators charge
their own steps; here: coefficient and bias accumulation, the concretisation over the input
box and the Vertex-Softmax P·V term). ``arithmetic="plain"`` (``propagate``, ``backward``)
is the old unsound float64, kept to measure the cost (docs/certify/sound-fp.md).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from softcert.bounds import vertex_softmax
from softcert.certify import ops
from softcert.certify.ops import (
    add_down,
    charge,
    floor_charge,
    gamma_charge,
    host,
    magnitude,
    scale_charge,
    sub_down,
    weighted_sum,
)
from softcert.certify.ops import arithmetic as rounding
from softcert.certify.options import PropagationOptions

ARITHMETIC = ("Sound float64: bounds enclose the real-arithmetic function of the float64 graph (float32 "
              "weights lift exactly). Standard model fl(x op y) = (x op y)(1 + d), |d| <= u = 2^-53, "
              "plus 2^-1074 per product in the subnormal range; round to nearest. Each matrix product "
              "and sum (adjoints, intervals, plane steps, coefficient and bias accumulation, "
              "concretisation, Vertex-Softmax c) is charged gamma_n |A||B| (Higham, Thm 3.5; n its "
              "length, gamma from kernels.floating) against max|x| of the node's bounds, bias and "
              "interval ends moved one ulp outward (nextafter). Relaxation planes and exp/log-type "
              "intervals are the operators' own (certify.ops: certified intercepts and self-charged "
              "steps, libm within their stated ulps); "
              "Vertex-Softmax assumes exp within 2 ulp (bounds.vertex_softmax). No heuristic widening. "
              "On a GPU the same: IEEE float64 with round to nearest in cuBLAS and in elementwise kernels "
              "(sums in any order and fused multiply-adds are covered by the same charges); CUDA's float64 "
              "exp/log are documented at 1 ulp (within the 2 ulp assumed; gpu-check measures them); a "
              "CUDA run with cuBLAS float64 emulation enabled is refused (certify.spec.check_arithmetic).")
#: the propagation algorithms: interval bounds only, CROWN, CROWN with Vertex-Softmax intervals
ALGORITHMS = ("ibp", "crown", "vertex")
DEFAULT = PropagationOptions()


def _widen_lower(v, slack):
    # the old relative widening of arithmetic="plain" (no proof rests on it)
    v = torch.nan_to_num(v, nan=-torch.inf)  # NaN from overflowed bounds: no information
    return v - slack * (1 + v.abs())


def _ambient(arithmetic):
    if arithmetic is None:
        return "sound" if ops.is_sound() else "plain"
    if arithmetic not in ops.MODES:
        raise ValueError(f"arithmetic: expected one of {ops.MODES}, got {arithmetic!r}")
    return arithmetic


def _mode(state):
    return state.arithmetic


def _no_info(v):
    # NaN from overflowed bounds (inf - inf, 0·inf): no information
    return torch.nan_to_num(v, nan=-torch.inf, posinf=torch.inf, neginf=-torch.inf)


def _concretise(bias, A, box, sound, slack):
    """A float64 <= bias + min over the box (l, u) (B, *shape) of A·x (A (B, S, *shape)):
    Σ_o A⁺_o l_o + A⁻_o u_o (``_add_pair_sum``); ``slack``: the widening of unsound mode."""
    l, u = box
    if not sound:
        t = A.clamp(min=0) * l.unsqueeze(1) + A.clamp(max=0) * u.unsqueeze(1)
        return _widen_lower(bias + ops.sum_rest(t), slack)
    return _no_info(_add_pair_sum(bias, A.clamp(min=0), A.clamp(max=0), l.unsqueeze(1), u.unsqueeze(1)))


def _add_pair_sum(bias, p, q, a, b):
    """A float64 <= bias + Σ_o (p_o a_o + q_o b_o) for p >= 0 >= q (B, S, *shape) and a, b
    (B, 1, *shape): 2N rounded products and their sum, charged
    γ_(N+1) Σ (p|a| + |q||b|) + 2N·2^-1074, added with downward steps."""
    s = weighted_sum(p, a) + weighted_sum(q, b)
    n = math.prod(p.shape[2:])
    total = weighted_sum(p, a.abs()) - weighted_sum(q, b.abs())
    err = scale_charge(total, n + 1, 2 * n) + floor_charge(2 * n, 1.0, bias.device)
    return sub_down(add_down(bias, s), err)


def _accumulate(state, coef, j, a, bias, sound):
    """coef[j] += a; returns the bias lowered by the rounding of the sum (sound): |fl(c + a) -
    (c + a)| <= u|fl(c + a)| (sums are exact below the normal range)."""
    if j not in coef:
        coef[j] = a
        return bias
    s = coef[j] + a
    if sound:
        bias = sub_down(bias, charge(s, magnitude(*state.bounds[j]).unsqueeze(1), 1))
    coef[j] = s
    return bias


class BoundState:
    """Bounds (l, u) of every node for one batch of input boxes (``bounds``: node id -> (l, u),
    each (B, *shape)), the softmax shifts (``consts``) and the options and arithmetic they were
    computed under. The default planes of elementwise nodes are cached (``planes``); the state
    drops a node's cached planes itself whenever the bounds of its input change
    (``tighten``, ``track``)."""

    def __init__(self, graph, xl, xu, options=DEFAULT):
        self.g = graph
        self.bounds = {0: (xl, xu)}
        self.consts = {}
        self.planes = {}  # elementwise node id -> default planes (see _planes)
        self.batch = xl.shape[0]
        self.options = options
        self.arithmetic = _ambient(options.arithmetic)
        self._users = None

    def _consumers_of(self, i):
        if self._users is None:
            self._users = _consumers(self.g)
        return self._users[i]

    def tighten(self, i, l, u):
        """Set node i's bounds to (l, u) (the caller's proof that they enclose z_i)."""
        self.bounds[i] = (l, u)
        for c in self._consumers_of(i):
            self.planes.pop(c, None)

    def track(self, nodes):
        """Replace the bounds of ``nodes`` by fresh copies that require grad (gradients of a
        bound with respect to them: split scores, worst points); returns node -> (l, u)."""
        leaves = {}
        for i in nodes:
            leaves[i] = tuple(t.detach().clone().requires_grad_(True) for t in self.bounds[i])
            self.tighten(i, *leaves[i])
        return leaves

    def expand(self, batch):
        """This state (batch 1) copied for ``batch`` input boxes (views, no copies)."""
        ex = lambda t: t.expand(batch, *t.shape[1:])  # noqa: E731
        out = BoundState(self.g, *(ex(t) for t in self.bounds[0]), self.options)
        out.arithmetic = self.arithmetic
        out.consts = {i: ex(c) if c.dim() and c.shape[0] == 1 else c for i, c in self.consts.items()}
        out.bounds = {i: (ex(l), ex(u)) for i, (l, u) in self.bounds.items()}
        return out

    def detached(self):
        """This state with every bound detached from autograd (the same values)."""
        out = BoundState(self.g, *(t.detach() for t in self.bounds[0]), self.options)
        out.arithmetic = self.arithmetic
        out.bounds = {i: (l.detach(), u.detach()) for i, (l, u) in self.bounds.items()}
        out.consts = self.consts
        return out


# ---------------------------------------------------------------- interval propagation
def ibp_node(state, i):
    node = state.g.nodes[i]
    with rounding(_mode(state)):
        return node.operator.interval(node, [state.bounds[j] for j in node.inputs], state.consts.get(i))


# ---------------------------------------------------------------- backward propagation
def backward(state, target, A, *, alphas=None, vertex_pv=(), constraints=None):
    """Lower bound (B, S) of A·x_target over the input box. ``A``: (B, S, *shape).

    ``alphas``: node id -> ReLU lower slopes (B, S, *shape). ``vertex_pv``: ids of P·V
    nodes whose term is bounded by Vertex-Softmax instead of McCormick planes.
    ``constraints``: node id -> (lo, hi, beta_lo, beta_hi): the bound holds over the inputs of
    the box whose z_node lies in [lo, hi] (B, *shape; ±inf where unconstrained), with the
    Lagrange multipliers beta (B, S, *shape; negative values count as 0) adding
    -beta_lo (z - lo) - beta_hi (hi - z) <= 0 to A·x_target (beta-CROWN, Wang et al. 2021;
    any beta >= 0 is sound, the multipliers only change tightness).
    The arithmetic is the state's (``propagate``'s options).
    Invariant (sound): A·x_target >= Σ_j coef_j·x_j + bias for every real input in the box,
    with the float64 coef and bias as they stand; each step keeps it by charging its error.
    Off the CPU the operators' tests (domain checks, infinite weights) are read once, at the
    end (``ops.host.read_once``)."""
    mode = _mode(state)
    with rounding(mode):
        return host.read_once(lambda: _backward(state, target, A, alphas, vertex_pv, mode == "sound",
                                                constraints or {}), A)


def _lagrangian(state, i, lo, hi, blo, bhi, bias, sound):
    """(d, bias'): A·x >= (A + d)·z_i + bias' - bias + ... on {lo <= z_i <= hi} for the float
    multipliers beta >= 0: d = beta_hi - beta_lo; bias' adds Σ beta_lo lo - beta_hi hi
    (``_add_pair_sum``) less the rounding of d (u |d| max|z_i|)."""
    has_lo, has_hi = torch.isfinite(lo).unsqueeze(1), torch.isfinite(hi).unsqueeze(1)
    blo = torch.where(has_lo, blo.clamp(min=0), 0.0)
    bhi = torch.where(has_hi, bhi.clamp(min=0), 0.0)
    lo1 = torch.where(has_lo, lo.unsqueeze(1), 0.0)
    hi1 = torch.where(has_hi, hi.unsqueeze(1), 0.0)
    d = bhi - blo
    if not sound:
        return d, bias + ops.sum_rest(blo * lo1) - ops.sum_rest(bhi * hi1)
    bias = _add_pair_sum(bias, blo, -bhi, lo1, hi1)
    return d, sub_down(bias, charge(d, magnitude(*state.bounds[i]).unsqueeze(1), 1))


def _backward(state, target, A, alphas, vertex_pv, sound, constraints):
    g = state.g
    coef = {target: A}
    bias = A.new_zeros(A.shape[:2])
    add = add_down if sound else torch.add
    for i in range(target, -1, -1):
        if i in constraints:
            # every consumer of z_i has a larger id, so coef[i] is complete here
            d, bias = _lagrangian(state, i, *constraints[i], bias, sound)
            bias = _accumulate(state, coef, i, d, bias, sound)
        if i not in coef:
            continue
        Ai, node = coef.pop(i), g.nodes[i]
        op = node.operator
        if op.kind == "input":
            return _concretise(bias, Ai, state.bounds[i], sound, state.options.plain_slack)
        if i in vertex_pv:
            bias = add(bias, vertex_pv_term(state, i, Ai))
            continue
        alpha = None if alphas is None else alphas.get(i)
        planes = _planes(state, i) if op.kind == "elementwise" and alpha is None else _alpha_planes(state, i, alpha)
        if planes is not None:
            new, b = op.step(Ai, planes, state.bounds[node.inputs[0]])
        else:
            new, b = op.backward(node, Ai, [state.bounds[j] for j in node.inputs],
                                 [g.nodes[j].shape for j in node.inputs], state.consts.get(i), alpha)
        bias = add(bias, b)
        for j, a in zip(node.inputs, new):
            bias = _accumulate(state, coef, j, a, bias, sound)
    # no coefficient reached the input (e.g. Vertex-Softmax bounded every path through P·V):
    # the bound is the constant collected so far
    return _no_info(bias) if sound else _widen_lower(bias, state.options.plain_slack)


def _planes(state, i):
    """The default planes of elementwise node i, computed once per input box: they depend
    only on the bounds of the node's input, fixed once that node is bounded."""
    if i not in state.planes:
        l, u = state.bounds[state.g.nodes[i].inputs[0]]
        state.planes[i] = state.g.nodes[i].operator.planes(l.unsqueeze(1), u.unsqueeze(1), None)
    return state.planes[i]


def _alpha_planes(state, i, alpha):
    """Node i's planes for ``alpha`` from its kept default planes (``_planes``), where its
    operator's family reuses them (``Elementwise.alpha_planes``: the upper plane and its
    Newton searches, once per box instead of once per pass) and its input's bounds carry no
    gradient (kept planes with a graph would share it between passes); else None (the
    operator's own backward step)."""
    op = state.g.nodes[i].operator
    if alpha is None or getattr(op, "alpha_planes", None) is None:
        return None
    l, u = state.bounds[state.g.nodes[i].inputs[0]]
    if l.requires_grad or u.requires_grad:
        return None
    return op.alpha_planes(l.unsqueeze(1), u.unsqueeze(1), alpha, _planes(state, i))


def vertex_pv_term(state, pv, A):
    """min over the score and value boxes of A·(P V), decoupled through the simplex:
    Σ_i Σ_k p_ik (Σ_d A_id v_kd) >= Σ_i min_{s_i in box} Σ_k softmax(s_i)_k c_ik with
    c_ik = min_{v in box} Σ_d A_id v_kd (p >= 0), each row solved exactly (Vertex-Softmax).
    Sound: the computed c (two products of length d and a sum) is lowered by
    γ_(d+1) (|A| max|v|)_ik + 3(d+1)·2^-1074, so it is <= the real minimum; the row bounds
    are outward (bounds.vertex_softmax) and their sum is charged γ_(n+1) Σ|row|."""
    att = next(a for a in state.g.attention if a.pv == pv)
    vl, vu = (t.unsqueeze(1) for t in state.bounds[att.values])
    yl, yu = (t.unsqueeze(1) for t in state.bounds[att.shifted])
    ap, an = A.clamp(min=0), A.clamp(max=0)
    c = ap @ vl.transpose(-1, -2) + an @ vu.transpose(-1, -2)
    sound = ops.is_sound()
    if not sound:
        c = _widen_lower(c, state.options.plain_slack)
    else:
        d = vl.shape[-1]
        c = _no_info(sub_down(c, gamma_charge(A.abs() @ magnitude(vl, vu).transpose(-1, -2), d + 1)))
    # bounds.vertex_softmax solves where c is (Triton on CUDA, Numba on the CPU)
    low = vertex_softmax(c, yl.expand_as(c), yu.expand_as(c)).lower
    s = ops.sum_rest(low)
    if not sound:
        return s
    return sub_down(s, charge(low, 1.0, math.prod(low.shape[2:]) + 1))


def crown_node(state, i, select=None, optimise=0, lr=0.1, deadline=None):
    """CROWN bounds (l, u) of node i, each (B, *shape): one lower row e_k and one upper row
    -e_k per element k where ``select`` (bool (B, *shape); default all) holds, in chunks of
    about ``chunk_elements`` coefficients (the state's options; few large chunks: the backward
    pass is overhead bound). Unselected elements get (-inf, inf). Images of a batch with fewer selected elements are
    padded with rows whose result is discarded. ``optimise`` > 0: each row's bound is
    alpha-CROWN's (``optimised_lower``, that many Adam steps at rate ``lr``): the relaxations of
    every node up to i optimised for that row alone; chunks not started by ``deadline`` (a
    ``time.monotonic()`` value) are skipped: their elements get (-inf, inf), like unselected
    ones (the caller keeps the bounds it had)."""
    shape = state.g.nodes[i].shape
    m, b = _numel(shape), state.batch
    widest = max(_numel(n.shape) for n in state.g.nodes[: i + 1])
    half = max(1, state.options.chunk_elements // (2 * b * widest))
    device = state.bounds[0][0].device
    if select is None:
        idx, valid = torch.arange(m, device=device).expand(b, m), torch.ones(b, m, dtype=torch.bool, device=device)
    else:
        sel = select.reshape(b, m)
        # off the CPU every element's rows are bounded unless optimised (no read of the count)
        k = m if host.deferring(sel) and not optimise else int(sel.sum(1).max())
        # selected indices first, in order; the tail of shorter rows is padding
        idx = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)[:, :k]
        valid = torch.gather(sel, 1, idx)
    # the chunks' tests are read once, after the last (ops.host.read_once)
    return host.read_once(lambda: _crown_chunks(state, i, (idx, valid), half, optimise, lr, deadline), idx)


def _crown_chunks(state, i, rows, half, optimise, lr, deadline):
    """``crown_node``'s bounds of node i from its rows (idx, valid) (B, k), ``half`` per chunk."""
    shape = state.g.nodes[i].shape
    idx, valid = rows
    (b, m), device = (state.batch, _numel(shape)), idx.device
    lo = torch.full((b, m), -torch.inf, dtype=torch.float64, device=device)
    hi = torch.full((b, m), torch.inf, dtype=torch.float64, device=device)
    for s in range(0, idx.shape[1], half):
        if deadline is not None and time.monotonic() > deadline:
            break
        cidx, cval = idx[:, s: s + half], valid[:, s: s + half]
        c = cidx.shape[1]
        A = torch.zeros(b, 2 * c, m, dtype=torch.float64, device=device)
        A[:, :c].scatter_(2, cidx.unsqueeze(-1), 1.0)
        A[:, c:].scatter_(2, cidx.unsqueeze(-1), -1.0)
        A = A.reshape(b, 2 * c, *shape)
        out = optimised_lower(state, i, A, optimise, lr, per_product=state.options.intermediate_per_product) \
            if optimise else backward(state, i, A)
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


def _clip_to_value_range(node, l, u):
    # NaN only arises from overflowed interval arithmetic (inf - inf, 0·inf): no information
    l, u = torch.nan_to_num(l, nan=-torch.inf), torch.nan_to_num(u, nan=torch.inf)
    l, u = _clip(l, u, node.operator.value_range)
    l, u = _clip(l, u, node.value_range)
    return l, torch.maximum(l, u)


@dataclass(frozen=True)
class Deadlines:
    """``time.monotonic()`` values for ``propagate``. ``optimise``: alpha optimisation of the
    intermediate bounds stops there and the remaining elements keep their "full" bounds (a
    share of a budget); ``hard`` (a wall-clock budget's end): CROWN chunks not started by then
    are skipped and those elements keep their IBP bounds (sound, looser)."""

    optimise: float | None = None
    hard: float | None = None

    def first(self):
        """The earlier of the two (None: neither)."""
        ends = [t for t in (self.optimise, self.hard) if t is not None]
        return min(ends) if ends else None


def propagate(graph, xl, xu, *, algorithm="crown", centre=None, options=DEFAULT, deadlines=Deadlines(),
              optimise=None):
    """Bounds of every node over the input boxes [xl, xu] (B, *input shape): a ``BoundState``.
    ``algorithm`` (``ALGORITHMS``): "ibp" (interval bounds only), "crown" (CROWN bounds of the
    inputs of nonlinear nodes, intersected with IBP), "vertex" (CROWN, with softmax
    probabilities and attention outputs also intersected with their exact Vertex-Softmax
    intervals). ``centre``: the input point (default: the box centre) whose winning key j* per
    attention row is subtracted from the scores (any choice is exact; it only changes
    tightness). ``options`` (``PropagationOptions``): the arithmetic (kept on the state for
    ``backward``; see ``ARITHMETIC``) and ``intermediate``, how the nodes of ``_needs_bounds``
    get CROWN bounds:
    - "full" (default): every element except those whose IBP interval has zero width (CROWN
      cannot tighten them), in cache-sized chunks: the same bounds as "dense";
    - "sparse": also skips elements on which IBP already decides every consumer's relaxation
      (``_decided``: e.g. a ReLU input with l >= 0 or u <= 0). The relaxations are then the
      same, but the skipped elements keep their IBP bounds, and later IBP intervals that
      start from them can be looser, so a later node where IBP beat CROWN can end looser;
    - "dense" (measurement only): the algorithm before, [I; -I] over every element in
      ``element_budget`` chunks (for the depth benchmark and the test that "full" is no looser);
    - "alpha": "full", then the elements whose consumers' relaxations are still undecided
      (``_decided``) re-bounded by alpha-CROWN (``intermediate_steps`` Adam steps per row,
      every relaxation up to the node optimised for that row; Xu et al. 2021 optimise the
      intermediate bounds in the same way) and intersected: no looser than "full" at each
      node given the same upstream bounds, and about 30x its time on mnist-vit1
      (docs/certify/bab.notes.md). ``deadlines``: a ``Deadlines``. ``optimise``: node id ->
      bool (B, *shape), the only elements "alpha" optimises (default: every undecided one)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if not isinstance(options, PropagationOptions):
        raise ValueError(f"options: expected a PropagationOptions, got {type(options).__name__}")
    state = BoundState(graph, xl, xu, options)
    need = _needs_bounds(graph) if algorithm != "ibp" else set()
    att_of = {a.probs: a for a in graph.attention} | {a.pv: a for a in graph.attention}
    centre = graph.values((xl + xu) / 2 if centre is None else centre, lifted=True)
    for i in range(1, len(graph.nodes)):
        node = graph.nodes[i]
        if node.operator.anchor is not None:
            # e.g. the softmax shift subtracts the score of the key that wins at the box
            # centre: differences of scores get tight CROWN bounds, and y_j* = 0 keeps the
            # exp-sum >= 1
            state.consts[i] = node.operator.anchor(*[centre[j] for j in node.inputs])
        l, u = ibp_node(state, i)
        if i in need:
            l, u = _intermediate(state, i, (l, u), deadlines, optimise)
        if algorithm == "vertex" and i in att_of:
            vl, vu = _vertex_interval(state, att_of[i], i)
            l, u = torch.maximum(l, vl), torch.minimum(u, vu)
        state.bounds[i] = _clip_to_value_range(node, l, u)
    return state


def _intermediate(state, i, box, deadlines, optimise):
    """Node i's IBP box (l, u) intersected with its CROWN bounds by the options' algorithm
    (``propagate``)."""
    l, u = box
    mode, users = state.options.intermediate, state._consumers_of(i)
    if mode == "dense":
        cl, cu = _crown_dense(state, i)
    else:
        select = ~(l == u)  # NaN (no information) stays selected
        if mode == "sparse":
            select &= ~_decided(state.g, users, l, u)
        cl, cu = crown_node(state, i, select, deadline=deadlines.hard)
    l, u = torch.maximum(l, cl), torch.minimum(u, cu)
    del cl, cu
    if mode == "alpha":
        # optimise only where CROWN left some consumer's relaxation undecided
        select = ~(l == u) & ~_decided(state.g, users, l, u)
        if optimise is not None:
            select &= optimise[i] if i in optimise else torch.zeros_like(select)
        stop = deadlines.first()
        if select.any() and (stop is None or time.monotonic() < stop):
            cl, cu = crown_node(state, i, select, optimise=state.options.intermediate_steps, deadline=stop)
            l, u = torch.maximum(l, cl), torch.minimum(u, cu)
    return l, u


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
            with host.at_once():  # the domain checks raise here, not at the end of an enclosing block
                lw, lb, uw, ub = graph.nodes[c].operator.planes(l, u, None)
        except ValueError:  # an interval outside the operator's domain: decide nothing
            return torch.zeros_like(exact)
        exact = exact & (lw == uw) & (lb == ub)
    return exact


def _crown_dense(state, i):
    """CROWN bounds of node i with specs [I; -I] over every element, chunked to stay within
    the options' ``element_budget`` (the intermediate-bound algorithm before "full")."""
    shape = state.g.nodes[i].shape
    m = _numel(shape)
    widest = max(_numel(n.shape) for n in state.g.nodes[: i + 1])
    chunk = max(1, state.options.element_budget // (state.batch * widest))
    eye = torch.eye(m, dtype=torch.float64, device=state.bounds[0][0].device)
    spec = torch.cat([eye, -eye])
    out = []
    for s in range(0, 2 * m, chunk):
        A = spec[s: s + chunk].reshape(-1, *shape).unsqueeze(0).expand(state.batch, -1, *shape)
        out.append(backward(state, i, A))
    lo = torch.cat(out, 1)
    return lo[:, :m].reshape(-1, *shape), -lo[:, m:].reshape(-1, *shape)


def _vertex_interval(state, att, i):
    yl, yu = state.bounds[att.shifted]
    if i == att.probs:
        n = yl.shape[-1]
        c = torch.eye(n, dtype=yl.dtype, device=yl.device)  # row i picks p_i: exact elementwise interval
        r = vertex_softmax(c, yl.unsqueeze(-2), yu.unsqueeze(-2))
        return r.lower, r.upper  # on yl's device (bounds.vertex_softmax follows its inputs)
    vl, vu = state.bounds[att.values]
    # o_id in [min_s Σ_k p_k vl_kd, max_s Σ_k p_k vu_kd], rows (i, d) over keys k
    lo = vertex_softmax(vl.transpose(-1, -2).unsqueeze(-3), yl.unsqueeze(-2), yu.unsqueeze(-2)).lower
    hi = vertex_softmax(vu.transpose(-1, -2).unsqueeze(-3), yl.unsqueeze(-2), yu.unsqueeze(-2)).upper
    return lo, hi


def ibp_lower(state, C):
    """IBP lower bound of C·z from the logit interval (rounded down, as the concretisation)."""
    l, u = state.bounds[state.g.output]
    return _concretise(C.new_zeros(C.shape[:2]), C, (l, u), _mode(state) == "sound", state.options.plain_slack)


def most_sensitive(state, target, A, nodes, fraction, alphas=None):
    """node -> bool (B, *shape): for each of ``nodes``, the ``fraction`` of its elements (per
    image) whose bounds the bound of A·x_target (``backward`` with ``alphas``, summed over the
    rows) is most sensitive to, scored by the first-order gain of tightening them:
    ((d bound / d l)⁺ + (-d bound / d u)⁺) · (u - l). Elements of score 0 are never chosen.
    Used to pick the intermediate bounds worth optimising (``propagate(..., optimise=)``)."""
    saved, planes = {i: state.bounds[i] for i in nodes}, dict(state.planes)
    try:
        leaves = state.track(nodes)
        with torch.enable_grad():
            lo = backward(state, target, A, alphas=alphas)
            fin = torch.isfinite(lo)
            wrt = [t for i in nodes for t in leaves[i]]
            grads = torch.autograd.grad(lo[fin].sum(), wrt, allow_unused=True) if fin.any() else [None] * len(wrt)
    finally:
        state.bounds.update(saved)
        state.planes = planes
    out = {}
    for n, i in enumerate(nodes):
        l, u = saved[i]
        width = torch.nan_to_num(u - l, nan=0.0, posinf=0.0)
        score = torch.zeros_like(l)
        for g, sign in ((grads[2 * n], 1), (grads[2 * n + 1], -1)):
            if g is not None:
                score = score + (sign * g).clamp(min=0) * width
        flat = score.reshape(score.shape[0], -1)
        k = max(1, int(fraction * flat.shape[1]))
        cut = flat.topk(k, dim=1).values[:, -1:]
        out[i] = ((flat >= cut) & (flat > 0)).reshape(score.shape)
    return out


class Adam:
    """Adam (Kingma & Ba 2015) with torch.optim.Adam's defaults (betas (0.9, 0.999), eps 1e-8,
    no weight decay) and its single-tensor update, operation for operation. torch.optim's
    first construction in a process imports torch._dynamo (1.4 s measured on the 2-core
    machine), which a short solver budget cannot afford (tests/test_vnncomp.py). Only
    tightness depends on it: every iterate is projected onto its sound range."""

    def __init__(self, tensors, lr, betas=(0.9, 0.999), eps=1e-8):
        self.tensors, self.lr, self.betas, self.eps, self.steps = tensors, lr, betas, eps, 0
        self.m = [torch.zeros_like(t) for t in tensors]
        self.v = [torch.zeros_like(t) for t in tensors]

    def zero_grad(self):
        for t in self.tensors:
            t.grad = None

    @torch.no_grad()
    def step(self):
        self.steps += 1
        b1, b2 = self.betas
        step_size = self.lr / (1 - b1 ** self.steps)
        correction = (1 - b2 ** self.steps) ** 0.5
        for t, m, v in zip(self.tensors, self.m, self.v):
            if t.grad is None:
                continue
            m.lerp_(t.grad, 1 - b1)
            v.mul_(b2).addcmul_(t.grad, t.grad, value=1 - b2)
            t.addcdiv_(m, (v.sqrt() / correction).add_(self.eps), value=-step_size)


def adam_ascent(bound, params, steps, lr, best, deadline=None):
    """``steps`` Adam steps at rate ``lr`` ascending the sum of the finite entries of
    ``bound(values)`` (B, S) over the parameters ``params`` (key -> ``ops.Params``, start
    (B, S, ...)), each projected onto its sound range before every evaluation and after every
    step: the one optimiser loop of alpha-CROWN and of branch and bound. Returns (best, kept,
    last): the rowwise max of ``best`` and of every bound evaluated; per key the projected
    values that gave each row its best bound (the start where none beat ``best``); the last
    iterate (projected). It runs with gradients on even inside ``torch.no_grad()``. Steps
    not started by ``deadline`` (a ``time.monotonic()`` value) are skipped: every iterate is
    sound, so stopping early only costs tightness."""
    return host.read_once(lambda: _adam_ascent(bound, params, steps, lr, best, deadline), best)


def _adam_ascent(bound, params, steps, lr, best, deadline):
    """``adam_ascent``'s loop; its operators' tests are read once, after it (``ops.host.read_once``)."""
    x = {k: p.start.detach().clone().requires_grad_(True) for k, p in params.items()}
    kept = {k: p.project(x[k].detach()) for k, p in params.items()}
    with torch.enable_grad():
        opt = Adam(list(x.values()), lr=lr)
        for _ in range(steps):
            if deadline is not None and time.monotonic() > deadline:
                break
            lo = bound({k: p.project(x[k]) for k, p in params.items()})
            with torch.no_grad():
                better = lo > best
                best = torch.maximum(best, lo)
                for k, a in x.items():
                    w = better.view(*better.shape, *([1] * (a.dim() - 2)))
                    kept[k] = torch.where(w, params[k].project(a), kept[k])
            opt.zero_grad()
            # rows already at -inf or NaN (no information) must not poison the others' steps:
            # masked without reading the mask (lo[fin] sizes its result on the host); the
            # gradient is lo[fin].sum()'s, 1 on the finite entries and exactly 0 elsewhere
            (-torch.where(torch.isfinite(lo), lo, 0.0).sum()).backward()
            opt.step()
            with torch.no_grad():
                for k, a in x.items():
                    a.copy_(params[k].project(a))
    return best, kept, {k: a.detach() for k, a in x.items()}


def alpha_crown(state, C, iterations=20, lr=0.1, *, operators=None, per_product=True):
    """CROWN with the free relaxation parameters of the final specification optimised jointly
    by Adam (alpha-CROWN, Xu et al. 2021), per target class: every alpha has the spec axis S.

    The parameters are those every operator declares (``Operator.initial_params``): the lower
    slope or tangent point of the elementwise maps (relu, exp, neg_log, reciprocal, square,
    rsqrt, gelu, gelu_tanh, tanh, sigmoid) and the McCormick interpolation of the products
    (mul, matmul). Warm start: the CROWN choice; every alpha is projected onto its range,
    where every value gives a sound bound, so the optimisation only changes tightness; the
    best bound per row over all steps is kept. ``operators``: the names of the operators to
    optimise (None: all; ("relu",): the ReLU-only alpha-CROWN). ``per_product``: one alpha
    per product of a matmul (False: one per output element)."""
    return optimised_lower(state, state.g.output, C, iterations, lr, operators=operators, per_product=per_product)


def optimised_lower(state, target, A, iterations=20, lr=0.1, *, operators=None, per_product=True):
    """Lower bound (B, S) of A·x_target (as ``backward``), with the parameters of every
    optimisable node up to ``target`` optimised per row by ``iterations`` Adam steps at rate
    ``lr`` (``adam_ascent``; the last iterate is bounded too)."""
    best = backward(state, target, A)
    params = {}
    for i in sorted(_ancestors(state.g, target)):
        if operators is not None and state.g.nodes[i].op not in operators:
            continue
        start = initial_params(state, i, A.shape[1], per_product)
        if start is not None:
            params[i] = start
    if not params or iterations <= 0:
        return best
    best, _, last = adam_ascent(lambda a: backward(state, target, A, alphas=a), params, iterations, lr, best)
    with torch.no_grad():
        lo = backward(state, target, A, alphas=last)
    return torch.maximum(best, lo)


def _ancestors(graph, target):
    """target and every node it depends on: the nodes whose relaxations its bound uses."""
    seen, todo = {target}, [target]
    while todo:
        for j in graph.nodes[todo.pop()].inputs:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return seen


def initial_params(state, i, specs, per_product=True):
    """Node i's free relaxation parameters (``ops.Params``: CROWN's choice for ``specs`` rows
    and the sound range), as its operator declares them on the state's bounds, or None."""
    node = state.g.nodes[i]
    with torch.no_grad():
        return node.operator.initial_params(node, [state.bounds[j] for j in node.inputs],
                                            [state.g.nodes[j].shape for j in node.inputs], specs, per_product)
