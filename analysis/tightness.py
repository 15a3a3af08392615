"""Tightness of softmax relaxations on synthetic attention score boxes.

The published synthetic sweep (Vertex-Softmax abstract): a query attends over n keys; the
input tokens move in an L∞ ball of radius eps; score intervals follow by interval
arithmetic through random Q/K projections; every relaxation bounds the same objective
c·softmax(s) with c = V w (values projected on a random direction). The gap of a baseline
is how much its bound is looser than Vertex-Softmax, the exact optimum over the box:
gap = ((upper_b - upper_v) + (lower_v - lower_b)) / 2 >= 0. The table and plot are
``softcert tightness`` (softcert/cli/commands/tightness.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from softcert import bounds

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


def sweep(ns=NS, epsilons=EPSILONS, trials: int = 200, seed: int = 0, progress=None):
    """Run the sweep; one TightnessRow per (n, eps), in the order of ``ns`` x ``epsilons``.

    ``progress``, if given, is called with 1 after each (n, eps) cell (e.g. a tqdm bar's
    ``update``).
    """
    grid = [(n, eps) for n in ns for eps in epsilons]
    rows = []
    for k, (n, eps) in enumerate(grid):
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
        if progress is not None:
            progress(1)
    return rows
