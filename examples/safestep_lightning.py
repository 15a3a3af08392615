"""SafeStep in a Lightning Trainer: one callback, no change to the LightningModule.

    python examples/safestep_lightning.py [--spike 1000] [--steps 120]

Trains the MLP+LayerNorm classifier on sklearn digits with Adam; from step 40 the learning rate
is multiplied by --spike (a mis-set schedule). Run once plain and once with
``SafeStepLightningCallback``, which scales each update p by min(1, rho_a / ||p||),
rho_a = pi / max_x (max_k a_k - min_k a_k), a = J_z p (analysis/safestep.py).
Needs the `lightning` extra (pytorch-lightning).
"""
from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from softcert.analysis.callbacks import SafeStepLightningCallback
from softcert.analysis.ghosts_models import make_model
from softcert.certify.data import digits


class Digits(pl.LightningModule):
    def __init__(self, spike: float):
        super().__init__()
        self.net = make_model("MLP+LN", 0)
        self.spike = spike

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)  # self(x): the callback records the batch here

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: self.spike if s >= 40 else 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def run(safe: bool, spike: float, steps: int) -> float:
    torch.manual_seed(0)
    x_tr, y_tr, x_te, y_te = digits()
    x_tr, x_te = x_tr.flatten(1), x_te.flatten(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_tr, y_tr), batch_size=64, shuffle=True)
    callbacks = [SafeStepLightningCallback()] if safe else []
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    model = Digits(spike)
    trainer.fit(model, loader)
    if safe:
        hist = callbacks[0].history
        bound = sum(s.scale < 1 for s in hist)
        print(f"  SafeStep bound {bound} of {len(hist)} steps; last scale {hist[-1].scale:.3g}")
    model.eval()
    with torch.no_grad():
        return (model(x_te).argmax(1) == y_te).float().mean().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spike", type=float, default=1000.0)
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    for safe in (False, True):
        acc = run(safe, args.spike, args.steps)
        print(f"{'SafeStep' if safe else 'plain'}: test accuracy {100 * acc:.1f} % (LR x{args.spike:g} from step 40)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
