"""SafeStep in training frameworks: a Hugging Face ``Trainer`` callback and a Lightning callback.

Both apply :class:`analysis.safestep.SafeStepGuard` to the framework's own optimizer: each
update p is scaled by min(1, r rho_a / ||p||), rho_a = pi / max_x Delta(J_z p)(x) over the
micro-batches of the step (docs/mathematics.md section 2). Neither framework is imported when this
module is: the classes are built on first access (``from softcert.analysis.callbacks import
SafeStepCallback`` imports transformers then), so the library does not depend on them.

- ``SafeStepCallback`` (transformers.TrainerCallback): measures between the Trainer's
  ``on_pre_optimizer_step`` and ``on_optimizer_step`` events; the batch is every forward of
  the Trainer's model since the last step (all gradient-accumulation micro-batches); logits
  are ``output.logits`` of the ModelOutput. Logs ``safestep_scale`` and ``safestep_ratio``.
- ``SafeStepLightningCallback`` (lightning.pytorch.Callback): attaches a guard to each of
  ``trainer.optimizers`` through torch's optimizer step hooks at ``on_fit_start``; the batch
  is every forward of the LightningModule (or of its submodule ``module``) with gradients on.
Both keep ``history``: the :class:`analysis.safestep.SafeStepState` of every step. Options are
those of :class:`analysis.safestep.SafeStepGuard` (``reuse_steps``: the weaker, cheaper variant).
"""
from __future__ import annotations

import functools

__all__ = ["SafeStepCallback", "SafeStepLightningCallback"]  # noqa: F822 (module __getattr__ builds them)


def _options(target_ratio, method, logits_fn, accumulation, reuse_steps):
    from torch import nn

    from softcert.analysis.safestep import SafeStepGuard

    options = {"target_ratio": target_ratio, "method": method, "logits_fn": logits_fn,
               "accumulation": accumulation, "reuse_steps": reuse_steps}
    SafeStepGuard(nn.Linear(1, 2), **options).remove()  # validates the options now, not at the first step
    return options


@functools.cache
def _hf_callback():
    from transformers import TrainerCallback

    from softcert.analysis.safestep import SafeStepGuard

    class SafeStepCallback(TrainerCallback):
        """Hugging Face Trainer callback: ``Trainer(..., callbacks=[SafeStepCallback()])``."""

        def __init__(self, target_ratio: float = 1.0, method: str = "pi", logits_fn=None,
                     accumulation: str = "all", reuse_steps: int = 0):
            self.options = _options(target_ratio, method, logits_fn, accumulation, reuse_steps)
            self.guard = None

        @property
        def history(self):
            return self.guard.history if self.guard is not None else []

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if model is None:
                raise ValueError("model: the Trainer passed no model to SafeStepCallback")
            if self.guard is not None:
                self.guard.remove()
            self.guard = SafeStepGuard(model, history=True, **self.options)

        def on_pre_optimizer_step(self, args, state, control, optimizer=None, model=None, **kwargs):
            groups = optimizer.param_groups if optimizer is not None else [{"params": list(model.parameters())}]
            self.guard.before_step(p for g in groups for p in g["params"])

        def on_optimizer_step(self, args, state, control, **kwargs):
            self.guard.after_step()

        def on_log(self, args, state, control, logs=None, **kwargs):
            """Add ``safestep_scale`` and ``safestep_ratio`` of the last optimizer step to
            ``logs`` (seen by the reporting callbacks after this one) and to the entry that
            Trainer.log already appended to ``state.log_history`` (issue 32)."""
            if logs is None or not self.history:
                return
            metrics = {"safestep_scale": self.guard.last_scale, "safestep_ratio": self.guard.last_ratio}
            logs.update(metrics)  # what the reporting callbacks after this one see
            # Trainer.log has already appended a copy ({**logs, "step"}) to state.log_history
            last = state.log_history[-1] if state.log_history else None
            if last is not None and last.get("step") == state.global_step:
                last.update(metrics)

        def on_train_end(self, args, state, control, **kwargs):
            if self.guard is not None:
                self.guard.remove()  # stop recording; the logged state stays readable

    SafeStepCallback.__module__, SafeStepCallback.__qualname__ = __name__, "SafeStepCallback"
    return SafeStepCallback


@functools.cache
def _lightning_callback():
    try:
        from lightning.pytorch import Callback
    except ImportError:  # the standalone distribution (the `lightning` extra installs this one)
        from pytorch_lightning import Callback

    from softcert.analysis.safestep import SafeStepGuard

    class SafeStepLightningCallback(Callback):
        """Lightning callback: ``Trainer(..., callbacks=[SafeStepLightningCallback()])``.

        ``module``: the name of the LightningModule's submodule that computes the logits, when
        ``training_step`` calls it directly instead of ``self(x)`` (default: the module itself).
        """

        def __init__(self, target_ratio: float = 1.0, method: str = "pi", logits_fn=None,
                     accumulation: str = "all", reuse_steps: int = 0, module: str | None = None):
            self.options = _options(target_ratio, method, logits_fn, accumulation, reuse_steps)
            self.module = module
            self.guards = []

        @property
        def guard(self):
            return self.guards[0] if self.guards else None

        @property
        def history(self):
            return self.guard.history if self.guard is not None else []

        def on_fit_start(self, trainer, pl_module):
            target = pl_module if self.module is None else getattr(pl_module, self.module, None)
            if target is None:
                raise ValueError(f"module: the LightningModule has no submodule {self.module!r}")
            self._remove()
            for opt in trainer.optimizers:
                self.guards.append(SafeStepGuard(target, history=True, **self.options).attach(opt))

        def _remove(self):
            for g in self.guards:
                g.remove()
            self.guards = []

        def on_fit_end(self, trainer, pl_module):
            for g in self.guards:
                g.remove()  # keep the guards (and their logged state), stop recording

    SafeStepLightningCallback.__module__ = __name__
    SafeStepLightningCallback.__qualname__ = "SafeStepLightningCallback"
    return SafeStepLightningCallback


def __getattr__(name):
    if name == "SafeStepCallback":
        return _hf_callback()
    if name == "SafeStepLightningCallback":
        return _lightning_callback()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
