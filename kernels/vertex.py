"""Numba kernel for batched Vertex-Softmax: Dinkelbach passes (no sort), two certificates per row.

Array in, array out (numpy float64); ``bounds.vertex_softmax(backend="numba")`` calls it.
The threshold theorem proposes the optimum, and the returned bound λ is proved by
g(λ) = Σ_i max((c_i-λ)a_i, (c_i-λ)b_i) <= 0 evaluated with the rigorous rounding-error
bound of ``kernels.floating`` (``term_rel``, ``dot_error``, ``first_step``: the same
formulas the torch reference uses, compiled here). The minimum is the
maximum for -c, whose descending order is the reverse of c's, so one sort serves both.
Rows run in parallel; no fastmath (it would void the error model).

Sort-free route (``method="dinkelbach"``, the default; docs/mathematics.md §1): λ ← value of the vertex
that puts {i : c_i > λ} at the upper bound, started from the all-upper vertex. Each step is
one O(n) pass; in exact arithmetic the values increase strictly until a fixed point, and a
fixed point is the optimum (g(λ) = 0 there). The iteration only proposes λ: the same
certificate g(λ + h) <= -err as the sweep proves the bound, with the same a priori step h,
so the bound is as tight as the sweep's. If the iteration stalls in floating point (one
weight dominates, the step g/D is below rounding) or exceeds ``MAX_PASSES``, and the
certificate fails at that step, the row falls back to the sort and sweep below
(``method="sweep"`` always takes it).

Fast path: weights a = e^{l-M}, b = e^{u-M}, M the row's largest upper score, computed once
and reused by both sweeps and every certificate round. Rows where a weight would leave the
normal float range (scores spread over more than ~690) take the robust path: online
(max, sum) scans and per-vertex shifts, which never underflow. Products that still
underflow are charged by ``dot_error``'s absolute terms.
"""
from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads, njit, prange

from softcert.kernels import floating
from softcert.kernels.floating import EXP_ZERO_ARG, SUBNORMAL_ULP, TINY, U64
from softcert.kernels.threads import caller_threads

#: weights below this take the robust path (a design threshold, not a rounding constant)
FAST_PATH_MIN_WEIGHT = 2.0 ** -1000
#: Dinkelbach passes before a row falls back to the sweep (a prototype needed <= 11 for
#: n <= 512, median 1-3; docs/mathematics.md §1)
MAX_PASSES = 40
METHODS = ("dinkelbach", "sweep")
NEG_INF = -np.inf

# the shared error formulas, compiled (numba freezes the constants they read)
_term_rel = njit(cache=True)(floating.term_rel)
_dot_error = njit(cache=True)(floating.dot_error)
_first_step = njit(cache=True)(floating.first_step)
_a_priori_step = njit(cache=True)(floating.a_priori_step)


@njit(cache=True)
def _gap(sign, c, lo, hi, a, b, xa, xb, lam, shifted):
    """(G, err, D) of the certificate for max of (sign·c)·softmax at λ.

    With ``shifted`` the weights are recomputed relative to the vertex's largest score
    (robust path); otherwise the precomputed a, b (and their |log| xa, xb) are used.
    """
    n = c.shape[0]
    m = 0.0
    if shifted:
        m = NEG_INF
        for i in range(n):
            if hi[i] != NEG_INF:
                s = hi[i] if sign * c[i] - lam > 0 else lo[i]
                m = max(m, s)
        if m == NEG_INF:
            m = 0.0
    g = 0.0
    abs_sum = 0.0
    rel_sum = 0.0
    rel_max = 0.0
    d_sum = 0.0
    w_sum = 0.0
    n_terms = 0
    for i in range(n):
        if hi[i] == NEG_INF:
            continue
        d = sign * c[i] - lam
        d_sum += abs(d)
        n_terms += 1
        if shifted:
            s = hi[i] if d > 0 else lo[i]
            if s == NEG_INF:
                continue
            x = abs(s - m)
            w = math.exp(s - m)
        elif d > 0:
            w, x = b[i], xb[i]
        else:
            w, x = a[i], xa[i]
        t = d * w
        rel = _term_rel(min(x, EXP_ZERO_ARG))  # beyond it w = 0 (also when s - m overflowed)
        g += t
        abs_sum += abs(t)
        rel_sum += abs(t) * rel
        rel_max = max(rel_max, rel)
        w_sum += w
    return g, _dot_error(rel_sum, abs_sum, rel_max, d_sum, n_terms, n), w_sum


