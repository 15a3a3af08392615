"""The exp accuracy assumed by the error model (kernels.floating) holds for numpy and torch."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import torch

from kernels.floating import EXP_ULPS, gamma


def test_float64_exp_within_assumed_ulps():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-745, 709, 3000), rng.uniform(-1, 1, 1000), [0.0, -708.3, 709.7]])
    for y in (np.exp(x), torch.exp(torch.tensor(x)).numpy()):
        worst = 0.0
        for xi, yi in zip(x, y):
            exact = mpmath.exp(mpmath.mpf(float(xi)))
            if exact < mpmath.mpf(2) ** -1022:
                continue  # subnormal results are covered by the absolute floor
            ulp = math.ulp(float(exact))
            worst = max(worst, float(abs(mpmath.mpf(float(yi)) - exact) / ulp))
        assert worst <= EXP_ULPS, worst


def test_gamma():
    assert gamma(0) == 0
    assert math.isclose(gamma(10, 0.001), 0.01 / 0.99)
    assert gamma(10**20) == math.inf
