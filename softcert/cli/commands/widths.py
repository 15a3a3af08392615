"""``softcert widths``: where a model's interval bounds grow, node by node.

For each model and radius: ``certify.interval_widths`` on the first n test images (the IBP
boxes that certified training and CROWN-IBP's relaxations are built on, in the model's dtype).
Writes widths.md (per model and radius, the nodes where the largest width first passes each
power of ten times the input box's width, and the output), widths.json (every node) and
widths.png (largest width against node position, log scale).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from softcert import certify
from softcert.cli import common, dataset, model_formats


def configure(parser) -> None:
    model_formats.add_arguments(parser, "mnist-vit1")
    parser.add_argument("--eps", nargs="+", type=float, default=[1e-4, 0.005, 0.02],
                        help="radii of the L∞ balls (default: %(default)s)")
    parser.add_argument("--n", type=int, default=8, help="first n test images (default: %(default)s)")
    parser.add_argument("--out", default="widths", help="output folder (default: %(default)s)")


def run(args) -> int:
    torch.set_num_threads(1)
    if args.n < 1:
        raise ValueError(f"--n: expected at least 1 image, got {args.n}")
    out = Path(args.out)
    loaded = {name: dataset.load(name, args.data, args.allow_pickle) for name in args.model}
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "widths", [
        ("--model", args.model), ("--data", args.data), ("--allow-pickle", args.allow_pickle),
        ("--eps", args.eps), ("--n", args.n), ("--out", args.out)])
    results = []
    for name, (model, xte, _, _) in loaded.items():
        for eps in args.eps:
            r = certify.interval_widths(model, xte[:args.n], eps)
            results.append((name, r))
            last = r.nodes[-1]
            print(f"{name} eps {eps:g}: input width {r.input_width:.3g}, output width {last.max_width:.3g} "
                  f"(x{_ratio(last.max_width, r.input_width)})")
    _write(out, results, command)
    return 0


def _ratio(w, w0) -> str:
    return "inf" if not math.isfinite(w) else f"{w / w0:.3g}"


def _growth(r) -> list:
    """Nodes where the largest width first reaches each power of ten times the input width,
    then the output node."""
    rows, decade = [], 1
    for n in r.nodes:
        if not math.isfinite(n.max_width) or n.max_width >= r.input_width * 10.0 ** decade:
            rows.append(n)
            if not math.isfinite(n.max_width):
                break
            decade = math.floor(math.log10(n.max_width / r.input_width)) + 1
    if not rows or rows[-1] is not r.nodes[-1]:
        rows.append(r.nodes[-1])
    return rows


def _write(out: Path, results, command) -> None:
    lines = ["# Interval widths node by node", "",
             f"`{command}`", "",
             "IBP boxes of every node over the L∞ ball, in the model's dtype, plain arithmetic (the boxes "
             "certified training and CROWN-IBP build on: certify.interval_widths; no certificate). Per model and "
             "radius: the nodes where the largest width first reaches each power of ten times the input box's "
             "width, and the output. Every node: widths.json.", ""]
    for name, r in results:
        lines += [f"## {name}, eps {r.eps:g} ({r.images} images, {r.dtype}, input width {r.input_width:.3g})", "",
                  "| node | name | operator | largest width | median width | x input |", "|---|---|---|---|---|---|"]
        lines += [f"| {n.index} | {n.name} | {n.operator} | {n.max_width:.3g} | {n.median_width:.3g} | "
                  f"{_ratio(n.max_width, r.input_width)} |" for n in _growth(r)]
        lines.append("")
    common.write_markdown(out / "widths.md", lines)
    common.write_json(out / "widths.json", {"command": command, "results": [
        {"model": name, "eps": r.eps, "dtype": r.dtype, "images": r.images, "input_width": r.input_width,
         "assumptions": r.assumptions,
         "nodes": [{"index": n.index, "name": n.name, "operator": n.operator, "max_width": _num(n.max_width),
                    "median_width": _num(n.median_width)} for n in r.nodes]} for name, r in results]})
    plt = common.pyplot()
    models = list(dict.fromkeys(name for name, _ in results))
    cols = min(3, len(models))
    rows = math.ceil(len(models) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), sharey=True, squeeze=False)
    for ax, model in zip(axes.flat, models):
        for name, r in results:
            if name == model:
                # inf drawn at 1e300, the top of the axis
                ax.plot([n.index for n in r.nodes], [min(n.max_width, 1e300) for n in r.nodes], label=f"eps {r.eps:g}")
        ax.set_yscale("log")
        ax.set_title(model, fontsize="medium")
        ax.set_xlabel("node (graph order)")
    for ax in axes[:, 0]:
        ax.set_ylabel("largest interval width")
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small")
    common.save_figure(fig, out / "widths.png")
    print(f"softcert widths: wrote {out / 'widths.md'}, widths.json, widths.png")


def _num(v):
    # 4 significant digits (the table's 3, and a little more); JSON has no inf: a string names it
    return float(f"{v:.4g}") if math.isfinite(v) else "inf"
