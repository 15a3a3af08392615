"""The verifier's entry points, for any ``torch.nn.Module`` built from supported operators.

- ``verify``: certified lower bounds of every margin z_y - z_j over an L∞ ball clipped to the
  input domain;
- ``verify_box``: the same over an explicit input box;
- ``verify_text``: over an L∞ ball in embedding space on chosen token positions (Shi et al.
  2020, "Robustness verification for transformers"), for models that take ``inputs_embeds``;
- ``linear_bounds``: lower bounds of C·output over a box, on a traced graph (``vertex_bounds``:
  those of "vertex" with the state of its propagation);
- ``attention_scores``: the verifier's own attention scores at concrete inputs.
Every method runs through ``certify.methods.Method.run`` and returns a ``certify.result.CertResult``.
Models are traced by ``certify.trace`` through ``certify.graph_cache.graph_of`` (again whenever
the model's state has changed).
The methods are listed once, in ``certify.methods.METHODS``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from softcert.certify import crown
from softcert.certify.graph_cache import classes_of, graph_of
from softcert.certify.methods import get_method, vertex_lower
from softcert.certify.ops import tensor_of
from softcert.certify.options import BoundOptions
from softcert.certify.result import CertResult, Problem
from softcert.certify.spec import (
    DOMAIN,
    check_box,
    check_device,
    check_domain,
    check_eps,
    check_graph_device,
    check_images,
    check_labels,
    check_progress,
    input_box,
)


# ---------------------------------------------------------------- bounds
def linear_bounds(graph, lower, upper, C, method="crown", center=None) -> torch.Tensor:
    """Certified lower bounds (B, S) of C·output over the input box [lower, upper].

    ``lower``, ``upper`` (B, *input shape) with the graph's input shape graph.nodes[0].shape;
    ``C`` (B, S, *output shape); ``center``: the anchor point in the box (default the
    midpoint; it only changes tightness). ``method``: a name in ``certify.METHODS`` that runs on
    graphs (not the auto_LiRPA baselines, which need the torch model)."""
    meth = get_method(method)
    if meth.needs_model:
        raise ValueError(f"method: {method!r} runs on the torch model (auto_LiRPA, branch and bound); "
                         f"linear_bounds takes our bound-only methods")
    lo, hi, c, C = _checked_box(graph, lower, upper, C, center)
    return meth.lower(graph, lo, hi, c, C, BoundOptions()).detach().to(torch.float64)


def vertex_bounds(graph, lower, upper, C, center=None):
    """``linear_bounds(graph, lower, upper, C, "vertex", center)`` and the state of its one
    propagation (``crown.BoundState``: every node's bounds, for callers that bound more of the
    graph from them, as ``certify.vnncomp.lower_bounds`` bounds a softmax output)."""
    lo, hi, c, C = _checked_box(graph, lower, upper, C, center)
    with torch.no_grad():
        state = crown.propagate(graph, lo, hi, algorithm="vertex", centre=c, options=BoundOptions().propagation)
        bound = vertex_lower(state, C)
    return bound.detach().to(torch.float64), state


def _checked_box(graph, lower, upper, C, center):
    """(lower, upper, centre, C) of ``linear_bounds`` checked against ``graph``: ValueError naming
    the argument otherwise."""
    shape = tuple(graph.nodes[0].shape)
    lo, hi, c = check_box(lower, upper, center)
    if tuple(lo.shape[1:]) != shape:
        raise ValueError(f"lower: expected shape (B, {', '.join(map(str, shape))}), got {tuple(lo.shape)}")
    C = tensor_of(C, device=lo.device).to(torch.float64)
    if C.device != lo.device:
        raise ValueError(f"C: on {C.device} but lower is on {lo.device}; move both to one device")
    check_graph_device(graph, lo, "lower")
    out = tuple(graph.nodes[graph.output].shape)
    if C.dim() != 2 + len(out) or C.shape[0] != lo.shape[0] or tuple(C.shape[2:]) != out:
        raise ValueError(f"C: expected shape ({lo.shape[0]}, S, {', '.join(map(str, out))}), got {tuple(C.shape)}")
    return lo, hi, c, C


def _lift(t):
    """(B, *shape) -> (B, 1, *shape): the traced graph keeps the model's batch axis (size 1)."""
    return t.unsqueeze(1)


