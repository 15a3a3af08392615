"""``softcert bab``: three-valued verdicts by branch and bound (``certify.verify(...,
method="bab")``) on zoo models, against the bound-only methods and auto_LiRPA's alpha-CROWN.

For each model and eps, on the first n test images: PGD-robust accuracy (the ceiling), the
certified counts of every ingredient (crown; alpha-crown with ReLU slopes only; alpha-crown
with every relaxation; bab without and with Vertex-Softmax leaves), the bab verdict counts
(certified / falsified / unknown) under the per-sample budget --timeout, and
lirpa-alpha-crown's certified count and time per sample. Every bab certificate is checked
against PGD (a certified image PGD breaks raises SoundnessError). Writes bab.md, bab.json and
bab_cactus.png (samples with a verdict vs time per sample, per method, VNN-COMP style).
Models: every ``--model`` form of softcert.cli.model_formats (the user's own with ``--data``).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from softcert import certify
from softcert.certify.options import ROOT_INTERMEDIATE, BabOptions
from softcert.cli import common, dataset, devices, model_formats, style

#: the ingredients table: column -> method. "alpha-crown-relu" and "alpha-crown" name the
#: same registered method until certify.METHODS has a ReLU-only variant of its own
INGREDIENTS = ("crown", "alpha-crown-relu", "alpha-crown", "bab", "bab-vertex")
BASELINE = "lirpa-alpha-crown"


def _registered(column):
    if column == "alpha-crown-relu":
        return "alpha-crown-relu" if "alpha-crown-relu" in certify.METHODS else "alpha-crown"
    return column


def configure(parser):
    model_formats.add_arguments(parser, "mnist-vit1")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.005, 0.01, 0.02])
    parser.add_argument("--n", type=int, default=24, help="first n test images")
    parser.add_argument("--timeout", type=float, default=60.0, help="bab budget per sample, seconds")
    parser.add_argument("--methods", nargs="+", default=list(INGREDIENTS) + [BASELINE], metavar="METHOD",
                        help=f"columns from {', '.join(INGREDIENTS + (BASELINE,))}")
    parser.add_argument("--softmax", default="sigmoid", choices=certify.SOFTMAX_FORMS,
                        help="softmax lowering (certify.softmax_form): sigmoid (default) or product (the lowering "
                             "before session 7, 2026-12-03, to measure what the default buys)")
    parser.add_argument("--intermediate", default="auto", choices=ROOT_INTERMEDIATE,
                        help="the bab root's intermediate bounds (certify.BabOptions.intermediate): auto (default; optimised "
                             "only where the root is left open), full (CROWN: the default before session 8, "
                             "2026-12-03), alpha (always optimised)")
    parser.add_argument("--out", default="docs/certify")
    devices.add_argument(parser)
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of other (model, eps) pairs already in OUT/bab.json (e.g. a second model "
                             "run with other radii)")


def _timed_bound(model, x, y, eps, method):
    """Per sample: (certified, seconds), one image at a time so that each has its time."""
    out = []
    for b in range(x.shape[0]):
        t0 = time.perf_counter()
        r = certify.verify(model, x[b:b + 1], y[b:b + 1], eps, method=method)
        out.append((bool(r.certified[0]), time.perf_counter() - t0))
    return out


def run(args) -> int:
    torch.set_num_threads(1)
    known = INGREDIENTS + (BASELINE,)
    bad = [m for m in args.methods if m not in known]
    if bad:
        raise ValueError(f"--methods: unknown {', '.join(map(repr, bad))}; choose from {', '.join(known)}")
    if args.n < 1:
        raise ValueError("--n: must be >= 1")
    if not args.timeout > 0:
        raise ValueError("--timeout: must be > 0")
    devices.device_of(args.device)  # refused by name before anything loads
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "bab", [
        ("--model", args.model), ("--data", args.data), ("--allow-pickle", args.allow_pickle), ("--eps", args.eps),
        ("--n", args.n), ("--timeout", args.timeout),
        ("--methods", args.methods), ("--softmax", args.softmax), ("--intermediate", args.intermediate),
        ("--out", args.out), ("--device", args.device)])
    rows, commands = [], [command]
    if args.append and (out / "bab.json").exists():
        old = json.loads((out / "bab.json").read_text())
        commands = [c for c in old.get("commands", [old.get("command")]) if c and c != command] + [command]
        new = {(m, e) for m in args.model for e in args.eps}
        rows = [r for r in old["rows"] if (r["model"], r["eps"]) not in new]
    for name in args.model:  # every model and its data load (or fail, by name) before the bar starts
        dataset.load(name, args.data, args.allow_pickle)
    bar = common.progress(total=len(args.model) * len(args.eps) * len(args.methods), desc="bab", unit="run")
    with certify.softmax_form(args.softmax):
        _runs(args, out, rows, commands, bar)
    bar.close()
    return 0


def _runs(args, out, rows, commands, bar):
    for name in args.model:
        model, xte, yte, _ = dataset.load(name, args.data, args.allow_pickle)
        model, x, y = devices.on_device(model, xte[: args.n].to(torch.float64), yte[: args.n],
                                        devices.device_of(args.device))
        for eps in args.eps:
            att = certify.attack(model, x, y, eps)
            row = dict(model=name, eps=eps, n=len(y), timeout=args.timeout, pgd_robust=int((~att.falsified).sum()),
                       softmax=args.softmax, intermediate=args.intermediate, methods={})
            for meth in args.methods:
                bar.set_postfix_str(f"{name} eps {eps} {meth}")
                if meth in ("bab", "bab-vertex"):
                    r = certify.verify(model, x, y, eps, meth,
                                       options=BabOptions(timeout=args.timeout, intermediate=args.intermediate))
                    for b, v in enumerate(r.verdicts):
                        if v.status == "certified" and bool(att.falsified[b]):
                            raise certify.SoundnessError(f"{name} eps {eps} image {b}: bab certified, PGD falsified")
                    row["methods"][meth] = dict(
                        counts=r.counts(), certified=r.counts()["certified"],
                        seconds=[v.seconds for v in r.verdicts], status=list(r.status),
                        leaves=[v.leaves for v in r.verdicts], vertex_leaves=[v.vertex_leaves for v in r.verdicts],
                        lower_margin=r.lower_margin.tolist())
                else:
                    per = _timed_bound(model, x, y, eps, _registered(meth))
                    for b, (c, _) in enumerate(per):
                        if c and bool(att.falsified[b]):
                            raise certify.SoundnessError(f"{name} eps {eps} image {b}: {meth} certified, PGD falsified")
                    row["methods"][meth] = dict(registered=_registered(meth), certified=sum(c for c, _ in per),
                                                seconds=[s for _, s in per],
                                                status=["certified" if c else "unknown" for c, _ in per])
                bar.update(1)
            rows.append(row)
            counts = row["methods"].get("bab", {}).get("counts")
            if counts:
                print(f"{name} eps {eps}: certified {counts['certified']}, falsified {counts['falsified']}, "
                      f"unknown {counts['unknown']} (of {row['n']}; PGD-robust {row['pgd_robust']})")
            _write(out, rows, commands, args)  # after every eps, so a long run keeps its results


def _verdicts(methods):
    """The bab run whose verdicts the tables show: bab, else bab-vertex where only it ran."""
    return methods.get("bab") or methods.get("bab-vertex") or {}


def _mean(v):
    return sum(v) / len(v) if v else float("nan")


def _cell(v):
    return "–" if math.isnan(v) else f"{v:.1f}"


def _write(out, rows, commands, args):
    common.write_json(out / "bab.json", {"commands": commands, "rows": rows})
    cols = [m for m in args.methods if m != BASELINE]
    lines = ["# Branch and bound: three-valued verdicts", "",
             "Regenerate: " + "; then ".join(f"`{c}`" for c in commands) + " (1 CPU thread per process; up to two",
             "such processes at once on a 2-core machine, so times are wall-clock and somewhat noisy). Ball: L∞ radius eps",
             "clipped to [0, 1]; the first n test images. PGD-robust: no counterexample from PGD (40 steps x 2",
             "restarts), the ceiling of any sound method. bab falsified / unknown and bab leaves: of bab, or of",
             "bab-vertex where bab did not run. bab: `certify.verify(model, x, y, eps, method=\"bab\", "
             "options=BabOptions(timeout=T))` with T the command's --timeout",
             "(certify/bab/): alpha-CROWN at the root, then splits of the inputs of ReLU, exp, -log and sigmoid and of",
             "attention scores, alpha warm-started from the parent, split constraints in the bound through",
             "optimised beta-CROWN multipliers, falsification (PGD, then PGD from each",
             "leaf's worst point) alongside; bab-vertex: the same with Vertex-Softmax intervals at the root and",
             "P·V bounds in the leaves (method `bab-vertex`). alpha-crown-relu: alpha-CROWN on the ReLU slopes only "
             "(method `" + _registered("alpha-crown-relu") + "`); alpha-crown: on every optimisable relaxation (certify/ops).",
             "softmax: the lowering of our methods (`--softmax`, certify.softmax_form): sigmoid, p_k = σ(y_k - log Σ_{j≠k}",
             "exp y_j), or product, exp(y_k) · 1/Σ_j exp(y_j) (the default before session 7, 2026-12-03).",
             "bab root: the root's intermediate bounds (`--intermediate`, certify.options.ROOT_INTERMEDIATE): full (CROWN), or",
             "auto (CROWN, then, where the root is left open and PGD fails, the most sensitive quarter of each split",
             "node's elements re-bounded by alpha-CROWN within half the budget left (`BabOptions.root_share`, since",
             "session 9; before, up to the deadline); the default since session 8).", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        lines += [f"## {model}", "", "### Verdicts (bab) and certified counts per ingredient", "",
                  "| eps | softmax | bab root | n | PGD-robust | " + "".join(f"certified: {c} | " for c in cols) +
                  "bab falsified | bab unknown |",
                  "|---|---|---|---|---|" + "---|" * len(cols) + "---|---|"]
        for r in rs:
            m = r["methods"]
            counts = _verdicts(m).get("counts", {})
            # rows written before the softmax column existed used the product lowering; the
            # baseline runs auto_LiRPA's own graph, so a row of it alone has no lowering
            form = r.get("softmax", "product") if any(c in m for c in INGREDIENTS) else "–"
            # rows written before session 8 bounded the root with CROWN intermediate bounds
            root = r.get("intermediate", "full") if any(c in m for c in ("bab", "bab-vertex")) else "–"
            lines.append(f"| {r['eps']} | {form} | {root} | {r['n']} | {r['pgd_robust']} | " +
                         "".join(f"{m[c]['certified'] if c in m else '–'} | " for c in cols) +
                         f"{counts.get('falsified', '–')} | {counts.get('unknown', '–')} |")
        lines += ["", "### Seconds per sample (mean) and BaB leaves", "",
                  "| eps | " + " | ".join(args.methods) + " | bab leaves (mean) | bab-vertex leaves where Vertex won (mean) |",
                  "|---|" + "---|" * len(args.methods) + "---|---|"]
        for r in rs:
            m = r["methods"]
            lb, vx = _verdicts(m), m.get("bab-vertex", {})
            lines.append(f"| {r['eps']} | " + " | ".join(f"{_mean(m[c]['seconds']):.3g}" if c in m else "–"
                                                         for c in args.methods) +
                         f" | {_cell(_mean(lb.get('leaves', [])))} | {_cell(_mean(vx.get('vertex_leaves', [])))} |")
        if BASELINE in args.methods:
            lines += ["", f"certified: {BASELINE} (auto_LiRPA 0.3, a float32 baseline, not a proof): " +
                      ", ".join(f"eps {r['eps']}: {r['methods'][BASELINE]['certified']}" for r in rs
                                if BASELINE in r["methods"])]
        lines.append("")
    lines += ["![cactus](bab_cactus.png)", "",
              "Cactus plot: for each method, the number of samples with a verdict (bab: certified or falsified;",
              "the bound-only methods: certified) reached within t seconds per sample, over all eps.", ""]
    common.write_markdown(out / "bab.md", lines)
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    every = []
    for meth in args.methods:
        ts = sorted(s for r in rows if meth in r["methods"]
                    for s, st in zip(r["methods"][meth]["seconds"], r["methods"][meth]["status"])
                    if st in ("certified", "falsified"))
        every += ts
        if ts:
            ax.step(ts, range(1, len(ts) + 1), where="post", marker="o", markersize=3, label=meth)
    style.log_axis(ax, "x", every)
    ax.set_xlabel("seconds per sample")
    ax.set_ylabel("samples with a verdict")
    ax.legend(fontsize=7)
    common.save_figure(fig, out / "bab_cactus.png", dpi=120)
