"""``softcert fp``: proven FP softmax error bounds against the worst measured errors.

Writes docs/fp/: fp_bounds.md/.json (algorithm x n x dtype: proven rel bound, worst measured
rel beyond the floor, ratio), thresholds, exp accuracy, per-layer attention-row bounds, and
error_vs_n.png. References: mpmath at 50 digits for n <= ``--mpmath-max-n``; above it an
exactly rounded float64 sum (math.fsum, reference error ~4 * 2^-53) for float32/16/bfloat16,
and long double exps with a pairwise long double sum (~20 * 2^-64) for float64.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numba
import numpy as np

from softcert.analysis import fp
from softcert.cli import common

NS = (100, 1_000, 10_000, 100_000, 1_000_000)


def configure(parser) -> None:
    parser.add_argument("--out", default="docs", help="output root (writes <out>/fp/)")
    parser.add_argument("--ns", default=",".join(str(n) for n in NS),
                        help="comma-separated lengths n")
    parser.add_argument("--dtypes", default=",".join(fp.DTYPES))
    parser.add_argument("--block", type=int, default=128, help="tile size of 'blocked'")
    parser.add_argument("--random-trials", type=int, default=10,
                        help="extra random inputs per n <= 10^4 (1 above)")
    parser.add_argument("--mpmath-max-n", type=int, default=1000)
    parser.add_argument("--exhaustive-exp", action="store_true",
                        help="also check float32 expf on every float32 in [-104, 89] vs float64")
    parser.add_argument("--rows", default="auto",
                        help="attention rows: 'auto' (MiniLM if analysis.attention exists, else "
                             "synthetic), 'synthetic', or 'none'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", action="store_true",
                        help="only the FP32 attention study: writes <out>/fp/attention_bounds.md/.json")
    parser.add_argument("--attention-blocks", default="16,32,64,128,256",
                        help="tile sizes of the attention study")
    parser.add_argument("--attention-n", type=int, default=4096,
                        help="keys of the adversarial inputs in the attention study")
    parser.add_argument("--attention-sentences", type=int, default=32,
                        help="MiniLM corpus sentences in the attention study (0: none)")


def _reference(xr: np.ndarray, dtype: str, mp_max: int) -> tuple[np.ndarray, str]:
    if len(xr) <= mp_max:
        return fp.reference_softmax(xr, dps=50), "mpmath-50"
    if dtype != "float64":
        return fp.reference_softmax_fast(xr), "fsum-float64"
    x = np.asarray(xr, dtype=np.longdouble)
    e = np.exp(x - x.max())
    return (e / e.sum()).astype(np.float64), "longdouble"


def measure_table(ns, dtypes, block, trials, mp_max, seed, progress=None):
    rng = np.random.default_rng(seed)
    rows = []
    for n in ns:
        inputs = fp.stress_inputs(n, rng)
        extra = trials if n <= 10_000 else 1
        for t in range(extra):
            inputs[f"random1_{t}"] = rng.standard_normal(n)
            inputs[f"random30_{t}"] = rng.standard_normal(n) * 30
        for dtype in dtypes:
            bounds = {a: fp.error_bound(n, a, dtype, block=block) for a in fp.ALGORITHMS}
            worst = {a: (0.0, "", 0.0) for a in fp.ALGORITHMS}
            ref_kind = set()
            for kind, x in inputs.items():
                if dtype == "float16" and kind == "wide":
                    x = x / 1e3  # float16 cannot hold |x| > 65504
                xr = fp.round_array(x, dtype)
                p, rk = _reference(xr, dtype, mp_max)
                ref_kind.add(rk)
                for a in fp.ALGORITHMS:
                    y = fp.softmax(x, a, dtype, block=block)
                    b = bounds[a]
                    need = fp.needed_rel(y, xr, p, b)
                    v = max(fp.bound_violation(y, p, b),
                            fp.elementwise_violation(y, xr, p, b))
                    if need >= worst[a][0]:
                        worst[a] = (need, kind, max(v, worst[a][2]))
                    else:
                        worst[a] = (worst[a][0], worst[a][1], max(v, worst[a][2]))
                if progress:
                    progress.update(1)
            for a in fp.ALGORITHMS:
                b = bounds[a]
                need, kind, viol = worst[a]
                rows.append({
                    "algorithm": a, "n": n, "dtype": dtype, "u": b.u,
                    "bound_rel_u": b.rel_in_u, "bound_rel_core_u": b.rel_core / b.u, "abs_floor": b.abs_floor,
                    "worst_rel_u": need / b.u, "worst_input": kind,
                    "ratio": (b.rel / need) if need > 0 else math.inf,
                    "max_violation": viol, "reference": "+".join(sorted(ref_kind)),
                })
    return rows


@numba.njit(cache=True)
def _scan_expf(v):
    worst = 0.0
    arg = 0.0
    for i in range(v.size):
        y = math.exp(v[i])  # float32 expf, the exp used by analysis.fp
        r = math.exp(np.float64(v[i]))
        if r >= 3.4028235677973366e38:  # beyond max + ulp/2: the correct result is +inf
            if not math.isinf(y):
                return math.inf, np.float64(v[i])
            continue
        if r < 1.1754943508222875e-38:
            ulp = 1.401298464324817e-45
        else:
            m, e = math.frexp(r)
            ulp = math.ldexp(1.0, e - 24)
        err = abs(np.float64(y) - r) / ulp
        if err > worst:
            worst = err
            arg = np.float64(v[i])
    return worst, arg


def exhaustive_expf(progress=None) -> dict:
    """Every float32 t in [-104, 89] (about 2.2e9 values): max ulp error of expf vs float64 exp.

    The float64 exp is within 1 float64 ulp (2^-29 float32 ulp), so the reported maximum is
    exact to about 1e-8 ulp.
    """
    pos_hi = int(np.array([89.0], np.float32).view(np.uint32)[0])
    neg_hi = int(np.array([-104.0], np.float32).view(np.uint32)[0])
    ranges = [(0, pos_hi + 1), (0x80000000, neg_hi + 1)]
    worst, at, count = 0.0, 0.0, 0
    chunk = 1 << 24
    for lo, hi in ranges:
        for a in range(lo, hi, chunk):
            v = np.arange(a, min(hi, a + chunk), dtype=np.uint32).view(np.float32)
            w, x = _scan_expf(v)
            count += v.size
            if w > worst:
                worst, at = w, x
            if progress:
                progress.update(1)
    return {"max_ulp": worst, "at": at, "values": count,
            "reference": "float64 exp (error < 2^-29 float32 ulp)"}


def _stack_rows(scores) -> np.ndarray:
    """Per-sequence (L, H, T_i, T_i) score tensors -> (L, sum_i H T_i, max T) with -inf
    on the padded keys (masked keys already are -inf)."""
    mats = [np.asarray(s, dtype=np.float32) for s in scores]
    L = mats[0].shape[0]
    T = max(m.shape[-1] for m in mats)
    rows = sum(m.shape[1] * m.shape[2] for m in mats)
    out = np.full((L, rows, T), -np.inf, dtype=np.float32)
    r0 = 0
    for m in mats:
        k = m.shape[1] * m.shape[2]
        out[:, r0:r0 + k, :m.shape[-1]] = m.reshape(L, k, m.shape[-1])
        r0 += k
    return out


def attention_rows(mode: str, seed: int):
    if mode == "none":
        return None, "none"
    if mode == "auto":
        try:
            from softcert.analysis import attention

            at = attention.extract_attention()
            return _stack_rows(at.scores), (
                f"all-MiniLM-L6-v2 over the shipped corpus ({len(at.scores)} sequences; "
                "analysis.attention.extract_attention; rows of every head and query, keys "
                "padded with -inf)")
        except (ImportError, AttributeError, TypeError) as exc:
            print(f"analysis.attention unavailable ({exc.__class__.__name__}); "
                  "using synthetic rows", file=sys.stderr)
    rng = np.random.default_rng(seed)
    L, H, Q, K = 6, 12, 128, 128
    scale = np.array([1, 2, 4, 8, 16, 32], dtype=np.float64)[:, None, None, None]
    s = (rng.standard_normal((L, H, Q, K)) * scale).astype(np.float32)
    lengths = rng.integers(8, K + 1, size=(L, H, Q))  # padding masks
    s[np.arange(K)[None, None, None, :] >= lengths[..., None]] = -np.inf
    return s, "synthetic randn*scale rows, layer l has scale 2^l, random -inf padding"


def _attention_cells(q, k, v, blocks):
    """Per tile size: (max bound, max measured, max measured/bound, median bound/measured)."""
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q64 @ np.swapaxes(k64, -1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64  # error ~(n + d) 2^-53 max|v|, far below u
    cells = {}
    for b in blocks:
        res = fp.attention(q, k, v, block=b)
        err = np.abs(res.out.astype(np.float64) - ref)
        ratio = err / res.bound
        pos = err > 0
        cells[b] = {"max_bound_u": float(res.bound.max() / 2 ** -24),
                    "max_measured_u": float(err.max() / 2 ** -24),
                    "max_measured_over_bound": float(ratio.max()),
                    "median_bound_over_measured": float(np.median(1 / ratio[pos])) if pos.any()
                    else math.inf}
    return cells


def _merge(acc, cells):
    for b, c in cells.items():
        a = acc.setdefault(b, {"max_bound_u": 0.0, "max_measured_u": 0.0,
                               "max_measured_over_bound": 0.0, "median_bound_over_measured": []})
        for key in ("max_bound_u", "max_measured_u", "max_measured_over_bound"):
            a[key] = max(a[key], c[key])
        a["median_bound_over_measured"].append(c["median_bound_over_measured"])


def attention_study(blocks, sentences: int, seed: int, progress=None, n: int = 4096):
    """The attention bound against float64 references: adversarial inputs (n keys, d = 64)
    and all-MiniLM-L6-v2 q/k/v of every layer and head of the first ``sentences`` sentences."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind in fp.ATTENTION_STRESS:
        q, k, v = fp.attention_stress_inputs(kind, n, 64, rng)
        acc = {}
        _merge(acc, _attention_cells(q, k, v, blocks))
        rows.append({"source": kind, "n": n, "d": 64, "cells": acc})
        if progress is not None:
            progress(1)
    if sentences > 0:
        from softcert.analysis.attention import load_corpus

        # passages of 8 corpus sentences, truncated to 128 tokens: rows long enough for
        # the tile size to matter
        corpus = load_corpus()[:sentences]
        texts = [" ".join(corpus[i:i + 8]) for i in range(0, len(corpus), 8)]
        acc, n_max = {}, 0
        for q, k, v in fp.minilm_qkv(texts, max_length=128):
            _merge(acc, _attention_cells(q.numpy(), k.numpy(), v.numpy(), blocks))
            n_max = max(n_max, q.shape[-2])
        rows.append({"source": f"MiniLM, {len(texts)} passages ({sentences} sentences) x 6 "
                               "layers x 12 heads", "n": n_max, "d": 32, "cells": acc})
        if progress is not None:
            progress(1)
    for r in rows:
        for c in r["cells"].values():
            c["median_bound_over_measured"] = float(np.median(c["median_bound_over_measured"]))
    apriori = {b: fp.attention_error_bound(n, 64, b).coeff_in_u for b in blocks}
    return rows, apriori


