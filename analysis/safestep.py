"""Safe step sizes from the softmax Taylor radius: a controller, a guard and a torch.optim wrapper.

Along the optimizer's actual update p, the logits move as z + t J_z p; cross-entropy's Taylor
expansion in t converges for |t| < rho(p) >= pi / max_x Delta(J_z p)(x) (analysis.ghosts,
"pi" bound; the minimum over the batch). In parameter units rho_a = rho(p) ||p||, the
normalised step is r = ||p|| / rho_a and the controller applies s p with
s = min(1, r_target rho_a / ||p||) = min(1, r_target rho(p)).

- :class:`SafeStepController`: pure (optax-like) ``init(params) -> state`` and
  ``update(state, logits, slopes, update_norm) -> (scale, state)``; no torch.nn involved.
- :func:`logit_slopes`: (z, J_z p) by one forward-mode JVP (forward-AD duals) at given
  parameters, with BatchNorm buffers copied (running stats untouched), dropout off, the
  caller's RNG state restored, and the math SDPA backend (fused kernels have no forward AD).
- :class:`SafeStepGuard`: records the batches a model trains on and scales the update of an
  optimizer it does not own (``before_step()`` / ``after_step()``, or ``attach(optimizer)``
  through torch's optimizer step hooks); the training-framework callbacks use it.
- :class:`SafeStep`: a torch.optim.Optimizer that wraps any optimizer (shares its
  param_groups, so LR schedulers keep working) and applies the controller after each step.
Batches: every forward of the model run with gradients enabled since the last step (any
train/eval mode); with gradient accumulation the radius is the minimum over all of them
(``accumulation="all"``) or, cheaper and weaker, over the last one (``"last"``).
Assumption: the logits are the model output, its ``.logits`` / ``["logits"]`` (dicts,
Hugging Face ``ModelOutput``), or ``logits_fn(output)``; last dim = classes.
Source: Sao, "Ghosts of Softmax" (arXiv:2603.13552; docs/report/references.bib, sao2026ghosts);
docs/mathematics.md section 2.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import torch.autograd.forward_ad as fwAD
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parametrize

from softcert.analysis.ghosts import radius_lower_bound_batch
from softcert.kernels.floating import U64

__all__ = ["SafeStepState", "SafeStepController", "SafeStepWarning", "logit_slopes", "measurement_mode", "pi_rho",
           "SafeStepGuard", "SafeStep", "ACCUMULATION"]

ACCUMULATION = ("all", "last")


class SafeStepWarning(UserWarning):
    """SafeStep could not measure a step (no batch recorded), so the update went unscaled."""


@dataclass(frozen=True)
class SafeStepState:
    """What the controller saw at its last update (nan before the first one).

    ``measured`` is False when the step was applied without a radius (no batch recorded);
    ``stale`` is True when the step reused the last measured rho_a (``reuse_steps``)."""

    step: int = 0
    rho_a: float = math.nan  # batch radius along the update, in parameter-norm units
    update_norm: float = math.nan  # ||p|| of the proposed (unscaled) update
    ratio: float = math.nan  # r = ||p|| / rho_a of the proposed update
    scale: float = 1.0  # factor applied to the update
    method: str = "pi"
    measured: bool = True
    batches: int = 0  # micro-batches the radius was taken over
    stale: bool = False


def pi_rho(slopes) -> float:
    """min over rows of pi / (max_k a_k - min_k a_k), rounded down: the "pi" radius of the
    whole batch in multiples of p, as ``analysis.ghosts.pi_radius_batch(a).min()``, with the
    spreads subtracted in float64 and one scalar division (the controller's per-step cost).

    The margin (1 - 64 n u) and the final step towards 0 are those of pi_radius_batch; the
    maximum spread gives the minimum radius because x -> pi / x and rounding are monotone.
    """
    a = torch.as_tensor(slopes).detach()
    if a.ndim != 2 or a.shape[1] < 2:
        raise ValueError(f"slopes must have shape (batch, classes>=2), got {tuple(a.shape)}")
    spread = float((a.amax(dim=1).to(torch.float64) - a.amin(dim=1).to(torch.float64)).max())
    if not math.isfinite(spread):
        raise ValueError("slopes must be finite (no NaN/inf)")
    if spread <= 0.0:
        return math.inf
    try:
        w = math.pi / spread
    except OverflowError:  # pragma: no cover - Python floats return inf, kept for clarity
        w = math.inf
    if math.isinf(w):  # subnormal spread: the real quotient still exceeds the largest float
        w = 1.7976931348623157e308
    return math.nextafter(w * (1.0 - 64 * a.shape[1] * U64), 0.0)


@dataclass(frozen=True)
class SafeStepController:
    """Pure step-size rule: scale = min(1, target_ratio * rho_a / ||p||).

    ``slopes`` are J_z p along the unnormalised update p, so the radius in multiples of p is
    rho(p) = lower bound of :func:`analysis.ghosts.radius_lower_bound_batch` (minimum over the
    batch) and rho_a = rho(p) ||p||.
    """

    target_ratio: float = 1.0
    method: str = "pi"

    def __post_init__(self):
        if not (self.target_ratio > 0 and math.isfinite(self.target_ratio)):
            raise ValueError(f"target_ratio must be positive and finite, got {self.target_ratio}")
        if self.method not in ("pi", "closed", "root"):
            raise ValueError(f"method must be 'pi', 'closed' or 'root', got {self.method!r}")

    def init(self, params=None) -> SafeStepState:
        return SafeStepState(method=self.method)

    def update(self, state: SafeStepState, logits, slopes, update_norm: float, batches: int = 1):
        update_norm = float(update_norm)
        if not (update_norm >= 0 and math.isfinite(update_norm)):
            raise ValueError(f"update_norm must be finite and >= 0, got {update_norm}")
        a = torch.as_tensor(slopes).detach()
        a = a.reshape(-1, a.shape[-1])
        if self.method == "pi":
            rho_p = pi_rho(a)
        else:
            z = torch.as_tensor(logits).detach().reshape(a.shape)
            rho_p = float(radius_lower_bound_batch(z, a, self.method).min())
        if update_norm == 0.0 or math.isinf(rho_p):
            ratio, scale = 0.0, 1.0
            rho_a = math.inf if update_norm == 0.0 else rho_p * update_norm
        else:
            rho_a = rho_p * update_norm
            ratio = 1.0 / rho_p
            scale = min(1.0, self.target_ratio * rho_p)
        new = replace(state, step=state.step + 1, rho_a=rho_a, update_norm=update_norm, ratio=ratio,
                      scale=scale, measured=True, batches=batches, stale=False)
        return scale, new


def _measured_modules(model: nn.Module):
    dropouts, mhas, bns = [], [], []
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            dropouts.append(m)
        elif isinstance(m, nn.MultiheadAttention):
            mhas.append(m)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            bns.append(m)
    return dropouts, mhas, bns


@contextlib.contextmanager
def measurement_mode(model: nn.Module, modules=None):
    """Dropout off, MultiheadAttention dropout 0, BatchNorm without running-stat updates (it
    still normalises by batch statistics in training mode), math SDPA backend, RNG restored.
    ``modules``: the (dropouts, attentions, batchnorms) lists, if the caller cached them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dropouts, mhas, bns = modules if modules is not None else _measured_modules(model)
    was = [m.training for m in dropouts]
    p_mha = [m.dropout for m in mhas]
    bns = [m for m in bns if m.training]
    track = [m.track_running_stats for m in bns]
    try:
        for m in bns:
            m.track_running_stats = False
        for m in dropouts:
            m.eval()
        for m in mhas:
            m.dropout = 0.0
        with torch.random.fork_rng(devices=[]), sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        for m, w in zip(dropouts, was):
            m.train(w)
        for m, p in zip(mhas, p_mha):
            m.dropout = p
        for m, t in zip(bns, track):
            m.track_running_stats = t


def _logits_of(out, logits_fn):
    """The logits tensor of a model output: ``logits_fn(out)``, the tensor itself, or
    ``out.logits`` / ``out["logits"]`` (Hugging Face ModelOutput, dicts)."""
    if logits_fn is not None:
        out = logits_fn(out)
    elif not isinstance(out, torch.Tensor):
        found = getattr(out, "logits", None)
        if found is None and isinstance(out, Mapping):
            found = out.get("logits")
        if found is None:
            raise ValueError(
                f"logits_fn: the model returns {type(out).__name__} without a .logits attribute or "
                "'logits' key; pass logits_fn=... (a function from the model output to the logits)")
        out = found
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"logits_fn must give a tensor of logits, got {type(out).__name__}")
    return out


