"""softcert.cli.modelio: `--model` zoo names, checkpoints and ONNX files, `--data`; clear errors
(the other model formats: tests/test_cli_model_formats.py)."""
from __future__ import annotations

import warnings

import pytest
import torch

from softcert.certify import zoo
from softcert.certify.options import AttackOptions
from softcert.cli import modelio

pytest.importorskip("onnx")


def _export(model, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, str(path), dynamo=False, input_names=["x"], output_names=["logits"])


def test_checkpoint_roundtrip(tmp_path):
    m, x, _ = zoo.load("digits-vit1")
    p = tmp_path / "m.pt"
    torch.save({"config": m.config, "state_dict": m.state_dict()}, p)
    m2, xte, _, label = modelio.load_model(str(p), data="digits")
    assert label == str(p) and torch.equal(m2(x[:8]), m(x[:8])) and xte.shape[1:] == (1, 8, 8)


def test_bare_state_dict_is_rejected_with_reason(tmp_path):
    m, _, _ = zoo.load("digits-vit1")
    p = tmp_path / "bare.pt"
    torch.save(m.state_dict(), p)
    with pytest.raises(ValueError, match="bare state dict.*recipe"):
        modelio.load_model(str(p), data="digits")


@pytest.mark.parametrize("name", ["digits-vit1", "mnist-vit1-cls-ln"])  # mean pool; LayerNorm + class token
def test_onnx_export_of_the_family_loads_and_matches(tmp_path, name):
    m, x, _ = zoo.load(name)
    p = tmp_path / "m.onnx"
    _export(m, x[:1], p)
    m2, _, _, _ = modelio.load_model(str(p), data="digits" if name.startswith("digits") else "mnist5k")
    assert m2.config["heads"] == m.config["heads"]
    assert (m2(x[:32]) - m(x[:32])).abs().max() < 1e-5


def test_onnx_with_unsupported_operator_names_it(tmp_path):
    class Ranked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(1, 2, 3)  # supported since the generic front end
            self.fc = torch.nn.Linear(72, 10)

        def forward(self, x):
            return torch.topk(self.fc(self.c(x).flatten(1)), 10).values

    p = tmp_path / "ranked.onnx"
    _export(Ranked(), torch.zeros(1, 1, 8, 8), p)
    with pytest.raises(ValueError, match=r"unsupported ONNX operator TopK"):
        modelio.load_model(str(p), data="digits")


def test_unknown_name_and_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match="no file, entry point or zoo model"):
        modelio.load_model("resnet50")
    p = tmp_path / "junk.pt"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt holds a pickled object.*--allow-pickle"):
        modelio.load_model(str(p), data="digits")
    with pytest.raises(ValueError, match="cannot load .*junk.pt"):
        modelio.load_model(str(p), data="digits", allow_pickle=True)


# ----------------------------------------------------------------------------- --data
def _own_model(tmp_path, image=(1, 12, 12)):
    from softcert.certify.models import ViT

    torch.manual_seed(0)
    m = ViT(image=image, patch=4, dim=8, heads=2, mlp=16, depth=1, classes=3).eval()
    p = tmp_path / "own.pt"
    torch.save({"config": m.config, "state_dict": m.state_dict()}, p)
    return m, p


def _xy(n=4, image=(1, 12, 12)):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((n,) + image).astype(np.float32), rng.integers(0, 3, n).astype(np.int64)


@pytest.mark.parametrize("fmt", ["npz", "pt-dict", "pt-tuple", "npz-hw"])
def test_own_test_set_any_image_shape(tmp_path, fmt):
    import numpy as np

    m, ckpt = _own_model(tmp_path)
    x, y = _xy()
    p = tmp_path / f"data.{fmt[:3].rstrip('-')}"
    if fmt == "npz":
        np.savez(p, x=x, y=y)
    elif fmt == "npz-hw":  # greyscale without the channel axis
        np.savez(p, x=x[:, 0], y=y)
    elif fmt == "pt-dict":
        torch.save({"x": torch.as_tensor(x), "y": torch.as_tensor(y)}, p)
    else:
        torch.save((torch.as_tensor(x), torch.as_tensor(y)), p)
    m2, xte, yte, _ = modelio.load_model(str(ckpt), data=str(p))
    assert xte.shape == (4, 1, 12, 12) and xte.dtype == torch.float32 and yte.tolist() == y.tolist()
    assert (xte.numpy() == x).all()  # float32 in, float32 out: no conversion


