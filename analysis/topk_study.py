"""Per-(layer, head) statistics of certified top-k over a model's attention rows.

For every query row: the certified minimal k at each ε (analysis.topk, outward rounded),
the reduction n/k, whether k is proved minimal, the Gaussian rule's prediction from the
row's score spread σ, and at ε = ERR_EPS the single- and 4-level gap bounds at the certified
k and the attention-output error of top-k truncation with its diameter and variance bounds.
``softcert topk`` (softcert/cli/commands/topk.py) runs it on MiniLM and writes the tables.
"""
from __future__ import annotations

import numpy as np
import torch

from softcert.analysis import topk

__all__ = ["ERR_EPS", "row_stats", "study", "view_summary"]

#: the ε at which the gap and output-error bounds are evaluated
ERR_EPS = 0.01


def row_stats(s: torch.Tensor, v: torch.Tensor, eps_list):
    """Per (layer, head) sums over the query rows of one sequence: s (L,H,T,T), v (L,H,T,d)."""
    s = s.double()
    L, H, T, _ = s.shape
    model = topk._TailModel.for_length(T)
    vs, w, n_valid = topk.sorted_weights(s)
    Ts = topk.tail_sums(w)
    ks = torch.arange(T + 1).expand(Ts.shape)
    out = {"rows": torch.full((L, H), float(T)), "n": n_valid.double().sum(-1)}
    nv = n_valid.unsqueeze(-1)
    tau_up = topk._tail_from_sums(Ts, Ts[..., :1], ks, nv, model, "up")
    valid = torch.isfinite(s)
    mean = torch.where(valid, s, 0.0).sum(-1, keepdim=True) / n_valid.unsqueeze(-1)
    chk_sigma = (torch.where(valid, (s - mean) ** 2, 0.0).sum(-1) / n_valid).sqrt()
    for e in eps_list:
        k = (tau_up > e).sum(-1)
        Tprev = Ts.gather(-1, (k - 1).unsqueeze(-1)).squeeze(-1)
        lo_prev = topk._tail_from_sums(Tprev, Ts[..., 0], k - 1, n_valid, model, "down")
        frac = k.double() / n_valid
        out[f"k@{e}"] = k.double().sum(-1)
        out[f"frac@{e}"] = frac.sum(-1)
        out[f"red@{e}"] = (n_valid.double() / k).sum(-1)
        out[f"proved@{e}"] = (lo_prev > e).double().sum(-1)
        out[f"gauss@{e}"] = torch.from_numpy(
            np.asarray(topk.gaussian_k_fraction(chk_sigma.numpy(), e))).sum(-1)
        if e == ERR_EPS:
            out["gap1"] = topk.gap_bound(s, k).sum(-1)
            out["gap4"] = topk.multi_gap_bound(s, k, levels=4).sum(-1)
            out["tail"] = tau_up.gather(-1, k.unsqueeze(-1)).squeeze(-1).sum(-1)
            err = topk.output_error_bound(s, v.double().unsqueeze(-3), k)
            attn = torch.softmax(s, -1) @ v.double()
            out["err_exact"] = err.exact.sum(-1)
            out["err_diam"] = err.diameter.sum(-1)
            out["err_var"] = err.variance.sum(-1)
            out["out_norm"] = torch.linalg.vector_norm(attn, dim=-1).sum(-1)
    out["sigma"] = chk_sigma.sum(-1)
    return out


def study(at, eps_list, progress=None):
    """Per-(layer, head) means over all query rows of all sequences of an AttentionTensors;
    -> (means, rows per sequence of the first head). ``progress``, if given, is called with 1
    after each sequence."""
    acc = None
    for s, v in zip(at.scores, at.values):
        st = row_stats(s, v, eps_list)
        if progress is not None:
            progress(1)
        acc = st if acc is None else {key: acc[key] + st[key] for key in acc}
    rows = acc.pop("rows")
    return {key: (val / rows) for key, val in acc.items()}, int(rows[0, 0])


def view_summary(means, eps_list, n_rows, n_seq, label):
    """Per-layer means (over heads) of ``study``'s output and their overall mean, as JSON-ready
    dicts; ``heatmap_frac@0.01`` keeps the (layer, head) grid of k/n at ERR_EPS."""
    L, H = means["n"].shape
    per_layer = []
    for layer in range(L):
        row = {"layer": layer, "n_mean": float(means["n"][layer].mean())}
        for e in eps_list:
            row[f"k_mean@{e}"] = float(means[f"k@{e}"][layer].mean())
            row[f"frac@{e}"] = float(means[f"frac@{e}"][layer].mean())
            row[f"reduction@{e}"] = float(means[f"red@{e}"][layer].mean())
            row[f"gauss_frac@{e}"] = float(means[f"gauss@{e}"][layer].mean())
            row[f"proved@{e}"] = float(means[f"proved@{e}"][layer].mean())
        for key in ("gap1", "gap4", "tail", "err_exact", "err_diam", "err_var", "out_norm",
                    "sigma"):
            row[key] = float(means[key][layer].mean())
        per_layer.append(row)
    overall = {key: float(np.mean([r[key] for r in per_layer])) for key in per_layer[0]
               if key != "layer"}
    return {
        "label": label, "sequences": n_seq, "query_rows": n_rows * L * H,
        "per_layer": per_layer, "overall": overall,
        "heatmap_frac@0.01": means.get(f"frac@{ERR_EPS}", means[f"frac@{eps_list[0]}"]).tolist(),
    }
