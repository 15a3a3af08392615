"""``certify.verify``: certified lower bounds of every margin z_y - z_j over an L∞ ball
clipped to the input domain; ``certify.attention_scores``: the verifier's own attention
scores at concrete inputs. The methods are listed once, in ``certify.methods.METHODS``.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from certify import ops
from certify.graph import build_graph
from certify.methods import get_method
from certify.models import check_supported
from certify.spec import (
    DOMAIN,
    check_batch_size,
    check_domain,
    check_images,
    check_problem,
    input_box,
    margin_spec,
)


@dataclass(frozen=True)
class CertResult:
    """lower_margin[b, j] <= min over the ball of z_y - z_j (0 at j = y); certified[b] iff
    every j != y has a positive lower bound. ``assumptions``: the method's, as registered."""

    lower_margin: torch.Tensor
    certified: torch.Tensor
    method: str
    eps: float
    seconds: float
    note: str = ""
    assumptions: str = field(default="", repr=False)
    domain: tuple = DOMAIN

    @property
    def worst_margin(self):
        """min_{j != y} lower_margin (B,)."""
        m = self.lower_margin.clone()
        m[self.lower_margin == 0] = torch.inf
        return m.min(1).values


def verify(model, x, label, eps, method="crown", batch_size=8, *, domain=DOMAIN) -> CertResult:
    """Certify ``model`` (a certify.ViT) at images ``x`` (B, C, H, W) or (C, H, W) with integer
    labels ``label`` over the L∞ ball of radius ``eps`` (a Python, numpy or 0-d tensor real
    scalar, taken as float64) clipped to ``domain`` (default [0, 1]; x must lie in it).
    ``method``: a name in ``certify.METHODS``."""
    meth = get_method(method)
    check_supported(model)
    batch_size = check_batch_size(batch_size)
    domain = check_domain(domain)
    x, label, eps = check_problem(model, x, label, eps, domain)
    m64 = copy.deepcopy(model).double().eval()
    g = build_graph(m64)
    classes = model.head.out_features
    t0 = time.perf_counter()
    out, note = [], ""
    if meth.batch_size is not None:
        batch_size = min(batch_size, meth.batch_size)
    for s in range(0, x.shape[0], batch_size):
        xb, lb = x[s: s + batch_size], label[s: s + batch_size]
        xl, xu = input_box(xb, eps, domain)
        zl, zu, z0 = m64.patchify(xl), m64.patchify(xu), m64.patchify(xb)
        C = margin_spec(lb, classes)
        try:
            lo = meth.lower(m64, g, zl, zu, z0, C)
        except meth.soft_failures as exc:
            note = f"{meth.failure_note}: {type(exc).__name__}: {exc}"[:200]
            lo = torch.full(C.shape[:2], -torch.inf, dtype=torch.float64)
        lo = lo.detach().to(torch.float64)
        lo[torch.arange(len(lb)), lb] = 0.0
        out.append(lo)
    lower = torch.cat(out)
    other = torch.ones_like(lower, dtype=torch.bool)
    other[torch.arange(len(label)), label] = False
    certified = torch.where(other, lower > 0, True).all(1)
    return CertResult(lower, certified, meth.name, eps, time.perf_counter() - t0, note, meth.assumptions, domain)


@dataclass(frozen=True)
class AttentionScores:
    """Per block and head, at concrete inputs: ``scores`` (B, L, H, N, N) = Q Kᵀ / sqrt(d_h)
    before the softmax (row = query, column = key) and ``values`` (B, L, H, N, d_h), float64,
    evaluated on the verifier's own graph (``certify.graph.build_graph``)."""

    scores: torch.Tensor
    values: torch.Tensor

    @property
    def keys_by_queries(self):
        """scores with query and key axes swapped: K Qᵀ / sqrt(d_h)."""
        return self.scores.transpose(-1, -2)


def attention_scores(model, x) -> AttentionScores:
    """Pre-softmax attention scores and values of every block of ``model`` (a certify.ViT) at
    images ``x`` (B, C, H, W) or (C, H, W); no input domain is imposed."""
    check_supported(model)
    x = check_images(model, x)
    m64 = copy.deepcopy(model).double().eval()
    g = build_graph(m64)
    with torch.no_grad():
        vals = [m64.patchify(x)]
        for node in g.nodes[1:]:
            vals.append(ops.forward(node, [vals[j] for j in node.inputs]))
    return AttentionScores(torch.stack([vals[a["scores"]] for a in g.attention], 1),
                           torch.stack([vals[a["values"]] for a in g.attention], 1))
