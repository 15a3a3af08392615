"""Taylor convergence radius of cross-entropy along a line ("ghosts of softmax").

Linearise the logits along a direction v: z_k(t) = z_k + a_k t with a = J_z v. Cross-entropy
along the line is -a_y t + log F(t) + const, F(t) = sum_k exp(z_k + a_k t), so its Taylor
radius at t = 0 is the modulus of the nearest complex zero of F (DESIGN.md section 2).

- binary (exact): zeros t = (-delta + i pi (2m+1)) / Delta, radius sqrt(delta^2 + pi^2)/|Delta|;
- ``pi``: |Im t| Delta_a < pi puts every term exp(i a_k Im t) in an open half-plane, so
  radius >= pi / Delta_a, Delta_a = max a - min a;
- ``closed``: at a zero no term exceeds half of sum |terms|, so the top class k0 has
  log-odds l(Re t) <= 0; l is concave with |l'| <= s = max_j |a_j - a_k0|, hence
  |Re t| >= L0/s and radius >= sqrt((L0/s)^2 + (pi/Delta_a)^2);
- ``root``: |Re t| >= distance from 0 to the nearest root of l (1-D bisection).
``closed`` and ``root`` are exact for two classes. Every lower bound is rounded down
(float64 standard model, margins below), so it is <= the real-arithmetic radius.

The exact radius uses the argument principle (winding of F on |t| = R, bisection on R from
the lower bound) and an mpmath Newton polish of the zero.
Source: the "ghosts of softmax" abstract in seeds/abstracts.md; formulas checked in DESIGN.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath
import numpy as np

from kernels.floating import EXP_REL, U64

__all__ = [
    "RadiusResult",
    "binary_radius",
    "radius_lower_bound",
    "radius_exact",
    "top2_estimate",
    "radius_lower_bound_batch",
    "pi_radius_batch",
    "batch_radius",
]

_METHODS = ("pi", "closed", "root")


@dataclass(frozen=True)
class RadiusResult:
    """Exact Taylor radius of log F at 0 and the zero of F that attains it (Im >= 0)."""

    radius: float
    zero: complex
    lower_bound: float
    method: str = "argument principle + bisection, mpmath findroot polish"
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


def _lse_err(vals_abs_max: float, spread: float, n: int) -> float:
    """Absolute error bound of float64 LSE = m + log(sum exp(x_j - m)) (standard model).

    x_j - m: relative error u, i.e. absolute u*spread in the exponent, which becomes a relative
    error <= e^{u spread}-1 ~ u*spread of each exp, plus EXP_REL; the sum adds gamma_{n-1};
    log(S), S in [1, n], converts a relative error eta into an absolute one <= eta/(1-eta),
    adds u*log n; the final add adds u*(|m| + log n). Doubled for safety.
    """
    eta = U64 * spread + EXP_REL + (n + 1) * U64
    return 2.0 * (eta / (1.0 - eta) + U64 * (vals_abs_max + 2 * math.log(n) + 1.0))


def _log_odds(z: np.ndarray, a: np.ndarray, k0: int, u: float) -> tuple[float, float]:
    """(l(u), absolute error bound) with l(u) = z_k0 + a_k0 u - LSE_{j != k0}(z_j + a_j u)."""
    others = np.delete(np.arange(z.size), k0)
    x = z[others] + a[others] * u
    m = float(np.max(x))
    lse = m + math.log(float(np.sum(np.exp(x - m))))
    top = z[k0] + a[k0] * u
    # each x_j carries <= 2u|z_j| + 2u|a_j u| (one product, one sum)
    arg_err = 2 * U64 * float(np.max(np.abs(z) + np.abs(a * u)))
    err = (
        _lse_err(abs(m), float(m - np.min(x)), others.size)
        + 2 * arg_err
        + 2 * U64 * (abs(top) + abs(lse))
    )
    return top - lse, err


def _spread_pi(a: np.ndarray) -> float:
    """A rounded-down pi/Delta_a (inf when all slopes are equal)."""
    spread = float(np.max(a) - np.min(a))  # one rounding: true spread <= spread (1+u)
    if spread == 0.0:
        return math.inf
    # math.pi < pi, and the division adds one rounding
    return _down(math.pi / (spread * (1.0 + 2 * U64)), 4)


def radius_lower_bound(z, a, method: str = "root") -> float:
    """Rigorous lower bound on the exact radius (see the module docstring for the formulas).

    ``"pi"``: pi/Delta_a; ``"closed"``: sqrt((L0/s)^2 + (pi/Delta_a)^2); ``"root"``: the
    nearest root of the concave log-odds, certified by an error-bounded evaluation. All three
    are rounded down; ``closed`` and ``root`` equal the exact radius for two classes up to
    that rounding. Returns inf when all slopes are equal (F never vanishes).
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    z, a = _as_vectors(z, a)
    w = _spread_pi(a)
    if method == "pi" or math.isinf(w):
        return w
    k0 = int(np.argmax(z))
    s = float(np.max(np.abs(a - a[k0])))  # > 0 since the spread is > 0
    s_up = s * (1.0 + 2 * U64)
    l0, err0 = _log_odds(z, a, k0, 0.0)
    l0_lo = l0 - err0
    u_closed = _down(l0_lo / s_up, 4) if l0_lo > 0 else 0.0
    u = u_closed
    if method == "root" and l0_lo > 0:
        u = max(u_closed, _root_distance(z, a, k0, u_closed))
    return _down(math.sqrt(u * u + w * w), 4)


