"""Lowest lower margin and CPU time per image under the two softmax lowerings, same run.

    python examples/softmax_forms.py --model mnist-vit1 --cases 11:0.005 0:0.01 18:0.01 5:0.02

For each case (test image : eps) and each form of ``certify.softmax_form`` ("product":
exp(y_k) · 1/Σ_j exp(y_j), "sigmoid": σ(y_k - log Σ_{j≠k} exp(y_j))), ``crown`` and
``alpha-crown`` bound the margins of one image; printed as a markdown table: the lowest
lower margin over the target classes (higher is tighter; > 0 is certified) and the process
CPU time (one torch thread, tracing excluded). Both forms are exact lowerings of the same
softmax, so every margin is a sound bound of the same quantity.
"""
import argparse
import time

import torch

from softcert import certify
from softcert.certify import zoo

FORMS = ("product", "sigmoid")
METHODS = ("crown", "alpha-crown")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mnist-vit1")
    p.add_argument("--cases", nargs="+", default=["11:0.005", "0:0.01", "18:0.01", "5:0.02"],
                   help="IMAGE:EPS pairs (first test images of the zoo model)")
    a = p.parse_args()
    torch.set_num_threads(1)
    m, X, y = zoo.load(a.model)
    cases = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in a.cases]
    cols = [(meth, form) for meth in METHODS for form in FORMS]
    print(f"{a.model}: lowest lower margin (CPU s)\n")
    print("| image, eps | " + " | ".join(f"{meth}, {form}" for meth, form in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for form in FORMS:  # trace once per form, outside the timing
        with certify.softmax_form(form):
            certify.verify(m, X[:1], y[:1], 0.0, method="ibp")
    for i, eps in cases:
        cells = []
        for meth, form in cols:
            with certify.softmax_form(form):
                t0 = time.process_time()
                r = certify.verify(m, X[i:i + 1], y[i:i + 1], eps, method=meth)
                cells.append(f"{float(r.worst_margin[0]):.3f} ({time.process_time() - t0:.1f})")
        print(f"| {i}, {eps} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
