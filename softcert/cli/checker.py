"""The independent checker behind ``softcert check``: pure functions, one per record kind and
one per summary section, and ``check_results`` over a whole results.json.

Independence is deliberate: this module keeps its own constants (unit roundoff, FP formats,
exp accuracy) and its own exact arithmetic (Fraction, mpmath intervals, argument principle)
instead of importing ``bounds``, ``analysis`` or ``certify``, so that a bug there cannot
vouch for itself. It shares only the record format (``softcert.cli.records``) and takes the
names of ``certify.METHODS`` (a list of names, no computation): a verdict of any other method
was not made by the verifier.

JSON numbers are read exactly: integers stay integers, floats are their exact binary64 values
(``Fraction(x)``); nothing is rounded through ``float()`` on the way to a decision.

Record kinds:

- ``vertex``: max/min of c·softmax(s) over the score box, decided exactly: the claim
  f <= V is Σ_i max((c_i - V) a_i, (c_i - V) b_i) <= 0 with [a_i, b_i] = [e^{l_i}, e^{u_i}];
  terms with equal exponents are merged, and by Lindemann–Weierstrass the remaining sum is
  zero only when every merged coefficient is, so interval evaluation at increasing
  precision decides it;
- ``radius``: F(t) = Σ_k exp(z_k + a_k t) has no zero in |t| < ρ (certified argument
  principle, see ``zero_count``); a claimed exact radius is the modulus of a zero of F;
- ``topk``: outward-rounded tail mass of the recorded row against the claimed τ⁺ <= ε;
- ``fp``: the closed-form FP softmax bound re-evaluated at 40 digits;
- ``feedback``: ‖ΠWΠ‖₂ <= s and ‖W‖₂ <= s' by exact rational LDLᵀ, thresholds exactly;
- ``verdict``: one image at one eps and method; only provably implied rules are checked
  (certified <=> worst lower margin > 0; certified => clean prediction correct and no PGD
  counterexample; lower margin <= PGD margin). Cross-method rules (e.g. "CROWN certifies
  whatever IBP does") are not theorems for these relaxations and are not asserted.

Sections: the table numbers are re-derived from the records and the section's own raw data
(certified, PGD and clean counts k/n, their accuracies and their 95 % Clopper-Pearson intervals,
whose ends are bracketed by exact rational binomial tails, and mean margins from verdicts; radius minima and
medians from per-image lists; top-k means from integer totals; FP rows from the formula;
feedback rows from their records), and the sealed manifest ties record counts to the
settings, so deleting a record, a section or the digest table fails.

Inputs (``check_inputs``): results.json names its model file and test data by SHA-256 and the
corpus of image ids; they must agree with the model section and the settings (corpus = the
first min(n_images, test-set size) images), and every verdict record must name a known method,
an eps and a method of the settings, an image of the corpus, and carry the id these imply.
Digests are unkeyed, so a consistent forger can still rewrite verdicts, eps or the model name:
only re-running the verifier on the named, hash-checked model and data catches that
(``softcert check --reverify``, softcert/cli/commands/check.py).
"""
from __future__ import annotations

import functools
import json
import math
import re
from fractions import Fraction

import mpmath
import numpy as np

from softcert.cli.records import (
    FORMAT,
    INPUTS,
    KINDS,
    SECTIONS,
    canonical,
    digest,
    ids_digest,
    record_counts,
    sha256,
)

__all__ = ["CHECKERS", "exact", "as_float", "linear_max_sign", "vertex_claim_holds", "zero_count",
           "tail_mass_bounds", "fp_formula", "norm_upper_holds", "check_vertex", "check_radius", "check_topk",
           "check_fp", "check_feedback", "check_verdict", "check_record", "check_certify_section",
           "check_radii_section", "check_topk_section", "check_fp_section", "check_feedback_section",
           "check_appendix_section", "expected_counts", "check_manifest", "check_results",
           "binomial_tail", "check_proportion_interval", "CI_TOL", "known_methods", "check_inputs",
           "check_verdict_context"]

U64 = 2.0 ** -53
VERTEX_MAX_PREC = 1 << 16  # bits; a nonzero sum is decided well before this on float64 inputs
PGD_SLACK = 1e-9  # float64 evaluation error allowed on a recorded PGD margin (relative to 1 + |m|)
CI_TOL = Fraction(1, 10 ** 9)  # a recorded interval endpoint may sit this far from the exact root


# ----------------------------------------------------------------------------- exact numbers
def exact(v, what: str) -> Fraction:
    """The exact rational value of a finite JSON number (bool and strings are refused)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what}: expected a number, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{what}: not finite ({v!r})")
    return Fraction(v)


def as_float(v, what: str) -> float:
    """A JSON number that must be a float64 value: an integer that float64 rounds is refused."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what}: expected a number, got {v!r}")
    if isinstance(v, int):
        try:
            f = float(v)
        except OverflowError:
            raise ValueError(f"{what}: {v} is not a float64 value") from None
        if int(f) != v:
            raise ValueError(f"{what}: {v} is not a float64 value (float64 rounds it to {f!r})")
        return f
    return v


def _floats(vs, what: str) -> list:
    if not isinstance(vs, list):
        raise ValueError(f"{what}: expected a list")
    return [as_float(v, f"{what}[{i}]") for i, v in enumerate(vs)]


# ----------------------------------------------------------------------------- vertex
def _iv(q: Fraction):
    from mpmath import iv

    return iv.mpf(q.numerator) / iv.mpf(q.denominator)


def linear_max_sign(c, lower, upper, V) -> int:
    """Sign (-1, 0, 1) of max over y in [e^l, e^u] of Σ (c_i - V) y_i, exactly.

    c, V: exact numbers (int, float or Fraction); lower, upper: float64 (lower may be -inf,
    a masked key has upper = -inf).
    """
    V = Fraction(V)
    merged: dict = {}
    for ci, li, ui in zip(c, lower, upper):
        d = Fraction(ci) - V
        x = ui if d > 0 else li  # the vertex maximising this term
        if d == 0 or x == -math.inf:
            continue  # the term is 0 (y_i = e^{-inf} = 0)
        q = Fraction(x)
        merged[q] = merged.get(q, Fraction(0)) + d
    terms = [(x, d) for x, d in merged.items() if d != 0]
    if not terms:
        return 0
    m = max(x for x, _ in terms)  # homogeneous in y: shift the exponents so that e^{x - m} <= 1
    if all(d > 0 for _, d in terms):
        return 1
    if all(d < 0 for _, d in terms):
        return -1
    from mpmath import iv

    old, prec = iv.prec, 64
    try:
        while prec <= VERTEX_MAX_PREC:
            iv.prec = prec
            total = iv.mpf(0)
            for x, d in terms:
                total += _iv(d) * iv.exp(_iv(x - m))
            if total.b < 0:
                return -1
            if total.a > 0:
                return 1
            prec *= 4
    finally:
        iv.prec = old
    raise ValueError(f"undecided at {VERTEX_MAX_PREC} bits")  # not reached on float64 inputs