@njit(cache=True)
def _gap_row(sign, c, a, b, lam, rel_max, cmax, cmin):
    """(G, err) of the certificate at λ on the fast path, charged with row-wide bounds.

    Every term is charged the row's largest relative error ``rel_max`` (>= term_rel of its
    |x|: term_rel increases with |x|), Σ|d_i| is bounded by 2n(|cmax - λ| + |cmin - λ|) and
    the term count by n: each only enlarges ``dot_error``. A masked entry has a = b = 0, so
    its term is an exact 0. Two accumulations per entry instead of six: the proof of a row
    costs about a third of ``_gap`` at n = 16 (docs/benchmark.md).
    """
    n = c.shape[0]
    g = 0.0
    abs_sum = 0.0
    for i in range(n):
        d = sign * c[i] - lam
        t = d * (b[i] if d > 0 else a[i])
        g += t
        abs_sum += abs(t)
    d_bound = 2.0 * n * (abs(cmax - lam) + abs(cmin - lam))
    return g, _dot_error(rel_max * abs_sum, abs_sum, rel_max, d_bound, n, n)


@njit(cache=True)
def _certify(sign, c, lo, hi, a, b, xa, xb, value, shifted, cmax, scale):
    """Smallest proved λ >= value (see bounds.vertex.certify_upper)."""
    g, err, dsum = _gap(sign, c, lo, hi, a, b, xa, xb, value, shifted)
    step = _first_step(max(g, 0.0), err, max(dsum, TINY), value, scale)
    return _prove_above(sign, c, lo, hi, a, b, xa, xb, value, step, shifted, cmax)


@njit(cache=True)
def _prove_above(sign, c, lo, hi, a, b, xa, xb, value, step, shifted, cmax):
    """First λ = value + step·4^k whose certificate holds; max c if none within 64 tries."""
    for _ in range(64):
        trial = max(value + step, np.nextafter(value, np.inf))
        g, err, _ = _gap(sign, c, lo, hi, a, b, xa, xb, trial, shifted)
        if g <= -err:
            return min(trial, cmax)
        step *= 4
    return cmax


@njit(cache=True)
def _certify_fast(sign, c, lo, hi, a, b, xa, xb, value, cmax, cmin, scale, xmax):
    """As ``_certify``, with the first step taken from an a priori error estimate
    (``floating.a_priori_step``); the trial is still checked by ``_gap``."""
    nu = (c.shape[0] + 1) * U64
    step = _a_priori_step(_term_rel(xmax), nu / (1.0 - nu), cmax, cmin, value, scale)
    return _prove_above(sign, c, lo, hi, a, b, xa, xb, value, step, False, cmax)


@njit(cache=True)
def _online_add(m, s, nsum, x, cx):
    if x == NEG_INF:
        return m, s, nsum
    if x > m:
        r = math.exp(m - x) if m != NEG_INF else 0.0
        return x, s * r + 1.0, nsum * r + cx
    w = math.exp(x - m)
    return m, s + w, nsum + cx * w


