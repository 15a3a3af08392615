"""`softcert check` against consistent forgeries (issue 27, item 9): every record, table, digest
and the sealed manifest recomputed the way the checker computes them. The plain check refuses
unknown methods, records outside the manifest's settings and corpora that are not the
manifest's; `--reverify` re-runs the verifier on the hash-checked model and data it names."""
from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import softcert.cli
from softcert.cli import checker, records
from softcert.cli.commands import check, report

SETTINGS = replace(report.TINY, methods=("ibp", "crown"))  # TINY without its slowest method


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    out = tmp_path_factory.mktemp("forgery")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "settings_for", lambda args: SETTINGS)
        assert softcert.cli.main(["report", "--no-minilm", "--out", str(out)]) == 0
    return out


def _results(rep):
    return json.loads((rep / "results.json").read_text())


def _rebuild_certify(res):
    """The certify table re-derived from the (forged) verdicts, as an honest report would print it."""
    sec = res["certify"]
    n = sec["images"]
    vs = [r for r in res["certificates"] if r["kind"] == "verdict"]
    for row in sec["rows"]:
        rs = [v for v in vs if v["eps"] == row["eps"] and v["method"] == row["method"]]
        ok = [v for v in rs if v["predicted"] == v["label"]]
        ks = {"clean": len(ok), "pgd": sum(not v["pgd_counterexample"] for v in ok),
              "certified": sum(v["certified"] for v in rs)}
        for what, k in ks.items():
            row.update({f"{what}_k": k, f"{what}_acc": k / n, f"{what}_ci": records.clopper_pearson(k, n)})
        row["n"] = n
        ms = [v["lower_margin"] for v in ok if v["lower_margin"] is not None and math.isfinite(v["lower_margin"])]
        row["mean_lower_margin"] = math.fsum(ms) / len(ms) if ms else None
    first = res["settings"]["eps"][0]
    sec["correct"] = sum(v["predicted"] == v["label"] for v in vs
                         if v["eps"] == first and v["method"] == res["settings"]["methods"][0])


def _forge(res, path=None):
    """Re-seal everything: record digests, section digests, the manifest (what a forger can do)."""
    _rebuild_certify(res)
    for rec in res["certificates"]:
        rec["sha256"] = records.digest(rec)
    res["digests"] = records.section_digests(res)
    res["manifest"] = records.sealed_manifest(res, res["certificates"])
    if path is not None:
        path.write_text(json.dumps(res))
    return res


def _verdicts(res, **kw):
    return [r for r in res["certificates"] if r["kind"] == "verdict" and all(r[k] == v for k, v in kw.items())]


def _names(res):
    return [f[0] for f in checker.check_results(res)]


def test_honest_report_checks_and_reverifies(rep, capsys):
    res = _results(rep)
    assert checker.check_results(res) == []
    inp = res["inputs"]
    assert inp["model"]["zoo"] == "digits-vit1" and len(inp["model"]["sha256"]) == 64
    assert inp["corpus"]["images"] == list(range(SETTINGS.n_images)) and inp["data"]["size"] >= SETTINGS.n_images
    assert res["manifest"]["inputs"] == inp
    assert softcert.cli.main(["check", str(rep / "results.json"), "--reverify", "--quiet"]) == 0
    certified = len(_verdicts(res, certified=True))
    assert certified >= 1 and f"OK: {certified} certified verdict records re-verified" in capsys.readouterr().out
    fails, done = check.reverify(res, limit=1)
    assert fails == [] and done == 1


def test_every_verdict_set_to_certified_is_refused_by_reverify(rep, tmp_path, capsys):
    res = _results(rep)
    forged = []
    for r in _verdicts(res, certified=False):
        # consistent: correctly classified, no PGD counterexample, margin positive and below PGD's
        assert r["predicted"] == r["label"] and not r["pgd_counterexample"]
        r.update(certified=True, lower_margin=min(1e-3, r["pgd_margin"] / 2))
        forged.append(r["id"])
    assert forged
    path = tmp_path / "results.json"
    _forge(res, path)
    assert checker.check_results(res) == []  # digests cannot tell: only the verifier can
    assert softcert.cli.main(["check", str(path), "--reverify", "--quiet"]) == 1
    out = capsys.readouterr().out
    for rid in forged:
        assert f"FAIL {rid}: re-running ibp at eps=0.02 does not certify" in out
    assert f"{len(forged)} failure(s) re-verifying" in out


def test_unknown_method_is_refused_by_the_plain_check(rep):
    text = json.dumps(_results(rep)).replace('"ibp"', '"magic"').replace("/ibp/", "/magic/")
    res = _forge(json.loads(text))
    names = _names(res)
    assert "settings" in names
    assert {r["id"] for r in _verdicts(res, method="magic")} <= set(names)
    why = dict(checker.check_results(res))[_verdicts(res, method="magic")[0]["id"]]
    assert "unknown method 'magic'" in why


def _scale_eps(res, factor):
    for r in _verdicts(res):
        r["eps"] *= factor
        r["id"] = f"verdict/eps={r['eps']}/{r['method']}/image{r['image']}"
    for row in res["certify"]["rows"]:
        row["eps"] *= factor
    res["settings"]["eps"] = [e * factor for e in res["settings"]["eps"]]


def test_eps_times_ten_is_refused_by_reverify(rep):
    res = _results(rep)
    _scale_eps(res, 10)
    _forge(res)
    assert checker.check_results(res) == []
    fails, done = check.reverify(res)
    assert done == len(_verdicts(res, certified=True)) >= 1
    assert sorted(f[0] for f in fails) == sorted(r["id"] for r in _verdicts(res, certified=True))
    assert all("at eps=0.2 does not certify" in why for _, why in fails)


