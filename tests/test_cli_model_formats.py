"""softcert.cli.model_formats: every way to name the user's own model on the command line
(entry points, recipes, torch.export, ONNX, pickles behind --allow-pickle), with --data.

Oracles: the loaded module reproduces the user's own module on the test images (float32
forward passes, to 1e-5); every certificate the commands report is checked by their own PGD
cross-check and, here, against the model's clean margin at the image (a certified lower
bound above the margin it bounds would be false)."""
from __future__ import annotations

import json
import textwrap
import warnings

import numpy as np
import pytest
import torch

from softcert import certify
from softcert.cli import main, model_formats, modelio

SOURCE = textwrap.dedent('''
    import torch
    from torch import nn


    class AttentionClassifier(nn.Module):
        """8x8 images as 4 tokens of 16 pixels, one nn.MultiheadAttention, mean pool, 3 classes."""

        def __init__(self, dim=8, heads=2):
            super().__init__()
            self.embed = nn.Linear(16, dim)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            self.head = nn.Linear(dim, 3)

        def forward(self, x):
            t = self.embed(x.reshape(x.shape[0], 4, 16))
            o, _ = self.attn(t, t, t, need_weights=False)
            return self.head(o.mean(1))


    def build(dim=8, heads=2):
        """The user's model with its weights (here: a fixed seed)."""
        torch.manual_seed(0)
        return AttentionClassifier(dim, heads).eval()


    def not_a_model():
        return 3
''')


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(folder, the module, data .npz): labels are the model's own predictions, so every image
    is correctly classified and the certificates are not vacuous."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my_model.py").write_text(SOURCE)
    model = model_formats.call_entry(str(folder / "my_model.py"), "build", "test")
    x = np.random.default_rng(0).random((6, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        y = model(torch.as_tensor(x)).argmax(1).numpy()
    np.savez(folder / "data.npz", x=x, y=y)
    return folder, model, folder / "data.npz"


def _formats(folder, model, fmt):
    """The --model spec of ``fmt``, written into ``folder``."""
    x1 = torch.zeros(1, 1, 8, 8)
    if fmt == "entry-file":
        return f"{folder / 'my_model.py'}:build"
    if fmt == "entry-module":
        return "my_model:build"
    if fmt == "recipe":
        torch.save({"recipe": "my_model.py:build", "config": {"dim": 8, "heads": 2},
                    "state_dict": model.state_dict()}, folder / "ckpt.pt")
        return str(folder / "ckpt.pt")
    if fmt == "export":
        torch.export.save(torch.export.export(model, (x1,)), str(folder / "m.pt2"))
        return str(folder / "m.pt2")
    if fmt == "onnx":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x1,), str(folder / "m.onnx"), dynamo=False, opset_version=17)
        return str(folder / "m.onnx")
    if fmt == "pickle":
        torch.save(model, folder / "whole.pt")
        return str(folder / "whole.pt")
    if fmt == "torchscript":
        torch.jit.save(torch.jit.trace(model, x1, check_trace=False), str(folder / "scripted.pt"))
        return str(folder / "scripted.pt")
    raise AssertionError(fmt)


