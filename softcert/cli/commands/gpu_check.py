"""``softcert gpu-check``: the measurements a GPU run of softcert rests on, in one script.

Nothing measured on a CPU is assumed on a GPU. On the device the kernels run on, this
command (1) sweeps the float32 exp of the Triton kernels over every float32 argument they
take (t in [-104, 0]: scores minus their row maximum; below -104 exp underflows to 0) and
fails when the measured error exceeds the accuracy their bounds assume
(``kernels.floating.triton_exp32_ulps``); (2) samples their float64 exp against glibc's;
(3) checks every kernel's bound against an oracle (attention: float64 reference on the
stress kinds of ``analysis.fp``; Vertex-Softmax: every vertex of the box; top-k: the tail
mass of the certified k, summed exactly); (4) times them against one ``torch.sort`` or
``scaled_dot_product_attention`` (TF32 off) of the same data; (5) tries ``certify.verify``
on the device. It writes kernels.md and kernels.json to ``--out`` and exits 1 on any
violation. Without a GPU, ``--small`` runs the same checks on the Triton interpreter at a
small size (the sweep strided, no timings): a test of the script, not a measurement.
"""
from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from softcert.cli import common

NEG_ZERO_BITS, NEG_104_BITS = 0x80000000, 0xC2D00000  # float32 bit patterns of -0.0 and -104.0


def _float32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    signed = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return signed.view(torch.float32)


def _spacing(ref: torch.Tensor, digits: int, smallest: int) -> torch.Tensor:
    """The spacing of a format with ``digits`` significand bits at |ref| (float64):
    2^(e - digits) for ref = m 2^e, m in [0.5, 1), never below the subnormal quantum
    2^smallest (float32: 24, -149; float64: 53, -1074)."""
    _, e = torch.frexp(ref)
    return torch.exp2((e.to(torch.float64) - digits).clamp(min=smallest))


def exp32_sweep(libdevice: bool | None, stride: int = 1, chunk: int = 2**26) -> dict:
    """Max error in float32 ulps of the kernels' exp over every ``stride``-th float32 in
    [-104, 0], against float64 exp on the same device (itself within 2^-29 float32 ulp)."""
    from softcert.kernels.triton_math import kernel_device, kernel_exp

    dev = kernel_device()
    worst, at, count, above = 0.0, 0.0, 0, {1: 0, 2: 0, 4: 0, 16: 0}
    for start in range(NEG_ZERO_BITS, NEG_104_BITS + 1, chunk * stride):
        stop = min(start + chunk * stride, NEG_104_BITS + 1)
        x = _float32_from_bits(torch.arange(start, stop, stride, dtype=torch.int64, device=dev))
        y = kernel_exp(x, libdevice).to(torch.float64)
        ref = torch.exp(x.to(torch.float64))
        err = (y - ref).abs() / _spacing(ref, 24, -149)
        i = int(err.argmax())
        if float(err[i]) > worst:
            worst, at = float(err[i]), float(x[i])
        count += x.numel()
        for k in above:
            above[k] += int((err > k).sum())
    return {"values": count, "stride": stride, "exhaustive": stride == 1, "max_ulps": worst,
            "at": at, "above": {str(k): v for k, v in above.items()}}


def _exact_ulps64(x: float, y: float) -> float:
    """|y - exp(x)| in float64 ulps of exp(x), exp(x) from mpmath at 60 digits."""
    import mpmath

    with mpmath.workdps(60):
        ref = mpmath.exp(mpmath.mpf(x))
        ulp = mpmath.ldexp(1, max(int(mpmath.floor(mpmath.log(ref, 2))) - 52, -1074))
        return float(abs(mpmath.mpf(y) - ref) / ulp)


