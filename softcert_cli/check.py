"""``softcert check results.json``: re-check every certificate of a report from its JSON record.

Each record under ``certificates`` is re-checked without trusting the code that produced it:

- ``vertex``: min/max of c·softmax(s) over the recorded score box, by the exact rational
  check ``bounds.check_certificate`` (Σ(c_i - V) y_i <= 0 over an outward-enclosed exp box);
- ``radius``: F(t) = Σ_k exp(z_k + a_k t) has no zero in the open disc |t| < ρ (the claimed
  lower bound), by an argument-principle count whose arcs are certified (see
  :func:`zero_count`); the claimed exact radius must be the modulus of a zero of F;
- ``topk``: the tail mass of the recorded row, recomputed in float64 (correctly rounded
  ``math.fsum`` sums, per-weight relative error bounds) and rounded outward, must lie below
  the claimed τ⁺ <= ε, and above the claimed lower bound of τ_{k-1};
- ``fp``: the stated closed-form FP softmax error bound (analysis.fp.error_bound's
  derivation) is re-evaluated at 40 digits with mpmath and must match the recorded numbers;
- ``feedback``: the claimed upper bound s of ‖ΠWΠ‖₂ (and of ‖W‖₂) is proved by an exact
  rational LDLᵀ factorisation of s²I - AᵀA, and β* <= 2/s, β_classical <= 1/‖W‖ exactly.

Every record (and every summary section) also carries a SHA-256 digest of its canonical JSON,
so a number changed without recomputing the digest is named too. Exit code 0 iff every record
passes; otherwise each failing record is printed with the reason and the exit code is 1.
"""
from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np

U64 = 2.0 ** -53