FORMATS = ["entry-file", "entry-module", "recipe", "export", "onnx", "pickle", "torchscript"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_the_same_model(user, fmt, monkeypatch):
    folder, model, data = user
    monkeypatch.syspath_prepend(str(folder))
    spec = _formats(folder, model, fmt)
    pickled = fmt in ("pickle", "torchscript")
    if pickled:
        with pytest.raises(ValueError, match="runs code stored in the file.*--allow-pickle"):
            modelio.load_model(spec, data=str(data))
    loaded, x, y, label = modelio.load_model(spec, data=str(data), allow_pickle=pickled)
    assert loaded.image == (1, 8, 8) and modelio.classes_of(loaded) == 3 and len(y) == 6
    with torch.no_grad():
        got = certify.logits_of(loaded(x)).double()
        want = model(x).double()
    assert (got - want).abs().max() < 1e-5, fmt


@pytest.mark.parametrize("fmt", ["entry-file", "recipe", "export", "onnx"])
def test_certify_command_on_the_users_model_and_data(user, fmt, tmp_path):
    folder, model, data = user
    spec = _formats(folder, model, fmt)
    out = tmp_path / "out"
    assert main(["certify", "--model", spec, "--data", str(data), "--eps", "0.02", "--methods", "crown",
                 "--n", "3", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["data"] == str(data) and res["rows"][0]["n"] == 3
    title = (out / "results.md").read_text().splitlines()[0]
    assert "zoo" not in title and spec.rsplit("/", 1)[-1] in title and "data.npz" in title
    x = torch.as_tensor(np.load(data)["x"][:3], dtype=torch.float64)
    with torch.no_grad():
        z = model.double()(x)
    model.float()
    y = z.argmax(1)
    clean = (z.gather(1, y[:, None]) - z).masked_fill(torch.nn.functional.one_hot(y, 3).bool(), float("inf"))
    for row in res["rows"]:
        for b, margins in enumerate(row["lower_margin"]):
            lower = min(m for j, m in enumerate(margins) if j != int(y[b]))
            assert lower <= float(clean[b].min()) + 1e-6  # a bound above the clean margin is false


def test_bab_command_on_an_entry_point(user, tmp_path):
    folder, _, data = user
    out = tmp_path / "bab"
    assert main(["bab", "--model", f"{folder / 'my_model.py'}:build", "--data", str(data), "--n", "2",
                 "--eps", "0.02", "--timeout", "2", "--methods", "crown", "bab", "--out", str(out)]) == 0
    rows = json.loads((out / "bab.json").read_text())["rows"]
    assert rows[0]["n"] == 2 and set(rows[0]["methods"]) == {"crown", "bab"}
    bab, crown = rows[0]["methods"]["bab"], rows[0]["methods"]["crown"]
    assert bab["certified"] >= crown["certified"]  # bab's root is at least CROWN


@pytest.mark.parametrize("command", ["certify", "bab"])
def test_users_model_without_data_is_an_error(user, command, tmp_path, capsys):
    folder, _, _ = user
    assert main([command, "--model", f"{folder / 'my_model.py'}:build", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--data" in err and "your own model" in err and "Traceback" not in err


@pytest.mark.parametrize("spec,match", [
    ("{folder}/my_model.py", "name the function that builds the model"),
    ("{folder}/my_model.py:nope", "has no function 'nope'"),
    ("{folder}/my_model.py:not_a_model", "returned a int, expected a torch.nn.Module"),
    ("{folder}/missing.py:build", "no such file"),
    ("no_such_package.mod:build", "cannot import module 'no_such_package.mod'"),
    ("{folder}", "is a folder"),
    ("resnet50", "no file, entry point or zoo model"),
])
def test_bad_model_specs_are_named(user, spec, match):
    folder, _, data = user
    with pytest.raises(ValueError, match=match):
        modelio.load_model(spec.format(folder=folder), data=str(data))


def test_bad_checkpoints_are_named(user, tmp_path):
    folder, model, data = user
    cases = {
        "bare.pt": (model.state_dict(), "bare state dict.*recipe"),
        "badrecipe.pt": ({"recipe": "build", "state_dict": {}}, "'recipe' must be 'file.py:function'"),
        "norecipefile.pt": ({"recipe": "gone.py:build", "state_dict": {}}, "gone.py found neither"),
        "wrongkeys.pt": ({"recipe": f"{folder / 'my_model.py'}:build", "state_dict": {"w": torch.zeros(1)}},
                         "state dict lacks"),
        "badconfig.pt": ({"recipe": f"{folder / 'my_model.py'}:build", "config": {"depth": 3},
                          "state_dict": model.state_dict()}, r"build\(depth\) raised TypeError"),
        "list.pt": ([torch.zeros(1)], "holds a list, expected a checkpoint dict"),
    }
    for name, (obj, match) in cases.items():
        torch.save(obj, tmp_path / name)
        with pytest.raises(ValueError, match=match):
            modelio.load_model(str(tmp_path / name), data=str(data))


def test_data_that_the_model_cannot_take_is_named(user, tmp_path):
    folder, _, _ = user
    np.savez(tmp_path / "wide.npz", x=np.zeros((2, 1, 8, 12), np.float32), y=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"running it on one image of --data \(shape \(1, 1, 8, 12\)\)"):
        modelio.load_model(f"{folder / 'my_model.py'}:build", data=str(tmp_path / "wide.npz"))
    np.savez(tmp_path / "labels.npz", x=np.zeros((2, 1, 8, 8), np.float32), y=np.array([0, 7]))
    with pytest.raises(ValueError, match=r"--data: y has labels in \[0, 7\]; the model has 3 classes"):
        modelio.load_model(f"{folder / 'my_model.py'}:build", data=str(tmp_path / "labels.npz"))


def test_report_on_the_users_model_with_bab_and_a_failing_baseline(user, tmp_path, capsys):
    """`softcert report` on an entry point with --data: the sections read the model's own
    attention (no certify.ViT config), bab runs with its cactus plot, a baseline that cannot
    read the model (auto_LiRPA: nn.MultiheadAttention's fused operator) becomes a row with a
    note saying why (never an aborted report), and `softcert check` passes."""
    folder, _, data = user
    out = tmp_path / "rep"
    assert main(["report", "--tiny", "--model", f"{folder / 'my_model.py'}:build", "--data", str(data),
                 "--methods", "ibp", "crown", "lirpa-ibp", "bab", "--timeout", "2", "--eps", "0.02", "--n", "2",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["model"]["config"]["heads"] == 2 and res["model"]["config"]["architecture"] == "AttentionClassifier"
    assert [r["method"] for r in res["certify"]["rows"]] == ["ibp", "crown", "lirpa-ibp"]
    lirpa = res["certify"]["rows"][2]
    assert lirpa["certified_k"] == 0 and lirpa["note"].startswith("auto_LiRPA failed: NotImplementedError")
    bab = res["certify"]["bab"][0]
    assert bab["method"] == "bab" and len(bab["status"]) == 2 and (out / "bab_cactus.png").exists()
    md = (out / "report.md").read_text()
    assert "- lirpa-ibp: auto_LiRPA failed" in md and "### Branch and bound" in md and "MiniLM" not in md
    assert "my_model.py:build" in md and "kernels.fp_rows" not in md
    capsys.readouterr()
    assert main(["check", str(out / "results.json"), "--quiet"]) == 0, capsys.readouterr()
    # --reverify loads the entry point again (by its file, checked by SHA-256) and re-runs every certificate
    assert main(["check", str(out / "results.json"), "--reverify"]) == 0, capsys.readouterr()
    assert "my_model.py" in capsys.readouterr().out


def test_report_options_are_checked(tmp_path, capsys):
    for argv, match in ((["--n", "0"], "--n: must be an integer >= 1"), (["--eps", "-0.1"], "--eps"),
                        (["--methods", "nope"], "--methods: unknown 'nope'"), (["--timeout", "0"], "--timeout"),
                        (["--methods", "bab"], "at least one bound-only method")):
        assert main(["report", "--tiny", *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert match in err and "Traceback" not in err
