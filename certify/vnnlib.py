"""VNN-LIB property files (1.0 of VNN-COMP and 2.0) as regions: an input box and a
disjunction of conjunctions of linear output constraints ``mat · Y <= rhs``.

Semantics (VNN-COMP): the assertions, all conjoined, describe a counterexample; the property
holds ("unsat") when no input in the box yields an output satisfying them. The formula is
put in disjunctive normal form; every term contributes its input bounds (which must bound
every X) and its output rows; terms with the same box are one ``Region``.
- VNN-LIB 1.0: ``(declare-const X_0 Real)``, ``(declare-const Y_0 Real)``, asserts over them.
- VNN-LIB 2.0: ``(vnnlib-version <2.0>)``, ``(declare-network N (declare-input X real [s..])
  ... (declare-hidden H real [s..] "onnx-value") ... (declare-output Y real [s..]) ...)``,
  indexed ``X[i]`` / ``X[i,j]`` (row-major flattened). Several inputs and outputs: X is the
  concatenation of the flattened inputs in declaration order, Y that of the flattened outputs,
  then of the hidden tensors (``Property.tensors`` gives each one's slice); they are matched to
  the ONNX graph's inputs and outputs by order, or by the ONNX names written after the shapes
  (the standard: then every input and output of the network names one). A hidden tensor is an
  internal ONNX value (the standard's node output name, required); constraints on it are rows
  over Y like the outputs' (a counterexample must satisfy them, so bounding them row by row
  stays sound).
  The file is also parsed by the ``vnnlib`` package (its grammar and type checks); its
  ``vnnlib.compat.transform`` treats each ``assert`` as its own case rather than conjoining
  them, so the normal form is computed here for both versions.
Atoms: ``<=, >=, <, >, =`` (1.0), ``==`` and ``!=`` (2.0; a != b is a < b or a > b) between
linear expressions (``+``, ``-``, ``*`` by a constant). A constraint over several inputs is a
row of the term's input polytope (``Region.input_rows``). An equality of two inputs
(``(== X_i X_j)``: two rows) gives each the other's bounds in that term, and its region reads
the two as one variable (``Region.representatives``, ``Region.merged``: its own graph,
``certify.vnnlib_binding.solve``); a top-level equality of inputs of two networks is one
position of X already (``_shared_inputs``). Every input needs a box in every term, of its own
or through such an equality; a constraint relating inputs to outputs (MNC) is refused.
Numerals: ``[+-]digits[.digits][e[+-]digits]``, read as exact rationals.
Two readings of every region:
- for bounding ("unsat"): the float64 ``lower``/``upper`` rounded outward, ``rhs`` rounded
  upward, strict inequalities closed (each region contains the real one: sound);
- as written (``box``, ``rows``: exact rationals, strictness kept): a counterexample must
  lie in ``box`` (``Region.contains``) and its output satisfy ``rows``
  (``Region.satisfied_exactly``); ``Region.inner_box`` gives the points an attack may use.
``.gz`` files are decompressed. Anything else raises ValueError naming the file, the line
and the construct.
"""
from __future__ import annotations

import dataclasses
import gzip
import math
import os
import re
import sys
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

MAX_TERMS = 100_000  # DNF size limit (a product of disjunctions can explode)
#: nesting limit of the recursive readers (chains of one associative operator, e.g.
#: (or a (or b ...)), are flattened first and do not count); Python's stack is ~1000 frames
MAX_NESTING = 100
MAX_ELEMENTS = 10_000_000  # declared size of X or Y (the box and rows are dense arrays)
MAX_NUMERAL = 1_000  # characters of one numeral (an exact rational is built from it)
MAX_EXPONENT = 10_000  # |e| of a numeral's exponent (10**e is built exactly)
_FMAX = Fraction(sys.float_info.max)
_NUMERAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?")
_NUMBER_LIKE = re.compile(r"[+-]?\.?\d")  # a token that starts like a numeral


