"""``softcert certify``: certified-accuracy tables for zoo models (Markdown + JSON + PNG).

For each zoo model, radius and method: certify.verify on the correctly classified first n
test images, checked against certify.attack (PGD): no certified image may be falsified and
no PGD margin may lie below a certified bound. Writes results.md, results.json and
certified_accuracy.png.
"""
from __future__ import annotations

from pathlib import Path

import torch

import certify
from certify import zoo
from softcert_cli import common

DEFAULT_METHODS = ["ibp", "crown", "alpha-crown", "vertex", "lirpa-ibp", "lirpa-crown"]


def configure(parser):
    parser.add_argument("--model", nargs="+", default=["mnist-vit1"], help="zoo names (certify.zoo.names())")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.005, 0.01, 0.02])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--n", type=int, default=10, help="first n test images")
    parser.add_argument("--out", default="docs/certify")


def run(args) -> int:
    torch.set_num_threads(1)
    for m in args.methods:
        if m not in certify.METHODS:
            raise ValueError(f"methods: unknown method {m!r}; choose from {certify.METHODS}")
    if args.n < 1:
        raise ValueError("n: must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "certify", [
        ("--model", args.model), ("--eps", args.eps), ("--methods", args.methods),
        ("--n", args.n), ("--out", args.out)])
    rows = []
    jobs = [(name, eps, meth) for name in args.model for eps in args.eps for meth in args.methods]
    loaded = {}
    bar = common.progress(jobs, desc="certify", unit="run")
    for name, eps, meth in bar:
        bar.set_postfix_str(f"{name} eps={eps} {meth}")
        if name not in loaded:
            model, xte, yte = zoo.load(name)
            with torch.no_grad():
                full_acc = (model(xte).argmax(1) == yte).float().mean().item()
            x, y = xte[: args.n], yte[: args.n]
            with torch.no_grad():
                correct = model(x).argmax(1) == y
            loaded[name] = (model, x, y, correct, full_acc, {})
        model, x, y, correct, full_acc, cache = loaded[name]
        if (name, eps) not in cache:
            att = certify.attack(model, x[correct], y[correct], eps)
            cache[(name, eps)] = att
        att = cache[(name, eps)]
        res = certify.verify(model, x[correct], y[correct], eps, method=meth)
        certify.attack(model, x[correct], y[correct], eps, certified=res.certified)  # raises if unsound
        if (att.min_margin < res.worst_margin - 1e-9).any():
            raise RuntimeError(f"soundness violation: PGD margin below the {meth} bound")
        rows.append(dict(
            model=name, eps=eps, method=meth, n=len(y),
            clean_acc_full_test=full_acc, clean_acc=correct.float().mean().item(),
            pgd_acc=(sum(s != "sat" for s in att.status) / len(y)),
            certified_acc=res.certified.sum().item() / len(y),
            mean_lower_margin=res.worst_margin.mean().item(),
            seconds_per_sample=res.seconds / max(1, int(correct.sum())),
            lower_margin=res.lower_margin.tolist(), note=res.note,
        ))
        if (name, eps, meth) == jobs[-1] or jobs[jobs.index((name, eps, meth)) + 1][0] != name:
            _write(out, rows, command)  # after every model, so a long run keeps its results
    return 0


def _compare(rows, a, b):
    """Fraction of (image, target) pairs where method a's bound >= b's (and > b's)."""
    out = {}
    for r in rows:
        if r["method"] != a:
            continue
        other = next((s for s in rows if s["method"] == b and s["model"] == r["model"] and s["eps"] == r["eps"]), None)
        if other is None:
            continue
        la, lb = torch.tensor(r["lower_margin"]), torch.tensor(other["lower_margin"])
        mask = la != 0
        if not mask.any():
            continue
        out[(r["model"], r["eps"])] = ((la[mask] >= lb[mask] - 1e-9).float().mean().item(),
                                        (la[mask] > lb[mask] + 1e-9).float().mean().item())
    return out


def _write(out, rows, command):
    common.write_json(out / "results.json", {"command": command, "rows": rows})
    lines = ["# Certified accuracy of the zoo models", "",
             f"Regenerate: `{command}` (1 CPU thread). Ball: L∞ radius eps clipped to [0, 1]; the first n",
             "test images; certified / PGD-robust accuracy count misclassified images as failures; the",
             "mean lower margin is over correctly classified images of min_{j≠y} (certified lower bound of",
             "z_y - z_j). PGD: 40 steps x 2 restarts; every run also checked that no certified image is",
             "falsified and no PGD margin lies below a certified bound.", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        lines += [f"## {model} (clean accuracy on the whole test split {rs[0]['clean_acc_full_test']:.3f}; "
                  f"n = {rs[0]['n']}, clean {rs[0]['clean_acc']:.2f})", "",
                  "| eps | method | PGD-robust acc | certified acc | mean lower margin | s / sample |",
                  "|---|---|---|---|---|---|"]
        for r in rs:
            note = f" ({r['note']})" if r.get("note") else ""
            lines.append(f"| {r['eps']} | {r['method']}{note} | {r['pgd_acc']:.2f} | {r['certified_acc']:.2f} | "
                         f"{r['mean_lower_margin']:.4g} | {r['seconds_per_sample']:.3g} |")
        lines.append("")
    for a, b in [("crown", "lirpa-crown"), ("vertex", "crown"), ("vertex", "alpha-crown"), ("alpha-crown", "crown")]:
        cmp = _compare(rows, a, b)
        if cmp:
            lines += [f"### {a} vs {b}: fraction of (image, target) bounds with {a} >= {b} (and strictly >)", ""]
            lines += [f"- {m}, eps {e}: {ge:.3f} ({gt:.3f})" for (m, e), (ge, gt) in cmp.items()]
            lines.append("")
    common.write_markdown(out / "results.md", lines)
    plt = common.pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for meth in dict.fromkeys(r["method"] for r in rows):
            rs = [r for r in rows if r["model"] == model and r["method"] == meth]
            ax.plot([r["eps"] for r in rs], [r["certified_acc"] for r in rs], marker="o", label=meth)
        rs = [r for r in rows if r["model"] == model and r["method"] == rows[0]["method"]]
        ax.plot([r["eps"] for r in rs], [r["pgd_acc"] for r in rs], "k--", label="PGD (upper)")
        ax.set_title(model)
        ax.set_xlabel("eps")
        ax.set_ylabel("certified accuracy")
    axes[0][0].legend(fontsize=7)
    common.save_figure(fig, out / "certified_accuracy.png", dpi=120)
