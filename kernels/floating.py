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

#: smallest positive float64 (subnormal), 2^-1074: the spacing of the subnormal range
Q64 = 2.0 ** -1074
#: relative error of one weight exp(fl(s - m)) with |s - m| <= 746 (EXP_REL of the exp, plus
#: the rounding of its argument: |fl(d) - d| <= u|d| <= 746u moves exp by at most 747u)
RHO_WEIGHT = EXP_REL + 747 * U64 * 1.001
#: absolute error of one weight fl(exp(fl(s - m))) below the normal range: EXP_ULPS ulp of the
#: subnormal range (spacing Q64), plus Q64 for |s - m| > 746, where RHO_WEIGHT does not hold
#: but both the true weight and exp of the rounded argument are below Q64/4. A weight is off
#: by at most RHO_WEIGHT·w + EXP_ABS; the absolute part is multiplied by any count it carries.
EXP_ABS = (EXP_ULPS + 1) * Q64

# IEEE formats: precision p (hidden bit included), unit roundoff u = 2^-p, smallest positive
# subnormal Q = 2^(emin - p + 1), as used by the low-precision error bounds (analysis.fp,
# kernels.fp_rows)
P64, EMIN64 = 53, -1022
P32, EMIN32 = 24, -126
P16, EMIN16 = 11, -14
PBF16, EMINBF16 = 8, -126
U32 = 2.0 ** -P32
U16 = 2.0 ** -P16
UBF16 = 2.0 ** -PBF16
Q32 = 2.0 ** (EMIN32 - P32 + 1)
Q16 = 2.0 ** (EMIN16 - P16 + 1)
QBF16 = 2.0 ** (EMINBF16 - PBF16 + 1)