@dataclass(frozen=True)
class Region:
    """Input box [lower, upper] (flat, float64, rounded outward) and the counterexample
    condition: some disjunct (mat, rhs) with mat · Y <= rhs (an empty mat is always
    satisfied; ``rhs`` rounded upward, strict rows closed). As written: ``box`` per input
    (lo, lo_strict, hi, hi_strict) and ``rows`` per disjunct, per row (((j, a_j), ...), r,
    strict) meaning Σ a_j Y_j < r (strict) or <= r, all Fractions; None: the float values are
    the exact ones (non-strict)."""

    lower: np.ndarray
    upper: np.ndarray
    disjuncts: tuple
    box: tuple | None = None
    rows: tuple | None = None
    #: linear constraints over several inputs, per row (((i, a_i), ...), r, strict): Σ a_i X_i
    #: < r or <= r in Fractions. The input set is the box cut by them (a polytope): bounds over
    #: the box are sound for it, and a counterexample must satisfy them (``contains``)
    input_rows: tuple = ()

    def satisfied(self, y, tol=0.0) -> bool:
        """Does output y (flat) satisfy some disjunct's float rows (each within ``tol``)?"""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        return any(bool(np.all(m @ y <= r + tol)) for m, r in self.disjuncts)

    def exact_box(self) -> tuple:
        """``box``, or the float box taken exactly (non-strict)."""
        if self.box is not None:
            return self.box
        return tuple((Fraction(float(lo)), False, Fraction(float(hi)), False) for lo, hi in zip(self.lower, self.upper))

    def exact_rows(self) -> tuple:
        """``rows``, or the float disjuncts taken exactly (non-strict)."""
        if self.rows is not None:
            return self.rows
        return tuple(tuple((tuple((j, Fraction(float(a))) for j, a in enumerate(m_r) if a), Fraction(float(r_r)), False)
                           for m_r, r_r in zip(m, r)) for m, r in self.disjuncts)

    def strict(self) -> tuple:
        """Per disjunct, a bool array: which rows are strict inequalities."""
        return tuple(np.array([s for _, _, s in d], dtype=bool).reshape(len(d)) for d in self.exact_rows())

    def contains(self, x) -> bool:
        """Is the point x (flat floats, each taken as its exact rational) in the box as
        written, strict bounds honoured? Non-finite coordinates are outside."""
        x = np.asarray(x).reshape(-1)
        box = self.exact_box()
        if x.size != len(box) or not np.all(np.isfinite(x)):
            return False
        q = [Fraction(float(v)) for v in x.tolist()]
        return all(_inside(v, b) for v, b in zip(q, box)) and all(
            _holds(sum((a * q[i] for i, a in coefs), Fraction(0)), r, strict) for coefs, r, strict in self.input_rows)

    def excludes(self, lo, hi) -> bool:
        """Does some input row hold nowhere on the box [lo, hi] (float arrays, read exactly)?
        Then no input of the region lies there (exact minimum of Σ a_i X_i over the box)."""
        for coefs, r, strict in self.input_rows:
            least = sum((a * Fraction(float(lo[i] if a > 0 else hi[i])) for i, a in coefs), Fraction(0))
            if not _holds(least, r, strict):
                return True
        return False

    def representatives(self) -> tuple:
        """Per input, the smallest input its input rows equate it with (``_equated``: a pair
        of rows a·X_i - a·X_j <= 0 and >= 0, what ``(== X_i X_j)`` in a disjunct gives), itself
        when none. Inputs with one representative are one variable of the region (``merged``):
        bounding them apart over the box ignores the equality, and no attack point meets it."""
        return _representatives(self.lower.size, _equated(self.input_rows))

    def merged(self):
        """This region over one variable per class of ``representatives`` (in the order of
        the representatives), or None when it holds no input: the class's box is the
        intersection of its members' boxes (all members are equal), and every input row has
        each input replaced by its representative's variable (``_substituted``). Exact: x is
        in the merged region iff ``expand(x)`` is in this one."""
        reps = self.representatives()
        at = np.array(class_positions(reps), dtype=np.int64)
        box = self.exact_box()
        lo, hi = _shared_bounds([(a, sa) for a, sa, _, _ in box], [(b, sb) for _, _, b, sb in box], reps)
        box = [(*lo[k], *hi[k]) for k in sorted(set(reps))]
        rows = _substituted(self.input_rows, at)
        if rows is None or any(a > b or (a == b and (sa or sb)) for a, sa, b, sb in box):
            return None
        lower, upper = np.full(len(box), -np.inf), np.full(len(box), np.inf)
        np.maximum.at(lower, at, self.lower)
        np.minimum.at(upper, at, self.upper)
        return Region(lower, upper, self.disjuncts, tuple(box), self.rows, rows)

    def expand(self, x) -> np.ndarray:
        """A point of ``merged()`` (one value per class) as a point of this region: every
        input takes its representative's value."""
        return np.asarray(x).reshape(-1)[list(class_positions(self.representatives()))]

    def satisfied_exactly(self, y) -> bool:
        """Does output y (flat floats, each taken as its exact rational, e.g. a model's float32
        outputs) satisfy some disjunct as written (Σ a_j y_j < r or <= r, in rationals)? A
        non-finite output satisfies nothing (no exact reading)."""
        y = np.asarray(y).reshape(-1)
        if not np.all(np.isfinite(y)):
            return False
        q = [Fraction(float(v)) for v in y.tolist()]
        return any(all(_holds(sum((a * q[j] for j, a in coefs), Fraction(0)), r, s) for coefs, r, s in d)
                   for d in self.exact_rows())

    def inner_box(self, dtype=np.float64):
        """(lo, hi): arrays of ``dtype`` with, per input, the smallest and largest finite
        ``dtype`` values inside the box as written (strictness honoured); None when some input
        has no such value (e.g. 0.1 <= X <= 0.1 in floats)."""
        dtype = np.dtype(dtype)
        lo, hi = [], []
        for a, sa, b, sb in self.exact_box():
            u, v = _ceil_in(a, sa, dtype), _floor_in(b, sb, dtype)
            if u is None or v is None or u > v:
                return None
            lo.append(u)
            hi.append(v)
        return np.array(lo, dtype=dtype), np.array(hi, dtype=dtype)


def _holds(v, r, strict) -> bool:
    return v < r if strict else v <= r


def _inside(q, b) -> bool:
    lo, lo_strict, hi, hi_strict = b
    return (q > lo if lo_strict else q >= lo) and (q < hi if hi_strict else q <= hi)


def _equated(xrows) -> list:
    """Pairs (i, j), i < j, of inputs that input rows ((coefs, r, strict), coefs sorted by
    input) make equal: a·X_i - a·X_j <= 0 and -a·X_i + a·X_j <= 0 (any a, both non-strict),
    as ``(== X_i X_j)`` or ``(<= X_i X_j) (>= X_i X_j)`` give. Only these pure equalities
    (no offset, no third input) are one variable; other rows stay rows of the polytope."""
    signs = {}
    for coefs, r, strict in xrows:
        if len(coefs) == 2 and r == 0 and not strict and coefs[0][1] == -coefs[1][1]:
            signs.setdefault((coefs[0][0], coefs[1][0]), set()).add(coefs[0][1] > 0)
    return sorted(pair for pair, s in signs.items() if len(s) == 2)


