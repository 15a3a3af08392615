"""VNN-LIB property files (1.0 of VNN-COMP and 2.0) as regions: an input box and a
disjunction of conjunctions of linear output constraints ``mat · Y <= rhs``.

Semantics (VNN-COMP): the assertions, all conjoined, describe a counterexample; the property
holds ("unsat") when no input in the box yields an output satisfying them. The formula is
put in disjunctive normal form; every term contributes its input bounds (which must bound
every X) and its output rows; terms with the same box are one ``Region``.
- VNN-LIB 1.0: ``(declare-const X_0 Real)``, ``(declare-const Y_0 Real)``, asserts over them.
- VNN-LIB 2.0: ``(vnnlib-version <2.0>)``, ``(declare-network N (declare-input X real [s..])
  (declare-output Y real [s..]))``, indexed ``X[i]`` / ``X[i,j]`` (row-major flattened).
  The file is first parsed by the ``vnnlib`` package (its grammar and type checks); its
  ``vnnlib.compat.transform`` treats each ``assert`` as its own case rather than conjoining
  them, so the normal form is computed here for both versions.
Atoms: ``<=, >=, <, >, =`` between linear expressions (``+``, ``-``, ``*`` by a constant);
strict inequalities are read as non-strict (the closure: sound for "unsat", and a "sat"
counterexample is re-checked against the non-strict rows). Literals are exact rationals;
box bounds are rounded outward to float64 and ``rhs`` upward, so each region contains the
real one. ``.gz`` files are decompressed. Anything else raises ValueError naming the file
and the construct.
"""
from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

MAX_TERMS = 100_000  # DNF size limit (a product of disjunctions can explode)


@dataclass(frozen=True)
class Region:
    """Input box [lower, upper] (flat, float64) and the counterexample condition: some
    disjunct (mat, rhs) with mat · Y <= rhs (an empty mat is always satisfied)."""

    lower: np.ndarray
    upper: np.ndarray
    disjuncts: tuple

    def satisfied(self, y, tol=0.0) -> bool:
        """Does output y (flat) satisfy some disjunct (each row within ``tol``)?"""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        return any(bool(np.all(m @ y <= r + tol)) for m, r in self.disjuncts)


@dataclass(frozen=True)
class Property:
    """A parsed VNN-LIB file: ``regions`` (a disjunction over input boxes), sizes of X and Y,
    the version ("1.0" or "2.0"), the network name (2.0) and the file."""

    regions: tuple
    n_inputs: int
    n_outputs: int
    version: str
    network: str | None
    path: str
    assumptions: str = ("strict inequalities read as non-strict; literals exact, box bounds rounded outward "
                        "and rhs upward to float64; coefficients rounded to nearest")


# ---------------------------------------------------------------- s-expressions
def _tokens(text):
    text = re.sub(r";[^\n]*", " ", text)
    return re.findall(r"\(|\)|[^\s()]+", text)


def _parse(tokens, where):
    stack, out = [], []
    for t in tokens:
        if t == "(":
            stack.append([])
        elif t == ")":
            if not stack:
                raise ValueError(f"{where}: unbalanced ')'")
            e = stack.pop()
            (stack[-1] if stack else out).append(e)
        else:
            (stack[-1] if stack else out).append(t)
    if stack:
        raise ValueError(f"{where}: unbalanced '(' (missing {len(stack)} ')')")
    return out


def _read_text(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"path: no such file {path!r}")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- declarations
class _Vars:
    def __init__(self, where):
        self.where = where
        self.kind = {}  # name -> ("X" | "Y", shape) (2.0) or flat ("X" | "Y", index) (1.0)
        self.nx = self.ny = 0

    def declare_const(self, name, sort):
        m = re.fullmatch(r"([XY])_(\d+)", name)
        if not m or sort.lower() != "real":
            raise ValueError(f"{self.where}: unsupported declaration (declare-const {name} {sort}); "
                             f"expected X_i / Y_j Real")
        k, i = m.group(1), int(m.group(2))
        self.kind[name] = (k, i)
        if k == "X":
            self.nx = max(self.nx, i + 1)
        else:
            self.ny = max(self.ny, i + 1)

    def declare_tensor(self, role, name, shape):
        if role == "X":
            if self.nx:
                raise ValueError(f"{self.where}: more than one declare-input (only one input tensor)")
            self.nx = math.prod(shape)
        else:
            if self.ny:
                raise ValueError(f"{self.where}: more than one declare-output (only one output tensor)")
            self.ny = math.prod(shape)
        self.kind[name] = (role, tuple(shape))

    def ref(self, atom):
        """('X'|'Y', flat index) of a variable reference, or None when not a variable."""
        if atom in self.kind and isinstance(self.kind[atom][1], int):
            return self.kind[atom]
        m = re.fullmatch(r"([^\[\]]+)\[([\d,\s]+)\]", atom)
        if m and m.group(1) in self.kind and isinstance(self.kind[m.group(1)][1], tuple):
            role, shape = self.kind[m.group(1)]
            idx = [int(i) for i in m.group(2).split(",")]
            if len(idx) != len(shape) or any(not 0 <= i < s for i, s in zip(idx, shape)):
                raise ValueError(f"{self.where}: index {atom} out of range for shape {list(shape)}")
            return role, int(np.ravel_multi_index(idx, shape)) if shape else 0
        return None