def _root_distance(z: np.ndarray, a: np.ndarray, k0: int, start: float) -> float:
    """Largest certified d with l(u) > 0 for all |u| <= d (l concave, l(0) > 0).

    By concavity, l > 0 on [0, d] iff l(d) > 0 and l(0) > 0; each side is bisected and its
    end point certified by l(d) - err(d) > 0.
    """
    best = math.inf
    for sign in (1.0, -1.0):
        lo = start  # certified: l(sign*lo) > 0 (from the closed form)
        hi = max(2 * lo, 1.0)
        for _ in range(64):  # expand until l(hi) is not certified positive
            val, err = _log_odds(z, a, k0, sign * hi)
            if val - err <= 0:
                break
            lo, hi = hi, 2 * hi
        else:
            best = min(best, lo)  # l > 0 certified on [0, lo]; no root nearer than that
            continue
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            val, err = _log_odds(z, a, k0, sign * mid)
            if val - err > 0:
                lo = mid
            else:
                hi = mid
        best = min(best, lo)
    return start if math.isinf(best) else best


# ---------------------------------------------------------------- exact radius


def _phase_samples(z: np.ndarray, a: np.ndarray, R: float, n_pts: int) -> np.ndarray:
    """arg F(R e^{i theta}) at n_pts equally spaced theta (F shifted by its largest term)."""
    theta = np.arange(n_pts) * (2 * np.pi / n_pts)
    t = R * np.exp(1j * theta)
    w = z[None, :] + a[None, :] * t[:, None]
    w = w - np.max(w.real, axis=1, keepdims=True)
    return np.angle(np.sum(np.exp(w), axis=1))


def _winding(z: np.ndarray, a: np.ndarray, R: float) -> int | None:
    """Number of zeros of F in |t| < R (argument principle), None if unresolved.

    Sampling is refined until every phase increment is below pi/3; the term phases rotate
    at rate <= R max|a| per radian, which sets the initial resolution.
    """
    n_pts = int(2 ** math.ceil(math.log2(max(256.0, 16 * R * float(np.max(np.abs(a))) + 64))))
    while n_pts <= 2**15:
        ph = _phase_samples(z, a, R, n_pts)
        inc = np.angle(np.exp(1j * np.diff(np.append(ph, ph[0]))))
        if np.max(np.abs(inc)) < np.pi / 3:
            return int(round(float(np.sum(inc)) / (2 * np.pi)))
        n_pts *= 4
    return None


