"""Baselines are sound (sampling never escapes them) and never tighter than the exact optimum."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from softcert import bounds
from softcert.bounds.baselines import BASELINES


@pytest.mark.parametrize("name", sorted(BASELINES))
@pytest.mark.parametrize("width", [0.0, 0.05, 0.5, 3.0])
def test_baseline_encloses_samples_and_the_exact_optimum(name, width):
    rng = np.random.default_rng(int(width * 100) + len(name))
    c = torch.tensor(rng.normal(size=(64, 6)))
    lo = torch.tensor(rng.normal(size=(64, 6)) * 2)
    hi = lo + width * torch.tensor(rng.random(size=(64, 6)))
    base = BASELINES[name](c, lo, hi)
    exact = bounds.vertex_softmax(c, lo, hi)
    tol = 1e-12 * (1 + exact.upper.abs())
    assert (base.upper >= exact.upper - tol).all()
    assert (base.lower <= exact.lower + tol).all()
    s = lo + (hi - lo) * torch.rand(400, 64, 6, dtype=torch.float64)
    f = (c * torch.softmax(s, -1)).sum(-1)
    assert (f <= base.upper + 1e-12).all() and (f >= base.lower - 1e-12).all()


def test_width_zero_makes_linear_baselines_exact():
    rng = np.random.default_rng(0)
    c = torch.tensor(rng.normal(size=(8, 5)))
    s = torch.tensor(rng.normal(size=(8, 5)))
    f = (c * torch.softmax(s, -1)).sum(-1)
    for name in ("shi2020", "wei2023-lse", "wei2023-er"):
        b = BASELINES[name](c, s, s)
        assert torch.allclose(b.upper, f, atol=1e-10) and torch.allclose(b.lower, f, atol=1e-10)


def test_baselines_need_finite_boxes():
    with pytest.raises(ValueError, match="finite box"):
        bounds.shi2020([1.0, 2.0], [float("-inf"), 0.0], [0.0, 1.0])