def _shape_of(atoms, where):
    text = "".join(atoms)
    m = re.fullmatch(r"\[([\d,]*)\]", text)
    if not m:
        raise ValueError(f"{where}: unsupported shape {text!r}")
    return tuple(int(s) for s in m.group(1).split(",") if s)


def _declare_network(e, vars_, where):
    if len(e) < 2 or not isinstance(e[1], str):
        raise ValueError(f"{where}: declare-network without a name")
    for d in e[2:]:
        if not isinstance(d, list) or not d or d[0] not in ("declare-input", "declare-output"):
            head = d[0] if isinstance(d, list) and d else d
            raise ValueError(f"{where}: unsupported construct {head!r} in declare-network "
                             f"(only declare-input and declare-output)")
        if len(d) < 4 or not all(isinstance(a, str) for a in d[1:]):
            raise ValueError(f"{where}: malformed {d[0]}")
        if not d[2].lower().startswith(("real", "float")):
            raise ValueError(f"{where}: unsupported element type {d[2]!r} of {d[1]}")
        vars_.declare_tensor("X" if d[0] == "declare-input" else "Y", d[1], _shape_of(d[3:], where))
    return e[1]


# ---------------------------------------------------------------- formulas
def _number(atom):
    try:
        return Fraction(atom)
    except (ValueError, ZeroDivisionError):
        return None


def _linear(e, vars_, where):
    """A linear expression as ({(role, index): coef}, constant), exact."""
    if isinstance(e, str):
        n = _number(e)
        if n is not None:
            return {}, n
        r = vars_.ref(e)
        if r is None:
            raise ValueError(f"{where}: undeclared variable {e!r}")
        return {r: Fraction(1)}, Fraction(0)
    if not e or not isinstance(e[0], str):
        raise ValueError(f"{where}: malformed expression {e!r}")
    op, args = e[0], [_linear(a, vars_, where) for a in e[1:]]
    if op == "+" and args:
        return _combine(args, [1] * len(args))
    if op == "-" and len(args) == 1:
        return _combine(args, [-1])
    if op == "-" and args:
        return _combine(args, [1] + [-1] * (len(args) - 1))
    if op == "*" and args:
        consts = [c for t, c in args if not t]
        terms = [(t, c) for t, c in args if t]
        if len(terms) > 1:
            raise ValueError(f"{where}: nonlinear product {_show(e)}")
        k = math.prod(consts, start=Fraction(1))
        if not terms:
            return {}, k
        t, c = terms[0]
        return {v: a * k for v, a in t.items()}, c * k
    raise ValueError(f"{where}: unsupported arithmetic {_show(e)}")


def _combine(args, signs):
    out, c0 = {}, Fraction(0)
    for (t, c), s in zip(args, signs):
        c0 += s * c
        for v, a in t.items():
            out[v] = out.get(v, 0) + s * a
    return {v: a for v, a in out.items() if a}, c0


def _show(e):
    return e if isinstance(e, str) else "(" + " ".join(_show(a) for a in e) + ")"


def _atoms(e, vars_, where):
    """One comparison as a list of (coefs, constant) meaning Σ coefs·v + constant <= 0."""
    op = e[0]
    if len(e) != 3:
        raise ValueError(f"{where}: comparison {op!r} with {len(e) - 1} operands (expected 2)")
    a, b = _linear(e[1], vars_, where), _linear(e[2], vars_, where)
    d = _combine([a, b], [1, -1])  # a - b
    neg = ({v: -c for v, c in d[0].items()}, -d[1])
    if op in ("<=", "<"):
        return [d]
    if op in (">=", ">"):
        return [neg]
    if op == "=":
        return [d, neg]
    raise ValueError(f"{where}: unsupported comparison {op!r}")


def _dnf(e, vars_, where):
    """The formula as a list of terms (lists of atoms)."""
    if not isinstance(e, list) or not e or not isinstance(e[0], str):
        raise ValueError(f"{where}: malformed assertion {_show(e) if isinstance(e, list) else e!r}")
    op = e[0]
    if op == "and":
        terms = [[]]
        for a in e[1:]:
            sub = _dnf(a, vars_, where)
            if len(terms) * len(sub) > MAX_TERMS:
                raise ValueError(f"{where}: the disjunctive normal form exceeds {MAX_TERMS} terms")
            terms = [t + s for t in terms for s in sub]
        return terms
    if op == "or":
        return [t for a in e[1:] for t in _dnf(a, vars_, where)]
    if op in ("<=", ">=", "<", ">", "="):
        return [_atoms(e, vars_, where)]
    raise ValueError(f"{where}: unsupported construct {op!r} in an assertion")


