"""The sort-free Dinkelbach route of kernels/vertex.py: sound (brute force at 50 digits),
as tight as the sort-and-sweep route (within the proven margin, never bit for bit), and
falling back to the sweep when the iteration stalls in floating point."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from conftest import brute_force_extrema
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernels_vertex import margin

from softcert import bounds
from softcert.kernels import vertex as kv

NINF = float("-inf")
SLACK = mpmath.mpf(10) ** -40


def _both(c, lo, hi):
    passes = np.zeros((c.shape[0], 2), dtype=np.int64)
    dk = kv.vertex_bounds(c, lo, hi, method="dinkelbach", passes_out=passes)
    sw = kv.vertex_bounds(c, lo, hi, method="sweep")
    return dk, sw, passes


def _assert_tight_and_sound(low, up, c, lo, hi, rel=1e-9):
    worst, best = brute_force_extrema(c, lo, hi)
    assert mpmath.mpf(up) >= best - SLACK * (1 + abs(best)), (up, best)
    assert mpmath.mpf(low) <= worst + SLACK * (1 + abs(worst)), (low, worst)
    scale = max(abs(float(best)), abs(float(worst)), float(np.max(np.abs(c))), 1e-300)
    assert up - float(best) <= rel * scale
    assert float(worst) - low <= rel * scale


@pytest.mark.parametrize("rows,n", [(500, 2), (300, 16), (64, 128), (8, 1024)])
def test_dinkelbach_matches_the_sweep_within_the_margin(rows, n):
    rng = np.random.default_rng(n)
    c = rng.normal(size=(rows, n))
    lo = rng.normal(size=(rows, n)) * 4
    hi = lo + rng.exponential(size=(rows, n))
    lo[::5, 0] = NINF
    if n > 1:
        lo[::7, -1] = hi[::7, -1] = NINF
    (dl, du, dlm, dum), (sl, su, _, _), passes = _both(c, lo, hi)
    tol = margin(*(torch.from_numpy(x) for x in (c, lo, hi))).numpy()
    assert (np.abs(du - su) <= tol).all() and (np.abs(dl - sl) <= tol).all()
    assert (dl <= du).all()
    # the reported vertices attain the bound up to the margin
    ct = torch.from_numpy(c)
    for mask, bound in ((dum, du), (dlm, dl)):
        s = torch.from_numpy(np.where(mask, hi, lo))
        value = (ct * torch.softmax(s, -1)).sum(-1).numpy()
        assert (np.abs(value - bound) <= tol + 64 * n * 2.0**-53 * np.abs(c).max(-1)).all()
    # a handful of O(n) passes, not the sort: the behaviour DESIGN.md §1 describes
    has_mass = (np.isfinite(lo) & np.isfinite(hi)).any(-1)  # else the bound is max c at once
    assert (passes[has_mass] > 0).mean() > 0.99
    assert np.median(passes[passes > 0]) <= 5 and passes.max() <= kv.MAX_PASSES


def test_a_stalled_iteration_falls_back_to_the_sweep():
    """One upper weight dominates the denominator, so the Dinkelbach step g/D is below
    rounding at a value well under the optimum (found in a random sweep, then reduced to
    three entries). The certificate at that value fails and the row is solved by the
    sweep: still tight."""
    c = np.array([[0.0077753672332860095, 0.009140629289713511, -0.003583354387416221]])
    lo = np.array([[5.904595162260881, 63.9006806930976, -3.530350695088374]])
    hi = np.array([[119.88569787899021, 63.9007158660632, 161.86688445768536]])
    (low, up, _, up_mask), _, passes = _both(c, lo, hi)
    assert passes[0, 0] == 0  # the upper bound came from the sweep
    assert not up_mask[0, 0]  # the dominant entry goes to its lower bound at the optimum
    _assert_tight_and_sound(low[0], up[0], c[0], lo[0], hi[0])
    assert bounds.check_certificate(c[0], lo[0], hi[0], up[0]).holds


def test_edge_rows():
    """n = 1, all lower bounds -inf (the first pass has no mass), ties, a degenerate box."""
    cases = [
        ([2.0], [-1.0], [3.0]),
        ([1.0, 1.0], [NINF, NINF], [0.0, 1.0]),
        ([1.0, -1.0, 1.0, -1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]),
        ([0.3, -2.0, 5.0], [0.1, 0.2, 0.3], [0.1, 0.2, 0.3]),
        ([5.0, 1.0, -1.0], [NINF, 0.0, -0.5], [NINF, 0.3, 0.5]),
    ]
    for c, lo, hi in cases:
        c, lo, hi = (np.array([x], dtype=float) for x in (c, lo, hi))
        (low, up, _, _), _, _ = _both(c, lo, hi)
        _assert_tight_and_sound(low[0], up[0], c[0], lo[0], hi[0])


def test_bad_method_names_the_argument():
    with pytest.raises(ValueError, match="method"):
        kv.vertex_bounds(np.ones((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), method="newton")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(-3, 3), min_size=n, max_size=n),  # few distinct c: ties
            st.floats(-3, 3),  # log10 scale of c
            st.lists(st.floats(-300, 300), min_size=n, max_size=n),
            st.lists(st.floats(-8, 2.5), min_size=n, max_size=n),  # log10 widths
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    )
)
def test_property_dominant_weights_ties_and_spreads(data):
    """Score spreads up to 600 (weights near the fast path's limit), widths from 1e-8 to
    300, tied coefficients at every scale: the regimes where the iteration can stall.
    Every row is as tight as brute force demands, whichever route proved it."""
    ci, logc, lo, logw, mask = data
    c = np.array(ci, dtype=float) * 10.0**logc + np.linspace(0, 1e-3, len(ci)) * 10.0**logc
    lo = np.array(lo)
    hi = lo + 10.0 ** np.array(logw)
    mask = np.array(mask, dtype=bool)
    if mask.all():
        mask[0] = False
    lo[mask] = hi[mask] = NINF
    (low, up, _, _), (sl, su, _, _), _ = _both(c[None], lo[None], hi[None])
    _assert_tight_and_sound(low[0], up[0], c, lo, hi)
    tol = margin(*(torch.from_numpy(x[None]) for x in (c, lo, hi))).numpy()
    assert abs(up[0] - su[0]) <= tol[0] and abs(low[0] - sl[0]) <= tol[0]