def _write_attention_md(out, res):
    blocks = res["blocks"]
    L = ["# FP32 attention: proven bound against measured error, per tile size\n",
         f"Regenerate: `{res['command']}` ({res['seconds']:.0f} s). Derivation: "
         "[attention.md](attention.md). Kernel: `kernels/attention.py` through "
         "`analysis.fp.attention(q, k, v, block=...)`.\n",
         "Each cell: largest per-element bound (u = 2^-24) / largest measured error (u) "
         "[largest measured/bound; median over sources of the per-element median "
         "bound/measured]. Measured = |out - O64|, O64 the float64 attention of the float32 "
         "inputs (its own error ~(n + d) 2^-53 max|v|). A measured/bound above 1 would be a "
         f"bug; violations in this run: {res['violations']}.\n",
         "| source | n | d | " + " | ".join(f"block {b}" for b in blocks) + " |",
         "|---|---|---|" + "---|" * len(blocks)]
    for r in res["rows"]:
        cells = []
        for b in blocks:
            c = r["cells"][str(b)] if str(b) in r["cells"] else r["cells"][b]
            cells.append(f"{c['max_bound_u']:,.1f} / {c['max_measured_u']:,.2f} "
                         f"[{c['max_measured_over_bound']:.3f}; {c['median_bound_over_measured']:.1f}x]")
        L.append(f"| {r['source']} | {r['n']} | {r['d']} | " + " | ".join(cells) + " |")
    L += ["", f"A-priori coefficient (`analysis.fp.attention_error_bound({res['n']}, 64, block)`, "
          "any score spread, score rounding excluded), in u per unit max|v|: "
          + ", ".join(f"block {b}: {res['apriori'][str(b)] if str(b) in res['apriori'] else res['apriori'][b]:,.0f}"
                      for b in blocks) + ".", "",
          f"Assumptions: {fp.ATTENTION_ASSUMPTIONS}.", ""]
    common.write_markdown(out / "attention_bounds.md", "\n".join(L))


