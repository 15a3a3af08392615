"""The command line: help on every subcommand, JSON output, clear errors."""
from __future__ import annotations

import json

import pytest

import softcert_cli


def test_help_lists_subcommands(capsys):
    assert softcert_cli.main([]) == 0
    out = capsys.readouterr().out
    for name in softcert_cli.SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("name", sorted(softcert_cli.SUBCOMMANDS))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        softcert_cli.main([name, "--help"])
    assert exc.value.code == 0
    assert "usage: softcert " + name in capsys.readouterr().out


def test_vertex_json_and_exact_check(capsys):
    rc = softcert_cli.main(["vertex", "--c", "1", "-2", "0.5", "--lower", "0", "-1", "0.3",
                            "--upper", "0.5", "0.2", "0.9", "--check"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["check"] == {"lower": True, "upper": True}
    assert out["lower"] < out["upper"]


def test_bad_input_is_a_clear_error(capsys):
    rc = softcert_cli.main(["vertex", "--c", "1", "--lower", "1", "--upper", "0"])
    assert rc == 2
    assert "lower > upper" in capsys.readouterr().err


def test_tightness_small_run_writes_outputs(tmp_path, capsys):
    rc = softcert_cli.main(["tightness", "--trials", "3", "--n", "4", "8", "--eps", "0.01",
                            "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "tightness.json").read_text())
    assert len(data["rows"]) == 2
    for row in data["rows"]:
        assert all(v == 0 for v in row["violations"].values())
        assert all(g >= 0 for g in row["gap"].values())
    assert (tmp_path / "tightness.png").stat().st_size > 0
