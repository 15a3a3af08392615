"""Taylor convergence radius of cross-entropy along a line ("ghosts of softmax").

Linearise the logits along a direction v: z_k(t) = z_k + a_k t with a = J_z v. Cross-entropy
along the line is -a_y t + log F(t) + const, F(t) = sum_k exp(z_k + a_k t), so its Taylor
radius at t = 0 is the modulus of the nearest complex zero of F (docs/mathematics.md section 2).

- binary (exact): zeros t = (-delta + i pi (2m+1)) / Delta, radius sqrt(delta^2 + pi^2)/|Delta|;
- ``pi``: |Im t| Delta_a < pi puts every term exp(i a_k Im t) in an open half-plane, so
  radius >= pi / Delta_a, Delta_a = max a - min a;
- ``closed``: at a zero no term exceeds half of sum |terms|, so the top class k0 has
  log-odds l(Re t) <= 0; l is concave with |l'| <= s = max_j |a_j - a_k0|, hence
  |Re t| >= L0/s and radius >= sqrt((L0/s)^2 + (pi/Delta_a)^2);
- ``root``: |Re t| >= distance from 0 to the nearest root of l (1-D bisection).
``closed`` and ``root`` are exact for two classes. Every lower bound is rounded down
(float64 standard model, margins below), so it is <= the real-arithmetic radius.

Terms with equal slopes are merged (log-sum-exp of their z) before anything else. The exact
radius uses the closed form when two distinct slopes remain, else the argument principle
with certified sampling (winding of F on |t| = R, bisection on R from the lower bound), a
time limit, and a Newton polish of the zero that must land in the verified bracket.
Source: Sao, "Ghosts of Softmax" (arXiv:2603.13552; docs/report/references.bib, sao2026ghosts);
formulas checked in docs/mathematics.md section 2.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import mpmath
import numpy as np

from softcert.kernels.floating import EXP_REL, U64, gamma

__all__ = [
    "RadiusNotVerified",
    "RadiusResult",
    "batch_radius",
    "binary_radius",
    "count_zeros",
    "pi_radius_batch",
    "radius_exact",
    "radius_lower_bound",
    "radius_lower_bound_batch",
    "top2_estimate",
]

_METHODS = ("pi", "closed", "root")
_MAX = sys.float_info.max


@dataclass(frozen=True)
class RadiusResult:
    """Exact Taylor radius of log F at 0 and the zero of F that attains it (Im >= 0).

    ``bracket`` = (lo, hi) is the verified enclosure lo <= radius <= hi (certified zero counts,
    or the closed form); ``radius`` is |zero| for the Newton-polished zero inside it.
    """

    radius: float
    zero: complex
    lower_bound: float
    bracket: tuple[float, float] = (math.nan, math.nan)
    method: str = "certified argument-principle bisection, mpmath Newton polish"
    assumptions: str = "logits linear along the direction: z(t) = z + a t"


# ---------------------------------------------------------------- validation helpers


def _as_vectors(z, a) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(_to_numpy(z), dtype=np.float64)
    a = np.asarray(_to_numpy(a), dtype=np.float64)
    if z.ndim != 1 or z.size < 2:
        raise ValueError(f"z must be a 1-D array with at least 2 logits, got shape {z.shape}")
    if a.shape != z.shape:
        raise ValueError(f"a must have the shape of z {z.shape}, got {a.shape}")
    if not np.all(np.isfinite(z)):
        raise ValueError("z must be finite (no NaN/inf)")
    if not np.all(np.isfinite(a)):
        raise ValueError("a must be finite (no NaN/inf)")
    return z, a


def _to_numpy(x):
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()
    return x


def _down(x: float, k: int = 8) -> float:
    """x shrunk by k units of roundoff and one more ulp towards 0 (x >= 0)."""
    if x <= 0 or math.isinf(x):
        return max(x, 0.0)
    return float(np.nextafter(x * (1.0 - k * U64), 0.0))


# ---------------------------------------------------------------- closed forms


def binary_radius(delta: float, Delta: float) -> float:
    """sqrt(delta^2 + pi^2) / |Delta| (inf when Delta = 0): the exact two-class radius.

    delta = z_1 - z_2, Delta = a_1 - a_2. Rounded to nearest (an exact formula, not a bound).
    """
    delta, Delta = float(delta), float(Delta)
    if math.isnan(delta) or math.isnan(Delta) or math.isinf(delta) or math.isinf(Delta):
        raise ValueError(f"delta and Delta must be finite, got {delta}, {Delta}")
    if Delta == 0.0:
        return math.inf
    return math.hypot(delta, math.pi) / abs(Delta)


def top2_estimate(z, a, y: int | None = None, c: int | None = None) -> float:
    """ESTIMATE (not a bound): sqrt(delta^2 + pi^2)/|a_y - a_c| from the top two classes.

    It ignores every other class and may exceed the exact radius by orders of magnitude
    (z=(5,4,0), a=(0,0.1,10): estimate 32.97, exact 0.619). Never use it as a safety bound.
    """
    z, a = _as_vectors(z, a)
    order = np.argsort(-z, kind="stable")
    y = int(order[0]) if y is None else int(y)
    c = int(order[1]) if c is None else int(c)
    return binary_radius(z[y] - z[c], a[y] - a[c])


def _lse(x: np.ndarray) -> tuple[float, float]:
    """(LSE(x), absolute error bound) for float LSE = m + log(sum exp(x_j - m)), x exact floats.

    Standard model (kernels/floating.py): d_j = m - x_j carries <= u d_j, so the term e^{-d_j}
    is off by <= e^{-d_j}(e^{u d_j} - 1) <= u d_j e^{-d_j (1-u)} (absolute, and S >= 1 since the
    top term is exactly 1); exp adds EXP_REL, underflow 2^-1074 per term, the sum gamma_n.
    With that relative error eta <= 1/2 of S, |log(S~) - log S| <= 2 eta; log and the final
    add round once each. The whole is doubled to cover evaluating the bound itself. When eta
    is not small the error is inf (no certificate), never a negative or wrapped-around value.
    """
    n = x.size
    m = float(np.max(x))
    d = m - x
    if not (math.isfinite(m) and np.all(np.isfinite(d))):
        return math.nan, math.inf
    dc = np.minimum(d, 1e6)  # beyond, u d e^{-d} is far below the underflow floor
    S = float(np.sum(np.exp(-d)))
    arg = float(np.sum(U64 * dc * np.exp(-dc * (1.0 - U64))))
    eta = 2.0 * arg + EXP_REL + gamma(n) + n * 2.0 ** -1070
    if not (eta <= 0.25):
        return math.nan, math.inf
    L = math.log(S)
    val = m + L
    err = 2.0 * (2.0 * eta + EXP_REL * abs(L) + U64 * abs(val))
    return val, err


def _merge_ties(z: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Terms with exactly equal slopes merged: sum_{a_j = A} e^{z_j + A t} = e^{LSE(z_j) + A t}.

    Returns (Z, A, E): merged intercepts (float), distinct slopes, and absolute error bounds of
    the float Z (0 for a single term). The zero set of F is unchanged by merging.
    """
    A, inv = np.unique(a, return_inverse=True)
    if A.size == a.size:
        order = np.argsort(a, kind="stable")
        return z[order], a[order], np.zeros(a.size)
    Z = np.empty(A.size)
    E = np.zeros(A.size)
    for g in range(A.size):
        zg = z[inv == g]
        if zg.size == 1:
            Z[g] = zg[0]
        else:
            Z[g], E[g] = _lse(zg)
    return Z, A, E


