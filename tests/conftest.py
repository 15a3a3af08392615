"""Shared fixtures and oracles for the test suite."""
from __future__ import annotations

import itertools
import os

# Triton runs its kernels in interpreter mode on this CPU-only machine; the flag is read when
# triton is first imported, and a test module collected earlier may import it (through torch)
os.environ.setdefault("TRITON_INTERPRET", "1")

# The repository root holds kernels/, bounds/, ... which install as softcert.*; on sys.path
# (``python -m pytest`` or ``python -c`` from the root put it there) its kernels/ would shadow
# Hugging Face's `kernels`, which transformers >= 5.25 imports. Tests import the installed
# layout only, here and in every subprocess they start (PYTHONSAFEPATH, Python 3.11+).
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
os.environ["PYTHONSAFEPATH"] = "1"

import mpmath  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests: deterministic in CI, bounded in time.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(1)
# oracle comparisons (mpf +- slack) must not round back to 53 bits
mpmath.mp.dps = 50


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def brute_force_extrema(c, lower, upper, dps: int = 50):
    """(min, max) of c·softmax(s) over all 2^n vertices of the box, in mpmath at ``dps`` digits.

    The exact optimum is attained at a vertex (linear-fractional objective in y = e^s), so
    this is the true optimum up to 10^-dps. Masked entries (upper = -inf) take no mass.
    """
    with mpmath.workdps(dps):
        c = [mpmath.mpf(float(x)) for x in c]
        ends = [
            (mpmath.exp(mpmath.mpf(float(lo))), mpmath.exp(mpmath.mpf(float(hi))))
            for lo, hi in zip(lower, upper)
        ]
        best, worst = -mpmath.inf, mpmath.inf
        for choice in itertools.product((0, 1), repeat=len(c)):
            y = [ends[i][k] for i, k in enumerate(choice)]
            total = mpmath.fsum(y)
            if total == 0:
                continue
            f = mpmath.fsum(ci * yi for ci, yi in zip(c, y)) / total
            best, worst = max(best, f), min(worst, f)
        return worst, best


def mp_softmax_value(c, s, dps: int = 50):
    """c·softmax(s) in mpmath at ``dps`` digits."""
    with mpmath.workdps(dps):
        y = [mpmath.exp(mpmath.mpf(float(x))) for x in s]
        return mpmath.fsum(mpmath.mpf(float(ci)) * yi for ci, yi in zip(c, y)) / mpmath.fsum(y)
