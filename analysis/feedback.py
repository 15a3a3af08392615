"""Stability threshold of the softmax feedback system x = softmax(β(W x + b)).

On the simplex, x - y lies in T = {v: 1ᵀv = 0}; the softmax Jacobian J(p) = diag(p) - ppᵀ
satisfies J = ΠJΠ (Π = I - 11ᵀ/n) and ‖J‖₂ <= 1/2. Hence for F(x) = softmax(β(Wx + b)),
‖F(x) - F(y)‖₂ <= (β/2)‖ΠWΠ‖₂ ‖x - y‖₂: for β < β* = 2/‖ΠWΠ‖₂ the map is a contraction of
the simplex, with a unique fixed point reached geometrically (Banach). The classical
sufficient condition is β < 1/‖W‖₂. The threshold is sharp: n = 2, W = cI has a pitchfork at
βc = 2, and W = -cI a period-2 orbit of the iteration for βc > 2 (:func:`pitchfork_demo`).

Rigour: ‖ΠWΠ‖₂ is bounded from above, never below. ΠWΠ is formed in exact rationals from the
float entries of W, a float candidate s = σ̂(1 + 1e-9) is proved >= σ_max by an exact LDLᵀ
factorisation of s²I - AᵀA (all pivots >= 0 <=> positive semidefinite); for n > 24 the
Frobenius norm is used instead (rigorous but looser): its square is summed in exact
rationals and its square root rounded up by an exact comparison, so no entry can underflow
or overflow when squared (the float sum of squares lost every entry below ~1e-162). β* is
rounded down; the contraction factor is rounded up in exact rationals.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "EXACT_MAX_N",
    "NormBound",
    "StabilityCertificate",
    "example_matrix",
    "fixed_points_n2",
    "frobenius_upper",
    "iterate",
    "jacobian_norm",
    "period_two_amplitude",
    "projected",
    "rigorous_norm2",
    "softmax",
    "stability_threshold",
]

EXACT_MAX_N = 24


@dataclass(frozen=True)
class NormBound:
    value: float  # a rigorous upper bound on ‖A‖₂
    estimate: float  # numpy's SVD value
    method: str


@dataclass(frozen=True)
class StabilityCertificate:
    """β* = 2/‖ΠWΠ‖₂ (rounded down), the classical 1/‖W‖₂, and a certificate at ``beta``."""

    n: int
    beta_star: float
    beta_classical: float
    proj_norm: NormBound
    full_norm: NormBound
    beta: float | None
    contraction: float | None  # (β/2)‖ΠWΠ‖₂, rounded up
    unique_fixed_point: bool | None
    iterations: int | None  # k with contraction^k * sqrt(2) <= tol (any start on the simplex)
    tol: float
    assumptions: str = ("‖diag(p) - ppᵀ‖₂ <= 1/2 (proved for n = 2, 3 with sympy in "
                        "tests/test_feedback.py; general n: Gershgorin/eigen bound); Banach "
                        "fixed point theorem on the simplex in the 2-norm (diameter sqrt 2)")


def _ldl_psd(M: list[list[Fraction]]) -> bool:
    """Exact test that a symmetric rational matrix is positive semidefinite (LDLᵀ with pivoting
    on zero pivots: a zero pivot needs a zero row)."""
    n = len(M)
    A = [row[:] for row in M]
    for k in range(n):
        piv = A[k][k]
        if piv < 0:
            return False
        if piv == 0:
            if any(A[k][j] != 0 for j in range(k, n)):
                return False
            continue
        for i in range(k + 1, n):
            f = A[i][k] / piv
            if f == 0:
                continue
            for j in range(k + 1, n):
                A[i][j] -= f * A[k][j]
    return True


def rigorous_norm2(A_exact: list[list[Fraction]]) -> NormBound:
    """An upper bound on the spectral norm of an exact rational matrix."""
    A = np.array([[float(v) for v in row] for row in A_exact])
    n, m = A.shape
    est = float(np.linalg.svd(A, compute_uv=False)[0]) if A.size else 0.0
    if max(n, m) <= EXACT_MAX_N and math.isfinite(est):
        AtA = [[sum((A_exact[k][i] * A_exact[k][j] for k in range(n)), Fraction(0))
                for j in range(m)] for i in range(m)]
        s = est * (1 + 1e-9) + 1e-300
        for _ in range(60):
            s2 = Fraction(s) ** 2
            M = [[(s2 if i == j else 0) - AtA[i][j] for j in range(m)] for i in range(m)]
            if _ldl_psd(M):
                return NormBound(s, est, "exact LDL^T certificate of s^2 I - A^T A >= 0")
            s = s * (1 + 1e-6) + 1e-300
    return NormBound(frobenius_upper(A_exact), est, "Frobenius norm rounded up")


def _up(q: Fraction) -> float:
    """The smallest float >= q (inf above the float range)."""
    try:
        f = float(q)
    except OverflowError:
        return math.inf
    if Fraction(f) < q:
        f = float(np.nextafter(f, np.inf))
    return f


def frobenius_upper(A_exact: list[list[Fraction]]) -> float:
    """A float >= ‖A‖_F >= ‖A‖₂ for an exact rational matrix.

    S = Σ a_ij² is exact; with S = 4^e S', S' in [1, 4), sqrt(S') is rounded up by an exact
    check r² >= S', then scaled by 2^e (exact in the normal range, rounded up otherwise).
    Never underflows to 0 for a non-zero A, and gives inf only above the float range.
    """
    S = sum((v * v for row in A_exact for v in row), Fraction(0))
    if S == 0:
        return 0.0
    e = (S.numerator.bit_length() - S.denominator.bit_length()) // 2
    Sp = S / Fraction(4) ** e if e >= 0 else S * Fraction(4) ** (-e)
    r = math.sqrt(float(Sp))
    while Fraction(r) ** 2 < Sp:
        r = float(np.nextafter(r, np.inf))
    return _up(Fraction(r) * Fraction(2) ** e)


def _exact(W: np.ndarray) -> list[list[Fraction]]:
    return [[Fraction(float(v)) for v in row] for row in W]


def projected(W_exact: list[list[Fraction]]) -> list[list[Fraction]]:
    """ΠWΠ in exact rationals: W_ij - rowmean_i - colmean_j + mean."""
    n = len(W_exact)
    r = [sum(row, Fraction(0)) / n for row in W_exact]
    c = [sum((W_exact[i][j] for i in range(n)), Fraction(0)) / n for j in range(n)]
    g = sum(r, Fraction(0)) / n
    return [[W_exact[i][j] - r[i] - c[j] + g for j in range(n)] for i in range(n)]


def _down(v: float) -> float:
    """One float below v, never below 0 (thresholds are non-negative)."""
    return max(0.0, float(np.nextafter(v, -np.inf)))


def stability_threshold(W, beta: float | None = None, tol: float = 1e-8) -> StabilityCertificate:
    """β* = 2/‖ΠWΠ‖₂ and the classical 1/‖W‖₂ for x = softmax(β(Wx + b)), any b.

    With ``beta``: the contraction factor (β/2)‖ΠWΠ‖₂ (rounded up), whether the fixed point
    is certified unique, and the iterations that reach ``tol`` in the 2-norm from any start.
    """
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise ValueError(f"W must be a square matrix, got shape {W.shape}")
    if not np.all(np.isfinite(W)):
        raise ValueError("W must be finite")
    if beta is not None and not (beta >= 0 and math.isfinite(beta)):
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    if not (0 < tol < 1):
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    n = W.shape[0]
    We = _exact(W)
    pn = rigorous_norm2(projected(We))
    fn = rigorous_norm2(We)
    beta_star = math.inf if pn.value == 0 else _down(2.0 / pn.value)
    beta_cl = math.inf if fn.value == 0 else _down(1.0 / fn.value)
    q = unique = iters = None
    if beta is not None:
        # exact product: a float product may underflow (or round down) to a false contraction
        q = _up(Fraction(beta) * Fraction(pn.value) / 2) if math.isfinite(pn.value) else math.inf
        if beta == 0:
            q = 0.0
        unique = q < 1
        if unique:
            iters = 0 if q == 0 else max(0, math.ceil(math.log(tol / math.sqrt(2)) / math.log(q)))
    return StabilityCertificate(n, beta_star, beta_cl, pn, fn, beta, q, unique, iters, tol)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def iterate(W, b, beta: float, x0=None, steps: int = 200) -> np.ndarray:
    """The orbit x_{k+1} = softmax(β(W x_k + b)), shape (steps + 1, n)."""
    W = np.asarray(W, dtype=np.float64)
    n = W.shape[0]
    x = np.full(n, 1.0 / n) if x0 is None else np.asarray(x0, dtype=np.float64)
    b = np.zeros(n) if b is None else np.asarray(b, dtype=np.float64)
    out = [x]
    for _ in range(steps):
        x = softmax(beta * (W @ x + b))
        out.append(x)
    return np.array(out)


def fixed_points_n2(c: float, beta: float, grid: int = 200_001) -> int:
    """Number of fixed points of softmax(β c x) for n = 2, W = cI, b = 0.

    With d = x_1 - x_2 the fixed-point equation is d = tanh(βc d / 2); its roots are counted
    by sign changes of tanh(βc d/2) - d on a fine grid of (-1, 1) (plus the root d = 0).
    """
    d = np.linspace(-1, 1, grid)
    g = np.tanh(beta * c * d / 2) - d
    s = np.sign(g)
    # d = 0 is always a root; count sign changes away from it
    changes = np.count_nonzero(s[1:] * s[:-1] < 0)
    zeros = np.count_nonzero(s == 0)
    return int(changes + zeros)


def period_two_amplitude(c: float, beta: float, steps: int = 4000) -> float:
    """n = 2, W = -cI: |x_1 - x_2| at the end of the orbit from a slightly perturbed start
    (0 if the iteration converges to the fixed point (1/2, 1/2), > 0 on a 2-cycle)."""
    orbit = iterate(-c * np.eye(2), None, beta, x0=np.array([0.6, 0.4]), steps=steps)
    return float(abs(orbit[-1, 0] - orbit[-1, 1]))


def jacobian_norm(p) -> float:
    """‖diag(p) - ppᵀ‖₂ (largest eigenvalue of the PSD softmax Jacobian)."""
    p = np.asarray(p, dtype=np.float64)
    return float(np.linalg.eigvalsh(np.diag(p) - np.outer(p, p))[-1])


def example_matrix() -> np.ndarray:
    """W = 5·11ᵀ + 0.3 I, n = 4: ‖W‖₂ = 20.3 but ‖ΠWΠ‖₂ = 0.3."""
    return 5 * np.ones((4, 4)) + 0.3 * np.eye(4)
