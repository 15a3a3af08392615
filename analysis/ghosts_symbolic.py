"""sympy derivations behind :mod:`analysis.ghosts`, re-derived rather than asserted.

- ``binary_zero_set()``: solves exp(z1 + a1 t) + exp(z2 + a2 t) = 0 with t = x + i y by
  splitting modulus and phase: |e^{delta + Delta t}| = 1 gives x = -delta/Delta, and the phase
  condition gives Delta y = pi (2m+1); the nearest zero has |t|^2 = (delta^2 + pi^2)/Delta^2.
- ``half_plane_lemma()``: for phases theta_k = a_k y with a_k in [a_min, a_max], centring at
  phi = y (a_min + a_max)/2 leaves |theta_k - phi| <= |y| Delta_a / 2; cos has no zero-or-negative
  value on (-pi/2, pi/2), so Re(e^{-i phi} F) > 0 whenever |y| Delta_a < pi.
- ``log_odds_lemma(n)``: l(u) = z_0 + a_0 u - LSE_{j>0}(z_j + a_j u) has l' = a_0 - E_q[a] and
  l'' = -Var_q(a) <= 0 (concave, |l'| <= max_j |a_j - a_0|), the facts behind ``closed``/``root``.
The tests evaluate these expressions against the numeric code.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

__all__ = ["BinaryZeroSet", "binary_zero_set", "half_plane_lemma", "log_odds_lemma"]


@dataclass(frozen=True)
class BinaryZeroSet:
    """Symbols, the zero t_m (m integer) and the squared nearest radius, as sympy expressions."""

    delta: sp.Symbol
    Delta: sp.Symbol
    m: sp.Symbol
    zero: sp.Expr  # t_m
    radius_sq: sp.Expr  # min_m |t_m|^2
    residual: sp.Expr  # 1 + exp(delta + Delta t_m), simplified (0 when the derivation is right)


def binary_zero_set() -> BinaryZeroSet:
    """Derive the zeros of e^{z1 + a1 t} + e^{z2 + a2 t}; divide by e^{z2 + a2 t} > 0 first."""
    delta, Delta = sp.symbols("delta Delta", real=True, nonzero=True)
    x, y = sp.symbols("x y", real=True)
    m = sp.Symbol("m", integer=True)
    w = delta + Delta * (x + sp.I * y)  # F = 0  <=>  e^w = -1
    # modulus: e^{Re w} = 1
    (x_sol,) = sp.solve(sp.Eq(sp.exp(sp.re(w)), 1), x)
    # phase: e^{i Im w} = -1  <=>  sin(Im w) = 0 and cos(Im w) = -1
    im_w = sp.im(w)
    # sin(Im w) = 0 at k*pi, where cos = (-1)^k: odd k, i.e. Im w = pi (2m + 1)
    (y_sol,) = sp.solve(sp.Eq(im_w, sp.pi * (2 * m + 1)), y)
    zero = x_sol + sp.I * y_sol
    residual = sp.simplify(1 + sp.exp(delta + Delta * zero))
    mod_sq = sp.simplify(x_sol**2 + y_sol**2)
    # (2m+1)^2 >= 1 with equality at m in {0, -1}: the nearest zeros
    radius_sq = sp.simplify(mod_sq.subs(m, 0))
    return BinaryZeroSet(delta, Delta, m, zero, radius_sq, residual)


def half_plane_lemma() -> dict[str, sp.Basic]:
    """Return the derived pieces: the phase deviation bound and the set where cos <= 0."""
    lam, y, D = sp.symbols("lambda y Delta_a", real=True)
    # a_k = a_min + lam * Delta_a, lam in [0, 1]; deviation from the centre phase
    deviation = sp.expand(y * D * (lam - sp.Rational(1, 2)))
    # |lam - 1/2| <= 1/2 on [0, 1]: the maximum of |deviation| over lam is at an end point
    ends = [sp.Abs(deviation.subs(lam, v)) for v in (0, 1)]
    dev_max = sp.simplify(sp.Max(*ends))
    v = sp.Symbol("v", real=True)
    bad = sp.solveset(sp.cos(v) <= 0, v, sp.Interval.open(-sp.pi / 2, sp.pi / 2))
    # deviation < pi/2  <=>  |y| < pi / Delta_a : the half-plane radius pi / Delta_a
    Y, Dp = sp.symbols("Y D", positive=True)
    (y_max,) = sp.solve(sp.Eq(Y * Dp / 2, sp.pi / 2), Y)
    return {"deviation_max": dev_max, "cos_nonpositive_set": bad, "y_max": y_max}


def log_odds_lemma(n: int = 3) -> dict[str, sp.Expr]:
    """l, l', l'' for n classes (class 0 on top) and the residuals l' - (a_0 - E_q a) and
    l'' + Var_q(a), which simplify to 0."""
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    u = sp.Symbol("u", real=True)
    z = sp.symbols(f"z0:{n}", real=True)
    a = sp.symbols(f"a0:{n}", real=True)
    e = [sp.exp(z[j] + a[j] * u) for j in range(1, n)]
    S = sum(e)
    ell = z[0] + a[0] * u - sp.log(S)
    q = [ej / S for ej in e]
    mean = sum(qj * a[j + 1] for j, qj in enumerate(q))
    var = sum(qj * (a[j + 1] - mean) ** 2 for j, qj in enumerate(q))
    d1 = sp.diff(ell, u)
    d2 = sp.diff(ell, u, 2)
    return {
        "ell": ell,
        "d1": d1,
        "d2": d2,
        "d1_residual": sp.simplify(d1 - (a[0] - mean)),
        "d2_residual": sp.simplify(d2 + var),
        "symbols": (u, z, a),
    }