def vertex_claim_holds(c, lower, upper, V, side: str = "upper") -> bool:
    """Exactly: c·softmax(s) <= V on the box (side 'upper') or >= V (side 'lower')."""
    if side == "upper":
        return linear_max_sign(c, lower, upper, V) <= 0
    return linear_max_sign([-Fraction(ci) for ci in c], lower, upper, -Fraction(V)) <= 0


def check_vertex(rec) -> str | None:
    c = [exact(v, f"c[{i}]") for i, v in enumerate(rec["c"])]
    lo, hi = _floats(rec["lower"], "lower"), _floats(rec["upper"], "upper")
    if not (len(c) == len(lo) == len(hi)) or not c:
        return "c, lower, upper differ in length or are empty"
    for i, (a, b) in enumerate(zip(lo, hi)):
        if math.isnan(a) or math.isnan(b) or b == math.inf or a > b:
            return f"invalid score interval [{a!r}, {b!r}] at key {i}"
    if all(b == -math.inf for b in hi):
        return "every key is masked (softmax undefined)"
    vmin, vmax = exact(rec["min"], "min"), exact(rec["max"], "max")
    if vmin > vmax:
        return f"min {rec['min']!r} > max {rec['max']!r}"
    if not vertex_claim_holds(c, lo, hi, vmax, "upper"):
        return f"upper bound {rec['max']!r} refuted: a vertex of the box exceeds it (exact decision)"
    if not vertex_claim_holds(c, lo, hi, vmin, "lower"):
        return f"lower bound {rec['min']!r} refuted: a vertex of the box falls below it (exact decision)"
    return None


# ----------------------------------------------------------------------------- radius
def _F(z, a, t):
    return mpmath.fsum(mpmath.exp(zk + ak * t) for zk, ak in zip(z, a))


def _dF_bound(z, a, t, h):
    """max |F'| on the disc |s - t| <= h: Σ |a_k| e^{Re(z_k + a_k t) + |a_k| h}."""
    return mpmath.fsum(abs(ak) * mpmath.exp(mpmath.re(zk + ak * t) + abs(ak) * h) for zk, ak in zip(z, a))


def zero_count(z, a, R, dps: int = 40, max_evals: int = 400_000):
    """Number of zeros of F(t) = Σ exp(z_k + a_k t) in |t| < R (argument principle), or None.

    The circle is split into arcs; an arc from t0 to t1 (arc length ℓ) is accepted when both
    |F(t0)| and |F(t1)| exceed ℓ/2 times the bound of |F'| on a disc of radius ℓ/2 around the
    end point: then F has no zero on the arc and its argument changes by less than π on it
    (each half stays in a half-plane around the nearer end's value), so the winding number is
    Σ of the principal increments / 2π. Arcs that fail are bisected; None when the budget
    ``max_evals`` runs out (e.g. a zero on the circle itself).
    """
    with mpmath.workdps(dps):
        z = [mpmath.mpf(float(v)) for v in z]
        a = [mpmath.mpf(float(v)) for v in a]
        R = mpmath.mpf(float(R))
        if R == 0:
            return 0
        n0 = int(min(4096, max(64, 8 * float(R) * max(abs(float(v)) for v in a))))
        cache = {}

        def F_at(theta):
            if theta not in cache:
                cache[theta] = _F(z, a, R * mpmath.expj(theta))
            return cache[theta]

        twopi = 2 * mpmath.pi
        stack = [(twopi * i / n0, twopi * (i + 1) / n0) for i in range(n0)]
        total = mpmath.mpf(0)
        evals = 0
        while stack:
            t0, t1 = stack.pop()
            f0, f1 = F_at(t0), F_at(t1)
            evals += 1
            if evals > max_evals:
                return None
            ell = R * (t1 - t0)
            h = ell / 2
            p0, p1 = R * mpmath.expj(t0), R * mpmath.expj(t1)
            ok = abs(f0) > h * _dF_bound(z, a, p0, h) and abs(f1) > h * _dF_bound(z, a, p1, h)
            if ok:
                total += mpmath.arg(f1 / f0)
            else:
                if t1 - t0 < mpmath.mpf(10) ** (-dps + 5):
                    return None
                mid = (t0 + t1) / 2
                stack += [(t0, mid), (mid, t1)]
        return int(mpmath.nint(total / twopi))


def check_radius(rec) -> str | None:
    z, a, lb = _floats(rec["z"], "z"), _floats(rec["a"], "a"), as_float(rec["lower_bound"], "lower_bound")
    if len(z) != len(a) or len(z) < 2:
        return "z and a must have the same length >= 2"
    if not (lb >= 0):
        return f"lower bound {lb!r} is negative or NaN"
    if math.isinf(lb):
        if max(a) != min(a):
            return "infinite radius claimed but the slopes differ"
        return None
    cnt = zero_count(z, a, lb)
    if cnt is None:
        return f"argument-principle count on |t| = {lb!r} did not resolve (zero on the circle?)"
    if cnt != 0:
        return f"F has {cnt} zero(s) inside the claimed radius {lb!r}"
    if rec.get("exact") is not None:
        ex = as_float(rec["exact"], "exact")
        zr = complex(*_floats(rec["zero"], "zero"))
        if ex < lb:
            return f"exact radius {ex!r} below the lower bound {lb!r}"
        with mpmath.workdps(40):
            t = mpmath.mpc(zr.real, zr.imag)
            zz = [mpmath.mpf(float(v)) for v in z]
            aa = [mpmath.mpf(float(v)) for v in a]
            scale = mpmath.fsum(abs(mpmath.exp(zk + ak * t)) for zk, ak in zip(zz, aa))
            resid = abs(_F(zz, aa, t)) / scale
        if resid > 1e-8:
            return f"claimed zero {zr} is not a zero of F (|F|/Σ|terms| = {float(resid):.3g})"
        if abs(abs(zr) - ex) > 1e-9 * max(1.0, ex):
            return f"exact radius {ex!r} differs from |zero| = {abs(zr)!r}"
        # no zero strictly closer than the claimed one (a disc slightly inside it)
        inner = zero_count(z, a, ex * (1 - 1e-6))
        if inner is None or inner != 0:
            return f"a zero lies closer than the claimed exact radius {ex!r}"
    return None