def _log_odds(Z: np.ndarray, A: np.ndarray, E: np.ndarray, k0: int, u: float) -> tuple[float, float]:
    """(l(u), absolute error bound), l(u) = Z_k0 + A_k0 u - LSE_{j != k0}(Z_j + A_j u).

    Each exponent Z_j + A_j u carries <= 2u(|Z_j| + |A_j u|) + E_j (one product, one sum, the
    merge error; plus 2^-1070 for a subnormal product); LSE is 1-Lipschitz in the max norm. Non-finite values give (nan, inf).
    """
    others = np.delete(np.arange(Z.size), k0)
    with np.errstate(over="ignore", invalid="ignore"):
        x = Z[others] + A[others] * u
        top = Z[k0] + A[k0] * u
        arg_err = 2 * U64 * (np.abs(Z) + np.abs(A * u)) + E + 2.0 ** -1070  # floor: subnormal A u
    if not (np.all(np.isfinite(x)) and math.isfinite(top) and np.all(np.isfinite(arg_err))):
        return math.nan, math.inf
    lse, lse_err = _lse(x)
    val = top - lse
    err = lse_err + float(np.max(arg_err[others])) + float(arg_err[k0]) + 2 * U64 * (abs(top) + abs(lse))
    err = err * (1.0 + 16 * U64)
    if not math.isfinite(val):
        return math.nan, math.inf
    return val, err


