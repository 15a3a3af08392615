"""`softcert report` end to end (test-size settings, every stage) and `softcert check` on it."""
from __future__ import annotations

import copy
import json

import pytest
import torch

import softcert_cli
from softcert_cli import checker, records
from softcert_cli.report import TINY, QUICK


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    rc = softcert_cli.main(["report", "--tiny", "--out", str(out)])
    assert rc == 0
    return out


def test_report_folder_complete(tiny_report):
    names = {p.name for p in tiny_report.iterdir()}
    for f in ("report.md", "report.tex", "results.json", "manifest.json"):
        assert f in names
    for stem in ("certified_accuracy", "radii", "topk_heatmap", "fp_bounds"):
        assert f"{stem}.png" in names and f"{stem}.pdf" in names
    res = json.loads((tiny_report / "results.json").read_text())
    kinds = {r["kind"] for r in res["certificates"]}
    assert kinds == {"verdict", "vertex", "radius", "topk", "fp", "feedback"}  # every stage left records
    assert {r["method"] for r in res["certify"]["rows"]} == set(TINY.methods)
    assert "minilm" in res["topk"] and res["topk"]["minilm_sequences"] == TINY.minilm_sentences
    assert all(all(v.values()) for v in res["appendix"].values())
    man = json.loads((tiny_report / "manifest.json").read_text())
    assert {"certify", "radii", "topk", "fp", "feedback", "appendix"} <= set(man["wall_seconds"])
    assert man["versions"]["torch"].startswith("2.13")
    tex = (tiny_report / "report.tex").read_text()
    assert r"\toprule" in tex and r"\includegraphics" in tex and r"\section*{Appendix" in tex
    md = (tiny_report / "report.md").read_text()
    assert "Regenerate: `softcert report --out" in md and "--tiny`" in md  # numbers beside their command


def test_quick_settings_run_every_stage_with_more_work():
    assert QUICK.n_images > TINY.n_images and set(TINY.methods) <= set(QUICK.methods)


def test_check_passes_on_report(tiny_report, capsys):
    rc = softcert_cli.main(["check", str(tiny_report / "results.json"), "--quiet"])
    assert rc == 0, capsys.readouterr().out
    assert "OK" in capsys.readouterr().out


def _tamper(res, kind, mutate):
    res = copy.deepcopy(res)
    rec = next(r for r in res["certificates"] if r["kind"] == kind)
    mutate(rec)
    rec["sha256"] = records.digest(rec)  # a forger recomputes the digest: the math must catch it
    return res, rec["id"]


@pytest.mark.parametrize("kind,mutate", [
    ("vertex", lambda r: r.update(max=r["max"] - 1e-3 * (1 + abs(r["max"])))),
    ("vertex", lambda r: r.update(min=r["min"] + 1e-3 * (1 + abs(r["min"])))),
    ("radius", lambda r: r.update(lower_bound=r["exact"] * 1.001)),
    ("radius", lambda r: r.update(exact=r["exact"] * 0.9)),
    ("topk", lambda r: r.update(k=r["k"] - 1) if r["k"] > 1 else r.update(tail_upper=r["tail_upper"] / 4)),
    ("topk", lambda r: r.update(tail_upper=r["tail_upper"] * (1 - 1e-6))),
    ("fp", lambda r: r.update(rel=r["rel"] * 0.99)),
    ("feedback", lambda r: r.update(proj_norm_upper=r["proj_norm_upper"] * 0.99)),
    ("feedback", lambda r: r.update(beta_star=r["beta_star"] * 1.01)),
])
def test_tampered_certificate_fails_and_is_named(tiny_report, tmp_path, kind, mutate, capsys):
    res = json.loads((tiny_report / "results.json").read_text())
    bad, rid = _tamper(res, kind, mutate)
    fails = checker.check_results(bad)
    assert [f[0] for f in fails] == [rid], fails
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    assert softcert_cli.main(["check", str(path), "--quiet"]) == 1
    assert rid in capsys.readouterr().out


def test_changed_number_without_new_digest_is_named(tiny_report):
    res = json.loads((tiny_report / "results.json").read_text())
    res["certificates"][0]["lower"][0] -= 1.0  # widening the box: still sound, but not what was reported
    res["certify"]["rows"][0]["certified_acc"] = 1.0
    names = [f[0] for f in checker.check_results(res)]
    assert res["certificates"][0]["id"] in names and "section certify" in names


def test_bad_model_argument_errors(tmp_path, capsys):
    assert softcert_cli.main(["report", "--tiny", "--model", "no-such-model", "--out", str(tmp_path)]) == 2
    assert "neither a file nor a zoo model" in capsys.readouterr().err
    bad = tmp_path / "conv.pt"
    torch.save({"config": {"image": (1, 8, 8), "patch": 2, "dim": 16, "heads": 2, "mlp": 32, "depth": 1},
                "state_dict": {"conv.weight": torch.zeros(2, 1, 3, 3)}}, bad)
    assert softcert_cli.main(["report", "--tiny", "--model", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unsupported layer 'conv.weight'" in err and "certify.ViT" in err


def test_check_rejects_missing_file(tmp_path, capsys):
    assert softcert_cli.main(["check", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_figures_are_byte_stable(tiny_report, tmp_path, monkeypatch):
    from softcert_cli import render

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    res = json.loads((tiny_report / "results.json").read_text())
    digests = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        names = render.figures(d, res)
        digests.append({n: (d / n).read_bytes() for ns in names.values() for n in ns})
    assert digests[0] == digests[1] and len(digests[0]) == 8
