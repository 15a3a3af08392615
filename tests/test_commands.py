"""The moved subcommands at toy size: outputs written, the typed command recorded, the
library's own soundness checks (PGD against the certificate, measured FP error against the
proven bound) passing, and bad options rejected by name."""
from __future__ import annotations

import json

import pytest

import softcert.cli


def test_fp_small_run_has_no_violation(tmp_path, capsys):
    argv = ["fp", "--ns", "100", "--dtypes", "float32", "--random-trials", "1", "--rows", "none",
            "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0  # 1 would mean a measured error above the proven bound
    res = json.loads((tmp_path / "fp" / "fp_bounds.json").read_text())
    assert res["command"] == "softcert " + " ".join(argv)
    assert res["assumptions"] and res["rows"] is None
    for row in res["table"]:
        assert row["max_violation"] <= 1 and row["worst_rel_u"] <= row["bound_rel_u"]
    assert "## float32" in (tmp_path / "fp" / "fp_bounds.md").read_text()
    assert (tmp_path / "fp" / "error_vs_n.png").stat().st_size > 0


def test_fp_rejects_unknown_dtype(tmp_path, capsys):
    assert softcert.cli.main(["fp", "--dtypes", "float8", "--out", str(tmp_path)]) == 2
    assert "--dtypes" in capsys.readouterr().err


def test_certify_small_run_is_checked_by_pgd(tmp_path, capsys):
    out = tmp_path / "c"
    rc = softcert.cli.main(["certify", "--model", "digits-vit1", "--eps", "0.01", "--methods",
                            "ibp", "crown", "--n", "3", "--out", str(out)])
    assert rc == 0  # run() raises if PGD found a margin below a certified bound
    res = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in res["rows"]] == ["ibp", "crown"]
    for r in res["rows"]:
        assert 0 <= r["certified_acc"] <= r["pgd_acc"] <= r["clean_acc"] <= 1
    assert "| eps | method |" in (out / "results.md").read_text()
    assert (out / "certified_accuracy.png").stat().st_size > 0


def test_certify_rejects_unknown_method(tmp_path, capsys):
    assert softcert.cli.main(["certify", "--methods", "magic", "--out", str(tmp_path)]) == 2
    assert "methods" in capsys.readouterr().err


def test_bench_measure_and_table():
    from softcert.cli.commands import bench

    res = bench.measure(shapes=((8, 4),), repeats=1, backends=("torch",))
    assert len(res) == 1 and res[0]["seconds"] > 0 and res[0]["ratio_to_sort"] > 0
    md = bench.to_markdown(res, "softcert bench --repeats 1")
    assert "`softcert bench --repeats 1`" in md and "| 8 | 4 | torch |" in md