def _problem(model, graph, box, label, eps=None, domain=None):
    """The ``Problem`` of inputs box = (centre, lower, upper) (B, ...), labels checked."""
    x, lo, hi = box
    label = check_labels(label, x.shape[0], classes_of(graph), x.device)
    return Problem(model, graph, x, lo, hi, label, eps, domain, model)


def verify(model, x, label, eps, method="crown", *, domain=DOMAIN, options=None, progress=None) -> CertResult:
    """Certify ``model`` (any nn.Module whose traced graph uses supported operators; see
    ``certify.supported_operators``) at inputs ``x`` (B, ...) with integer labels ``label``
    over the L∞ ball of radius ``eps`` (a Python, numpy or 0-d tensor real scalar, taken as
    float64) clipped to ``domain`` (default [0, 1]; x must lie in it; None: no clipping).
    ``method``: a name in ``certify.METHODS``: bound-only methods (certified or unknown per
    sample) or "bab"/"bab-vertex": branch and bound with falsification alongside (certified,
    falsified or unknown). ``options``: the method's options object (``BoundOptions``, e.g.
    ``batch_size``; ``BabOptions``, e.g. ``timeout`` seconds per sample, which "bab" needs).
    ``progress``: called with the number of samples just finished. Returns a ``CertResult``."""
    progress = check_progress(progress)
    meth = get_method(method)
    options = meth.check_options(options)
    domain = None if domain is None else check_domain(domain)
    eps = check_eps(eps)
    x = check_images(model, x, domain)
    graph = graph_of(model, x)
    lo, hi = input_box(x, eps, domain)
    return meth.run(_problem(model, graph, (x, lo, hi), label, eps, domain), options, progress)


def verify_box(model, lower, upper, label, method="crown", *, center=None, options=None) -> CertResult:
    """Certify ``model`` over the explicit input box [lower, upper] (B, ...); ``center``: a
    point of the box (default the midpoint) that anchors the softmax shift and, for the
    auto_LiRPA baselines, the forward pass. ``options``: as for ``verify``; bound-only methods."""
    meth = get_method(method)
    if meth.complete:
        raise ValueError(f"method: {method!r} searches an L∞ ball (certify.verify); verify_box takes bound-only "
                         f"methods")
    options = meth.check_options(options)
    lo, hi, c = check_box(lower, upper, center)
    check_device(model, lo, "lower")
    graph = graph_of(model, c)
    return meth.run(_problem(model, graph, (c, lo, hi), label), options)


def _embeddings_call(model, e):
    return model(inputs_embeds=e)


def embed(model, input_ids) -> torch.Tensor:
    """float64 token embeddings (B, T, d) of ``input_ids`` (B, T) by the model's input embedding
    layer (``model.get_input_embeddings()``, as Hugging Face models have)."""
    ids = tensor_of(input_ids)
    if ids.dtype in (torch.bool,) or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"input_ids: expected integer token ids, got dtype {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"input_ids: expected shape (B, T) or (T,), got {tuple(tensor_of(input_ids).shape)}")
    get = getattr(model, "get_input_embeddings", None)
    if get is None:
        raise ValueError(f"model: {type(model).__name__} has no get_input_embeddings(); verify_text needs a model "
                         f"that embeds tokens and takes inputs_embeds (e.g. a Hugging Face model)")
    layer = get()
    check_device(layer, ids, "input_ids")
    if (ids < 0).any() or (ids >= layer.num_embeddings).any():
        raise ValueError(f"input_ids: token ids must lie in [0, {layer.num_embeddings})")
    with torch.no_grad():
        return layer.weight.detach().to(torch.float64)[ids]