def exp64_sample(n: int, assumed: float, seed: int = 0, exact_limit: int = 1000) -> dict:
    """Max error in float64 ulps of the kernels' float64 exp on n points of [-745, 0] (and the
    ends). Screened against glibc's exp on the CPU (within 1 ulp itself): a point more than
    ``assumed`` - 1 ulp from it is measured exactly (mpmath); more than ``exact_limit`` such
    points count as a failure."""
    from softcert.kernels.triton_math import kernel_exp

    g = torch.Generator().manual_seed(seed)
    x = torch.cat([-745.0 * torch.rand(n, generator=g, dtype=torch.float64),
                   torch.tensor([0.0, -1e-300, -708.39, -709.78, -744.44, -745.13], dtype=torch.float64)])
    y = kernel_exp(x).cpu()
    ref = torch.exp(x)
    err = (y - ref).abs() / _spacing(ref, 53, -1074)
    suspects = (err > assumed - 1).nonzero().flatten().tolist()
    exact = [_exact_ulps64(float(x[i]), float(y[i])) for i in suspects[:exact_limit]]
    worst = max(exact, default=0.0) if len(suspects) <= exact_limit else math.inf
    return {"values": x.numel(), "max_ulps_vs_glibc": float(err.max()), "screened_out": len(suspects),
            "max_exact_ulps_of_screened": worst}


def _attention_reference(q, k, v) -> np.ndarray:
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def attention_soundness(lengths, d: int, block: int, seed: int = 0) -> list[dict]:
    """Per stress kind and length: violations of |out - O| <= bound (O in float64)."""
    from softcert.analysis import fp

    rows = []
    for n in lengths:
        for kind in fp.ATTENTION_STRESS:
            q, k, v = fp.attention_stress_inputs(kind, n, d, np.random.default_rng(seed + n))
            res = fp.attention(q, k, v, block=block, backend="triton")
            err = np.abs(np.asarray(res.out, dtype=np.float64) - _attention_reference(q, k, v))
            bound = np.asarray(res.bound)
            rows.append({"kind": kind, "n": n, "violations": int((err > bound).sum()),
                         "max_err_over_bound": float((err / np.maximum(bound, 1e-300)).max())})
    return rows


def vertex_soundness(rows: int, n: int, seed: int = 0) -> dict:
    """Triton Vertex-Softmax bounds against every vertex of each box (float64, with the
    rounding tolerance 64·n·2^-53·max|c| of tests/test_kernels_vertex.py)."""
    from softcert import bounds

    g = torch.Generator().manual_seed(seed)
    c = torch.randn(rows, n, generator=g, dtype=torch.float64)
    lo = 3 * torch.randn(rows, n, generator=g, dtype=torch.float64)
    hi = lo + 2 * torch.rand(rows, n, generator=g, dtype=torch.float64)
    res = bounds.vertex_softmax(c, lo, hi, backend="triton")
    choice = torch.tensor(list(np.ndindex(*(2,) * n)), dtype=torch.bool)  # (2^n, n)
    s = torch.where(choice, hi[:, None, :], lo[:, None, :])
    values = (c[:, None, :] * torch.softmax(s, -1)).sum(-1)
    tol = 64 * n * 2.0**-53 * c.abs().amax(-1)
    bad = (res.upper.cpu() < values.amax(-1) - tol) | (res.lower.cpu() > values.amin(-1) + tol)
    return {"rows": rows, "n": n, "violations": int(bad.sum())}


def topk_soundness(rows: int, n: int, eps: float = 0.01, seed: int = 0) -> dict:
    """The Triton top-k certificate's k against the tail mass of its top k, summed exactly
    (math.fsum of float64 weights: relative error ~1e-16); and its k against Numba's."""
    from softcert.analysis import topk

    g = torch.Generator().manual_seed(seed)
    s = 4 * torch.randn(rows, n, generator=g, dtype=torch.float64)
    k = topk.certified_k(s, eps, backend="triton").cpu()
    k_numba = topk.certified_k(s, eps, backend="numba")
    w = torch.exp(s - s.amax(-1, keepdim=True)).sort(-1, descending=True).values.numpy()
    tails = [math.fsum(row[int(kk):].tolist()) / math.fsum(row.tolist()) for row, kk in zip(w, k)]
    return {"rows": rows, "n": n, "eps": eps, "violations": int(sum(t > eps for t in tails)),
            "k_differs_from_numba": int((k != k_numba).sum())}


def _seconds(fn, dev: str, repeat: int = 10) -> float:
    def synced():
        fn()
        if dev == "cuda":
            torch.cuda.synchronize()
    return common.median_seconds(synced, repeat)


TIMED_ROWS = ((65536, 128), (4096, 1024))  # the kernels issue's targets
TIMED_HEADS = ((64, 1024, 64), (16, 4096, 64))