class _Slots:
    """Where each parameter lives (module, attribute, canonical name), tied ones included, so
    a JVP can swap in dual tensors without functional_call's per-call bookkeeping."""

    def __init__(self, model: nn.Module):
        canon = {id(p): n for n, p in model.named_parameters()}
        seen, self.slots = set(), []
        self.parametrized = False
        for mod in model.modules():
            if parametrize.is_parametrized(mod):
                self.parametrized = True  # parametrizations compute weights: leave them to functional_call
            for pname, p in mod._parameters.items():
                if p is not None and id(p) in canon and (id(mod), pname) not in seen:
                    seen.add((id(mod), pname))
                    self.slots.append((mod, pname, canon[id(p)]))
        self.signature = self._signature(model)

    @staticmethod
    def _signature(model):
        return [(n, id(p)) for n, p in model.named_parameters(remove_duplicate=False)]

    def valid(self, model) -> bool:
        """The model still has these parameter objects under these names (ties included)."""
        return self._signature(model) == self.signature

    @contextlib.contextmanager
    def swapped(self, tensors: dict):
        saved = []
        try:
            for mod, pname, name in self.slots:
                saved.append((mod, pname, mod._parameters[pname]))
                mod._parameters[pname] = tensors[name]
            yield
        finally:
            for mod, pname, p in saved:
                mod._parameters[pname] = p


