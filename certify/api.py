"""The verifier's entry points, for any ``torch.nn.Module`` built from supported operators.

- ``verify``: certified lower bounds of every margin z_y - z_j over an L∞ ball clipped to the
  input domain;
- ``verify_box``: the same over an explicit input box;
- ``verify_text``: over an L∞ ball in embedding space on chosen token positions (Shi et al.
  2020, "Robustness verification for transformers"), for models that take ``inputs_embeds``;
- ``linear_bounds``: lower bounds of C·output over a box, on a traced graph;
- ``attention_scores``: the verifier's own attention scores at concrete inputs.
Models are traced by ``certify.trace`` through ``certify.graph_cache.graph_of`` (again whenever
the model's state has changed).
The methods are listed once, in ``certify.methods.METHODS``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from softcert.certify import bab, ops
from softcert.certify.graph_cache import classes_of, graph_of
from softcert.certify.methods import get_method
from softcert.certify.spec import (
    DOMAIN,
    check_batch_size,
    check_box,
    check_domain,
    check_eps,
    check_images,
    check_labels,
    check_progress,
    input_box,
    margin_spec,
)


@dataclass(frozen=True)
class CertResult:
    """lower_margin[b, j] <= min over the input set of z_y - z_j (0 at j = y); certified[b]
    iff every j != y has a positive lower bound. ``eps``: the ball radius (None for a box);
    ``domain``: the input domain the ball was clipped to (None: unclipped);
    ``assumptions``: the method's, as registered (ours: the arithmetic model
    ``certify.crown.ARITHMETIC``, under which every bound encloses the real-arithmetic value)."""

    lower_margin: torch.Tensor
    certified: torch.Tensor
    method: str
    eps: float | None
    seconds: float
    note: str = ""
    assumptions: str = field(default="", repr=False)
    domain: tuple | None = DOMAIN
    label: torch.Tensor | None = None  # (B,) the labels y

    @property
    def worst_margin(self):
        """min_{j != y} lower_margin (B,). Without ``label``, every exact 0 counts as y's own
        column (a bound of exactly 0 elsewhere would then be skipped)."""
        m = self.lower_margin.clone()
        if self.label is None:
            m[self.lower_margin == 0] = torch.inf
        else:
            m[torch.arange(len(self.label)), self.label] = torch.inf
        return m.min(1).values


# ---------------------------------------------------------------- bounds
def linear_bounds(graph, lower, upper, C, method="crown", center=None) -> torch.Tensor:
    """Certified lower bounds (B, S) of C·output over the input box [lower, upper].

    ``lower``, ``upper`` (B, *input shape) with the graph's input shape graph.nodes[0].shape;
    ``C`` (B, S, *output shape); ``center``: the anchor point in the box (default the
    midpoint; it only changes tightness). ``method``: a name in ``certify.METHODS`` that runs on
    graphs (not the auto_LiRPA baselines, which need the torch model)."""
    meth = get_method(method)
    if meth.needs_model:
        raise ValueError(f"method: {method!r} runs auto_LiRPA on the torch model; linear_bounds takes our "
                         f"methods only")
    shape = tuple(graph.nodes[0].shape)
    lo, hi, c = check_box(lower, upper, center)
    if tuple(lo.shape[1:]) != shape:
        raise ValueError(f"lower: expected shape (B, {', '.join(map(str, shape))}), got {tuple(lo.shape)}")
    C = torch.as_tensor(C).to(torch.float64)
    out = tuple(graph.nodes[graph.output].shape)
    if C.dim() != 2 + len(out) or C.shape[0] != lo.shape[0] or tuple(C.shape[2:]) != out:
        raise ValueError(f"C: expected shape ({lo.shape[0]}, S, {', '.join(map(str, out))}), got {tuple(C.shape)}")
    return meth.lower(graph, lo, hi, c, C, None).detach().to(torch.float64)


def _certify(model, graph, meth, x0, lower, upper, label, batch_size, eps, domain, model_input=None,
             progress=None):
    """Margins of ``label`` over the boxes [lower, upper] (B, *input shape of the graph);
    ``progress(k)`` after each batch of k samples."""
    classes = classes_of(graph)
    label = check_labels(label, x0.shape[0], classes)
    out_shape = graph.nodes[graph.output].shape
    t0 = time.perf_counter()
    out, note = [], ""
    if meth.batch_size is not None:
        batch_size = min(batch_size, meth.batch_size)
    for s in range(0, x0.shape[0], batch_size):
        sl = slice(s, s + batch_size)
        lb = label[sl]
        C = margin_spec(lb, classes).reshape(len(lb), classes, *out_shape)
        try:
            lo = meth.lower(graph, lower[sl], upper[sl], x0[sl], C, model_input)
        except meth.soft_failures as exc:
            note = f"{meth.failure_note}: {type(exc).__name__}: {exc}"[:200]
            lo = torch.full(C.shape[:2], -torch.inf, dtype=torch.float64)
        lo = lo.detach().to(torch.float64)
        lo[torch.arange(len(lb)), lb] = 0.0
        out.append(lo)
        if progress is not None:
            progress(len(lb))
    lower_margin = torch.cat(out)
    other = torch.ones_like(lower_margin, dtype=torch.bool)
    other[torch.arange(len(label)), label] = False
    certified = torch.where(other, lower_margin > 0, True).all(1)
    return CertResult(lower_margin, certified, meth.name, eps, time.perf_counter() - t0, note, meth.assumptions,
                      domain, label)


def _lift(t):
    """(B, *shape) -> (B, 1, *shape): the traced graph keeps the model's batch axis (size 1)."""
    return t.unsqueeze(1)


