"""Code style of certify/ (issue 29): no function takes more than 8 parameters.

Every positional(-only), keyword-only, *args and **kwargs parameter counts, self/cls of a
method excepted; tunables travel as frozen options objects (certify/options.py) instead. The
only exceptions are the ATen handlers of certify/trace.py that mirror torch's own signatures.
"""
from __future__ import annotations

import ast
from pathlib import Path

CERTIFY = Path(__file__).resolve().parents[1] / "certify"
MAX_PARAMETERS = 8
#: (file relative to certify/, function name): handlers that take an ATen operator's arguments
EXEMPT = {("trace.py", name) for name in ("_batch_norm", "_bn_no_training", "_sdpa", "_conv2d")}


def _parameters(fn, in_class):
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if in_class and not static and names and names[0] in ("self", "cls"):
        names = names[1:]
    return names


def _functions(tree):
    """(function node, whether it is defined directly in a class body), everywhere in ``tree``."""
    stack = [(tree, False)]
    while stack:
        node, _ = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, isinstance(node, ast.ClassDef)
            stack.append((child, False))


def test_no_certify_function_takes_more_than_eight_parameters():
    files = sorted(CERTIFY.rglob("*.py"))
    assert files, f"no sources under {CERTIFY}"
    offenders = []
    for path in files:
        rel = path.relative_to(CERTIFY).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for fn, in_class in _functions(tree):
            params = _parameters(fn, in_class)
            if len(params) > MAX_PARAMETERS and (rel, fn.name) not in EXEMPT:
                offenders.append(f"certify/{rel}:{fn.lineno} {fn.name} ({len(params)}: {', '.join(params)})")
    assert not offenders, (f"functions with more than {MAX_PARAMETERS} parameters (group them into an "
                           "options object, certify/options.py):\n" + "\n".join(offenders))


ROOT = CERTIFY.parent


def _softcert_modules(tree):
    """Local names bound to modules of softcert (``from softcert.x import mod``, ``import
    softcert.x.mod as m``): where an UPPER_CASE attribute would be a module-level tunable."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("softcert"):
            names.update(a.asname or a.name for a in node.names if not a.name[:1].isupper())
        elif isinstance(node, ast.Import):
            names.update(a.asname for a in node.names if a.name.startswith("softcert") and a.asname)
    return names


def _tunable_writes(tree, modules):
    """Assignments ``mod.UPPER = ...`` / ``setattr(mod, "UPPER", ...)`` to a softcert module."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules \
                    and t.attr.isupper():
                yield node.lineno, f"{t.value.id}.{t.attr}"
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in modules \
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).isupper():
            yield node.lineno, f"{node.args[0].id}.{node.args[1].value}"


def test_no_module_level_tunable_is_reassigned():
    """Settings travel as options objects (certify/options.py): nothing in the library, the
    tests, the examples or the commands reassigns a module's UPPER_CASE constant."""
    offenders = []
    for folder in ("certify", "bounds", "kernels", "analysis", "softcert", "tests", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            offenders += [f"{path.relative_to(ROOT)}:{line} {what}"
                          for line, what in _tunable_writes(tree, _softcert_modules(tree))]
    assert not offenders, "module-level tunables reassigned (pass an options object instead):\n" + "\n".join(offenders)
