"""Where a verifier loses tightness: per node, the width of its certified bounds against the
width spanned by sampled inputs of the same box (an inner estimate of the true range).

    python examples/bound_looseness.py --model mnist-vit1 --image 11 --eps 0.005 --samples 4000

Bounds: ``crown.propagate`` (CROWN on the inputs of nonlinear nodes, IBP elsewhere; sound
arithmetic). Samples: random vertices of the input box (each coordinate at lo or hi) pushed
through the graph in float64. The ratio mean(bound width) / mean(sample width) is >= 1 up to
sampling; a jump between consecutive nodes shows the relaxation that loses the most.
"""
import argparse
import json

import torch

from softcert.certify import crown, zoo
from softcert.certify.graph_cache import graph_of
from softcert.certify.spec import DOMAIN, input_box


def looseness(model, x, eps, samples, seed=0):
    g = graph_of(model, x)
    lo, hi = input_box(x, eps, DOMAIN)
    st = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), centre=x.unsqueeze(1))
    gen = torch.Generator().manual_seed(seed)
    corner = torch.randint(0, 2, (samples, *lo.shape[1:]), generator=gen).to(torch.float64)
    with torch.no_grad():
        # the root's softmax shifts for every sample (a batch-1 shift index alone made every
        # sample subtract sample 0's key score: shifted scores, exp and exp-sums were off)
        vals = g.values(lo + (hi - lo) * corner, st.consts)
    need = crown._needs_bounds(g)
    rows = []
    for i, n in enumerate(g.nodes):
        l, u = st.bounds[i]
        v = vals[i]
        sample = float((v.amax(0) - v.amin(0)).mean())
        bound = float((u - l).mean())
        rows.append(dict(node=i, op=n.op, shape=list(n.shape), crown=i in need, bound_width=bound,
                         sample_width=sample, ratio=bound / sample if sample > 0 else None))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mnist-vit1")
    p.add_argument("--image", type=int, default=11)
    p.add_argument("--eps", type=float, default=0.005)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args()
    torch.set_num_threads(1)
    m, X, _ = zoo.load(a.model)
    rows = looseness(m, X[a.image: a.image + 1].to(torch.float64), a.eps, a.samples)
    print("| node | op | shape | CROWN-bounded | bound width | sample width | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"| {r['node']} | {r['op']} | {tuple(r['shape'])} | {'yes' if r['crown'] else ''} | "
              f"{r['bound_width']:.4g} | {r['sample_width']:.4g} | {ratio} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