def verify(model, x, label, eps, method="crown", batch_size=8, *, domain=DOMAIN, timeout=None, progress=None):
    """Certify ``model`` (any nn.Module whose traced graph uses supported operators; see
    ``certify.supported_operators``) at inputs ``x`` (B, ...) with integer labels ``label``
    over the L∞ ball of radius ``eps`` (a Python, numpy or 0-d tensor real scalar, taken as
    float64) clipped to ``domain`` (default [0, 1]; x must lie in it; None: no clipping).
    ``method``: a name in ``certify.METHODS`` (a ``CertResult``), or "bab": branch-and-bound
    with falsification alongside, ``timeout`` seconds per sample, three-valued verdicts (a
    ``certify.bab.BabResult``; see ``certify.bab.verify``). ``progress``: called with the
    number of samples just finished, after each batch (each sample for "bab")."""
    progress = check_progress(progress)
    if method == "bab":
        if timeout is None:
            raise ValueError("timeout: method 'bab' needs a per-sample time budget in seconds")
        return bab.verify(model, x, label, eps, timeout=timeout, domain=domain, progress=progress)
    if timeout is not None:
        raise ValueError(f"timeout: only method 'bab' takes a time budget, got method {method!r}")
    meth = get_method(method)
    batch_size = check_batch_size(batch_size)
    domain = None if domain is None else check_domain(domain)
    eps = check_eps(eps)
    x = check_images(model, x, domain)
    graph = graph_of(model, x)
    lo, hi = input_box(x, eps, domain)
    lifted = (_lift(x), _lift(lo), _lift(hi))
    return _certify(model, graph, meth, *lifted, label, batch_size, eps, domain,
                    model_input=model, progress=progress)


def verify_box(model, lower, upper, label, method="crown", batch_size=8, *, center=None) -> CertResult:
    """Certify ``model`` over the explicit input box [lower, upper] (B, ...); ``center``: a
    point of the box (default the midpoint) that anchors the softmax shift and, for the
    auto_LiRPA baselines, the forward pass."""
    meth = get_method(method)
    batch_size = check_batch_size(batch_size)
    lo, hi, c = check_box(lower, upper, center)
    graph = graph_of(model, c)
    return _certify(model, graph, meth, _lift(c), _lift(lo), _lift(hi), label, batch_size, None, None,
                    model_input=model)


def _embeddings_call(model, e):
    return model(inputs_embeds=e)


