"""Lowest lower margin at the branch-and-bound root under each way of tightening it, same run.

    python examples/root_tightening.py --model mnist-vit1 --cases 18:0.01 0:0.01 4:0.02 13:0.02 --fractions 0.1 0.25 1

For each case (test image : eps), the lowest lower margin over the target classes (higher is
tighter; > 0 is certified) and the process CPU seconds (one torch thread, tracing excluded) of
- crown: CROWN on the "full" intermediate bounds (``crown.propagate``; the time includes them);
- alpha, shared: alpha-CROWN with one McCormick alpha per matmul output element (the default
  before session 8);
- alpha, per product: alpha-CROWN with one alpha per product X_ik Y_kj (``certify.ops.bilinear``)
  (both alpha columns time the optimisation alone, on crown's intermediate bounds);
- f = ...: alpha, per product, on intermediate bounds re-bounded by alpha-CROWN
  (``crown.propagate(..., options=PropagationOptions(intermediate="alpha"), optimise=...)``) for the
  fraction f of each split node's elements that ``crown.most_sensitive`` picks (f = 1: every
  undecided element). The times of these columns include their own "full" pass.
All are sound bounds of the same margin; the columns differ only in tightness and cost.
"""
import argparse
import time

import torch

from softcert import certify
from softcert.certify import crown, zoo
from softcert.certify.options import PropagationOptions
from softcert.certify.spec import input_box, margin_spec


def _case(model, x, label, eps, fractions):
    g = certify.graph_of(model, x)
    lo, hi = input_box(x, eps)
    xl, xu, x0 = lo.unsqueeze(1), hi.unsqueeze(1), x.unsqueeze(1)
    out = g.nodes[g.output].shape
    classes = out[-1]
    keep = [j for j in range(classes) if j != int(label)]
    C = margin_spec(label, classes).reshape(1, classes, *out)[:, keep]
    split = sorted({n.inputs[0] for n in g.nodes if n.operator.kind == "elementwise"})
    cells = []

    def timed(fn):
        t0 = time.process_time()
        v = fn()
        cells.append(f"{float(v.min()):.3f} ({time.process_time() - t0:.1f})")

    state = None

    def crown_bound():
        nonlocal state
        with torch.no_grad():
            state = crown.propagate(g, xl, xu, centre=x0)
        return crown.backward(state, g.output, C)
    timed(crown_bound)
    timed(lambda: crown.alpha_crown(state, C, per_product=False))
    timed(lambda: crown.alpha_crown(state, C))

    for f in fractions:
        def tightened(f=f):
            with torch.no_grad():
                st = crown.propagate(g, xl, xu, centre=x0)
                chosen = None if f >= 1 else crown.most_sensitive(st, g.output, C, split, f)
                st = crown.propagate(g, xl, xu, centre=x0, options=PropagationOptions(intermediate="alpha"),
                                     optimise=chosen)
            return crown.alpha_crown(st, C)
        timed(tightened)
    return cells


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mnist-vit1")
    p.add_argument("--cases", nargs="+", default=["18:0.01", "0:0.01", "4:0.02", "13:0.02"],
                   help="IMAGE:EPS pairs (test images of the zoo model)")
    p.add_argument("--fractions", nargs="+", type=float, default=[0.1, 0.25, 1.0])
    a = p.parse_args()
    torch.set_num_threads(1)
    model, X, y = zoo.load(a.model)
    cases = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in a.cases]
    cols = ["crown", "alpha, shared", "alpha, per product"] + [f"f = {f:g}" for f in a.fractions]
    print(f"{a.model}: lowest lower margin at the root (CPU s)\n")
    print("| image, eps | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    certify.graph_of(model, X[:1].to(torch.float64))  # trace once, outside the timing
    for i, eps in cases:
        cells = _case(model, X[i:i + 1].to(torch.float64), y[i:i + 1], eps, a.fractions)
        print(f"| {i}, {eps} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
