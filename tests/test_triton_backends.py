"""Triton backends in interpreter mode (TRITON_INTERPRET=1 on CPU; small sizes): sound against
float64/mpmath oracles and within the proven rounding error of the Numba/torch paths, never
compared bit for bit. Nothing imports triton unless backend="triton" is asked for."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import brute_force_extrema
from test_kernels_vertex import assert_within_margin

from softcert import bounds

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton
pytest.importorskip("triton")  # the optional `triton` extra (make test installs it)

from softcert.analysis import fp  # noqa: E402
from softcert.kernels import floating  # noqa: E402


def reference64(q, k, v):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_nothing_imports_triton_unless_asked():
    code = ("import sys, numpy as np; from softcert import bounds, kernels, analysis;"
            "import softcert.analysis.fp as fp, softcert.analysis.topk;"
            "import softcert.cli.commands.bench;"
            "q = np.ones((2, 4), np.float32); fp.attention(q, q, q, block=2);"
            "bounds.vertex_softmax([1.0, 2.0], [0.0, 0.0], [1.0, 1.0]);"
            "print('triton' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_interpreter_exp_is_within_the_assumed_ulps():
    """tl.exp is numpy's float32 exp in the interpreter: measure it on a dense grid of the
    arguments attention uses (t <= 0, down to the underflow threshold) against float64."""
    t = np.linspace(-104.0, 0.0, 2_000_001).astype(np.float32)
    y = np.exp(t).astype(np.float64)
    ex = np.exp(t.astype(np.float64))  # float64 exp: 2^-29 of a float32 ulp
    e = np.floor(np.log2(np.maximum(ex, 2.0 ** -126)))
    ulp = np.exp2(np.maximum(e, -126) - 23)
    assert float(np.max(np.abs(y - ex) / ulp)) <= floating.triton_exp32_ulps(interpreted=True) - 0.01


def test_compiled_kernels_take_libdevice_exp_never_the_approximate_one(monkeypatch):
    """Compiled for a GPU, tl.exp on float32 is off by up to 62.7 ulp (shared/notes/gpu_h200.md):
    every Triton kernel calls kernels.triton_math.exp, which is libdevice's exp when compiled,
    and the accuracy assumed there is libdevice's (2 ulp), never the interpreter's."""
    import ast
    from pathlib import Path

    from softcert.kernels import triton_math

    for path in Path(triton_math.__file__).parent.glob("triton_*.py"):
        if path.name == "triton_math.py":
            continue
        calls = [ast.unparse(n.func) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        assert "tl.exp" not in calls and "tl.exp2" not in calls, path.name
        if "exp" in calls:  # every exp call passes the LIBDEVICE flag its launcher sets
            assert "LIBDEVICE=libdevice_exp()" in path.read_text().replace(" ", ""), path.name
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert triton_math.libdevice_exp() and floating.triton_exp32_ulps(triton_math.interpreted()) == 2.0
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_math.libdevice_exp() and floating.triton_exp32_ulps(triton_math.interpreted()) == 4.0


@pytest.mark.parametrize("kind", ["random", "equal_scores", "wide_range", "ascending"])
@pytest.mark.parametrize("block", [8, 20])
def test_attention_sound_and_within_the_proven_error_of_numba(kind, block):
    rng = np.random.default_rng(block)
    q, k, v = fp.attention_stress_inputs(kind, 60, 8, rng)
    t = fp.attention(q, k, v, block=block, backend="triton")
    nb = fp.attention(q, k, v, block=block, backend="numba")
    ref = reference64(q, k, v)
    slack = 1e-12 * np.abs(v).max()
    assert (np.abs(t.out - ref) <= t.bound + slack).all()
    # both are within their bounds of the same exact value, so of each other
    assert (np.abs(t.out.astype(np.float64) - nb.out) <= t.bound + nb.bound).all()
    tiles = -(-60 // block)
    for r in (t.rescales, nb.rescales):
        assert (0 <= r).all() and (r <= tiles - 1).all()
    if kind in ("equal_scores", "ascending"):  # one nonzero product per score: exact in any
        # order, so the same maxima; random scores may differ in the last bit between the
        # two summation orders, and a near-tie may then rescale in one backend only
        assert (t.rescales == nb.rescales).all()


def test_attention_torch_tensors_and_shapes():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 5)
    res = fp.attention(q, k, v, block=4, backend="triton")
    assert res.out.shape == (2, 3, 4, 5) and res.backend == "triton"
    ref = torch.from_numpy(reference64(q.numpy(), k.numpy(), v.numpy()))
    assert ((res.out.double() - ref).abs() <= res.bound + 1e-12).all()


# ----------------------------------------------------------------------------- vertex


@pytest.mark.parametrize("rows,n", [(40, 1), (30, 7), (12, 33)])
def test_vertex_triton_matches_numba_within_the_margin_and_is_sound(rows, n):
    rng = np.random.default_rng(rows + n)
    c = torch.tensor(rng.normal(size=(rows, n)))
    lo = torch.tensor(rng.normal(size=(rows, n)) * 4)
    hi = lo + torch.tensor(rng.exponential(size=(rows, n)))
    lo[::5, 0] = float("-inf")
    if n > 1:
        lo[::7, -1] = hi[::7, -1] = float("-inf")
    t = bounds.vertex_softmax(c, lo, hi, backend="triton")
    nb = bounds.vertex_softmax(c, lo, hi, backend="numba")
    assert_within_margin(t, nb, c, lo, hi)
    for r in range(0, rows, 6):
        assert bounds.check_certificate(c[r], lo[r], hi[r], t.upper[r].item()).holds
        assert bounds.check_certificate(c[r], lo[r], hi[r], t.lower[r].item(), sense="lower").holds


def test_vertex_triton_exact_against_brute_force_including_stalls_and_robust_rows():
    """Random boxes, the stalled row of tests/test_kernels_dinkelbach.py and a row whose
    weights leave the fast path: every bound within 1e-9 of the 50-digit optimum."""
    rng = np.random.default_rng(5)
    rows = [(rng.normal(size=6) * 3, lo := rng.normal(size=6) * 4, lo + rng.exponential(size=6))
            for _ in range(6)]
    rows.append((np.array([0.0077753672332860095, 0.009140629289713511, -0.003583354387416221]),
                 np.array([5.904595162260881, 63.9006806930976, -3.530350695088374]),
                 np.array([119.88569787899021, 63.9007158660632, 161.86688445768536])))
    rows.append((np.array([1.0, -2.0, 0.5]), np.array([-900.0, 0.0, -10.0]),
                 np.array([-800.0, 1.0, 5.0])))
    for c, lo, hi in rows:
        res = bounds.vertex_softmax(c, lo, hi, backend="triton")
        worst, best = brute_force_extrema(c, lo, hi)
        scale = max(abs(float(best)), abs(float(worst)), float(np.abs(c).max()))
        assert float(best) <= res.upper.item() + 1e-300 and res.upper.item() - float(best) <= 1e-9 * scale
        assert res.lower.item() <= float(worst) and float(worst) - res.lower.item() <= 1e-9 * scale
        assert bounds.check_certificate(c, lo, hi, res.upper.item()).holds


def test_triton_dinkelbach_passes_match_numba():
    """The same iteration in both kernels: pass counts agree up to ties in rounding."""
    from softcert.kernels import vertex as kv
    from softcert.kernels.triton_vertex import dinkelbach_triton

    rng = np.random.default_rng(8)
    c, lo = rng.normal(size=(20, 16)), rng.normal(size=(20, 16)) * 2
    hi = lo + rng.random(size=(20, 16))
    passes = np.zeros((20, 2), dtype=np.int64)
    kv.vertex_bounds(c, lo, hi, passes_out=passes)
    _, _, tp, robust = dinkelbach_triton(*(torch.tensor(x) for x in (c, lo, hi)))
    assert not robust.any()
    assert (np.abs(tp.numpy() - passes) <= 1).all() and tp.max() <= kv.MAX_PASSES


def test_bench_says_triton_timing_needs_a_gpu(monkeypatch, capsys):
    import softcert.cli
    from softcert.cli.commands import bench

    monkeypatch.setattr(bench, "gpu_available", lambda: False)
    assert softcert.cli.main(["bench", "--backend", "triton"]) == 0
    assert "timing needs a GPU" in capsys.readouterr().out
    res = bench.measure(shapes=((8, 4),), repeats=1, backends=("numba-kernel", "numba-sweep"))
    assert [r["backend"] for r in res] == ["numba-kernel", "numba-sweep"]


# ----------------------------------------------------------------------------- top-k
def test_topk_triton_matches_numba_and_torch_within_the_rounding_model():
    """Tail sums from the Triton kernel, outward rounded by analysis.topk: the proved τ⁺/τ⁻
    enclose the float64 estimate of every backend, and certified k agree up to a tie
    within the rounding margin."""
    from softcert.analysis import topk

    rng = np.random.default_rng(11)
    s = torch.tensor(rng.normal(size=(6, 40)) * 3)
    s[0, :5] = float("-inf")  # masked keys
    ks = torch.tensor([0, 1, 5, 20, 39, 40])
    up = topk.tail_mass(s, ks, rounding="up", backend="triton")
    down = topk.tail_mass(s, ks, rounding="down", backend="triton")
    for be in ("torch", "numba"):
        est = topk.tail_mass(s, ks, backend=be)
        assert (down <= est).all() and (est <= up).all()
    # the exact tail mass (mpmath) is inside
    import mpmath

    with mpmath.workdps(40):
        for r in range(6):
            row = [mpmath.mpf(float(x)) for x in s[r] if math.isfinite(float(x))]
            w = sorted((mpmath.exp(x) for x in row), reverse=True)
            k = int(ks[r])
            tau = mpmath.fsum(w[k:]) / mpmath.fsum(w) if k < len(w) else mpmath.mpf(0)
            assert mpmath.mpf(float(down[r])) <= tau <= mpmath.mpf(float(up[r]))
    for eps in (0.01, 0.2):
        ct = topk.certify_topk(s, eps, backend="triton")
        cn = topk.certify_topk(s, eps, backend="numba")
        assert (ct.k - cn.k).abs().max() <= 1 and (ct.tail_upper <= eps).all()
        assert "triton" in ct.method
    assert topk.certified_k(s, 0.05, backend="triton").shape == (6,)
    with pytest.raises(ValueError, match="triton"):
        topk.gap_bound(s, 3, backend="triton")


# ----------------------------------------------------------------------------- FP rows
def test_fp_rows_triton_bound_covers_its_measured_error_and_matches_numba():
    """Row statistics from the Triton kernel: the bound covers the measured error of the
    Triton FP32 three-pass softmax (interpreter exps), the mean gap E_p[m-x] agrees with the
    Numba kernel's within the inflation both apply, and the numba bound is the smaller
    (1 ulp exps against the interpreter's 4)."""
    from softcert.kernels import fp_rows

    rng = np.random.default_rng(12)
    x = (rng.standard_normal((3, 6, 48)) * np.array([0.5, 5, 50])[:, None, None]).astype(np.float32)
    x[1, :, 40:] = -np.inf  # masked keys
    x[2, 0, :] = 0.0
    x[2, 0, 0] = 1.0  # constant-term stress
    t = fp_rows.rows_report(x, backend="triton")
    nb = fp_rows.rows_report(x, backend="numba")
    assert (t.n == nb.n).all() and (t.max == nb.max).all() and (t.range == nb.range).all()
    assert np.all(t.measured <= t.bound) and np.all(t.measured > 0)
    assert np.allclose(t.mean_gap, nb.mean_gap, rtol=1e-12, atol=1e-300)
    assert np.all(nb.bound <= t.bound)
    with pytest.raises(ValueError, match="backend"):
        fp_rows.rows_report(x, backend="cuda")
