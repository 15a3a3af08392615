"""``softcert certify``: certified-accuracy tables (Markdown + JSON + PNG) for zoo models and
the user's own (every ``--model`` form of softcert.cli.model_formats, with ``--data``).

For each model: ``certify.evaluate`` over the radii and methods on the first n test
images (PGD, every method, and the cross-check: no certified image may be falsified and no
PGD margin may lie below a certified bound). Writes results.md, results.json and
certified_accuracy.png.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from softcert import certify
from softcert.cli import common, dataset, devices, model_formats

DEFAULT_METHODS = ["ibp", "crown", "alpha-crown", "vertex", "lirpa-ibp", "lirpa-crown"]


def configure(parser):
    model_formats.add_arguments(parser, "mnist-vit1")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.005, 0.01, 0.02])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, metavar="METHOD",
                        help=f"bound-only methods of certify.METHODS: {', '.join(m for m, x in certify.METHODS.items() if not x.complete)}")
    parser.add_argument("--n", type=int, default=10, help="first n test images")
    parser.add_argument("--cascade", action="store_true",
                        help="run each method, in the order given, only on the images still open: not broken "
                             "by PGD and not certified by an earlier method (e.g. --methods ibp crown "
                             "alpha-crown); a method's row then counts the cascade up to it")
    parser.add_argument("--out", default="docs/certify")
    dataset.add_arguments(parser, "OUT/store.jsonl")
    devices.add_argument(parser, workers=True)


def run(args) -> int:
    torch.set_num_threads(1)
    out = Path(args.out)
    devices.device_of(args.device)  # refused by name before anything loads
    job = dataset.Job(tuple(args.model), tuple(args.eps), tuple(args.methods), args.n, data=args.data,
                      allow_pickle=args.allow_pickle, device=args.device, cascade=args.cascade)
    for name in args.model:  # every model and its data load (or fail, by name) before the bar starts
        dataset.load(name, args.data, args.allow_pickle)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "certify", [
        ("--model", args.model), ("--data", args.data), ("--allow-pickle", args.allow_pickle), ("--eps", args.eps),
        ("--methods", args.methods), ("--n", args.n), ("--cascade", args.cascade), ("--out", args.out), ("--workers", args.workers), ("--scheduler", args.scheduler),
        ("--store", args.store), ("--resume", args.resume), ("--device", args.device)])
    # attack -> verify -> cross-check per image; a PGD-contradicted certificate raises SoundnessError
    res = dataset.run(job, Path(args.store) if args.store else out / "store.jsonl", workers=args.workers,
                      scheduler=args.scheduler, resume=args.resume)
    rows = []
    for name in args.model:
        model, xte, yte, _ = dataset.load(name, args.data, args.allow_pickle)
        with torch.no_grad():
            full_acc = (certify.logits_of(model(xte)).argmax(1) == yte).float().mean().item()
        ev = res.evaluations[name]
        rows += [_row(name, ev, eps, meth, full_acc, args.cascade) for eps in ev.eps for meth in ev.methods]
    _write(out, rows, command, args.data)
    print(f"softcert certify: {res.ran} images computed, {res.skipped} taken from {res.store} ({res.mode})")
    return 0


def _row(name, ev, eps, meth, full_acc, cascade=False) -> dict:
    """One table row from the per-image records of ``certify.evaluate`` at (eps, method)
    (``cascade``: the run was one, --cascade)."""
    rs = [r for r in ev.records if r.eps == eps and r.method == meth]
    # the images the method bounded: with --cascade, those its predecessors left open
    verified = [r for r in rs if r.correct and not r.skipped]
    margins = [r.lower_margin for r in verified]
    k_clean, n = ev.clean_accuracy()
    return dict(
        model=name, eps=eps, method=meth, n=n, clean_acc_full_test=full_acc, clean_acc=k_clean / n,
        pgd_acc=ev.robust_accuracy(eps)[0] / n, certified_acc=ev.certified_accuracy(eps, meth)[0] / n,
        bounded=len(verified), cascade=cascade,
        mean_lower_margin=math.fsum(margins) / len(margins) if margins else None,
        seconds_per_sample=math.fsum(r.seconds for r in verified) / max(1, len(verified)),
        # one verify call per (eps, method): its RSS growth, None without psutil
        peak_mb=max((r.peak_mb for r in verified if getattr(r, "peak_mb", None) is not None), default=None),
        # per-(image, target) comparisons need every method on every image: none in a cascade
        lower_margin=[] if cascade else [list(r.class_margins) for r in verified],
        note=next((r.note for r in verified if r.note), ""))


def _compare(rows, a, b):
    """Fraction of (image, target class) pairs where method a's lower margin is >= b's (and > b's)."""
    out = {}
    for r in rows:
        if r["method"] != a:
            continue
        other = next((s for s in rows if s["method"] == b and s["model"] == r["model"] and s["eps"] == r["eps"]), None)
        if other is None or not r["lower_margin"]:
            continue
        la, lb = torch.tensor(r["lower_margin"]), torch.tensor(other["lower_margin"])
        pair = la != 0  # the entry j = y is 0 by definition, not a bound
        la, lb = la[pair], lb[pair]
        out[(r["model"], r["eps"])] = ((la >= lb - 1e-9).float().mean().item(),
                                        (la > lb + 1e-9).float().mean().item())
    return out


def _g(v):
    return "–" if v is None else f"{v:.4g}"


def _title(rows, data) -> str:
    models = list(dict.fromkeys(r["model"] for r in rows))
    named = ", ".join(Path(m).name if Path(m).exists() else m for m in models)
    return f"# Certified accuracy of {named}" + (f" on {Path(data).name}" if data else "")


def _write(out, rows, command, data=None):
    common.write_json(out / "results.json", {"command": command, "data": data, "rows": rows})
    lines = [_title(rows, data), "",
             f"Regenerate: `{command}` (1 CPU thread). Ball: L∞ radius eps clipped to [0, 1]; the first n",
             "test images; certified / PGD-robust accuracy count misclassified images as failures; the",
             "mean lower margin is over correctly classified images of min_{j≠y} (certified lower bound of",
             "z_y - z_j). PGD: 40 steps x 2 restarts; every run also checked that no certified image is",
             "falsified and no PGD margin lies below a certified bound. Peak MB: the growth of the",
             "process's resident memory during the method's run (psutil polling; – without psutil)."]
    if any(r.get("cascade") for r in rows):
        lines += ["Cascade: each method bounded only the images PGD did not break and no earlier method",
                  "certified (\"bounded N\"); its certified accuracy is the cascade's up to it, its mean lower",
                  "margin and s / sample are over the images it bounded."]
    lines.append("")
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        lines += [f"## {model} (clean accuracy on the whole test split {rs[0]['clean_acc_full_test']:.3f}; "
                  f"clean {common.share(rs[0]['clean_acc'], rs[0]['n'])})", "",
                  "| eps | method | PGD-robust acc | certified acc | mean lower margin | s / sample | peak MB |",
                  "|---|---|---|---|---|---|---|"]
        for r in rs:
            note = f" ({r['note']})" if r.get("note") else ""
            if r.get("cascade"):
                note += f" (cascade: bounded {r['bounded']})"
            lines.append(f"| {r['eps']} | {r['method']}{note} | {common.share(r['pgd_acc'], r['n'])} | "
                         f"{common.share(r['certified_acc'], r['n'])} | "
                         f"{_g(r['mean_lower_margin'])} | {r['seconds_per_sample']:.3g} | "
                         f"{_g(r.get('peak_mb'))} |")
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
        ax.set_title(Path(model).name if Path(model).exists() else model)
        ax.set_xlabel("eps")
        ax.set_ylabel("certified accuracy")
    axes[0][0].legend(fontsize=7)
    common.save_figure(fig, out / "certified_accuracy.png", dpi=120)