def run_attention(args, out: Path) -> int:
    blocks = [int(b) for b in args.attention_blocks.split(",")]
    if any(b < 1 for b in blocks):
        raise ValueError("--attention-blocks: tile sizes must be >= 1")
    if args.attention_sentences < 0:
        raise ValueError("--attention-sentences: must be >= 0")
    if args.attention_n < 2:
        raise ValueError("--attention-n: must be >= 2")
    cmd = common.command_line(args, "fp")
    clock = common.Stopwatch()
    total = len(fp.ATTENTION_STRESS) + (1 if args.attention_sentences else 0)
    with common.progress(total=total, desc="attention study") as bar:
        rows, apriori = attention_study(blocks, args.attention_sentences, args.seed, bar.update,
                                        args.attention_n)
    violations = sum(1 for r in rows for c in r["cells"].values()
                     if c["max_measured_over_bound"] > 1)
    res = {"command": cmd, "seconds": clock.seconds, "blocks": blocks, "rows": rows,
           "n": args.attention_n,
           "apriori": apriori, "violations": violations,
           "assumptions": fp.ATTENTION_ASSUMPTIONS}
    common.write_json(out / "attention_bounds.json", res)
    _write_attention_md(out, res)
    print(f"wrote {out}/attention_bounds.md, .json in {clock.seconds:.0f}s; "
          f"violations: {violations}")
    return 1 if violations else 0


