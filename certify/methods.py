"""The verification methods, listed once: ``METHODS`` maps a name to a ``Method``.

A method turns one batch of input boxes into lower bounds of C·logits. Ours ("ibp",
"crown", "alpha-crown", "vertex", "alpha-crown-relu", "alpha-crown-intermediate") run
``certify.crown`` on the graph of registered operators; "vertex" is the hybrid: CROWN whose
softmax-probability and attention-output intermediate bounds are intersected with exact
Vertex-Softmax intervals, and whose final bound is, per target class, the max of the CROWN
bound and the bound with the P·V term of every attention layer solved by Vertex-Softmax;
"alpha-crown" optimises every relaxation jointly, "alpha-crown-relu" the ReLU slopes only,
"alpha-crown-intermediate" also every intermediate bound (``options`` carries the Adam
settings as data). "lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown" run auto_LiRPA 0.3
through ``certify.lirpa_compat`` (the independent baseline).
The command line and the report list methods from here.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from softcert.certify import crown

LIRPA_ASSUMPTIONS = ("auto_LiRPA 0.3 on the float32 copy of the model (it mixes float32 buffers into "
                     "float64 runs), patched by certify.lirpa_compat; float32 without directed rounding, "
                     "no widening: a baseline, not a proof.")


@dataclass(frozen=True)
class Method:
    """``lower(graph, xl, xu, x0, C, model_input)`` -> (B, S) lower bounds of C·output over the
    box [xl, xu] (B, *graph input shape); x0: a point of the box (the input itself) that
    anchors the softmax shifts; C (B, S, *graph output shape). ``needs_model``: the method runs
    on the torch model, given as ``model_input``, instead of the graph. ``batch_size``: the largest
    batch the method is run on (None: the caller's). ``soft_failures``: exception types
    that mean "no bound" (the certificate becomes -inf with a note starting with
    ``failure_note``) instead of an error."""

    name: str
    description: str
    assumptions: str
    lower: Callable
    batch_size: int | None = None
    needs_model: bool = False
    soft_failures: tuple = ()
    failure_note: str = "failed"
    options: Mapping = field(default_factory=lambda: MappingProxyType({}))


#: alpha-CROWN settings (the reference settings of docs/mathematics.md §6): Adam steps and rate
ALPHA_OPTIONS = MappingProxyType({"iterations": 20, "lr": 0.1})


def _ibp(g, xl, xu, x0, C, model_input):
    return crown.ibp_lower(crown.propagate(g, xl, xu, crown=False, anchor=x0), C)


def _crown(g, xl, xu, x0, C, model_input):
    # anchor the softmax shift at the input itself, as auto_LiRPA does (fixed max index)
    state = crown.propagate(g, xl, xu, vertex=False, anchor=x0)
    return crown.backward(state, g.output, C)


def _alpha_crown(operators=None, iterations=20, lr=0.1, intermediate="full"):
    def lower(g, xl, xu, x0, C, model_input):
        state = crown.propagate(g, xl, xu, vertex=False, anchor=x0, intermediate=intermediate)
        return crown.alpha_crown(state, C, iterations, lr, operators=operators)
    return lower


def _vertex(g, xl, xu, x0, C, model_input):
    state = crown.propagate(g, xl, xu, vertex=True, anchor=x0)
    lo = crown.backward(state, g.output, C)
    pvs = [a["pv"] for a in g.attention if a["pv"] is not None]
    if not pvs:
        return lo
    with torch.no_grad():
        lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv=set(pvs)))
        if len(pvs) > 1:
            lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv={pvs[-1]}))
    return lo


def _lirpa(name):
    def lower(g, xl, xu, x0, C, model_input):
        from softcert.certify.lirpa_compat import lirpa_lower

        model = model_input
        # the graph carries the model's batch axis (size 1); auto_LiRPA sees the model's own shapes
        xl, xu, x0 = xl.squeeze(1), xu.squeeze(1), x0.squeeze(1)
        C = C.reshape(*C.shape[:2], -1)
        m32 = copy.deepcopy(model).float().eval()
        f = lambda t: t.to(torch.float32)  # noqa: E731
        return lirpa_lower(m32, f(xl), f(xu), f(x0), f(C), name).detach().to(torch.float64)
    return lower


_OURS = f"Ours (certify.crown). Arithmetic: {crown.ARITHMETIC}"
# auto_LiRPA gives up by raising (e.g. an IBP denominator interval reaching 0): no bound
_LIRPA_FAILS = (AssertionError, RuntimeError, IndexError)

METHODS = MappingProxyType({m.name: m for m in (
    Method("ibp", "interval bound propagation through every registered operator", _OURS, _ibp),
    Method("crown", "CROWN: linear bound propagation with per-operator relaxations, intermediate bounds "
           "by CROWN intersected with IBP", _OURS, _crown),
    Method("alpha-crown", "CROWN with every relaxation of the final specification optimised jointly by Adam "
           "per target class (20 steps, lr 0.1): ReLU/GELU/tanh/sigmoid slopes, the exp/-log/reciprocal/square/"
           "rsqrt tangent points (so the decomposed softmax) and the McCormick interpolation of mul and "
           "matmul (Q·Kᵀ, P·V)", _OURS, _alpha_crown(None, **ALPHA_OPTIONS), options=ALPHA_OPTIONS),
    Method("vertex", "CROWN with exact Vertex-Softmax intervals for softmax probabilities and attention "
           "outputs, and the P·V terms solved by Vertex-Softmax", _OURS, _vertex),
    Method("alpha-crown-relu", "CROWN with the ReLU lower slopes only of the final specification optimised "
           "by Adam (20 steps, lr 0.1; the alpha-CROWN of the ingredients table)", _OURS,
           _alpha_crown(("relu",), **ALPHA_OPTIONS),
           options=MappingProxyType({**ALPHA_OPTIONS, "operators": ("relu",)})),
    Method("alpha-crown-intermediate", "alpha-crown whose intermediate bounds are optimised too: every element "
           "that CROWN leaves undecided gets its own parameters, 10 Adam steps per row (crown.propagate "
           "intermediate=\"alpha\"; about 30x the time of alpha-crown on mnist-vit1)", _OURS,
           _alpha_crown(None, intermediate="alpha", **ALPHA_OPTIONS),
           options=MappingProxyType({**ALPHA_OPTIONS, "intermediate": "alpha",
                                     "intermediate_steps": crown.INTERMEDIATE_STEPS})),
    # auto_LiRPA 0.3 needed > 20 GB for 4 images of the 2-block model: one image at a time
    Method("lirpa-ibp", "auto_LiRPA 0.3 IBP (baseline)", LIRPA_ASSUMPTIONS, _lirpa("IBP"), 1, True, _LIRPA_FAILS,
           "auto_LiRPA failed"),
    Method("lirpa-crown", "auto_LiRPA 0.3 CROWN (baseline)", LIRPA_ASSUMPTIONS, _lirpa("CROWN"), 1,
           True, _LIRPA_FAILS, "auto_LiRPA failed"),
    Method("lirpa-alpha-crown", "auto_LiRPA 0.3 alpha-CROWN, 20 Adam steps at lr 0.1 (baseline)",
           LIRPA_ASSUMPTIONS, _lirpa("alpha-CROWN"), 1, True, _LIRPA_FAILS, "auto_LiRPA failed"),
)})


def get_method(name) -> Method:
    """The registered method ``name``; ValueError naming the choices otherwise."""
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {name!r}")
    return METHODS[name]
