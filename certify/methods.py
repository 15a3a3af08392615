"""The verification methods, listed once: ``METHODS`` maps a name to a ``Method``.

A method turns one batch of input boxes into lower bounds of C·logits. Ours ("ibp",
"crown", "alpha-crown", "vertex", "alpha-crown-relu", "alpha-crown-intermediate") run
``certify.crown`` on the graph of registered operators; "vertex" is the hybrid: CROWN whose
softmax-probability and attention-output intermediate bounds are intersected with exact
Vertex-Softmax intervals, and whose final bound is, per target class, the max of the CROWN
bound and the bound with the P·V term of every attention layer solved by Vertex-Softmax;
"alpha-crown" optimises every relaxation jointly, "alpha-crown-relu" the ReLU slopes only,
"alpha-crown-intermediate" also every intermediate bound (``settings`` carries the Adam
settings as data). "lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown" run auto_LiRPA 0.3
through ``certify.lirpa_compat`` (the independent baseline). "bab" and "bab-vertex" are
complete: branch and bound with falsification alongside (``certify.bab``), three-valued
verdicts. Every method runs through ``Method.run`` on a ``certify.result.Problem`` and
returns a ``certify.result.CertResult``; its options object is ``Method.defaults``' type
(``BoundOptions`` or ``BabOptions``).
The command line and the report list methods from here.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from softcert.certify import crown
from softcert.certify.bab.samples import ASSUMPTIONS as BAB_ASSUMPTIONS
from softcert.certify.bab.samples import search_margins
from softcert.certify.graph_cache import classes_of
from softcert.certify.options import BabOptions, BoundOptions
from softcert.certify.result import CertResult
from softcert.certify.spec import margin_spec

LIRPA_ASSUMPTIONS = ("auto_LiRPA 0.3 on the float32 copy of the model (it mixes float32 buffers into "
                     "float64 runs), patched by certify.lirpa_compat; float32 without directed rounding, "
                     "no widening: a baseline, not a proof.")


@dataclass(frozen=True)
class Method:
    """A verification method. Bound-only methods give ``lower(graph, xl, xu, x0, C, options)``
    -> (B, S) lower bounds of C·output over the box [xl, xu] (B, *graph input shape); x0: a
    point of the box (the input itself) that anchors the softmax shifts; C (B, S, *graph
    output shape); ``options``: the ``BoundOptions``, or for ``needs_model`` methods the torch
    model (they run on it instead of the graph). Complete methods give ``search(method,
    problem, options, progress)`` -> ``CertResult`` instead. ``batch_size``: the largest
    batch the method is run on (None: the options'). ``soft_failures``: exception types that
    mean "no bound" (the certificate becomes -inf with a note starting with ``failure_note``)
    instead of an error. ``settings``: the method's fixed settings, as data; ``defaults``:
    its options object when the caller passes none (its type is the one ``run`` takes)."""

    name: str
    description: str
    assumptions: str
    lower: Callable | None = None
    batch_size: int | None = None
    needs_model: bool = False
    soft_failures: tuple = ()
    failure_note: str = "failed"
    settings: Mapping = field(default_factory=lambda: MappingProxyType({}))
    search: Callable | None = None
    defaults: object = field(default_factory=BoundOptions)

    @property
    def complete(self):
        """Whether the method can also falsify (three-valued verdicts)."""
        return self.search is not None

    def check_options(self, options):
        """``options`` (None: ``defaults``) of this method's type; ValueError otherwise."""
        if options is None:
            options = self.defaults
        if not isinstance(options, type(self.defaults)):
            raise ValueError(f"options: method {self.name!r} takes a {type(self.defaults).__name__}, got "
                             f"{type(options).__name__}")
        if isinstance(options, BabOptions) and options.timeout is None:
            raise ValueError(f"timeout: method {self.name!r} needs a per-sample time budget in seconds: "
                             f"options=BabOptions(timeout=...)")
        return options

    def run(self, problem, options=None, progress=None) -> CertResult:
        """This method on ``problem`` (``certify.result.Problem``) with ``options`` (None: the
        defaults); ``progress(k)`` after each k samples finished."""
        options = self.check_options(options)
        if self.search is not None:
            return self.search(self, problem, options, progress)
        return _bound_margins(self, problem, options, progress)


def _bound_margins(meth, problem, options, progress):
    """Margins of ``problem.label`` over the problem's boxes, ``options.batch_size`` samples
    at a time; ``progress(k)`` after each batch of k samples."""
    graph, label = problem.graph, problem.label
    classes, out_shape = classes_of(graph), graph.nodes[graph.output].shape
    lift = lambda t: t.unsqueeze(1)  # noqa: E731  (the traced graph keeps the model's batch axis)
    t0 = time.perf_counter()
    out, note = [], ""
    batch = options.batch_size if meth.batch_size is None else min(options.batch_size, meth.batch_size)
    for s in range(0, problem.size, batch):
        sl = slice(s, s + batch)
        lb = label[sl]
        C = margin_spec(lb, classes).reshape(len(lb), classes, *out_shape)
        extra = problem.model_input if meth.needs_model else options
        try:
            lo = meth.lower(graph, lift(problem.lower[sl]), lift(problem.upper[sl]), lift(problem.centre[sl]), C,
                            extra)
        except meth.soft_failures as exc:
            note = f"{meth.failure_note}: {type(exc).__name__}: {exc}"[:200]
            lo = torch.full(C.shape[:2], -torch.inf, dtype=torch.float64, device=C.device)
        lo = lo.detach().to(torch.float64)
        lo[torch.arange(len(lb), device=lo.device), lb] = 0.0
        out.append(lo)
        if progress is not None:
            progress(len(lb))
    lower_margin = torch.cat(out)
    other = torch.ones_like(lower_margin, dtype=torch.bool)
    other[torch.arange(len(label), device=other.device), label] = False
    certified = torch.where(other, lower_margin > 0, True).all(1)
    infinite = (other & ~torch.isfinite(lower_margin)).any(1)
    if not note and bool(infinite.any()):
        note = infinite_note(problem, int(infinite.nonzero()[0, 0]))
    return CertResult(lower_margin, certified, meth.name, problem.eps, time.perf_counter() - t0, note,
                      meth.assumptions, problem.domain, label)


#: interval ends above this magnitude overflow float64 in the next product (its square root)
HUGE = 1e154


def infinite_note(problem, b: int) -> str:
    """Where sample ``b``'s bounds blew up: the first node whose interval bounds (IBP over the
    sample's box) are infinite, NaN or above ``HUGE`` in magnitude, by name and operator, and
    what to try."""
    graph = problem.graph
    with torch.no_grad():
        state = crown.propagate(graph, problem.lower[b:b + 1].unsqueeze(1), problem.upper[b:b + 1].unsqueeze(1),
                                algorithm="ibp", centre=problem.centre[b:b + 1].unsqueeze(1))
    where = "the final bound (every interval bound is moderate: the linear bounds overflowed)"
    for i, node in enumerate(graph.nodes):
        size = torch.stack([a.abs().max() for a in state.bounds[i]]).max()
        if not bool(size <= HUGE):  # NaN included
            where = f"node {i} ({node.name or node.op}, operator {node.op}: interval ends up to {float(size):.3g})"
            break
    box = "its input box" if problem.eps is None else f"the input box of radius {problem.eps:g}"
    return (f"a lower margin is -inf (sample {b}): the bounds became infinite at {where} over {box}; "
            "try a smaller eps, or a domain that narrows the inputs")


#: alpha-CROWN settings (the reference settings of docs/mathematics.md §6): Adam steps and rate
ALPHA_OPTIONS = MappingProxyType({"iterations": 20, "lr": 0.1})


def _ibp(g, xl, xu, x0, C, options):
    return crown.ibp_lower(crown.propagate(g, xl, xu, algorithm="ibp", centre=x0, options=options.propagation), C)


def _with_interval(state, C, lo):
    """The larger of a linear lower bound ``lo`` of C·z and the one the state's own logit
    intervals give (both sound): where an intermediate box is finite but astronomically wide
    (a softmax's exp-sum reaching 0 over the box), its relaxation planes can carry the final
    linear bound to -inf while the output's interval, clipped through the probabilities'
    [0, 1], still decides (mnist-vit2-ct at eps 0.02: 3 of the first 200 test images)."""
    with torch.no_grad():
        interval = crown.ibp_lower(state, C)
    return torch.maximum(lo, interval)


def _crown(g, xl, xu, x0, C, options):
    # anchor the softmax shift at the input itself, as auto_LiRPA does (fixed max index)
    state = crown.propagate(g, xl, xu, centre=x0, options=options.propagation)
    return _with_interval(state, C, crown.backward(state, g.output, C))


def _alpha_crown(operators=None, iterations=20, lr=0.1, intermediate="full"):
    def lower(g, xl, xu, x0, C, options):
        opts = dataclasses.replace(options.propagation, intermediate=intermediate)
        state = crown.propagate(g, xl, xu, centre=x0, options=opts)
        return _with_interval(state, C, crown.alpha_crown(state, C, iterations, lr, operators=operators))
    return lower


def _vertex(g, xl, xu, x0, C, options):
    state = crown.propagate(g, xl, xu, algorithm="vertex", centre=x0, options=options.propagation)
    return vertex_lower(state, C)


def vertex_lower(state, C):
    """The lower bound of C·z of method "vertex" on its propagated ``state`` (``crown.propagate``
    with algorithm="vertex"): CROWN's backward bound, the output's own interval where tighter,
    and the backward bounds with the attention P·V terms solved by Vertex-Softmax."""
    g = state.g
    lo = _with_interval(state, C, crown.backward(state, g.output, C))
    pvs = [a.pv for a in g.attention if a.pv is not None]
    if not pvs:
        return lo
    with torch.no_grad():
        lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv=set(pvs)))
        if len(pvs) > 1:
            lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv={pvs[-1]}))
    return lo