def timings(dev: str = "cuda", rows_n=TIMED_ROWS, heads_n_d=TIMED_HEADS) -> list[dict]:
    """Each GPU path against its baseline in the same run (targets: the kernels issue)."""
    from softcert import bounds
    from softcert.analysis import fp, topk

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 baselines are IEEE too
    out, g = [], torch.Generator(device=dev).manual_seed(0)
    for rows, n in rows_n:
        c, lo = (torch.randn(rows, n, generator=g, device=dev, dtype=torch.float64) for _ in range(2))
        hi = lo + 1
        sort = _seconds(lambda c=c: torch.sort(c, -1), dev)
        vs = _seconds(lambda c=c, lo=lo, hi=hi: bounds.vertex_softmax(c, lo, hi, backend="triton"), dev, 3)
        tk = _seconds(lambda lo=lo: topk.certified_k(lo, 0.01, backend="triton"), dev, 3)
        out += [{"what": f"vertex_softmax {rows}x{n}", "seconds": vs, "baseline": "torch.sort", "ratio": vs / sort},
                {"what": f"certified_k {rows}x{n}", "seconds": tk, "baseline": "torch.sort", "ratio": tk / sort}]
    for heads, n, d in heads_n_d:
        # CUDA tensors in, CUDA tensors out: no host copy is timed (the bound runs on the device)
        q, k, v = (torch.randn(heads, n, d, generator=g, device=dev) for _ in range(3))
        sdpa = _seconds(lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(q, k, v), dev)
        att = _seconds(lambda q=q, k=k, v=v: fp.attention(q, k, v, backend="triton"), dev, 3)
        fwd = _seconds(lambda q=q, k=k, v=v: _attention_forward(q, k, v), dev, 3)
        out.append({"what": f"fp.attention {heads}x{n}x{d}", "seconds": att, "forward_seconds": fwd,
                    "baseline": "scaled_dot_product_attention", "ratio": att / sdpa})
    return out


def _attention_forward(q, k, v, block: int = 128):
    """The tiled Triton kernel alone (no bound), as ``fp.attention`` runs it."""
    from softcert.analysis import fp
    from softcert.kernels.floating import triton_exp32_ulps
    from softcert.kernels.triton_attention import flash_attention_triton
    from softcert.kernels.triton_math import interpreted

    fmt = fp.FORMATS["float32"]
    ue = 2 * triton_exp32_ulps(interpreted()) * fmt.u
    return flash_attention_triton(q, k, v, block, fmt.u, ue, fmt.q, with_bound=False)


def _where(fn) -> str:
    try:
        out = fn()
    except Exception as exc:  # a measurement: the error is the finding
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    t = out if isinstance(out, torch.Tensor) else next(
        (v for v in getattr(out, "__dict__", {}).values() if isinstance(v, torch.Tensor)), None)
    if isinstance(out, np.ndarray):
        return "numpy (host)"
    return str(t.device) if t is not None else type(out).__name__


def device_probe(dev: str = "cuda") -> dict:
    """Where each public bound of ``bounds`` and ``analysis`` returns CUDA inputs' results
    (the kernels issue asks for the input's device), or the error it raises."""
    from softcert import bounds
    from softcert.analysis import fp, topk

    g = torch.Generator(device=dev).manual_seed(0)
    c, lo = (torch.randn(64, 16, generator=g, device=dev, dtype=torch.float64) for _ in range(2))
    q = torch.randn(2, 64, 16, generator=g, device=dev)
    return {
        "bounds.vertex_softmax(numba)": _where(lambda: bounds.vertex_softmax(c, lo, lo + 1)),
        "bounds.vertex_softmax(triton)": _where(lambda: bounds.vertex_softmax(c, lo, lo + 1, backend="triton")),
        "analysis.topk.certified_k": _where(lambda: topk.certified_k(lo, 0.01)),
        "analysis.topk.tail_mass": _where(lambda: topk.tail_mass(lo, 4)),
        "analysis.fp.softmax": _where(lambda: fp.softmax(q[0, 0])),
        "analysis.fp.attention(triton)": _where(lambda: fp.attention(q, q, q, backend="triton")),
    }


