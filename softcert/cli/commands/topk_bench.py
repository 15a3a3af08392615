"""``softcert topk-bench``: throughput of the top-k certificate kernels, as ratios to torch.sort.

Rows per second at n keys for certified_k / tail mass / gap bounds (Numba and the torch
reference), each against one ``torch.sort`` and one ``torch.topk(k = n/2)`` pass over the
same float64 tensor in the same run (best of ``--repeat``; equal thread counts for torch and
Numba). Scores are synthetic attention-like rows: N(0, 2²) with a tenth of the rows padded.
Writes ``<out>/bench.md`` and ``bench.json`` with the command.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numba
import numpy as np
import torch

from softcert.analysis import topk
from softcert.cli import common
from softcert.kernels import topk as ktopk


def configure(parser):
    parser.add_argument("--out", default="docs/topk", help="output directory (default docs/topk)")
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512, 4096])
    parser.add_argument("--elements", type=int, default=1 << 21,
                        help="scores per tensor (rows = elements / n), default 2^21")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch and Numba threads")
    parser.add_argument("--eps", type=float, default=0.01)


def disagreement(a, b) -> str | None:
    """What two top-k certificates of the same rows contradict, or None.

    Only what is proven is compared, never the bits: each k must be certified (τ⁺_k <= ε,
    k <= valid keys); where both prove minimality (τ⁻_{k-1} > ε) the k are equal, since
    τ_k is non-increasing and the least k with τ_k <= ε is unique; where only one proves it,
    the other k is not smaller.
    """
    for name, c in (("a", a), ("b", b)):
        if bool((c.tail_upper > c.eps).any()) or bool((c.k > c.n_valid).any()):
            return f"certificate {name} claims a k it does not certify"
    if not torch.equal(a.n_valid, b.n_valid):
        return "different numbers of valid keys"
    both = a.minimal_proved & b.minimal_proved
    if bool((a.k != b.k)[both].any()):
        return "different k where both prove minimality"
    if bool((b.k < a.k)[a.minimal_proved].any()) or bool((a.k < b.k)[b.minimal_proved].any()):
        return "a certified k below a proved minimal k"
    return None


def run(args) -> int:
    if args.threads < 1 or args.repeat < 1:
        raise ValueError("threads/repeat: must be >= 1")
    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    rng = np.random.default_rng(0)
    results = []
    for n in common.progress(args.n, desc="topk-bench", unit="n"):
        rows = max(1, args.elements // n)
        s = torch.from_numpy(rng.standard_normal((rows, n)) * 2.0)
        s[::10, n - n // 4:] = float("-inf")
        k_half = torch.full((rows,), n // 2, dtype=torch.int64)
        # partial binds this iteration's tensors (the calls happen inside the loop anyway)
        cases = {
            "torch.sort": partial(torch.sort, s, dim=-1, descending=True),
            "torch.topk(n/2)": partial(torch.topk, s, n // 2, dim=-1),
            "numba certified_k": partial(ktopk.certified_k_numba, s, args.eps),
            "numba tail_mass": partial(ktopk.tail_mass_numba, s, k_half, "up"),
            "numba gap_bound (selection)": partial(ktopk.gap_bound_numba, s, k_half),
            "numba multi_gap_bound(4)": partial(ktopk.multi_gap_bound_numba, s, k_half, 4),
            "torch ref certify_topk": partial(topk.certify_topk, s, args.eps, backend="torch"),
        }
        times = {name: common.best_seconds(fn, args.repeat) for name, fn in cases.items()}
        # a throughput figure only counts if the kernel's certificates agree with the reference's
        problem = disagreement(topk.certify_topk(s, args.eps, backend="numba"),
                               topk.certify_topk(s, args.eps, backend="torch"))
        if problem:
            raise RuntimeError(f"numba and torch top-k certificates disagree at n={n}: {problem}")
        for name, t in times.items():
            results.append({
                "n": n, "rows": rows, "method": name, "seconds": t, "rows_per_s": rows / t,
                "time_vs_sort": t / times["torch.sort"], "time_vs_topk": t / times["torch.topk(n/2)"],
            })
    command = common.command_line(args, "topk-bench")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": command, "threads": args.threads, "eps": args.eps,
            "torch": torch.__version__, "numba": numba.__version__, "results": results}
    common.write_json(out / "bench.json", meta)
    lines = ["# Top-k certificate kernels: throughput", "",
             f"Regenerate: `{command}` (threads = {args.threads}; best of {args.repeat}; "
             "float64 N(0,4) rows, every tenth row with a quarter of its keys masked).", "",
             "time ratio = time / time of the baseline pass over the same tensor in the same "
             "run (< 1 is faster).", "",
             "| n | rows | method | rows/s | time / torch.sort | time / torch.topk(n/2) |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['n']} | {r['rows']} | {r['method']} | {r['rows_per_s']:.3g} | "
                     f"{r['time_vs_sort']:.2f} | {r['time_vs_topk']:.2f} |")
    common.write_markdown(out / "bench.md", lines)
    print("\n".join(lines))
    return 0
