"""The verification methods, listed once: ``METHODS`` maps a name to a ``Method``.

A method turns one batch of input boxes into lower bounds of C·logits. Ours ("ibp",
"crown", "alpha-crown", "vertex") run ``certify.crown`` on the graph of registered operators;
"vertex" is the hybrid: CROWN whose softmax-probability and attention-output intermediate
bounds are intersected with exact Vertex-Softmax intervals, and whose final bound is, per
target class, the max of the CROWN bound and the bound with the P·V term of every attention
layer solved by Vertex-Softmax. "lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown" run
auto_LiRPA 0.3 through ``certify.lirpa_compat`` (the independent baseline).
The command line and the report list methods from here.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch

from certify import crown

LIRPA_ASSUMPTIONS = ("auto_LiRPA 0.3 on the float32 copy of the model (it mixes float32 buffers into "
                     "float64 runs), patched by certify.lirpa_compat; float32 without directed rounding, "
                     "no widening: a baseline, not a proof.")


@dataclass(frozen=True)
class Method:
    """``lower(model64, graph, zl, zu, z0, C)`` -> (B, S) lower bounds of C·logits over the
    patch box [zl, zu] (z0: the patches of the input itself). ``batch_size``: the largest
    batch the method is run on (None: the caller's). ``soft_failures``: exception types
    that mean "no bound" (the certificate becomes -inf with a note starting with
    ``failure_note``) instead of an error."""

    name: str
    description: str
    assumptions: str
    lower: Callable
    batch_size: int | None = None
    soft_failures: tuple = ()
    failure_note: str = "failed"


def _ibp(model, g, zl, zu, z0, C):
    return crown.ibp_lower(crown.propagate(g, zl, zu, crown=False, anchor=z0), C)


def _crown(model, g, zl, zu, z0, C):
    # anchor the softmax shift at the input itself, as auto_LiRPA does (fixed max index)
    state = crown.propagate(g, zl, zu, vertex=False, anchor=z0)
    return crown.backward(state, g.output, C)


def _alpha_crown(model, g, zl, zu, z0, C):
    return crown.alpha_crown(crown.propagate(g, zl, zu, vertex=False, anchor=z0), C)


def _vertex(model, g, zl, zu, z0, C):
    state = crown.propagate(g, zl, zu, vertex=True, anchor=z0)
    lo = crown.backward(state, g.output, C)
    pvs = {a["pv"] for a in g.attention}
    with torch.no_grad():
        lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv=pvs))
        last = {g.attention[-1]["pv"]}
        if last != pvs:
            lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv=last))
    return lo


def _lirpa(name):
    def lower(model, g, zl, zu, z0, C):
        from certify.lirpa_compat import lirpa_lower

        m32 = copy.deepcopy(model).float()
        f = lambda t: t.to(torch.float32)  # noqa: E731
        return lirpa_lower(m32, f(zl), f(zu), f(z0), f(C), name).detach().to(torch.float64)
    return lower


_OURS = f"Ours (certify.crown). Arithmetic: {crown.ARITHMETIC}"
# auto_LiRPA gives up by raising (e.g. an IBP denominator interval reaching 0): no bound
_LIRPA_FAILS = (AssertionError, RuntimeError, IndexError)

METHODS = MappingProxyType({m.name: m for m in (
    Method("ibp", "interval bound propagation through every registered operator", _OURS, _ibp),
    Method("crown", "CROWN: linear bound propagation with per-operator relaxations, intermediate bounds "
           "by CROWN intersected with IBP", _OURS, _crown),
    Method("alpha-crown", "CROWN with the ReLU lower slopes of the final specification optimised by Adam "
           "(20 steps)", _OURS, _alpha_crown),
    Method("vertex", "CROWN with exact Vertex-Softmax intervals for softmax probabilities and attention "
           "outputs, and the P·V terms solved by Vertex-Softmax", _OURS, _vertex),
    # auto_LiRPA 0.3 needed > 20 GB for 4 images of the 2-block model: one image at a time
    Method("lirpa-ibp", "auto_LiRPA 0.3 IBP (baseline)", LIRPA_ASSUMPTIONS, _lirpa("IBP"), 1, _LIRPA_FAILS,
           "auto_LiRPA failed"),
    Method("lirpa-crown", "auto_LiRPA 0.3 CROWN (baseline)", LIRPA_ASSUMPTIONS, _lirpa("CROWN"), 1,
           _LIRPA_FAILS, "auto_LiRPA failed"),
    Method("lirpa-alpha-crown", "auto_LiRPA 0.3 alpha-CROWN, 20 Adam steps at lr 0.1 (baseline)",
           LIRPA_ASSUMPTIONS, _lirpa("alpha-CROWN"), 1, _LIRPA_FAILS, "auto_LiRPA failed"),
)})


def get_method(name) -> Method:
    """The registered method ``name``; ValueError naming the choices otherwise."""
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {name!r}")
    return METHODS[name]
