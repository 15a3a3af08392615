"""CPU time of CROWN intermediate bounds against ``PropagationOptions.chunk_elements``, same run.

    python examples/chunk_benchmark.py --models mnist-vit1 mnist-vit2 --images 4

For each chunk size (coefficients per chunk of intermediate-bound rows, ``crown.crown_node``)
the first ``--images`` test images are certified by ``crown`` at eps 0.005 in one batch;
printed: process CPU time per image (one torch thread; tracing excluded), and the largest
change of any lower margin against the first chunk size (the bounds must not depend on it).
"""
import argparse
import time

import torch

from softcert import certify
from softcert.certify import zoo
from softcert.certify.options import BoundOptions, PropagationOptions


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["mnist-vit1", "mnist-vit2"])
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--log2-chunks", type=int, nargs="+", default=[14, 16, 18, 20])
    p.add_argument("--eps", type=float, default=0.005)
    a = p.parse_args()
    torch.set_num_threads(1)
    for name in a.models:
        m, X, y = zoo.load(name)
        x, lab = X[: a.images], y[: a.images]
        certify.verify(m, x[:1], lab[:1], a.eps, method="ibp")  # trace once, outside the timing
        ref = None
        for k in a.log2_chunks:
            options = BoundOptions(batch_size=a.images, propagation=PropagationOptions(chunk_elements=2**k))
            c0 = time.process_time()
            r = certify.verify(m, x, lab, a.eps, method="crown", options=options)
            cpu = (time.process_time() - c0) / a.images
            ref = r.lower_margin if ref is None else ref
            diff = float((r.lower_margin - ref).abs().max())
            print(f"{name} 2**{k}: {cpu:.2f} s CPU per image, max |margin change| {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
