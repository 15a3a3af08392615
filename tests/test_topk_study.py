"""`softcert topk` end to end on a tiny corpus: files written, numbers consistent."""
from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

import softcert.cli  # noqa: E402
from softcert.analysis import attention  # noqa: E402


def test_topk_cli_writes_consistent_results(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(attention.load_corpus()[:12]))
    out = tmp_path / "out"
    rc = softcert.cli.main(["topk", "--out", str(out), "--corpus", str(corpus),
                            "--lengths", "32", "--eps", "0.01", "0.1"])
    assert rc == 0
    res = json.loads((out / "topk.json").read_text())
    assert (out / "topk.md").read_text().count("|") > 50 and (out / "topk_heatmap.png").stat().st_size
    assert [v["label"] for v in res["views"]] == ["sentences", "n=32 passages"]
    packed = res["views"][1]
    assert packed["n"] == 32
    for row in packed["per_layer"]:
        assert row["n_mean"] == 32
        # a larger budget never needs more keys; k <= n; certified tails meet the budget
        assert 0 < row["frac@0.1"] <= row["frac@0.01"] <= 1
        assert row["tail"] <= 0.01
        assert row["err_exact"] <= row["err_diam"] and row["err_exact"] <= row["err_var"]
        assert row["gap4"] <= row["gap1"] * (1 + 1e-9)


def test_topk_cli_rejects_bad_eps(tmp_path):
    assert softcert.cli.main(["topk", "--out", str(tmp_path), "--eps", "0.01", "1.5"]) == 2
