"""Safe step sizes from the softmax Taylor radius: a controller and a torch.optim wrapper.

Along the optimizer's actual update p, the logits move as z + t J_z p; cross-entropy's Taylor
expansion in t converges for |t| < rho(p) >= pi / max_x Delta(J_z p)(x) (analysis.ghosts,
"pi" bound; the minimum over the batch). In parameter units rho_a = rho(p) ||p||, the
normalised step is r = ||p|| / rho_a and the controller applies s p with
s = min(1, r_target rho_a / ||p||) = min(1, r_target rho(p)).

- :class:`SafeStepController`: pure (optax-like) ``init(params) -> state`` and
  ``update(state, logits, slopes, update_norm) -> (scale, state)``; no torch.nn involved.
- :func:`logit_slopes`: (z, J_z p) by one forward-mode JVP (forward-AD duals + functional_call)
  at given parameters, with BatchNorm buffers copied (running stats untouched), dropout off,
  the caller's RNG state restored, and the math SDPA backend (fused kernels have no forward AD).
- :class:`SafeStep`: a torch.optim.Optimizer that wraps any optimizer (shares its
  param_groups, so LR schedulers keep working) and applies the controller after each step.
Assumption: the logits are the model output (or ``logits_fn(output)``), last dim = classes.
Source: "ghosts of softmax" abstract (seeds/abstracts.md); DESIGN.md section 2.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

import torch
import torch.autograd.forward_ad as fwAD
from torch import nn
from torch.func import functional_call

from analysis.ghosts import pi_radius_batch, radius_lower_bound_batch

__all__ = ["SafeStepState", "SafeStepController", "logit_slopes", "measurement_mode", "SafeStep"]


@dataclass(frozen=True)
class SafeStepState:
    """What the controller saw at its last update (nan before the first one)."""

    step: int = 0
    rho_a: float = math.nan  # batch radius along the update, in parameter-norm units
    update_norm: float = math.nan  # ||p|| of the proposed (unscaled) update
    ratio: float = math.nan  # r = ||p|| / rho_a of the proposed update
    scale: float = 1.0  # factor applied to the update
    method: str = "pi"


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

    def update(self, state: SafeStepState, logits, slopes, update_norm: float):
        update_norm = float(update_norm)
        if not (update_norm >= 0 and math.isfinite(update_norm)):
            raise ValueError(f"update_norm must be finite and >= 0, got {update_norm}")
        a = torch.as_tensor(slopes).detach()
        a = a.reshape(-1, a.shape[-1])
        if self.method == "pi":
            rho_p = float(pi_radius_batch(a).min())
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
        new = replace(
            state, step=state.step + 1, rho_a=rho_a, update_norm=update_norm, ratio=ratio, scale=scale
        )
        return scale, new


@contextlib.contextmanager
def measurement_mode(model: nn.Module):
    """Dropout off, MultiheadAttention dropout 0, BatchNorm without running-stat updates (it
    still normalises by batch statistics in training mode), math SDPA backend, RNG restored."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dropouts = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    was = [m.training for m in dropouts]
    mhas = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    p_mha = [m.dropout for m in mhas]
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]
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


def logit_slopes(model: nn.Module, tangents: dict, args=(), kwargs=None, params=None, logits_fn=None):
    """(z, a) with z the logits and a = J_z p by one forward-mode JVP (dual numbers); p given per parameter name.

    ``params``: name -> tensor to evaluate at (default: the model's current parameters);
    parameters missing from ``tangents`` get a zero tangent. BatchNorm running statistics are
    not updated; the model keeps its train/eval mode (BatchNorm in training normalises by
    batch statistics, as the training step does).
    """
    kwargs = kwargs or {}
    named = dict(model.named_parameters())
    primal = {k: (params[k] if params is not None and k in params else v).detach() for k, v in named.items()}
    tang = {k: (tangents[k].detach() if k in tangents else torch.zeros_like(v)) for k, v in primal.items()}
    # forward-mode AD directly (torch.func.jvp computes the same, with more dispatch overhead)
    with measurement_mode(model), fwAD.dual_level():
        duals = {k: fwAD.make_dual(primal[k], tang[k]) for k in primal}
        out = functional_call(model, duals, args, kwargs, strict=False)
        out = logits_fn(out) if logits_fn is not None else out
        z, a = fwAD.unpack_dual(out)
        if a is None:  # the output does not depend on the parameters
            a = torch.zeros_like(z)
    return z.detach(), a.detach()


class SafeStep(torch.optim.Optimizer):
    """Wrap ``optimizer`` so that each update p is scaled by min(1, r rho_a / ||p||).

    Two-line use: ``opt = SafeStep(torch.optim.Adam(model.parameters()), model)`` and keep
    calling ``opt.step()``; the batch is the last input of ``model`` seen in training mode
    (recorded by a forward pre-hook), or pass ``opt.step(inputs=x)``. The wrapper shares the
    inner optimizer's ``param_groups`` and ``state``, so LR schedulers, ``zero_grad`` and
    checkpoints act on the inner optimizer; the inner optimizer's own state (e.g. Adam moments)
    is updated as usual, only the applied parameter change is scaled.
    Logged: ``last_rho_a``, ``last_update_norm``, ``last_ratio``, ``last_scale``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, target_ratio: float = 1.0,
                 method: str = "pi", logits_fn=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.optimizer = optimizer
        self.model = model
        self.logits_fn = logits_fn
        self.controller = SafeStepController(target_ratio, method)
        self.ctrl_state = self.controller.init()
        params = [p for g in optimizer.param_groups for p in g["params"]]
        super().__init__(params, dict(optimizer.defaults))
        # share, do not copy: schedulers and zero_grad must act on the inner optimizer
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults
        self._inputs = None
        self._hook = model.register_forward_pre_hook(self._record, with_kwargs=True)
        self._names = {id(p): n for n, p in model.named_parameters()}

    def _record(self, module, args, kwargs):
        if module.training:
            self._inputs = (args, kwargs)

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

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None, inputs=None):
        params = [p for g in self.param_groups for p in g["params"]]
        old = torch._foreach_mul([p.detach() for p in params], 1.0)  # one fused copy
        if closure is not None:
            with torch.enable_grad():
                loss = self.optimizer.step(closure)
        else:
            loss = self.optimizer.step()
        delta = torch._foreach_sub([p.detach() for p in params], old)
        norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(delta)).double())) if delta else 0.0
        if inputs is not None:
            batch = (inputs if isinstance(inputs, tuple) else (inputs,)), {}
        else:
            batch = self._inputs
        if batch is None or norm == 0.0:
            self.ctrl_state = replace(self.ctrl_state, step=self.ctrl_state.step + 1, update_norm=norm,
                                      scale=1.0, ratio=math.nan if batch is None else 0.0)
            return loss
        at = {self._names[id(p)]: o for p, o in zip(params, old) if id(p) in self._names}
        tang = {self._names[id(p)]: d for p, d in zip(params, delta) if id(p) in self._names}
        z, a = logit_slopes(self.model, tang, batch[0], batch[1], params=at, logits_fn=self.logits_fn)
        scale, self.ctrl_state = self.controller.update(self.ctrl_state, z, a, norm)
        if scale < 1.0:  # p <- old + scale (p - old)
            torch._foreach_copy_(params, torch._foreach_add(old, delta, alpha=scale))
        return loss

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "controller": self.ctrl_state.__dict__.copy()}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state
        self.ctrl_state = SafeStepState(**state_dict["controller"])

    def remove_hook(self):
        """Stop recording the model's inputs (call when the wrapper is discarded)."""
        self._hook.remove()