@njit(cache=True)
def _sweep_robust(sign, c, lo, hi, order, sm, ss, sn):
    """Best candidate t (over sign·c descending) by online (max, sum) scans."""
    n = c.shape[0]
    m, s, nsum = NEG_INF, 0.0, 0.0
    sm[n], ss[n], sn[n] = m, s, nsum
    for t in range(n - 1, -1, -1):
        i = order[t] if sign > 0 else order[n - 1 - t]
        m, s, nsum = _online_add(m, s, nsum, lo[i], sign * c[i])
        sm[t], ss[t], sn[t] = m, s, nsum
    best, best_t = NEG_INF, 0
    m, s, nsum = NEG_INF, 0.0, 0.0
    for t in range(n + 1):
        top = max(m, sm[t])
        if top != NEG_INF:
            fp = math.exp(m - top) if m != NEG_INF else 0.0
            fs = math.exp(sm[t] - top) if sm[t] != NEG_INF else 0.0
            den = s * fp + ss[t] * fs
            if den > 0:
                v = (nsum * fp + sn[t] * fs) / den
                if v > best:
                    best, best_t = v, t
        if t < n:
            i = order[t] if sign > 0 else order[n - 1 - t]
            m, s, nsum = _online_add(m, s, nsum, hi[i], sign * c[i])
    return best_t


@njit(cache=True)
def _sweep_fast(sign, c, a, b, order, sa, sca):
    """Best candidate t over sign·c descending, with the precomputed weights."""
    n = c.shape[0]
    sa[n] = 0.0
    sca[n] = 0.0
    for t in range(n - 1, -1, -1):
        i = order[t] if sign > 0 else order[n - 1 - t]
        sa[t] = sa[t + 1] + a[i]
        sca[t] = sca[t + 1] + sign * c[i] * a[i]
    best, best_t = NEG_INF, 0
    pb, pcb = 0.0, 0.0
    for t in range(n + 1):
        den = pb + sa[t]
        if den > 0:
            v = (pcb + sca[t]) / den
            if v > best:
                best, best_t = v, t
        if t < n:
            i = order[t] if sign > 0 else order[n - 1 - t]
            pb += b[i]
            pcb += sign * c[i] * b[i]
    return best_t, best


@njit(cache=True)
def _solve(sign, c, lo, hi, a, b, xa, xb, order, robust, cmax, cmin, scale, xmax, mask_out,
           w1, w2, w3):
    """Certified max of (sign·c)·softmax(s) for one row; the vertex goes to mask_out."""
    n = c.shape[0]
    if robust:
        best_t = _sweep_robust(sign, c, lo, hi, order, w1, w2, w3)
    else:
        best_t, best = _sweep_fast(sign, c, a, b, order, w1, w2)
    for t in range(n):
        i = order[t] if sign > 0 else order[n - 1 - t]
        mask_out[i] = t < best_t
    if not robust and best > NEG_INF:
        # the sweep's value at the chosen vertex; the certificate below does not trust it
        return _certify_fast(sign, c, lo, hi, a, b, xa, xb, best, cmax, cmin, scale, xmax)
    # value at the chosen vertex, shifted by its largest score
    vm = NEG_INF
    for i in range(n):
        if hi[i] != NEG_INF:
            vm = max(vm, hi[i] if mask_out[i] else lo[i])
    if vm == NEG_INF:
        return cmax
    num, den = 0.0, 0.0
    for i in range(n):
        if hi[i] != NEG_INF:
            s = hi[i] if mask_out[i] else lo[i]
            if s != NEG_INF:
                w = math.exp(s - vm)
                num += sign * c[i] * w
                den += w
    return _certify(sign, c, lo, hi, a, b, xa, xb, num / den, robust, cmax, scale)


@njit(cache=True, inline="always")
def _vertex_pass(sign, c, a, b, lam):
    """(Σ c_i w_i, Σ w_i, min {c_i : c_i > λ}) at the vertex that puts {c_i > λ} (c = sign·c)
    at the upper weights b and the rest at a."""
    num, den = 0.0, 0.0
    cmin_up = np.inf
    for i in range(c.shape[0]):
        ci = sign * c[i]
        if ci > lam:
            w = b[i]
            cmin_up = min(cmin_up, ci)
        else:
            w = a[i]
        num += ci * w
        den += w
    return num, den, cmin_up