# ----------------------------------------------------------------------------- top-k
def _up(x: float) -> float:
    return float(np.nextafter(x, math.inf))


def _down(x: float) -> float:
    return max(0.0, float(np.nextafter(x, -math.inf)))


def tail_mass_bounds(scores, k: int) -> tuple[float, float]:
    """(τ⁻, τ⁺) enclosing the real tail mass 1 - Σ_{top k} softmax(s), -inf = masked.

    w_i = exp(s_i - m) in float64: the difference d_i = s_i - m is rounded (relative u, so the
    weight is off by a factor e^{±u|d_i|}) and exp is accurate to 2 ulp (4u relative); weights
    below 2^-1000 get an absolute allowance. Sums use math.fsum (correctly rounded: relative
    u/2 each), the quotient τ = T / (H + T) is monotone in T and H, rounded outward.
    """
    s = np.asarray(scores, dtype=np.float64)
    v = np.sort(s[np.isfinite(s)])[::-1]
    n = v.size
    if k <= 0:
        return 1.0, 1.0
    if k >= n:
        return 0.0, 0.0
    m = v[0]
    d = v - m
    w = np.exp(d)
    eta = 4 * U64 + U64 * np.abs(d) * 1.0001 + 2 * U64
    tiny = 2.0 ** -1000
    w_up = w * (1 + eta) + tiny
    w_lo = np.maximum(w * (1 - eta) - tiny, 0.0)
    # each product above carries one more rounding: absorbed by the 2u in eta
    T_up = _up(math.fsum(w_up[k:]) * (1 + U64))
    T_lo = _down(math.fsum(w_lo[k:]) * (1 - U64))
    H_up = _up(math.fsum(w_up[:k]) * (1 + U64))
    H_lo = _down(math.fsum(w_lo[:k]) * (1 - U64))
    hi = _up(_up(T_up / _down(H_lo + T_up)) * (1 + 2 * U64))
    lo = _down(_down(T_lo / _up(H_up + T_lo)) * (1 - 2 * U64))
    return lo, min(hi, 1.0)


def check_topk(rec) -> str | None:
    k, eps = rec["k"], as_float(rec["eps"], "eps")
    if isinstance(k, bool) or not isinstance(k, int):
        return f"k {k!r} is not an integer"
    scores = _floats(rec["scores"], "scores")
    for name in ("tail_upper", "tail_lower_prev"):
        if rec.get(name) is not None:
            as_float(rec[name], name)
    lo, hi = tail_mass_bounds(scores, k)
    if not (rec["tail_upper"] <= eps):
        return f"claimed tail bound {rec['tail_upper']!r} exceeds eps {eps}"
    if rec["tail_upper"] < hi:
        if rec["tail_upper"] < lo:
            return (f"tail mass of the top-{k} truncation is >= {lo!r}, above the claimed bound "
                    f"{rec['tail_upper']!r}")
        return f"claimed tail bound {rec['tail_upper']!r} not proved (recomputed τ⁺ = {hi!r})"
    if rec.get("tail_lower_prev") is not None and k >= 1:
        lo_p, hi_p = tail_mass_bounds(scores, k - 1)
        if rec["tail_lower_prev"] > hi_p:
            return (f"claimed lower bound {rec['tail_lower_prev']!r} of τ_(k-1) exceeds the "
                    f"recomputed τ⁺_(k-1) = {hi_p!r}")
        if rec.get("minimal_proved") and not rec["tail_lower_prev"] > eps:
            return "minimality claimed but the lower bound of τ_(k-1) is not above eps"
    return None


# ----------------------------------------------------------------------------- fp
_FORMATS = {"float64": (53, -1022, 1024), "float32": (24, -126, 128), "float16": (11, -14, 16),
            "bfloat16": (8, -126, 128)}