def test_own_model_without_data_is_an_error(tmp_path):
    """Never a silent fallback to bundled images (issue 32: 289 of the 360 digits a user's
    8x8 model was measured on were in its training set)."""
    _, ckpt = _own_model(tmp_path)
    with pytest.raises(ValueError, match="--data: .*own.pt is your own model"):
        modelio.load_model(str(ckpt))
    with pytest.raises(ValueError, match="--data: the bundled split 'digits' has images \\(1, 8, 8\\)"):
        modelio.load_model(str(ckpt), data="digits")


@pytest.mark.parametrize("edit,match", [
    (lambda x, y: dict(x=x), r"--data: .* no array 'y'"),
    (lambda x, y: dict(x=(x * 255).astype("uint8"), y=y), r"--data: x has dtype uint8.*255"),
    (lambda x, y: dict(x=x * 255, y=y), r"--data: x has values in \[.*\]; the model's input domain is \[0, 1\]"),
    (lambda x, y: dict(x=x, y=y + 0.5), r"--data: y has dtype float.*integers"),
    (lambda x, y: dict(x=x[:, :, :8], y=y), r"--data: x has shape \(4, 1, 8, 12\).*\(1, 12, 12\)"),
    (lambda x, y: dict(x=x, y=y[:3]), r"--data: y has shape \(3,\)"),
    (lambda x, y: dict(x=x, y=y + 3), r"--data: y has labels in \[\d, 5\].*3 classes"),
    (lambda x, y: dict(x=x * float("nan"), y=y), r"--data: x has non-finite"),
])
def test_bad_test_set_is_named(tmp_path, edit, match):
    import numpy as np

    m, ckpt = _own_model(tmp_path)
    p = tmp_path / "bad.npz"
    np.savez(p, **edit(*_xy()))
    with pytest.raises(ValueError, match=match):
        modelio.load_model(str(ckpt), data=str(p))


def test_bad_data_file_kinds(tmp_path):
    _, ckpt = _own_model(tmp_path)
    for name, body, match in (("d.csv", b"1,2", "expected a .pt or .npz"), ("d.pt", b"junk", "cannot read"),
                              ("missing.npz", None, "no such file")):
        p = tmp_path / name
        if body is not None:
            p.write_bytes(body)
        with pytest.raises(ValueError, match=f"--data: .*{match}|--data: {match}"):
            modelio.load_model(str(ckpt), data=str(p))
    p = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], p)
    with pytest.raises(ValueError, match="--data: .*expected a dict with keys 'x', 'y' or a tuple"):
        modelio.load_model(str(ckpt), data=str(p))


def test_any_onnx_classifier_loads_as_its_own_graph(tmp_path):
    """An ONNX export outside the certify.ViT family is verified on the ONNX graph itself."""
    from softcert import certify
    from softcert.cli.modelio import load_model

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.GELU(),
                            torch.nn.Linear(16, 10)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(m, (torch.rand(1, 1, 8, 8),), str(path), dynamo=False, opset_version=17)
    model, xte, yte, label = load_model(str(path), data="digits")
    assert isinstance(model, certify.GraphModule) and model.image == (1, 8, 8) and model.classes == 10
    x = xte[:3].double()
    with torch.no_grad():
        y = m(x.float()).argmax(1)
        torch.testing.assert_close(model(x), m(x.float()).double(), rtol=1e-5, atol=1e-5)
    r = certify.verify(model, x, y, 0.01, method="crown")
    a = certify.attack(model, x, y, 0.01, options=AttackOptions(steps=5))
    assert (a.min_margin >= r.worst_margin - 1e-9).all()