def verify_text(model, input_ids, label, eps, positions=None, method="crown", *, options=None) -> CertResult:
    """Certify a text classifier over an L∞ ball of radius ``eps`` around the token embeddings
    at ``positions`` (token indices; default every position), the other embeddings fixed.
    ``model`` must take ``inputs_embeds=`` (Hugging Face convention); the attention mask is
    all ones (sentences of equal length). ``options``: as for ``verify``; bound-only methods
    of ours."""
    meth = get_method(method)
    if meth.needs_model:
        raise ValueError(f"method: {method!r} runs on the torch model's own input (auto_LiRPA, branch and bound) "
                         f"and is not wired for embedding-space balls; use a bound-only method of ours")
    options = meth.check_options(options)
    eps = check_eps(eps)
    e = embed(model, input_ids)
    t = e.shape[1]
    if positions is None:
        positions = list(range(t))
    pos = tensor_of(positions, device=e.device).to(e.device)
    if pos.dim() == 0:
        pos = pos.reshape(1)
    if pos.is_floating_point() or pos.dtype == torch.bool or pos.numel() == 0 or (pos < 0).any() or (pos >= t).any():
        raise ValueError(f"positions: expected token indices in [0, {t}), got {positions!r}")
    mask = torch.zeros(t, 1, dtype=torch.float64, device=e.device)
    mask[pos] = 1.0
    r = eps * mask
    # e ± r rounded outward on the chosen positions, exact elsewhere
    lo = torch.where(r > 0, torch.nextafter(e - r, torch.full_like(e, -torch.inf)), e)
    hi = torch.where(r > 0, torch.nextafter(e + r, torch.full_like(e, torch.inf)), e)
    graph = graph_of(model, e, _embeddings_call, key="inputs_embeds")
    return meth.run(_problem(None, graph, (e, lo, hi), label, eps), options)


# ---------------------------------------------------------------- attention scores
@dataclass(frozen=True)
class AttentionScores:
    """Per attention layer (softmax followed by a product with values) and head, at concrete
    inputs: ``scores`` (B, L, *head axes, N, N) before the softmax (row = query, column = key;
    Q Kᵀ · scale + mask) and ``values`` (B, L, *head axes, N, d_h), float64, evaluated on the
    verifier's own graph."""

    scores: torch.Tensor
    values: torch.Tensor

    @property
    def keys_by_queries(self):
        """scores with query and key axes swapped: K Qᵀ / sqrt(d_h)."""
        return self.scores.transpose(-1, -2)


def attention_scores(model, x) -> AttentionScores:
    """Pre-softmax attention scores and values of every attention layer of ``model`` at inputs
    ``x`` (B, ...); no input domain is imposed. Layers must share one shape."""
    x = check_images(model, x)
    g = graph_of(model, x)
    att = [a for a in g.attention if a.pv is not None]
    if not att:
        raise ValueError("model: no attention layer (softmax followed by a product with values) in the graph")
    with torch.no_grad():
        vals = g.values(_lift(x), lifted=True)
    try:
        # drop the traced batch axis (size 1) that every node value carries
        return AttentionScores(torch.stack([vals[a.scores].squeeze(1) for a in att], 1),
                               torch.stack([vals[a.values].squeeze(1) for a in att], 1))
    except RuntimeError as exc:
        raise ValueError(f"model: attention layers of different shapes cannot be stacked ({exc})") from None


@dataclass(frozen=True)
class AttentionBox:
    """Certified boxes of one attention layer over an input box: ``shifted`` (lower, upper)
    of the shifted scores y = s - s_j* (softmax(y) = softmax(s); j* is the key that wins at
    the input) and ``values`` (lower, upper), each (B, *head axes, N, ·) without the traced
    batch axis. Computed by the method's intermediate bounds (``method``)."""

    shifted: tuple
    values: tuple
    method: str


def attention_boxes(model, x, eps, *, domain=DOMAIN, method="vertex") -> tuple:
    """``AttentionBox`` of every attention layer of ``model`` over the L∞ ball of radius
    ``eps`` around ``x`` clipped to ``domain``; ``method``: "ibp", "crown" or "vertex" (the
    intermediate bounds that method computes)."""
    if method not in ("ibp", "crown", "vertex"):
        raise ValueError(f"method: expected 'ibp', 'crown' or 'vertex', got {method!r}")
    domain = None if domain is None else check_domain(domain)
    eps = check_eps(eps)
    x = check_images(model, x, domain)
    g = graph_of(model, x)
    lo, hi = input_box(x, eps, domain)
    state = crown.propagate(g, _lift(lo), _lift(hi), algorithm=method, centre=_lift(x))
    out = []
    for a in g.attention:
        if a.pv is None:
            continue
        yl, yu = state.bounds[a.shifted]
        vl, vu = state.bounds[a.values]
        out.append(AttentionBox((yl.squeeze(1), yu.squeeze(1)), (vl.squeeze(1), vu.squeeze(1)), method))
    return tuple(out)


def forward(graph, x) -> torch.Tensor:
    """The graph's output at inputs ``x`` (B, *input shape), float64 (a plain forward pass)."""
    with torch.no_grad():
        return graph.values(tensor_of(x).to(torch.float64), lifted=True)[-1]