@njit(cache=True, inline="always")
def _dinkelbach(sign, c, a, b, num, den, cmin_all, mask_out):
    """Dinkelbach iteration for max of (sign·c)·softmax on the fast path (weights a, b).

    Starts from the all-upper vertex, whose sums Σ c_i b_i and Σ b_i are ``num``, ``den``
    (c = sign·c; ``cmin_all`` its smallest unmasked c). Returns (λ, passes, N, D, m): λ = N/D
    the value of the last vertex, its sums N, D as computed, and m <= the smallest c_i of its
    upper set {sign·c_i > θ}, which goes to mask_out. A pass from θ = λ gives λ' on the set
    S = {c_i > λ}; if no c_i of S lies at or below λ', the next set would be S again, so λ'
    is the fixed point and the confirming pass is skipped. Stops also when a pass does not
    increase λ (a stall in floating point) or after MAX_PASSES; the caller's certificate
    decides either way.
    """
    n = c.shape[0]
    lam = num / den
    cmin_up = cmin_all
    theta = NEG_INF
    passes = 1
    while passes < MAX_PASSES:
        p_num, p_den, p_cmin = _vertex_pass(sign, c, a, b, lam)
        passes += 1
        if not p_den > 0:
            break
        new = p_num / p_den
        if not new > lam:
            break
        theta, lam, num, den, cmin_up = lam, new, p_num, p_den, p_cmin
        if cmin_up > new:
            break
    for i in range(n):
        mask_out[i] = sign * c[i] > theta
    return lam, passes, num, den, cmin_up


@njit(cache=True, inline="always")
def _gap_from_sums(num, den, lam, cabs, k, n):
    """(G, err) of the certificate at λ from the sums N = Σ c_i w_i, D = Σ w_i of the vertex
    whose upper set is {c_i > λ}: there g(λ) = N - λD exactly (each entry's max picks that
    vertex). Error, with k = γ_{n+1} + ρ (ρ >= each weight's relative error) and M = ``cabs``
    >= max|c_i|: N and D as summed by the pass are off by at most k·M·D and k·D to first
    order (each product and the sums in any order, the weights off by ρ), the product λD and
    the difference by u each; (1 + 4k) covers the second order, 2(n + 2) spacings the
    products that underflow (weights are normal on the fast path). tests/test_kernels_vertex.py
    checks it against mpmath.
    """
    g = num - lam * den
    err = k * (cabs + abs(lam)) * den * (1.0 + 4.0 * k) + 1.01 * U64 * abs(g)
    return g, 1.01 * err + 2.0 * (n + 2) * SUBNORMAL_ULP


@njit(cache=True, inline="always")
def _prove_once(sign, c, a, b, value, bounds, scale, errors, sums, tries):
    """(λ, proved): the first of ``tries`` widenings of ``value`` (a priori step as in
    ``_certify_fast``, then x4) whose certificate holds on the fast path. ``bounds`` =
    (max, min) of the unmasked sign·c, ``errors`` = (ρ, γ_{n+1}), ρ = term_rel of the row's
    largest |x|; ``sums`` = (N, D, m) of the vertex that proposed ``value``
    (``_dinkelbach``): while every c_i of its upper set exceeds the trial (m > trial) that
    vertex is the certificate's, and N - trial·D proves it without a pass over the row
    (about a third of the kernel's time at n = 16); else ``_gap_row`` does."""
    cmax, cmin = bounds
    if value >= cmax:  # max c bounds any convex combination; the iteration reached it
        return cmax, True
    rel_max, gam = errors
    step = _a_priori_step(rel_max, gam, cmax, cmin, value, scale)
    num, den, m = sums
    cabs = max(abs(cmax), abs(cmin))
    for _ in range(tries):
        trial = max(value + step, np.nextafter(value, np.inf))
        if m > trial:
            g, err = _gap_from_sums(num, den, trial, cabs, gam + rel_max, c.shape[0])
            if g <= -err:
                return min(trial, cmax), True
        g, err = _gap_row(sign, c, a, b, trial, rel_max, cmax, cmin)
        if g <= -err:
            return min(trial, cmax), True
        step *= 4
    return cmax, False


