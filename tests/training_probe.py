"""Measurements of docs/certify/training.md that no softcert command makes (not a test file):

    python -P tests/training_probe.py step --model mnist-vit4-ln --batch 128
        seconds, peak resident memory, loss and gradient norm of three CROWN-IBP steps
        (certify.margin_bounds, eps 0.005, beta 0.5) on the first test images of a zoo model
        (--bound ibp, --eps, --dtype float64, --steps: other steps; --threads: torch threads);
    python -P tests/training_probe.py from-scratch --init ibp
        a fresh 4-block centred-LayerNorm ViT (mnist-vit4-nv's architecture) trained by IBP from
        the first step (no natural warm-up), eps 0.02 over a 40-epoch ramp (fewer: all epochs), Adam 1e-3, with
        PyTorch's initialisation ("default") or Shi et al. 2021's ("ibp": w ~ N(0, 2π/n²) for a
        Linear of fan-in n, biases 0); one line per epoch: eps, mean natural and robust loss;
    python -P tests/training_probe.py growth
        the IBP bounds of mnist-vit4-ln (natural, from the zoo) and of a fresh model of its
        architecture (seed 0, PyTorch's and Shi et al.'s initialisation, and zero residual branches
        at 4 and 8 blocks: certify.models.ViTConfig.branch_init) and without LayerNorm
        (mnist-vit4's and mnist-vit8's), in float32 and float64:
        the mean over 8 test images of the smallest natural margin and of the smallest IBP lower
        margin (certify.margin_bounds) at eps 0, 1e-12, 1e-9, 1e-6 and 0.02, and the width growth
        (largest width / input width, certify.interval_widths) at the end of each block at eps 1e-12;
        with --nodes, also every node of the first block of the fresh LayerNorm model (PyTorch's
        init) at eps 1e-10, float64: where the widths grow;
    python -P tests/training_probe.py natural --recipe mnist-vit4-ln --epochs 60 --shift 2
        a zoo recipe trained by certify.train.train (AdamW 3e-3, cosine schedule, batch 128,
        seed 0, the recipe's PGD where it has one) for --epochs, each batch translated by up to
        --shift pixels (certify.training.translated); test accuracy on the first 200 test images
        of the recipe's dataset and on the whole split;
    python -P tests/training_probe.py misses mnist-vit4-ln RUN/NAME.pt ...
        the indices of the first --n mnist5k test images each model (a zoo name or a checkpoint
        file or entry point, as --model of the commands reads it) misclassifies, and how many of them the first
        model misses too.
"""
import argparse
import math
import resource
import time

import torch
import torch.nn.functional as F

from softcert import certify
from softcert.certify import data, zoo
from softcert.certify.models import ViT


def step(args):
    model, x, y = zoo.load(args.model)
    dtype = getattr(torch, args.dtype)
    model = model.to(dtype).train()
    xb, yb = x[:args.batch].to(dtype), y[:args.batch]
    for k in range(args.steps):
        start = time.perf_counter()
        loss = F.cross_entropy(-certify.margin_bounds(model, xb, yb, args.eps, args.bound, beta=0.5), yb)
        loss.backward()
        grad = sum(float(p.grad.norm()) for p in model.parameters() if p.grad is not None)
        model.zero_grad()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
        print(f"step {k}: {time.perf_counter() - start:.2f} s, peak {peak:.2f} GB, loss {loss.item():.6f}, "
              f"gradient norm {grad:.6f}", flush=True)


def _ibp_init(model):
    g = torch.Generator().manual_seed(0)
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            n = mod.weight.shape[1]
            with torch.no_grad():
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * math.sqrt(2 * math.pi) / n)
                mod.bias.zero_()


def from_scratch(args):
    torch.manual_seed(0)
    model = ViT(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4, layer_norm=True,
                norm_variance=False)
    if args.init == "ibp":
        _ibp_init(model)
    xtr, ytr, _, _ = data.mnist5k()
    opts = certify.CertifiedTraining(eps=0.02, epochs=args.epochs, warmup_epochs=0, ramp_epochs=min(40, args.epochs), lr=1e-3,
                                     bound="ibp")
    steps = math.ceil(len(xtr) / opts.batch_size)
    losses = []

    def progress(epoch, k, eps, nat, rob):
        losses.append((nat, rob))
        if k % steps == steps - 1:
            nats, robs = zip(*losses)
            print(f"epoch {epoch}: eps {eps:.4f}, natural {sum(nats) / len(nats):.3f}, "
                  f"robust {sum(robs) / len(robs):.3f}", flush=True)
            losses.clear()
    certify.train_certified(model, xtr, ytr, opts, progress=progress)


def _smallest(m, y):
    return float(m.masked_fill(F.one_hot(y, m.shape[1]).bool(), math.inf).min(1).values.mean())


