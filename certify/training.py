"""Certified training: IBP (Gowal et al. 2018) and CROWN-IBP (Zhang et al. 2020) for any model
certify's torch front end takes (``certify.trace``: the zoo ViTs, user models with
nn.MultiheadAttention, LayerNorm, GELU...).

Loss (per batch, labels y, radius eps, K classes): with m̲_j <= z_y - z_j a lower bound of every
margin over the L∞ box [x - eps, x + eps] ∩ domain (m̲_y = 0), the worst-case logits are -m̲
and the robust loss is CE(-m̲, y) = log(1 + Σ_{j≠y} exp(-m̲_j)), an upper bound of the
cross-entropy at every point of the box (CE is shift invariant and decreasing in each margin).
Training minimises kappa·CE(z(x), y) + (1 - kappa)·CE(-m̲, y) with
- IBP: m̲_j = l_y - u_j from the interval bounds [l, u] of the logits;
- CROWN-IBP: m̲ = beta·m̲_CROWN-IBP + (1 - beta)·m̲_IBP, where m̲_CROWN-IBP is CROWN's backward
  pass from the margin specification down to the input, with the IBP bounds of every
  intermediate node for the relaxations (a convex combination of lower bounds is one). A row
  whose CROWN-IBP bound is not finite (an IBP bound overflowed, e.g. exp underflowing to 0 in
  a softmax, so -log of its sum is +inf) keeps its IBP bound, and is bounded apart from the
  others so that no 0·inf of its chain rule reaches a gradient.
Schedules (per step, after ``warmup_epochs`` of natural training): eps grows from 0 to its final
value over ``ramp_epochs``, linearly by default (``RAMPS``: also smooth and geometric); kappa and
beta move linearly with eps/eps_final from
their start to their end values, as in the reference code of Zhang et al. 2020
(github.com/huanzhang12/CROWN-IBP, train.py: kappa = 1 - (eps/eps_max)(1 - final_kappa)).

How gradients reach the weights. The traced graph (``certify.graph``) holds float64 copies of
the weights, detached. ``_Binding`` traces two copies of the model whose parameters hold
distinct random values and finds, for every constant of the graph, the parameter whose storage
it views (its shape, strides and offset into that storage); every step rebuilds the graph's
constants as the same views of the live parameters (``as_strided``, differentiable) and runs
each operator's own ``interval`` method on them (``crown.ibp_node``; CROWN-IBP is
``crown.backward`` on those bounds), so an operator owns its behaviour and this module never
looks at operator names. A constant that is computed from the parameters but is
not a view of one (e.g. eval-mode batch norm's w/sqrt(var + eps)) is refused with a ValueError
naming the node and its operator. Buffers are read once, when the model is first bound.

Arithmetic: the training bounds are plain autograd arithmetic, NOT the sound outward rounding
of ``certify.verify``: IBP runs in the model's dtype (an operator that computes in float64,
e.g. the smooth activations, is cast back), the CROWN-IBP backward pass in float64 (the
operators' relaxation planes are float64). They are exact lower bounds only up to rounding;
certificates of a trained model come from ``certify.verify`` afterwards.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
import weakref
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from softcert.certify import crown
from softcert.certify.attack import pgd_cross_entropy
from softcert.certify.lowering import current_softmax_form
from softcert.certify.ops import all_finite, host, tensor_of
from softcert.certify.options import PropagationOptions
from softcert.certify.spec import DOMAIN, check_domain, check_eps, check_images, check_labels, input_box, margin_spec
from softcert.certify.trace import logits_of, trace

#: the bounds ``robust_loss`` can train with
BOUNDS = ("ibp", "crown-ibp")


def _smooth(t, mid=0.25, power=4):
    """The smooth ramp on [0, 1]: a·t^power up to ``mid``, then the tangent line there, scaled
    so that it reaches 1 at t = 1 (continuous with its derivative)."""
    a = 1.0 / (mid ** power + power * mid ** (power - 1) * (1 - mid))
    if t <= mid:
        return a * t ** power
    return a * (mid ** power + power * mid ** (power - 1) * (t - mid))


def _geometric(t, start):
    """start^(1 - t) for t > 0 (0 before the ramp): eps grows by a constant factor per step,
    from start·eps to eps, so that every decade of eps gets the same number of steps."""
    return 0.0 if t <= 0 else start ** (1 - t)


#: the shapes of the eps ramp: the fraction of the final eps at a fraction t of the ramp
#: (``start``: the geometric ramp's first fraction, ``CertifiedTraining.ramp_start``)
RAMPS = {"linear": lambda t, start: t, "smooth": lambda t, start: _smooth(t), "geometric": _geometric}
_PLAIN = PropagationOptions(arithmetic="plain")


def _count(v, low):
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _unit(v):
    return _real(v) and 0.0 <= v <= 1.0


@dataclass(frozen=True)
class CertifiedTraining:
    """The certified-training recipe of ``train_certified`` (the schedules: module docstring).

    ``eps``: the final training radius (0.02: the middle of the reference radii 0.01 / 0.02 /
    0.03 of softcert certify's default --eps and the radius of the zoo's PGD-trained mnist-vit1-pgd).
    ``epochs``: epochs in all (100: CROWN-IBP's config/mnist_crown.json).
    ``warmup_epochs``: natural training first (1: mnist_crown.json "schedule_start": 1).
    ``ramp_epochs``: eps grows linearly from 0 to ``eps`` over these (61: mnist_crown.json
    "schedule_length": 61); the rest trains at ``eps``.
    ``kappa_start``, ``kappa_end``: the weight of the natural loss at eps 0 and at ``eps``
    (1 and 0.5: Gowal et al. 2018; CROWN-IBP defaults.json "final-kappa": 0.5).
    ``bound``: "ibp" (Gowal et al. 2018) or "crown-ibp" (Zhang et al. 2020, the default:
    tighter early in the ramp, where IBP bounds of a fresh network are loose).
    ``beta_start``, ``beta_end``: the weight of the CROWN-IBP bound at eps 0 and at ``eps``
    (1 and 0: Zhang et al. 2020, defaults.json "final-beta": 0.0); unused with "ibp".
    ``lr``: Adam's learning rate (5e-4: CROWN-IBP defaults.json, Adam).
    ``lr_milestones``, ``lr_decay``: the rate is multiplied by ``lr_decay`` at the start of
    each epoch listed (a step decay, Gowal et al. 2018: 10x, twice, after the ramp; default ():
    a constant rate, as before the option existed; 0.1: Gowal et al.'s factor).
    ``batch_size``: 128 (CROWN-IBP defaults.json; also certify/train.py's natural recipes).
    ``seed``: the batch order and any dropout draws (0: certify/train.py's default seed).
    ``domain``: the input domain the box is clipped to (certify.spec.DOMAIN, [0, 1], the
    verifier's; None: no clipping).
    ``ramp``: the shape of the eps ramp (module docstring): "linear" (the default: CROWN-IBP's
    train.py, as the zoo's models were trained) or "smooth" (Gowal et al. 2018's reference
    code, Shi et al. 2021: degree-4 growth over the first quarter, then linear) or "geometric"
    (from ramp_start·eps by a constant factor per step; kappa and beta follow eps/eps_final, so
    with this ramp set kappa_start to the weight the robust term should have from its start).
    ``grad_clip``: the largest global gradient norm of a step, larger ones scaled down to it
    (None: no clipping, as the zoo's models were trained; Shi et al. 2021 and Mao et al.
    2023's CTBench scripts use 10).
    ``box_fraction``: the robust term bounds a box of radius box_fraction·eps inside the eps
    box, around a PGD point of ``attack_steps`` steps (Mueller et al. 2023, SABR; their
    shrinkage 0.1-0.4); 1.0 (the default) is the whole box, no attack. Below 1 the robust loss
    bounds only that small box: a training signal, not an upper bound over the eps box.
    ``attack_steps``: PGD steps for the small box's centre (5: SABR's train_steps in CTBench).
    ``shift``: each training image is translated by a random whole number of pixels in
    [-shift, shift] along its last two axes, edges replicated (so it stays in the domain),
    before both terms see it: random translation, the augmentation of the CIFAR recipes of
    Gowal et al. 2018 and Shi et al. 2021 (random crops). 0 (the default): none, as the zoo's
    models before it were trained; on mnist5k, 2 raised a natural 4-block LayerNorm ViT's test
    accuracy from 0.926 to 0.961 (docs/certify/training.md).
    ``ramp_start``: the fraction of eps the "geometric" ramp starts from (1e-4: the span of the
    geometric ramp measured in docs/certify/training.md; unused by the other ramps). A model's
    interval bounds can grow by 1e3-1e6 per attention block (docs/certify/training.md, "Why
    those runs collapse"), so that a linear ramp spends almost all its steps at radii where
    the robust loss is saturated."""

    eps: float = 0.02
    epochs: int = 100
    warmup_epochs: int = 1
    ramp_epochs: int = 61
    kappa_start: float = 1.0
    kappa_end: float = 0.5
    bound: str = "crown-ibp"
    beta_start: float = 1.0
    beta_end: float = 0.0
    lr: float = 5e-4
    lr_milestones: tuple = ()
    lr_decay: float = 0.1
    batch_size: int = 128
    seed: int = 0
    domain: tuple | None = DOMAIN
    ramp: str = "linear"
    grad_clip: float | None = None
    box_fraction: float = 1.0
    attack_steps: int = 5
    ramp_start: float = 1e-4
    shift: int = 0

    def __post_init__(self):
        def check(name, ok, expected):
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"{type(self).__name__}.{name}: expected {expected}, got {value!r}")

        check("eps", lambda v: _real(v) and v >= 0, "a finite float >= 0")
        check("epochs", lambda v: _count(v, 1), "an int >= 1")
        check("warmup_epochs", lambda v: _count(v, 0), "an int >= 0")
        check("ramp_epochs", lambda v: _count(v, 0), "an int >= 0")
        for name in ("kappa_start", "kappa_end", "beta_start", "beta_end"):
            check(name, _unit, "a float in [0, 1]")
        check("bound", lambda v: v in BOUNDS, f"one of {', '.join(BOUNDS)}")
        check("lr", lambda v: _real(v) and v > 0, "a finite float > 0")
        check("lr_decay", lambda v: _real(v) and 0 < v <= 1, "a finite float in (0, 1]")
        check("lr_milestones", lambda v: isinstance(v, (tuple, list)) and all(_count(e, 1) for e in v)
              and list(v) == sorted(set(v)), "increasing epochs >= 1")
        object.__setattr__(self, "lr_milestones", tuple(self.lr_milestones))
        if self.lr_milestones and self.lr_milestones[-1] >= self.epochs:
            raise ValueError(f"{type(self).__name__}.lr_milestones: epoch {self.lr_milestones[-1]} is not before "
                             f"the last (epochs = {self.epochs}; epochs count from 0)")
        check("batch_size", lambda v: _count(v, 1), "an int >= 1")
        check("seed", lambda v: _count(v, 0), "an int >= 0")
        check("ramp", lambda v: v in RAMPS, f"one of {', '.join(RAMPS)}")
        check("grad_clip", lambda v: v is None or (_real(v) and v > 0), "None or a finite float > 0")
        check("box_fraction", lambda v: _real(v) and 0 < v <= 1, "a finite float in (0, 1]")
        check("attack_steps", lambda v: _count(v, 1), "an int >= 1")
        check("ramp_start", lambda v: _real(v) and 0 < v < 1, "a finite float in (0, 1)")
        check("shift", lambda v: _count(v, 0), "an int >= 0")
        if self.warmup_epochs + self.ramp_epochs > self.epochs:
            raise ValueError(f"{type(self).__name__}.ramp_epochs: warmup_epochs + ramp_epochs = "
                             f"{self.warmup_epochs + self.ramp_epochs} exceeds epochs = {self.epochs} "
                             f"(eps would never reach its final value)")
        if self.domain is not None:
            try:
                object.__setattr__(self, "domain", check_domain(self.domain))
            except ValueError as exc:
                raise ValueError(f"{type(self).__name__}.{exc}") from None

    def learning_rate(self, epoch):
        """Adam's rate in epoch ``epoch`` (0-based): lr · lr_decay^(milestones <= epoch)."""
        return self.lr * self.lr_decay ** sum(m <= epoch for m in self.lr_milestones)

    def schedule(self, step, steps_per_epoch):
        """(eps, kappa, beta) at global step ``step`` (0-based) of ``steps_per_epoch`` per
        epoch; eps is 0 through the warm-up, then reaches ``eps`` at the ramp's last step."""
        warm, ramp = self.warmup_epochs * steps_per_epoch, self.ramp_epochs * steps_per_epoch
        if step < warm:
            frac = 0.0
        else:
            frac = 1.0 if ramp == 0 else min(1.0, (step - warm + 1) / ramp)
        frac = RAMPS[self.ramp](frac, self.ramp_start)
        return (self.eps * frac, self.kappa_start + frac * (self.kappa_end - self.kappa_start),
                self.beta_start + frac * (self.beta_end - self.beta_start))


@dataclass(frozen=True)
class EpochRecord:
    """One epoch of ``train_certified``: the radius, kappa and beta at its last step, the mean
    natural and robust losses over its samples (robust: None in the warm-up), the fraction of
    its samples misclassified and not proved by the training bound (some m̲_j < 0; None in the
    warm-up), the steps skipped for a non-finite loss or gradient, and its wall-clock seconds."""

    epoch: int
    eps: float
    kappa: float
    beta: float
    natural_loss: float
    robust_loss: float | None
    natural_error: float
    robust_error: float | None
    skipped_steps: int
    seconds: float


# ---------------------------------------------------------------- parameters -> graph constants
def _storage_values(t):
    """The whole float64 storage ``t`` views, as a flat tensor (shares it)."""
    st = t.untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(st, 0, (st.nbytes() // t.element_size(),), (1,))


def _tensors_of(value):
    """[(position, tensor)] of a node parameter: a tensor, or a tuple/list holding some."""
    if isinstance(value, torch.Tensor):
        return [(None, value)]
    if isinstance(value, (tuple, list)):
        return [(j, v) for j, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return []


def _probe(model, seed):
    """A copy of ``model`` in eval mode whose parameters hold distinct random values."""
    probe = copy.deepcopy(model).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in probe.parameters():
            if p.is_floating_point():
                p.copy_((0.25 + 0.5 * torch.rand(p.shape, generator=gen, dtype=torch.float64)).to(p))
    return probe


@dataclass(frozen=True)
class _Slot:
    """Where a graph constant comes from: parameter ``name`` viewed as (shape, stride, offset)
    of its contiguous flattening, or (name None) the fixed value ``value``."""

    name: str | None
    shape: tuple = ()
    stride: tuple = ()
    offset: int = 0
    value: torch.Tensor | None = None


class _Binding:
    """The graph of a model with every constant tied to the parameter it views (module
    docstring). ``graph_at(model, dtype)``: the graph with constants from the live parameters
    (autograd flows to them), other floating constants cast to ``dtype``."""

    def __init__(self, model, example):
        a, b = _probe(model, 1), _probe(model, 2)
        ex = example[:1].detach().to(torch.float64)
        ga, gb = trace(a, ex), trace(b, ex)
        if [(n.op, n.inputs, n.shape) for n in ga.nodes] != [(n.op, n.inputs, n.shape) for n in gb.nodes]:
            raise ValueError("model: its traced graph changes with the values of its parameters; certified "
                             "training needs one graph for all weights")
        pa = {n: p.detach().to(torch.float64).reshape(-1) for n, p in a.named_parameters()}
        pb = {n: p.detach().to(torch.float64).reshape(-1) for n, p in b.named_parameters()}
        self.graph = ga
        self.slots = {}  # (node id, key, position) -> _Slot
        for i, (na, nb) in enumerate(zip(ga.nodes, gb.nodes)):
            for key, value in na.params.items():
                other = dict(_tensors_of(nb.params[key]))
                for j, t in _tensors_of(value):
                    if t.is_floating_point():
                        self.slots[(i, key, j)] = self._slot(i, na, key, t, other[j], pa, pb)
        self._cast = {}

    @staticmethod
    def _slot(i, node, key, ta, tb, pa, pb):
        base = _storage_values(ta) if ta.dtype == torch.float64 else None
        hits = [] if base is None else [n for n, v in pa.items() if v.numel() == base.numel() and torch.equal(v, base)]
        if len(hits) == 1:
            s = _Slot(hits[0], tuple(ta.shape), tuple(ta.stride()), ta.storage_offset())
            flat = pb[s.name]
            view = torch.as_strided(flat, s.shape, s.stride, flat.storage_offset() + s.offset)
            if torch.equal(view, tb):
                return s
        elif not hits and ta.shape == tb.shape and torch.equal(ta, tb):
            return _Slot(None, value=ta)
        raise ValueError(f"model: {key!r} of node {i} {node.name!r} (operator {node.op!r}) is computed from the "
                         f"parameters but is not a view of one parameter; certified training cannot carry "
                         f"gradients through it (use the parameter directly, e.g. no eval-mode batch norm)")

    def graph_at(self, model, dtype):
        params = dict(model.named_parameters())
        flat = {}
        out = copy.copy(self.graph)
        nodes = []
        for i, node in enumerate(self.graph.nodes):
            new = {}
            for key, value in node.params.items():
                parts = _tensors_of(value)
                if not any((i, key, j) in self.slots for j, _ in parts):
                    new[key] = value
                    continue
                got = {j: self._tensor(i, key, j, params, flat, dtype) for j, _ in parts if (i, key, j) in self.slots}
                new[key] = got[None] if None in got else type(value)(got.get(j, v) for j, v in enumerate(value))
            nodes.append(dataclasses.replace(node, params=new))
        out.nodes = nodes
        out.attention = list(self.graph.attention)
        return out

    def _tensor(self, i, key, j, params, flat, dtype):
        s = self.slots[(i, key, j)]
        if s.name is None:
            k = (i, key, j, dtype)
            if k not in self._cast:
                self._cast[k] = s.value.to(dtype)
            return self._cast[k]
        if s.name not in flat:
            f = params[s.name].to(dtype).reshape(-1)
            flat[s.name] = f
        f = flat[s.name]
        return torch.as_strided(f, s.shape, s.stride, f.storage_offset() + s.offset)


_BINDINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _binding(model, x):
    """The model's ``_Binding`` for inputs shaped like ``x`` (kept while the model lives and
    its parameters keep their names, shapes and dtypes)."""
    key = (tuple(x.shape[1:]), x.device, current_softmax_form(),
           tuple((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()))
    per_model = _BINDINGS.setdefault(model, {})
    if key not in per_model:
        binding = _Binding(model, x)
        _check_reproduces(binding, model, x)
        per_model.clear()  # an older architecture of this object is not coming back
        per_model[key] = binding
    return per_model[key]


def _check_reproduces(binding, model, x):
    """The rebound graph must compute the model's logits (float64, at ``x``)."""
    m64 = copy.deepcopy(model).double().eval()
    x64 = x[:4].detach().to(torch.float64)
    with torch.no_grad():
        want = logits_of(m64(x64)).reshape(len(x64), -1)
        got = binding.graph_at(m64, torch.float64).values(x64.unsqueeze(1), lifted=True)[-1].reshape(len(x64), -1)
    err = (got - want).abs().max().item()
    if not err <= 1e-6 * (1 + want.abs().max().item()):
        raise ValueError(f"model: the graph rebuilt from its parameters does not reproduce its logits (max "
                         f"difference {err:.3g}); certified training cannot bind this model's weights")


# ---------------------------------------------------------------- differentiable bounds
def _finite_grad(t):
    """t, with non-finite entries of its gradient set to 0 (an infinite bound carries no
    information, and 0·inf in the chain rule must not poison the weights)."""
    if t.requires_grad:
        t.register_hook(_finite)
    return t


def _finite(g):
    # the CPU skips the identity (all_finite answers False on a GPU, where reading it would stall)
    if all_finite(g):
        return g
    return torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)


def _all_below(l, u):
    """True only if l < u everywhere, tested where ``all_finite`` tests (the CPU): for floats
    u - l > 0 exactly when u > l (gradual underflow; a flushed difference or NaN answers False)."""
    return not host.deferring(l) and (l.numel() == 0 or bool((u - l).min() > 0))


def _clip(t, lo, hi):
    """t clamped to [lo, hi] (None: unbounded), skipped on the CPU where t lies in it already:
    clamp's gradient passes inside the closed range, so the skip changes neither values nor
    gradients, and one min or max costs a third of a clamp and its backward (2026-12-08)."""
    cpu = not host.deferring(t)
    if t.numel() == 0:
        return t
    if lo is not None and not (cpu and bool(t.min() >= lo)):
        t = t.clamp(min=lo)
    if hi is not None and not (cpu and bool(t.max() <= hi)):
        t = t.clamp(max=hi)
    return t


def _settle(node, l, u, dtype):
    """Bounds cast to ``dtype``, NaN as no information, clipped to the node's and its
    operator's value ranges (as ``certify.crown.propagate`` does)."""
    l, u = l.to(dtype), u.to(dtype)
    # on the CPU, skip the steps that are the identity here, values and gradients alike
    # (nan_to_num of finite entries, maximum(l, u) of l < u, which passes u's gradient only):
    # their backward passes took about 40% of an IBP training step (4-block LayerNorm ViT,
    # batch 128, torch profiler, 2026-12-07), and isfinite(l).all() itself another 20%
    # (2026-12-08), hence the tests by one reduction each. Reading a test synchronises, once
    # per node on a GPU, so there the steps are always taken and the tests are not computed.
    if not all_finite(l):
        l = torch.nan_to_num(l, nan=-torch.inf)
    if not all_finite(u):
        u = torch.nan_to_num(u, nan=torch.inf)
    for lo, hi in (node.operator.value_range, node.value_range):
        l, u = _clip(l, lo, hi), _clip(u, lo, hi)
    if not _all_below(l, u):
        u = torch.maximum(l, u)
    return _finite_grad(l), _finite_grad(u)


def _interval_state(graph, lo, hi, centre, dtype):
    """IBP over ``graph`` (lifted boxes (B, 1, ...)) in ``dtype`` with autograd: a
    ``crown.BoundState`` (plain arithmetic) holding every node's bounds and softmax shifts."""
    state = crown.BoundState(graph, lo, hi, _PLAIN)
    values = None
    for i in range(1, len(graph.nodes)):
        node = graph.nodes[i]
        if node.operator.anchor is not None:
            if values is None:
                with torch.no_grad():
                    values = graph.values(centre, lifted=True)
            state.consts[i] = node.operator.anchor(*[values[j] for j in node.inputs])
        l, u = crown.ibp_node(state, i)
        state.bounds[i] = _settle(node, l, u, dtype)
    return state


def _model_dtype(model):
    t = next((p for p in model.parameters() if p.is_floating_point()), None)
    return torch.get_default_dtype() if t is None else t.dtype


def margin_bounds(model, x, y, eps, bound="ibp", *, beta=1.0, domain=DOMAIN):
    """Differentiable lower bounds m̲ (B, K) of the margins z_y - z_j over the L∞ box of radius
    ``eps`` around ``x`` clipped to ``domain`` (m̲_y = 0): "ibp", l_y - u_j from the logits'
    interval bounds (Gowal et al. 2018); "crown-ibp", beta·(CROWN's backward bound on the IBP
    intermediate bounds) + (1 - beta)·IBP (Zhang et al. 2020). Autograd reaches the model's
    parameters. Plain arithmetic, not sound outward rounding (module docstring): a training
    signal, not a certificate (certify.verify gives those)."""
    if bound not in BOUNDS:
        raise ValueError(f"bound: expected one of {', '.join(BOUNDS)}, got {bound!r}")
    if not _unit(beta):
        raise ValueError(f"beta: expected a float in [0, 1], got {beta!r}")
    eps, domain, x, dtype, binding = _bound_inputs(model, x, eps, domain)
    return _margins(binding, model, x, y, eps, (bound, beta), domain, dtype)


def _bound_inputs(model, x, eps, domain):
    """(eps, domain, x, dtype, binding) checked: x as a batch in the model's dtype, detached;
    ``model`` a module (ValueError naming the argument otherwise)."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    eps = check_eps(eps)
    domain = None if domain is None else check_domain(domain)
    x = tensor_of(x)
    check_images(model, x, domain)
    dtype = _model_dtype(model)
    image = getattr(model, "image", None)
    if image is not None and x.dim() == len(tuple(image)):
        x = x.unsqueeze(0)
    x = x.detach().to(dtype)
    return eps, domain, x, dtype, _binding(model, x)


def _margins(binding, model, x, y, eps, mixing, domain, dtype):
    """Margin lower bounds (B, classes), 0 at the label; ``mixing`` (bound, beta): "ibp", or
    "crown-ibp" mixed with IBP by beta."""
    bound, beta = mixing
    graph = binding.graph_at(model, dtype)
    out = graph.nodes[graph.output].shape
    classes = math.prod(out[1:])
    y = check_labels(y, x.shape[0], classes, x.device)
    lo, hi = input_box(x, eps, domain)
    lift = lambda t: t.unsqueeze(1)  # noqa: E731  (the traced batch axis)
    with torch.enable_grad():
        state = _interval_state(graph, lift(lo), lift(hi), lift(x), dtype)
        l, u = (t.reshape(len(x), classes) for t in state.bounds[graph.output])
        m = l.gather(1, y[:, None]) - u
        if bound == "crown-ibp" and beta > 0:
            C = margin_spec(y, classes, torch.float64).reshape(len(x), classes, *out)
            g64 = graph if dtype == torch.float64 else binding.graph_at(model, torch.float64)
            c = _crown_ibp(g64, state, C)
            ok = torch.isfinite(c).all(1)
            if not bool(ok.all()):
                # rows where an IBP bound overflowed (e.g. exp underflow in a softmax) give -inf
                # or NaN, and 0·inf in their chain rule would poison every weight's gradient:
                # bound the finite rows again on their own, IBP alone for the others
                rows = ok.nonzero().squeeze(1)
                c = torch.zeros_like(m, dtype=torch.float64)
                if len(rows):
                    c = c.index_put((rows,), _crown_ibp(g64, state, C, rows))
            c = c.to(dtype)
            m = torch.where(ok[:, None], beta * c + (1 - beta) * m, m)
    return m.scatter(1, y[:, None], 0.0)


def _crown_ibp(graph, state, C, rows=None):
    """CROWN's lower bound of C·logits (B, S) with the IBP bounds of ``state`` for every
    relaxation (of the batch ``rows`` only, when given), run in float64 on the float64
    ``graph`` (the operators' relaxation planes are float64)."""
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
    lo, hi = state.bounds[0]
    s64 = crown.BoundState(graph, pick(lo).to(torch.float64), pick(hi).to(torch.float64), _PLAIN)
    s64.bounds = {i: (pick(l).to(torch.float64), pick(u).to(torch.float64)) for i, (l, u) in state.bounds.items()}
    s64.consts = {i: pick(c) for i, c in state.consts.items()}
    return crown.backward(s64, graph.output, pick(C))


@dataclass(frozen=True)
class NodeWidth:
    """One node of the graph: its position, name (the module path it was traced from),
    operator, and the largest and median width u - l of its IBP box over all elements and
    images (inf where a bound overflowed)."""

    index: int
    name: str
    operator: str
    max_width: float
    median_width: float


@dataclass(frozen=True)
class IntervalWidths:
    """``interval_widths``' result: the radius, the model's dtype the boxes were computed in,
    the number of images, the input box's largest width, and one ``NodeWidth`` per node in
    graph order (the input excluded). Plain arithmetic (``assumptions``): the training signal's
    boxes, not certified bounds."""

    eps: float
    dtype: str
    images: int
    input_width: float
    nodes: tuple
    assumptions: str = ("interval bounds in plain arithmetic in the model's dtype, as certified training "
                        "computes them (certify.training); not outward rounded: no certificate")

    def first_above(self, width: float):
        """The first node whose largest width exceeds ``width`` (None if none does)."""
        return next((n for n in self.nodes if not n.max_width <= width), None)


def interval_widths(model, x, eps, *, domain=DOMAIN) -> IntervalWidths:
    """The width of every node's IBP box over the L∞ ball of radius ``eps`` around the images
    ``x`` (clipped to ``domain``): the boxes IBP training and CROWN-IBP's relaxations are built
    on (``margin_bounds``), in the model's dtype. Shows where the bounds of a model grow
    (docs/certify/training.md: the standard LayerNorm's 1/std makes every box after the first
    attention block of mnist-vit4-ln as wide as its value range at eps 1e-4)."""
    eps, domain, x, dtype, binding = _bound_inputs(model, x, eps, domain)
    graph = binding.graph_at(model, dtype)
    lo, hi = input_box(x, eps, domain)
    with torch.no_grad():
        state = _interval_state(graph, lo.unsqueeze(1), hi.unsqueeze(1), x.unsqueeze(1), dtype)
    rows = []
    for i in range(1, len(graph.nodes)):
        node = graph.nodes[i]
        l, u = state.bounds[i]
        w = (u.to(torch.float64) - l.to(torch.float64)).reshape(-1)
        w = torch.where(torch.isnan(w), torch.inf, w)
        rows.append(NodeWidth(i, node.name, node.op, float(w.max()), float(w.median())))
    return IntervalWidths(eps, str(dtype).removeprefix("torch."), len(x), float((hi - lo).max()), tuple(rows))


def robust_loss(model, x, y, eps, bound="ibp", *, beta=1.0, domain=DOMAIN):
    """Mean over the batch of CE(-m̲, y), m̲ = ``margin_bounds(model, x, y, eps, bound, beta=beta,
    domain=domain)``: the cross-entropy of the worst-case logits, an upper bound of the
    cross-entropy at every point of the box (Gowal et al. 2018; Zhang et al. 2020 for
    "crown-ibp"). Differentiable in the model's parameters; plain arithmetic (a training
    signal, not a certificate)."""
    x = tensor_of(x)
    m = margin_bounds(model, x, y, eps, bound, beta=beta, domain=domain)
    y = check_labels(y, m.shape[0], m.shape[1], m.device)
    return F.cross_entropy(-m, y)


# ---------------------------------------------------------------- the training loop
def _robust_box(model, x, y, eps, options):
    """(centre, radius) of the box the robust term bounds: (x, eps), or with box_fraction
    λ < 1 a PGD point of the eps box pulled to within (1 - λ)·eps of x, and λ·eps, so that the
    small box (clipped to the domain) lies in the eps box (Mueller et al. 2023, SABR)."""
    frac = options.box_fraction
    if frac >= 1 or eps == 0:
        return x, eps
    lo, hi = input_box(x, eps, options.domain)
    was_training = model.training
    model.eval()
    step = 2.5 * eps / options.attack_steps  # Madry et al. 2018's step for a few-step attack
    xa = pgd_cross_entropy(model, y, (lo, hi), step, options.attack_steps)
    model.train(was_training)
    inner = (1 - frac) * eps
    return torch.minimum(torch.maximum(xa, x - inner), x + inner).detach(), frac * eps


def translated(x, shift, generator=None):
    """Each image of x (..., H, W) moved by its own random offsets dy, dx drawn uniformly from
    [-shift, shift]: out[..., i, j] = x[..., clamp(i + dy), clamp(j + dx)], the edge rows and
    columns replicated where the image moves off them, so every value is one of x's."""
    if shift == 0:
        return x
    h, w = x.shape[-2:]
    b = x.shape[0]
    dy = torch.randint(-shift, shift + 1, (b,), generator=generator).to(x.device)
    dx = torch.randint(-shift, shift + 1, (b,), generator=generator).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device)).clamp(0, h - 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device)).clamp(0, w - 1)
    lead = (b,) + (1,) * (x.dim() - 3)
    out = torch.gather(x, -2, rows.reshape(*lead, h, 1).expand(x.shape))
    return torch.gather(out, -1, cols.reshape(*lead, 1, w).expand(x.shape))


def train_certified(model, x, y, options=CertifiedTraining(), progress=None):
    """Train ``model`` in place on (x, y) by ``options`` (a ``CertifiedTraining``): Adam at
    ``options.learning_rate(epoch)``, batches of ``batch_size`` in an order drawn from ``seed``; ``warmup_epochs`` of
    natural cross-entropy, then kappa·CE(z(x), y) + (1 - kappa)·CE(-m̲, y) with m̲ the
    ``options.bound`` margins at the scheduled eps (module docstring; Gowal et al. 2018,
    Zhang et al. 2020). A step whose loss or gradient is not finite is skipped (counted in the history).
    ``progress``: called after every step with (epoch, step, eps, natural loss, robust loss or
    None in the warm-up). Returns (model in eval mode, history: a tuple of ``EpochRecord``).
    The natural loss runs the model in training mode; the bounds run on its traced graph
    (eval mode). Deterministic for a given seed, model and data."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(options, CertifiedTraining):
        raise ValueError(f"options: expected a certify.CertifiedTraining, got {type(options).__name__}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a callable taking (epoch, step, eps, natural loss, robust loss), "
                         f"got {progress!r}")
    x = tensor_of(x)
    check_images(model, x, options.domain)
    if options.shift and x.dim() < 3:
        raise ValueError(f"options.shift: translating needs images (B, ..., H, W), got x of shape {tuple(x.shape)}; "
                         f"set shift=0")
    dtype = _model_dtype(model)
    x = x.detach().to(dtype)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("model: has no parameters that require grad")
    binding = _binding(model, x)
    out = binding.graph.nodes[binding.graph.output].shape
    y = check_labels(y, x.shape[0], math.prod(out[1:]), x.device)
    n, bs = x.shape[0], options.batch_size
    spe = math.ceil(n / bs)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=options.lr)
    gen = torch.Generator().manual_seed(options.seed)
    history, step = [], 0
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        torch.manual_seed(options.seed)
        for epoch in range(options.epochs):
            start = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = options.learning_rate(epoch)
            perm = torch.randperm(n, generator=gen).to(x.device)
            sums = dict(nat=0.0, rob=0.0, nat_err=0, rob_err=0, robust_n=0, skipped=0)
            eps = kappa = beta = 0.0
            for k in range(spe):
                idx = perm[k * bs:(k + 1) * bs]
                xb, yb = translated(x[idx], options.shift, gen), y[idx]
                eps, kappa, beta = options.schedule(step, spe)
                model.train()
                z = logits_of(model(xb)).reshape(len(xb), -1)
                nat = F.cross_entropy(z, yb)
                rob = None
                loss = nat
                if eps > 0 or step >= options.warmup_epochs * spe:
                    centre, radius = _robust_box(model, xb, yb, eps, options)
                    m = _margins(binding, model, centre, yb, radius, (options.bound, beta), options.domain, dtype)
                    rob = F.cross_entropy(-m, yb)
                    loss = kappa * nat + (1 - kappa) * rob
                    sums["rob"] += rob.item() * len(xb)
                    sums["robust_n"] += len(xb)
                    sums["rob_err"] += int((m.detach() < 0).any(1).sum())
                sums["nat"] += nat.item() * len(xb)
                sums["nat_err"] += int((z.detach().argmax(1) != yb).sum())
                opt.zero_grad()
                if torch.isfinite(loss):
                    loss.backward()
                if torch.isfinite(loss) and all(p.grad is None or bool(torch.isfinite(p.grad).all())
                                                for p in model.parameters()):
                    if options.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), options.grad_clip)
                    opt.step()
                else:
                    sums["skipped"] += 1
                if progress is not None:
                    progress(epoch, step, eps, nat.item(), None if rob is None else rob.item())
                step += 1
            robust = sums["robust_n"] > 0
            history.append(EpochRecord(
                epoch=epoch, eps=eps, kappa=kappa, beta=beta if options.bound == "crown-ibp" else 0.0,
                natural_loss=sums["nat"] / n, robust_loss=sums["rob"] / sums["robust_n"] if robust else None,
                natural_error=sums["nat_err"] / n, robust_error=sums["rob_err"] / sums["robust_n"] if robust else None,
                skipped_steps=sums["skipped"], seconds=time.perf_counter() - start))
    model.eval()
    return model, tuple(history)