def _shared_bounds(lo, hi, reps) -> tuple:
    """(lo, hi) per input: the tightest lower and upper bound ((value, strict), or None when
    no member has one) over the inputs with its representative. Exact, not a relaxation:
    inputs made equal lie within each other's bounds."""
    best_lo, best_hi = {}, {}
    for i, r in enumerate(reps):
        if lo[i] is not None:
            best_lo[r] = _tighter(best_lo.get(r), lo[i], False)
        if hi[i] is not None:
            best_hi[r] = _tighter(best_hi.get(r), hi[i], True)
    return [best_lo.get(r) for r in reps], [best_hi.get(r) for r in reps]


def _substituted(xrows, at) -> tuple | None:
    """Input rows with input i replaced by variable ``at[i]`` (coefficients of one variable
    summed); a row left without variables (an equality's 0 <= 0) is dropped when it holds,
    and None is returned when it fails (no input satisfies the rows)."""
    out = set()
    for coefs, r, strict in xrows:
        acc = {}
        for i, a in coefs:
            acc[int(at[i])] = acc.get(int(at[i]), Fraction(0)) + a
        acc = tuple(sorted((k, a) for k, a in acc.items() if a))
        if not acc and not _holds(Fraction(0), r, strict):
            return None
        if acc:
            out.add((acc, r, strict))
    return tuple(sorted(out))


def class_positions(reps) -> tuple:
    """Per index, the position of its class (its representative ``reps[i]``) among the
    distinct representatives in increasing order: where its value is in the shorter vector
    that holds one value per class."""
    at = {r: k for k, r in enumerate(sorted(set(reps)))}
    return tuple(at[r] for r in reps)