# ----------------------------------------------------------------------------- digests
def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def digest(record: dict) -> str:
    """SHA-256 of the record's canonical JSON without its own ``sha256`` field."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def seal(record: dict) -> dict:
    record = dict(record)
    record["sha256"] = digest(record)
    return record


# ----------------------------------------------------------------------------- vertex
def check_vertex(rec) -> str | None:
    from bounds import check_certificate

    c, lo, hi = rec["c"], rec["lower"], rec["upper"]
    if not (len(c) == len(lo) == len(hi)):
        return "c, lower, upper differ in length"
    if rec["min"] > rec["max"]:
        return f"min {rec['min']} > max {rec['max']}"
    up = check_certificate(c, lo, hi, rec["max"], "upper")
    if not up.holds:
        return f"upper bound {rec['max']!r} refuted: a vertex reaches it + {up.slack:.3g}"
    low = check_certificate(c, lo, hi, rec["min"], "lower")
    if not low.holds:
        return f"lower bound {rec['min']!r} refuted: a vertex falls {low.slack:.3g} below it"
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
    z, a, lb = rec["z"], rec["a"], rec["lower_bound"]
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
        ex, zr = rec["exact"], complex(*rec["zero"])
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
    k, eps = int(rec["k"]), float(rec["eps"])
    lo, hi = tail_mass_bounds(rec["scores"], k)
    if not (rec["tail_upper"] <= eps):
        return f"claimed tail bound {rec['tail_upper']!r} exceeds eps {eps}"
    if rec["tail_upper"] < hi:
        if rec["tail_upper"] < lo:
            return (f"tail mass of the top-{k} truncation is >= {lo!r}, above the claimed bound "
                    f"{rec['tail_upper']!r}")
        return f"claimed tail bound {rec['tail_upper']!r} not proved (recomputed τ⁺ = {hi!r})"
    if rec.get("tail_lower_prev") is not None and k >= 1:
        lo_p, hi_p = tail_mass_bounds(rec["scores"], k - 1)
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
    rel, floor = fp_formula(int(rec["n"]), rec["algorithm"], rec["dtype"], int(rec.get("block") or 128),
                            float(rec["exp_ulps"]), rec.get("score_range"))
    for name, claimed, val in (("rel", rec["rel"], rel), ("abs_floor", rec["abs_floor"], floor)):
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
    W = [[Fraction(float(v)) for v in row] for row in rec["W"]]
    n = len(W)
    if any(len(r) != n for r in W):
        return "W is not square"
    r = [sum(row, Fraction(0)) / n for row in W]
    c = [sum((W[i][j] for i in range(n)), Fraction(0)) / n for j in range(n)]
    g = sum(r, Fraction(0)) / n
    P = [[W[i][j] - r[i] - c[j] + g for j in range(n)] for i in range(n)]
    s, sw = rec["proj_norm_upper"], rec["norm_upper"]
    if not norm_upper_holds(P, s):
        return f"‖ΠWΠ‖₂ <= {s!r} refuted (s²I - AᵀA is not positive semidefinite)"
    if not norm_upper_holds(W, sw):
        return f"‖W‖₂ <= {sw!r} refuted"
    if s > 0 and Fraction(rec["beta_star"]) > 2 / Fraction(s):
        return f"β* = {rec['beta_star']!r} exceeds 2/{s!r}"
    if sw > 0 and Fraction(rec["beta_classical"]) > 1 / Fraction(sw):
        return f"classical threshold {rec['beta_classical']!r} exceeds 1/{sw!r}"
    if rec.get("beta") is not None and rec.get("contraction") is not None:
        if Fraction(rec["contraction"]) < Fraction(rec["beta"]) * Fraction(s) / 2:
            return f"contraction {rec['contraction']!r} below β‖ΠWΠ‖/2"
    return None


CHECKERS = {"vertex": check_vertex, "radius": check_radius, "topk": check_topk, "fp": check_fp,
            "feedback": check_feedback}


def check_results(results: dict, progress: bool = False) -> list[tuple[str, str]]:
    """[(record id, reason)] for every failing record (empty: everything checks)."""
    failures = []
    certs = results.get("certificates")
    if not isinstance(certs, list) or not certs:
        return [("certificates", "no certificate records in the file")]
    seen = set()
    it = certs
    if progress:
        from tqdm import tqdm

        it = tqdm(certs, desc="check", unit="record")
    for rec in it:
        rid = rec.get("id", "<no id>")
        if rid in seen:
            failures.append((rid, "duplicate record id"))
        seen.add(rid)
        if rec.get("sha256") != digest(rec):
            failures.append((rid, "digest mismatch: the record was changed after the report"))
        kind = rec.get("kind")
        if kind not in CHECKERS:
            failures.append((rid, f"unknown kind {kind!r}"))
            continue
        try:
            reason = CHECKERS[kind](rec)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
            reason = f"malformed record: {type(exc).__name__}: {exc}"
        if reason:
            failures.append((rid, reason))
    for name, sec in results.get("digests", {}).items():
        if name not in results:
            failures.append((f"section {name}", "missing"))
        elif hashlib.sha256(canonical(results[name]).encode()).hexdigest() != sec:
            failures.append((f"section {name}", "digest mismatch: a reported number was changed"))
    return failures


def configure(parser) -> None:
    parser.add_argument("results", help="results.json written by `softcert report`")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    path = Path(args.results)
    if not path.exists():
        raise ValueError(f"results: no such file {path}")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"results: not valid JSON ({exc})") from None
    failures = check_results(results, progress=not args.quiet)
    n = len(results.get("certificates") or [])
    kinds = {}
    for rec in results.get("certificates") or []:
        kinds[rec.get("kind")] = kinds.get(rec.get("kind"), 0) + 1
    if failures:
        for rid, why in failures:
            print(f"FAIL {rid}: {why}")
        print(f"{len(failures)} failure(s) among {n} records")
        return 1
    print(f"OK: {n} certificate records re-checked ({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))}); "
          f"{len(results.get('digests', {}))} sections match their digests")
    return 0