def _down(q: Fraction) -> float:
    f = float(q)
    return f if Fraction(f) <= q else float(np.nextafter(f, -np.inf))


def _up(q: Fraction) -> float:
    f = float(q)
    return f if Fraction(f) >= q else float(np.nextafter(f, np.inf))


def _term(atoms, nx, ny, where):
    """(lower, upper, mat, rhs) of one DNF term, or None when it is infeasible."""
    lo = [None] * nx
    hi = [None] * nx
    rows, rhs = [], []
    for coefs, c in atoms:
        roles = {r for r, _ in coefs}
        if not coefs:
            if c > 0:
                return None  # constant false
            continue
        if roles == {"X"}:
            if len(coefs) > 1:
                raise ValueError(f"{where}: unsupported linear constraint on several inputs "
                                 f"({', '.join(f'X_{i}' for _, i in coefs)}); only bounds on single inputs")
            (_, i), a = next(iter(coefs.items()))
            bound = -c / a
            if a > 0:
                hi[i] = bound if hi[i] is None else min(hi[i], bound)
            else:
                lo[i] = bound if lo[i] is None else max(lo[i], bound)
        elif roles == {"Y"}:
            row = np.zeros(ny)
            for (_, j), a in coefs.items():
                row[j] = float(a)
            rows.append(row)
            rhs.append(_up(-c))
        else:
            raise ValueError(f"{where}: unsupported constraint mixing inputs and outputs")
    unbounded = [i for i in range(nx) if lo[i] is None or hi[i] is None]
    if unbounded:
        raise ValueError(f"{where}: input X_{unbounded[0]} has no {'lower' if lo[unbounded[0]] is None else 'upper'} "
                         f"bound (every input needs a box)")
    if any(a > b for a, b in zip(lo, hi)):
        return None
    lower = np.array([_down(q) for q in lo])
    upper = np.array([_up(q) for q in hi])
    mat = np.array(rows).reshape(len(rows), ny)
    return lower, upper, mat, np.array(rhs, dtype=np.float64)


def parse_vnnlib(text: str, where: str = "<string>") -> Property:
    """Parse VNN-LIB 1.0 or 2.0 text (``where``: the file name for messages)."""
    exprs = _parse(_tokens(text), where)
    vars_ = _Vars(where)
    version, network, asserts = "1.0", None, []
    for e in exprs:
        if not isinstance(e, list) or not e:
            raise ValueError(f"{where}: unexpected top-level {e!r}")
        head = e[0]
        if head == "vnnlib-version":
            version = "".join(e[1:]).strip("<>")
            if version not in ("2.0",):
                raise ValueError(f"{where}: unsupported vnnlib-version {version!r}")
        elif head == "declare-const":
            if len(e) != 3:
                raise ValueError(f"{where}: malformed declare-const {_show(e)}")
            vars_.declare_const(e[1], e[2])
        elif head == "declare-network":
            if network is not None:
                raise ValueError(f"{where}: more than one declare-network (only one network)")
            network = _declare_network(e, vars_, where)
        elif head == "assert":
            if len(e) != 2:
                raise ValueError(f"{where}: malformed assert")
            asserts.append(e[1])
        else:
            raise ValueError(f"{where}: unsupported construct {head!r}")
    if network is not None and version != "2.0":
        version = "2.0"
    if not vars_.nx or not vars_.ny:
        raise ValueError(f"{where}: the file declares no {'inputs' if not vars_.nx else 'outputs'}")
    if not asserts:
        raise ValueError(f"{where}: no assert")
    terms = _dnf(["and", *asserts], vars_, where)
    regions: dict = {}
    for t in terms:
        r = _term(t, vars_.nx, vars_.ny, where)
        if r is None:
            continue
        lower, upper, mat, rhs = r
        key = (lower.tobytes(), upper.tobytes())
        regions.setdefault(key, (lower, upper, []))[2].append((mat, rhs))
    out = tuple(Region(lo, hi, tuple(ds)) for lo, hi, ds in regions.values())
    return Property(out, vars_.nx, vars_.ny, version, network, where)


def read_vnnlib(path) -> Property:
    """Read a VNN-LIB 1.0 or 2.0 file (``.gz`` accepted). A 2.0 file is first parsed by the
    ``vnnlib`` package when it is installed, whose error is reported with the file name."""
    where = os.fspath(path)
    text = _read_text(path)
    if re.search(r"\(\s*vnnlib-version", text):
        try:
            import vnnlib as vnnlib_pkg
        except ImportError:  # an optional check (the test extra installs it): parse_vnnlib is complete
            vnnlib_pkg = None
        if vnnlib_pkg is not None:
            try:
                vnnlib_pkg.parse_query_string(text)
            except vnnlib_pkg.VNNLibException as exc:
                raise ValueError(f"{where}: the vnnlib parser rejects the file ({exc})") from exc
    return parse_vnnlib(text, where)