def logit_slopes(model: nn.Module, tangents: dict, args=(), kwargs=None, params=None, logits_fn=None,
                 _cache=None):
    """(z, a) with z the logits and a = J_z p by one forward-mode JVP (dual numbers); p given per parameter name.

    ``params``: name -> tensor to evaluate at (default: the model's current parameters);
    parameters missing from ``tangents`` get a zero tangent. BatchNorm running statistics are
    not updated; the model keeps its train/eval mode (BatchNorm in training normalises by
    batch statistics, as the training step does). Outputs that are not tensors: see
    :func:`_logits_of` (``.logits``, ``["logits"]`` or ``logits_fn``).
    """
    kwargs = kwargs or {}
    named = dict(model.named_parameters())
    primal = {k: (params[k] if params is not None and k in params else v).detach() for k, v in named.items()}
    # _cache: (slots, module lists) kept by SafeStepGuard across steps
    slots, modules = _cache if _cache is not None else (_Slots(model), None)
    with measurement_mode(model, modules), fwAD.dual_level():
        duals = {k: (fwAD.make_dual(primal[k], tangents[k].detach()) if k in tangents else primal[k])
                 for k in primal}
        if not slots.parametrized:
            with slots.swapped(duals):
                out = model(*args, **kwargs)
        else:
            out = functional_call(model, duals, args, kwargs, strict=False)
        z, a = fwAD.unpack_dual(_logits_of(out, logits_fn))
        if a is None:  # the output does not depend on the parameters
            a = torch.zeros_like(z)
    return z.detach(), a.detach()