def growth(args):
    natural, x, y = zoo.load("mnist-vit4-ln")
    x, y = x[:8], y[:8]
    models = {"natural": natural}
    for init in ("default", "ibp"):
        torch.manual_seed(0)
        fresh = ViT(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4, layer_norm=True).eval()
        if init == "ibp":
            _ibp_init(fresh)
        models[f"fresh ({init} init)"] = fresh
    torch.manual_seed(0)
    models["fresh, zero residual branches (branch_init='zero')"] = ViT(
        image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4, layer_norm=True, branch_init="zero").eval()
    torch.manual_seed(0)
    models["fresh, zero residual branches, 8 blocks"] = ViT(
        image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=8, layer_norm=True, branch_init="zero").eval()
    torch.manual_seed(0)
    models["fresh without LayerNorm (mnist-vit4's architecture)"] = ViT(
        image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4).eval()
    torch.manual_seed(0)
    models["fresh without LayerNorm, 8 blocks (mnist-vit8's architecture)"] = ViT(
        image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=8).eval()
    for name, model in models.items():
        for dtype in (torch.float32, torch.float64):
            m, xd = model.to(dtype), x.to(dtype)
            with torch.no_grad():
                z = m(xd)
                cells = [f"natural {_smallest(z.gather(1, y[:, None]) - z, y):.3g}"]
                cells += [f"eps {e:g}: {_smallest(certify.margin_bounds(m, xd, y, e, 'ibp'), y):.3g}"
                          for e in (0.0, 1e-12, 1e-9, 1e-6, 0.02)]
            print(f"{name}, {str(dtype)[6:]}: smallest margin, mean of 8: " + ", ".join(cells), flush=True)
        w = certify.interval_widths(model.to(torch.float64), x.to(torch.float64), 1e-12)
        ends = {n.name: n.max_width / w.input_width for n in w.nodes if n.name.count(".") == 1 and n.operator == "add"}
        print(f"{name}, float64, eps 1e-12: width growth at each block's end: "
              + ", ".join(f"{k} {v:.2g}" for k, v in ends.items()), flush=True)
    if args.nodes:
        fresh = models["fresh (default init)"].to(torch.float64)
        w = certify.interval_widths(fresh, x.to(torch.float64), 1e-10)
        for n in w.nodes:
            if n.name.startswith("blocks.0") and n.operator not in ("reshape", "permute"):
                print(f"{n.index} {n.name} {n.operator}: width x {n.max_width / w.input_width:.3g} of the input's")


def natural(args):
    from softcert.certify.train import RECIPES, train

    start = time.perf_counter()
    model = train(args.recipe, epochs=args.epochs, shift=args.shift)
    xte, yte = getattr(data, RECIPES[args.recipe][0])()[2:]
    with torch.no_grad():
        hit = model(xte).argmax(1) == yte
    print(f"{args.recipe}, {args.epochs} epochs, shift {args.shift}: test accuracy {hit[:200].double().mean():.3f} "
          f"on the first 200, {hit.double().mean():.3f} on the split ({time.perf_counter() - start:.0f} s)")


def misses(args):
    from softcert.cli import model_formats

    x, y = data.mnist5k()[2:]
    x, y = x[:args.n], y[:args.n]
    first = None
    for name in args.models:
        spec = model_formats.parse(name)  # read as --model of the commands reads it
        model = (zoo.load(name)[0] if spec.kind == "zoo" else model_formats.build(spec)).eval()
        with torch.no_grad():
            wrong = set((model(x.to(next(model.parameters()).dtype)).argmax(1) != y).nonzero().flatten().tolist())
        first = wrong if first is None else first
        print(f"{name}: {args.n - len(wrong)} of {args.n} right; {len(wrong & first)} of its {len(wrong)} misses "
              f"also missed by {args.models[0]}: {sorted(wrong)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step")
    s.add_argument("--model", default="mnist-vit4-ln")
    s.add_argument("--batch", type=int, default=128)
    s.add_argument("--bound", choices=("crown-ibp", "ibp"), default="crown-ibp")
    s.add_argument("--eps", type=float, default=0.005)
    s.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    s.add_argument("--steps", type=int, default=3)
    s.add_argument("--threads", type=int, default=1)
    f = sub.add_parser("from-scratch")
    f.add_argument("--init", choices=("default", "ibp"), default="ibp")
    f.add_argument("--epochs", type=int, default=60)
    g = sub.add_parser("growth")
    g.add_argument("--nodes", action="store_true")
    n = sub.add_parser("natural")
    n.add_argument("--recipe", default="mnist-vit4-ln")
    n.add_argument("--epochs", type=int, default=60)
    n.add_argument("--shift", type=int, default=2)
    m = sub.add_parser("misses")
    m.add_argument("models", nargs="+")
    m.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(getattr(args, "threads", 1))
    {"step": step, "from-scratch": from_scratch, "growth": growth, "natural": natural,
     "misses": misses}[args.what](args)


if __name__ == "__main__":
    main()
