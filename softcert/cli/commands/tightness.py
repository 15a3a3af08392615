"""``softcert tightness``: baselines against Vertex-Softmax on synthetic attention score boxes.

Runs analysis.tightness.sweep (mean gap of each baseline to the exact optimum, width ratio,
violations) and writes tightness.md, tightness.json and tightness.png; exits 1 if any
baseline was tighter than the exact bound.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from softcert.analysis.tightness import EPSILONS, NS, sweep
from softcert.cli import common


def to_markdown(rows, command: str) -> str:
    names = list(rows[0].gap)
    lines = [
        "# Tightness: baselines vs Vertex-Softmax on synthetic attention score boxes",
        "",
        f"Regenerate with `{command}`.",
        "",
        "Mean gap = ((upper_b − upper_v) + (lower_v − lower_b)) / 2 over the trials, in units of",
        "c·softmax(s); Vertex-Softmax is the exact optimum over the score box, so every gap is",
        ">= 0 (the `violations` column counts trials where a baseline was tighter than exact:",
        "it must be 0). Setup: `analysis/tightness.py::score_boxes`.",
        "",
        "| n | eps | mean score width | Vertex width | " + " | ".join(f"gap {m}" for m in names)
        + " | " + " | ".join(f"width ratio {m}" for m in names) + " | violations |",
        "|" + "---|" * (5 + 2 * len(names)),
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.eps} | {r.mean_score_width:.4f} | {r.vertex_width:.4g} | "
            + " | ".join(f"{r.gap[m]:.4g}" for m in names) + " | "
            + " | ".join(f"{r.width_ratio[m]:.3g}" for m in names) + " | "
            + str(sum(r.violations.values())) + " |"
        )
    return "\n".join(lines) + "\n"


def plot(rows, path: Path) -> None:
    plt = common.pyplot()
    epsilons = sorted({r.eps for r in rows})
    names = list(rows[0].gap)
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4 * len(epsilons), 3.4), sharey=True)
    for ax, eps in zip(np.atleast_1d(axes), epsilons):
        sel = [r for r in rows if r.eps == eps]
        for m in names:
            ax.plot([r.n for r in sel], [r.width_ratio[m] for r in sel], marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"eps = {eps}")
        ax.set_xlabel("keys n")
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
    np.atleast_1d(axes)[0].set_ylabel("bound width / Vertex-Softmax width")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    common.save_figure(fig, path, dpi=120)


def configure(parser) -> None:
    parser.add_argument("--out", default="docs", help="output folder (default: docs)")
    parser.add_argument("--trials", type=int, default=200, help="trials per (n, eps)")
    parser.add_argument("--n", type=int, nargs="+", default=list(NS), help="numbers of keys")
    parser.add_argument("--eps", type=float, nargs="+", default=list(EPSILONS), help="input radii")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    if args.trials < 1:
        raise ValueError("--trials: must be >= 1")
    if any(e < 0 for e in args.eps):
        raise ValueError("--eps: radii must be >= 0")
    if any(n < 1 for n in args.n):
        raise ValueError("--n: must be >= 1")
    clock = common.Stopwatch()
    with common.progress(total=len(args.n) * len(args.eps), desc="tightness") as bar:
        rows = sweep(args.n, args.eps, args.trials, args.seed, progress=bar.update)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.spelled_out("tightness", [
        ("--trials", args.trials), ("--n", args.n), ("--eps", args.eps), ("--seed", args.seed),
        ("--out", args.out)])
    md = to_markdown(rows, command)
    common.write_markdown(out / "tightness.md", md)
    common.write_json(out / "tightness.json", {"command": command, "rows": [asdict(r) for r in rows]})
    plot(rows, out / "tightness.png")
    print(md)
    print(f"wrote {out / 'tightness.md'}, .json, .png in {clock.seconds:.1f} s")
    return 0 if all(sum(r.violations.values()) == 0 for r in rows) else 1