def _finite_down(x: float, k: int = 4) -> float:
    """_down for a quantity known to be finite in real arithmetic: an overflowed inf becomes the
    largest float (rounded down), which is still below the true value."""
    return _down(_MAX if math.isinf(x) else x, k)


def _spread_pi(a: np.ndarray) -> float:
    """A rounded-down pi/Delta_a (inf only when all slopes are equal)."""
    spread = float(np.max(a) - np.min(a))  # one rounding (exact when subnormal)
    if spread == 0.0:
        return math.inf
    # math.pi < pi; spread (1 + 4u) rounds to >= the true spread; the division rounds once
    with np.errstate(over="ignore"):
        q = math.pi / (spread * (1.0 + 4 * U64)) if spread < math.inf else 0.0
    return _finite_down(q, 4)


def radius_lower_bound(z, a, method: str = "root") -> float:
    """Rigorous lower bound on the exact radius (see the module docstring for the formulas).

    ``"pi"``: pi/Delta_a; ``"closed"``: sqrt((L0/s)^2 + (pi/Delta_a)^2); ``"root"``: the
    nearest root of the concave log-odds, certified by an error-bounded evaluation. Terms with
    equal slopes are merged first (their LSE, with its error carried). All three are rounded
    down and never overflow (a bound beyond the float range is the largest float); ``closed``
    and ``root`` equal the exact radius for two distinct slopes up to that rounding. Returns
    inf only when all slopes are equal (F never vanishes).
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    z, a = _as_vectors(z, a)
    w = _spread_pi(a)
    if method == "pi" or math.isinf(w):
        return w
    Z, A, E = _merge_ties(z, a)
    k0 = int(np.argmax(Z))
    with np.errstate(over="ignore"):
        s = float(np.max(np.abs(A - A[k0])))  # > 0: at least two distinct slopes
        s_up = s * (1.0 + 4 * U64)
    l0, err0 = _log_odds(Z, A, E, k0, 0.0)
    l0_lo = l0 - err0
    u_closed = 0.0
    if l0_lo > 0 and math.isfinite(s_up):
        u_closed = _finite_down(l0_lo / s_up, 4)
    u = u_closed
    if method == "root" and l0_lo > 0:
        u = max(u_closed, _root_distance(Z, A, E, k0, u_closed))
    return _finite_down(math.hypot(u, w), 4)


def _root_distance(Z: np.ndarray, A: np.ndarray, E: np.ndarray, k0: int, start: float) -> float:
    """Largest certified d with l(u) > 0 for all |u| <= d (l concave, l(0) > 0).

    By concavity, l > 0 on [0, d] iff l(d) > 0 and l(0) > 0; each side is bisected and its
    end point certified by l(d) - err(d) > 0 (a non-finite evaluation certifies nothing).
    """
    best = math.inf
    for sign in (1.0, -1.0):
        lo = start  # certified: l(sign*lo) > 0 (from the closed form)
        hi = max(2 * lo, 1.0)
        for _ in range(64):  # expand until l(hi) is not certified positive
            val, err = _log_odds(Z, A, E, k0, sign * hi)
            if not (val - err > 0):
                break
            lo, hi = hi, 2 * hi
        else:
            best = min(best, lo)  # l > 0 certified on [0, lo]; no root nearer than that
            continue
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            val, err = _log_odds(Z, A, E, k0, sign * mid)
            if val - err > 0:
                lo = mid
            else:
                hi = mid
        best = min(best, lo)
    return start if math.isinf(best) else best


# ---------------------------------------------------------------- exact radius


class RadiusNotVerified(ValueError):
    """:func:`radius_exact` / :func:`count_zeros` could not verify a result (time limit,
    float64 precision exhausted near a zero, or the radius beyond the float range)."""


def _circle_eval(Z, A, ew, R, s):
    """F~, F'~, H~ = sum A_j^2 |term_j| and an error bound E >= |F~ - F(c)| at the exact
    circle points c = R e^{2 pi i s}, all scaled by one positive factor per point (phases
    unchanged); A_max E bounds the error of F'~ the same way.

    ew_j bounds the absolute exponent error of term j (point off the circle, Z and A roundings);
    the shift d_j = m - Re w_j adds u d_j, bounded by u d e^{-d(1-u)} in absolute terms as in
    :func:`_lse`; complex exp adds EXP_REL + 4u; the complex sum 2 gamma_{2n} sum |terms|.
    """
    t = R * np.exp(2j * np.pi * s)
    w = Z[None, :] + A[None, :] * t[:, None]
    m = w.real.max(axis=1)
    d = m[:, None] - w.real
    terms = np.exp(w - m[:, None])
    mod = np.abs(terms)
    F = terms.sum(axis=1)
    dF = (terms * A[None, :]).sum(axis=1)
    H = (mod * (A * A)[None, :]).sum(axis=1)
    dc = np.minimum(d, 1e6)
    base = np.exp(-dc * (1.0 - U64))
    n = Z.size
    err = (base * (np.expm1(ew)[None, :] + U64 * dc)).sum(axis=1) + mod.sum(axis=1) * (
        EXP_REL + 4 * U64 + 2 * gamma(2 * n)) + n * 2.0 ** -1070
    return F, dF, H, 2.0 * err


def _count(Z, A, E, R, deadline, max_evals=4_000_000):
    """Verified number of zeros of F in |t| < R, or None when unresolved.

    Argument principle on the exact circle, cut into arcs [s_a, s_b] (s = theta / 2 pi). An arc
    is accepted when every point tau of it, at distance <= d from the float point t_a, satisfies
    |F(tau) - F(t_a)| <= |F'(t_a)| d + (d^2/2) e^{A_max d} H(t_a) <= 0.9 |F(t_a)| (Taylor with
    |F''| <= e^{A_max d} H on the disk), so arg F moves by < asin 0.9 on it; otherwise the arc
    is halved. The phase errors of the samples are
    bounded by asin(E/|F~|), and the sum of increments is rounded only when their total is < pi.
    Returns (count, s of the smallest |F|/sum|terms| sample) or None.
    """
    c = 0.5 * (float(np.max(A)) + float(np.min(A)))  # e^{-ct} F has the zeros of F
    Ash = A - c
    dt = 32 * U64 * R  # float points t vs the exact circle
    ew = 2 * U64 * (np.abs(Z) + 3 * np.abs(Ash) * R) + E + np.abs(Ash) * dt
    if not (R > 0 and math.isfinite(R) and np.all(np.isfinite(ew))) or float(np.max(ew)) > 0.05:
        return None
    amax = float(np.max(np.abs(Ash)))
    gfac = 1.0 + 2.0 * float(np.max(np.expm1(ew))) + 1e-9
    n0 = int(2 ** min(20, max(6, math.ceil(math.log2(8 * (2 * math.pi * R * amax + 8))))))
    todo = np.arange(n0, dtype=np.float64) / n0
    width = np.full(n0, 1.0 / n0)
    acc_s, acc_F, acc_E, acc_rel = [], [], [], []
    evals = 0
    while todo.size:
        if time.monotonic() > deadline:
            raise RadiusNotVerified(f"time limit reached while counting zeros on |t| = {R!r}")
        evals += todo.size
        if evals > max_evals:
            return None
        F, dF, H, err = _circle_eval(Z, Ash, ew, R, todo)
        absF = np.abs(F)
        dist = 2 * math.pi * R * width * (1 + 1e-12) + dt
        bound = ((np.abs(dF) + amax * err) * dist + 0.5 * dist * dist * np.exp(amax * dist) * H * gfac) * (1 + 1e-12)
        if np.any(absF <= err):
            return None  # F is within its error of 0 on the circle: a zero too near to resolve
        ok = (err <= 0.25 * absF) & (bound <= 0.9 * (absF - err))
        acc_s.append(todo[ok])
        acc_F.append(F[ok])
        acc_E.append(err[ok])
        acc_rel.append(absF[ok])
        bad = ~ok
        if bad.any() and float(np.min(width[bad])) < 2.0 ** -60:
            return None
        half = width[bad] / 2
        todo = np.concatenate([todo[bad], todo[bad] + half])
        width = np.concatenate([half, half])
    s = np.concatenate(acc_s)
    order = np.argsort(s)
    s = s[order]
    F = np.concatenate(acc_F)[order]
    err = np.concatenate(acc_E)[order]
    absF = np.concatenate(acc_rel)[order]
    phase_err = np.arcsin(np.minimum(1.0, err / absF))
    if 2 * float(np.sum(phase_err)) >= 0.5 * math.pi:
        return None
    inc = np.angle(np.roll(F, -1) / F)
    total = float(np.sum(inc)) / (2 * math.pi)
    k = round(total)
    if abs(total - k) > 0.25:
        return None
    return k, float(s[int(np.argmin(absF))])


def _groups_mp(z: np.ndarray, a: np.ndarray, dps: int = 50):
    """Merged (Z, A, E) for the zero counter: Z_g = log sum e^{z_j} at ``dps`` digits, rounded
    to float with E_g >= |Z_g(float) - Z_g| (0 for single terms, which are exact floats)."""
    A, inv = np.unique(a, return_inverse=True)
    Z = np.empty(A.size)
    E = np.zeros(A.size)
    with mpmath.workdps(dps):
        for g in range(A.size):
            zg = z[inv == g]
            if zg.size == 1:
                Z[g] = zg[0]
                continue
            val = mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(float(v))) for v in zg))
            Z[g] = float(val)
            # val itself is good to ~dps digits: cover that too
            E[g] = float(2 * abs(mpmath.mpf(Z[g]) - val) + mpmath.mpf(10) ** (8 - dps) * (1 + abs(val)))
    return Z, A, E


def count_zeros(z, a, R: float, time_limit: float = 5.0) -> int:
    """Verified number of zeros of F(t) = sum_k e^{z_k + a_k t} in the open disk |t| < R.

    Argument principle with an adaptive, certified sampling of the circle (every arc carries a
    mean-value bound that keeps arg F within a half-plane; sample errors are bounded in the
    float64 standard model, kernels/floating.py). Raises :class:`RadiusNotVerified` when a zero
    lies too near the circle to resolve in float64, or past ``time_limit`` seconds.
    """
    z, a = _as_vectors(z, a)
    R = float(R)
    if not (R > 0 and math.isfinite(R)):
        raise ValueError(f"R must be finite and > 0, got {R}")
    if not (time_limit > 0):
        raise ValueError(f"time_limit must be positive, got {time_limit}")
    Z, A, E = _groups_mp(z, a)
    if A.size == 1:
        return 0
    res = _count(Z, A, E, R, time.monotonic() + time_limit)
    if res is None:
        raise RadiusNotVerified(f"count_zeros: unresolved on |t| = {R!r} for z={z.tolist()}, a={a.tolist()}")
    return res[0]


def _newton(z, a, t0: complex, deadline: float, iters: int = 60):
    """Newton on F from t0 at enough digits for the exponents' magnitude: (zero, |F|/sum|terms|)
    or None (no convergence to |F| <= 1e-20 sum|terms|). It runs on e^{-ct} F (same zeros,
    c the mid slope): a common slope a0 >> the spread would shrink Newton's basin to ~spread/a0.
    """
    mag = float(np.max(np.abs(z))) + float(np.max(np.abs(a))) * abs(t0)
    dps = 30 + math.ceil(math.log10(2.0 + mag))
    with mpmath.workdps(dps):
        zz = [mpmath.mpf(float(v)) for v in z]
        c = (mpmath.mpf(float(np.max(a))) + mpmath.mpf(float(np.min(a)))) / 2
        aa = [mpmath.mpf(float(v)) - c for v in a]
        t = mpmath.mpc(t0)
        for _ in range(iters):
            if time.monotonic() > deadline:
                return None
            e = [mpmath.exp(zk + ak * t) for zk, ak in zip(zz, aa)]
            F = mpmath.fsum(e)
            dF = mpmath.fsum(ak * ek for ak, ek in zip(aa, e))
            scale = mpmath.fsum(abs(ek) for ek in e)
            if abs(F) <= scale * mpmath.mpf(10) ** -20:
                return complex(t), float(abs(F) / scale)
            if dF == 0:
                return None
            t = t - F / dF
        return None


def radius_exact(z, a, tol: float = 1e-10, time_limit: float = 5.0) -> RadiusResult:
    """Distance from 0 to the nearest zero of F(t) = sum_k exp(z_k + a_k t), verified.

    Equal slopes are merged (log-sum-exp of their z at 50 digits): one distinct slope means no
    zero (inf), two give the exact binary closed form sqrt(delta^2 + pi^2)/|Delta| (docs/mathematics.md
    section 2). Otherwise the radius is bracketed by certified zero counts (:func:`count_zeros`
    machinery): 0 zeros in |t| < lo (or lo = the rigorous lower bound), >= 1 in |t| < hi,
    bisected to relative width ``tol``; the zero is then polished by Newton (30 digits beyond
    the exponents' magnitude) and must lie in the bracket. Raises :class:`RadiusNotVerified` (a ValueError naming z and a)
    when it cannot verify within ``time_limit`` seconds; never returns an unverified radius.
    """
    try:
        return _radius_exact(z, a, tol, time_limit)
    except RadiusNotVerified as err:
        z, a = _as_vectors(z, a)
        raise RadiusNotVerified(f"{err} (z={z.tolist()}, a={a.tolist()})") from None


def _radius_exact(z, a, tol: float, time_limit: float) -> RadiusResult:
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol}")
    if not (time_limit > 0):
        raise ValueError(f"time_limit must be positive, got {time_limit}")
    z, a = _as_vectors(z, a)
    deadline = time.monotonic() + time_limit
    lb = radius_lower_bound(z, a, "root")
    if math.isinf(lb):
        return RadiusResult(math.inf, complex(math.nan, math.nan), lb, (math.inf, math.inf),
                            method="all slopes equal: F = e^{z + a t} sum e^{z_k - z} never vanishes")
    Z, A, E = _groups_mp(z, a)
    if A.size == 2:
        with mpmath.workdps(60):
            Zm = [mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(float(v))) for v in z[a == g]))
                  for g in A]
            delta = Zm[0] - Zm[1]
            Delta = mpmath.mpf(float(A[0])) - mpmath.mpf(float(A[1]))
            zero = mpmath.mpc(-delta / Delta, mpmath.pi / abs(Delta))
            r = abs(zero)
            radius = float(r)
            if math.isinf(radius):
                raise RadiusNotVerified(f"radius_exact: radius {mpmath.nstr(r, 5)} beyond float64")
            bracket = (_down(radius, 1), float(np.nextafter(radius, math.inf)))
        return RadiusResult(radius, complex(zero), lb, bracket,
                            method="merged equal slopes; binary closed form at 60 digits")
    lo, hi = lb, lb * 2.0
    s_best = 0.0
    for _ in range(200):
        res = _count(Z, A, E, hi, deadline)
        if res is None:
            hi = hi * (1 + 1e-3)
            continue
        if res[0] >= 1:
            s_best = res[1]
            break
        lo, hi = hi, hi * 2.0
    else:
        raise RadiusNotVerified("radius_exact: no zero bracketed")
    found = None
    while hi - lo > tol * hi:
        if found is None and hi - lo <= 1e-3 * hi:
            # shortcut: polish a zero, then verify |t| = r (1 -+ tol) by two counts
            t0 = hi * complex(math.cos(2 * math.pi * s_best), math.sin(2 * math.pi * s_best))
            found = _newton(z, a, t0, deadline) or False
            if found and lo <= abs(found[0]) <= hi:
                r = abs(found[0])
                inner = _count(Z, A, E, r * (1 - 0.45 * tol), deadline)
                outer = _count(Z, A, E, r * (1 + 0.45 * tol), deadline)
                if inner is not None and inner[0] == 0:
                    lo = max(lo, r * (1 - 0.45 * tol))
                if outer is not None and outer[0] >= 1 and r * (1 + 0.45 * tol) < hi:
                    hi, s_best = r * (1 + 0.45 * tol), outer[1]
                continue
        mid = lo + 0.5 * (hi - lo)
        res = None
        for cand in (mid, lo + 0.3 * (hi - lo), lo + 0.7 * (hi - lo)):  # dodge a zero on the circle
            res = _count(Z, A, E, cand, deadline)
            if res is not None:
                break
        if res is None:
            break
        if res[0] >= 1:
            hi, s_best = cand, res[1]
        else:
            lo = cand
    if hi - lo > max(tol, 1e-7) * hi:
        raise RadiusNotVerified(f"radius_exact: bracket [{lo!r}, {hi!r}] not resolved to tol")
    if not (found and lo <= abs(found[0]) <= hi):
        t0 = hi * complex(math.cos(2 * math.pi * s_best), math.sin(2 * math.pi * s_best))
        found = _newton(z, a, t0, deadline)
    if found is None or not (lo * (1 - 1e-12) <= abs(found[0]) <= hi * (1 + 1e-12)):
        raise RadiusNotVerified(f"radius_exact: Newton found no zero in the verified bracket "
                                f"[{lo!r}, {hi!r}]")
    best = complex(found[0].real, abs(found[0].imag))
    with mpmath.workdps(40):
        radius = float(abs(mpmath.mpc(best)))
    return RadiusResult(radius=radius, zero=best, lower_bound=lb, bracket=(lo, hi))


# ---------------------------------------------------------------- batched torch versions


def radius_lower_bound_batch(z, a, method: str = "pi"):
    """Per-sample lower bounds for (batch, classes) tensors; returns a float64 tensor (batch,).

    ``pi`` and ``closed`` are vectorised in torch; ``root`` runs a vectorised bisection on the
    concave log-odds with a certified end point. Rounded down by a relative margin of
    64 n u (a generous cover of the float64 errors bounded in the scalar code) plus one ulp.
    """
    import torch

    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    z = torch.as_tensor(z).detach().to(torch.float64)
    a = torch.as_tensor(a).detach().to(torch.float64)
    if z.ndim != 2 or z.shape[1] < 2:
        raise ValueError(f"z must have shape (batch, classes>=2), got {tuple(z.shape)}")
    if a.shape != z.shape:
        raise ValueError(f"a must have the shape of z {tuple(z.shape)}, got {tuple(a.shape)}")
    if not torch.isfinite(z).all():
        raise ValueError("z must be finite (no NaN/inf)")
    if not torch.isfinite(a).all():
        raise ValueError("a must be finite (no NaN/inf)")
    n = z.shape[1]
    spread = a.max(dim=1).values - a.min(dim=1).values
    big = torch.full_like(spread, _MAX)

    def finite(x):  # a real-arithmetic finite quantity that overflowed is still >= the largest float
        return torch.where(torch.isinf(x), big, x)

    w = torch.where(spread > 0, finite(math.pi / spread), torch.full_like(spread, math.inf))
    margin = 1.0 - 64 * n * U64
    def down(x):  # relative margin, one ulp towards 0, inf kept
        return torch.where(torch.isinf(x), x, torch.nextafter(x * margin, torch.zeros_like(x)))

    if method == "pi":
        return down(w)
    k0 = z.argmax(dim=1, keepdim=True)
    ak0 = a.gather(1, k0)
    zk0 = z.gather(1, k0)
    mask = torch.ones_like(z, dtype=torch.bool).scatter_(1, k0, False)
    s = torch.where(mask, (a - ak0).abs(), torch.zeros_like(a)).max(dim=1).values

    def logodds(u):  # u: (batch,)
        x = torch.where(mask, z + a * u[:, None], torch.full_like(z, -math.inf))
        return (zk0 + ak0 * u[:, None]).squeeze(1) - torch.logsumexp(x, dim=1)

    def err(u):
        mag = (z.abs() + (a * u[:, None]).abs()).max(dim=1).values
        return 64 * n * U64 * (1.0 + 4 * mag + math.log(n))

    zero = torch.zeros_like(spread)
    l0 = logodds(zero) - err(zero)
    pos = (l0 > 0) & (spread > 0)
    ucl = finite(torch.where(pos, l0 / torch.where(s > 0, s, torch.ones_like(s)), zero)) * margin
    u = ucl
    if method == "root":
        dist = torch.full_like(ucl, math.inf)
        for sign in (1.0, -1.0):
            lo = ucl.clone()
            hi = torch.maximum(2 * lo, torch.ones_like(lo))
            for _ in range(64):  # expand while l(hi) is certified positive
                still = pos & (logodds(sign * hi) - err(hi) > 0)
                if not still.any():
                    break
                lo = torch.where(still, hi, lo)
                hi = torch.where(still, 2 * hi, hi)
            for _ in range(80):
                mid = 0.5 * (lo + hi)
                good = logodds(sign * mid) - err(mid) > 0
                lo = torch.where(good, mid, lo)
                hi = torch.where(good, hi, mid)
            dist = torch.minimum(dist, lo)  # l > 0 certified on [0, lo] on this side
        u = torch.where(pos & torch.isfinite(dist), torch.maximum(dist, ucl), ucl)
    r = finite(torch.hypot(u, w))  # hypot: u * u overflows from u ~ 1e154
    return down(torch.where(torch.isfinite(w), r, w))


def pi_radius_batch(a):
    """pi / Delta_a(x) per row of a (batch, classes) slope tensor, rounded down; the "pi" bound
    needs no logits, which keeps the controller's per-step cost to a max, a min and a divide."""
    import torch

    a = torch.as_tensor(a).detach()
    if a.ndim != 2 or a.shape[1] < 2:
        raise ValueError(f"a must have shape (batch, classes>=2), got {tuple(a.shape)}")
    # subtract in float64: a float32 difference could round the spread down (radius up)
    spread = a.amax(dim=1).to(torch.float64) - a.amin(dim=1).to(torch.float64)
    if not torch.isfinite(spread).all():
        raise ValueError("a must be finite (no NaN/inf)")
    w = torch.where(spread > 0, math.pi / spread, torch.full_like(spread, math.inf))
    w = torch.where(torch.isinf(w) & (spread > 0), torch.full_like(w, _MAX), w)  # subnormal spread
    margin = 1.0 - 64 * a.shape[1] * U64
    return torch.where(torch.isinf(w), w, torch.nextafter(w * margin, torch.zeros_like(w)))


def batch_radius(z, a, method: str = "pi") -> float:
    """Batch radius: the minimum over samples of :func:`radius_lower_bound_batch`.

    With ``"pi"`` this is pi / max_x Delta_a(x), the controller's rho_a.
    """
    return float(radius_lower_bound_batch(z, a, method).min())