def fp_formula(n, algorithm, dtype, block, exp_ulps, score_range=None, dps: int = 40):
    """(rel, abs_floor) of the componentwise FP softmax bound, evaluated at ``dps`` digits.

    The formula (standard model; K_u roundings and K_e exps per normaliser term; L the
    argument-rounding constant min(ln n/(1-u), R)):
    P± = (1±u)^{K_u}(1±u_e)^{K_e}, η_S = P⁺(n η_e + steps(n P⁺ η_e + q)),
    S⁺ = e^{uL}P⁺ + η_S, S⁻ = e^{-uL}P⁻ - η_S, B⁺ = (1+u_e)(1+u)^{k_out}/S⁻,
    B⁻ = (1-u_e)(1-u)^{k_out}/S⁺, rel = max(B⁺-1, 1-B⁻) [+ B⁺(e^{uR}-1) with a range R],
    abs_floor = η_e(1+u)^{k_out}/S⁻ + 2 k_out q(1+u_e) [+ B⁺ u/((1-u)e) without a range].
    """
    p, emin, _ = _FORMATS[dtype]
    with mpmath.workdps(dps):
        u = mpmath.mpf(2) ** (-p)
        q = mpmath.mpf(2) ** (emin - p + 1)
        k = mpmath.mpf(exp_ulps)
        ue = 2 * k * u
        if algorithm == "three_pass":
            Ku, Ke, steps, kout = n - 1, 1, 0, 1
        elif algorithm in ("two_pass", "online"):
            Ku, Ke, steps, kout = 2 * (n - 1), n, n - 1, (1 if algorithm == "two_pass" else 2)
        elif algorithm == "blocked":
            nb = -(-n // block)
            Ku, Ke, steps, kout = (min(block, n) - 1) + 2 * (nb - 1), nb, 2 * (nb - 1), 1
        elif algorithm == "tree":
            depth = math.ceil(math.log2(n)) if n > 1 else 0
            Ku, Ke, steps, kout = 2 * depth, depth, 2 * (n - 1), 1
        else:
            raise ValueError(f"algorithm: unknown {algorithm!r}")
        L = mpmath.log(n) / (1 - u) if n > 1 else mpmath.mpf(0)
        if score_range is not None:
            L = min(L, mpmath.mpf(score_range))
        Phi = (1 + u) ** Ku * (1 + ue) ** Ke
        Plo = (1 - u) ** Ku * (1 - ue) ** Ke
        eta_e = k * q
        eta_S = Phi * (n * eta_e + steps * (n * Phi * eta_e + q))
        S_hi = mpmath.exp(u * L) * Phi + eta_S
        S_lo = mpmath.exp(-u * L) * Plo - eta_S
        B_hi = (1 + ue) * (1 + u) ** kout / S_lo
        B_lo = (1 - ue) * (1 - u) ** kout / S_hi
        rel = max(B_hi - 1, 1 - B_lo)
        floor = eta_e * (1 + u) ** kout / S_lo + kout * q * (1 + ue) * 2
        if score_range is not None:
            rel += B_hi * mpmath.expm1(u * mpmath.mpf(score_range))
        else:
            floor += B_hi * u / ((1 - u) * mpmath.e)
        return float(rel), float(floor)


def check_fp(rec) -> str | None:
    for name in ("n", "block"):
        if rec.get(name) is not None and (isinstance(rec[name], bool) or not isinstance(rec[name], int)
                                          or rec[name] < 1):
            return f"{name} {rec[name]!r} is not a positive integer"
    if rec["dtype"] not in _FORMATS:
        return f"unknown dtype {rec['dtype']!r}"
    sr = rec.get("score_range")
    rel, floor = fp_formula(rec["n"], rec["algorithm"], rec["dtype"], rec.get("block") or 128,
                            as_float(rec["exp_ulps"], "exp_ulps"), None if sr is None else as_float(sr, "score_range"))
    for name, claimed, val in (("rel", as_float(rec["rel"], "rel"), rel),
                               ("abs_floor", as_float(rec["abs_floor"], "abs_floor"), floor)):
        # val is the 40-digit value rounded to nearest: allow that half ulp, nothing more
        if not (claimed >= val * (1 - 2.0 ** -52)):
            return f"{name} {claimed!r} is below the formula's value {val!r}"
        if claimed > val * (1 + 1e-8) + 1e-300:
            return f"{name} {claimed!r} does not match the formula's value {val!r}"
    return None


# ----------------------------------------------------------------------------- feedback
def _psd(M) -> bool:
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
            if f:
                for j in range(k + 1, n):
                    A[i][j] -= f * A[k][j]
    return True


def norm_upper_holds(A, s) -> bool:
    """Exactly: ‖A‖₂ <= s, i.e. s²I - AᵀA is positive semidefinite (rationals)."""
    m = len(A[0])
    s2 = Fraction(s) ** 2
    AtA = [[sum((A[r][i] * A[r][j] for r in range(len(A))), Fraction(0)) for j in range(m)]
           for i in range(m)]
    return _psd([[(s2 if i == j else 0) - AtA[i][j] for j in range(m)] for i in range(m)])


def check_feedback(rec) -> str | None:
    W = [[exact(v, "W") for v in row] for row in rec["W"]]
    n = len(W)
    if any(len(r) != n for r in W):
        return "W is not square"
    r = [sum(row, Fraction(0)) / n for row in W]
    c = [sum((W[i][j] for i in range(n)), Fraction(0)) / n for j in range(n)]
    g = sum(r, Fraction(0)) / n
    P = [[W[i][j] - r[i] - c[j] + g for j in range(n)] for i in range(n)]
    s, sw = exact(rec["proj_norm_upper"], "proj_norm_upper"), exact(rec["norm_upper"], "norm_upper")
    if s < 0 or sw < 0:
        return "a norm bound is negative"
    if not norm_upper_holds(P, s):
        return f"‖ΠWΠ‖₂ <= {rec['proj_norm_upper']!r} refuted (s²I - AᵀA is not positive semidefinite)"
    if not norm_upper_holds(W, sw):
        return f"‖W‖₂ <= {rec['norm_upper']!r} refuted"
    for name, bound, num in (("beta_star", s, 2), ("beta_classical", sw, 1)):
        v = rec[name]
        if isinstance(v, float) and v == math.inf:
            if bound != 0:
                return f"{name} = inf claimed with a nonzero norm bound"
        elif bound > 0 and exact(v, name) > num / bound:
            return f"{name} = {v!r} exceeds {num}/{float(bound)!r}"
    if rec.get("beta") is not None and rec.get("contraction") is not None:
        if exact(rec["contraction"], "contraction") < exact(rec["beta"], "beta") * s / 2:
            return f"contraction {rec['contraction']!r} below β‖ΠWΠ‖/2"
    return None


# ----------------------------------------------------------------------------- verdict
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_verdict(rec) -> str | None:
    """One image at one eps and method: the rules that the definitions imply.

    lower_margin is the verifier's min over j != label of its lower bound on z_label - z_j over
    the ball (None when the image was not verified: clean prediction wrong); the clean image
    lies in the ball, so certified => predicted == label; a PGD point lies in the ball, so
    lower_margin <= pgd_margin (up to the float64 evaluation of the PGD margin, PGD_SLACK) and
    certified => no PGD counterexample.
    """
    for name in ("image", "label", "predicted"):
        if not _is_int(rec[name]) or rec[name] < 0:
            return f"{name} {rec[name]!r} is not a non-negative integer"
    for name in ("certified", "pgd_counterexample"):
        if not isinstance(rec[name], bool):
            return f"{name} {rec[name]!r} is not a boolean"
    if not isinstance(rec["method"], str):
        return "method is not a string"
    as_float(rec["eps"], "eps")
    lm, pm, cert = rec["lower_margin"], rec["pgd_margin"], rec["certified"]
    if lm is not None:
        lm = as_float(lm, "lower_margin")
        if math.isnan(lm):
            return "lower_margin is NaN"
    if pm is not None:
        pm = as_float(pm, "pgd_margin")
        if not math.isfinite(pm):
            return f"pgd_margin {pm!r} is not finite"
    correct = rec["predicted"] == rec["label"]
    if cert and not correct:
        return "certified although the clean prediction is wrong (the clean image lies in the ball)"
    if cert != (lm is not None and lm > 0):
        return f"certified = {cert} but the recorded lower margin is {lm!r} (certified <=> lower margin > 0)"
    if pm is None:
        if rec["pgd_counterexample"]:
            return "PGD counterexample claimed without a PGD margin"
    else:
        if rec["pgd_counterexample"] != (pm < 0):
            return f"pgd_counterexample = {rec['pgd_counterexample']} but the PGD margin is {pm!r}"
        if lm is not None and lm > pm + PGD_SLACK * (1 + abs(pm)):
            return f"lower margin {lm!r} exceeds the margin {pm!r} PGD reached inside the ball"
    if cert and rec["pgd_counterexample"]:
        return "certified image has a PGD counterexample"
    return None


CHECKERS = {"verdict": check_verdict, "vertex": check_vertex, "radius": check_radius, "topk": check_topk,
            "fp": check_fp, "feedback": check_feedback}
assert set(CHECKERS) == set(KINDS)


def check_record(rec: dict) -> str | None:
    """The reason ``rec`` fails its kind's check, or None. Memoised on the canonical JSON (the
    checks are pure), so re-checking a file with the same records costs nothing."""
    return _check_canonical(canonical(rec))


@functools.lru_cache(maxsize=4096)
def _check_canonical(text: str) -> str | None:
    rec = json.loads(text)
    kind = rec.get("kind")
    if kind not in CHECKERS:
        return f"unknown kind {kind!r}"
    try:
        return CHECKERS[kind](rec)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, IndexError) as exc:
        return f"malformed record: {type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------- sections
