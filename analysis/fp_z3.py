"""z3 (floating-point theory) lemmas for one combine step of the online-softmax monoid (m, S).

Step: m = max(m_A, m_B); t_A = fl(m_A - m), t_B = fl(m_B - m); e_A, e_B = exp(t) (z3 has no
exp: they are free Float32 variables in [0, 1], with e = 1 when t = 0, i.e. exp(0) = 1);
S = fl(fl(S_A e_A) + fl(S_B e_B)), all in IEEE binary32 with round-to-nearest-even.

Lemmas (each returns a :class:`Lemma` with z3's verdict on the negated claim):

* :func:`combine_is_finite` -- for finite |m_A|, |m_B| <= 2^126 and S_A, S_B in [1, 2^24]:
  t_A, t_B <= 0 are finite, one of them is 0, and S is finite, not NaN, in [1, 2^25].
* :func:`rounding_width` -- for one Float32 add (operands in [0, 2^24]) or multiply (S in
  [1, 2^24], e in [2^-100, 1], so the product is normal): the RNE result is one of the two
  directed roundings RTN/RTP, which lie at most 2u|c| apart. Since the exact value lies between
  them and RNE takes the nearer, |c - exact| <= u|c|: the standard model, machine-checked on
  every Float32 input in range.
* :func:`step_error` -- linear real arithmetic: those per-operation facts compose to
  |S_hat - (S_A e_A + S_B e_B)| <= γ_2 (S_A e_A + S_B e_B), γ_2 = 2u / (1 - 2u): the model
  constant of one rescale-and-add step (exp errors u_e multiply the exact terms on top).

Scope: whole-softmax statements (the full sum of n exps) only scale to n = 2..3
(docs/mathematics.md section 5: n = 2 in seconds, n = 3 in minutes, n = 4 times out; not
re-measured here). The cost is z3's bit-blasted Float32 multipliers: even these single-step
lemmas take 2-15 s each, and formulations that compare against the exact value in a wider format
(Float64 or reals via fpToReal) did not finish within 60-120 s. Hence per-step lemmas only,
composed by hand in analysis.fp.error_bound. Subnormal products (e < 2^-100 here) are covered
there by the absolute term eta, not by these lemmas.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import z3

U32 = 2.0 ** -24


@dataclass(frozen=True)
class Lemma:
    name: str
    statement: str
    result: str  # "proved" (negation unsat), "counterexample", or "unknown" (timeout)
    seconds: float
    counterexample: str | None = None


def _prove(name: str, statement: str, solver: z3.Solver, timeout_ms: int) -> Lemma:
    solver.set("timeout", timeout_ms)
    t0 = time.perf_counter()
    r = solver.check()
    dt = time.perf_counter() - t0
    if r == z3.unsat:
        return Lemma(name, statement, "proved", dt)
    if r == z3.sat:
        return Lemma(name, statement, "counterexample", dt, str(solver.model()))
    return Lemma(name, statement, "unknown", dt)


def combine_is_finite(timeout_ms: int = 60_000) -> Lemma:
    F, rm = z3.Float32(), z3.RNE()
    mA, mB, SA, SB, eA, eB = (z3.FP(n, F) for n in ("mA", "mB", "SA", "SB", "eA", "eB"))
    v = lambda x: z3.FPVal(x, F)  # noqa: E731
    s = z3.Solver()
    for m in (mA, mB):
        s.add(z3.fpLEQ(z3.fpAbs(m), v(2.0 ** 126)))
    for S in (SA, SB):
        s.add(z3.fpGEQ(S, v(1.0)), z3.fpLEQ(S, v(2.0 ** 24)))
    m = z3.fpMax(mA, mB)
    tA, tB = z3.fpSub(rm, mA, m), z3.fpSub(rm, mB, m)
    for t, e in ((tA, eA), (tB, eB)):
        s.add(z3.fpGEQ(e, v(0.0)), z3.fpLEQ(e, v(1.0)))
        s.add(z3.Implies(z3.fpIsZero(t), z3.fpEQ(e, v(1.0))))
    S = z3.fpAdd(rm, z3.fpMul(rm, SA, eA), z3.fpMul(rm, SB, eB))
    ok = z3.And(z3.fpLEQ(tA, v(0.0)), z3.fpLEQ(tB, v(0.0)),
                z3.Or(z3.fpIsZero(tA), z3.fpIsZero(tB)),
                z3.Not(z3.fpIsNaN(S)), z3.Not(z3.fpIsInf(S)),
                z3.fpGEQ(S, v(1.0)), z3.fpLEQ(S, v(2.0 ** 25)))
    s.add(z3.Not(ok))
    return _prove("combine_is_finite",
                  "|m_A|,|m_B| <= 2^126, S_A,S_B in [1,2^24], e in [0,1], exp(0)=1 => "
                  "t <= 0 finite, one t = 0, S finite in [1, 2^25]", s, timeout_ms)


def rounding_width(op: str, timeout_ms: int = 60_000) -> Lemma:
    if op not in ("add", "mul"):
        raise ValueError(f"op must be 'add' or 'mul', got {op!r}")
    F = z3.Float32()
    v = lambda x: z3.FPVal(x, F)  # noqa: E731
    a, b = z3.FP("a", F), z3.FP("b", F)
    s = z3.Solver()
    if op == "add":
        s.add(z3.fpGEQ(a, v(0.0)), z3.fpLEQ(a, v(2.0 ** 24)),
              z3.fpGEQ(b, v(0.0)), z3.fpLEQ(b, v(2.0 ** 24)))
        f, rng = z3.fpAdd, "a, b in [0, 2^24]"
    else:
        s.add(z3.fpGEQ(a, v(1.0)), z3.fpLEQ(a, v(2.0 ** 24)),
              z3.fpGEQ(b, v(2.0 ** -100)), z3.fpLEQ(b, v(1.0)))
        f, rng = z3.fpMul, "S in [1, 2^24], e in [2^-100, 1]"
    lo, hi, c = f(z3.RTN(), a, b), f(z3.RTP(), a, b), f(z3.RNE(), a, b)
    width_ok = z3.fpLEQ(z3.fpSub(z3.RNE(), hi, lo), z3.fpMul(z3.RNE(), v(2 * U32), c))
    s.add(z3.Not(z3.And(z3.Or(z3.fpEQ(c, lo), z3.fpEQ(c, hi)), width_ok)))
    return _prove(f"rounding_width_{op}",
                  f"Float32 {op}, {rng}: RNE in {{RTN, RTP}} and RTP - RTN <= 2u|RNE| "
                  "(hence |fl - exact| <= u|fl|)", s, timeout_ms)


def step_error(timeout_ms: int = 10_000) -> Lemma:
    u = z3.RealVal(2) ** -24
    PA, PB, XA, XB, Sh = z3.Reals("PA PB XA XB Sh")
    s = z3.Solver()
    s.add(PA >= 0, PB >= 0, XA >= 0, XB >= 0)
    for P, X in ((PA, XA), (PB, XB)):  # rounded products, per rounding_width('mul')
        s.add(P - X <= u * P, X - P <= u * P)
    s.add(Sh - (PA + PB) <= u * Sh, (PA + PB) - Sh <= u * Sh)  # rounding_width('add')
    X = XA + XB
    g2 = 2 * u / (1 - 2 * u)
    s.add(z3.Not(z3.And(Sh - X <= g2 * X, X - Sh <= g2 * X)))
    return _prove("step_error", "per-op |fl - exact| <= u|fl| => |S_hat - S| <= γ_2 S, "
                  "γ_2 = 2u/(1-2u)", s, timeout_ms)


def all_lemmas() -> list[Lemma]:
    return [combine_is_finite(), rounding_width("add"), rounding_width("mul"), step_error()]