class SafeStepGuard:
    """Scale each update of an optimizer by min(1, r rho_a / ||p||), without wrapping it.

    ``guard = SafeStepGuard(model)``; then either call ``guard.before_step(params)`` before and
    ``guard.after_step()`` after each ``optimizer.step()``, or ``guard.attach(optimizer)`` once
    (torch's optimizer step hooks do the same). Batches: every forward of ``model`` with
    gradients enabled since the last step (train or eval mode), recorded by a forward pre-hook;
    ``accumulation="all"`` takes the radius over all of them (gradient accumulation), ``"last"``
    over the last one only (one JVP per step; weaker: the other micro-batches are not checked).
    With no batch recorded the update is applied unscaled and a :class:`SafeStepWarning` says so.
    ``history=True`` keeps the :class:`SafeStepState` of every step in ``history``.

    ``reuse_steps=k > 0`` is an explicit, weaker and cheaper variant: for up to k steps after a
    measurement, a step with ||p|| <= reuse_margin * target_ratio * rho_a(last measured) is
    applied unscaled without a JVP (``stale=True`` in its state); a step that could bind is
    always measured. It assumes rho_a (a distance in parameter space) does not shrink by more
    than 1/reuse_margin within k steps; the failure rate of that assumption is measured by
    ``softcert ghosts sweep --stale`` (docs/ghosts/sweep_stale/). Default 0: every step measured.
    """

    def __init__(self, model: nn.Module, target_ratio: float = 1.0, method: str = "pi", logits_fn=None,
                 accumulation: str = "all", history: bool = False, reuse_steps: int = 0,
                 reuse_margin: float = 0.5):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if accumulation not in ACCUMULATION:
            raise ValueError(f"accumulation must be one of {ACCUMULATION}, got {accumulation!r}")
        if logits_fn is not None and not callable(logits_fn):
            raise ValueError(f"logits_fn must be callable, got {type(logits_fn).__name__}")
        if not (isinstance(reuse_steps, int) and reuse_steps >= 0):
            raise ValueError(f"reuse_steps must be an int >= 0, got {reuse_steps!r}")
        if not (0 < reuse_margin <= 1):
            raise ValueError(f"reuse_margin must be in (0, 1], got {reuse_margin!r}")
        self.model = model
        self.logits_fn = logits_fn
        self.accumulation = accumulation
        self.reuse_steps, self.reuse_margin = reuse_steps, reuse_margin
        self._since = 0  # steps since the last measurement
        self._rho_last = math.nan  # last measured rho_a
        self.controller = SafeStepController(target_ratio, method)
        self.ctrl_state = self.controller.init()
        self.history = [] if history else None
        self._batches = []
        self._measuring = False
        self._old = None
        self._params = None
        self._hooks = [model.register_forward_pre_hook(self._record, with_kwargs=True)]
        self._slots = _Slots(model)
        self._modules = _measured_modules(model)

    def _record(self, module, args, kwargs):
        # a forward without gradients (evaluation, our own JVP) is not part of the update
        if self._measuring or not torch.is_grad_enabled():
            return
        if self.accumulation == "last":
            self._batches.clear()
        self._batches.append((args, kwargs))

    # logged quantities
    @property
    def last_rho_a(self) -> float:
        return self.ctrl_state.rho_a

    @property
    def last_update_norm(self) -> float:
        return self.ctrl_state.update_norm

    @property
    def last_ratio(self) -> float:
        return self.ctrl_state.ratio

    @property
    def last_scale(self) -> float:
        return self.ctrl_state.scale

    @torch.no_grad()
    def before_step(self, params):
        """Remember the parameters before the optimizer moves them (``params``: an iterable)."""
        self._params = [p for p in params if p.requires_grad or p.grad is not None]
        self._old = torch._foreach_mul([p.detach() for p in self._params], 1.0)  # one fused copy

    def after_step(self, inputs=None) -> float:
        """Measure the update made since :meth:`before_step` and scale it; returns the scale.

        ``inputs``: the batch (a tensor or a tuple of positional arguments), overriding the
        recorded ones."""
        scale = self._after_step(inputs)
        if self.history is not None:
            self.history.append(self.ctrl_state)
        return scale

    @torch.no_grad()
    def _after_step(self, inputs=None) -> float:
        if self._old is None:
            raise ValueError("after_step: call before_step(params) first")
        params, old = self._params, self._old
        self._params = self._old = None
        batches, self._batches = self._batches, []
        if inputs is not None:
            batches = [((inputs if isinstance(inputs, tuple) else (inputs,)), {})]
        delta = torch._foreach_sub([p.detach() for p in params], old)
        norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(delta)).double())) if delta else 0.0
        if not batches:
            warnings.warn(
                "SafeStep: no training batch was recorded since the last step (no forward of the model "
                "with gradients enabled), so this update was applied unscaled; run the forward pass "
                "before step(), or pass step(inputs=...)", SafeStepWarning, stacklevel=4)
            self.ctrl_state = replace(self.ctrl_state, step=self.ctrl_state.step + 1, update_norm=norm, scale=1.0,
                                      ratio=math.nan, rho_a=math.nan, measured=False, batches=0, stale=False)
            return 1.0
        if norm == 0.0:
            self.ctrl_state = replace(self.ctrl_state, step=self.ctrl_state.step + 1, update_norm=0.0, scale=1.0,
                                      ratio=0.0, rho_a=math.inf, measured=True, batches=len(batches), stale=False)
            return 1.0
        if (self.reuse_steps and self._since < self.reuse_steps and math.isfinite(self._rho_last)
                and norm <= self.reuse_margin * self.controller.target_ratio * self._rho_last):
            self._since += 1
            self.ctrl_state = replace(self.ctrl_state, step=self.ctrl_state.step + 1, update_norm=norm, scale=1.0,
                                      ratio=norm / self._rho_last, rho_a=self._rho_last, measured=True,
                                      batches=len(batches), stale=True)
            return 1.0
        if not self._slots.valid(self.model):  # parameters added or removed since construction
            self._slots, self._modules = _Slots(self.model), _measured_modules(self.model)
        names = {id(p): n for n, p in self.model.named_parameters()}
        at = {names[id(p)]: o for p, o in zip(params, old) if id(p) in names}
        tang = {names[id(p)]: d for p, d in zip(params, delta) if id(p) in names}
        zs, as_ = [], []
        self._measuring = True
        try:
            for args, kwargs in batches:
                z, a = logit_slopes(self.model, tang, args, kwargs, params=at, logits_fn=self.logits_fn,
                                    _cache=(self._slots, self._modules))
                zs.append(z.reshape(-1, z.shape[-1]))
                as_.append(a.reshape(-1, a.shape[-1]))
        finally:
            self._measuring = False
        z, a = (zs[0], as_[0]) if len(zs) == 1 else (torch.cat(zs), torch.cat(as_))
        scale, self.ctrl_state = self.controller.update(self.ctrl_state, z, a, norm, batches=len(batches))
        self._since, self._rho_last = 0, self.ctrl_state.rho_a
        if scale < 1.0:  # p <- old + scale (p - old)
            torch._foreach_copy_(params, torch._foreach_add(old, delta, alpha=scale))
        return scale

    def attach(self, optimizer: torch.optim.Optimizer) -> SafeStepGuard:
        """Guard every ``optimizer.step()`` through torch's step pre/post hooks."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")

        def pre(opt, args, kwargs):
            self.before_step(p for g in opt.param_groups for p in g["params"])

        def post(opt, args, kwargs):
            self.after_step()

        self._hooks += [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
        return self

    def remove(self):
        """Stop recording batches and detach from any optimizer."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._batches = []


