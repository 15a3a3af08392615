"""The VNN-LIB 2.0 solver interface: result words and the assignment of a ``sat`` answer.

The standard (VNNLIB-Standard, ``document/chapters/cli_solver.tex``, "Solver Command-line
Interface"; the command line itself is ``softcert vnnlib``, softcert/cli/commands/vnnlib.py):

- ``verify`` prints one word on its first line: ``sat``, ``unsat``, ``unknown`` or
  ``timed-out`` (``WORDS``: certify.vnncomp's ``"timeout"`` is printed ``timed-out``; the
  VNN-COMP result file, ``certify.vnncomp.result_text``, keeps its own ``timeout``).
- For ``sat``, the assignment follows on stdout (``assignment_text``): every declared
  variable in the order of the query file, as a line ``NAME TYPE [d1,d2,...]`` followed by
  its values one a line in row-major order::

      sat
      X real [1,2]
      0.5
      0.25
      Y real [2]
      1.0
      -3.0

  Or, with ``--serialise-assignments DIR``, one file ``DIR/NAME.pb`` per variable holding an
  ONNX ``TensorProto`` of the variable's element type and shape (``write_assignment``).

Values are Python's shortest round-trip repr of the float64 that holds the value exactly (the
counterexample's x is a value of the model's input dtype, y the model's own output), so
``float(line)`` gives back the very value. VNN-LIB 1.0 files (``declare-const X_0 Real``)
have scalars: ``X_0 Real []``. Several inputs, outputs and hidden tensors: each its own line
and values, cut from the concatenated x and y by ``offsets``. ``parse_assignment`` reads the
format back.
"""
from __future__ import annotations

import gzip
import math
import os
import re
from dataclasses import dataclass

import numpy as np

#: certify.vnncomp's result -> the word of the VNN-LIB 2.0 ``verify`` command
WORDS = {"sat": "sat", "unsat": "unsat", "unknown": "unknown", "timeout": "timed-out"}


