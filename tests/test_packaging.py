"""Packaging: one import root, ``softcert``, beside the Hugging Face ``kernels`` distribution.

Oracles: the wheel's own file list (what ``pip install .`` puts into site-packages), the
folders of the repository, and a fresh interpreter importing both ``kernels`` packages.
"""
from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (path,) = out.glob("softcert-*.whl")
    return path


def test_the_wheel_installs_one_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert z.read(top_level).decode().split() == ["softcert"]
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"softcert"}
    # the mapped folders, their data and the command layer are all inside
    for name in ("softcert/__init__.py", "softcert/__main__.py", "softcert/kernels/vertex.py",
                 "softcert/bounds/vertex.py", "softcert/analysis/data/sentences.txt",
                 "softcert/certify/ops/__init__.py", "softcert/certify/zoo/mnist-vit1.pt",
                 "softcert/cli/commands/report.py"):
        assert name in names, name


def test_every_package_folder_is_listed():
    """pyproject's explicit package list names every folder with an __init__.py (a new
    subpackage left out would be missing from the wheel, silently)."""
    cfg = _pyproject()["tool"]["setuptools"]
    dirs = {"softcert": "softcert", **cfg["package-dir"]}
    found = set()
    for package, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *rel)))
    assert found == set(cfg["packages"])


def test_no_version_caps_on_python_torch_transformers():
    project = _pyproject()["project"]
    assert "<" not in project["requires-python"]
    deps = project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]
    for dep in deps:
        name = dep.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
        if name in ("torch", "transformers", "triton"):
            assert "<" not in dep and "==" not in dep, dep


def test_hugging_face_kernels_and_ours_in_one_process(tmp_path):
    """The collision of issue 28: transformers >= 5.25 imports Hugging Face's ``kernels``; ours is
    ``softcert.kernels``. Run from an empty folder, so the repository's folders are not on the path."""
    code = ("import transformers, kernels, softcert.kernels, softcert.bounds;"
            "import softcert.kernels.vertex as kv;"
            "assert hasattr(kv, 'vertex_bounds'), 'ours';"
            "assert not hasattr(kernels, 'vertex'), kernels.__file__;"
            "print(kernels.__file__); print(softcert.kernels.__file__)")
    res = _run(code, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    hf, ours = res.stdout.split()
    assert "site-packages" in hf and Path(ours).parent == ROOT / "kernels"


def test_old_top_level_names_are_gone(tmp_path):
    for old in ("certify", "bounds", "analysis", "softcert_cli"):
        res = _run(f"import {old}", tmp_path)
        assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, old


def test_python_dash_m_softcert_prints_the_version(tmp_path):
    from importlib.metadata import version

    res = subprocess.run([sys.executable, "-m", "softcert", "--version"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"softcert {version('softcert')}"
    import softcert

    assert softcert.__version__ == version("softcert")
