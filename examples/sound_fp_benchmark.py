"""Cost and effect of sound floating point in certify: plain vs sound arithmetic, same run.

    python examples/sound_fp_benchmark.py --images 3 --repeats 3 --out docs/certify/sound-fp.json

For each zoo model and method (crown, vertex), the first ``--images`` test images are
certified at eps 0.005 with ``certify.ops.arithmetic("plain")`` (the old float64 + 1e-9
widening) and with the default sound arithmetic, alternately, ``--repeats`` times each; the
time is the minimum over repeats of the process CPU time (``time.process_time``, bounds
only, tracing excluded; one torch thread), which load on a shared machine distorts less than
wall time; the wall time (``CertResult.seconds``) is reported beside it. Margins: the largest relative
change |sound - plain| / max(1, |plain|) over every image and class, and the largest move
down (sound below plain).
"""
import argparse
import json
import platform
import time

import torch

from softcert import certify
from softcert.certify import ops, zoo


def run(models, methods, images, repeats, eps):
    rows = []
    for name in models:
        m, X, y = zoo.load(name)
        x, lab = X[:images], y[:images]
        certify.verify(m, x[:1], lab[:1], eps, method="ibp")  # trace once, outside the timing
        for meth in methods:
            best, wall, res = {}, {}, {}
            for _ in range(repeats):
                for mode in ("plain", "sound"):
                    t0 = time.process_time()
                    with ops.arithmetic(mode):
                        r = certify.verify(m, x, lab, eps, method=meth,
                                           options=certify.BoundOptions(batch_size=images))
                    best[mode] = min(best.get(mode, float("inf")), time.process_time() - t0)
                    wall[mode] = min(wall.get(mode, float("inf")), r.seconds)
                    res[mode] = r.lower_margin
            p, s = res["plain"], res["sound"]
            rel = ((s - p).abs() / p.abs().clamp(min=1)).max().item()
            down = ((p - s) / p.abs().clamp(min=1)).clamp(min=0).max().item()
            rows.append(dict(model=name, method=meth, images=images, eps=eps, plain_cpu_s=best["plain"],
                             sound_cpu_s=best["sound"], ratio=best["sound"] / best["plain"],
                             plain_wall_s=wall["plain"], sound_wall_s=wall["sound"],
                             wall_ratio=wall["sound"] / wall["plain"], max_rel_change=rel, max_rel_down=down))
            print(f"{name:12s} {meth:7s} cpu plain {best['plain']:7.2f}s sound {best['sound']:7.2f}s "
                  f"ratio {best['sound'] / best['plain']:.2f} | wall ratio {wall['sound'] / wall['plain']:.2f} | "
                  f"max rel change {rel:.1e}  max rel down {down:.1e}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mnist-vit1", "mnist-vit2", "digits-vit1"])
    ap.add_argument("--methods", nargs="+", default=["crown", "vertex"])
    ap.add_argument("--images", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eps", type=float, default=0.005)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows = run(a.models, a.methods, a.images, a.repeats, a.eps)
    if a.out:
        meta = dict(torch=torch.__version__, python=platform.python_version(), threads=a.threads,
                    command="python examples/sound_fp_benchmark.py " + " ".join(argv or []))
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
