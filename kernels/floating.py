"""The floating-point error model behind every outward-rounded bound in softcert.

This is the one module that defines the rounding constants and error formulas; every other
module imports them from here (the report checker keeps its own on purpose, to stay
independent of the code it checks).

Standard model (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2.2):
fl(x op y) = (x op y)(1 + δ), |δ| <= u, u = 2^-53 for float64, for normal results; a
result in the subnormal range carries an absolute error <= 2^-1075 instead. Sums of n terms
in any order satisfy |fl(Σ t) - Σ t| <= γ_{n-1} Σ|t|, γ_k = k u / (1 - k u).

Assumption (stated, and tested against mpmath in tests/test_floating.py): float64 ``exp`` of
numpy and torch is accurate to within EXP_ULPS units in the last place.
"""
from __future__ import annotations

import math

U64 = 2.0 ** -53
EXP_ULPS = 2
#: relative error of one float64 exp (EXP_ULPS ulp = at most 2*EXP_ULPS*u relative)
EXP_REL = 2 * EXP_ULPS * U64
#: absolute floor: results below the normal range may be off by this much (generous)
TINY = 2.0 ** -1060


def gamma(n: int, u: float = U64) -> float:
    """γ_n = n u / (1 - n u), the accumulated relative error of n roundings."""
    nu = n * u
    if nu >= 1:
        return math.inf
    return nu / (1.0 - nu)