@njit(cache=True)
def _unscale(bound, shift, toward):
    """bound · 2^-shift, moved one ulp ``toward`` ±inf when it lands below the normal range
    and round-to-nearest went inward (scaling back up is exact, so comparing detects it)."""
    out = math.ldexp(bound, -shift)
    back = math.ldexp(out, shift)
    if (back < bound) if toward > 0 else (back > bound):
        out = np.nextafter(out, toward)
    return out


@njit(cache=True)
def _argsort_desc(c, order):
    """Indices of c in descending order; insertion sort for short rows (no allocation)."""
    n = c.shape[0]
    if n > 32:
        order[:] = np.argsort(-c)
        return
    for i in range(n):
        j = i
        while j > 0 and c[order[j - 1]] < c[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i


@njit(cache=True, parallel=True)
def vertex_rows(c, lo, hi, upper, lower, up_mask, lo_mask, chunks, dinkelbach, passes,
                lo_vertex, up_vertex):
    """Certified (min, max) of c·softmax(s) per row of (R, n) float64 arrays.

    With ``dinkelbach`` the fast-path rows try the sort-free iteration first; ``passes``
    (R, 2) receives its pass count per bound (upper, lower), 0 where the sweep ran.
    ``lo_vertex`` / ``up_vertex`` (R, n), or (0, n) for none, receive the optimal vertices
    (each score at hi where its mask is set, else at lo).
    """
    with_vertices = lo_vertex.shape[0] > 0
    rows, n = c.shape
    nu = (n + 1) * U64
    gam = nu / (1.0 - nu)  # γ_{n+1} of every certificate sum
    for k in prange(chunks):
        order = np.empty(n, dtype=np.int64)
        a = np.empty(n)
        b = np.empty(n)
        xa = np.empty(n)
        xb = np.empty(n)
        w1 = np.empty(n + 1)
        w2 = np.empty(n + 1)
        w3 = np.empty(n + 1)
        cbuf = np.empty(n)
        for r in range(k * rows // chunks, (k + 1) * rows // chunks):
            cr, lr, hr = c[r], lo[r], hi[r]
            top = NEG_INF
            cmax, cmin, scale = NEG_INF, np.inf, 0.0
            for i in range(n):
                if hr[i] != NEG_INF:
                    top = max(top, hr[i])
                    cmax = max(cmax, cr[i])
                    cmin = min(cmin, cr[i])
                    scale = max(scale, abs(cr[i]))
            # scale the row by 2^shift (exact) so that max |c_i| lies in [1, 2): keeps the
            # products out of the subnormal range (bounds/vertex.py, _normalise)
            shift = 0
            if scale > 0.0:
                shift = max(1 - math.frexp(scale)[1], 0)
            if shift > 0:
                for i in range(n):
                    cbuf[i] = math.ldexp(cr[i], shift)
                cr = cbuf
                cmax, cmin = math.ldexp(cmax, shift), math.ldexp(cmin, shift)
                scale = math.ldexp(scale, shift)
            xmax = 0.0
            num, den = 0.0, 0.0  # the all-upper vertex: Dinkelbach's start for both bounds
            wmin = np.inf
            for i in range(n):
                # an infinite exponent gives an exact zero weight: no error term (x = 0)
                hi_i, lo_i = hr[i], lr[i]
                x_b = top - hi_i if hi_i != NEG_INF else 0.0
                x_a = top - lo_i if lo_i != NEG_INF else 0.0
                w_b = math.exp(-x_b) if hi_i != NEG_INF else np.inf
                w_a = math.exp(-x_a) if lo_i != NEG_INF else np.inf
                wmin = min(wmin, min(w_a, w_b))
                b[i] = w_b if hi_i != NEG_INF else 0.0
                a[i] = w_a if lo_i != NEG_INF else 0.0
                xmax = max(xmax, x_a)
                num += cr[i] * b[i]
                den += b[i]
            xmax = min(xmax, EXP_ZERO_ARG)
            robust = wmin < FAST_PATH_MIN_WEIGHT
            done_up = done_lo = False
            passes[r, 0] = passes[r, 1] = 0
            if dinkelbach and not robust:
                lam, npass, sn, sd, sm = _dinkelbach(1.0, cr, a, b, num, den, cmin, up_mask[r])
                errors = (_term_rel(xmax), gam)
                upper[r], done_up = _prove_once(1.0, cr, a, b, lam, (cmax, cmin), scale, errors,
                                                (sn, sd, sm), 2)
                if done_up:
                    passes[r, 0] = npass
                lam, npass, sn, sd, sm = _dinkelbach(-1.0, cr, a, b, -num, den, -cmax, lo_mask[r])
                neg, done_lo = _prove_once(-1.0, cr, a, b, lam, (-cmin, -cmax), scale, errors,
                                           (sn, sd, sm), 2)
                lower[r] = -neg
                if done_lo:
                    passes[r, 1] = npass
            if not (done_up and done_lo):
                for i in range(n):  # the sweep's |log| of each weight
                    xb[i] = top - hr[i] if hr[i] != NEG_INF else 0.0
                    xa[i] = top - lr[i] if lr[i] != NEG_INF else 0.0
                _argsort_desc(cr, order)
                if not done_up:
                    upper[r] = _solve(1.0, cr, lr, hr, a, b, xa, xb, order, robust, cmax,
                                      cmin, scale, xmax, up_mask[r], w1, w2, w3)
                if not done_lo:
                    lower[r] = -_solve(-1.0, cr, lr, hr, a, b, xa, xb, order, robust, -cmin,
                                       -cmax, scale, xmax, lo_mask[r], w1, w2, w3)
            if shift > 0:
                upper[r] = _unscale(upper[r], shift, np.inf)
                lower[r] = _unscale(lower[r], shift, -np.inf)
            if with_vertices:
                for i in range(n):
                    up_vertex[r, i] = hr[i] if up_mask[r, i] else lr[i]
                    lo_vertex[r, i] = hr[i] if lo_mask[r, i] else lr[i]


def vertex_bounds(c: np.ndarray, lo: np.ndarray, hi: np.ndarray, method: str = "dinkelbach",
                  passes_out: np.ndarray | None = None, vertices_out: tuple | None = None):
    """Certified bounds of c·softmax(s) over lo <= s <= hi, one row per (R, n) row.

    ``method``: "dinkelbach" (sort-free passes, sweep as fallback) or "sweep" (sort and
    threshold sweep). Both prove their bound with the same certificate. ``passes_out``, an
    optional (R, 2) int64 array, receives the Dinkelbach pass counts (0 = the sweep ran);
    ``vertices_out``, an optional pair of (R, n) float64 arrays, the lower and upper optimal
    vertices (saves the caller two passes over the box).

    Inputs: float64 arrays of one shape (R, n), validated by the caller (no NaN, no +inf,
    lo <= hi, no fully masked row; -inf in hi marks a masked entry). Each row of c is scaled
    by an exact power of two inside (max |c_i| in [1, 2)) and the bounds scaled back outward. Returns numpy arrays
    (lower (R,), upper (R,), lower-vertex mask (R, n), upper-vertex mask (R, n)); a mask
    entry is True where the optimal vertex puts that score at its upper bound.
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    cn, ln, hn = (np.ascontiguousarray(x, dtype=np.float64) for x in (c, lo, hi))
    rows = cn.shape[0]
    passes = np.zeros((rows, 2), dtype=np.int64) if passes_out is None else passes_out
    upper, lower = np.empty(rows), np.empty(rows)
    vertices = vertices_out if vertices_out is not None else (np.empty((0, cn.shape[1])),) * 2
    up_mask = np.zeros(cn.shape, dtype=np.bool_)
    lo_mask = np.zeros(cn.shape, dtype=np.bool_)
    with caller_threads():  # numba.get_num_threads() starts the threading layer too
        chunks = max(1, min(rows, 8 * get_num_threads()))
        vertex_rows(cn, ln, hn, upper, lower, up_mask, lo_mask, chunks, method == "dinkelbach",
                    passes, *vertices)
    return lower, upper, lo_mask, up_mask
