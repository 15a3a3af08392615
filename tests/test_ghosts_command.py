"""``softcert ghosts`` (softcert/cli/commands/ghosts.py) at toy size: the experiments'
structure and semantics, the reports they write, and clear errors for bad options."""
from __future__ import annotations

import pytest


def test_reduced_experiments_run(tmp_path):
    """The CLI experiments at toy size: structure, semantics of the sweep, reports written."""
    import argparse
    import json

    from softcert.cli.commands import ghosts as ge

    sweep = ge.run_sweep(["Linear", "MLP+LN"], [0, 5], 1, 2.0, progress=False)
    assert len(sweep["rows"]) == 2 * 2 * 2
    for r in sweep["rows"]:
        assert r["rho_a"] > 0 and len(r["ratios"]) == len(ge.R_GRID)
        assert r["onset_r"] is None or r["onset_r"] in ge.R_GRID
        if r["direction"] == "gradient":  # a short descent step lowers the loss
            assert r["ratios"][0] < 1.0
    stale = ge.run_sweep(["MLP"], [0, 5], 1, 2.0, progress=False, stale=2)
    assert [r["stage"] for r in stale["rows"]] == [2, 2, 5, 5] and stale["stale"] == 2
    assert all(r["rho_fresh"] > 0 and r["rho_a"] > 0 for r in stale["rows"])
    ge.write_report("sweep", stale, tmp_path / "stale", "softcert ghosts sweep --stale 2", 1.0)
    assert "rho_fresh / rho_stale" in (tmp_path / "stale" / "sweep.md").read_text()
    spike = ge.run_spike(["Linear"], [1000.0], [0], steps=55, progress=False)
    assert {r["method"] for r in spike["rows"]} == set(ge.METHODS)
    # two worker processes give the same table (each run seeds itself)
    par = ge.run_spike(["Linear"], [1000.0], [0], steps=55, progress=False, jobs=2)
    assert [r["accuracies"] for r in par["rows"]] == [r["accuracies"] for r in spike["rows"]]
    assert all(0.0 <= r["median"] <= 1.0 for r in spike["rows"])
    temp = ge.run_temperature(["Linear"], (0.5, 2.0), 5, 2.0, progress=False)
    assert [r["T"] for r in temp["rows"]] == [0.5, 2.0]
    # rho_a scales with T for a fixed direction of the unscaled logits
    assert temp["rows"][1]["rho_a"] > temp["rows"][0]["rho_a"]
    bench = ge.run_bench(["Linear"], 3, progress=False)
    assert bench["rows"][0]["ratio"] > 0 and bench["rows"][0]["reuse_ratio"] > 0
    for name, res in [("sweep", sweep), ("spike", spike), ("temperature", temp), ("bench", bench)]:
        ge.write_report(name, res, tmp_path, f"softcert ghosts {name}", 1.0)
        assert json.loads((tmp_path / f"{name}.json").read_text())["command"] == f"softcert ghosts {name}"
        assert f"`softcert ghosts {name}`" in (tmp_path / f"{name}.md").read_text()
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    parser = argparse.ArgumentParser()
    ge.configure(parser)
    with pytest.raises(ValueError, match="archs"):
        ge.run(parser.parse_args(["sweep", "--archs", "ResNet", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="jobs"):
        ge.run(parser.parse_args(["spike", "--jobs", "0", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="stale"):
        ge.run(parser.parse_args(["sweep", "--stale", "-1", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="fail-ratio"):
        ge.run(parser.parse_args(["sweep", "--fail-ratio", "0.5", "--out", str(tmp_path)]))
