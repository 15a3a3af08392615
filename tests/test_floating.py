"""The exp and log accuracy assumed by the error model (kernels.floating) holds for numpy and torch."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import torch

from softcert.kernels.floating import (
    EXP_ULPS,
    EXP_ZERO_ARG,
    LOG_ULPS,
    NORMAL_MIN,
    SUBNORMAL_ULP,
    TINY,
    dot_error,
    first_step,
    gamma,
    term_rel,
)


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


def test_float64_log_within_assumed_ulps():
    """-log x of the neg_log operator (the softmax lowering): torch's float64 log, including
    subnormal arguments and arguments next to 1, where the result is small."""
    rng = np.random.default_rng(1)
    x = np.concatenate([np.exp(rng.uniform(-744, 709, 3000)), 1 + rng.uniform(-1e-6, 1e-6, 500),
                        rng.uniform(0, 4, 500), [5e-324, 1.0, np.nextafter(1.0, 2.0), 1.7e308]])
    y = torch.log(torch.tensor(x)).numpy()
    worst = 0.0
    for xi, yi in zip(x, y):
        exact = mpmath.log(mpmath.mpf(float(xi)))
        if exact == 0:
            assert yi == 0.0
            continue
        worst = max(worst, float(abs(mpmath.mpf(float(yi)) - exact) / math.ulp(float(exact))))
    assert worst <= LOG_ULPS, worst


def test_gamma():
    assert gamma(0) == 0
    assert math.isclose(gamma(10, 0.001), 0.01 / 0.99)
    assert gamma(10**20) == math.inf


def test_exp_below_the_normal_range_within_the_absolute_floor():
    """The absolute part of the model: where exp's result is subnormal (or 0), numpy and torch
    are off by at most EXP_ULPS subnormal spacings, which TINY covers per unit |d|."""
    x = np.concatenate([np.linspace(-760.0, -708.0, 2001), [-745.1332191019411, -745.2, -708.4]])
    for y in (np.exp(x), torch.exp(torch.tensor(x)).numpy()):
        for xi, yi in zip(x, y):
            err = abs(mpmath.mpf(float(yi)) - mpmath.exp(mpmath.mpf(float(xi))))
            assert err <= EXP_ULPS * SUBNORMAL_ULP <= TINY, (xi, yi)


def test_underflow_constants_are_not_zero():
    # 2.0 ** -1075 rounds to 0.0: an error floor written that way charges nothing
    assert 2.0 ** -1075 == 0.0
    assert SUBNORMAL_ULP > 0 and SUBNORMAL_ULP / 2 == 0.0 and SUBNORMAL_ULP == math.ulp(0.0)
    assert NORMAL_MIN == np.finfo(np.float64).tiny
    assert math.exp(-EXP_ZERO_ARG) == 0.0 and np.exp(-EXP_ZERO_ARG) == 0.0


def test_dot_error_charges_underflowed_products():
    """Products that round to zero still carry SUBNORMAL_ULP / 2 each; dot_error charges
    them even when every computed term is 0 (issue 10, subnormal products)."""
    d = [mpmath.mpf(5e-25), mpmath.mpf(-2.5e-25)]
    w = mpmath.exp(-690)
    exact = mpmath.fsum(di * w for di in d)
    terms = [float(di) * float(w) for di in d]
    g = sum(terms)
    rels = [term_rel(690.0)] * 2
    err = dot_error(sum(abs(t) * r for t, r in zip(terms, rels)), sum(abs(t) for t in terms),
                    max(rels), sum(abs(float(di)) for di in d), 2, 2)
    assert err > 0 and abs(mpmath.mpf(g) - exact) <= err


def test_first_step_makes_progress():
    assert first_step(0.0, 0.0, 1.0, 0.0, 0.0) >= TINY
    assert first_step(1.0, 0.5, 4.0, 3.0, 1.0) >= (1.0 + 1.0) / 4.0
