"""The command line: help on every subcommand, JSON output, clear errors."""
from __future__ import annotations

import json

import pytest

import softcert.cli


def test_help_lists_subcommands(capsys):
    assert softcert.cli.main([]) == 0
    out = capsys.readouterr().out
    for name in softcert.cli.SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("name", sorted(softcert.cli.SUBCOMMANDS))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        softcert.cli.main([name, "--help"])
    assert exc.value.code == 0
    assert "usage: softcert " + name in capsys.readouterr().out


def test_vertex_json_and_exact_check(capsys):
    rc = softcert.cli.main(["vertex", "--c", "1", "-2", "0.5", "--lower", "0", "-1", "0.3",
                            "--upper", "0.5", "0.2", "0.9", "--check"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["check"] == {"lower": True, "upper": True}
    assert out["lower"] < out["upper"]


def test_bad_input_is_a_clear_error(capsys):
    rc = softcert.cli.main(["vertex", "--c", "1", "--lower", "1", "--upper", "0"])
    assert rc == 2
    assert "lower > upper" in capsys.readouterr().err


def test_tightness_small_run_writes_outputs(tmp_path, capsys):
    rc = softcert.cli.main(["tightness", "--trials", "3", "--n", "4", "8", "--eps", "0.01",
                            "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "tightness.json").read_text())
    assert len(data["rows"]) == 2
    for row in data["rows"]:
        assert all(v == 0 for v in row["violations"].values())
        assert all(g >= 0 for g in row["gap"].values())
    assert (tmp_path / "tightness.png").stat().st_size > 0


# ---------------------------------------------------------------------------- layers
LIBRARY = ("bounds", "kernels", "analysis", "certify")
COMMAND_ONLY = {"argparse", "matplotlib", "softcert.cli"}


def _imports(path):
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_library_imports_no_command_line_or_plotting():
    """bounds/kernels/analysis/certify never import argparse, matplotlib or the CLI layer,
    not even inside a function (the layer contract proper is import-linter's job)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bad = []
    for package in LIBRARY:
        files = sorted((root / package).rglob("*.py"))
        assert files, package
        for path in files:
            for name in _imports(path):
                if any(name == m or name.startswith(m + ".") for m in COMMAND_ONLY):
                    bad.append(f"{path.relative_to(root)} imports {name}")
    assert not bad, "\n".join(bad)


def test_layer_scan_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    import matplotlib.pyplot as plt\n    from argparse import ArgumentParser\n")
    assert set(_imports(bad)) == {"matplotlib.pyplot", "argparse"}
    bad.write_text("from softcert.cli.common import write_json\n")
    assert list(_imports(bad)) == ["softcert.cli.common"]


def test_every_subcommand_module_has_configure_and_run():
    import importlib

    for name, (module, _) in softcert.cli.SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        assert callable(mod.configure) and callable(mod.run), name


# ---------------------------------------------------------------------------- common helpers
def test_spelled_out_and_command_line():
    import argparse

    from softcert.cli import common

    line = common.spelled_out("ghosts sweep", [("--out", "a b"), ("--n", [4, 8]),
                                               ("--flag", True), ("--off", False), ("--x", None)])
    assert line == "softcert ghosts sweep --out 'a b' --n 4 8 --flag"
    ns = argparse.Namespace(invocation=["softcert", "fp", "--ns", "100"])
    assert common.command_line(ns, "fp", [("--ns", 5)]) == "softcert fp --ns 100"
    assert common.command_line(argparse.Namespace(), "fp", [("--ns", 5)]) == "softcert fp --ns 5"


def test_share_prints_the_count_so_no_threshold_is_rounded_over():
    from softcert.cli import common

    # 179 of 200 with two decimals read "0.90", above a 0.90 target it misses
    assert common.share(179 / 200, 200) == "179/200 (0.895)"
    assert common.share(0.0, 24) == "0/24 (0.000)"
    assert common.share(21 / 24, 24) == "21/24 (0.875)"


def test_writers_and_figure(tmp_path):
    import numpy as np

    from softcert.cli import common

    md = common.write_markdown(tmp_path / "a.md", ["# t", "", "x", ""])
    assert md.read_text() == "# t\n\nx\n"
    js = common.write_json(tmp_path / "a.json", {"v": np.float64(0.5)})
    assert json.loads(js.read_text()) == {"v": 0.5}
    plt = common.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    names = common.save_figure(fig, tmp_path / "f.png", formats=("png", "pdf"))
    assert names == ["f.png", "f.pdf"]
    png = (tmp_path / "f.png").read_bytes()
    assert png.startswith(b"\x89PNG") and b"Software" not in png  # no version stamp
    assert (tmp_path / "f.pdf").read_bytes().startswith(b"%PDF")
    assert not plt.get_fignums()  # closed


def test_timing_helpers_reject_bad_repeat():
    from softcert.cli import common

    calls = []
    common.best_seconds(lambda: calls.append(1), 2)
    assert len(calls) == 3  # one warm-up, two timed
    with pytest.raises(ValueError, match="repeat"):
        common.median_seconds(lambda: None, 0)


# ---------------------------------------------------------------------------- commands
def test_stability_records_the_typed_command(tmp_path, capsys):
    argv = ["stability", "--scan", "3", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0
    res = json.loads((tmp_path / "stability" / "stability.json").read_text())
    assert res["command"] == "softcert stability --scan 3 --out " + str(tmp_path)
    assert all(r["beta_star"] >= r["beta_classical"] for r in res["cases"])
    assert (tmp_path / "stability" / "sharpness.png").stat().st_size > 0


def test_train_rejects_unknown_names(capsys):
    assert softcert.cli.main(["train", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert softcert.cli.main(["train"]) == 2