def gemm64_check(dev: str = "cuda", n: int = 256, matmul=None) -> dict:
    """float64 A @ B on ``dev`` against the CPU's, within the bound both obey if the device's
    float64 is IEEE with round to nearest: |C_dev - C_cpu| <= 2 γ_n |A||B| (any summation
    order, FMAs included; certify.crown.ARITHMETIC). Rows mix magnitudes 2^±40, where a
    fixed-point emulated GEMM (cuBLAS float64 emulation: about 55 bits relative to a row's
    largest entry) loses the small products' bits and exceeds the bound. ``matmul``: the
    product to check (default torch's on ``dev``)."""
    from softcert.certify.spec import EMULATION_SETTINGS
    from softcert.kernels.floating import gamma

    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g, dtype=torch.float64) * 2.0 ** (torch.rand(n, n, generator=g) * 80 - 40)
    b = torch.randn(n, n, generator=g, dtype=torch.float64) * 2.0 ** (torch.rand(n, n, generator=g) * 80 - 40)
    prod = matmul or (lambda x, y: (x.to(dev) @ y.to(dev)).cpu())
    c = prod(a, b)
    bound = 2.02 * gamma(n) * (a.abs() @ b.abs())  # 2.02: the CPU's own rounding of |A||B| too
    ratio = (c - a @ b).abs() / bound
    return {"n": n, "max_err_over_bound": float(ratio.max()), "violations": int((ratio > 1).sum()),
            "emulation_setting": os.environ.get(EMULATION_SETTINGS[0], "(unset)")}


def certify_probe(dev: str = "cuda") -> dict:
    """certify.verify with a zoo model and inputs on the GPU: the answer, or the error."""
    from softcert import certify
    from softcert.certify import zoo

    model, x, y = zoo.load("mnist-vit1")
    t = time.perf_counter()
    try:
        res = certify.verify(model.to(dev), x[:2].to(dev), y[:2].to(dev), 0.001, method="crown")
        return {"ok": True, "device": str(res.lower_margin.device), "seconds": time.perf_counter() - t}
    except Exception as exc:  # a measurement: whatever fails is the finding
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def measure(small: bool) -> dict:
    from softcert.kernels import floating
    from softcert.kernels.triton_math import interpreted

    compiled = not interpreted()
    if not compiled and not small:
        raise ValueError("no CUDA device: the Triton kernels only interpret here; pass --small "
                         "to run the checks at a test size (no measurement of a GPU)")
    stride = 1 if not small else 2**16
    result = {"device": torch.cuda.get_device_name() if compiled else "cpu (Triton interpreter)",
              "compiled": compiled, "small": small, "torch": torch.__version__,
              "python": platform.python_version(),
              "exp32": exp32_sweep(None, stride), "assumed_exp32_ulps": floating.triton_exp32_ulps(not compiled),
              "exp64": exp64_sample(10_000 if small else 2**24, floating.EXP_ULPS),
              "assumed_exp64_ulps": floating.EXP_ULPS,
              "attention": attention_soundness((60,) if small else (64, 1024, 8192), 8 if small else 64,
                                               20 if small else 128),
              "vertex": vertex_soundness(64 if small else 4096, 6),
              "topk": topk_soundness(64 if small else 4096, 16 if small else 128)}
    if compiled:  # the approximate exp, for the record only (never assumed)
        result["exp32_tl_exp"] = exp32_sweep(False, stride)
        result["timings"] = timings()
        result["devices"] = device_probe()
        result["gemm64"] = gemm64_check()
        result["certify"] = certify_probe()
    return result


def failures(r: dict) -> list[str]:
    """Every way the measurement contradicts an assumption or a bound."""
    bad = []
    if r["exp32"]["max_ulps"] > r["assumed_exp32_ulps"]:
        bad.append(f"float32 exp: {r['exp32']['max_ulps']:.3f} ulp > assumed {r['assumed_exp32_ulps']}")
    if r["exp64"]["max_exact_ulps_of_screened"] > r["assumed_exp64_ulps"]:
        bad.append(f"float64 exp: {r['exp64']['max_exact_ulps_of_screened']:.3f} ulp > assumed {r['assumed_exp64_ulps']}")
    bad += [f"attention {a['kind']} n={a['n']}: {a['violations']} violations" for a in r["attention"] if a["violations"]]
    for name in ("vertex", "topk", "gemm64"):
        if r.get(name, {}).get("violations"):
            bad.append(f"{name}: {r[name]['violations']} violations")
    return bad