def _polish(z: np.ndarray, a: np.ndarray, t0: complex, dps: int = 40) -> complex | None:
    with mpmath.workdps(dps):
        zz = [mpmath.mpf(float(v)) for v in z]
        aa = [mpmath.mpf(float(v)) for v in a]

        def F(t):
            return mpmath.fsum(mpmath.exp(zk + ak * t) for zk, ak in zip(zz, aa))

        try:
            root = mpmath.findroot(F, mpmath.mpc(t0), tol=mpmath.mpf(10) ** (-dps + 8))
        except (ValueError, ZeroDivisionError):
            return None
        return complex(root)


def radius_exact(z, a, tol: float = 1e-10) -> RadiusResult:
    """Distance from 0 to the nearest zero of F(t) = sum_k exp(z_k + a_k t), and that zero.

    Bisection on R with the winding number of F on |t| = R, started at the rigorous lower
    bound (no zero below it), until the zero is bracketed to ~1e-5 relative; mpmath
    ``findroot`` then polishes candidates (local minima of |F| on the bracketing circle) to
    ``tol``. The reported radius is the modulus of the polished zero, which the bracket
    confirms is the nearest one. inf (and zero = nan) when all slopes are equal.
    """
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol}")
    z, a = _as_vectors(z, a)
    lb = radius_lower_bound(z, a, "root")
    if math.isinf(lb):
        return RadiusResult(math.inf, complex(math.nan, math.nan), lb)
    lo = lb
    hi = lb * 1.25
    for _ in range(200):
        k = _winding(z, a, hi)
        if k is None or k >= 1:  # unresolved means a zero lies near the circle: polish there
            break
        lo, hi = hi, hi * 1.5
    else:
        raise ValueError("radius_exact: no zero found (slopes too close to equal?)")
    while hi - lo > 1e-5 * hi:
        mid = 0.5 * (lo + hi)
        k = _winding(z, a, mid)
        if k is None:
            break
        if k >= 1:
            hi = mid
        else:
            lo = mid
    # candidate starting points: local minima of |F| on the circle |t| = hi
    n_pts = 4096
    theta = np.arange(n_pts) * (2 * np.pi / n_pts)
    t = hi * np.exp(1j * theta)
    w = z[None, :] + a[None, :] * t[:, None]
    mx = np.max(w.real, axis=1)
    logmod = np.log(np.abs(np.sum(np.exp(w - mx[:, None]), axis=1)) + 1e-300) + mx
    is_min = (logmod <= np.roll(logmod, 1)) & (logmod <= np.roll(logmod, -1))
    cands = np.flatnonzero(is_min)
    cands = cands[np.argsort(logmod[cands])][:6]
    best = None
    for idx in cands:
        root = _polish(z, a, complex(t[idx]))
        if root is None or abs(root) > hi * (1 + 1e-6) + tol:
            continue  # converged to a farther zero than the bracket allows
        if best is None or abs(root) < abs(best):
            best = root
    if best is None:  # fall back to the nearest zero any candidate reached
        roots = [r for r in (_polish(z, a, complex(t[i])) for i in cands) if r is not None]
        best = min(roots, key=abs) if roots else None
    if best is None:
        raise ValueError("radius_exact: mpmath findroot did not converge")
    best = complex(best.real, abs(best.imag))
    with mpmath.workdps(40):
        radius = float(abs(mpmath.mpc(best)))
    return RadiusResult(radius=radius, zero=best, lower_bound=lb)


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
    w = torch.where(spread > 0, math.pi / spread, torch.full_like(spread, math.inf))
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
    ucl = torch.where(pos, l0 / torch.where(s > 0, s, torch.ones_like(s)), zero) * margin
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
    r = torch.sqrt(u * u + w * w)
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
    margin = 1.0 - 64 * a.shape[1] * U64
    return torch.where(torch.isinf(w), w, torch.nextafter(w * margin, torch.zeros_like(w)))


def batch_radius(z, a, method: str = "pi") -> float:
    """Batch radius: the minimum over samples of :func:`radius_lower_bound_batch`.

    With ``"pi"`` this is pi / max_x Delta_a(x), the controller's rho_a.
    """
    return float(radius_lower_bound_batch(z, a, method).min())
