"""`softcert report` end to end (test-size settings, every stage) and `softcert check` on it."""
from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

import softcert.cli
from softcert.cli import checker, records
from softcert.cli.commands.report import QUICK, TINY


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    rc = softcert.cli.main(["report", "--tiny", "--minilm", "--out", str(out)])  # MiniLM is opt-in
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
    from importlib.metadata import version

    assert man["versions"]["torch"] == version("torch")  # the torch that ran (2.13.0+cpu, 2.6.0, ...)
    tex = (tiny_report / "report.tex").read_text()
    assert r"\toprule" in tex and r"\includegraphics" in tex and r"\section*{Appendix" in tex
    md = (tiny_report / "report.md").read_text()
    assert "Regenerate: `softcert report --tiny --minilm --out" in md  # numbers beside their command (as typed)


def test_quick_settings_run_every_stage_with_more_work():
    assert QUICK.n_images > TINY.n_images and set(TINY.methods) <= set(QUICK.methods)


def test_check_passes_on_report(tiny_report, capsys):
    rc = softcert.cli.main(["check", str(tiny_report / "results.json"), "--quiet"])
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
    assert softcert.cli.main(["check", str(path), "--quiet"]) == 1
    assert rid in capsys.readouterr().out


def test_changed_number_without_new_digest_is_named(tiny_report):
    res = json.loads((tiny_report / "results.json").read_text())
    res["certificates"][0]["lower"][0] -= 1.0  # widening the box: still sound, but not what was reported
    res["certify"]["rows"][0]["certified_acc"] = 1.0
    names = [f[0] for f in checker.check_results(res)]
    assert res["certificates"][0]["id"] in names and "section certify" in names


