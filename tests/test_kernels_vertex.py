"""The Numba kernel and the torch reference: both sound, and within the proven rounding margin
of each other (never compared bit for bit: their sums run in different orders)."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

from softcert import bounds
from softcert.kernels import floating
from softcert.kernels import vertex as kv

KERNEL = pathlib.Path(kv.__file__)


def margin(c: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """A priori width of a certified bound above the optimum, per row, from the error model.

    Both backends start from a vertex whose value is within the rounding error of the
    optimum and widen by at most four first steps (``floating.first_step``, the a priori step
    of ``kernels.vertex._certify_fast``); the terms are bounded by (c_max - c_min) D and the
    relative error per term by ``term_rel`` of the largest exponent spread.
    """
    active = ~torch.isneginf(hi)
    finite_lo = torch.where(torch.isinf(lo), hi, lo)
    spread = torch.where(active, hi.amax(-1, keepdim=True) - finite_lo, torch.zeros_like(lo))
    rel = floating.term_rel(spread.amax(-1)) + floating.gamma(c.shape[-1] + 1)
    cabs = torch.where(active, c.abs(), torch.zeros_like(c)).amax(-1)
    return 64 * rel * (2 * cabs) + 1e-300


def assert_within_margin(a, b, c, lo, hi):
    tol = margin(c, lo, hi)
    assert ((a.upper - b.upper).abs() <= tol).all()
    assert ((a.lower - b.lower).abs() <= tol).all()
    # ties between candidates make the vertex ambiguous; its value is not
    for va, vb in ((a.upper_vertex, b.upper_vertex), (a.lower_vertex, b.lower_vertex)):
        fa = (c * torch.softmax(va, -1)).sum(-1)
        fb = (c * torch.softmax(vb, -1)).sum(-1)
        assert ((fa - fb).abs() <= tol + 64 * c.shape[-1] * 2.0**-53 * c.abs().amax(-1)).all()


def test_kernel_is_the_bottom_layer():
    """kernels/vertex.py imports nothing of ours but kernels.floating and kernels.threads (the
    thread-count guard around its parallel launch), and keeps no local copy
    of a rounding constant (they are compiled in from kernels.floating)."""
    tree = ast.parse(KERNEL.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= {"__future__", "math", "numpy", "numba", "softcert.kernels",
                        "softcert.kernels.floating", "softcert.kernels.threads"}
    constants = {floating.U64, floating.EXP_REL, floating.TINY, floating.SUBNORMAL_ULP}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.BinOp, ast.Constant)):
            try:
                value = ast.literal_eval(node.value) if isinstance(node.value, ast.Constant) \
                    else eval(compile(ast.Expression(node.value), "<const>", "eval"), {})
            except (NameError, TypeError, ValueError):  # not a constant expression
                continue
            assert value not in constants, ast.unparse(node)


def test_kernel_is_array_in_array_out():
    c = np.array([[1.0, -1.0, 0.5]])
    lo = np.array([[0.0, -1.0, -2.0]])
    hi = lo + 1.0
    low, up, lo_mask, up_mask = kv.vertex_bounds(c, lo, hi)
    assert all(isinstance(x, np.ndarray) for x in (low, up, lo_mask, up_mask))
    assert low.shape == up.shape == (1,) and up_mask.shape == lo_mask.shape == (1, 3)
    assert low[0] <= up[0]


@pytest.mark.parametrize("rows,n", [(300, 1), (200, 7), (64, 33), (8, 1000)])
def test_numba_matches_torch(rows, n):
    rng = np.random.default_rng(rows + n)
    c = torch.tensor(rng.normal(size=(rows, n)))
    lo = torch.tensor(rng.normal(size=(rows, n)) * 4)
    hi = lo + torch.tensor(rng.exponential(size=(rows, n)))
    lo[::5, 0] = float("-inf")  # some vanishing entries
    if n > 1:
        lo[::7, -1] = hi[::7, -1] = float("-inf")  # some masked keys
    a = bounds.vertex_softmax(c, lo, hi, backend="torch")
    b = bounds.vertex_softmax(c, lo, hi, backend="numba")
    assert_within_margin(a, b, c, lo, hi)
    # and both are sound: the exact check proves each returned bound (a few rows)
    for r in range(0, rows, max(1, rows // 4)):
        if n <= 64:
            for res in (a, b):
                assert bounds.check_certificate(c[r], lo[r], hi[r], res.upper[r].item()).holds
                assert bounds.check_certificate(c[r], lo[r], hi[r], res.lower[r].item(),
                                                sense="lower").holds


def test_robust_path_matches_torch():
    rng = np.random.default_rng(4)
    c = torch.tensor(rng.normal(size=(50, 12)))
    lo = torch.tensor(rng.normal(size=(50, 12)) * 600)
    hi = lo + torch.tensor(rng.random(size=(50, 12)) * 900)
    a = bounds.vertex_softmax(c, lo, hi, backend="torch")
    b = bounds.vertex_softmax(c, lo, hi, backend="numba")
    assert_within_margin(a, b, c, lo, hi)
    for r in range(0, 50, 10):
        for res in (a, b):
            assert bounds.check_certificate(c[r], lo[r], hi[r], res.upper[r].item()).holds


def test_tiny_coefficients_match_torch():
    """Rows of c at every scale from 1e-320 to 1: normalisation makes them all relative."""
    rng = np.random.default_rng(6)
    scale = 10.0 ** rng.uniform(-320, 0, size=(40, 1))
    c = torch.tensor(rng.normal(size=(40, 6)) * scale)
    lo = torch.tensor(rng.uniform(-745, -600, size=(40, 6)))
    hi = torch.where(torch.rand(40, 6, dtype=torch.float64) < 0.5, lo, lo + 600)
    a = bounds.vertex_softmax(c, lo, hi, backend="torch")
    b = bounds.vertex_softmax(c, lo, hi, backend="numba")
    assert_within_margin(a, b, c, lo, hi)


def test_row_wide_certificate_error_encloses_the_exact_gap():
    """_gap_row charges every term the row's largest relative error and bounds Σ|d| and the
    term count by the row's: its (G, err) must still enclose the real g(λ) = Σ (c_i - λ) e^{s_i - top}
    (mpmath at 50 digits), masked entries and -inf lower bounds included."""
    import math

    import mpmath

    from softcert.kernels.floating import EXP_ZERO_ARG, term_rel

    rng = np.random.default_rng(11)
    mpmath.mp.dps = 50
    for trial in range(200):
        n = int(rng.integers(1, 40))
        c = rng.normal(size=n) * 10.0 ** rng.uniform(-3, 3)
        lo = rng.normal(size=n) * rng.uniform(0.1, 200)
        hi = lo + rng.exponential(size=n) * rng.uniform(0.01, 50)
        if n > 2:
            lo[0] = -np.inf
            lo[1] = hi[1] = -np.inf
        top = hi[np.isfinite(hi)].max()
        xa = np.where(np.isfinite(lo), top - lo, 0.0)
        xb = np.where(np.isfinite(hi), top - hi, 0.0)
        a = np.where(np.isfinite(lo), np.exp(-xa), 0.0)
        b = np.where(np.isfinite(hi), np.exp(-xb), 0.0)
        if ((a > 0) & (a < kv.FAST_PATH_MIN_WEIGHT)).any():
            continue  # the robust path's rows never reach _gap_row
        act = np.isfinite(hi)
        cmax, cmin = c[act].max(), c[act].min()
        lam = float(rng.uniform(cmin, cmax)) if trial % 3 else float(c[act][0])
        for sign, hi_c, lo_c in ((1.0, cmax, cmin), (-1.0, -cmin, -cmax)):
            g, err = kv._gap_row(sign, c, a, b, lam, term_rel(min(xa.max(), EXP_ZERO_ARG)), hi_c, lo_c)
            exact = mpmath.mpf(0)
            for i in range(n):
                d = mpmath.mpf(sign) * mpmath.mpf(c[i]) - mpmath.mpf(lam)
                s = hi[i] if sign * c[i] - lam > 0 else lo[i]
                if not math.isinf(s):
                    exact += d * mpmath.exp(mpmath.mpf(s) - mpmath.mpf(top))
            assert abs(mpmath.mpf(g) - exact) <= mpmath.mpf(err), (trial, sign, g, err, exact)


def test_vertices_out_are_the_masks_applied_to_the_box():
    rng = np.random.default_rng(4)
    c, lo = rng.normal(size=(50, 7)), rng.normal(size=(50, 7))
    hi = lo + rng.random(size=(50, 7))
    lo[::4, 2] = hi[::4, 2] = -np.inf
    vertices = (np.empty(c.shape), np.empty(c.shape))
    _, _, lo_mask, up_mask = kv.vertex_bounds(c, lo, hi, vertices_out=vertices)
    assert np.array_equal(vertices[0], np.where(lo_mask, hi, lo))  # a selection, no arithmetic
    assert np.array_equal(vertices[1], np.where(up_mask, hi, lo))


def test_certificate_from_the_pass_sums_encloses_the_exact_gap():
    """_gap_from_sums proves g(t) = N - t·D from the sums the Dinkelbach pass computed for
    the vertex {c_i > θ}, valid for θ <= t < min of that set: its (G, err) must enclose the
    real g(t) with the true weights e^{s_i - top} (mpmath at 50 digits), on clustered c
    (cancellation), tiny c (products that underflow), and masked entries."""
    import math

    import mpmath

    from softcert.kernels.floating import EXP_ZERO_ARG, gamma, term_rel

    rng = np.random.default_rng(12)
    mpmath.mp.dps = 50
    checked = 0
    for trial in range(300):
        n = int(rng.integers(1, 40))
        kind = trial % 3
        c = rng.normal(size=n) * (1e-9 if kind == 1 else 1.0) + (1.5 if kind == 1 else 0.0)
        if kind == 2:
            c[: n // 2] *= 1e-310  # subnormal products
        lo = rng.normal(size=n) * rng.uniform(0.1, 100)
        hi = lo + rng.exponential(size=n) * rng.uniform(0.01, 20)
        if n > 2:
            lo[0] = hi[0] = -np.inf
        act = np.isfinite(hi)
        top = hi[act].max()
        a = np.where(np.isfinite(lo), np.exp(lo - top), 0.0)
        b = np.where(act, np.exp(hi - top), 0.0)
        xa = np.where(np.isfinite(lo), top - lo, 0.0)
        if ((a > 0) & (a < kv.FAST_PATH_MIN_WEIGHT)).any():
            continue
        for sign in (1.0, -1.0):
            sc = sign * c
            theta = float(rng.choice(sc[act])) - float(rng.uniform(0, 1e-9))
            num, den, m = kv._vertex_pass(sign, c, a, b, theta)
            if not den > 0 or not m > theta:
                continue
            t = float(rng.uniform(theta, m)) if trial % 2 else theta
            k = gamma(n + 1) + term_rel(min(xa.max(), EXP_ZERO_ARG))
            g, err = kv._gap_from_sums(num, den, t, float(np.abs(sc[act]).max()), k, n)
            exact = mpmath.mpf(0)
            for i in range(n):
                s = hi[i] if sc[i] > theta else lo[i]
                if not math.isinf(s):
                    exact += (mpmath.mpf(sc[i]) - mpmath.mpf(t)) * mpmath.exp(mpmath.mpf(s) - mpmath.mpf(top))
            assert abs(mpmath.mpf(g) - exact) <= mpmath.mpf(err), (trial, sign, g, err, exact)
            checked += 1
    assert checked > 300