def _lirpa(name):
    def lower(g, xl, xu, x0, C, model):
        from softcert.certify.lirpa_compat import lirpa_lower

        # the graph carries the model's batch axis (size 1); auto_LiRPA sees the model's own shapes
        xl, xu, x0 = xl.squeeze(1), xu.squeeze(1), x0.squeeze(1)
        C = C.reshape(*C.shape[:2], -1)
        m32 = copy.deepcopy(model).float().eval()
        f = lambda t: t.to(torch.float32)  # noqa: E731
        return lirpa_lower(m32, f(xl), f(xu), f(x0), f(C), name).detach().to(torch.float64)
    return lower


def _bab(vertex):
    def search(method, problem, options, progress):
        if options.vertex and not vertex:
            raise ValueError(f"options: BabOptions(vertex=True) is the method 'bab-vertex', not {method.name!r}")
        return search_margins(method, problem, dataclasses.replace(options, vertex=vertex), progress)
    return search


_OURS = f"Ours (certify.crown). Arithmetic: {crown.ARITHMETIC}"
# auto_LiRPA gives up by raising (e.g. an IBP denominator interval reaching 0): no bound
#: auto_LiRPA's own failures on graphs it half-supports (unsupported operators raise
#: NotImplementedError, a RuntimeError; a ViT with LayerNorm raised "'BoundAdd' object has no
#: attribute 'forward_value'" in its IBP, issue 32): the baseline has no bound, said in the note
_LIRPA_FAILS = (AssertionError, RuntimeError, IndexError, AttributeError, TypeError, KeyError)

