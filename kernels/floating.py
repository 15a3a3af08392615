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
#: float64 ``log`` of torch is accurate to within LOG_ULPS units in the last place (glibc
#: documents < 1 ulp; tested against mpmath in tests/test_floating.py)
LOG_ULPS = 2
#: relative error of one float64 log of a positive normal or subnormal float
LOG_REL = 2 * LOG_ULPS * U64
#: absolute floor: results below the normal range may be off by this much (generous)
TINY = 2.0 ** -1060


def gamma(n: int, u: float = U64) -> float:
    """γ_n = n u / (1 - n u), the accumulated relative error of n roundings."""
    nu = n * u
    if nu >= 1:
        return math.inf
    return nu / (1.0 - nu)


#: smallest positive normal float64; below it the relative model above does not hold
NORMAL_MIN = 2.0 ** -1022
#: the subnormal spacing: a rounded product or quotient whose exact value lies below the
#: normal range is off by at most half of it (sums and differences there are exact).
#: (2^-1075 itself is not a float64: it rounds to 0, so we charge the whole spacing.)
SUBNORMAL_ULP = 2.0 ** -1074


#: exp(-x) rounds to 0 in float64 for x > 745.14: a term with |x| beyond this carries w = 0,
#: its error is absolute (``dot_error``), so callers clip |x| here before ``term_rel``
EXP_ZERO_ARG = 746.0


def term_rel(x):
    """Relative error bound of one term d·w, w = exp(x̂), x̂ = fl(s - m), |x̂| = ``x``.

    EXP_REL for exp, u|x| (1.01 for the exponential of it) for rounding the argument, and
    4u for rounding d = c - λ, the product and second-order terms. Valid while d·w and w are
    normal; ``dot_error`` adds the absolute terms for the subnormal range. ``x`` clipped to
    EXP_ZERO_ARG (beyond it w = 0 and only the absolute terms apply). Works on floats,
    numpy arrays and torch tensors alike (both Vertex backends use it).
    """
    return EXP_REL + 4 * U64 + 1.01 * U64 * x


def dot_error(rel_sum, abs_sum, rel_max, d_abs_sum, n_terms, n):
    """Bound on |fl(Σ_i d_i w_i) - Σ_i d_i e^{x_i}| for a certificate of n entries.

    rel_sum = Σ|t_i| rel_i and abs_sum = Σ|t_i| over the computed terms t_i = fl(d_i w_i),
    rel_max = max rel_i (``term_rel``), d_abs_sum = Σ|d_i|, n_terms = number of terms.
    Relative part: each term off by rel_i, the sum in any order by γ_{n+1} (Higham §2.2,
    ``gamma``; inlined so Numba can compile this function). Absolute part for results below
    the normal range: a subnormal w is off by EXP_ULPS·2^-1074 <= TINY per unit |d|, and a
    product that underflows (to a subnormal or to zero) by SUBNORMAL_ULP / 2; we charge
    SUBNORMAL_ULP per term. Without that last term, rows whose products all underflow
    "prove" g <= 0 from g = 0 (tests/test_vertex.py, subnormal products).
    """
    nu = (n + 1) * U64
    g = nu / (1.0 - nu)
    return (1.01 * (rel_sum + g * abs_sum * (1 + rel_max)) + d_abs_sum * TINY
            + n_terms * SUBNORMAL_ULP)


def first_step(g_pos, err, d_sum, value, scale):
    """First widening of λ above the proposed value: (g⁺ + 2 err)/D + 2u|λ| + TINY (1 + scale).

    g(λ + h) = g(λ) - h·D exactly in real arithmetic (D = Σ chosen weights, the chosen
    vertex does not change for h > 0 small), so h = (g⁺ + 2 err)/D makes the new g about
    -err; the other terms cover the rounding of λ + h and a zero D. ``d_sum`` must be
    positive (callers clamp it by TINY). Later trials multiply the step by 4.
    """
    return (g_pos + 2 * err) / d_sum + 2 * U64 * abs(value) + TINY * (1 + scale)


def a_priori_step(rel_max, gamma_n1, cmax, cmin, value, scale):
    """First widening of a proposed Vertex-Softmax value before any certificate is evaluated:
    3.03 (ρ + γ_{n+1})(1 + ρ)(cmax - cmin) + 2u|λ| + TINY (1 + scale), ρ = ``rel_max``.

    Every term of g has |t_i| <= (cmax - cmin) w_i, so g's rounding error is at most about
    (ρ + γ_{n+1})(cmax - cmin) D; three times that per unit D usually proves the bound at the
    first trial (the trial is still checked). Floats and torch tensors alike (the Numba
    kernel and the torch prover of ``bounds.vertex`` use it)."""
    return 3.03 * (rel_max + gamma_n1) * (1 + rel_max) * (cmax - cmin) + (2 * U64 * abs(value) + TINY * (1 + scale))


#: relative error of one weight exp(fl(s - m)) with |s - m| <= 746 (EXP_REL of the exp, plus
#: the rounding of its argument: |fl(d) - d| <= u|d| <= 746u moves exp by at most 747u)
RHO_WEIGHT = EXP_REL + 747 * U64 * 1.001
#: absolute error of one weight fl(exp(fl(s - m))) below the normal range: EXP_ULPS ulp of the
#: subnormal range (spacing SUBNORMAL_ULP), plus SUBNORMAL_ULP for |s - m| > 746, where RHO_WEIGHT does not hold
#: but both the true weight and exp of the rounded argument are below SUBNORMAL_ULP/4. A weight is off
#: by at most RHO_WEIGHT·w + EXP_ABS; the absolute part is multiplied by any count it carries.
EXP_ABS = (EXP_ULPS + 1) * SUBNORMAL_ULP

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

#: float32 exp accuracy assumed for Triton on the CPU interpreter, where tl.exp is numpy's SIMD
#: float32 exp (measured 2.49 ulp on AVX-512 here; tests/test_triton_backends.py re-measures)
TRITON_CPU_EXP32_ULPS = 4.0
#: float32 exp accuracy assumed for compiled Triton kernels, which call libdevice's exp
#: (kernels.triton_math): CUDA's expf, 2 ulp documented; 1.93 ulp measured on every float32 in
#: [-104, 0] on an H200 (shared/notes/gpu_h200.md); `softcert gpu-check` re-measures it on
#: the GPU it runs on and fails above this value. (tl.exp there: 62.7 ulp, never assumed.)
TRITON_CUDA_EXP32_ULPS = 2.0


def triton_exp32_ulps(interpreted: bool) -> float:
    """The float32 exp accuracy a bound may assume for the Triton kernels as they run."""
    return TRITON_CPU_EXP32_ULPS if interpreted else TRITON_CUDA_EXP32_ULPS
