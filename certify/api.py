"""``certify.verify``: certified lower bounds of every margin z_y - z_j over an L∞ ball.

Methods: "ibp", "crown", "alpha-crown" (ours, ``certify.crown``), "vertex" (the hybrid:
CROWN whose softmax-probability and attention-output intermediate bounds are intersected
with exact Vertex-Softmax intervals, and whose final bound is, per target class, the max of
the CROWN bound and the bound with the P·V term of every attention layer solved by
Vertex-Softmax), and "lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown" (auto_LiRPA 0.3
through ``certify.lirpa_compat``, the independent baseline).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from certify import crown
from certify.graph import build_graph
from certify.models import check_supported
from certify.spec import check_problem, input_box, margin_spec

METHODS = ("ibp", "crown", "alpha-crown", "vertex", "lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown")


@dataclass(frozen=True)
class CertResult:
    """lower_margin[b, j] <= min over the ball of z_y - z_j (0 at j = y); certified[b] iff
    every j != y has a positive lower bound."""

    lower_margin: torch.Tensor
    certified: torch.Tensor
    method: str
    eps: float
    seconds: float
    note: str = ""
    assumptions: str = field(default=crown.__doc__.split("Arithmetic: ")[1].strip(), repr=False)

    @property
    def worst_margin(self):
        """min_{j != y} lower_margin (B,)."""
        m = self.lower_margin.clone()
        m[self.lower_margin == 0] = torch.inf
        return m.min(1).values


def _lower(model, g, zl, zu, z0, C, method, batch_first):
    if method.startswith("lirpa-"):
        from certify.lirpa_compat import lirpa_lower

        name = {"lirpa-ibp": "IBP", "lirpa-crown": "CROWN", "lirpa-alpha-crown": "alpha-CROWN"}[method]
        # auto_LiRPA 0.3 mixes float32 buffers into float64 runs: give it the float32 model
        m32 = copy.deepcopy(model).float()
        f = lambda t: t.to(torch.float32)  # noqa: E731
        return lirpa_lower(m32, f(zl), f(zu), f(z0), f(C), name).detach().to(torch.float64)
    if method == "ibp":
        return crown.ibp_lower(crown.propagate(g, zl, zu, crown=False, anchor=z0), C)
    # anchor the softmax shift at the input itself, as auto_LiRPA does (fixed max index)
    state = crown.propagate(g, zl, zu, vertex=(method == "vertex"), anchor=z0)
    if method == "alpha-crown":
        return crown.alpha_crown(state, C)
    lo = crown.backward(state, g.output, C)
    if method == "vertex":
        pvs = {a["pv"] for a in g.attention}
        with torch.no_grad():
            lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv=pvs))
            last = {g.attention[-1]["pv"]}
            if last != pvs:
                lo = torch.maximum(lo, crown.backward(state, g.output, C, vertex_pv=last))
    return lo


def verify(model, x, label, eps, method="crown", batch_size=8) -> CertResult:
    """Certify ``model`` (a certify.ViT) at images ``x`` (B, C, H, W) with labels ``label``
    over the L∞ ball of radius ``eps`` clipped to [0, 1]."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    check_supported(model)
    x, label = check_problem(model, x, label, eps)
    m64 = copy.deepcopy(model).double().eval()
    g = build_graph(m64)
    classes = model.head.out_features
    t0 = time.perf_counter()
    out, note = [], ""
    for s in range(0, x.shape[0], batch_size):
        xb, lb = x[s: s + batch_size], label[s: s + batch_size]
        xl, xu = input_box(xb, eps)
        zl, zu, z0 = m64.patchify(xl), m64.patchify(xu), m64.patchify(xb)
        C = margin_spec(lb, classes)
        try:
            lo = _lower(m64, g, zl, zu, z0, C, method, True)
        except (AssertionError, RuntimeError, IndexError) as exc:
            if not method.startswith("lirpa-"):
                raise
            # auto_LiRPA gives up (e.g. an IBP denominator interval reaching 0): no bound
            note = f"auto_LiRPA failed: {type(exc).__name__}: {exc}"[:200]
            lo = torch.full(C.shape[:2], -torch.inf, dtype=torch.float64)
        lo = lo.detach().to(torch.float64)
        lo[torch.arange(len(lb)), lb] = 0.0
        out.append(lo)
    lower = torch.cat(out)
    other = torch.ones_like(lower, dtype=torch.bool)
    other[torch.arange(len(label)), label] = False
    certified = torch.where(other, lower > 0, True).all(1)
    return CertResult(lower, certified, method, float(eps), time.perf_counter() - t0, note)
