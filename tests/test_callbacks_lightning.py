"""SafeStepLightningCallback in a Lightning Trainer: a small MLP on random digits-shaped data
trains a few steps with gradient accumulation; after an LR spike x1000 the controller binds."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from softcert.analysis.ghosts_models import make_model


def _module(direct: bool):
    import pytorch_lightning as pl

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model("MLP+LN", seed=0)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x) if direct else self(x)
            return F.cross_entropy(logits, y)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=1e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1000.0 if s >= 3 else 1.0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Classifier()


def _loader():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _trainer(cb):
    import pytorch_lightning as pl

    return pl.Trainer(max_steps=6, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[cb])


@pytest.mark.parametrize("direct", [False, True])
def test_lightning_callback_binds_on_lr_spike(direct):
    """``direct``: training_step calls self.net(x), so the callback is pointed at "net"."""
    from softcert.analysis.callbacks import SafeStepLightningCallback

    cb = SafeStepLightningCallback(module="net" if direct else None)
    model = _module(direct)
    _trainer(cb).fit(model, _loader())
    hist = cb.history
    assert len(hist) == 6 and all(s.measured and s.batches == 2 for s in hist)
    assert all(s.scale == 1.0 for s in hist[:3])
    for s in hist[3:]:
        assert s.scale < 1.0
        assert s.scale * s.update_norm == pytest.approx(s.rho_a, rel=1e-9)
    assert all(math.isfinite(p.detach().abs().max().item()) for p in model.parameters())


def test_lightning_callback_warns_when_forward_bypasses_module():
    """training_step calls self.net directly but the callback watches the LightningModule:
    nothing is recorded, and every step says so instead of passing silently."""
    from softcert.analysis.callbacks import SafeStepLightningCallback
    from softcert.analysis.safestep import SafeStepWarning

    cb = SafeStepLightningCallback()
    with pytest.warns(SafeStepWarning, match="no training batch"):
        _trainer(cb).fit(_module(True), _loader())
    assert not any(s.measured for s in cb.history)
    with pytest.raises(ValueError, match="module"):
        _trainer(SafeStepLightningCallback(module="nope")).fit(_module(True), _loader())