def _forward(row: dict) -> str:
    """The kernel-alone time of an attention row (the rest is its bound)."""
    return f" (kernel alone {row['forward_seconds']:.5f})" if "forward_seconds" in row else ""


def to_markdown(r: dict, command: str) -> list[str]:
    e32 = r["exp32"]
    which = " (every float32)" if e32["exhaustive"] else f" (every {e32['stride']}th)"
    lines = ["# softcert on the GPU: function accuracy, kernel soundness, timings", "",
             f"Regenerate with `{command}`. Device: {r['device']}; torch {r['torch']}, Python {r['python']}.", "",
             "| check | measured | assumed / target | result |", "|---|---|---|---|",
             f"| float32 exp of the kernels, {e32['values']:,} values in [-104, 0]{which} | "
             f"{e32['max_ulps']:.3f} ulp at {e32['at']:.6g} | {r['assumed_exp32_ulps']} ulp | "
             f"{'ok' if e32['max_ulps'] <= r['assumed_exp32_ulps'] else 'FAIL'} |",
             f"| float64 exp of the kernels, {r['exp64']['values']:,} values in [-745, 0] | "
             f"{r['exp64']['max_ulps_vs_glibc']:.3f} ulp from glibc; {r['exp64']['screened_out']} points above "
             f"{r['assumed_exp64_ulps'] - 1} measured exactly: max {r['exp64']['max_exact_ulps_of_screened']:.3f} ulp | "
             f"{r['assumed_exp64_ulps']} ulp | {'ok' if r['exp64']['max_exact_ulps_of_screened'] <= r['assumed_exp64_ulps'] else 'FAIL'} |"]
    if "exp32_tl_exp" in r:
        t = r["exp32_tl_exp"]
        lines.append(f"| tl.exp (approximate ex2; not used) | {t['max_ulps']:.1f} ulp at {t['at']:.6g} | never assumed | |")
    for a in r["attention"]:
        lines.append(f"| attention bound, {a['kind']}, n = {a['n']} | max err/bound {a['max_err_over_bound']:.3g} | "
                     f"<= 1 | {a['violations']} violations |")
    v, t = r["vertex"], r["topk"]
    lines += [f"| Vertex-Softmax vs every vertex, {v['rows']} rows, n = {v['n']} | | | {v['violations']} violations |",
              f"| top-k k vs exact tail mass, {t['rows']} rows, n = {t['n']} | {t['k_differs_from_numba']} rows differ "
              f"from Numba | tail <= {t['eps']} | {t['violations']} violations |"]
    if "timings" in r:
        lines += ["", "| timed | seconds | baseline | ratio |", "|---|---|---|---|"]
        lines += [f"| {x['what']} | {x['seconds']:.5f}{_forward(x)} | {x['baseline']} | {x['ratio']:.2f} |"
                  for x in r["timings"]]
        lines += ["", "| called with CUDA tensors | result on / error |", "|---|---|"]
        lines += [f"| {name} | {where} |" for name, where in r["devices"].items()]
        lines += ["", f"certify.verify on the device: {r['certify']}"]
        m = r["gemm64"]
        lines += ["", f"float64 GEMM {m['n']}x{m['n']} (magnitudes 2^±40) against the CPU: max error / 2γ_n|A||B| "
                      f"{m['max_err_over_bound']:.3g}, {m['violations']} violations "
                      f"(CUBLAS_EMULATE_DOUBLE_PRECISION {m['emulation_setting']})"]
    return lines


def configure(parser) -> None:
    parser.add_argument("--out", default="docs/gpu", help="folder for kernels.md and kernels.json")
    parser.add_argument("--small", action="store_true",
                        help="test size on the Triton interpreter (strided sweep, no timings); "
                             "the only mode without a CUDA device")


def run(args) -> int:
    r = measure(args.small)
    command = common.command_line(args, "gpu-check", [("--out", args.out), ("--small", args.small)])
    r["failures"] = failures(r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = to_markdown(r, command)
    common.write_markdown(out / "kernels.md", md)
    common.write_json(out / "kernels.json", {"command": command, **r})
    print("\n".join(md))
    for f in r["failures"]:
        print(f"FAIL: {f}")
    return 1 if r["failures"] else 0