def _same_float(claimed, exact_value: Fraction) -> bool:
    """claimed is exact_value correctly rounded to float64 (how int/int and mean of ints round)."""
    return isinstance(claimed, (int, float)) and not isinstance(claimed, bool) and \
        math.isfinite(claimed) and claimed == float(exact_value)


def _lookup(by_id, bad, rid, fails, where):
    """The record ``rid`` if present and valid; None (a failure recorded when it is absent)."""
    if rid in bad:
        return None  # already reported on its own
    rec = by_id.get(rid)
    if rec is None:
        fails.append((where, f"no record {rid!r} behind this table entry"))
    return rec


def check_certify_section(sec, verdicts, settings, bad=frozenset()) -> list:
    """Rows re-derived from the per-image verdicts: n, clean/PGD/certified accuracy, mean margin."""
    fails = []
    n = sec["images"]
    if not _is_int(n) or n < 0 or n > settings["n_images"]:
        return [("section certify", f"images {n!r} is not an integer in [0, n_images]")]
    groups: dict = {}
    for r in verdicts:
        groups.setdefault((r["eps"], r["method"]), []).append(r)
    want = {(e, m) for e in settings["eps"] for m in settings["methods"]}
    rows = {(r["eps"], r["method"]): r for r in sec["rows"]}
    if len(rows) != len(sec["rows"]):
        fails.append(("section certify", "duplicate (eps, method) rows"))
    for key in sorted(want - set(rows), key=str):
        fails.append(("section certify", f"no row for eps={key[0]} method={key[1]}"))
    for key in sorted(set(rows) - want, key=str):
        fails.append(("section certify", f"row eps={key[0]} method={key[1]} is not in the settings"))
    for key in sorted(set(groups) - want, key=str):
        fails.append(("section certify", f"verdict records for eps={key[0]} method={key[1]} not in the settings"))
    per_image: dict = {}
    for key in sorted(want & set(rows), key=str):
        row, where = rows[key], f"section certify row eps={key[0]} method={key[1]}"
        vs = groups.get(key, [])
        if any(v.get("id") in bad for v in vs):
            continue  # a failing verdict record is reported on its own
        if sorted(v["image"] for v in vs) != list(range(n)):
            fails.append((where, f"verdict records cover images {sorted(v['image'] for v in vs)}, "
                                 f"expected 0..{n - 1}"))
            continue
        for v in vs:
            pi = per_image.setdefault((v["image"], key[0]), v)
            if (pi["label"], pi["predicted"], pi["pgd_margin"], pi["pgd_counterexample"]) != \
                    (v["label"], v["predicted"], v["pgd_margin"], v["pgd_counterexample"]):
                fails.append((where, f"image {v['image']}: label, prediction or PGD outcome differ "
                                     "between methods (one attack per eps)"))
        correct = [v for v in vs if v["predicted"] == v["label"]]
        derived = {"n": n,
                   "clean_acc": Fraction(len(correct), n) if n else Fraction(0),
                   "pgd_acc": Fraction(sum(not v["pgd_counterexample"] for v in correct), n) if n else Fraction(0),
                   "certified_acc": Fraction(sum(v["certified"] for v in vs), n) if n else Fraction(0)}
        for name, val in derived.items():
            ok = row[name] == val if name == "n" else _same_float(row[name], val)
            if not ok:
                fails.append((where, f"{name} = {row[name]!r}, but the verdict records give {float(val)!r}"))
        # the counts behind each accuracy, and their Clopper-Pearson intervals
        for what in ("clean", "pgd", "certified"):
            k_want = derived[f"{what}_acc"] * n
            k_got = row.get(f"{what}_k")
            if k_got is None or not _is_int(k_got) or k_got != k_want:
                fails.append((where, f"{what}_k = {k_got!r}, but the verdict records give {int(k_want)}"))
                continue
            err = check_proportion_interval(k_got, n, row.get(f"{what}_ci"), row.get("confidence"))
            if err:
                fails.append((where, f"{what}_ci: {err}"))
        ms = [Fraction(v["lower_margin"]) for v in correct
              if v["lower_margin"] is not None and math.isfinite(v["lower_margin"])]
        claimed = row["mean_lower_margin"]
        if not ms:
            if claimed is not None:
                fails.append((where, f"mean_lower_margin = {claimed!r}, but no finite margin is recorded"))
        else:
            mean = sum(ms, Fraction(0)) / len(ms)
            # a float64 mean of m terms: error <= (m + 1) u Σ|x| / m (any summation order)
            tol = (len(ms) + 1) * Fraction(2) ** -52 * sum(abs(x) for x in ms) / len(ms)
            if claimed is None or not isinstance(claimed, (int, float)) or abs(Fraction(claimed) - mean) > tol:
                fails.append((where, f"mean_lower_margin = {claimed!r}, but the verdict records give "
                                     f"{float(mean)!r}"))
    if not fails and per_image:
        correct_imgs = {i for (i, _), v in per_image.items() if v["predicted"] == v["label"]}
        first_eps = {i for (i, e) in per_image if e == settings["eps"][0]}
        if sec["correct"] != len(correct_imgs & first_eps):
            fails.append(("section certify", f"correct = {sec['correct']!r}, but the verdict records give "
                                             f"{len(correct_imgs & first_eps)}"))
    return fails


