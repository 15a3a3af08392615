"""Safe step sizes in an ordinary PyTorch training loop: a two-line change.

    python examples/safe_step.py [--spike 1000]

Trains the MLP+LayerNorm on sklearn digits with Adam and an LR schedule, once with the bare
optimizer and once wrapped in analysis.safestep.SafeStep; from step 50 the learning rate is
multiplied by --spike (a mis-set schedule). The wrapper scales each update by
min(1, rho_a / ||p||), rho_a = pi / max_x (max_k a_k - min_k a_k), a = J_z p by one JVP.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from softcert.analysis.ghosts_models import make_model
from softcert.analysis.safestep import SafeStep  # (change 1 of 2)
from softcert.certify.data import digits


def train(safe: bool, spike: float, steps: int = 200, seed: int = 0) -> float:
    torch.manual_seed(seed)
    x_tr, y_tr, x_te, y_te = digits()
    x_tr, x_te = x_tr.flatten(1), x_te.flatten(1)  # the models take (N, 64) rows
    model = make_model("MLP+LN", seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if safe:
        opt = SafeStep(opt, model)  # change 2 of 2: wrap; everything below is unchanged
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: spike if s >= 50 else 1.0)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        idx = torch.randint(0, len(y_tr), (64,), generator=g)
        loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if safe and step % 50 == 49:
            print(f"  step {step + 1}: loss {loss.item():.3f}  ||p|| {opt.last_update_norm:.3g}  "
                  f"rho_a {opt.last_rho_a:.3g}  r {opt.last_ratio:.3g}  scale {opt.last_scale:.3g}")
    model.eval()
    with torch.no_grad():
        return (model(x_te).argmax(1) == y_te).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spike", type=float, default=1000.0, help="LR multiplier from step 50")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain = train(False, args.spike, args.steps)
    print("SafeStep-wrapped Adam:")
    safe = train(True, args.spike, args.steps)
    print(f"test accuracy after an LR x{args.spike:g} spike: plain Adam {plain:.1%}, SafeStep {safe:.1%}")


if __name__ == "__main__":
    main()
