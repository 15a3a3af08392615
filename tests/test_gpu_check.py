"""softcert gpu-check: the script a lent GPU runs, exercised here on the Triton interpreter
(--small). Oracles: its own checks must find no violation of a sound bound, and must flag a
measurement that exceeds an assumption (or it could never fail on the GPU)."""
import json

import pytest

pytest.importorskip("triton")  # the optional `triton` extra (make test installs it)

from softcert.cli import main  # noqa: E402
from softcert.cli.commands import gpu_check  # noqa: E402


def test_small_run_on_the_interpreter_writes_md_and_json_with_no_failure(tmp_path):
    assert main(["gpu-check", "--small", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "kernels.json").read_text())
    assert r["failures"] == [] and not r["compiled"] and r["exp32"]["values"] > 10_000
    assert r["exp32"]["max_ulps"] <= r["assumed_exp32_ulps"]
    assert all(a["violations"] == 0 for a in r["attention"]) and len(r["attention"]) == 7
    assert r["vertex"]["violations"] == 0 and r["topk"]["violations"] == 0
    assert "Regenerate with `softcert gpu-check --small" in (tmp_path / "kernels.md").read_text()


def test_failures_name_every_broken_assumption():
    r = {"exp32": {"max_ulps": 62.7}, "assumed_exp32_ulps": 2.0,
         "exp64": {"max_exact_ulps_of_screened": 2.5}, "assumed_exp64_ulps": 2,
         "attention": [{"kind": "random", "n": 64, "violations": 1}, {"kind": "ascending", "n": 64, "violations": 0}],
         "vertex": {"violations": 0}, "topk": {"violations": 3}}
    bad = gpu_check.failures(r)
    assert len(bad) == 4 and bad[0].startswith("float32 exp: 62.700 ulp")
    assert any("attention random" in b for b in bad) and any(b.startswith("topk: 3") for b in bad)


def test_exact_float64_exp_error_is_measured_in_ulps():
    x = -1.5
    import math

    y = math.exp(x)
    assert gpu_check._exact_ulps64(x, y) <= 0.5 + 1e-9  # glibc's exp is correctly rounded here
    assert 0.5 < gpu_check._exact_ulps64(x, math.nextafter(math.nextafter(y, 1.0), 1.0)) <= 2.5


def test_on_the_interpreter_the_full_run_is_refused_by_name(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what a machine without a CUDA device runs
    assert main(["gpu-check", "--out", "unused"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_gpu_only_sections_run_end_to_end_on_the_cpu():
    """timings, the device probe and the certify probe run only on a GPU; here they run on
    CPU tensors at a tiny size, so the script a lent machine runs once has run before."""
    rows = gpu_check.timings("cpu", rows_n=((8, 4),), heads_n_d=((1, 8, 4),))
    assert [r["baseline"] for r in rows] == ["torch.sort", "torch.sort", "scaled_dot_product_attention"]
    assert all(r["seconds"] > 0 and r["ratio"] > 0 for r in rows)
    where = gpu_check.device_probe("cpu")
    # no error anywhere; fp.softmax returns numpy whatever the input (a finding for the GPU run)
    assert len(where) == 6 and set(where.values()) <= {"cpu", "numpy (host)"}, where
    probe = gpu_check.certify_probe("cpu")
    assert probe["ok"] and probe["device"] == "cpu", probe


def test_float64_gemm_check_passes_ieee_and_flags_a_fixed_point_emulation():
    """On the CPU the device product is the CPU's own: within the bound. A simulated
    fixed-point GEMM (each row of A kept to 55 bits relative to its largest entry, as cuBLAS's
    float64 emulation does) must be flagged, or the check could never fail on a GPU."""
    import torch

    ok = gpu_check.gemm64_check("cpu", n=64)
    assert ok["violations"] == 0 and ok["max_err_over_bound"] <= 1

    def fixed_point(a, b):
        scale = 2.0 ** (torch.floor(torch.log2(a.abs().amax(1, keepdim=True))) - 54)
        return torch.round(a / scale) * scale @ b

    bad = gpu_check.gemm64_check("cpu", n=64, matmul=fixed_point)
    assert bad["violations"] > 0
    assert gpu_check.failures({**_MINIMAL, "gemm64": bad})[-1].startswith("gemm64:")


_MINIMAL = {"exp32": {"max_ulps": 1.0}, "assumed_exp32_ulps": 2.0, "exp64": {"max_exact_ulps_of_screened": 1.0},
            "assumed_exp64_ulps": 2, "attention": [], "vertex": {"violations": 0}, "topk": {"violations": 0}}