def binomial_tail(n: int, k: int, p: Fraction, upper: bool = True) -> Fraction:
    """P(X >= k) (``upper``) or P(X <= k) for X ~ Binomial(n, p), exactly in rationals."""
    p = Fraction(p)
    js = range(k, n + 1) if upper else range(0, k + 1)
    return sum((math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in js), Fraction(0))


def check_proportion_interval(k, n, ci, confidence) -> str | None:
    """Is ``ci`` the Clopper-Pearson interval of k/n at ``confidence`` (to CI_TOL)?

    lo: P(X >= k | lo) = α/2, increasing in p, so the exact root lies in [lo - tol, lo + tol]
    iff the tail at lo - tol is <= α/2 <= the tail at lo + tol; hi mirrors it with
    P(X <= k | hi) = α/2 (decreasing). k = 0 forces lo = 0 and k = n forces hi = 1.
    """
    if not (_is_int(k) and _is_int(n) and 0 <= k <= n and n >= 1):
        return f"k/n = {k!r}/{n!r} is not a proportion of integers"
    if not (isinstance(ci, list) and len(ci) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                          and math.isfinite(v) for v in ci)):
        return f"interval {ci!r} is not a pair of finite numbers"
    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        return f"confidence {confidence!r} is not in (0, 1)"
    lo, hi = Fraction(ci[0]), Fraction(ci[1])
    if not 0 <= lo <= Fraction(k, n) <= hi <= 1:
        return f"interval {ci!r} does not satisfy 0 <= lo <= k/n <= hi <= 1"
    half = (1 - Fraction(confidence).limit_denominator(10 ** 6)) / 2
    one, zero = Fraction(1), Fraction(0)
    if k == 0:
        if lo != 0:
            return f"lower end {ci[0]!r} of the interval for 0/{n} is not 0"
    elif not (binomial_tail(n, k, max(zero, lo - CI_TOL)) <= half <= binomial_tail(n, k, min(one, lo + CI_TOL))):
        return f"lower end {ci[0]!r} is not the Clopper-Pearson bound of {k}/{n}"
    if k == n:
        if hi != 1:
            return f"upper end {ci[1]!r} of the interval for {n}/{n} is not 1"
    elif not (binomial_tail(n, k, max(zero, hi - CI_TOL), upper=False) >= half
              >= binomial_tail(n, k, min(one, hi + CI_TOL), upper=False)):
        return f"upper end {ci[1]!r} is not the Clopper-Pearson bound of {k}/{n}"
    return None