def test_record_eps_outside_the_manifest_settings_is_refused(rep):
    res = _results(rep)
    rec = _verdicts(res, method="crown")[0]
    rec["eps"] = 0.5
    rec["id"] = f"verdict/eps=0.5/crown/image{rec['image']}"
    names = _names(_forge(res))
    assert rec["id"] in names and dict(checker.check_results(res))[rec["id"]].startswith("eps 0.5")


def test_id_not_naming_its_record_is_refused(rep):
    res = _results(rep)
    rec = _verdicts(res, method="crown", image=0)[0]
    rec["id"] = rec["id"].replace("image0", "image7")
    assert rec["id"] in _names(_forge(res))


def _drop_image(res, image):
    res["certificates"] = [r for r in res["certificates"] if not (r["kind"] == "verdict" and r["image"] == image)]
    res["certify"]["images"] -= 1


def test_dropped_images_are_refused(rep, tmp_path, capsys):
    last = SETTINGS.n_images - 1
    res = _results(rep)  # the corpus in the manifest still lists the image
    _drop_image(res, last)
    assert "section certify" in _names(_forge(res))
    res = _results(rep)  # the corpus shrunk with it
    _drop_image(res, last)
    res["inputs"]["corpus"]["images"].remove(last)
    assert "inputs" in _names(_forge(res))
    res["inputs"]["data"]["size"] = last  # and the test set "shrunk" too: only the data can tell
    path = tmp_path / "results.json"
    _forge(res, path)
    assert checker.check_results(res) == []
    assert softcert.cli.main(["check", str(path), "--reverify", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "softcert check: error: --data:" in err and res["inputs"]["data"]["sha256"] in err


def test_renamed_model_is_refused_by_its_hash(rep, tmp_path, capsys):
    res = _results(rep)
    m = res["inputs"]["model"]
    m.update(spec="mnist-vit1", zoo="mnist-vit1", file=m["file"].replace("digits-vit1", "mnist-vit1"))
    res["model"]["spec"] = "zoo:mnist-vit1"
    path = tmp_path / "results.json"
    _forge(res, path)
    assert checker.check_results(res) == []
    assert softcert.cli.main(["check", str(path), "--reverify", "--quiet"]) == 2
    err = capsys.readouterr().err
    want = m["sha256"]
    assert f"--model: {m['file']} has sha256 " in err and f"results.json names sha256 {want}" in err
    assert records.file_sha256(m["file"]) in err
    # the forger recomputes the model's hash too: the bundled data of that model is another set
    m["sha256"] = records.file_sha256(m["file"])
    with pytest.raises(ValueError, match="--data: the test set loaded for mnist-vit1"):
        check.reverify(_forge(res))


def test_report_without_inputs_fails_the_plain_check(rep):
    res = _results(rep)
    del res["inputs"]
    res["manifest"] = records.sealed_manifest(res, res["certificates"])
    assert "inputs" in _names(res)


def test_inflated_margin_of_a_certified_record_is_refused_by_reverify(rep):
    res = _results(rep)
    rec = _verdicts(res, certified=True)[0]
    rec["lower_margin"] = min(rec["pgd_margin"], rec["lower_margin"] * 1.5)
    fails, _ = check.reverify(_forge(res))
    assert [f[0] for f in fails] == [rec["id"]] and "exceeds the re-run's" in fails[0][1]


def test_changed_model_or_data_file_is_refused(tmp_path):
    from softcert.certify.models import ViT

    torch.manual_seed(0)
    net = ViT(image=(1, 12, 12), patch=4, dim=8, heads=2, mlp=16, depth=1, classes=3).eval()
    ckpt, data = tmp_path / "own.pt", tmp_path / "data.npz"
    torch.save({"config": net.config, "state_dict": net.state_dict()}, ckpt)
    x = np.random.default_rng(0).random((3, 1, 12, 12)).astype(np.float32)
    np.savez(data, x=x, y=np.array([0, 1, 2]))
    from softcert.cli.modelio import load_model

    _, xte, yte, _ = load_model(str(ckpt), data=str(data))
    inputs = report.inputs_of(str(ckpt), str(data), xte, yte, 3)
    assert check.load_inputs(inputs)[2].tolist() == [0, 1, 2]
    old = inputs["data"]["file_sha256"]
    np.savez(data, x=x, y=np.array([0, 1, 1]))  # one label changed after the report
    with pytest.raises(ValueError, match=f"--data: {data} has sha256 [0-9a-f]{{64}}, but results.json names sha256 {old}"):
        check.load_inputs(inputs)
    moved = tmp_path / "moved.pt"
    ckpt.rename(moved)
    with pytest.raises(ValueError, match=f"--model: {ckpt}, named by results.json, does not exist; pass --model"):
        check.load_inputs(copy.deepcopy(inputs))
    torch.save({"config": net.config, "state_dict": {k: v + 1 for k, v in net.state_dict().items()}}, moved)
    with pytest.raises(ValueError, match="--model: .*moved.pt has sha256"):
        check.load_inputs(inputs, model=str(moved))


def test_reverify_options_are_checked(rep, capsys):
    path = str(rep / "results.json")
    assert softcert.cli.main(["check", path, "--reverify-limit", "2"]) == 2
    assert "only with --reverify" in capsys.readouterr().err
    assert softcert.cli.main(["check", path, "--reverify", "--reverify-limit", "0"]) == 2
    assert "--reverify-limit: must be an integer >= 1" in capsys.readouterr().err
    assert softcert.cli.main(["check", path, "--reverify", "--data", path]) == 2
    assert "bundled test split" in capsys.readouterr().err