METHODS = MappingProxyType({m.name: m for m in (
    Method("ibp", "interval bound propagation through every registered operator", _OURS, _ibp),
    Method("crown", "CROWN: linear bound propagation with per-operator relaxations, intermediate bounds "
           "by CROWN intersected with IBP, the final bound no lower than the interval one", _OURS, _crown),
    Method("alpha-crown", "CROWN with every relaxation of the final specification optimised jointly by Adam "
           "per target class (20 steps, lr 0.1): ReLU/GELU/tanh/sigmoid slopes, the exp/-log/reciprocal/square/"
           "rsqrt tangent points (so the decomposed softmax) and the McCormick interpolation of mul and "
           "matmul (Q·Kᵀ, P·V)", _OURS, _alpha_crown(None, **ALPHA_OPTIONS), settings=ALPHA_OPTIONS),
    Method("vertex", "CROWN with exact Vertex-Softmax intervals for softmax probabilities and attention "
           "outputs, and the P·V terms solved by Vertex-Softmax", _OURS, _vertex),
    Method("alpha-crown-relu", "CROWN with the ReLU lower slopes only of the final specification optimised "
           "by Adam (20 steps, lr 0.1; the alpha-CROWN of the ingredients table)", _OURS,
           _alpha_crown(("relu",), **ALPHA_OPTIONS),
           settings=MappingProxyType({**ALPHA_OPTIONS, "operators": ("relu",)})),
    Method("alpha-crown-intermediate", "alpha-crown whose intermediate bounds are optimised too: every element "
           "that CROWN leaves undecided gets its own parameters, 10 Adam steps per row (crown.propagate "
           "intermediate=\"alpha\"; about 30x the time of alpha-crown on mnist-vit1)", _OURS,
           _alpha_crown(None, intermediate="alpha", **ALPHA_OPTIONS),
           settings=MappingProxyType({**ALPHA_OPTIONS, "intermediate": "alpha",
                                      "intermediate_steps": BoundOptions().propagation.intermediate_steps})),
    # auto_LiRPA 0.3 needed > 20 GB for 4 images of the 2-block model: one image at a time
    Method("lirpa-ibp", "auto_LiRPA 0.3 IBP (baseline)", LIRPA_ASSUMPTIONS, _lirpa("IBP"), 1, True, _LIRPA_FAILS,
           "auto_LiRPA failed"),
    Method("lirpa-crown", "auto_LiRPA 0.3 CROWN (baseline)", LIRPA_ASSUMPTIONS, _lirpa("CROWN"), 1,
           True, _LIRPA_FAILS, "auto_LiRPA failed"),
    Method("lirpa-alpha-crown", "auto_LiRPA 0.3 alpha-CROWN, 20 Adam steps at lr 0.1 (baseline)",
           LIRPA_ASSUMPTIONS, _lirpa("alpha-CROWN"), 1, True, _LIRPA_FAILS, "auto_LiRPA failed"),
    Method("bab", "branch and bound on the inputs of nonlinear neurons (GenBaB-style, beta-CROWN multipliers, "
           "alpha-CROWN leaves), PGD falsification alongside: certified, falsified or unknown per sample",
           BAB_ASSUMPTIONS, search=_bab(vertex=False), defaults=BabOptions(), needs_model=True),
    Method("bab-vertex", "bab with Vertex-Softmax intervals at the root and P·V bounds in the leaves",
           BAB_ASSUMPTIONS, search=_bab(vertex=True), defaults=BabOptions(vertex=True), needs_model=True),
)})


def get_method(name) -> Method:
    """The registered method ``name``; ValueError naming the choices otherwise."""
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {name!r}")
    return METHODS[name]