def run(args) -> int:
    out = Path(args.out) / "fp"
    out.mkdir(parents=True, exist_ok=True)
    if args.attention:
        return run_attention(args, out)
    ns = [int(float(v)) for v in args.ns.split(",")]
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    for d in dtypes:
        if d not in fp.FORMATS:
            raise ValueError(f"--dtypes: unknown {d!r}")
    cmd = common.command_line(args, "fp")
    clock = common.Stopwatch()
    n_inputs = sum(6 + 2 * (args.random_trials if n <= 10_000 else 1) for n in ns) * len(dtypes)
    with common.progress(total=n_inputs, desc="fp stress inputs") as bar:
        table = measure_table(ns, dtypes, args.block, args.random_trials, args.mpmath_max_n,
                              args.seed, bar)
    ths = [fp.thresholds(d).__dict__ for d in fp.DTYPES]
    exp_meas = {d: {"measured_max_ulp": fp.measure_exp_ulps(d, points=20_001),
                    "assumed_ulp": fp.EXP_ULPS[d]} for d in fp.DTYPES}
    if args.exhaustive_exp:
        with common.progress(total=133, desc="exhaustive float32 expf") as bar:
            exp_meas["float32"]["exhaustive"] = exhaustive_expf(bar)
    rows_res = None
    scores, source = attention_rows(args.rows, args.seed)
    if scores is not None:
        from softcert.kernels import fp_rows

        rep = fp_rows.rows_report(scores)
        thr = fp_rows.throughput_ratio(scores)
        per_layer = []
        for li in range(scores.shape[0]):
            b, m = rep.bound[li].ravel(), rep.measured[li].ravel()
            per_layer.append({"layer": li, "rows": int(b.size),
                              "median_bound_u": float(np.median(b) / 2 ** -24),
                              "max_bound_u": float(b.max() / 2 ** -24),
                              "median_measured_u": float(np.median(m) / 2 ** -24),
                              "max_measured_u": float(m.max() / 2 ** -24),
                              "max_measured_over_bound": float((m / b).max())})
        rows_res = {"source": source, "shape": list(scores.shape), "layers": per_layer,
                    "throughput": thr}
    result = {"command": cmd, "seconds": clock.seconds, "table": table, "thresholds": ths,
              "exp": exp_meas, "rows": rows_res, "block": args.block,
              "assumptions": fp.ASSUMPTIONS}
    common.write_json(out / "fp_bounds.json", result)
    _write_md(out, result, ns, dtypes)
    _plot(out, table, dtypes)
    bad = [r for r in table if r["max_violation"] > 1]
    print(f"wrote {out}/fp_bounds.md, .json, error_vs_n.png in {clock.seconds:.0f}s; "
          f"violations: {len(bad)}")
    return 1 if bad else 0


