"""Docstrings of analysis/ cite only files the repository has (issue 32: DESIGN §5 and
seeds/abstracts.md were cited but never shipped)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a path with a folder (docs/x.md, analysis/data/sentences.txt), a bare document (NOTES.md),
#: or a design/notes document cited by name (DESIGN §5)
PATH = re.compile(r"(?<![\w.])(?:[\w.-]+/)+[\w.-]*\w\.\w+\b|(?<![\w./])[\w-]+\.(?:md|rst)\b")
DOC_NAME = re.compile(r"\b(?:DESIGN|NOTES|PLAN|TODO|CHANGELOG|SPEC)\b(?!\.\w)")


def docstrings(source: str):
    """(line, text) of the module's, every class's and every function's docstring."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield (node.body[0].lineno, doc)


def missing_references(source: str) -> list[str]:
    """File references in the docstrings that resolve neither from the repository root nor
    from analysis/ (a URL such as arXiv:2603.13552 has no folder and is not matched)."""
    bad = []
    for line, doc in docstrings(source):
        for ref in PATH.findall(doc):
            ref = ref.rstrip(".")
            if not ((ROOT / ref).exists() or (ROOT / "analysis" / ref).exists()):
                bad.append(f"line {line}: {ref}")
        bad += [f"line {line}: {m}" for m in DOC_NAME.findall(doc)]
    return bad


def test_the_scanner_finds_dangling_references():
    src = '"""Source: seeds/abstracts.md; see DESIGN §5 and NOTES.md; docs/mathematics.md."""\n'
    assert missing_references(src) == ["line 1: seeds/abstracts.md", "line 1: NOTES.md", "line 1: DESIGN"]
    assert missing_references('def f():\n    """kernels/floating.py and analysis/data/sentences.txt"""\n') == []


def test_analysis_docstrings_cite_existing_files():
    found = {}
    for path in sorted((ROOT / "analysis").glob("*.py")):
        bad = missing_references(path.read_text(encoding="utf-8"))
        if bad:
            found[path.name] = bad
    assert not found, found