def embed(model, input_ids) -> torch.Tensor:
    """float64 token embeddings (B, T, d) of ``input_ids`` (B, T) by the model's input embedding
    layer (``model.get_input_embeddings()``, as Hugging Face models have)."""
    ids = torch.as_tensor(input_ids)
    if ids.dtype in (torch.bool,) or ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"input_ids: expected integer token ids, got dtype {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"input_ids: expected shape (B, T) or (T,), got {tuple(torch.as_tensor(input_ids).shape)}")
    get = getattr(model, "get_input_embeddings", None)
    if get is None:
        raise ValueError(f"model: {type(model).__name__} has no get_input_embeddings(); verify_text needs a model "
                         f"that embeds tokens and takes inputs_embeds (e.g. a Hugging Face model)")
    layer = get()
    if (ids < 0).any() or (ids >= layer.num_embeddings).any():
        raise ValueError(f"input_ids: token ids must lie in [0, {layer.num_embeddings})")
    with torch.no_grad():
        return layer.weight.detach().to(torch.float64)[ids]


def verify_text(model, input_ids, label, eps, positions=None, method="crown", batch_size=8) -> CertResult:
    """Certify a text classifier over an L∞ ball of radius ``eps`` around the token embeddings
    at ``positions`` (token indices; default every position), the other embeddings fixed.
    ``model`` must take ``inputs_embeds=`` (Hugging Face convention); the attention mask is
    all ones (sentences of equal length)."""
    meth = get_method(method)
    if meth.needs_model:
        raise ValueError(f"method: {method!r} (auto_LiRPA) is not wired for embedding-space balls; use one of "
                         f"ours")
    batch_size = check_batch_size(batch_size)
    eps = check_eps(eps)
    e = embed(model, input_ids)
    t = e.shape[1]
    if positions is None:
        positions = list(range(t))
    pos = torch.as_tensor(positions)
    if pos.dim() == 0:
        pos = pos.reshape(1)
    if pos.is_floating_point() or pos.dtype == torch.bool or pos.numel() == 0 or (pos < 0).any() or (pos >= t).any():
        raise ValueError(f"positions: expected token indices in [0, {t}), got {positions!r}")
    mask = torch.zeros(t, 1, dtype=torch.float64)
    mask[pos] = 1.0
    r = eps * mask
    # e ± r rounded outward on the chosen positions, exact elsewhere
    lo = torch.where(r > 0, torch.nextafter(e - r, torch.full_like(e, -torch.inf)), e)
    hi = torch.where(r > 0, torch.nextafter(e + r, torch.full_like(e, torch.inf)), e)
    graph = graph_of(model, e, _embeddings_call, key="inputs_embeds")
    return _certify(model, graph, meth, _lift(e), _lift(lo), _lift(hi), label, batch_size, eps, None)


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
    att = [a for a in g.attention if a["pv"] is not None]
    if not att:
        raise ValueError("model: no attention layer (softmax followed by a product with values) in the graph")
    with torch.no_grad():
        vals = [_lift(x)]
        for node in g.nodes[1:]:
            vals.append(ops.forward(node, [vals[j] for j in node.inputs]))
    try:
        # drop the traced batch axis (size 1) that every node value carries
        return AttentionScores(torch.stack([vals[a["scores"]].squeeze(1) for a in att], 1),
                               torch.stack([vals[a["values"]].squeeze(1) for a in att], 1))
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
    from softcert.certify import crown

    if method not in ("ibp", "crown", "vertex"):
        raise ValueError(f"method: expected 'ibp', 'crown' or 'vertex', got {method!r}")
    domain = None if domain is None else check_domain(domain)
    eps = check_eps(eps)
    x = check_images(model, x, domain)
    g = graph_of(model, x)
    lo, hi = input_box(x, eps, domain)
    state = crown.propagate(g, _lift(lo), _lift(hi), crown=method != "ibp", vertex=method == "vertex",
                            anchor=_lift(x))
    out = []
    for a in g.attention:
        if a["pv"] is None:
            continue
        yl, yu = state.bounds[a["shifted"]]
        vl, vu = state.bounds[a["values"]]
        out.append(AttentionBox((yl.squeeze(1), yu.squeeze(1)), (vl.squeeze(1), vu.squeeze(1)), method))
    return tuple(out)


def forward(graph, x) -> torch.Tensor:
    """The graph's output at inputs ``x`` (B, *input shape), float64 (a plain forward pass)."""
    vals = [torch.as_tensor(x).to(torch.float64)]
    with torch.no_grad():
        for node in graph.nodes[1:]:
            vals.append(ops.forward(node, [vals[j] for j in node.inputs]))
    return vals[-1]