def test_bad_model_argument_errors(tmp_path, capsys):
    assert softcert.cli.main(["report", "--tiny", "--model", "no-such-model", "--out", str(tmp_path)]) == 2
    assert "no file, entry point or zoo model" in capsys.readouterr().err
    bad = tmp_path / "conv.pt"
    torch.save({"config": {"image": (1, 8, 8), "patch": 2, "dim": 16, "heads": 2, "mlp": 32, "depth": 1},
                "state_dict": {"conv.weight": torch.zeros(2, 1, 3, 3)}}, bad)
    assert softcert.cli.main(["report", "--tiny", "--model", str(bad), "--data", "digits", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unsupported layer 'conv.weight'" in err and "certify.ViT" in err


def test_check_rejects_missing_file(tmp_path, capsys):
    assert softcert.cli.main(["check", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_figures_are_byte_stable(tiny_report, tmp_path, monkeypatch):
    from softcert.cli import render

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    res = json.loads((tiny_report / "results.json").read_text())
    digests = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        names = render.figures(d, res)
        digests.append({n: (d / n).read_bytes() for ns in names.values() for n in ns})
    assert digests[0] == digests[1] and len(digests[0]) == 8


# ----------------------------------------------------------------------------- tampering
# A forger can recompute every unkeyed digest (records, sections, the sealed manifest), so each
# tampering below is re-sealed the way a forger would and must still fail, naming what changed.
def _results(tiny_report):
    return json.loads((tiny_report / "results.json").read_text())


def _reseal(res, *sections):
    for name in sections:
        res["digests"][name] = records.sha256(res[name])
    res["manifest"] = records.sealed_manifest(res, res["certificates"])
    return res


def _failed(res):
    return [f[0] for f in checker.check_results(res)]


def test_report_checks_clean_and_records_every_verdict(tiny_report):
    res = _results(tiny_report)
    assert checker.check_results(res) == []
    verdicts = [r for r in res["certificates"] if r["kind"] == "verdict"]
    assert len(verdicts) == TINY.n_images * len(TINY.eps) * len(TINY.methods)
    assert res["manifest"]["record_counts"] == records.record_counts(res["certificates"])


@pytest.mark.parametrize("kind", ["verdict", "vertex", "radius", "topk", "fp", "feedback"])
def test_deleted_record_fails(tiny_report, kind):
    res = _results(tiny_report)
    i = next(i for i, r in enumerate(res["certificates"]) if r["kind"] == kind)
    del res["certificates"][i]
    assert "manifest" in _failed(res)  # the sealed ids and counts no longer match
    assert f"records {kind}" in _failed(_reseal(res))  # re-sealed: the settings imply one more


def test_keeping_one_record_fails(tiny_report):
    res = _results(tiny_report)
    res["certificates"] = res["certificates"][:1]
    names = _failed(_reseal(res))
    assert {"records vertex", "records radius", "records topk", "records fp", "records feedback"} <= set(names)


@pytest.mark.parametrize("section", ["certify", "radii", "topk", "fp", "feedback", "appendix"])
def test_deleted_section_fails(tiny_report, section):
    res = _results(tiny_report)
    del res[section]
    del res["digests"][section]
    assert f"section {section}" in _failed(_reseal(res))


def test_deleted_digest_table_and_manifest_fail(tiny_report):
    res = _results(tiny_report)
    del res["digests"]
    assert "digests" in _failed(res)
    res = _results(tiny_report)
    del res["manifest"]
    assert "manifest" in _failed(res)


def _first(rows, **kw):
    return next(r for r in rows if all(r[k] == v for k, v in kw.items()))


@pytest.mark.parametrize("section,mutate,name", [
    ("certify", lambda s: _first(s["rows"], method="ibp").update(certified_acc=1.0), "section certify row eps=0.02 method=ibp"),
    ("certify", lambda s: _first(s["rows"], method="crown").update(certified_acc=0.5), "section certify row eps=0.02 method=crown"),
    ("certify", lambda s: _first(s["rows"], method="crown").update(pgd_acc=0.5), "section certify row eps=0.02 method=crown"),
    ("certify", lambda s: _first(s["rows"], method="vertex").update(
        mean_lower_margin=_first(s["rows"], method="vertex")["mean_lower_margin"] * (1 + 1e-9)),
     "section certify row eps=0.02 method=vertex"),
    ("certify", lambda s: s.update(correct=s["correct"] - 1), "section certify"),
    ("radii", lambda s: s.update(rho_batch_pi=s["rho_batch_pi"] * 2), "section radii"),
    ("radii", lambda s: s.update(median_root=max(s["per_image_root"])), "section radii"),
    ("radii", lambda s: s["exact"][0].update(exact=s["exact"][0]["exact"] * 1.5), "section radii"),
    ("topk", lambda s: s["model"]["0.01"]["mean_k"][0].__setitem__(0, s["model"]["0.01"]["mean_k"][0][0] + 1),
     "section topk/model/eps=0.01"),
    ("topk", lambda s: s["minilm"]["0.01"]["proved_minimal"][0].__setitem__(0, 1.5), "section topk/minilm/eps=0.01"),
    ("fp", lambda s: s["table"][0].update(rel_in_u=s["table"][0]["rel_in_u"] / 2), None),
    ("fp", lambda s: s["table"][0].update(rel=s["table"][0]["rel"] / 2), None),
    ("fp", lambda s: s["measured"][0].update(max_ratio=1.5), None),
    ("feedback", lambda s: s["rows"][0].update(beta_star=s["rows"][0]["beta_star"] * 2), None),
    ("feedback", lambda s: s["rows"][0].update(unique_at_1=not s["rows"][0]["unique_at_1"]), None),
])
def test_edited_table_number_with_recomputed_digest_fails(tiny_report, section, mutate, name):
    res = _results(tiny_report)
    mutate(res[section])
    fails = checker.check_results(_reseal(res, section))
    assert fails and all(f[0].startswith(f"section {section}") for f in fails), fails
    assert name is None or name in [f[0] for f in fails], fails


def test_all_certified_acc_set_to_one_fails(tiny_report, tmp_path, capsys):
    res = _results(tiny_report)
    for r in res["certify"]["rows"]:
        r["certified_acc"] = 1.0
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_reseal(res, "certify")))
    assert softcert.cli.main(["check", str(path), "--quiet"]) == 1
    assert "section certify row eps=0.02 method=ibp: certified_acc = 1.0" in capsys.readouterr().out


@pytest.mark.parametrize("c,vmax", [([9007199254740993], 9007199254740992),
                                    ([2 ** 53 + 4], 9007199254740995)])
def test_forged_vertex_record_with_big_integers_fails(tiny_report, c, vmax):
    res = _results(tiny_report)
    rec = next(r for r in res["certificates"] if r["kind"] == "vertex")
    rec.update(c=c, lower=[0.0], upper=[0.0], min=vmax, max=vmax)
    rec["sha256"] = records.digest(rec)
    fails = checker.check_results(_reseal(res))
    assert [f[0] for f in fails] == [rec["id"]] and "refuted" in fails[0][1]


@pytest.mark.parametrize("mutate", [
    lambda r: r.update(certified=True),  # an IBP verdict: negative lower margin
    lambda r: r.update(certified=True, lower_margin=abs(r["pgd_margin"]) * 2),  # above what PGD reached
    lambda r: r.update(pgd_counterexample=True),  # margin >= 0 recorded
    lambda r: r.update(predicted=(r["label"] + 1) % 10, certified=True, lower_margin=1e-3),
])
def test_forged_verdict_record_fails(tiny_report, mutate):
    res = _results(tiny_report)
    rec = next(r for r in res["certificates"] if r["kind"] == "verdict" and r["method"] == "ibp")
    mutate(rec)
    rec["sha256"] = records.digest(rec)
    assert _failed(_reseal(res)) == [rec["id"]]


def test_verdicts_disagreeing_with_the_table_fail(tiny_report):
    # a consistent forged verdict (certified, positive margin below PGD's) still changes the
    # re-derived certified accuracy: the table must follow, or the section is named
    res = _results(tiny_report)
    rec = next(r for r in res["certificates"] if r["kind"] == "verdict" and r["method"] == "ibp")
    rec.update(certified=True, lower_margin=min(1e-3, rec["pgd_margin"] / 2))
    rec["sha256"] = records.digest(rec)
    assert set(_failed(_reseal(res))) == {"section certify row eps=0.02 method=ibp"}


# ----------------------------------------------------------------------------- --data
def _own(tmp_path):
    import numpy as np

    from softcert.certify.models import ViT

    torch.manual_seed(0)
    m = ViT(image=(1, 12, 12), patch=4, dim=8, heads=2, mlp=16, depth=1, classes=3).eval()
    ckpt = tmp_path / "own.pt"
    torch.save({"config": m.config, "state_dict": m.state_dict()}, ckpt)
    x = np.random.default_rng(0).random((3, 1, 12, 12)).astype(np.float32)
    with torch.no_grad():
        y = m(torch.as_tensor(x)).argmax(1).numpy()
    y[1] = (y[1] + 1) % 3  # one misclassified image: not verified, never certified
    data = tmp_path / "data.npz"
    np.savez(data, x=x, y=y)
    return m, ckpt, data


def test_certify_stage_on_own_data_gives_checkable_verdicts(tmp_path):
    from dataclasses import replace

    from softcert.cli import modelio
    from softcert.cli.commands import report

    _, ckpt, data = _own(tmp_path)
    model, x, y, _ = modelio.load_model(str(ckpt), data=str(data))
    st = replace(TINY, n_images=3, methods=("ibp", "crown"), vertex_rows=1)
    recs: list = []
    sec = report.stage_certify(model, x, y, st, recs)
    verdicts = [r for r in recs if r["kind"] == "verdict"]
    assert len(verdicts) == 3 * len(st.methods) and [r for r in recs if r["kind"] == "vertex"]
    assert all(checker.check_record(r) is None for r in recs)
    mis = [r for r in verdicts if r["image"] == 1]
    assert all(r["lower_margin"] is None and not r["certified"] and r["pgd_margin"] is None for r in mis)
    settings = {"n_images": st.n_images, "eps": list(st.eps), "methods": list(st.methods)}
    assert checker.check_certify_section(sec, verdicts, settings) == []
    assert all(r["clean_acc"] == 2 / 3 for r in sec["rows"])


def test_report_data_option_errors_name_it(tmp_path, capsys):
    import numpy as np

    _, ckpt, data = _own(tmp_path)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((2, 1, 12, 12), np.float32), y=np.array([0.0, 1.0]))
    assert softcert.cli.main(["report", "--tiny", "--model", str(ckpt), "--data", str(bad), "--out", str(tmp_path)]) == 2
    assert "--data: y has dtype float64; labels must be integers" in capsys.readouterr().err
    assert softcert.cli.main(["report", "--tiny", "--model", str(ckpt), "--out", str(tmp_path)]) == 2
    assert "is your own model, so name its test set: --data FILE" in capsys.readouterr().err


def test_unverified_exact_radius_is_recorded_without_a_claim(tmp_path, monkeypatch):
    """radius_exact may raise RadiusNotVerified on extreme inputs: the report keeps the lower
    bound, claims no exact radius for that image, and its records still check."""
    from dataclasses import replace

    from softcert.analysis import RadiusNotVerified, ghosts
    from softcert.cli import modelio
    from softcert.cli.commands import report

    def unresolved(z, a, *args, **kwargs):
        raise RadiusNotVerified("count_zeros: unresolved (simulated extreme input)")

    monkeypatch.setattr(ghosts, "radius_exact", unresolved)
    _, ckpt, data = _own(tmp_path)
    model, x, y, _ = modelio.load_model(str(ckpt), data=str(data))
    st = replace(TINY, radius_images=3, exact_radii=2)
    recs: list = []
    sec = report.stage_radii(model, x, y, st, recs)
    assert len(recs) == 2 and all(r["exact"] is None and r["zero"] is None and "not verified" in r["note"]
                                  for r in recs)
    assert all(e["exact"] is None and e["lower_root"] > 0 for e in sec["exact"])
    assert all(checker.check_record(r) is None for r in recs)
    by_id = {r["id"]: r for r in recs}
    settings = {"radius_images": st.radius_images, "exact_radii": st.exact_radii}
    assert checker.check_radii_section(sec, by_id, frozenset(), settings) == []


# ----------------------------------------------------------------------------- issue 17: paper-ready
def test_certify_rows_carry_counts_and_scipy_intervals(tiny_report):
    from scipy.stats import binomtest

    res = _results(tiny_report)
    verdicts = [r for r in res["certificates"] if r["kind"] == "verdict"]
    for row in res["certify"]["rows"]:
        vs = [v for v in verdicts if v["eps"] == row["eps"] and v["method"] == row["method"]]
        assert row["certified_k"] == sum(v["certified"] for v in vs) and row["n"] == len(vs)
        assert row["certified_acc"] == row["certified_k"] / row["n"] and row["confidence"] == 0.95
        for what in ("clean", "pgd", "certified"):
            r = binomtest(row[f"{what}_k"], row["n"]).proportion_ci(confidence_level=0.95, method="exact")
            assert row[f"{what}_ci"] == pytest.approx([r.low, r.high], abs=1e-12)
            assert checker.check_proportion_interval(row[f"{what}_k"], row["n"], row[f"{what}_ci"], 0.95) is None


@pytest.mark.parametrize("mutate,name", [
    (lambda s: _first(s["rows"], method="ibp").update(certified_k=1), "section certify row eps=0.02 method=ibp"),
    (lambda s: _first(s["rows"], method="ibp").update(certified_ci=[0.01, 0.8419]), "section certify row eps=0.02 method=ibp"),
    (lambda s: _first(s["rows"], method="crown").update(
        pgd_ci=[_first(s["rows"], method="crown")["pgd_ci"][0], 0.99]), "section certify row eps=0.02 method=crown"),
    (lambda s: _first(s["rows"], method="crown").update(
        certified_ci=[_first(s["rows"], method="crown")["certified_ci"][0] * (1 + 1e-6), 1.0]),
     "section certify row eps=0.02 method=crown"),
    (lambda s: _first(s["rows"], method="vertex").pop("clean_ci"), "section certify row eps=0.02 method=vertex"),
    (lambda s: _first(s["rows"], method="vertex").update(confidence=0.9), "section certify row eps=0.02 method=vertex"),
])
def test_edited_count_or_interval_fails(tiny_report, mutate, name):
    res = _results(tiny_report)
    mutate(res["certify"])
    fails = checker.check_results(_reseal(res, "certify"))
    assert name in [f[0] for f in fails], fails


def _non_ascii_outside_verbatim(tex):
    import re

    return sorted({c for c in re.sub(r"\\verb\|[^|]*\|", "", tex) if ord(c) > 127})


def test_tex_cites_every_method_run_and_uses_base_packages(tiny_report):
    import re

    from softcert.cli import references

    tex = (tiny_report / "report.tex").read_text()
    packages = set(re.findall(r"\\usepackage(?:\[[^]]*\])?\{([^}]*)\}", tex))
    allowed = {"geometry", "booktabs", "graphicx", "amsmath,amssymb", "fontenc", "inputenc", "hyperref"}
    assert packages <= allowed, packages - allowed
    assert _non_ascii_outside_verbatim(tex) == []  # every Unicode symbol went through _tex_escape
    methods = tex[tex.index(r"\section*{Methods}"):tex.index(r"\begin{table}", tex.index(r"\section*{Methods}"))]
    for m in TINY.methods:
        assert f"{m} (" in methods
        assert all(rf"{k}" in methods for k in references.METHOD_KEYS[m])
    for key in ("madry2018pgd", "clopper1934", "sao2026ghosts", "tzachristas2025topk", "blanchard2021softmax",
                "shi2025genbab", "wang2020minilm"):
        assert key in references.cited(methods)
    assert "cactus" in methods and "was not run" in methods  # branch and bound: said how to get it
    assert "not implemented" not in methods  # it is (softcert bab); issue 32
    assert r"\bibliography{references}" in tex and r"\bibliographystyle{plain}" in tex
    # every citation resolves in the written .bib, and the .bib holds nothing uncited
    bib = (tiny_report / "references.bib").read_text()
    bib_keys = re.findall(r"^@\w+\{([^,]+),", bib, flags=re.M)
    assert sorted(bib_keys) == sorted(references.cited(tex))
    # tables: the model table, k/n with intervals, per-head detail only in the appendix
    main, appendix = tex.split(r"\appendix")
    assert r"\label{tab:model}" in main and "attention heads per layer" in main
    assert re.search(r"\d+/\d+ & \[0\.\d\d, [01]\.\d\d\]", main)
    assert r"\label{tab:topk_heads}" in appendix and "h11" in appendix and "h11" not in main
    for fig in ("certified_accuracy", "radii", "fp_bounds"):
        assert rf"\includegraphics[width=3.3in]{{{fig}.pdf}}" in main  # single column at natural size


def test_bib_entries_complete_and_issue_references_present():
    import re

    from softcert.cli import references

    bib = references.bibtex()
    entries = re.findall(r"@(\w+)\{([^,]+),\n(.*?)\n\}", bib, flags=re.S)
    assert len(entries) == len(references.ENTRIES) == len({k for _, k, _ in entries})
    for kind, key, body in entries:
        fields = dict(re.findall(r"^\s+(\w+) = \{(.*)\},?$", body, flags=re.M))
        assert {"author", "title", "year"} <= set(fields), key
        assert kind != "misc" or fields["howpublished"].startswith("arXiv:"), key
        assert fields["title"].count("{") == fields["title"].count("}")
        assert fields["title"].startswith("{") and fields["title"].endswith("}")  # casing kept by bibtex
    # CROWN, alpha-CROWN, auto_LiRPA, Vertex-Softmax, GenBaB, Blanchard-Higham-Higham, ghosts, top-k
    for key in ("zhang2018crown", "xu2021fast", "xu2020autolirpa", "davoodi2026vertex", "shi2025genbab",
                "blanchard2021softmax", "sao2026ghosts", "tzachristas2025topk"):
        assert key in references.ENTRIES
    assert set(references.METHOD_KEYS) == set(certify_methods())
    with pytest.raises(ValueError, match="keys"):
        references.bibtex(["nope2020"])
    md = references.markdown_entry("blanchard2021softmax")
    assert md.startswith("[blanchard2021softmax] Pierre Blanchard, Desmond J. Higham, Nicholas J. Higham.")


def certify_methods():
    from softcert import certify

    return certify.METHODS


def test_markdown_has_model_methods_references_and_intervals(tiny_report):
    md = (tiny_report / "report.md").read_text()
    for heading in ("## Model", "## Methods", "## References", "## Appendix: certified top-k per head"):
        assert heading in md
    assert "| ε | method | certified k/n | 95 % CI | PGD k/n | 95 % CI |" in md
    assert "[madry2018pgd]" in md and "- [clopper1934] C. J. Clopper, E. S. Pearson." in md
    res = _results(tiny_report)
    row = res["certify"]["rows"][0]
    assert f"| {row['certified_k']}/{row['n']} | [{row['certified_ci'][0]:.2f}, {row['certified_ci'][1]:.2f}] |" in md


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed (the .tex text is tested above)")
def test_pdf_compiles_and_pages_render(tiny_report):
    from softcert.cli import render

    note = render.compile_pdf(tiny_report)
    assert note.startswith("report.pdf compiled"), (tiny_report / "report.log").read_text()[-2000:]
    import re

    log = (tiny_report / "report.log").read_text(errors="replace")
    if shutil.which("bibtex"):
        assert re.search(r"Citation .* undefined", log) is None
    if shutil.which("pdftoppm"):
        assert sorted(tiny_report.glob("page-*.png"))  # look at them: docs/report/README.md


def test_a_model_without_attention_is_refused_by_name(tmp_path, capsys):
    """An ONNX classifier that is not a certify.ViT crashed the report with an AttributeError
    on its config (issue 32). Any model with attention is reported now
    (tests/test_cli_model_formats.py); one without is refused by name, before any stage runs."""
    from torch import nn

    from softcert import cli

    m = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(m, (torch.rand(1, 1, 8, 8),), str(path), dynamo=False, opset_version=17)
    assert cli.main(["report", "--model", str(path), "--data", "digits", "--tiny", "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "model: no attention layer" in err and "Traceback" not in err
    assert not (tmp_path / "rep" / "results.json").exists()