class SafeStep(torch.optim.Optimizer):
    """Wrap ``optimizer`` so that each update p is scaled by min(1, r rho_a / ||p||).

    Two-line use: ``opt = SafeStep(torch.optim.Adam(model.parameters()), model)`` and keep
    calling ``opt.step()``; the batches are the forwards of ``model`` with gradients enabled
    since the last step (all micro-batches under gradient accumulation, or only the last one
    with ``accumulation="last"``), or pass ``opt.step(inputs=x)``. The wrapper shares the
    inner optimizer's ``param_groups`` and ``state``, so LR schedulers, ``zero_grad`` and
    checkpoints act on the inner optimizer; the inner optimizer's own state (e.g. Adam moments)
    is updated as usual, only the applied parameter change is scaled. ``load_state_dict``
    takes a SafeStep checkpoint or a plain one of the inner optimizer. ``reuse_steps``,
    ``reuse_margin``: the cheaper, weaker variant of :class:`SafeStepGuard` (default off).
    Logged: ``last_rho_a``, ``last_update_norm``, ``last_ratio``, ``last_scale``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, target_ratio: float = 1.0,
                 method: str = "pi", logits_fn=None, accumulation: str = "all", reuse_steps: int = 0,
                 reuse_margin: float = 0.5):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.guard = SafeStepGuard(model, target_ratio, method, logits_fn, accumulation,
                                   reuse_steps=reuse_steps, reuse_margin=reuse_margin)
        self.optimizer = optimizer
        self.model = model
        params = [p for g in optimizer.param_groups for p in g["params"]]
        super().__init__(params, dict(optimizer.defaults))
        # share, do not copy: schedulers and zero_grad must act on the inner optimizer
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults

    @property
    def controller(self) -> SafeStepController:
        return self.guard.controller

    @property
    def ctrl_state(self) -> SafeStepState:
        return self.guard.ctrl_state

    @ctrl_state.setter
    def ctrl_state(self, value: SafeStepState):
        self.guard.ctrl_state = value

    @property
    def logits_fn(self):
        return self.guard.logits_fn

    # logged quantities
    @property
    def last_rho_a(self) -> float:
        return self.guard.last_rho_a

    @property
    def last_update_norm(self) -> float:
        return self.guard.last_update_norm

    @property
    def last_ratio(self) -> float:
        return self.guard.last_ratio

    @property
    def last_scale(self) -> float:
        return self.guard.last_scale

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None, inputs=None):
        self.guard.before_step(p for g in self.param_groups for p in g["params"])
        if closure is not None:
            with torch.enable_grad():
                loss = self.optimizer.step(closure)
        else:
            loss = self.optimizer.step()
        self.guard.after_step(inputs)
        return loss

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "controller": self.ctrl_state.__dict__.copy()}

    def load_state_dict(self, state_dict):
        """A SafeStep checkpoint, or a plain ``state_dict()`` of the inner optimizer (then the
        controller's logged state is kept)."""
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        if "optimizer" in state_dict and "controller" in state_dict:
            inner, ctrl = state_dict["optimizer"], state_dict["controller"]
        elif "state" in state_dict and "param_groups" in state_dict:
            inner, ctrl = state_dict, None
        else:
            raise ValueError("state_dict must come from SafeStep.state_dict() (keys 'optimizer', 'controller') "
                             f"or from the inner optimizer (keys 'state', 'param_groups'); got keys {sorted(state_dict)}")
        self.optimizer.load_state_dict(inner)
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state
        if ctrl is not None:
            known = set(SafeStepState.__dataclass_fields__)
            self.ctrl_state = SafeStepState(**{k: v for k, v in ctrl.items() if k in known})

    def remove_hook(self):
        """Stop recording the model's inputs (call when the wrapper is discarded)."""
        self.guard.remove()