def _lower_median(xs):
    return sorted(xs)[(len(xs) - 1) // 2]


def check_radii_section(sec, by_id, bad, settings) -> list:
    fails, where = [], "section radii"
    n = sec["images"]
    pi, root = _floats(sec["per_image_pi"], "per_image_pi"), _floats(sec["per_image_root"], "per_image_root")
    if not _is_int(n) or not 1 <= n <= settings["radius_images"] or len(pi) != n or len(root) != n:
        return [(where, f"images = {n!r} does not match the per-image lists ({len(pi)}, {len(root)})")]
    for name, val in (("rho_batch_pi", min(pi)), ("rho_batch_root", min(root)),
                      ("median_pi", _lower_median(pi)), ("median_root", _lower_median(root))):
        if sec[name] != val:
            fails.append((where, f"{name} = {sec[name]!r}, but the per-image list gives {val!r}"))
    ex = sec["exact"]
    idx = [e["index"] for e in ex]
    if len(ex) != min(settings["exact_radii"], n) or len(set(idx)) != len(idx) or \
            not all(_is_int(i) and 0 <= i < n for i in idx):
        return fails + [(where, f"exact radii at images {idx}: expected {min(settings['exact_radii'], n)} "
                                "distinct images")]
    rest = [root[i] for i in range(n) if i not in set(idx)]
    if rest and max(root[i] for i in idx) > min(rest):
        fails.append((where, "the exact radii are not those of the images with the smallest root bounds"))
    for e in ex:
        rec = _lookup(by_id, bad, f"radius/image{e['index']}", fails, where)
        if rec is not None and (rec["lower_bound"] != e["lower_root"] or rec["exact"] != e["exact"]):
            fails.append((where, f"image {e['index']}: table ({e['lower_root']!r}, {e['exact']!r}) differs "
                                 f"from its record ({rec['lower_bound']!r}, {rec['exact']!r})"))
    return fails


def check_topk_section(sec, settings) -> list:
    """Means re-derived from the integer totals per (layer, head): sum of k, of n, proved count."""
    fails = []
    for key in ("model", "minilm"):
        if key not in sec:
            if key == "model":
                fails.append(("section topk", "no model table"))
            continue
        if set(sec[key]) != {str(e) for e in settings["topk_eps"]}:
            fails.append((f"section topk/{key}", f"eps {sorted(sec[key])} differ from the settings"))
        for e, d in sec[key].items():
            where = f"section topk/{key}/eps={e}"
            rows = d["rows"]
            if not _is_int(rows) or rows < 1 or "k_sum" not in d:
                fails.append((where, "no integer totals (k_sum, n_sum, proved_count, rows) to re-derive from"))
                continue
            for L, (ks, ns, ps) in enumerate(zip(d["k_sum"], d["n_sum"], d["proved_count"])):
                for H, (k, nn, p) in enumerate(zip(ks, ns, ps)):
                    if not (_is_int(k) and _is_int(nn) and _is_int(p) and 0 <= k <= nn and 0 <= p <= rows):
                        fails.append((where, f"layer {L} head {H}: totals k={k!r}, n={nn!r}, proved={p!r} "
                                             "are not integers with 0 <= k <= n, proved <= rows"))
                        continue
                    for name, tot in (("mean_k", k), ("mean_n", nn), ("proved_minimal", p)):
                        claimed = d[name][L][H]
                        if not _same_float(claimed, Fraction(tot, rows)):
                            fails.append((where, f"{name}[{L}][{H}] = {claimed!r}, but {tot}/{rows} = "
                                                 f"{float(Fraction(tot, rows))!r}"))
            shape = (len(d["k_sum"]), len(d["k_sum"][0]) if d["k_sum"] else 0)
            for name in ("mean_k", "mean_n", "proved_minimal", "n_sum", "proved_count"):
                if (len(d[name]), len(d[name][0]) if d[name] else 0) != shape:
                    fails.append((where, f"{name} has a different shape from k_sum"))
    return fails


def check_fp_section(sec, by_id, bad, settings) -> list:
    fails, where = [], "section fp"
    want = [(n, a) for n in sec["lengths"] for a in settings["fp_algorithms"]]
    got = [(r["n"], r["algorithm"]) for r in sec["table"]]
    if got != want:
        fails.append((where, f"table rows {got} differ from lengths x algorithms {want}"))
    for r in sec["table"]:
        w = f"{where} row n={r['n']} {r['algorithm']}"
        reason = check_fp(dict(r, dtype="float32", block=128, exp_ulps=_FP_EXP_ULPS, score_range=None))
        if reason:
            fails.append((w, reason))
        if r["rel_in_u"] != r["rel"] / 2.0 ** -24:
            fails.append((w, f"rel_in_u = {r['rel_in_u']!r}, but rel / 2^-24 = {r['rel'] / 2.0 ** -24!r}"))
        rec = _lookup(by_id, bad, f"fp/n={r['n']}/{r['algorithm']}", fails, w)
        if rec is not None and (rec["rel"], rec["abs_floor"]) != (r["rel"], r["abs_floor"]):
            fails.append((w, "table row differs from its record"))
    for m in sec["measured"]:
        if not m["max_ratio"] <= 1:
            fails.append((f"{where} measured n={m['n']}", f"a measured error exceeds its bound "
                                                           f"(max measured/bound = {m['max_ratio']!r})"))
    return fails


def check_feedback_section(sec, by_id, bad, model) -> list:
    fails, where = [], "section feedback"
    cfg = model["config"]
    want = cfg["depth"] * cfg["heads"] + 1
    if len(sec["rows"]) != want:
        fails.append((where, f"{len(sec['rows'])} rows, expected depth x heads + 1 = {want}"))
    for r in sec["rows"]:
        w = f"{where} row {r['case']}"
        q = r["contraction_at_1"]
        if r["unique_at_1"] != (q is not None and Fraction(q) < 1):
            fails.append((w, f"unique_at_1 = {r['unique_at_1']} but the contraction at β = 1 is {q!r}"))
        rec = _lookup(by_id, bad, f"feedback/{r['case']}", fails, w)
        if rec is None:
            continue
        pairs = (("beta_star", "beta_star"), ("beta_classical", "beta_classical"), ("proj_norm", "proj_norm_upper"),
                 ("norm", "norm_upper"), ("contraction_at_1", "contraction"))
        diff = [a for a, b in pairs if r[a] != rec[b]]
        if r["n"] != len(rec["W"]):
            diff.append("n")
        if diff:
            fails.append((w, f"{', '.join(diff)} differ from its record"))
    return fails


def check_appendix_section(sec) -> list:
    return [(f"section appendix/{k}", "derivation not verified") for k, v in sec.items()
            if not (isinstance(v, dict) and v and all(x is True for x in v.values()))]


_FP_EXP_ULPS = 1.0  # float32 expf accuracy the report's FP rows assume (ulps); the checker's own copy


# ----------------------------------------------------------------------------- manifest
def expected_counts(results) -> dict:
    """Record counts per kind that the settings and the sections imply."""
    st, cfg = results["settings"], results["model"]["config"]
    tk = results["topk"]
    return {
        "verdict": results["certify"]["images"] * len(st["eps"]) * len(st["methods"]),
        "vertex": st["vertex_rows"] * len(st["eps"]),
        "radius": min(st["exact_radii"], results["radii"]["images"]),
        "topk": max(2, st["topk_records"] // 3) + (st["topk_records"] if "minilm" in tk else 0),
        "fp": len(results["fp"]["lengths"]) * len(st["fp_algorithms"]),
        "feedback": cfg["depth"] * cfg["heads"] + 1,
    }


def check_manifest(results, certs) -> list:
    fails = []
    digests = results.get("digests")
    if not isinstance(digests, dict):
        fails.append(("digests", "the section digest table is missing"))
        digests = {}
    man = results.get("manifest")
    if not isinstance(man, dict):
        return fails + [("manifest", "the sealed manifest is missing")]
    if man.get("sha256") != digest(man):
        fails.append(("manifest", "digest mismatch: the manifest was changed after the report"))
    if man.get("format") != FORMAT:
        fails.append(("manifest", f"format {man.get('format')!r}, this checker reads {FORMAT} "
                                  "(a report of another softcert version: re-run softcert report)"))
    if man.get("inputs") != results.get("inputs"):
        fails.append(("manifest", "inputs differ from the sealed inputs"))
    if man.get("sections") != list(SECTIONS):
        fails.append(("manifest", f"sections {man.get('sections')!r}, expected {list(SECTIONS)}"))
    for name in SECTIONS:
        if name not in results:
            fails.append((f"section {name}", "missing"))
        elif name not in digests:
            fails.append((f"section {name}", "no digest in the digest table"))
        elif sha256(results[name]) != digests[name]:
            fails.append((f"section {name}", "digest mismatch: a reported number was changed"))
    for name in sorted(set(digests) - set(SECTIONS)):
        fails.append((f"section {name}", "digest of an unknown section"))
    counts = record_counts(certs)
    if man.get("record_counts") != counts:
        fails.append(("manifest", f"record counts {counts} differ from the sealed {man.get('record_counts')}"))
    if man.get("record_ids_sha256") != ids_digest(certs):
        fails.append(("manifest", "the record ids differ from the sealed list (a record was removed, added or renamed)"))
    if man.get("settings") != results.get("settings"):
        fails.append(("manifest", "settings differ from the sealed settings"))
    if all(name in results for name in SECTIONS):
        try:
            want = expected_counts(results)
        except (KeyError, TypeError) as exc:
            return fails + [("manifest", f"cannot derive the expected record counts ({type(exc).__name__}: {exc})")]
        for kind, n in want.items():
            if counts.get(kind, 0) != n:
                fails.append((f"records {kind}", f"{counts.get(kind, 0)} records, the settings imply {n}"))
    return fails


# ----------------------------------------------------------------------------- inputs
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _hex(v) -> bool:
    return isinstance(v, str) and _HEX64.fullmatch(v) is not None


@functools.lru_cache(maxsize=1)
def known_methods() -> frozenset:
    """The method names ``softcert.certify`` runs (``certify.METHODS``)."""
    from softcert.certify.methods import METHODS

    return frozenset(METHODS)


def _model_input_fails(m, model_sec) -> list:
    if not (isinstance(m, dict) and isinstance(m.get("spec"), str) and isinstance(m.get("file"), str)
            and _hex(m.get("sha256")) and (m.get("zoo") is None or isinstance(m["zoo"], str))):
        return [("inputs", "model: expected spec, zoo, file and the SHA-256 of the file")]
    label = m["spec"] if m["zoo"] is None else f"zoo:{m['zoo']}"
    if model_sec.get("spec") != label:
        return [("inputs", f"model {label!r} is not the model section's {model_sec.get('spec')!r}")]
    return []


def _data_input_fails(d, model_sec) -> list:
    bundled = isinstance(d, dict) and d.get("spec") is None and d.get("file") is None and d.get("file_sha256") is None
    own = isinstance(d, dict) and isinstance(d.get("spec"), str) and isinstance(d.get("file"), str) and \
        _hex(d.get("file_sha256"))
    if not ((bundled or own) and _is_int(d.get("size")) and d["size"] >= 1 and _hex(d.get("sha256"))):
        return [("inputs", "data: expected spec, file and its SHA-256 (or all null: the bundled split), "
                           "size >= 1 and the SHA-256 of the arrays")]
    want = "bundled test split" if bundled else d["spec"]
    if model_sec.get("data") != want:
        return [("inputs", f"data {want!r} is not the model section's {model_sec.get('data')!r}")]
    return []


def check_inputs(results) -> list:
    """The inputs name a model file and test data by SHA-256 and agree with the model section;
    the corpus is the first min(n_images, size) images and the certify section covers it; the
    settings name only methods softcert.certify runs."""
    inp, st = results.get("inputs"), results.get("settings")
    if not isinstance(inp, dict) or set(inp) != set(INPUTS):
        return [("inputs", f"missing or malformed: a report names its {', '.join(INPUTS)} (re-run softcert report)")]
    model_sec = results.get("model") if isinstance(results.get("model"), dict) else {}
    fails = _model_input_fails(inp["model"], model_sec) + _data_input_fails(inp["data"], model_sec)
    unknown = [m for m in st.get("methods", ())
               if not isinstance(m, str) or m not in known_methods()] if isinstance(st, dict) else []
    if unknown:
        fails.append(("settings", f"unknown method(s) {unknown}: softcert.certify runs {sorted(known_methods())}"))
    if fails or not isinstance(st, dict):
        return fails
    n = min(st["n_images"], inp["data"]["size"])
    images = inp["corpus"].get("images") if isinstance(inp["corpus"], dict) else None
    if images != list(range(n)):
        shown = images if not isinstance(images, list) or len(images) <= 8 else f"{images[:8]}... ({len(images)})"
        fails.append(("inputs", f"corpus images {shown} are not the first min(n_images, test-set size) = {n}"))
    elif isinstance(results.get("certify"), dict) and results["certify"].get("images") != n:
        fails.append(("section certify", f"images = {results['certify'].get('images')!r}, the corpus has {n}"))
    return fails


def check_verdict_context(rec, settings, images) -> str | None:
    """A verdict against the manifest: a known method, an eps and a method of the settings, an
    image of the corpus (``images``: a set, or None when the corpus is malformed), and the id
    ``verdict/eps=E/METHOD/imageI`` these imply."""
    meth, eps, image = rec.get("method"), rec.get("eps"), rec.get("image")
    if not isinstance(meth, str) or meth not in known_methods():
        return f"unknown method {meth!r} (softcert.certify runs {sorted(known_methods())})"
    if isinstance(settings, dict) and (eps not in settings.get("eps", ()) or meth not in settings.get("methods", ())):
        return f"eps {eps!r} / method {meth!r} are not among the manifest's settings"
    if images is not None and (not _is_int(image) or image not in images):
        return f"image {image!r} is not in the manifest's corpus"
    if rec.get("id") != f"verdict/eps={eps}/{meth}/image{image}":
        return f"id {rec.get('id')!r} does not name the record's eps, method and image"
    return None


def _corpus(results):
    try:
        images = results["inputs"]["corpus"]["images"]
        return {i for i in images if _is_int(i)}
    except (KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------- driver
def check_results(results: dict, progress: bool = False) -> list[tuple[str, str]]:
    """[(record id or section, reason)] for every failure (empty: everything checks)."""
    certs = results.get("certificates") if isinstance(results, dict) else None
    if not isinstance(certs, list) or not certs:
        return [("certificates", "no certificate records in the file")]
    failures, seen, bad, by_id = [], set(), set(), {}
    images = _corpus(results)
    it = certs
    if progress:
        from tqdm import tqdm

        it = tqdm(certs, desc="check", unit="record")
    for rec in it:
        if not isinstance(rec, dict):
            failures.append(("<record>", "not a JSON object"))
            continue
        rid = rec.get("id", "<no id>")
        if rid in seen:
            failures.append((rid, "duplicate record id"))
        seen.add(rid)
        by_id[rid] = rec
        reason = None
        if rec.get("sha256") != digest(rec):
            reason = "digest mismatch: the record was changed after the report"
            failures.append((rid, reason))
        why = check_record(rec)
        if not why and rec.get("kind") == "verdict":
            try:
                why = check_verdict_context(rec, results.get("settings"), images)
            except TypeError as exc:  # settings whose eps or methods are no list
                why = f"cannot be compared with the settings ({exc})"
        if why:
            failures.append((rid, why))
        if why or reason:
            bad.add(rid)
    failures += check_manifest(results, [r for r in certs if isinstance(r, dict)])
    try:
        failures += check_inputs(results)
    except (KeyError, TypeError, AttributeError) as exc:
        failures.append(("inputs", f"malformed: {type(exc).__name__}: {exc}"))
    st = results.get("settings")
    sections = (
        ("certify", lambda: check_certify_section(
            results["certify"], [r for r in certs if isinstance(r, dict) and r.get("kind") == "verdict"], st,
            bad)),
        ("radii", lambda: check_radii_section(results["radii"], by_id, bad, st)),
        ("topk", lambda: check_topk_section(results["topk"], st)),
        ("fp", lambda: check_fp_section(results["fp"], by_id, bad, st)),
        ("feedback", lambda: check_feedback_section(results["feedback"], by_id, bad, results["model"])),
        ("appendix", lambda: check_appendix_section(results["appendix"])),
    )
    for name, fn in sections:
        if name not in results or not isinstance(st, dict):
            continue  # a missing section or settings is reported by check_manifest
        try:
            failures += fn()
        except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, IndexError,
                AttributeError) as exc:
            failures.append((f"section {name}", f"malformed section: {type(exc).__name__}: {exc}"))
    return failures