def test_topk_bench_small_run(tmp_path, capsys):
    out = tmp_path / "tb"
    rc = softcert.cli.main(["topk-bench", "--n", "16", "--elements", "64", "--repeat", "1",
                            "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "bench.json").read_text())
    assert {r["method"] for r in res["results"]} >= {"torch.sort", "numba certified_k"}
    assert res["command"].startswith("softcert topk-bench --n 16")


def test_bench_rejects_bad_repeats(capsys):
    assert softcert.cli.main(["bench", "--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err


def test_bench_rejects_a_thread_count_numba_cannot_run(capsys):
    assert softcert.cli.main(["bench", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err


def test_bench_threads_sets_torch_and_numba_alike():
    import numba
    import torch

    from softcert.cli.commands import bench

    before = torch.get_num_threads(), numba.get_num_threads()
    try:
        bench.set_threads(1)
        assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(before[0])
        numba.set_num_threads(before[1])


@pytest.mark.parametrize("argv, word", [(["stability", "--c", "0"], "--c"),
                                        (["ghosts", "sweep", "--archs", "ResNet"], "archs")])
def test_bad_options_name_the_option(argv, word, tmp_path, capsys):
    assert softcert.cli.main(argv + ["--out", str(tmp_path)]) == 2
    assert word in capsys.readouterr().err


def test_train_writes_a_checkpoint_zoo_can_read(tmp_path, monkeypatch, capsys):
    """`softcert train` end to end on a one-epoch variant of the digits recipe."""
    import torch

    from softcert.certify import ViT, train

    dataset, cfg, recipe = train.RECIPES["digits-vit1"]
    monkeypatch.setitem(train.RECIPES, "digits-vit1", (dataset, cfg, dict(recipe, epochs=1)))
    assert softcert.cli.main(["train", "digits-vit1", "--out", str(tmp_path)]) == 0
    assert "digits-vit1: test accuracy" in capsys.readouterr().out
    ckpt = torch.load(tmp_path / "digits-vit1.pt", weights_only=True)
    assert ckpt["dataset"] == "digits" and ckpt["config"]["image"] == [1, 8, 8]
    model = ViT(**dict(ckpt["config"], image=tuple(ckpt["config"]["image"])))
    model.load_state_dict(ckpt["state_dict"])  # the layout zoo.load expects


def test_certify_unknown_method_message_lists_names_not_a_mapping(tmp_path, capsys):
    assert softcert.cli.main(["certify", "--methods", "crown", "magic", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--methods" in err and "'magic'" in err and "mappingproxy" not in err
    assert "ibp, crown, alpha-crown, vertex" in err


def test_topk_bench_compares_backends_within_what_is_proven():
    """The benchmark's cross-check uses both backends explicitly and rejects contradictions."""
    from dataclasses import replace

    import torch

    from softcert.analysis import topk
    from softcert.cli.commands.topk_bench import disagreement

    g = torch.Generator().manual_seed(0)
    s = torch.randn(64, 32, generator=g, dtype=torch.float64) * 2.0
    s[::8, 24:] = float("-inf")
    a = topk.certify_topk(s, 0.01, backend="numba")
    b = topk.certify_topk(s, 0.01, backend="torch")
    assert "numba" in a.method and "torch" in b.method
    assert disagreement(a, b) is None and disagreement(b, a) is None
    proved = torch.nonzero(a.minimal_proved & b.minimal_proved).flatten()
    assert len(proved) > 0
    k = b.k.clone()
    k[proved[0]] += 1  # a larger k is still certified, but contradicts a proved minimum
    assert "minimality" in disagreement(a, replace(b, k=k))
    up = b.tail_upper.clone()
    up[0] = 0.5  # a k whose own tail bound exceeds eps is not a certificate
    assert "does not certify" in disagreement(a, replace(b, tail_upper=up))


def test_ghosts_split_is_the_torch_permutation_of_certify_digits():
    """One digits loader: the ghosts split (a quarter held out by torch.randperm) comes from
    certify.data.digits, and selects exactly the images and labels sklearn gives at those indices."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    from softcert.certify.data import digits
    from softcert.cli.commands.ghosts import GHOSTS_TEST, load_digits_split

    d = load_digits()
    for seed in (0, 3):
        xtr, ytr, xte, yte = load_digits_split(seed)
        perm = torch.randperm(len(d.target), generator=torch.Generator().manual_seed(seed)).numpy()
        assert GHOSTS_TEST == 449 and xte.shape == (449, 64) and xtr.shape == (1797 - 449, 64)
        assert xte.dtype == torch.float32 and yte.dtype == torch.int64
        assert np.array_equal(yte.numpy(), d.target[perm[:449]]) and np.array_equal(ytr.numpy(), d.target[perm[449:]])
        assert np.array_equal(xte.numpy() * 16, d.data[perm[:449]])  # /16 and *16 are exact
    # the default split (the zoo's) is unchanged: numpy permutation, 360 test images, (1, 8, 8)
    xtr, ytr, xte, yte = digits()
    perm = np.random.default_rng(0).permutation(len(d.target))
    assert xte.shape == (360, 1, 8, 8) and np.array_equal(yte.numpy(), d.target[perm[:360]])


@pytest.mark.parametrize("kwargs, name", [({"split": "jax"}, "split"), ({"n_test": 0}, "n_test"),
                                          ({"n_test": 1797}, "n_test"), ({"seed": -1}, "seed"),
                                          ({"flat": 1}, "flat")])
def test_digits_rejects_bad_options_by_name(kwargs, name):
    from softcert.certify.data import digits

    with pytest.raises(ValueError, match=name):
        digits(**kwargs)


def test_extract_attention_reports_progress_through_a_callback():
    from softcert.analysis import attention

    calls = []
    at = attention.extract_attention(sentences=["The cat sat.", "A dog ran far.", "Hi."], max_length=16,
                                     batch_size=2, progress=calls.append)
    assert len(at.scores) == 3 and calls == [1, 1]  # one call per batch of two
    with pytest.raises(ValueError, match="progress"):
        attention.extract_attention(sentences=["x y"], progress=True)
