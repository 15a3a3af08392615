"""How far can better intermediate bounds take the branch-and-bound root? A diagnostic, not a bound.

    python examples/relaxation_limit.py --model mnist-vit1 --cases 18:0.01 0:0.01 23:0.02

For each case (test image : eps) and its worst target class (the lowest alpha-CROWN root
margin), alpha-CROWN (``crown.alpha_crown``) is run on the root's CROWN intermediate bounds
("full") and again with the bounds of some nodes replaced by an *estimate of their true range*:
per element, the min and max that PGD (one run per element and side, 30 steps of eps/3 in the
input box, batched) and 4,000 random points of the box reach. These ranges are inner
estimates, so the replaced columns are NOT sound bounds: they show what the relaxations
themselves give once intermediate bounds are (nearly) exact, i.e. how much of the gap to the
attack is in the intermediate bounds and how much in the single-neuron relaxations.
Nodes that are affine functions of the input keep their CROWN bounds (exact for them).
Columns: PGD margin (an upper bound of the true minimum); root: alpha-CROWN on CROWN bounds
(sound); then PGD ranges at the inputs of the ReLUs, at the other nonlinear inputs (the
attention: shifted scores, the exp-sum, the sigmoid's input, the probabilities), and at both;
ratio: the mean width of the CROWN bounds over the mean width of the estimated ranges there.
"""
import argparse

import torch

from softcert import certify
from softcert.certify import crown, zoo
from softcert.certify.attack import pgd
from softcert.certify.options import AttackOptions
from softcert.certify.spec import input_box, margin_spec


def _ranges(g, consts, x, lo, hi, eps, nodes, samples=4000, steps=30, seed=0):
    """node -> (min, max) (1, *shape) over random points of the box and per-element PGD."""
    gen = torch.Generator().manual_seed(seed)
    pts = lo + (hi - lo) * torch.rand(samples, *x.shape[1:], generator=gen, dtype=torch.float64)
    with torch.no_grad():
        vals = g.values(pts, consts)
    out = {i: [vals[i].amin(0, keepdim=True), vals[i].amax(0, keepdim=True)] for i in nodes}
    for i in nodes:
        shape = g.nodes[i].shape
        n = int(torch.tensor(shape).prod())
        for side, sign in ((0, -1.0), (1, 1.0)):
            xs = x.expand(n, *x.shape[1:]).clone()
            for _ in range(steps + 1):
                xs = xs.detach().requires_grad_(True)
                v = g.values(xs, consts)[i].reshape(n, -1).diagonal()
                (grad,) = torch.autograd.grad((sign * v).sum(), xs)
                xs = torch.minimum(torch.maximum(xs + eps / 3 * grad.sign(), lo), hi)
            v = v.detach().reshape(1, *shape)
            out[i][side] = torch.minimum(out[i][side], v) if side == 0 else torch.maximum(out[i][side], v)
    return {i: tuple(v) for i, v in out.items()}


def _affine_of_input(g):
    """Nodes whose every ancestor is affine: CROWN bounds them exactly (up to rounding)."""
    affine = {0}
    for i, node in enumerate(g.nodes[1:], 1):
        if node.operator.kind == "affine" and all(j in affine for j in node.inputs):
            affine.add(i)
    return affine


def _case(model, x, label, eps):
    g = certify.graph_of(model, x)
    lo, hi = input_box(x, eps)
    xl, xu = lo.unsqueeze(1), hi.unsqueeze(1)
    out = g.nodes[g.output].shape
    keep = [j for j in range(out[-1]) if j != int(label)]
    C = margin_spec(label, out[-1]).reshape(1, out[-1], *out)[:, keep]
    with torch.no_grad():
        st = crown.propagate(g, xl, xu, centre=x.unsqueeze(1))
    root = crown.alpha_crown(st, C)
    worst = int(root.argmin())
    Cw = C[:, worst:worst + 1]
    affine = _affine_of_input(g)
    inputs = sorted({j for n in g.nodes if n.operator.kind in crown.NONLINEAR for j in n.inputs} - affine)
    relu = sorted({n.inputs[0] for n in g.nodes if n.op == "relu"})
    attention = [i for i in inputs if i not in relu]
    ranges = _ranges(g, st.consts, x, lo, hi, eps, inputs)

    def bound(nodes):
        s = crown.BoundState(g, xl, xu)
        s.consts, s.bounds = st.consts, dict(st.bounds)
        for i in nodes:
            s.bounds[i] = ranges[i]
        return float(crown.alpha_crown(s, Cw).min())

    def ratio(nodes):
        cw = sum(float((st.bounds[i][1] - st.bounds[i][0]).mean()) for i in nodes)
        pw = sum(float((ranges[i][1] - ranges[i][0]).mean()) for i in nodes)
        return cw / pw

    _, m = pgd(model, x, label, eps, AttackOptions(steps=40, restarts=4, seed=0))
    attack = float(m[0, keep[worst]])
    return keep[worst], attack, float(root[0, worst]), [
        (bound(relu), ratio(relu)), (bound(attention), ratio(attention)), (bound(inputs), ratio(inputs))]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mnist-vit1")
    p.add_argument("--cases", nargs="+", default=["18:0.01", "0:0.01", "23:0.02"],
                   help="IMAGE:EPS pairs (test images of the zoo model)")
    a = p.parse_args()
    torch.set_num_threads(1)
    model, X, y = zoo.load(a.model)
    model = model.double()
    print(f"{a.model}: lowest lower margin of the worst target class; columns after 'root' are NOT sound "
          "(intermediate bounds replaced by PGD/sampled ranges; ratio: CROWN width / range width there)\n")
    print("| image, eps | class | PGD margin | root (sound) | ranges at ReLU inputs (ratio) "
          "| at attention nodes (ratio) | at both (ratio) |")
    print("|---|---|---|---|---|---|---|")
    for c in a.cases:
        i, eps = int(c.split(":")[0]), float(c.split(":")[1])
        cls, attack, root, cols = _case(model, X[i:i + 1].to(torch.float64), y[i:i + 1], eps)
        cells = " | ".join(f"{b:.3f} ({r:.2f})" for b, r in cols)
        print(f"| {i}, {eps} | {cls} | {attack:.3f} | {root:.3f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