@dataclass(frozen=True)
class Variable:
    """One declared variable of a query: ``role`` "X" (input), "H" (hidden) or "Y"
    (output); ``etype`` the element type as written (``real``, ``float32``, 1.0's ``Real``);
    ``shape`` () for a 1.0 scalar, ``index`` its flat position among the inputs or outputs
    (1.0 ``X_i`` / ``Y_j``; None for a 2.0 tensor, which is the whole input or output)."""

    name: str
    role: str
    etype: str
    shape: tuple
    index: int | None = None
    network: str | None = None


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|;[^\n]*|\(|\)|[^\s();"]+')


def _exprs(text):
    """The top-level s-expressions of ``text`` as nested lists of tokens (comments dropped;
    built without recursion; an unbalanced text yields what was closed)."""
    stack, out = [], []
    for t in _TOKEN.findall(text):
        if t.startswith(";"):
            continue  # a comment
        if t == "(":
            stack.append([])
        elif t == ")":
            if stack:
                e = stack.pop()
                (stack[-1] if stack else out).append(e)
        else:
            (stack[-1] if stack else out).append(t)
    return out


def read_text(path) -> str:
    """The text of a query file (``.gz`` decompressed)."""
    path = os.fspath(path)
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return f.read()


def _shape(tokens) -> tuple:
    text = "".join(t for t in tokens if isinstance(t, str) and not t.startswith('"'))
    m = re.fullmatch(r"\[((?:\d+,)*\d+|)\]", text)
    if not m:
        raise ValueError(f"unsupported shape {text!r} (expected e.g. [1,784])")
    return tuple(int(s) for s in m.group(1).split(",") if s)


def declarations(text: str) -> tuple[Variable, ...]:
    """The declared variables of a VNN-LIB 1.0 or 2.0 text, in the order they are declared
    (what the assignment of a ``sat`` answer lists). 2.0: the ``declare-input``,
    ``declare-hidden`` and ``declare-output`` of every ``declare-network``; 1.0: every
    ``declare-const X_i`` / ``Y_j``. ValueError for a declaration it cannot read."""
    out = []
    for e in _exprs(text):
        if not isinstance(e, list) or not e or not isinstance(e[0], str):
            continue
        if e[0] == "declare-const" and len(e) == 3 and all(isinstance(a, str) for a in e[1:]):
            m = re.fullmatch(r"([XY])_(\d+)", e[1])
            if m is None:
                raise ValueError(f"unsupported declaration (declare-const {e[1]} {e[2]}); expected X_i / Y_j Real")
            out.append(Variable(e[1], m.group(1), e[2], (), int(m.group(2))))
        elif e[0] == "declare-network" and len(e) >= 2 and isinstance(e[1], str):
            roles = {"declare-input": "X", "declare-hidden": "H", "declare-output": "Y"}
            for d in e[2:]:
                if isinstance(d, list) and len(d) >= 4 and d[0] in roles and all(isinstance(a, str) for a in d[1:3]):
                    out.append(Variable(d[1], roles[d[0]], d[2], _shape(d[3:]), None, e[1]))
    return tuple(out)


def is_real(etype: str) -> bool:
    """Is ``etype`` the ``real`` element type (2.0's ``real``, 1.0's sort ``Real``)?"""
    return etype.lower() == "real"


def offsets(variables) -> dict:
    """name -> (vector, offset) of each variable's elements: "X" for inputs, "Y" for outputs
    and hidden tensors. The layout of ``certify.vnnlib`` (and of the graph the ONNX reader
    builds): per network in order, its inputs appended to X in order, its outputs and then its
    hidden tensors appended to Y in order. 1.0 scalars sit at their own index."""
    out, nx, ny = {}, 0, 0
    for net in dict.fromkeys(v.network for v in variables):
        group = [v for v in variables if v.network == net]
        for role in ("X", "Y", "H"):
            for v in (v for v in group if v.role == role):
                if v.index is not None:
                    out[v.name] = (v.role, v.index)
                elif role == "X":
                    out[v.name], nx = ("X", nx), nx + math.prod(v.shape)
                else:
                    out[v.name], ny = ("Y", ny), ny + math.prod(v.shape)
    return out


def _values(variables, x, y, positions=None) -> list:
    """(variable, flat float64 array) per variable, in declaration order; x and y are the
    concatenated inputs and outputs (``offsets``), or ``positions`` gives each variable's
    (vector, indices) (inputs equated across networks share positions)."""
    x, y = np.asarray(x, dtype=np.float64).reshape(-1), np.asarray(y, dtype=np.float64).reshape(-1)
    if positions is not None:
        return [(v, _picked(v, x if positions[v.name][0] == "X" else y, positions[v.name][1])) for v in variables]
    where, out, used = offsets(variables), [], {"X": 0, "Y": 0}
    for v in variables:
        vec, at = where[v.name]
        n = math.prod(v.shape)
        src = x if vec == "X" else y
        vals = src[at:at + n]
        if vals.size != n:
            raise ValueError(f"assignment: {v.name} {list(v.shape)} needs {n} values, the counterexample has "
                             f"{max(src.size - at, 0)}")
        used[vec] = max(used[vec], at + n)
        out.append((v, vals))
    for vec, src in (("X", x), ("Y", y)):
        if any(v.index is None for v in variables) and used[vec] != src.size:
            raise ValueError(f"assignment: the {'inputs' if vec == 'X' else 'outputs'} need {used[vec]} values, "
                             f"the counterexample has {src.size}")
    return out


def _picked(v, src, indices):
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size != math.prod(v.shape) or (idx.size and (idx.min() < 0 or idx.max() >= src.size)):
        raise ValueError(f"assignment: {v.name} {list(v.shape)} needs {math.prod(v.shape)} values at positions "
                         f"within the counterexample's {src.size}")
    return src[idx]


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def assignment_text(variables, x, y, positions=None) -> str:
    """The command-line assignment format (see the module docstring) of input x and output y
    (flat) for ``variables`` (``declarations``; ``positions``: see ``_values``)."""
    lines = []
    for v, vals in _values(variables, x, y, positions):
        lines.append(f"{v.name} {v.etype} {_dims(v.shape)}")
        lines.extend(repr(float(a)) for a in vals.tolist())
    return "".join(line + "\n" for line in lines)


def result_text(verdict, variables=None, positions=None) -> str:
    """stdout of ``verify`` for a ``certify.vnncomp.Verdict``: the word, then for ``sat``
    (when ``variables`` is given) the assignment."""
    if verdict.result not in WORDS:
        raise ValueError(f"verdict: result {verdict.result!r} is not one of {tuple(WORDS)}")
    text = WORDS[verdict.result] + "\n"
    if verdict.result == "sat" and variables is not None:
        if verdict.counterexample is None:
            raise ValueError("verdict: 'sat' without a counterexample")
        text += assignment_text(variables, *verdict.counterexample, positions)
    return text


def parse_assignment(text: str) -> tuple[str, dict]:
    """(word, {name: (etype, shape, float64 array of that shape)}) of ``verify``'s stdout;
    ValueError when it does not follow the format."""
    lines = [line.strip() for line in text.strip().split("\n")]
    if not lines or lines[0] not in WORDS.values():
        raise ValueError(f"expected a result word {tuple(WORDS.values())} on the first line, got {lines[:1]!r}")
    out, k = {}, 1
    while k < len(lines):
        m = re.fullmatch(r"(\S+) (\S+) (\[[\d,]*\])", lines[k])
        if m is None:
            raise ValueError(f"line {k + 1}: expected 'NAME TYPE [DIMS]', got {lines[k]!r}")
        shape = _shape([m.group(3)])
        n = math.prod(shape)
        vals = lines[k + 1:k + 1 + n]
        if len(vals) != n:
            raise ValueError(f"line {k + 1}: {m.group(1)} needs {n} values, {len(vals)} follow")
        out[m.group(1)] = (m.group(2), shape, np.array([float(s) for s in vals], dtype=np.float64).reshape(shape))
        k += 1 + n
    return lines[0], out


def write_assignment(folder, variables, x, y, dtypes, positions=None) -> list:
    """The serialised assignment format: ``folder/NAME.pb`` per variable, an ONNX
    ``TensorProto`` of the variable's shape and element type; ``dtypes``: numpy dtype per
    variable name, or per role ("X", "Y"), the type of a ``real`` variable (the model's own; a
    declared ONNX type is used as declared). Returns the paths written."""
    from onnx import numpy_helper

    os.makedirs(folder, exist_ok=True)
    paths = []
    for v, vals in _values(variables, x, y, positions):
        dtype = dtypes.get(v.name, dtypes.get(v.role)) if is_real(v.etype) else np.dtype(v.etype)
        arr = vals.astype(dtype)
        if not np.array_equal(arr.astype(np.float64), vals):
            raise ValueError(f"assignment: a value of {v.name} is not exact in {np.dtype(dtype).name}")
        tensor = numpy_helper.from_array(arr.reshape(v.shape), name=v.name)
        path = os.path.join(os.fspath(folder), f"{v.name}.pb")
        with open(path, "wb") as f:
            f.write(tensor.SerializeToString())
        paths.append(path)
    return paths
