"""One pass over a coefficient box that says whether it needs no further validation.

``bounds.box.coefficient_box`` validates user input with several torch reductions, each a
pass over the box and some a temporary; for the small rows of Vertex-Softmax (n = 16) they
cost about a tenth of the bound (docs/benchmark.md). This pass answers the common case at
once: every c finite, every score box with lower <= upper and upper finite, no masked
entry. Anything else (NaN, ±inf, lower > upper, masks) returns False and takes the detailed
checks, which name the problem; so this check never accepts what they would reject.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def plain_box(c: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """True iff, for flat float64 arrays of one size, every |c_i| < inf, upper_i < inf and
    upper_i - lower_i >= 0. NaN fails every comparison; a masked entry (-inf, -inf) gives
    NaN for the difference, so it fails too."""
    for i in range(c.shape[0]):
        if not (abs(c[i]) < np.inf and hi[i] < np.inf and hi[i] - lo[i] >= 0.0):
            return False
    return True