def _representatives(n, pairs) -> tuple:
    """Per index 0..n-1, the smallest index joined to it by ``pairs`` (union-find)."""
    parent = list(range(n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in pairs:
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    return tuple(root(i) for i in range(n))


def _ceil_in(q: Fraction, strict: bool, dtype):
    """The smallest finite ``dtype`` value v with v > q (strict) or v >= q, or None."""
    top = dtype.type(np.finfo(dtype).max)
    above = lambda v: Fraction(float(v)) > q or (not strict and Fraction(float(v)) == q)  # noqa: E731
    if not above(top):
        return None
    if q < -Fraction(float(top)):
        return -top
    v, inf = dtype.type(float(q)), dtype.type(np.inf)  # nearest (rounded twice): a step or two away
    while not above(v):
        v = np.nextafter(v, inf)
    while np.isfinite(below := np.nextafter(v, -inf)) and above(below):
        v = below
    return v


def _floor_in(q: Fraction, strict: bool, dtype):
    """The largest finite ``dtype`` value v with v < q (strict) or v <= q, or None."""
    v = _ceil_in(-q, strict, dtype)
    return None if v is None else -v


@dataclass(frozen=True)
class Tensor:
    """One declared 2.0 tensor: ``role`` "X" (input), "Y" (output) or "H" (hidden); its
    elements are X[offset : offset + size] (inputs) or Y[offset : offset + size] (outputs and
    hidden tensors: the joint output vector), row-major. ``onnx_name``: the ONNX value it is
    bound to (always for a hidden tensor; for inputs and outputs when the file names them,
    else None: bound by order)."""

    name: str
    role: str
    shape: tuple
    offset: int
    network: str
    onnx_name: str | None = None
    line: int = 0
    #: an input's elements as positions in X when inputs of different networks are equated
    #: (``(assert (== A[i] X[i]))``, one variable for both); None: offset, offset + 1, ...
    positions: tuple | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def indices(self) -> tuple:
        """The positions of the elements (row-major) in X (inputs) or Y (the others)."""
        return self.positions if self.positions is not None else tuple(range(self.offset, self.offset + self.size))


@dataclass(frozen=True)
class Property:
    """A parsed VNN-LIB file: ``regions`` (a disjunction over input boxes), sizes of X and Y
    (all inputs; all outputs and hidden tensors), the version ("1.0" or "2.0"), the network
    name (2.0) and the file."""

    def of(self, role) -> tuple:
        """The declared tensors of ``role`` ("X" inputs, "Y" outputs, "H" hidden) in order."""
        return tuple(t for t in self.tensors if t.role == role)

    regions: tuple
    n_inputs: int
    n_outputs: int
    version: str
    network: str | None
    path: str
    #: 2.0: every declared tensor (``Tensor``), in the file's order; () for 1.0
    tensors: tuple = ()
    #: 2.0: (name, relation, target) per declare-network in order; relation "equal-to" (the
    #: same ONNX model as target), "isomorphic-to" (a model of the same interface) or None
    networks: tuple = ()
    assumptions: str = ("bounding: strict inequalities closed, box bounds rounded outward and rhs upward to "
                        "float64, coefficients rounded to nearest; counterexamples: checked against the "
                        "literals as written (exact rationals, strictness kept)")


# ---------------------------------------------------------------- s-expressions
class _Tok(str):
    """A token with the line it is on."""

    line = 0


class _Expr(list):
    """A parenthesised expression with the line of its '('."""

    line = 0


def _at(where, e) -> str:
    """'file:line' of an expression or token (the file alone when it has no line)."""
    line = getattr(e, "line", 0)
    return f"{where}:{line}" if line else where


def _tokens(text):
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        for t in re.findall(r'"[^"]*"|\(|\)|[^\s()]+', line.split(";", 1)[0]):
            tok = _Tok(t)
            tok.line = n
            out.append(tok)
    return out


def _parse(tokens, where):
    """Nested ``_Expr`` lists (built without recursion, so any depth parses)."""
    stack, out = [], []
    for t in tokens:
        if t == "(":
            e = _Expr()
            e.line = t.line
            stack.append(e)
        elif t == ")":
            if not stack:
                raise ValueError(f"{_at(where, t)}: unbalanced ')'")
            e = stack.pop()
            (stack[-1] if stack else out).append(e)
        else:
            (stack[-1] if stack else out).append(t)
    if stack:
        raise ValueError(f"{_at(where, stack[-1])}: unbalanced '(' (missing {len(stack)} ')')")
    return out


def _read_text(path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"path: no such file {path!r}")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return f.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable UTF-8 VNN-LIB text{' (gzip)' if path.endswith('.gz') else ''} "
                         f"({exc})") from exc


# ---------------------------------------------------------------- declarations
def _size(n, what, loc):
    if n > MAX_ELEMENTS:
        raise ValueError(f"{loc}: {what} has {n} elements, more than the {MAX_ELEMENTS} supported")
    return n


class _Vars:
    def __init__(self, where):
        self.where = where
        self.kind = {}  # name -> ("X" | "Y", shape) (2.0) or flat ("X" | "Y", index) (1.0)
        self.nx = self.ny = 0
        self.decl = {}  # "X" | "Y" -> {flat index or None (a tensor): line}
        self.tensors = []  # 2.0: the declared ``Tensor``s in order
        self.alias = {}  # X index as declared -> its position in X (``equate``)

    def declare_const(self, name, sort, loc):
        m = re.fullmatch(r"([XY])_(\d{1,9})", name) if isinstance(name, str) else None
        if not m or not isinstance(sort, str) or sort.lower() != "real":
            raise ValueError(f"{loc}: unsupported declaration (declare-const {_show(name)} {_show(sort)}); "
                             f"expected X_i / Y_j Real")
        k, i = m.group(1), _size(int(m.group(2)) + 1, m.group(0)[:2] + "i", loc) - 1
        self.kind[name] = (k, i)
        self.decl.setdefault(k, {})[i] = getattr(name, "line", 0)
        if k == "X":
            self.nx = max(self.nx, i + 1)
        else:
            self.ny = max(self.ny, i + 1)

    def declare_tensor(self, t: Tensor, loc):
        """Declare a 2.0 tensor (its offset already in its role's vector); a name declared
        twice is an error (the standard: names are unique within the query)."""
        _size(t.offset + t.size, f"{'the inputs' if t.role == 'X' else 'the outputs'} up to {t.name}", loc)
        if t.name in self.kind:
            raise ValueError(f"{loc}: {t.name} is declared twice (names are unique within a query)")
        role = "X" if t.role == "X" else "Y"  # hidden tensors: the joint output vector
        self.kind[t.name] = (role, t.shape, t.offset)
        self.decl.setdefault(role, {})[None] = t.line
        self.tensors.append(t)
        if role == "X":
            self.nx = max(self.nx, t.offset + t.size)
        else:
            self.ny = max(self.ny, t.offset + t.size)

    def name_of(self, role, i) -> str:
        """The written name of element i of the X or Y vector (X_i in 1.0, X[0,i] in 2.0); an
        input equated across networks (``equate``) by all its names, "X[0] = A[0]"."""
        names = []
        for t in self.tensors:
            if ("X" if t.role == "X" else "Y") == role and i in t.indices():
                idx = np.unravel_index(t.indices().index(i), t.shape) if t.shape else ()
                names.append(f"{t.name}[{','.join(str(int(k)) for k in idx)}]")
        return " = ".join(names) or f"{role}_{i}"

    def equate(self, pairs) -> None:
        """Make the input elements of each pair (flat indices of X) one variable: X keeps one
        position per class (in order of their first index), every reference and every input
        tensor's ``positions`` follow. Exact when the pairs are top-level equalities."""
        roots = _representatives(self.nx, pairs)
        self.alias = dict(enumerate(class_positions(roots)))
        self.nx = len(set(roots))
        self.tensors = [dataclasses.replace(t, positions=tuple(self.alias[i] for i in t.indices()))
                        if t.role == "X" else t for t in self.tensors]

    def line_of(self, role, i):
        """The line declaring role i (an undeclared X_i below a declared one: the last X)."""
        d = self.decl.get(role, {})
        return d.get(i, d.get(None, max(d.values(), default=0)))

    def ref(self, atom, loc):
        """('X'|'Y', flat index) of a variable reference, or None when not a variable (a
        hidden tensor's elements are in the joint output vector Y; equated inputs share their
        position, ``equate``)."""
        r = self.raw_ref(atom, loc)
        if r is not None and r[0] == "X" and self.alias:
            return "X", self.alias[r[1]]
        return r

    def network_of(self, i):
        """The network whose input holds X index ``i`` as declared (None for 1.0)."""
        return next((t.network for t in self.tensors if t.role == "X" and t.offset <= i < t.offset + t.size), None)

    def raw_ref(self, atom, loc):
        """('X'|'Y', flat index as declared) of a variable reference, or None."""
        if atom in self.kind and isinstance(self.kind[atom][1], int):
            return self.kind[atom]
        m = re.fullmatch(r"([^\[\]]+)\[([\d,\s]+)\]", atom)
        if m and m.group(1) in self.kind and isinstance(self.kind[m.group(1)][1], tuple):
            role, shape, offset = self.kind[m.group(1)]
            parts = m.group(2).split(",")
            if any(not p.strip().isdigit() or len(p.strip()) > 12 for p in parts):
                raise ValueError(f"{loc}: malformed index {atom}")
            idx = [int(p) for p in parts]
            if len(idx) != len(shape) or any(not 0 <= i < s for i, s in zip(idx, shape)):
                raise ValueError(f"{loc}: index {atom} out of range for shape {list(shape)}")
            return role, offset + (int(np.ravel_multi_index(idx, shape)) if shape else 0)
        return None


def _shape_of(atoms, loc):
    text = "".join(atoms)
    m = re.fullmatch(r"\[((?:\d{1,9},)*\d{1,9}|)\]", text)
    if not m:
        raise ValueError(f"{loc}: unsupported shape {text!r} (expected e.g. [1,784])")
    return tuple(int(s) for s in m.group(1).split(",") if s)


_ROLES = {"declare-input": "X", "declare-hidden": "H", "declare-output": "Y"}


def _declaration(d, e, where):
    """(role, name, shape, onnx name or None, loc) of one declare-input / -hidden / -output."""
    if not isinstance(d, list) or not d or d[0] not in _ROLES:
        head = d[0] if isinstance(d, list) and d else d
        raise ValueError(f"{_at(where, d if isinstance(d, list) else e)}: unsupported construct {_show(head)!r} "
                         f"in declare-network (only declare-input, declare-hidden and declare-output)")
    loc = _at(where, d)
    if len(d) < 4 or not all(isinstance(a, str) for a in d[1:]):
        tail = ' "onnx-name"' if d[0] == "declare-hidden" else ""
        raise ValueError(f"{loc}: malformed {d[0]} (expected ({d[0]} NAME real [SHAPE]{tail}))")
    if not d[2].lower().startswith(("real", "float")):
        raise ValueError(f"{loc}: unsupported element type {d[2]!r} of {d[1]}")
    atoms, onnx_name = list(d[3:]), None
    if atoms[-1].startswith('"'):
        onnx_name = atoms.pop()[1:-1]
        if not onnx_name:
            raise ValueError(f"{loc}: empty ONNX name in {d[0]} {d[1]}")
    if d[0] == "declare-hidden" and onnx_name is None:
        raise ValueError(f'{loc}: declare-hidden {d[1]} without the ONNX value it names (expected '
                         f'(declare-hidden NAME real [SHAPE] "onnx-name"))')
    return _ROLES[d[0]], d[1], _shape_of(atoms, loc), onnx_name, loc


def _relation(e, networks, where):
    """(relation, target) of ``(equal-to N)`` / ``(isomorphic-to N)`` at e[2], or (None, None)."""
    d = e[2] if len(e) > 2 else None
    if not (isinstance(d, list) and d and d[0] in ("equal-to", "isomorphic-to")):
        return None, None
    if len(d) != 2 or not isinstance(d[1], str):
        raise ValueError(f"{_at(where, d)}: malformed {d[0]} (expected ({d[0]} NETWORK))")
    if d[1] not in [n for n, _, _ in networks]:
        raise ValueError(f"{_at(where, d)}: {d[0]} {d[1]}: no network {d[1]!r} is declared before it")
    return d[0], d[1]


def _same_interface(name, relation, target, vars_, where, e):
    """ValueError unless network ``name`` has the inputs and outputs (number and shapes, in
    order) of ``target`` (the standard's typing of equal-to and isomorphic-to)."""
    for role, what in (("X", "input"), ("Y", "output")):
        mine = [t.shape for t in vars_.tensors if t.network == name and t.role == role]
        theirs = [t.shape for t in vars_.tensors if t.network == target and t.role == role]
        if mine != theirs:
            raise ValueError(f"{_at(where, e)}: declare-network {name} ({relation} {target}): its {what}s have shapes "
                             f"{[list(s) for s in mine]}, those of {target} {[list(s) for s in theirs]}")


def _declare_network(e, vars_, where, networks=()):
    """Declare a network's tensors: inputs at the end of X in order; outputs, then hidden
    tensors, at the end of Y in order. Returns (name, relation, target)."""
    if len(e) < 2 or not isinstance(e[1], str):
        raise ValueError(f"{_at(where, e)}: declare-network without a name")
    if e[1] in [n for n, _, _ in networks]:
        raise ValueError(f"{_at(where, e)}: network {e[1]} is declared twice")
    relation, target = _relation(e, networks, where)
    decls = [_declaration(d, e, where) for d in e[(3 if relation else 2):]]
    for role, what in (("X", "declare-input"), ("Y", "declare-output")):
        if not any(r == role for r, *_ in decls):
            raise ValueError(f"{_at(where, e)}: declare-network {e[1]} has no {what}")
    named = [n is not None for r, _, _, n, _ in decls if r != "H"]
    if any(named) and not all(named):
        raise ValueError(f"{_at(where, e)}: declare-network {e[1]} names the ONNX values of some inputs and outputs "
                         f"but not all (the standard: all of them, or none: bound by order)")
    offsets, nx, ny = {}, vars_.nx, vars_.ny
    for role in ("X", "Y", "H"):  # the layout: inputs in X; outputs, then hidden tensors, in Y
        for k, (r, _, shape, _, _) in enumerate(decls):
            if r == role:
                offsets[k] = nx if role == "X" else ny
                nx, ny = (nx + math.prod(shape), ny) if role == "X" else (nx, ny + math.prod(shape))
    for k, (role, name, shape, onnx_name, loc) in enumerate(decls):  # in the file's order
        vars_.declare_tensor(Tensor(name, role, shape, offsets[k], e[1], onnx_name, getattr(name, "line", 0)), loc)
    if relation:
        _same_interface(e[1], relation, target, vars_, where, e)
    return e[1], relation, target


# ---------------------------------------------------------------- formulas
def _number(atom, loc):
    """The exact rational of a numeral token, None for a name; ValueError for a malformed
    numeral (e.g. 1_000, 1/2, 0x10) or one too long or with too large an exponent."""
    if not _NUMBER_LIKE.match(atom):
        return None
    m = _NUMERAL.fullmatch(atom) if len(atom) <= MAX_NUMERAL else None
    if m is None:
        raise ValueError(f"{loc}: malformed numeral {atom[:40]!r} (expected digits with an optional "
                         f"fraction and exponent, e.g. 0.25, -3, 1e-3; at most {MAX_NUMERAL} characters)")
    if m.group(1) is not None and abs(int(m.group(1))) > MAX_EXPONENT:
        raise ValueError(f"{loc}: numeral {atom[:40]!r} has an exponent beyond ±{MAX_EXPONENT}")
    return Fraction(atom)


def _flat(e, op):
    """The arguments of e = (op a (op b ...) ...) with nested ``op`` chains spliced in, found
    without recursion (long right-nested chains are common in generated files)."""
    out, todo = [], list(reversed(e[1:]))
    while todo:
        a = todo.pop()
        if isinstance(a, list) and a and a[0] == op:
            todo.extend(reversed(a[1:]))
        else:
            out.append(a)
    return out


def _linear(e, vars_, where, depth=0):
    """A linear expression as ({(role, index): coef}, constant), exact."""
    if isinstance(e, str):
        n = _number(e, _at(where, e))
        if n is not None:
            return {}, n
        r = vars_.ref(e, _at(where, e))
        if r is None:
            raise ValueError(f"{_at(where, e)}: undeclared variable {e!r}")
        return {r: Fraction(1)}, Fraction(0)
    if not e or not isinstance(e[0], str):
        raise ValueError(f"{_at(where, e)}: malformed expression {_show(e)}")
    if depth > MAX_NESTING:
        raise ValueError(f"{_at(where, e)}: expression nested deeper than {MAX_NESTING} levels")
    op = e[0]
    raw = _flat(e, op) if op in ("+", "*") else e[1:]
    args = [_linear(a, vars_, where, depth + 1) for a in raw]
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
            raise ValueError(f"{_at(where, e)}: nonlinear product {_show(e)}")
        k = math.prod(consts, start=Fraction(1))
        if not terms:
            return {}, k
        t, c = terms[0]
        return {v: a * k for v, a in t.items() if a * k}, c * k
    raise ValueError(f"{_at(where, e)}: unsupported arithmetic {_show(e)}")


def _combine(args, signs):
    out, c0 = {}, Fraction(0)
    for (t, c), s in zip(args, signs):
        c0 += s * c
        for v, a in t.items():
            out[v] = out.get(v, 0) + s * a
    return {v: a for v, a in out.items() if a}, c0


def _show(e, depth=3):
    """An expression as text, at most ``depth`` levels and ~200 characters (for messages)."""
    if isinstance(e, str):
        return e
    if depth == 0:
        return "(...)"
    text = "(" + " ".join(_show(a, depth - 1) for a in e[:12]) + (" ..." if len(e) > 12 else "") + ")"
    return text if len(text) <= 200 else text[:197] + "..."


def _atoms(e, vars_, where, depth):
    """One comparison as a list of atoms (coefs, constant, strict, loc) meaning
    Σ coefs·v + constant < 0 (strict) or <= 0."""
    op, loc = e[0], _at(where, e)
    if len(e) != 3:
        raise ValueError(f"{loc}: comparison {op!r} with {len(e) - 1} operands (expected 2)")
    a, b = _linear(e[1], vars_, where, depth), _linear(e[2], vars_, where, depth)
    d = _combine([a, b], [1, -1])  # a - b
    neg = ({v: -c for v, c in d[0].items()}, -d[1])
    strict = op in ("<", ">")
    if op in ("<=", "<"):
        return [(*d, strict, loc)]
    if op in (">=", ">"):
        return [(*neg, strict, loc)]
    return [(*d, False, loc), (*neg, False, loc)]  # "=" (1.0) or "==" (2.0)


def _same_line(e, items):
    """An ``_Expr`` of ``items`` on the line of ``e``."""
    out = _Expr(items)
    out.line = getattr(e, "line", 0)
    return out


def _dnf(e, vars_, where, depth=0):
    """The formula as a list of terms (lists of atoms)."""
    if not isinstance(e, list) or not e or not isinstance(e[0], str):
        raise ValueError(f"{_at(where, e)}: malformed assertion {_show(e)}")
    if depth > MAX_NESTING:
        raise ValueError(f"{_at(where, e)}: formula nested deeper than {MAX_NESTING} levels")
    op = e[0]
    if op == "and":
        terms = [[]]
        for a in _flat(e, "and"):
            sub = _dnf(a, vars_, where, depth + 1)
            if len(terms) * len(sub) > MAX_TERMS:
                raise ValueError(f"{_at(where, e)}: the disjunctive normal form exceeds {MAX_TERMS} terms")
            terms = [t + s for t in terms for s in sub]
        return terms
    if op == "or":
        out = []
        for a in _flat(e, "or"):
            out += _dnf(a, vars_, where, depth + 1)
            if len(out) > MAX_TERMS:
                raise ValueError(f"{_at(where, e)}: the disjunctive normal form exceeds {MAX_TERMS} terms")
        return out
    if op in ("<=", ">=", "<", ">", "=", "=="):
        return [_atoms(e, vars_, where, depth + 1)]
    if op == "!=":  # a != b: a < b or a > b
        return [_atoms(_same_line(e, [strict, *e[1:]]), vars_, where, depth + 1) for strict in ("<", ">")]
    raise ValueError(f"{_at(where, e)}: unsupported construct {op!r} in an assertion")


def float_up(q: Fraction) -> float:
    """The smallest float64 >= q (inf above the float64 range)."""
    if q > _FMAX:
        return math.inf
    if q < -_FMAX:
        return -sys.float_info.max
    f = float(q)
    return f if Fraction(f) >= q else float(np.nextafter(f, np.inf))


def float_down(q: Fraction) -> float:
    """The largest float64 <= q (-inf below the float64 range)."""
    return -float_up(-q)


def _tighter(old, new, upper):
    """The tighter of two bounds (value, strict) on one input; at equal values strict wins."""
    if old is None or new[0] == old[0]:
        return new if old is None else (new[0], new[1] or old[1])
    return min(old, new) if upper else max(old, new)


def _term(atoms, vars_, where):
    """(exact box, exact rows) of one DNF term, or None when it is infeasible."""
    nx = vars_.nx
    lo, hi = [None] * nx, [None] * nx
    rows, xrows = [], []
    for coefs, c, strict, loc in atoms:
        roles = {r for r, _ in coefs}
        if not coefs:
            if c > 0 or (strict and c == 0):
                return None  # constant false
            continue
        if roles == {"X"}:
            if len(coefs) > 1:  # Σ a_i X_i + c <= 0 (< 0): an input row Σ a_i X_i <= -c
                xrows.append((tuple(sorted((i, a) for (_, i), a in coefs.items())), -c, strict))
                continue
            (_, i), a = next(iter(coefs.items()))
            if abs(c / a) > _FMAX:
                raise ValueError(f"{loc}: bound of {vars_.name_of('X', i)} beyond the float64 range (±1.8e308); every input "
                                 f"needs a finite box")
            if a > 0:
                hi[i] = _tighter(hi[i], (-c / a, strict), True)
            else:
                lo[i] = _tighter(lo[i], (-c / a, strict), False)
        elif roles == {"Y"}:
            rows.append((tuple(sorted((j, a) for (_, j), a in coefs.items())), -c, strict, loc))
        else:
            raise ValueError(_mixed(vars_, coefs, loc))
    lo, hi = _shared_bounds(lo, hi, _representatives(nx, _equated(xrows)))  # X_i = X_j: one box
    for i in range(nx):
        if lo[i] is None or hi[i] is None:
            raise ValueError(_unbounded(vars_, where, i, "lower" if lo[i] is None else "upper", atoms))
    if any(a > b or (a == b and (sa or sb)) for (a, sa), (b, sb) in zip(lo, hi)):
        return None
    return tuple((a, sa, b, sb) for (a, sa), (b, sb) in zip(lo, hi)), rows, tuple(sorted(set(xrows)))


def _mixed(vars_, coefs, loc) -> str:
    """The error for a constraint relating inputs to outputs or hidden values (of one network
    or across networks): the standard's theory MNC, which softcert does not read (a sound
    bound would need the input in the output's linear bound, an attack the relation kept)."""
    names = [vars_.name_of(r, i) for r, i in sorted(coefs)]
    return (f"{loc}: unsupported constraint mixing inputs and outputs ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}): a comparison of an input with an output or hidden value is the "
            f"theory MNC, which softcert does not support (supports --multiple-node-comparison-theories: SNC); "
            f"constrain inputs and outputs in separate comparisons")


def _unbounded(vars_, where, i, side, atoms) -> str:
    """The error for input i without a ``side`` bound in the DNF term ``atoms``: its
    declaration, the lines of the term's constraints (which disjunct), what to write."""
    name = vars_.name_of("X", i)
    one = name.split(" = ")[0]  # an input equated across networks: one of its names
    lines = sorted({int(m.group(1)) for *_, loc in atoms if (m := re.search(r":(\d+)$", loc))})
    where_ = f" in the conjunction of the constraints on line{'s' if len(lines) > 1 else ''} " \
        f"{', '.join(map(str, lines))}" if lines else ""
    return (f"{_at(where, _Line(vars_.line_of('X', i)))}: input {name} has no {side} bound{where_} (every input "
            f"needs a box in every disjunct); write its bounds there or at the top level, e.g. (assert (and "
            f"(>= {one} LO) (<= {one} HI))), or equate it there or at the top level with an input that has "
            f"bounds, e.g. (== {one} OTHER), which makes the two one variable")


class _Line:
    """Something with a line (the declaration an error points to)."""

    def __init__(self, line):
        self.line = line


def _floats(box, rows, ny):
    """The float64 reading for bounding: (lower, upper) rounded outward, (mat, rhs) with rhs
    rounded upward and coefficients to nearest. ValueError for a coefficient beyond the
    float64 range."""
    mat = np.zeros((len(rows), ny))
    for k, (coefs, _, _, loc) in enumerate(rows):
        for j, a in coefs:
            if abs(a) > _FMAX:
                raise ValueError(f"{loc}: coefficient of Y_{j} beyond the float64 range (±1.8e308); "
                                 f"scale the constraint")
            mat[k, j] = float(a)
    rhs = np.array([float_up(r) for _, r, _, _ in rows], dtype=np.float64)
    return (np.array([float_down(a) for a, _, _, _ in box]), np.array([float_up(b) for _, _, b, _ in box]), mat, rhs)


def _shared_inputs(conj, vars_, where):
    """Pairs (i, j) of X indices (as declared) that a top-level conjunct ``(== A[..] X[..])``
    (or 1.0's ``=``) equates, A and X inputs of different networks: one variable each, which
    is exact since every solution satisfies a top-level conjunct (a product graph then reads
    both networks' inputs from the same position, so its bounds see the two as equal)."""
    pairs = []
    for a in _flat(conj, "and"):
        if not (isinstance(a, list) and len(a) == 3 and a[0] in ("=", "==") and all(isinstance(v, str) for v in a[1:])):
            continue
        r, q = (vars_.raw_ref(v, _at(where, a)) for v in a[1:])
        if r and q and r[0] == q[0] == "X" and vars_.network_of(r[1]) != vars_.network_of(q[1]):
            pairs.append((r[1], q[1]))
    return pairs


def _header(e, vars_, where, state):
    """One top-level declaration into ``vars_`` / ``state`` (version, network, asserts)."""
    head, loc = e[0], _at(where, e)
    if head == "vnnlib-version":
        state["version"] = "".join(a for a in e[1:] if isinstance(a, str)).strip("<>")
        if len(e) < 2 or not all(isinstance(a, str) for a in e[1:]) or state["version"] != "2.0":
            raise ValueError(f"{loc}: unsupported vnnlib-version {state['version']!r} (only <2.0>)")
    elif head == "declare-const":
        if len(e) != 3:
            raise ValueError(f"{loc}: malformed declare-const {_show(e)} (expected (declare-const X_0 Real))")
        vars_.declare_const(e[1], e[2], loc)
    elif head == "declare-network":
        state["networks"].append(_declare_network(e, vars_, where, state["networks"]))
        state["network"] = state["networks"][0][0]
    elif head == "assert":
        if len(e) != 2:
            raise ValueError(f"{loc}: malformed assert (expected one formula)")
        state["asserts"].append(e[1])
    else:
        raise ValueError(f"{loc}: unsupported construct {_show(head)!r}")


def parse_vnnlib(text: str, where: str = "<string>") -> Property:
    """Parse VNN-LIB 1.0 or 2.0 text (``where``: the file name for messages)."""
    exprs = _parse(_tokens(text), where)
    vars_ = _Vars(where)
    state = {"version": "1.0", "network": None, "networks": [], "asserts": []}
    for e in exprs:
        if not isinstance(e, list) or not e or not isinstance(e[0], str):
            raise ValueError(f"{_at(where, e)}: unexpected top-level {_show(e)!r}")
        _header(e, vars_, where, state)
    version, network, asserts = state["version"], state["network"], state["asserts"]
    if network is not None and version != "2.0":
        version = "2.0"
    if not vars_.nx or not vars_.ny:
        raise ValueError(f"{where}: the file declares no {'inputs' if not vars_.nx else 'outputs'}")
    if not asserts:
        raise ValueError(f"{where}: no assert")
    conj = _same_line(asserts[0], ["and", *asserts])
    if len(state["networks"]) > 1:
        vars_.equate(_shared_inputs(conj, vars_, where))
    regions: dict = {}
    for t in _dnf(conj, vars_, where):
        r = _term(t, vars_, where)
        if r is None:
            continue
        box, rows, xrows = r
        regions.setdefault((box, xrows), []).append(rows)
    out = []
    for (box, xrows), terms in regions.items():
        parts = [_floats(box, rows, vars_.ny) for rows in terms]
        exact = tuple(tuple((coefs, r, s) for coefs, r, s, _ in rows) for rows in terms)
        out.append(Region(parts[0][0], parts[0][1], tuple((m, b) for _, _, m, b in parts), box, exact, xrows))
    return Property(tuple(out), vars_.nx, vars_.ny, version, network, where, tuple(vars_.tensors),
                    tuple(state["networks"]))


def read_vnnlib(path) -> Property:
    """Read a VNN-LIB 1.0 or 2.0 file (``.gz`` accepted). A 2.0 file is then also checked by
    the ``vnnlib`` package when it is installed (its error reported with the file and line)."""
    where = os.fspath(path)
    text = _read_text(path)
    prop = parse_vnnlib(text, where)  # first: its errors name the line
    if prop.version == "2.0" or re.search(r"\(\s*vnnlib-version", text):
        _package_check(text, where)
    return prop


_IO_NAME = re.compile(r'(\(\s*declare-(?:input|output)\s+[^\s()]+\s+[^\s()]+\s*\[[^\]]*\])(\s*)"[^"]*"')


def _without_io_names(text):
    """``text`` without the ONNX names of inputs and outputs (``(declare-input X real [2]
    "x")``: the standard's mapping by name), which the ``vnnlib`` package 1.0's grammar does
    not have (it has them on declare-hidden only); newlines are kept, so lines still match."""
    return _IO_NAME.sub(lambda m: m.group(1) + "\n" * m.group(2).count("\n"), text)


def _package_check(text, where):
    """The ``vnnlib`` package's grammar and type checks of a 2.0 file, when it is installed;
    its error as a ValueError naming the file and the line it reports."""
    try:
        import vnnlib as vnnlib_pkg
    except ImportError:  # an optional check (the test extra installs it): parse_vnnlib is complete
        return
    try:
        vnnlib_pkg.parse_query_string(_without_io_names(text))
    except RecursionError:
        pass  # too deep for the package's recursive parser: parse_vnnlib checked it alone
    except Exception as exc:  # noqa: BLE001 - VNNLibException, or the package's own failure on the file
        m = re.search(r"line (\d+)", str(exc))
        raise ValueError(f"{where}{':' + m.group(1) if m else ''}: the vnnlib parser rejects the file "
                         f"({type(exc).__name__}: {exc})") from exc
