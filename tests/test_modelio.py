"""`--model`: zoo names, checkpoints and ONNX files of the certify.ViT family; clear errors."""
from __future__ import annotations

import warnings

import pytest
import torch

from certify import zoo
from softcert_cli import modelio

pytest.importorskip("onnx")


def _export(model, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, str(path), dynamo=False, input_names=["x"], output_names=["logits"])


def test_checkpoint_roundtrip(tmp_path):
    m, x, _ = zoo.load("digits-vit1")
    p = tmp_path / "m.pt"
    torch.save({"config": m.config, "state_dict": m.state_dict()}, p)
    m2, xte, _, label = modelio.load_model(str(p))
    assert label == str(p) and torch.equal(m2(x[:8]), m(x[:8])) and xte.shape[1:] == (1, 8, 8)


def test_bare_state_dict_is_rejected_with_reason(tmp_path):
    m, _, _ = zoo.load("digits-vit1")
    p = tmp_path / "bare.pt"
    torch.save(m.state_dict(), p)
    with pytest.raises(ValueError, match="no config"):
        modelio.load_model(str(p))


@pytest.mark.parametrize("name", ["digits-vit1", "mnist-vit1-cls-ln"])  # mean pool; LayerNorm + class token
def test_onnx_export_of_the_family_loads_and_matches(tmp_path, name):
    m, x, _ = zoo.load(name)
    p = tmp_path / "m.onnx"
    _export(m, x[:1], p)
    m2, _, _, _ = modelio.load_model(str(p))
    assert m2.config["heads"] == m.config["heads"]
    assert (m2(x[:32]) - m(x[:32])).abs().max() < 1e-5


def test_onnx_with_unsupported_operator_names_it(tmp_path):
    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(1, 2, 3)
            self.fc = torch.nn.Linear(72, 10)

        def forward(self, x):
            return self.fc(self.c(x).flatten(1))

    p = tmp_path / "conv.onnx"
    _export(Conv(), torch.zeros(1, 1, 8, 8), p)
    with pytest.raises(ValueError, match=r"unsupported layer .*Conv.*supported operators: Add"):
        modelio.load_model(str(p))


def test_unknown_name_and_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match="neither a file nor a zoo model"):
        modelio.load_model("resnet50")
    p = tmp_path / "junk.pt"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read"):
        modelio.load_model(str(p))
