"""``softcert stability``: softmax feedback thresholds β* = 2/‖ΠWΠ‖₂ vs classical 1/‖W‖₂.

Writes docs/stability/: stability.md/.json (threshold table, sharpness demos) and
sharpness.png (n = 2: number of fixed points for W = cI and 2-cycle amplitude for W = -cI
against βc; both change exactly at βc = 2 = β*c).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from softcert.analysis import feedback as fb
from softcert.cli import common


def configure(parser) -> None:
    parser.add_argument("--out", default="docs", help="output root (writes <out>/stability/)")
    parser.add_argument("--c", type=float, default=3.0, help="c of the n = 2 demos W = ±cI")
    parser.add_argument("--scan", type=int, default=81, help="βc grid points in [1, 3]")
    parser.add_argument("--seed", type=int, default=0)


def _cases(c: float, seed: int):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((8, 8))
    return [
        ("W = 5·11ᵀ + 0.3I (n=4)", fb.example_matrix()),
        (f"W = {c:g}I (n=2)", c * np.eye(2)),
        (f"W = -{c:g}I (n=2)", -c * np.eye(2)),
        ("W = randn(8,8)", g),
        ("W = randn(8,8) + 10·1vᵀ (n=8)", g + 10 * np.outer(np.ones(8), rng.standard_normal(8))),
    ]


def run(args) -> int:
    if args.c <= 0:
        raise ValueError(f"--c must be > 0, got {args.c}")
    out = Path(args.out) / "stability"
    out.mkdir(parents=True, exist_ok=True)
    cmd = common.command_line(args, "stability")
    clock = common.Stopwatch()
    rows = []
    for name, W in _cases(args.c, args.seed):
        cert = fb.stability_threshold(W, beta=None)
        at = fb.stability_threshold(W, beta=0.9 * cert.beta_star)
        rows.append({"case": name, "n": cert.n, "beta_classical": cert.beta_classical,
                     "beta_star": cert.beta_star, "gain": cert.beta_star / cert.beta_classical,
                     "proj_norm_upper": cert.proj_norm.value, "norm_upper": cert.full_norm.value,
                     "norm_method": cert.proj_norm.method,
                     "contraction_at_0.9beta*": at.contraction,
                     "iterations_to_1e-8": at.iterations})
    c = args.c
    grid = np.linspace(1.0, 3.0, args.scan)
    fps, amps = [], []
    for bc in common.progress(grid, desc="sharpness scan (beta*c)"):
        fps.append(fb.fixed_points_n2(c, bc / c))
        amps.append(fb.period_two_amplitude(c, bc / c))
    demo = {
        "pitchfork": {"below": fb.fixed_points_n2(c, 0.98 * 2 / c),
                      "above": fb.fixed_points_n2(c, 1.02 * 2 / c)},
        "two_cycle": {"below": fb.period_two_amplitude(c, 0.98 * 2 / c),
                      "above": fb.period_two_amplitude(c, 1.02 * 2 / c)},
    }
    res = {"command": cmd, "seconds": clock.seconds, "cases": rows, "demo": demo,
           "scan": {"beta_c": grid.tolist(), "fixed_points": fps, "two_cycle_amplitude": amps}}
    common.write_json(out / "stability.json", res)
    L = ["# Softmax feedback stability thresholds\n",
         f"Regenerate: `{cmd}` ({res['seconds']:.0f} s).\n",
         "x = softmax(β(Wx + b)) is a contraction of the simplex (unique fixed point, any b) "
         "for β < β* = 2/‖ΠWΠ‖₂ (Π = I - 11ᵀ/n); the classical condition is β < 1/‖W‖₂. "
         "Norms are rigorous upper bounds (exact rational LDLᵀ certificate), thresholds "
         "rounded down (analysis/feedback.py).\n",
         "| W | n | classical 1/‖W‖₂ | β* = 2/‖ΠWΠ‖₂ | gain | contraction at 0.9β* | "
         "iterations to 1e-8 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['case']} | {r['n']} | {r['beta_classical']:.6g} | "
                 f"{r['beta_star']:.6g} | {r['gain']:.3g}x | "
                 f"{r['contraction_at_0.9beta*']:.4f} | {r['iterations_to_1e-8']} |")
    L.append(f"\nSharpness (n = 2, c = {c:g}, β* = 2/c): W = cI has "
             f"{demo['pitchfork']['below']} fixed point(s) at βc = 1.96 and "
             f"{demo['pitchfork']['above']} at βc = 2.04 (pitchfork); W = -cI: the orbit "
             f"from (0.6, 0.4) ends with |x1 - x2| = {demo['two_cycle']['below']:.2e} at "
             f"βc = 1.96 and {demo['two_cycle']['above']:.3f} at βc = 2.04 (2-cycle).\n")
    L.append("![sharpness](sharpness.png)\n")
    common.write_markdown(out / "stability.md", L)
    plt = common.pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot(grid, fps, "o-", ms=3)
    ax[0].axvline(2, color="k", ls=":")
    ax[0].set(xlabel="βc", ylabel="# fixed points", title="W = cI, n = 2: pitchfork")
    ax[1].plot(grid, amps, "o-", ms=3, color="C1")
    ax[1].axvline(2, color="k", ls=":")
    ax[1].set(xlabel="βc", ylabel="|x1 - x2| after 4000 steps", title="W = -cI: 2-cycle")
    common.save_figure(fig, out / "sharpness.png", dpi=120)
    print(f"wrote {out}/stability.md, .json, sharpness.png")
    return 0
