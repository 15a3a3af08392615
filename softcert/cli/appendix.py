"""Symbolic derivations (sympy) behind the closed forms a report uses, rendered as LaTeX.

Each ``derive_*`` function returns a :class:`Derivation`: the sympy objects of the argument
and the identities (``checks``: expressions that must simplify to 0, or sympy booleans
that must be True) on which it rests. tests/test_appendix.py checks exactly these objects,
and :func:`render_latex` / :func:`render_markdown` print the same objects, so the appendix
cannot drift from what was checked. The binary radius and half-plane derivations reuse
``analysis.ghosts_symbolic``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp


@dataclass(frozen=True)
class Derivation:
    key: str
    title: str
    claim: str  # LaTeX statement of the result
    steps: tuple  # (LaTeX text, sympy object or None) pairs, rendered in order
    checks: dict = field(default_factory=dict)  # name -> sympy expr that must be 0 / True

    def verify(self) -> dict[str, bool]:
        out = {}
        for name, expr in self.checks.items():
            if isinstance(expr, (bool, sp.logic.boolalg.BooleanAtom)):
                out[name] = bool(expr)
            elif isinstance(expr, sp.Basic) and expr.is_Relational:
                out[name] = bool(expr)
            else:
                out[name] = sp.simplify(expr) == 0
        return out


def derive_binary_radius() -> Derivation:
    from softcert.analysis.ghosts_symbolic import binary_zero_set

    b = binary_zero_set()
    rho = sp.sqrt(b.radius_sq)
    target = sp.sqrt(b.delta**2 + sp.pi**2) / sp.Abs(b.Delta)
    return Derivation(
        "binary_radius", "Binary Taylor radius",
        r"For $F(t) = e^{z_1 + a_1 t} + e^{z_2 + a_2 t}$, $\delta = z_1 - z_2$, "
        r"$\Delta = a_1 - a_2 \neq 0$: $\rho^* = \sqrt{\delta^2 + \pi^2}/|\Delta|$.",
        (
            (r"Dividing by $e^{z_2 + a_2 t} \neq 0$, $F(t) = 0 \iff e^{\delta + \Delta t} = -1$. "
             r"Modulus and phase give the zeros ($m \in \mathbb{Z}$)", sp.Eq(sp.Symbol("t_m"), b.zero)),
            (r"Residual $1 + e^{\delta + \Delta t_m}$ (simplified)", b.residual),
            (r"$|t_m|^2$ is smallest at $m \in \{0, -1\}$", sp.Eq(sp.Symbol(r"\rho^{*2}"), b.radius_sq)),
        ),
        {"zero_is_root": b.residual, "radius_formula": sp.simplify(rho**2 - target**2)},
    )


def derive_half_plane() -> Derivation:
    from softcert.analysis.ghosts_symbolic import half_plane_lemma

    h = half_plane_lemma()
    Y, D = sp.symbols("Y D", positive=True)
    return Derivation(
        "half_plane", "Half-plane lower bound on the radius",
        r"$\rho^* \ge \pi/\Delta_a$ with $\Delta_a = \max_k a_k - \min_k a_k$.",
        (
            (r"At $t = x + iy$ each term has phase $a_k y$; centred at $\varphi = y(a_{\min}+a_{\max})/2$ "
             r"the deviation is at most", h["deviation_max"]),
            (r"$\cos$ has no non-positive value on $(-\pi/2, \pi/2)$", h["cos_nonpositive_set"]),
            (r"so $\mathrm{Re}(e^{-i\varphi}F) > 0$ while $|y| < Y_{\max}$ with", sp.Eq(sp.Symbol("Y_max"), h["y_max"])),
        ),
        {"empty_bad_set": sp.Eq(h["cos_nonpositive_set"], sp.S.EmptySet),
         "y_max": h["y_max"] - sp.pi / D},
    )


def derive_tv_kl(k: int = 3) -> Derivation:
    """With head probabilities p_1..p_k (sum S = 1 - τ) and P̂ = P/S on the head:
    TV(P, P̂) = τ and KL(P̂‖P) = -log(1 - τ), i.e. τ = 1 - exp(-KL)."""
    p = sp.symbols(f"p1:{k + 1}", positive=True)
    tau = sp.Symbol("tau", positive=True)
    S = 1 - tau  # head mass
    phat = [pi / S for pi in p]
    kl = sum(ph * sp.log(ph / pi) for ph, pi in zip(phat, p))
    # the head probabilities sum to S: substitute p_k = S - (p_1 + ... + p_{k-1})
    sub = {p[-1]: S - sum(p[:-1])}
    kl_s = sp.simplify(sp.expand_log(kl.subs(sub), force=True))
    tv = sp.Rational(1, 2) * (sum(ph - pi for ph, pi in zip(phat, p)) + tau)  # head: P̂ >= P
    tv_s = sp.simplify(tv.subs(sub))
    return Derivation(
        "tv_kl", "Top-k truncation: TV = 1 - exp(-KL)",
        r"$\mathrm{TV}(P, \hat P) = \tau = 1 - \sum_{i\in H} P_i$ and $\tau = 1 - e^{-\mathrm{KL}(\hat P\|P)}$.",
        (
            (rf"Head $H$ of size {k}, $\hat P_i = P_i/(1-\tau)$ on $H$; "
             r"$\mathrm{KL}(\hat P\|P) = \sum_{i\in H}\hat P_i\log(\hat P_i/P_i)$ simplifies to", kl_s),
            (r"$\mathrm{TV} = \tfrac12(\sum_H(\hat P_i - P_i) + \sum_T P_i)$ simplifies to", tv_s),
            (r"hence $1 - e^{-\mathrm{KL}}$ equals", sp.simplify(1 - sp.exp(-kl_s))),
        ),
        {"kl": kl_s + sp.log(1 - tau), "tv": tv_s - tau, "identity": sp.simplify(1 - sp.exp(-kl_s)) - tau},
    )


def derive_jacobian_norm() -> Derivation:
    """‖diag(p) - ppᵀ‖₂ <= 1/2: xᵀJx = Var_p(x) <= (max x - min x)²/4 <= 2‖x‖²/4."""
    p = sp.Symbol("p", nonnegative=True)
    x, c, m, M, a, b = sp.symbols("x c m M a b", real=True)
    J2 = sp.Matrix([[p, 0], [0, 1 - p]]) - sp.Matrix([p, 1 - p]) * sp.Matrix([[p, 1 - p]])
    eig = sorted(J2.eigenvals().keys(), key=lambda e: sp.Poly(e, p).degree())
    top = eig[-1]
    popov = ((M - m) / 2) ** 2 - (x - (M + m) / 2) ** 2  # = (x - m)(M - x) >= 0 on [m, M]
    return Derivation(
        "jacobian_norm", "Softmax Jacobian norm",
        r"$J(p) = \mathrm{diag}(p) - pp^\top$ satisfies $\|J\|_2 \le 1/2$, attained at $p = (1/2, 1/2, 0, \dots)$.",
        (
            (r"$J$ is symmetric PSD and $x^\top J x = \sum_i p_i x_i^2 - (\sum_i p_i x_i)^2 = \mathrm{Var}_p(x)$. "
             r"Popoviciu: with $c = (m+M)/2$, $\mathrm{Var}_p(x) \le E_p[(x-c)^2]$ and on $[m, M]$", sp.factor(popov)),
            (r"so $\mathrm{Var}_p(x) \le (M-m)^2/4 \le 2(x_i^2 + x_j^2)/4 \le \|x\|^2/2$ because",
             sp.Eq(2 * (a**2 + b**2) - (a - b) ** 2, sp.factor(2 * (a**2 + b**2) - (a - b) ** 2))),
            (r"For $n = 2$ the non-zero eigenvalue is", sp.Eq(sp.Symbol(r"\lambda"), sp.factor(top))),
            (r"and $\tfrac12 - \lambda$ equals", sp.factor(sp.Rational(1, 2) - top)),
        ),
        {"popoviciu": popov - (x - m) * (M - x),
         "two_point": 2 * (a**2 + b**2) - (a - b) ** 2 - (a + b) ** 2,
         "n2_eigen": sp.Rational(1, 2) - top - 2 * (p - sp.Rational(1, 2)) ** 2,
         "n2_attained": top.subs(p, sp.Rational(1, 2)) - sp.Rational(1, 2)},
    )


def derive_vertex_threshold(n: int = 3) -> Derivation:
    """For f(y) = c·y / 1·y: ∂f/∂y_i = (c_i - f)/1·y, so at a maximiser every y_i with c_i > f
    is at its upper end and every y_i with c_i < f at its lower end (threshold property); for
    n = 3 and exact rational instances the max over all 2^n vertices equals max_t V_t."""
    y = sp.symbols(f"y1:{n + 1}", positive=True)
    c = sp.symbols(f"c1:{n + 1}", real=True)
    S = sum(y)
    f = sum(ci * yi for ci, yi in zip(c, y)) / S
    resid = [sp.simplify(sp.diff(f, yi) - (ci - f) / S) for ci, yi in zip(c, y)]
    # exact instances: threshold candidates V_t versus all vertices
    import itertools
    import random

    gen = random.Random(0)
    agree = True
    for _ in range(20):
        cc = [sp.Rational(gen.randint(-9, 9), gen.randint(1, 5)) for _ in range(n)]
        aa = [sp.Rational(gen.randint(1, 9), gen.randint(1, 4)) for _ in range(n)]
        bb = [ai + sp.Rational(gen.randint(1, 9), gen.randint(1, 4)) for ai in aa]
        allv = max(sum(ci * yi for ci, yi in zip(cc, v)) / sum(v)
                   for v in itertools.product(*zip(aa, bb)))
        order = sorted(range(n), key=lambda i: -cc[i])
        cands = []
        for t in range(n + 1):
            yy = [bb[i] if order.index(i) < t else aa[i] for i in range(n)]
            cands.append(sum(ci * yi for ci, yi in zip(cc, yy)) / sum(yy))
        agree = agree and (max(cands) == allv)
    Vt = sp.Symbol("V_t")
    return Derivation(
        "vertex_threshold", "Vertex-Softmax threshold property",
        r"$\max_{l \le s \le u} c^\top \mathrm{softmax}(s) = \max_{0 \le t \le n} V_t$, with $V_t$ putting the "
        r"$t$ largest $c_i$ at $e^{u_i}$ and the rest at $e^{l_i}$.",
        (
            (rf"With $y = e^s$, $f(y) = c^\top y / \mathbf 1^\top y$ ($n = {n}$); "
             r"$\partial f/\partial y_i - (c_i - f)/\mathbf 1^\top y$ simplifies to", sp.Matrix(resid).T),
            (r"so $f$ increases in $y_i$ iff $c_i > f$: at the optimum $\lambda^*$ every $y_i$ with "
             r"$c_i > \lambda^*$ sits at its upper end and every $y_i$ with $c_i < \lambda^*$ at its lower end, "
             r"a threshold vertex. Exact check on 20 rational boxes ($n = 3$): "
             r"$\max_{\text{vertices}} f = \max_t V_t$ holds:", sp.Eq(Vt, Vt) if agree else sp.false),
        ),
        {**{f"dfdy{i + 1}": r for i, r in enumerate(resid)}, "rational_instances": sp.true if agree else sp.false},
    )


DERIVATIONS = (derive_binary_radius, derive_half_plane, derive_tv_kl, derive_jacobian_norm,
               derive_vertex_threshold)


def all_derivations() -> list[Derivation]:
    return [d() for d in DERIVATIONS]


def render_latex(ders) -> str:
    out = [r"\section*{Appendix: symbolic derivations}",
           r"Generated by \texttt{softcert\_cli.appendix} from the sympy objects that "
           r"\texttt{tests/test\_appendix.py} checks.", ""]
    for d in ders:
        ok = d.verify()
        out += [rf"\subsection*{{{d.title}}}", d.claim, ""]
        for text, obj in d.steps:
            out.append(text)
            if obj is not None:
                out += [r"\[", sp.latex(obj), r"\]"]
        out.append(r"Checked identities: " + ", ".join(
            rf"\texttt{{{k.replace('_', chr(92) + '_')}}} ({'holds' if v else 'FAILS'})" for k, v in ok.items()) + ".")
        out.append("")
    return "\n".join(out)


def render_markdown(ders) -> str:
    out = ["## Appendix: symbolic derivations", "",
           "Generated by `softcert.cli.appendix` from the sympy objects that tests/test_appendix.py checks.", ""]
    for d in ders:
        ok = d.verify()
        out += [f"### {d.title}", "", d.claim, ""]
        for text, obj in d.steps:
            out.append(text)
            if obj is not None:
                out += ["", f"$$ {sp.latex(obj)} $$", ""]
        out += ["Checked identities: " + ", ".join(f"`{k}` ({'holds' if v else 'FAILS'})" for k, v in ok.items()), ""]
    return "\n".join(out)
