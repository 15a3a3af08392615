"""Tightness of softmax relaxations on synthetic attention score boxes.

The published synthetic sweep (Vertex-Softmax abstract): a query attends over n keys; the
input tokens move in an L∞ ball of radius eps; score intervals follow by interval
arithmetic through random Q/K projections; every relaxation bounds the same objective
c·softmax(s) with c = V w (values projected on a random direction). The gap of a baseline
is how much its bound is looser than Vertex-Softmax, the exact optimum over the box:
gap = ((upper_b - upper_v) + (lower_v - lower_b)) / 2 >= 0.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import bounds

NS = (4, 8, 16, 32, 64, 128)
EPSILONS = (0.005, 0.01, 0.02, 0.05)


@dataclass(frozen=True)
class TightnessRow:
    n: int
    eps: float
    trials: int
    mean_score_width: float
    vertex_width: float
    #: baseline -> mean gap to Vertex-Softmax (same units as c·softmax)
    gap: dict
    #: baseline -> mean (baseline width / Vertex-Softmax width)
    width_ratio: dict
    #: baseline -> number of trials where the baseline was (wrongly) tighter than exact
    violations: dict


def score_boxes(n: int, eps: float, trials: int, d: int = 16, d_k: int = 16, seed: int = 0):
    """Score boxes and coefficients for ``trials`` random attention rows of length ``n``.

    Tokens X ~ N(0, 1)^{n x d}; W_Q, W_K, W_V ~ N(0, 1/d); query = token 0. Each token moves
    in an L∞ ball of radius eps, so q and k_j lie in boxes centre ± eps·|W|ᵀ1, and the
    score q·k_j/sqrt(d_k) in the interval product of those boxes. c_j = (x_j W_V)·w, w a
    random unit vector (value path unperturbed: the comparison is about the softmax).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(trials, n, d, generator=g, dtype=torch.float64)
    wq, wk, wv = (torch.randn(trials, d, d_k, generator=g, dtype=torch.float64) / math.sqrt(d)
                  for _ in range(3))
    w = torch.randn(trials, d_k, 1, generator=g, dtype=torch.float64)
    w = w / w.norm(dim=1, keepdim=True)
    q_mid = x[:, :1] @ wq
    q_rad = eps * wq.abs().sum(1, keepdim=True)
    k_mid = x @ wk
    k_rad = eps * wk.abs().sum(1, keepdim=True).expand_as(k_mid)
    q_lo, q_hi = (q_mid - q_rad), (q_mid + q_rad)
    k_lo, k_hi = (k_mid - k_rad), (k_mid + k_rad)
    prods = torch.stack([q_lo * k_lo, q_lo * k_hi, q_hi * k_lo, q_hi * k_hi])
    scale = 1 / math.sqrt(d_k)
    lo = prods.amin(0).sum(-1) * scale
    hi = prods.amax(0).sum(-1) * scale
    c = ((x @ wv) @ w).squeeze(-1)
    return c, lo, hi


def sweep(ns=NS, epsilons=EPSILONS, trials: int = 200, seed: int = 0, progress: bool = True):
    """Run the sweep; one TightnessRow per (n, eps)."""
    from tqdm import tqdm

    grid = [(n, eps) for n in ns for eps in epsilons]
    rows = []
    for k, (n, eps) in enumerate(tqdm(grid, desc="tightness", disable=not progress)):
        c, lo, hi = score_boxes(n, eps, trials, seed=seed + k)
        exact = bounds.vertex_softmax(c, lo, hi)
        v_width = exact.upper - exact.lower
        gap, ratio, bad = {}, {}, {}
        for name, fn in bounds.BASELINES.items():
            b = fn(c, lo, hi)
            g_up, g_lo = b.upper - exact.upper, exact.lower - b.lower
            gap[name] = float(((g_up + g_lo) / 2).mean())
            ratio[name] = float(((b.upper - b.lower) / v_width.clamp(min=1e-300)).mean())
            bad[name] = int(((g_up < 0) | (g_lo < 0)).sum())
        rows.append(TightnessRow(n, eps, trials, float((hi - lo).mean()), float(v_width.mean()),
                                 gap, ratio, bad))
    return rows


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


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
    start = time.perf_counter()
    rows = sweep(args.n, args.eps, args.trials, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "softcert tightness " + " ".join(
        [f"--trials {args.trials}", "--n " + " ".join(map(str, args.n)),
         "--eps " + " ".join(map(str, args.eps)), f"--seed {args.seed}", f"--out {args.out}"])
    md = to_markdown(rows, command)
    (out / "tightness.md").write_text(md)
    (out / "tightness.json").write_text(json.dumps(
        {"command": command, "rows": [asdict(r) for r in rows]}, indent=1))
    plot(rows, out / "tightness.png")
    print(md)
    print(f"wrote {out / 'tightness.md'}, .json, .png in {time.perf_counter() - start:.1f} s")
    return 0 if all(sum(r.violations.values()) == 0 for r in rows) else 1