def _fmt(v, nd=1):
    if v is None or (isinstance(v, float) and math.isinf(v)):
        return "inf"
    return f"{v:,.{nd}f}"


def _write_md(out, res, ns, dtypes):
    L = ["# FP softmax error bounds\n", f"Regenerate: `{res['command']}` "
         f"({res['seconds']:.0f} s; single-threaded except the row kernel).\n",
         "Bound: |p̂_i - p_i| <= rel·p_i + abs_floor for every finite input of length n "
         "(analysis.fp.error_bound, no score_range; abs_floor ≈ 0.37u covers the exp-argument "
         "rounding of entries far below the max; the same proof gives the sharper per-entry "
         "form rel·p_i + B·min(p_i(e^{u d_i} - 1), 0.37u) + underflow, also checked). "
         "*worst* = the smallest rel that covers every input we tried given those per-entry "
         "terms (random, ascending, ramp, equal, const_stress, wide), in units of u; "
         "ratio = bound / worst. 'inf' = vacuous (K·u >= 1). "
         f"blocked uses tiles of {res['block']}.\n",
         f"Assumptions: {res['assumptions']}.\n"]
    for d in dtypes:
        L.append(f"\n## {d} (u = 2^-{fp.FORMATS[d].p})\n")
        L.append("| algorithm | " + " | ".join(f"n={n:g}" for n in ns) + " |")
        L.append("|---|" + "---|" * len(ns))
        for a in fp.ALGORITHMS:
            cells = []
            for n in ns:
                r = next(r for r in res["table"] if r["algorithm"] == a and r["n"] == n
                         and r["dtype"] == d)
                cells.append(f"{_fmt(r['bound_rel_u'])} / {_fmt(r['worst_rel_u'], 2)} "
                             f"({_fmt(r['ratio'])}x, {r['worst_input']})")
            L.append(f"| {a} | " + " | ".join(cells) + " |")
        L.append("\nCells: proven rel (u) / worst measured (u) (ratio, worst input). "
                 "References: " + ", ".join(sorted({r["reference"] for r in res["table"]
                                                    if r["dtype"] == d})) + ".")
    L.append("\n## Thresholds (round-to-nearest; mpmath at 40 digits, checked against the real "
             "dtype in tests/test_fp.py)\n")
    L.append("| dtype | exp overflows for x > | exp subnormal for x < (FTZ gives 0) | "
             "exp rounds to 0 for x <= | unshifted safe width | sequential sum of ones "
             "stagnates at n | largest n with finite n·1 |")
    L.append("|---|---|---|---|---|---|---|")
    for t in res["thresholds"]:
        L.append(f"| {t['dtype']} | {t['exp_overflow']:.10g} | {t['exp_subnormal']:.10g} | "
                 f"{t['exp_underflow_to_zero']:.10g} | {t['unshifted_range']:.8g} | "
                 f"{t['n_sum_stagnates']:.6g} | {float(t['n_sum_finite']):.6g} |")
    L.append("\n## exp accuracy (ulp of the result)\n")
    L.append("| dtype | measured max | assumed k |")
    L.append("|---|---|---|")
    for d, e in res["exp"].items():
        extra = ""
        if "exhaustive" in e:
            extra = (f"; exhaustive over {e['exhaustive']['values']:,} float32 values: "
                     f"{e['exhaustive']['max_ulp']:.4f} at t = {e['exhaustive']['at']:.8g}")
        L.append(f"| {d} | {e['measured_max_ulp']:.4f}{extra} | {e['assumed_ulp']} |")
    L.append("\nfloat16/bfloat16: every representable t in the exp range vs float64 exp; "
             "float32/float64: 20,001-point grid vs mpmath (float32 also exhaustively when "
             "run with --exhaustive-exp).")
    if res["rows"]:
        r = res["rows"]
        L.append(f"\n## A-posteriori bound on attention rows ({r['source']}, shape "
                 f"{r['shape']})\n")
        L.append("Normwise: max_i |p̂_i - p_i| / max_i p_i, FP32 three-pass vs float64 "
                 "reference; bound from n, max, range, E_p[m-x] (kernels/fp_rows.py).\n")
        L.append("| layer | rows | median bound (u) | max bound (u) | median measured (u) | "
                 "max measured (u) | max measured/bound |")
        L.append("|---|---|---|---|---|---|---|")
        for x in r["layers"]:
            L.append(f"| {x['layer']} | {x['rows']} | {x['median_bound_u']:.1f} | "
                     f"{x['max_bound_u']:.1f} | {x['median_measured_u']:.2f} | "
                     f"{x['max_measured_u']:.2f} | {x['max_measured_over_bound']:.3f} |")
        t = r["throughput"]
        L.append(f"\nThroughput (same tensor, best of 3): bound kernel = "
                 f"{t['bound_ratio']:.2f}x one float32 torch.softmax pass; bound + measured "
                 f"error = {t['bound_and_measure_ratio']:.2f}x (torch 1 thread, numba "
                 f"{t['threads']} thread(s)).")
    L.append("\n![error vs n](error_vs_n.png)\n")
    common.write_markdown(out / "fp_bounds.md", L)


def _plot(out, table, dtypes):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    d = "float32" if "float32" in dtypes else dtypes[0]
    for i, a in enumerate(fp.ALGORITHMS):
        rs = sorted((r for r in table if r["algorithm"] == a and r["dtype"] == d),
                    key=lambda r: r["n"])
        ns = [r["n"] for r in rs]
        c = f"C{i}"
        ax.loglog(ns, [r["bound_rel_u"] for r in rs], "-", color=c, label=f"{a} bound")
        ax.loglog(ns, [max(r["worst_rel_u"], 1e-2) for r in rs], "o--", color=c,
                  label=f"{a} worst")
    ax.set_xlabel("n")
    ax.set_ylabel(f"relative error / u ({d})")
    ax.set_title("Proven bound vs worst measured error")
    ax.legend(fontsize=7, ncol=2)
    common.save_figure(fig, out / "error_vs_n.png", dpi=120)
